"""The ``mxfp4_linear`` backends: AITER's two FP4 GEMM paths of an MXFP4 linear layer, one record each.

vLLM's ``AiterMxfp4LinearKernel`` runs a dense MXFP4 layer on the ASM ``gemm_a4w4`` (``bpreshuffle``)
when the weight scale can be swizzled without padding, else on the Triton ``gemm_afp4wfp4``. Each path
quantizes the activations with its own AITER quantizer, whose MX scale rounding differs (HIP
``per_1x32_f4_quant_hip``: RoundUp = RCEIL since AITER PR #3212; Triton ``dynamic_mxfp4_quant``: Even).
The records hold those facts, the ASM path's acceptance rule and vLLM's guard unit-test table; the
built-in policy, the properties and the ``vllm`` subject read them from here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from adapters import aiter, aiter_triton
from backends import BackendRecord, register
from contracts.mxfp4_linear import CONTRACT
from reference.formats import MXFP4_BLOCK, MxScaleRounding
from reference.layouts import asm_scale_swizzle_ok


class AiterLinearPath(enum.Enum):
    """The two AITER GEMM paths of an MXFP4 linear layer (the contract's backends)."""

    ASM = "aiter-asm"  # per_1x32_f4_quant_hip + gemm_a4w4(bpreshuffle=True) / gemm_afp4wfp4_preshuffle
    TRITON = "aiter-triton"  # dynamic_mxfp4_quant + gemm_afp4wfp4 (any K % 32, any N)


ASM_FORCE_TRITON_SCALE_ROWS = frozenset({96})
"""Scale row counts whose unpadded swizzle is valid but whose ASM ``gemm_a4w4`` result is wrong at
``M <= 64`` (Qwen3.8 GDN ``in_proj_ba`` at TP1, scale (96, 160); AITER #5931): vLLM PR #58139 routes
them to Triton, and vLLM's guard unit test pins ``(96, 160) -> False``."""


def asm_gemm_eligible(scale_shape: tuple[int, ...]) -> bool:
    """2-D, the unpadded swizzle is valid (``rows % 32``, ``cols % 8``, ``rows >= 32``) and the
    row count is not one the ASM kernel is known to get wrong (:data:`ASM_FORCE_TRITON_SCALE_ROWS`)."""
    if len(scale_shape) != 2:
        return False
    rows, cols = scale_shape
    return asm_scale_swizzle_ok(rows, cols) and rows not in ASM_FORCE_TRITON_SCALE_ROWS


def triton_eligible(scale_shape: tuple[int, ...]) -> bool:
    """``gemm_afp4wfp4`` takes any 2-D ``(N, K/32)`` scale (any N, any K % 32)."""
    return len(scale_shape) == 2


VLLM_GUARD_TABLE: tuple[tuple[tuple[int, ...], bool], ...] = (
    ((2560, 80), True),  # shared_expert gate/up_proj
    ((1280, 80), True),  # gate/up_proj at TP2
    ((2560, 8), True),  # minimal aligned columns
    ((32, 8), True),  # minimal aligned rows and columns
    ((2560, 20), False),  # shared_expert down_proj, in 640
    ((2560, 10), False),  # down_proj at TP2, in 320: the '[80, 2, 16, 1, 2, 4, 1]' crash
    ((30, 8), False),  # rows not a multiple of 32
    ((96, 160), False),  # Qwen3.8 TP1 GDN in_proj_ba (vLLM PR #58139)
    ((128, 160), True),  # rows % 32 == 0 and rows != 96
    ((2560,), False),  # non-2-D scales are rejected
    ((80, 2, 16), False),
)
"""vLLM's unit tests of ``_asm_fp4_scale_swizzle_supported`` (``tests/kernels/quantization/test_rocm_mxfp4.py``,
``test_asm_fp4_scale_swizzle_supported_shape_rules``): scale shape -> ASM allowed."""


def bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    """``ulp_bf16(|v|) = 2^(e - 8)`` for ``v = m·2^e``, ``m ∈ [0.5, 1)`` (8 significant bits); 0 at 0."""
    _, e = torch.frexp(v)
    return torch.where(v == 0, torch.zeros_like(v), torch.ldexp(torch.ones_like(v), e - 8))


def gemm_tolerance(exact: torch.Tensor, magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Per element: ``ulp_bf16(|exact|) + 2·(K/32)·2^-24·Σ_k |a_k b_k|`` (``magnitude`` = ``|a| @ |b|.T``).

    E2M1 x E2M1 products are multiples of 1/4 up to 36 times a power of two, so each 32-element block
    sum (≤ 1152) is exact in fp32; the kernel adds ``K/32`` block sums in fp32 (split-K partials
    included), each addition erring by at most ``2^-24`` of the running magnitude ``≤ Σ|ab|`` (factor 2
    for the MFMA's internal block grouping); rounding the fp32 result to bf16 costs at most half a bf16
    ulp, one ulp of ``|exact|`` if the sum crossed a binade. Stricter than vLLM's ``atol 0.5`` pass-rate
    test and AITER's logging-only ``checkAllclose``; an H200 Triton measurement met
    ``1 ulp + 2^-20·Σ|ab|``.
    """
    return bf16_ulp(exact) + 2 * (k // MXFP4_BLOCK) * 2.0**-24 * magnitude


MMA_K_STEP = 16
"""k of one bf16 MMA on sm_90 (``wgmma`` / ``mma.sync.m16n8k16``)."""


def bf16_half_ulp(v: torch.Tensor) -> torch.Tensor:
    """Half a bf16 ulp at ``|v|``: ``2^(e - 9)`` for ``|v| = m·2^e``, ``m ∈ [0.5, 1)``; 0 at 0."""
    _, e = torch.frexp(v)
    return torch.where(v == 0, torch.zeros_like(v), torch.ldexp(torch.ones_like(v), e - 9))


def sm90_dot_scaled_tolerance(exact: torch.Tensor, magnitude: torch.Tensor, k: int, splits: int = 1) -> torch.Tensor:
    """Per-element bound on ``|kernel - exact|`` for an MXFP4 x MXFP4 ``tl.dot_scaled`` GEMM on sm_90.

    Triton decomposes ``dot_scaled`` on sm_90: each operand element becomes ``e2m1 · 2^(s - 127)`` in
    bf16 (exact: 2 significant bits, exponents within bf16's range), then bf16 MMAs accumulate in
    fp32. Products are exact; each MMA k-step of 16 products adds to the accumulator with an error
    of at most ``2^-22`` of the magnitude it sums (truncating alignment and normalisation, i.e. two
    fp32 units; Fasi et al., "Numerical behavior of NVIDIA tensor cores", PeerJ CS 7:e330, 2021), and
    that magnitude never exceeds ``Σ_k |a_k b_k|``; ``splits`` split-K partials add one fp32 rounding
    each. So ``E = (K/16 + splits)·2^-22·Σ|ab|``, and rounding the fp32 result to bf16 adds half an
    ulp of at most ``|exact| + E``: ``tol = ½·ulp_bf16(|exact| + E) + E``.
    """
    accumulation = (k / MMA_K_STEP + splits) * 2.0**-22 * magnitude
    return bf16_half_ulp(exact.abs() + accumulation) + accumulation


@dataclass(frozen=True)
class PortableKernel:
    """A path's kernel where it also runs besides its native hardware ("AITER Triton on CUDA"):
    ``requires`` markers, ``gemm(act, weight, scale_kn)`` (:mod:`adapters.aiter_triton`), ``splits(M)``
    (its split-K count) and ``tolerance(exact, magnitude, K, splits)``, its per-element bound there."""

    requires: tuple[str, ...]
    gemm: Callable[..., torch.Tensor]
    splits: Callable[[int], int]
    tolerance: Callable[..., torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Mxfp4LinearRecord(BackendRecord):
    """An AITER MXFP4 GEMM path.

    ``accepts(scale_shape)``: whether the path can take a layer with that weight-scale shape (the ASM
    guard's rule). ``activation_quantizer``: the AITER function vLLM's ``gemm_with_dynamic_quant``
    calls on this path; ``activation_rounding``: its MX scale rounding. ``quantize(x)`` and
    ``gemm(act, weight, scale)``: the kernel runner (:mod:`adapters.aiter`); ``tolerance(exact,
    magnitude, K)``: its per-element bound. ``on_cuda``: the same kernel on an NVIDIA GPU, if it runs there.
    """

    accepts: Callable[[tuple[int, ...]], bool]
    activation_quantizer: str
    activation_rounding: MxScaleRounding
    quantize: Callable[[torch.Tensor], Any]
    gemm: Callable[..., torch.Tensor]
    tolerance: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    on_cuda: PortableKernel | None = None

    OPTIONAL: ClassVar[frozenset[str]] = BackendRecord.OPTIONAL | {"on_cuda"}


RECORDS = (
    Mxfp4LinearRecord(
        member=AiterLinearPath.ASM,
        contract=CONTRACT,
        entry_point="aiter.gemm_a4w4 (bpreshuffle=True)",
        kernel_requires=("gfx950", "aiter"),
        sources=(
            "https://github.com/vllm-project/vllm/pull/55213",
            "https://github.com/vllm-project/vllm/pull/58139",
            "https://github.com/ROCm/aiter/pull/3212",
        ),
        accepts=asm_gemm_eligible,
        activation_quantizer="per_1x32_f4_quant_hip",
        activation_rounding=MxScaleRounding.RCEIL,
        quantize=aiter.hip_quantize,
        gemm=aiter.gemm_a4w4_bpreshuffle,
        tolerance=gemm_tolerance,
    ),
    Mxfp4LinearRecord(
        member=AiterLinearPath.TRITON,
        contract=CONTRACT,
        entry_point="aiter.ops.triton gemm_afp4wfp4",
        kernel_requires=("gfx950", "aiter"),
        sources=("https://github.com/vllm-project/vllm/pull/55213",),
        accepts=triton_eligible,
        activation_quantizer="dynamic_mxfp4_quant",
        activation_rounding=MxScaleRounding.EVEN,
        quantize=aiter.triton_quantize,
        gemm=aiter.gemm_afp4wfp4,
        tolerance=gemm_tolerance,
        on_cuda=PortableKernel(
            requires=("aiter_triton",),
            gemm=aiter_triton.gemm_afp4wfp4,
            splits=lambda m: int(aiter_triton.gemm_config(m)["NUM_KSPLIT"]),
            tolerance=sm90_dot_scaled_tolerance,
        ),
    ),
)
register(*RECORDS)
