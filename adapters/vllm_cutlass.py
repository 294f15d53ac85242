"""vLLM's own CUTLASS MXFP4 MoE weight preparation (``CUTLASS_MXFP4_MXFP4``), a kernel library in its own right.

vLLM 0.33.0 hands ``cutlass_moe_mxfp4`` (its ``_C`` CUTLASS kernels) the loaded ``[w1; w3]`` weights
unchanged and each expert's ``[N, K/32]`` UE8M0 scales through ``_swizzle_cutlass_mxfp4_scales``
(``fused_moe/oracle/mxfp4.py``), which tiles them with ``swizzle_mxfp4_scales``
(``fused_moe/experts/cutlass_moe.py``: ``[ceil(N/128), ceil(K/128), 32, 4, 4]``, zero-padded to whole
tiles) and reshapes the result back to ``[N, K/32]``. Both are torch code that runs on a CPU; the
CUTLASS kernel itself needs an SM100 GPU.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from contracts.errors import LibraryUnavailable


def _oracle() -> ModuleType:
    try:
        importlib.import_module("vllm.model_executor.layers.fused_moe")  # first: vLLM's import order
        return importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    except ImportError as exc:
        raise LibraryUnavailable(f"vLLM is not importable ({exc}); run scripts/install-vllm-cpu.sh") from exc


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """vLLM's ``_swizzle_cutlass_mxfp4_scales`` on ``[E, N, K/32]`` UE8M0 bytes: the 128x4-tiled bytes
    viewed as ``[E, N, K/32]``; a ``RuntimeError`` where tiling pads (``N % 128`` or ``(K/32) % 4``)."""
    return _oracle()._swizzle_cutlass_mxfp4_scales(scales.contiguous())
