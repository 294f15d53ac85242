"""Oracle pieces of the ``mxfp4_linear`` contract that other contracts' properties reuse.

:func:`swizzle_error` asks the reference ASM scale swizzle whether it takes a scale shape;
:func:`asm_defects` and :func:`fallback_needless` read the documented ASM defects; :func:`process`
runs a policy's weight processing on a zero layer and turns any exception into a property failure. The shared-expert properties run the dense shared expert through both.
"""

from __future__ import annotations

import torch

from backends.kernel_defects import AITER_LINEAR_DEFECTS, KernelDefect, covering
from backends.mxfp4_linear import AiterLinearPath, asm_gemm_eligible
from contracts.mxfp4_linear import Mxfp4LinearKernelSelection, PreparedMxfp4Linear
from harness.inputs import InputModified
from reference.errors import ShapeContractError
from reference.formats import MXFP4_BLOCK
from reference.layouts import vllm_asm_scale_swizzle


def swizzle_error(scale_shape: tuple[int, ...]) -> str | None:
    """The reference ASM swizzle's error on a scale of ``scale_shape`` (None if it accepts it)."""
    try:
        vllm_asm_scale_swizzle(torch.empty(scale_shape, dtype=torch.uint8))
    except ShapeContractError as exc:
        return str(exc)
    return None


def asm_defects(scale_shape: tuple[int, ...]) -> list[KernelDefect]:
    """The documented ASM-kernel defects (:data:`~backends.kernel_defects.AITER_LINEAR_DEFECTS`) covering a scale shape."""
    return covering(AITER_LINEAR_DEFECTS, AiterLinearPath.ASM.value, scale_shape)


def fallback_needless(scale_shape: tuple[int, ...]) -> bool:
    """Falling back to Triton is a needless slow path: the ASM path takes the layer
    (:func:`~backends.mxfp4_linear.asm_gemm_eligible`) and no documented defect, required or not, gives
    a reason to avoid it."""
    return asm_gemm_eligible(scale_shape) and not asm_defects(scale_shape)


def process(policy: Mxfp4LinearKernelSelection, n: int, k: int, asm_enabled: bool) -> PreparedMxfp4Linear:
    """Run the policy's weight processing on a zero layer of the real ``(N, K)`` (a guard may route on
    any size it sees); any exception fails the property, an input write with its own message."""
    weight = torch.zeros(n, k // 2, dtype=torch.uint8)
    scale = torch.full((n, k // MXFP4_BLOCK), 127, dtype=torch.uint8)
    try:
        return policy.process_mxfp4_linear_weights(weight, scale, asm_enabled)
    except InputModified:
        raise
    except Exception as exc:
        raise AssertionError(
            f"weight processing raised for weight [{n}, {k // 2}], scale ({n}, {k // MXFP4_BLOCK}) "
            f"(asm_enabled={asm_enabled}): {type(exc).__name__}: {exc}"
        ) from exc
