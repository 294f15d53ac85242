"""Oracle pieces of the ``mxfp4_linear`` contract that other contracts' properties reuse.

:func:`swizzle_error` asks the reference ASM scale swizzle whether it takes a scale shape;
:func:`process` runs a policy's weight processing on a zero layer and turns any exception into a
property failure. The shared-expert properties run the dense shared expert through both.
"""

from __future__ import annotations

import torch

from contracts.mxfp4_linear import Mxfp4LinearKernelSelection, PreparedMxfp4Linear
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


def process(policy: Mxfp4LinearKernelSelection, n: int, k: int, asm_enabled: bool) -> PreparedMxfp4Linear:
    """Run the policy's weight processing on a zero layer of ``(N, K)``; any exception fails the property."""
    weight = torch.zeros(n, k // 2, dtype=torch.uint8)
    scale = torch.full((n, k // MXFP4_BLOCK), 127, dtype=torch.uint8)
    try:
        return policy.process_mxfp4_linear_weights(weight, scale, asm_enabled)
    except Exception as exc:
        raise AssertionError(
            f"weight processing raised for weight [{n}, {k // 2}], scale ({n}, {k // MXFP4_BLOCK}) "
            f"(asm_enabled={asm_enabled}): {type(exc).__name__}: {exc}"
        ) from exc
