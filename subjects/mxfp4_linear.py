"""Contract ``mxfp4_linear``: AITER kernel selection and weight preparation for an MXFP4 linear layer.

vLLM's ``AiterMxfp4LinearKernel`` (``vllm-logic.md`` §11) runs a dense MXFP4 layer either on
AITER's ASM FP4 GEMM (``gemm_a4w4`` with ``bpreshuffle``) or on the Triton ``gemm_afp4wfp4``.
The ASM path needs the weight in ``shuffle_weight`` (16, 16) order and the UE8M0 weight scale
``(N, K/32)`` swizzled by an **unpadded** 7-D view, which only exists for ``rows % 32 == 0`` and
``cols % 8 == 0``; every other layer must fall back to Triton, whose scale is stored transposed
and contiguous, ``(K/32, N)``.

Protocol (:class:`Mxfp4LinearKernelSelection`), one method per step of the real code, so vLLM's
functions adapt directly:

* ``use_asm_gemm(scale_shape) -> bool``: the guard (``_asm_fp4_scale_swizzle_supported`` on a
  tensor of that shape); it sees any rank, non-2-D shapes must be refused;
* ``prepare_asm_linear(weight, scale)`` / ``prepare_triton_linear(weight, scale)``: each path's
  layout (the two branches of ``process_weights_after_loading``), returning
  :class:`PreparedMxfp4Linear`;
* ``process_mxfp4_linear_weights(weight, scale, asm_enabled)``: the whole
  ``process_weights_after_loading`` with ``use_asm_gemm`` preset to ``asm_enabled`` (the
  ``VLLM_ROCM_USE_AITER_FP4_ASM_GEMM`` switch): guard, then one of the two preparations;
* ``linear_activation_rounding(path)``: the MX scale rounding of the activation quantizer each
  path runs (HIP ``per_1x32_f4_quant``: RoundUp = RCEIL since AITER PR #3212; Triton
  ``dynamic_mxfp4_quant``: Even).

Weights are packed uint8 ``[N, K/2]``; scales are uint8 UE8M0 bytes ``[N, K/32]``. A policy may
raise; the properties report any exception from a preparation as a failure.

What a guard may read: ``use_asm_gemm`` gets the layer's real rank-local scale shape ``(N, K/32)``,
and ``process_mxfp4_linear_weights`` real-shaped tensors, so a guard may route on N and K with any
threshold, and on dtypes and devices; the tensor contents are test data (zero codes, scale 1.0), so
not on values. The token count M is unknown at weight processing and not part of the contract: a
kernel defect that depends on M is routed around per shape, and a shape a guard avoids for a
reason other than the swizzle's layout needs a documented defect record
(:data:`subjects.kernel_defects.AITER_LINEAR_DEFECTS`). ``prepare_asm_linear`` and
``prepare_triton_linear`` are layouts, not guards: the numerical properties call them on reduced
tensors (same N mod 32, K mod 256), so they must not route.

Subjects shipped here: the built-in policy (vLLM after PRs #55213 and #58139) and known-bad ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.formats import MxScaleRounding
from reference.layouts import aiter_shuffle_weight, asm_scale_swizzle_ok, vllm_asm_scale_swizzle
from subjects.kernel_defects import AITER_LINEAR_DEFECTS, covering
from subjects.registry import Subject, register_contract, register_subject

CONTRACT = "mxfp4_linear"


class AiterLinearPath(enum.Enum):
    """The two AITER GEMM paths of an MXFP4 linear layer (the contract's backends)."""

    ASM = "aiter-asm"  # per_1x32_f4_quant_hip + gemm_a4w4(bpreshuffle=True) / gemm_afp4wfp4_preshuffle
    TRITON = "aiter-triton"  # dynamic_mxfp4_quant + gemm_afp4wfp4 (any K % 32, any N)


@dataclass(frozen=True)
class PreparedMxfp4Linear:
    """A layer after weight processing: ``path`` and its tensors.

    ASM: ``weight`` is ``shuffle_weight`` (16, 16) of ``[N, K/2]`` (same shape), ``scale`` the
    unpadded swizzle, ``(N, K/32)``. Triton: ``weight`` unchanged, ``scale`` = ``scale.T`` stored
    contiguous, ``(K/32, N)`` (the GEMM gets its ``.T`` view).
    """

    path: AiterLinearPath
    weight: torch.Tensor
    scale: torch.Tensor


@runtime_checkable
class Mxfp4LinearKernelSelection(Protocol):
    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        """Whether a layer whose weight scale has ``scale_shape`` may run on the ASM FP4 GEMM."""
        ...

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        """The ASM layout of ``weight [N, K/2]`` and ``scale [N, K/32]``."""
        ...

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        """The Triton layout of ``weight [N, K/2]`` and ``scale [N, K/32]``."""
        ...

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        """Weight processing after loading: pick the path (ASM only if enabled and guarded), prepare."""
        ...

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        """The MX scale rounding of the activation quantizer ``path`` runs."""
        ...


def asm_gemm_eligible(scale_shape: tuple[int, ...]) -> bool:
    """2-D, the unpadded swizzle is valid (``rows % 32``, ``cols % 8``, ``rows >= 32``) and no documented
    ASM defect that must be avoided covers the shape (:data:`~subjects.kernel_defects.AITER_LINEAR_DEFECTS`:
    the 96-row rule of vLLM PR #58139)."""
    if len(scale_shape) != 2:
        return False
    required = [d for d in covering(AITER_LINEAR_DEFECTS, AiterLinearPath.ASM.value, scale_shape) if d.required]
    return asm_scale_swizzle_ok(*scale_shape) and not required


ACTIVATION_ROUNDING = {AiterLinearPath.ASM: MxScaleRounding.RCEIL, AiterLinearPath.TRITON: MxScaleRounding.EVEN}
"""AITER's activation quantizers: HIP ``per_1x32_f4_quant_hip`` RoundUp (AITER >= PR #3212), Triton
``dynamic_mxfp4_quant`` Even (``formats.md`` §7, ``kernels.md`` §8.3)."""


class BuiltinMxfp4Linear:
    """Correct policy: vLLM's ``AiterMxfp4LinearKernel`` after PRs #55213 and #58139."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return asm_gemm_eligible(tuple(scale_shape))

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        swizzled = vllm_asm_scale_swizzle(scale)  # the scale first, as vLLM does
        return PreparedMxfp4Linear(AiterLinearPath.ASM, aiter_shuffle_weight(weight), swizzled)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return PreparedMxfp4Linear(AiterLinearPath.TRITON, weight, scale.T.contiguous())

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        if asm_enabled and self.use_asm_gemm(tuple(scale.shape)):
            return self.prepare_asm_linear(weight, scale)
        return self.prepare_triton_linear(weight, scale)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return ACTIVATION_ROUNDING[path]


class NoAsmGuardLinear(BuiltinMxfp4Linear):
    """vLLM before PR #55213: ASM whenever enabled; the 7-D view raises on (2560, 20), (2560, 10), ..."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return True


class OverconservativeGuardLinear(BuiltinMxfp4Linear):
    """A guard that mistakes ``e8m0_shuffle``'s 256-row padding for a requirement (``rows % 256``):
    correct but slow, it sends (32, 8), (128, 160), DeepSeek-V3 fused_qkv_a_proj (2112, 224) ... to Triton."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return len(scale_shape) == 2 and scale_shape[0] % 256 == 0 and asm_gemm_eligible(tuple(scale_shape))


class LayoutOnlyGuardLinear(BuiltinMxfp4Linear):
    """vLLM after PR #55213, before PR #58139: the layout guard alone keeps (96, 160) on ASM."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return len(scale_shape) == 2 and asm_scale_swizzle_ok(*scale_shape)


class SingleActivationRoundingLinear(BuiltinMxfp4Linear):
    """Models both paths' activation quantizers as RoundUp: the Triton fallback actually rounds Even,
    so the modelled output is wrong on blocks whose amax mantissa lies in (1.5, 1.75)."""

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return MxScaleRounding.RCEIL


register_contract(CONTRACT, Mxfp4LinearKernelSelection, BuiltinMxfp4Linear(), tuple(AiterLinearPath))
register_subject(
    Subject(
        "bad-no-asm-guard",
        "MXFP4 linear: the unpadded ASM scale swizzle applied to every layer (no fallback)",
        {CONTRACT: NoAsmGuardLinear()},
        reproduces="vLLM PR #55213 (Qwen3.8-Flash-Next on MI350x: shape '[80, 2, 16, 1, 2, 4, 1]' is invalid)",
    )
)
register_subject(
    Subject(
        "bad-overconservative-guard",
        "MXFP4 linear: the ASM guard also requires rows % 256 (falls back where ASM works: slower)",
        {CONTRACT: OverconservativeGuardLinear()},
        reproduces="over-strict fallback predicate (performance class, regressions.md §1 'Over-padding cost')",
    )
)
register_subject(
    Subject(
        "bad-asm-96-rows",
        "MXFP4 linear: layout-only ASM guard, keeps 96-row scales on the ASM GEMM",
        {CONTRACT: LayoutOnlyGuardLinear()},
        reproduces="vLLM PR #58139 (Qwen3.8 TP1 GDN in_proj_ba scale (96, 160): ASM wrong at M <= 64)",
    )
)
register_subject(
    Subject(
        "bad-single-act-rounding",
        "MXFP4 linear: the Triton fallback's activation quantizer modelled with the ASM path's RoundUp",
        {CONTRACT: SingleActivationRoundingLinear()},
        reproduces="formats.md §7: dynamic_mxfp4_quant rounds Even, per_1x32_f4_quant_hip RoundUp",
    )
)
