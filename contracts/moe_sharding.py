"""Vocabulary of the ``moe_sharding`` contract: splitting a checkpoint's FP4 or block-FP8 experts across TP x EP ranks.

Protocol (:class:`MoeSharding`): ``shard_moe(weights, gated, tp, *, ep=1, backend=None)`` gets the
checkpoint's global expert weights (:class:`~contracts.moe.MoeWeights`, FC1 rows in
``weights.fc1_layout``: stacked ``[gate; up]`` or gpt-oss's row-interleaved pairs) and returns every
one of the ``tp·ep`` ranks' :class:`RankShard`, EP-major: rank ``r`` is EP rank ``r // tp`` and TP
rank ``r % tp`` (:func:`rank_coordinates`; SGLang's ``moe_ep_rank = rank // moe_tp_size``,
``moe_tp_rank = rank % moe_tp_size``). ``backend`` is the kernel backend whose layer loads the shard, a
member of the ``nvfp4_moe`` / ``mxfp4_moe`` / ``fp8_moe`` backend enum of the checkpoint's format (an engine picks that
runner's loader and buffer; None: the policy's default). A policy raises
:class:`ShardRefused` with its own message for a degree it cannot split; an engine without a loader
for a checkpoint's form (no such checkpoint exists for it) raises
:class:`~contracts.errors.UnsupportedConfig`, recorded by the properties as not served.

Experts: each EP rank holds a set of global experts (``RankShard.experts``, in its local order; its
``weights`` hold only those), every TP rank of one EP rank the same set, and every expert lives on
exactly one EP rank (redundant EPLB replicas are out of scope). An EP rank may hold no expert when
``E < ep``.

Channels: within its experts a rank holds ``real`` intermediate channels starting at global channel
``offset`` (FC1 rows of both projections, FC2 columns and their scales), placed at buffer positions
``[start, start + real)`` of a zero-padded ``buffer`` every rank shares (engines allocate one
parameter shape per layer); ``start > 0`` is a split that pads in front of the real channels.
FC2's contraction runs over the intermediate channels, so its scale groups run along them too: a
rank boundary inside a ``block``-element group would give two ranks one scale for elements they
cannot both own, which no padding repairs (``docs/vllm-logic.md §15``); such a split is refused or
made on whole groups, and ``start`` is a whole number of groups. Block-FP8's 128x128 tiles run along the
channels in FC1's rows too, so its ranks hold whole 128-channel tiles (vLLM 0.33.0
``pad_tp_shard_to_weight_blocks``, vLLM PR #55867: an even share of ``I/tp`` channels that cuts a tile is
given ``cdiv(I/128, tp)`` whole tiles per rank instead, the last ranks short or empty). Per-expert scales
belong to their experts: an EP rank holds its own experts' scales, not the checkpoint's first ones
(SGLang #36597).

Biases: ``w13_bias`` is split with its FC1 channels. ``w2_bias`` is added after FC2, whose partial
outputs the TP ranks sum (all-reduce), so each expert's ``w2_bias`` is held whole by exactly one TP
rank of the EP rank holding the expert and is zero on the others: TP rank 0 in vLLM 0.33.0
(``GptOssModel._load_weights_mxfp4``: ``if tp_rank != 0: weight.zero_()``) and SGLang 0.5.23
(``GptOssForCausalLM._load_mxfp4_experts_weights``: ``down_proj_bias`` sliced to the EP rank's
experts, zeros where ``moe_tp_rank != 0``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from contracts.moe import MoeWeights

CONTRACT = "moe_sharding"


class ShardRefused(ValueError):
    """A policy refuses to split a layer at a TP x EP degree (its message says why)."""


@dataclass(frozen=True)
class RankShard:
    """One rank's experts ``experts`` (global ids, in the order of ``weights``' expert dimension) with
    channels ``[offset, offset + real)`` of the layer at buffer positions ``[start, start + real)`` of
    the buffer ``weights.intermediate_size``, the rest zero (``real`` may be 0 on an empty rank)."""

    weights: MoeWeights
    offset: int
    real: int
    experts: tuple[int, ...]
    start: int = 0


def rank_coordinates(rank: int, tp: int) -> tuple[int, int]:
    """``(ep_rank, tp_rank)`` of global rank ``rank`` (EP-major: ``rank = ep_rank·tp + tp_rank``)."""
    return divmod(rank, tp)


@runtime_checkable
class MoeSharding(Protocol):
    def shard_moe(
        self,
        weights: MoeWeights,
        gated: bool,
        tp: int,
        *,
        ep: int = 1,
        backend: enum.Enum | None = None,
    ) -> tuple[RankShard, ...]:
        """Every one of the ``tp·ep`` ranks' shards of the global experts ``weights``, EP-major."""
        ...
