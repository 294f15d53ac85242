"""Vocabulary of the ``shared_expert`` contract: where a MoE block's shared expert runs.

A shared expert (intermediate size ``I``) is either fused into the routed experts (AITER fused
shared experts, FSE: expert id ``num_experts`` of the fused MoE, sharded with the routed experts
under the MoE padding rules), a tensor-parallel dense MLP (column-parallel ``gate_up_proj``,
row-parallel ``down_proj`` of ``I/tp`` input features), a **replicated** dense MLP
(``disable_tp=True``, run outside the fused MoE, output added after), or refused.

Protocol (:class:`SharedExpertPolicy`): ``shared_expert_placement(setup) -> SharedExpertPlacement``
or raise ``ValueError`` (refusal, :class:`SharedExpertRefused`) with a message naming the size and
the TP degree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
