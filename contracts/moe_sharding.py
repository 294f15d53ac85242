"""Vocabulary of the ``moe_sharding`` contract: splitting a checkpoint's FP4 experts across tensor-parallel ranks.

Protocol (:class:`MoeSharding`): ``shard_moe(weights, gated, tp)`` gets the checkpoint's global
expert weights (:class:`~contracts.moe.MoeWeights`, FC1 rows in ``weights.fc1_layout``: stacked
``[gate; up]`` or gpt-oss's row-interleaved pairs) and returns every rank's :class:`RankShard`, or
raises :class:`ShardRefused` with its own message for a degree it cannot split. An engine without a
loader for a checkpoint's form (no such checkpoint exists for it) raises
:class:`~contracts.errors.UnsupportedConfig`; the properties record that example as not served.

A rank holds ``real`` intermediate channels starting at global channel ``offset`` (FC1 rows of
both projections, FC2 columns and their scales), zero-padded to a ``buffer`` every rank shares
(engines allocate one parameter shape per layer). FC2's contraction runs over the intermediate
channels, so its scale groups run along them too: a rank boundary inside a ``block``-element group
would give two ranks one scale for elements they cannot both own, which no padding repairs
(``docs/vllm-logic.md §15``); such a split is refused or made on whole groups. ``w2_bias`` is
added once, on rank 0 (the other ranks hold zeros), as engines add it after the all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from contracts.moe import MoeWeights

CONTRACT = "moe_sharding"


class ShardRefused(ValueError):
    """A policy refuses to split a layer at a tensor-parallel degree (its message says why)."""


@dataclass(frozen=True)
class RankShard:
    """One rank's experts: channels ``[offset, offset + real)`` of the layer, zero-padded to the
    buffer ``weights.intermediate_size`` (``real`` may be smaller, or 0 on an empty last rank)."""

    weights: MoeWeights
    offset: int
    real: int


@runtime_checkable
class MoeSharding(Protocol):
    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        """Every one of the ``tp`` ranks' shards of the global experts ``weights``, in rank order."""
        ...
