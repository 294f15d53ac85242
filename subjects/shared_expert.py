"""Contract ``shared_expert``: where a MoE block's shared expert runs (Qwen3-Next family, vLLM §12).

A shared expert (intermediate size ``I``) is either fused into the routed experts (AITER fused
shared experts, FSE: expert id ``num_experts`` of the fused MoE, sharded with the routed experts
under the MoE padding rules), a tensor-parallel dense MLP (column-parallel ``gate_up_proj``,
row-parallel ``down_proj`` of ``I/tp`` input features), a **replicated** dense MLP
(``disable_tp=True``, run outside the fused MoE, output added after), or refused.

Protocol (:class:`SharedExpertPolicy`): ``shared_expert_placement(setup) -> SharedExpertPlacement``
or raise ``ValueError`` (refusal) with a message naming the size and the TP degree. It adapts vLLM
as ``FSE resolved -> FUSED``, else ``_should_replicate_misaligned_shared_expert(I, tp, group,
enable_ep, is_sp)``: True -> REPLICATED, False -> SHARDED.

A policy object that also implements ``subjects.mxfp4_linear``'s protocol is tested as one unit:
its own linear guard receives the dense shared expert's scale shapes; otherwise the built-in
linear policy does.

Subjects shipped here: the built-in policy (vLLM after PR #55213: FSE resolved first), the old
order (``bad-fse-after-replicate``) and the whole pre-#55213 stack (``bad-pre-55213``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from subjects.mxfp4_linear import CONTRACT as LINEAR_CONTRACT
from subjects.mxfp4_linear import NoAsmGuardLinear
from subjects.registry import Subject, register_contract, register_subject

CONTRACT = "shared_expert"


class SharedExpertPlacement(enum.Enum):
    ABSENT = "absent"  # no shared expert (I <= 0)
    FUSED = "fused"  # AITER FSE: an extra expert of the fused MoE
    SHARDED = "sharded"  # dense MLP, tensor-parallel
    REPLICATED = "replicated"  # dense MLP, disable_tp=True


class SharedExpertRefused(ValueError):
    """The shared expert cannot be placed under this parallel configuration."""


@dataclass(frozen=True)
class SharedExpertSetup:
    """The inputs of the decision.

    ``group``: the OCP-MX group of ``shared_expert.down_proj`` (32 for Quark OCP-MX, None when
    the layer is not Quark or is excluded from quantization). ``fse_enabled``: AITER's
    fused-shared-experts switch; ``fse_quant_compatible``: ``is_shared_expert_quant_fse_compatible``.
    """

    intermediate: int
    tp: int
    group: int | None
    expert_parallel: bool
    sequence_parallel: bool
    fse_enabled: bool
    fse_quant_compatible: bool


@runtime_checkable
class SharedExpertPolicy(Protocol):
    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        """Where the shared expert runs; raise ``ValueError`` to refuse the configuration."""
        ...


def should_replicate_misaligned(setup: SharedExpertSetup) -> bool:
    """vLLM's ``_should_replicate_misaligned_shared_expert`` (``vllm-logic.md`` §12.1).

    False when there is nothing to align (``I <= 0`` or no group) or the split keeps whole groups
    (``I % tp == 0`` and ``(I/tp) % group == 0``); True (replicate) under EP or sequence
    parallelism; otherwise raises :class:`SharedExpertRefused`.
    """
    i, tp, group = setup.intermediate, setup.tp, setup.group
    if i <= 0 or group is None:
        return False
    part, rem = divmod(i, tp)
    if rem == 0 and part % group == 0:
        return False
    if setup.expert_parallel or setup.sequence_parallel:
        return True
    if rem:
        raise SharedExpertRefused(f"shared-expert intermediate size {i} must be divisible by tensor-parallel size {tp}")
    raise SharedExpertRefused(
        f"the OCP-MX shared expert cannot be tensor-parallelized: intermediate size {i} at TP size {tp} gives "
        f"{part} per rank, not a multiple of the group size {group}; choose another TP size or enable EP"
    )


def fse_resolved(setup: SharedExpertSetup) -> bool:
    """``resolve_layer_fused_shared_expert``: FSE switched on and the quantization FSE-compatible."""
    return setup.fse_enabled and setup.fse_quant_compatible


class BuiltinSharedExpert:
    """Correct policy (vLLM after PR #55213): resolve FSE first; only an unfused expert meets the gate."""

    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        if setup.intermediate <= 0:
            return SharedExpertPlacement.ABSENT
        if fse_resolved(setup):
            return SharedExpertPlacement.FUSED
        if should_replicate_misaligned(setup):
            return SharedExpertPlacement.REPLICATED
        return SharedExpertPlacement.SHARDED


class FseAfterReplicateSharedExpert:
    """vLLM before PR #55213: the replicate gate first, FSE only ``if I > 0 and not replicate``."""

    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        if setup.intermediate <= 0:
            return SharedExpertPlacement.ABSENT
        if should_replicate_misaligned(setup):
            return SharedExpertPlacement.REPLICATED
        return SharedExpertPlacement.FUSED if fse_resolved(setup) else SharedExpertPlacement.SHARDED


class Pre55213(FseAfterReplicateSharedExpert, NoAsmGuardLinear):
    """The whole pre-#55213 stack: old decision order and no ASM guard on the dense shared expert."""


register_contract(CONTRACT, SharedExpertPolicy, BuiltinSharedExpert())
register_subject(
    Subject(
        "bad-fse-after-replicate",
        "shared expert: replicate gate evaluated before fused-shared-expert resolution",
        {CONTRACT: FseAfterReplicateSharedExpert()},
        reproduces="vLLM PR #55213 (Qwen3.8-Flash-Next TP8+EP: FSE-capable shared expert replicated, unfused)",
    )
)
_PRE = Pre55213()
register_subject(
    Subject(
        "bad-pre-55213",
        "old shared-expert order and no AITER ASM guard (the Qwen3.8-Flash-Next MI350x load crash)",
        {CONTRACT: _PRE, LINEAR_CONTRACT: _PRE},
        reproduces="vLLM PR #55213 (TP8+EP: replicated down_proj scale (2560, 20) sent to the ASM swizzle)",
    )
)
