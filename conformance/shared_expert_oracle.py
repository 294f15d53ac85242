"""Oracle of the ``shared_expert`` contract: where a shared expert must run, and vLLM's unit-test table.

:func:`expected_placement` is written from the contract (vLLM's ``_should_replicate_misaligned_shared_expert``
after fusion is resolved), independently of the built-in policy in :mod:`subjects.shared_expert`;
:data:`VLLM_DECISION_TABLE` pins vLLM's own unit tests and the fusion-order cases.
"""

from __future__ import annotations

from contracts.shared_expert import SharedExpertPlacement, SharedExpertSetup
from reference.errors import ShapeContractError
from reference.sizes import even_split
from strategies.shared_expert import shared_expert_case

ABSENT, FUSED = SharedExpertPlacement.ABSENT, SharedExpertPlacement.FUSED
SHARDED, REPLICATED = SharedExpertPlacement.SHARDED, SharedExpertPlacement.REPLICATED
REFUSED = "refused"

QWEN38 = "qwen3.8-flash-next"
VLLM_DECISION_TABLE = (
    (shared_expert_case(QWEN38, 1), SHARDED),
    (shared_expert_case(QWEN38, 2), SHARDED),
    (shared_expert_case(QWEN38, 4), SHARDED),
    (shared_expert_case(QWEN38, 8), REFUSED),  # partition of 80, not a multiple of 32
    (shared_expert_case(QWEN38, 8, ep=True), REPLICATED),
    (shared_expert_case(QWEN38, 8, ep=True, intermediate=672), REPLICATED),
    (shared_expert_case(QWEN38, 8, ep=True, fse=True), FUSED),  # vLLM PR #55213: the old order replicated
    (shared_expert_case(QWEN38, 8, fse=True), FUSED),  # the old order refused
    (shared_expert_case(QWEN38, 8, ep=True, fse=True, compatible=False), REPLICATED),  # SGLang #22948 class
    (shared_expert_case(QWEN38, 8, sp=True), REPLICATED),
)
"""vLLM's ``_should_replicate_misaligned_shared_expert`` unit tests (group 32) and the FSE ordering cases."""


def expected_placement(setup: SharedExpertSetup) -> SharedExpertPlacement | str:
    """The contract (vLLM §12.1 after §12.3): no expert; fused if FSE is on and compatible; sharded
    when there is no group or the even split keeps whole groups (``reference.sizes.even_split``);
    replicated under EP or sequence parallelism; otherwise refused."""
    if setup.intermediate <= 0:
        return ABSENT
    if setup.fse_enabled and setup.fse_quant_compatible:
        return FUSED
    if setup.group is None:
        return SHARDED
    try:
        even_split(setup.intermediate, setup.tp, setup.group)
        return SHARDED
    except ShapeContractError:
        pass
    return REPLICATED if setup.expert_parallel or setup.sequence_parallel else REFUSED
