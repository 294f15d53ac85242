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
from typing import Any

import torch

from adapters.aiter_triton import GEMM, QUANT, AiterUnavailable, aiter_module
from adapters.calls import SourceOnly, launch, planned
from reference.formats import MXFP4_BLOCK
from reference.layouts import aiter_e8m0_unshuffle
from reference.sizes import round_up


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
            "ROCm/aiter main (2026-08), docs/hardware.md §3"
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


def entry(module: str, name: str) -> Any:
    """AITER's function ``name`` of ``module``; in a plan where AITER does not import (no ROCm), a
    :class:`~adapters.calls.SourceOnly` stand-in carrying its source signature."""
    try:
        return getattr(_import(module), name)
    except (AiterUnavailable, AttributeError) as exc:
        if planned():
            return SourceOnly(module, name, str(exc))
        raise AiterUnavailable(f"AITER's {module}.{name} is unavailable: {exc}") from exc


GEMM_A4W4_APIS = {
    "ROCm/aiter main": (("dtype", "bpreshuffle"), ("out",)),
    "amd-aiter 0.1.7": (("out", "bpreshuffle"), ("dtype",)),
}
"""``gemm_a4w4`` signatures by release: parameters each takes and lacks. ROCm/aiter main (what vLLM 0.33.0's
``gemm_with_dynamic_quant`` calls): ``gemm_a4w4(A, B, A_scale, B_scale, bias=None, dtype=bf16, ...,
bpreshuffle=True)`` returning its output; amd-aiter 0.1.7.post2.dev18 (``aiter/ops/gemm_op_a4w4.py`` of the
wheel): ``gemm_a4w4(A, B, A_scale, B_scale, out, bias=None, alpha=1.0, beta=0.0, bpreshuffle=True)`` writing
a preallocated ``out`` whose rows are a multiple of 32."""


def gemm_a4w4_api(fn: object) -> str:
    """Which :data:`GEMM_A4W4_APIS` entry ``fn``'s signature is; :class:`AiterApiMismatch` if neither."""
    params = inspect.signature(fn).parameters
    for api, (takes, lacks) in GEMM_A4W4_APIS.items():
        if all(p in params for p in takes) and not any(p in params for p in lacks):
            return api
    raise AiterApiMismatch(
        f"AITER's gemm_a4w4{inspect.signature(fn)} matches none of the known APIs {GEMM_A4W4_APIS} "
        "(docs/hardware.md §3)"
    )


def require_gfx950() -> None:
    """Raise :class:`AiterUnavailable` unless device 0 is a ROCm gfx950 GPU (MI350x / MI355x) or this is a plan."""
    if planned():
        return
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
    m, k = x.shape
    x_q, x_s = launch(
        "per_1x32_f4_quant_hip",
        entry("aiter.ops.quant", "per_1x32_f4_quant_hip"),
        x,
        shuffle=True,
        planned_output=lambda: (
            torch.zeros(m, k // 2, dtype=torch.uint8),
            torch.zeros(round_up(m, 256), round_up(k // MXFP4_BLOCK, 8), dtype=torch.uint8),
        ),
    )
    linear = aiter_e8m0_unshuffle(x_s.view(torch.uint8).cpu(), m, k // MXFP4_BLOCK)
    return QuantizedActivation(x_q.view(torch.uint8).cpu(), linear.contiguous(), x_q, x_s)


def triton_quantize(x: torch.Tensor) -> QuantizedActivation:
    """``dynamic_mxfp4_quant(x)``: packed ``[M, K/2]`` and linear scales ``[M, K/32]``."""
    require_gfx950()

    quant = aiter_module(QUANT)
    x_q, x_s = launch("dynamic_mxfp4_quant", quant.dynamic_mxfp4_quant, x)
    return QuantizedActivation(x_q.view(torch.uint8).cpu(), x_s.view(torch.uint8).cpu(), x_q, x_s)


def gemm_a4w4_bpreshuffle(act: QuantizedActivation, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """ASM ``gemm_a4w4`` on ``shuffle_weight`` (16, 16) weights ``[N, K/2]`` and swizzled scales
    ``[N, K/32]``; returns bf16 ``[M, N]`` (the kernel pads M to 32; vLLM slices ``[:M]``). Called in the
    API the installed AITER has (:func:`gemm_a4w4_api`): with ``dtype`` (ROCm/aiter main, as vLLM 0.33.0
    calls it), or with a preallocated ``out [ru(M, 32), N]`` (amd-aiter 0.1.7)."""
    require_gfx950()
    gemm = entry("aiter.ops.gemm_op_a4w4", "gemm_a4w4")
    api = gemm_a4w4_api(gemm)
    device = act.kernel_packed.device
    w = weight.to(device).contiguous().view(act.kernel_packed.dtype)
    s = scale.to(device).contiguous().view(act.kernel_scales.dtype)
    m, n, name = act.packed.shape[0], w.shape[0], f"gemm_a4w4 ({api} API)"
    if api == "amd-aiter 0.1.7":
        y = torch.empty(round_up(m, 32), n, dtype=torch.bfloat16, device=device)
        launch(name, gemm, act.kernel_packed, w, act.kernel_scales, s, y, bpreshuffle=True)
    else:
        y = launch(name, gemm, act.kernel_packed, w, act.kernel_scales, s, dtype=torch.bfloat16, bpreshuffle=True)
    return y[:m]


def gemm_afp4wfp4(act: QuantizedActivation, weight: torch.Tensor, scale_kn: torch.Tensor) -> torch.Tensor:
    """Triton ``gemm_afp4wfp4`` on plain weights ``[N, K/2]`` and the stored ``(K/32, N)`` scale
    (passed as its ``.T`` view, as vLLM does); returns bf16 ``[M, N]``."""
    require_gfx950()

    gemm = aiter_module(GEMM)
    device = act.kernel_packed.device
    w = weight.to(device).contiguous()
    s = scale_kn.to(device).contiguous()
    y = torch.empty(act.packed.shape[0], w.shape[0], dtype=torch.bfloat16, device=device)
    return launch("gemm_afp4wfp4", gemm.gemm_afp4wfp4, act.kernel_packed, w, act.kernel_scales, s.T, torch.bfloat16, y)
