"""Subjects of the ``mxfp4_linear`` contract (:mod:`contracts.mxfp4_linear`): AITER kernel selection and
weight preparation for an MXFP4 linear layer.

The built-in policy is vLLM's ``AiterMxfp4LinearKernel`` after PRs #55213 and #58139: the ASM guard
and each path's activation rounding are the records' (:mod:`backends.mxfp4_linear`), the layouts the
reference's. Known-bad subjects reproduce the guard's and the model's historical mistakes.
"""

from __future__ import annotations

import torch

from backends import record
from backends.mxfp4_linear import AiterLinearPath, asm_gemm_eligible
from contracts.mxfp4_linear import CONTRACT, Mxfp4LinearKernelSelection, PreparedMxfp4Linear
from reference.formats import MxScaleRounding
from reference.layouts import aiter_shuffle_weight, asm_scale_swizzle_ok, vllm_asm_scale_swizzle
from subjects.registry import Subject, register_contract, register_subject


class BuiltinMxfp4Linear:
    """Correct policy: vLLM's ``AiterMxfp4LinearKernel`` after PRs #55213 and #58139."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return asm_gemm_eligible(tuple(scale_shape))

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        swizzled = vllm_asm_scale_swizzle(scale)  # the scale first, as vLLM does
        return PreparedMxfp4Linear(AiterLinearPath.ASM, aiter_shuffle_weight(weight), swizzled)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return PreparedMxfp4Linear(
            AiterLinearPath.TRITON, weight.clone(), scale.T.clone(memory_format=torch.contiguous_format)
        )

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        if asm_enabled and self.use_asm_gemm(tuple(scale.shape)):
            return self.prepare_asm_linear(weight, scale)
        return self.prepare_triton_linear(weight, scale)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return record(path).activation_rounding


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
        reproduces="over-strict fallback predicate (performance class, docs/regressions.md §1 'Over-padding cost')",
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
        reproduces="docs/formats.md §7: dynamic_mxfp4_quant rounds Even, per_1x32_f4_quant_hip RoundUp",
    )
)
