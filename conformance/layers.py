"""The layer a drawn configuration describes, aligned by the policy under test (shared by property modules)."""

from __future__ import annotations

from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.moe_checks import align_checked
from contracts.moe import AlignedMoe, MoeAlignment
from reference.formats import NVFP4_BLOCK
from strategies.moe import MoeShape
from strategies.tensors import MoeCase, moe_case


def align_nvfp4(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, MoeCase]:
    """The NVFP4 layer of ``shape`` (:func:`strategies.tensors.moe_case`) and ``policy``'s alignment of it."""
    case = moe_case(shape, NVFP4_BLOCK)
    return align_checked(policy, backend, case.weights, shape.gated, shape.describe()), case
