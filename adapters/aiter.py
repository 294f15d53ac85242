"""Calls into AMD AITER (ROCm/aiter): the MXFP4 activation quantizers and the two FP4 GEMMs.

AITER imports only on a ROCm machine (``import aiter`` raises "ROCm version file not found"
elsewhere, ``docs/kernels.md`` §13.2), so every call imports lazily and raises
:class:`AiterUnavailable` naming what is missing. The suite's own layouts
(``reference.layouts``) prepare weights; these functions only run AITER's kernels, the way
vLLM's ``gemm_with_dynamic_quant`` does (``docs/vllm-logic.md`` §11):

* ASM path: ``per_1x32_f4_quant_hip(x, shuffle=True)`` then
  ``gemm_a4w4(x_q, w, x_s, w_s, dtype=bf16, bpreshuffle=True)[:M]``;
* Triton path: ``dynamic_mxfp4_quant(x)`` then ``gemm_afp4wfp4(x_q, w, x_s, w_s_kn.T, bf16)``.

Shapes: ``x [M, K]`` bf16; packed weights ``[N, K/2]`` uint8; activation scales come back in the
linear layout ``[M, K/32]`` as well (unshuffled from the ASM quantizer's padded shuffle).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType

import torch

from contracts.errors import LibraryUnavailable
from reference.formats import MXFP4_BLOCK
from reference.layouts import aiter_e8m0_unshuffle


class AiterUnavailable(LibraryUnavailable):
    """AITER, ROCm or a gfx950 GPU is missing."""


class AiterApiMismatch(RuntimeError):
    """The installed AITER has a different signature than the one the suite calls (a setup error: fails)."""


def require_parameters(fn: object, name: str, needed: tuple[str, ...], absent: tuple[str, ...] = ()) -> None:
    """Raise :class:`AiterApiMismatch` unless ``fn`` takes every parameter of ``needed`` and none of ``absent``."""
    params = inspect.signature(fn).parameters
    missing = [p for p in needed if p not in params]
    extra = [p for p in absent if p in params]
    if missing or extra:
        raise AiterApiMismatch(
            f"AITER's {name}{inspect.signature(fn)} lacks {missing} / has {extra}: the suite calls the API of "
            "ROCm/aiter main (2026-08); amd-aiter 0.1.7.post2.dev18 from PyPI predates it (docs/hardware.md §3)"
        )


@functools.cache
def _import(*candidates: str) -> ModuleType:
    """The first importable module of ``candidates`` (AITER moved its Triton GEMMs between releases)."""
    errors = []
    for module in candidates:
        try:
            return importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure means AITER is unusable here
            errors.append(f"{module}: {type(exc).__name__}: {exc}")
    raise AiterUnavailable(
        "AMD AITER is not importable (" + "; ".join(errors) + "); it needs ROCm and a gfx950 GPU: "
        "pip install 'fp4-conformance[amd]' (amd-aiter) or build ROCm/aiter"
    )


def require_gfx950() -> None:
    """Raise :class:`AiterUnavailable` unless device 0 is a ROCm gfx950 GPU (MI350x / MI355x)."""
    if torch.version.hip is None or not torch.cuda.is_available():
        raise AiterUnavailable("AITER FP4 GEMMs need a ROCm build of torch and an AMD GPU; this machine has neither")
    arch = torch.cuda.get_device_properties(0).gcnArchName
    if not arch.startswith("gfx950"):
        raise AiterUnavailable(f"AITER FP4 GEMMs need gfx950 (MI350x/MI355x); device 0 is {arch}")


@dataclass(frozen=True)
class QuantizedActivation:
    """AITER's MXFP4 activation: ``packed`` uint8 ``[M, K/2]`` and ``scales`` uint8 ``[M, K/32]``
    (linear layout, CPU), plus the tensors the GEMM consumes (``kernel_packed``, ``kernel_scales``)."""

    packed: torch.Tensor
    scales: torch.Tensor
    kernel_packed: torch.Tensor
    kernel_scales: torch.Tensor


def hip_quantize(x: torch.Tensor) -> QuantizedActivation:
    """``per_1x32_f4_quant_hip(x, shuffle=True)``: scales padded to ``(ru(M, 256), ru(K/32, 8))`` and
    shuffled (pad bytes never written); the linear scales are the unshuffled valid region."""
    require_gfx950()
    aiter = _import("aiter")
    m, k = x.shape
    x_q, x_s = aiter.per_1x32_f4_quant_hip(x, shuffle=True)
    linear = aiter_e8m0_unshuffle(x_s.view(torch.uint8).cpu(), m, k // MXFP4_BLOCK)
    return QuantizedActivation(x_q.view(torch.uint8).cpu(), linear.contiguous(), x_q, x_s)


def triton_quantize(x: torch.Tensor) -> QuantizedActivation:
    """``dynamic_mxfp4_quant(x)``: packed ``[M, K/2]`` and linear scales ``[M, K/32]``."""
    require_gfx950()
    quant = _import("aiter.ops.triton.quant", "aiter.ops.triton.quant.quant")
    x_q, x_s = quant.dynamic_mxfp4_quant(x)
    return QuantizedActivation(x_q.view(torch.uint8).cpu(), x_s.view(torch.uint8).cpu(), x_q, x_s)


def gemm_a4w4_bpreshuffle(act: QuantizedActivation, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """ASM ``gemm_a4w4`` on ``shuffle_weight`` (16, 16) weights ``[N, K/2]`` and swizzled scales
    ``[N, K/32]``; returns bf16 ``[M, N]`` (the kernel pads M to 32; vLLM slices ``[:M]``)."""
    require_gfx950()
    aiter = _import("aiter")
    # ROCm/aiter main: gemm_a4w4(A, B, A_scale, B_scale, bias=None, dtype=bf16, ..., bpreshuffle=True) returns
    # the output; amd-aiter 0.1.7 took a preallocated `out` as its fifth argument and had no dtype.
    require_parameters(aiter.gemm_a4w4, "gemm_a4w4", ("dtype", "bpreshuffle"), ("out",))
    device = act.kernel_packed.device
    w = weight.to(device).contiguous().view(act.kernel_packed.dtype)
    s = scale.to(device).contiguous().view(act.kernel_scales.dtype)
    y = aiter.gemm_a4w4(act.kernel_packed, w, act.kernel_scales, s, dtype=torch.bfloat16, bpreshuffle=True)
    return y[: act.packed.shape[0]]


def gemm_afp4wfp4(act: QuantizedActivation, weight: torch.Tensor, scale_kn: torch.Tensor) -> torch.Tensor:
    """Triton ``gemm_afp4wfp4`` on plain weights ``[N, K/2]`` and the stored ``(K/32, N)`` scale
    (passed as its ``.T`` view, as vLLM does); returns bf16 ``[M, N]``."""
    require_gfx950()
    gemm = _import("aiter.ops.triton.gemm.basic.gemm_afp4wfp4", "aiter.ops.triton.gemm_afp4wfp4")
    device = act.kernel_packed.device
    w = weight.to(device).contiguous()
    s = scale_kn.to(device).contiguous()
    y = torch.empty(act.packed.shape[0], w.shape[0], dtype=torch.bfloat16, device=device)
    return gemm.gemm_afp4wfp4(act.kernel_packed, w, act.kernel_scales, s.T, torch.bfloat16, y)
