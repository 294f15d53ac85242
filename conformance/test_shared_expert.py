"""Contract ``shared_expert``: fuse, shard, replicate or refuse a MoE block's shared expert (vLLM §12).

For every shared expert a catalogued model has (and adversarial sizes), under every TP degree,
EP / sequence-parallel setting, quantization group and AITER fused-shared-experts state, the
policy under test resolves fusion first (an enabled, compatible fusion never triggers
replication), then follows ``_should_replicate_misaligned_shared_expert`` (shard when the split
keeps whole 32-element groups, replicate under EP or SP, else refuse with a clear error), and the
dense layers of an unfused expert never send an unswizzlable weight scale to AITER's ASM GEMM.

Pinned regressions (``@example``): vLLM's unit-test table (640 at TP 1/2/4 shards, 640 at TP8
refuses, 640 / 672 at TP8 + EP replicate) and vLLM PR #55213's Qwen3.8-Flash-Next TP8 + EP with
FSE on (fused; the old order replicated it and crashed the ASM swizzle on scale (2560, 20)).
"""

from __future__ import annotations

import pytest

from conformance.linear_oracle import process, swizzle_error
from conformance.shared_expert_oracle import REFUSED, VLLM_DECISION_TABLE, expected_placement
from contracts.mxfp4_linear import Mxfp4LinearKernelSelection
from contracts.shared_expert import CONTRACT, SharedExpertPlacement, SharedExpertPolicy
from harness.properties import check, record_event
from reference.formats import MXFP4_BLOCK
from strategies.shared_expert import SharedExpertCase, dense_layer_shapes, shared_expert_cases
from subjects.mxfp4_linear import BuiltinMxfp4Linear

pytestmark = [pytest.mark.contract(CONTRACT)]

FUSED = SharedExpertPlacement.FUSED

PINS = [case for case, _ in VLLM_DECISION_TABLE]
"""Pinned regressions of every property (run first, filtered by ``--model/--tp/--ep``)."""


def decide(policy: SharedExpertPolicy, case: SharedExpertCase) -> tuple[SharedExpertPlacement | None, str | None]:
    """``(placement, None)`` or ``(None, refusal message)``; a refusal must be a ``ValueError``."""
    try:
        placement = policy.shared_expert_placement(case.setup())
    except ValueError as exc:
        record_event("refused")
        return None, str(exc)
    record_event(placement.value)
    return placement, None


@check(CONTRACT, SharedExpertCase, strategy=shared_expert_cases(), pins=PINS)
def check_fusion_resolved_first(case: SharedExpertCase, backend: None, policy: SharedExpertPolicy) -> None:
    """A shared expert with FSE on and compatible is fused, whatever the TP alignment: fusion is decided
    before the replicate gate and never triggers replication or a refusal; otherwise it is never fused."""
    placement, refusal = decide(policy, case)
    fusable = case.intermediate > 0 and case.fse_enabled and case.fse_quant_compatible
    if fusable:
        assert refusal is None, f"refused a shared expert that FSE fuses (fusion must be resolved first): {refusal}"
        assert placement is FUSED, (
            f"placed a fusable shared expert as {placement.value}: FSE must be resolved before the replicate "
            "gate, and an enabled fusion never replicates (vLLM PR #55213)"
        )
    else:
        assert placement is not FUSED, "fused a shared expert although FSE is off, incompatible or there is none"


@check(CONTRACT, SharedExpertCase, strategy=shared_expert_cases(), pins=PINS)
def check_decision_table(case: SharedExpertCase, backend: None, policy: SharedExpertPolicy) -> None:
    """The placement follows vLLM §12.1 after the ordering fix; a refusal is a ``ValueError`` naming the
    shared-expert size and the TP degree."""
    want = expected_placement(case.setup())
    placement, refusal = decide(policy, case)
    if refusal is not None:
        assert want == REFUSED, f"refused ({refusal}); the contract says {getattr(want, 'value', want)}"
        for what, number in (("intermediate size", case.intermediate), ("TP degree", case.tp)):
            assert str(number) in refusal, f"refusal does not name the {what} {number}: {refusal!r}"
        return
    assert want != REFUSED, (
        f"accepted as {placement.value}, but TP={case.tp} cuts the {case.intermediate}-wide shared expert's "
        f"{case.group}-element groups and neither EP nor SP allows replication: it must refuse"
    )
    assert placement is want, f"placed as {placement.value}; the contract says {want.value}"


@check(CONTRACT, SharedExpertCase, strategy=shared_expert_cases(), pins=PINS)
def check_dense_expert_reaches_no_unswizzlable_asm(
    case: SharedExpertCase, backend: None, policy: SharedExpertPolicy
) -> None:
    """The dense MXFP4 layers of an unfused shared expert (sharded or replicated) are loadable on the
    rank, and the linear guard sends none of their weight scales to the ASM GEMM unless the unpadded
    swizzle takes it; their weight processing succeeds. The linear policy is the subject's own when it
    implements both contracts, else the built-in one."""
    placement, refusal = decide(policy, case)
    if refusal is not None or case.group is None:
        return
    linear = policy if isinstance(policy, Mxfp4LinearKernelSelection) else BuiltinMxfp4Linear()
    for layer, shape in dense_layer_shapes(case, placement):
        assert shape is not None, (
            f"{placement.value} shared expert: a rank cannot hold {layer.name} at TP={case.tp} "
            f"(I/TP = {case.intermediate}/{case.tp} is not a whole number of {MXFP4_BLOCK}-element groups)"
        )
        scale = tuple(shape.scale_shape)
        error = swizzle_error(scale) if linear.use_asm_gemm(scale) else None
        assert error is None, f"{placement.value} shared expert's {layer.name} sent to the ASM GEMM: {error}"
        record_event(f"{layer.name} scale {'ASM' if linear.use_asm_gemm(scale) else 'Triton'}")
        process(linear, *shape.prep_shape(), asm_enabled=True)
