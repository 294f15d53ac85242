"""Calls into the real FlashInfer (flashinfer-python 0.7.4) code: layout helpers and kernels.

Nothing here re-types FlashInfer: the row-index helpers, gated reorder, SM90 scale interleave
and ``pad_trtllm_moe_weights`` are FlashInfer's own pure-torch functions and run on CPU; the
128x4 ``block_scale_interleave`` and the host dequant ops live in the CUDA JIT module
``fp4_quantization_{arch}`` and run where a CUDA GPU is present.

A missing library raises :class:`contracts.errors.LibraryUnavailable` (the plugin turns it into a skip naming
what is missing); an assertion inside FlashInfer is re-raised as ``AssertionError`` that names
the helper, the shape and FlashInfer's own message.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import traceback
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from adapters.calls import kernel_device, launch, planned
from contracts.errors import LibraryUnavailable, VersionGate
from reference.layouts import TRTLLM_EPILOGUE_TILE_M
from reference.sizes import round_up


@functools.cache
def _import(module: str) -> ModuleType:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except Exception as exc:
        raise LibraryUnavailable(
            f"flashinfer-python is not importable ({type(exc).__name__}: {exc}); "
            "install the 'nvidia' extra: pip install 'fp4-conformance[nvidia]'"
        ) from exc


def flashinfer_version() -> str:
    return _import("flashinfer").__version__


def function(module: str, name: str) -> Callable[..., Any]:
    """FlashInfer's ``module.name``; :class:`VersionGate` naming the installed version where that version
    has no such function. ``fused_moe.core.pad_trtllm_moe_weights`` is one: flashinfer-python 0.7.4 has it,
    0.7.2.post1 (the version vLLM 0.33.0 pins) and 0.7.2 (SGLang 0.5.23's) do not."""
    found = getattr(_import(module), name, None)
    if found is None:
        raise VersionGate(f"flashinfer-python {flashinfer_version()} has no {module}.{name}")
    return found


def _call(helper: str, fn: Callable[[], torch.Tensor], what: str) -> torch.Tensor:
    """``fn()``; FlashInfer's ``AssertionError`` re-raised naming ``helper`` and ``what`` it rejected, with FlashInfer's
    message, or for a bare ``assert`` the asserting source line (flashinfer-python 0.7.2.post1's
    ``get_shuffle_matrix_sf_a_row_indices`` has ``assert M % 128 == 0``; 0.7.4 says
    ``input_tensor.shape[0]=M must be a multiple of 128. ...``)."""
    try:
        return fn()
    except AssertionError as exc:
        said = str(exc) or (traceback.extract_tb(exc.__traceback__)[-1].line or "assert")
        raise AssertionError(f"FlashInfer {helper} rejected {what}: {said}") from exc


def fc1_permutation(rows: int, gated: bool, scales: bool, cols: int = 8) -> torch.Tensor:
    """FC1 row indices from FlashInfer's ``_maybe_get_cached_w3_w1_permute_indices``.

    ``scales`` selects the scale variant (``num_elts_per_sf=16``), which asserts ``rows % 128``.
    """
    core = _import("flashinfer.fused_moe.core")
    probe = torch.zeros(rows, cols, dtype=torch.uint8)
    return _call(
        "_maybe_get_cached_w3_w1_permute_indices",
        lambda: core._maybe_get_cached_w3_w1_permute_indices(
            {}, probe, TRTLLM_EPILOGUE_TILE_M, num_elts_per_sf=16 if scales else None, is_gated_act_gemm=gated
        ),
        f"FC1 {'scales' if scales else 'weights'} with {rows} rows (gated={gated})",
    )


def fc2_permutation(rows: int, scales: bool, cols: int = 8) -> torch.Tensor:
    """FC2 row indices from FlashInfer's ``get_w2_permute_indices_with_cache``."""
    core = _import("flashinfer.fused_moe.core")
    probe = torch.zeros(rows, cols, dtype=torch.uint8)
    return _call(
        "get_w2_permute_indices_with_cache",
        lambda: core.get_w2_permute_indices_with_cache(
            {}, probe, TRTLLM_EPILOGUE_TILE_M, num_elts_per_sf=16 if scales else None
        ),
        f"FC2 {'scales' if scales else 'weights'} with {rows} rows",
    )


def row_shuffle(rows: int, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M) -> torch.Tensor:
    """``flashinfer.utils.get_shuffle_matrix_a_row_indices`` for a ``[rows, 8]`` uint8 probe."""
    utils = _import("flashinfer.utils")
    probe = torch.zeros(rows, 8, dtype=torch.uint8)
    return _call(
        "get_shuffle_matrix_a_row_indices",
        lambda: utils.get_shuffle_matrix_a_row_indices(probe, epilogue_tile_m),
        f"{rows} rows",
    )


def scale_row_shuffle(rows: int, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M) -> torch.Tensor:
    """``flashinfer.utils.get_shuffle_matrix_sf_a_row_indices`` (the ``M % 128`` assert)."""
    utils = _import("flashinfer.utils")
    probe = torch.zeros(rows, 8, dtype=torch.uint8)
    return _call(
        "get_shuffle_matrix_sf_a_row_indices",
        lambda: utils.get_shuffle_matrix_sf_a_row_indices(probe, epilogue_tile_m, 16),
        f"scales with {rows} rows",
    )


def gated_reorder(rows: int) -> torch.Tensor:
    """``get_reorder_rows_for_gated_act_gemm_row_indices`` for ``rows`` rows."""
    core = _import("flashinfer.fused_moe.core")
    probe = torch.zeros(rows, 8, dtype=torch.uint8)
    return _call(
        "get_reorder_rows_for_gated_act_gemm_row_indices",
        lambda: core.get_reorder_rows_for_gated_act_gemm_row_indices(probe),
        f"{rows} rows",
    )


def sm90_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """``flashinfer.fused_moe.prepare.interleave_moe_scales_for_sm90_mixed_gemm`` (pure torch)."""
    prepare = _import("flashinfer.fused_moe.prepare")
    return prepare.interleave_moe_scales_for_sm90_mixed_gemm(scales, group_size=32)


def nvfp4_4over6_off(fn: Callable[..., object]) -> dict[str, None]:
    """``{"nvfp4_4over6": None}`` where ``fn`` takes it (flashinfer-python 0.7.4: ``None`` switches the NVFP4
    "4over6" recipe off whatever ``FLASHINFER_NVFP4_4OVER6*`` say), else nothing: 0.7.2.post1's MoE entry
    points (vLLM 0.33.0's pin) have neither the parameter nor the recipe."""
    return {"nvfp4_4over6": None} if "nvfp4_4over6" in inspect.signature(fn).parameters else {}


def cuda_capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def block_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's CUDA 128x4 ``block_scale_interleave`` on a GPU; returns the flat buffer on CPU.

    Raises :class:`LibraryUnavailable` without a CUDA GPU (the op is a JIT-built CUDA kernel). Its output
    holds ``prod(batch) · ru(rows, 128) · ru(cols, 4)`` bytes (zeros of that size in a plan).
    """
    if cuda_capability() is None and not planned():
        raise LibraryUnavailable("block_scale_interleave is a CUDA kernel: needs an NVIDIA GPU (sm_75+)")
    quant = _import("flashinfer.quantization.fp4_quantization")
    *batch, rows, cols = scales.shape
    numel = math.prod(batch) * round_up(rows, 128) * round_up(cols, 4)
    out = launch(
        "block_scale_interleave",
        quant.block_scale_interleave,
        scales.to(kernel_device()).contiguous(),
        planned_output=lambda: torch.zeros(numel, dtype=scales.dtype),
    )
    return out.cpu()


def e2m1_and_ufp8sf_scale_to_float(
    packed: torch.Tensor, scales: torch.Tensor, global_decode: float, sf_vec_size: int, ue8m0: bool
) -> torch.Tensor:
    """FlashInfer's C++ host dequant (``E2M1AndUFP8SFScaleToFloatV2``), linear scale layout.

    Computes ``e2m1 · (sf · global)``; UE8M0 bytes decode as fp32 bits ``b << 23``. The wrapper
    queries ``cuda:0`` for its module's architecture, so this needs a CUDA GPU.
    """
    if cuda_capability() is None and not planned():
        raise LibraryUnavailable("FlashInfer's host dequant wrapper queries cuda:0: needs an NVIDIA GPU")
    quant = _import("flashinfer.quantization.fp4_quantization")
    g = torch.tensor([global_decode], dtype=torch.float32)
    return launch(
        "e2m1_and_ufp8sf_scale_to_float",
        quant.e2m1_and_ufp8sf_scale_to_float,
        packed.cpu(),
        scales.cpu().reshape(-1),
        g,
        sf_vec_size=sf_vec_size,
        ufp8_type=0 if ue8m0 else 1,
        is_sf_swizzled_layout=False,
    )


def mxfp4_dequantize_host(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's ``mxfp4_dequantize_host`` (CPU op, linear ``[n, k/32]`` scales; needs a GPU to load)."""
    if cuda_capability() is None and not planned():
        raise LibraryUnavailable("FlashInfer's mxfp4_dequantize_host wrapper queries cuda:0: needs an NVIDIA GPU")
    quant = _import("flashinfer.quantization.fp4_quantization")
    return launch(
        "mxfp4_dequantize_host",
        quant.mxfp4_dequantize_host,
        packed.cpu().contiguous(),
        scales.cpu().contiguous(),
        32,
    )


def trtllm_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """Why trtllm-gen would reject NVFP4 expert weights of padded sizes ``(Ip, Hp)``; empty if none.

    FlashInfer's own weight and scale row-index helpers must accept FC1 (``F·Ip`` rows) and FC2
    (``Hp`` rows); the 128x4-swizzled scales must have exactly the linear numel, because the prep
    views them back as ``[rows, K/16]`` (``Ip % 64`` and ``Hp % 64``); and FlashInfer 0.7.4
    documents that NVFP4 hidden sizes must be multiples of 256.
    """
    f = 2 if gated else 1
    rows = f * intermediate
    problems: list[str] = []
    for label, call in (
        ("FC1 weights", lambda: fc1_permutation(rows, gated, scales=False)),
        ("FC1 scales", lambda: fc1_permutation(rows, gated, scales=True)),
        ("FC2 weights", lambda: fc2_permutation(hidden, scales=False)),
        ("FC2 scales", lambda: fc2_permutation(hidden, scales=True)),
    ):
        try:
            call()
        except AssertionError as exc:
            problems.append(f"{label}: {exc}")
    for label, m, kc in (("FC1", rows, hidden // 16), ("FC2", hidden, intermediate // 16)):
        swizzled = round_up(m, 128) * round_up(kc, 4)
        if swizzled != m * kc:
            problems.append(
                f"{label} scales: the 128x4-swizzled buffer holds {swizzled} bytes but is viewed back as "
                f"[{m}, {kc}] = {m * kc} bytes (needs rows % 128 and K/16 % 4)"
            )
    if hidden % 256:
        problems.append(f"hidden size {hidden} is not a multiple of 256 (FlashInfer 0.7.4: 128 gives wrong results)")
    return problems


def trtllm_per_token_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """:func:`trtllm_nvfp4_violations`, plus ``Hp % 512`` for a non-gated layer with a dynamic per-token
    activation scale: the heuristic default tactic of those trtllm-gen cubins finds no valid config for a
    K that is a multiple of 256 only (vLLM 0.33.0 ``trtllm_nvfp4_hidden_alignment``; a tactic rule, a
    launch error rather than wrong output)."""
    problems = trtllm_nvfp4_violations(intermediate, hidden, gated)
    if not gated and hidden % 512:
        problems.append(
            f"hidden size {hidden} is not a multiple of 512: the per-token non-gated trtllm-gen cubins' default "
            "tactic finds no valid config (vLLM 0.33.0 trtllm_nvfp4_hidden_alignment, Nemotron 2688 -> 2816)"
        )
    return problems


def cutlass_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """Why ``cutlass_fused_moe`` NVFP4 would reject expert weights of padded sizes ``(Ip, Hp)``.

    The 128x4 swizzle of the FC1 scales must add no rows (vLLM raises for gated layers and would
    have to pad non-gated ones), and ``Ip % 16``, ``Hp % 16`` (TMA alignment for FP4 activations;
    FlashInfer's tests run H = 160, 288). Returns an empty list when every rule holds.
    """
    rows = (2 if gated else 1) * intermediate
    problems: list[str] = []
    if round_up(rows, 128) != rows:
        problems.append(f"the 128x4 scale swizzle pads FC1 from {rows} to {round_up(rows, 128)} rows (gated={gated})")
    if intermediate % 16:
        problems.append(f"intermediate size {intermediate} is not a multiple of 16")
    if hidden % 16:
        problems.append(f"hidden size {hidden} is not a multiple of 16 (TMA alignment of FP4 activations)")
    return problems
