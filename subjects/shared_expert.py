"""Subjects of the ``shared_expert`` contract (:mod:`contracts.shared_expert`; Qwen3-Next family, vLLM §12).

The built-in policy adapts vLLM as ``FSE resolved -> FUSED``, else ``_should_replicate_misaligned_shared_expert(I, tp, group,
enable_ep, is_sp)``: True -> REPLICATED, False -> SHARDED.

A policy object that also implements ``contracts.mxfp4_linear``'s protocol is tested as one unit:
its own linear guard receives the dense shared expert's scale shapes; otherwise the built-in
linear policy does.

Subjects shipped here: the built-in policy (vLLM after PR #55213: FSE resolved first), the old
order (``bad-fse-after-replicate``) and the whole pre-#55213 stack (``bad-pre-55213``).
"""

from __future__ import annotations

from contracts.mxfp4_linear import CONTRACT as LINEAR_CONTRACT
from contracts.shared_expert import (
    CONTRACT,
    SharedExpertPlacement,
    SharedExpertPolicy,
    SharedExpertRefused,
    SharedExpertSetup,
)
from subjects.mxfp4_linear import NoAsmGuardLinear
from subjects.registry import Subject, register_contract, register_subject


def should_replicate_misaligned(setup: SharedExpertSetup) -> bool:
    """vLLM's ``_should_replicate_misaligned_shared_expert`` (``docs/vllm-logic.md`` §12.1).

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
