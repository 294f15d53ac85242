"""Subjects of the ``moe_sharding`` contract (:mod:`contracts.moe_sharding`): splitting a checkpoint's
FP4 experts across tensor-parallel ranks.

The built-in policy splits evenly where that keeps whole groups, else in whole blocks per rank with
short or empty last ranks (as the gpt-oss loader does); known-bad ones cut groups or split the fused
FC1 tensor as one block.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from contracts.moe import MoeWeights
from contracts.moe_sharding import CONTRACT, MoeSharding, RankShard, ShardRefused
from reference.layouts import join_fc1, split_fc1
from reference.padding import pad_dim
from reference.sizes import whole_block_split
from subjects.registry import Subject, register_contract, register_subject


def take_channels(weights: MoeWeights, gated: bool, offset: int, real: int, buffer: int, rank: int) -> MoeWeights:
    """Channels ``[offset, offset + real)`` of ``weights`` (both FC1 projections, FC2 columns, scales and
    ``w13_bias``) zero-padded to ``buffer`` channels; ``w2_bias`` on rank 0 only."""
    block = weights.block
    layout = weights.fc1_layout

    def fc1(x: torch.Tensor, dim: int) -> torch.Tensor:
        halves = split_fc1(x, layout, dim) if gated else (x,)
        parts = [pad_dim(h.narrow(dim, offset, real), dim, buffer) for h in halves]
        return join_fc1(*parts, layout, dim) if gated else parts[0]

    def fc2(x: torch.Tensor, per: int) -> torch.Tensor:
        return pad_dim(x[..., offset // per : (offset + real) // per], -1, buffer // per)

    return MoeWeights(
        w13=fc1(weights.w13, -2),
        w13_scale=fc1(weights.w13_scale, -2),
        w2=fc2(weights.w2, 2),
        w2_scale=fc2(weights.w2_scale, block),
        block=block,
        fc1_layout=layout,
        w13_bias=None if weights.w13_bias is None else fc1(weights.w13_bias, -1),
        w2_bias=None if weights.w2_bias is None else weights.w2_bias * (1 if rank == 0 else 0),
    )


def split_sizes(size: int, tp: int, block: int) -> tuple[int, ...]:
    """Real channels per rank: ``size / tp`` each when that is a whole number of ``block``-element
    groups, else whole blocks per rank (``cdiv(size / block, tp)`` blocks, short or empty last ranks)."""
    part, rem = divmod(size, tp)
    if rem == 0 and part % block == 0:
        return (part,) * tp
    return whole_block_split(size, tp, block)


def shards_of(weights: MoeWeights, gated: bool, sizes: tuple[int, ...]) -> tuple[RankShard, ...]:
    """The shards of consecutive channel ranges of ``sizes`` (buffer: the largest)."""
    buffer, offsets = max(sizes), [sum(sizes[:r]) for r in range(len(sizes))]
    return tuple(
        RankShard(take_channels(weights, gated, o, n, buffer, r), o, n)
        for r, (o, n) in enumerate(zip(offsets, sizes, strict=True))
    )


class BuiltinMoeSharding:
    """Correct policy: :func:`split_sizes`, consecutive ranges in rank order."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        return shards_of(weights, gated, split_sizes(weights.intermediate_size, tp, weights.block))


class EvenSplitCutsGroups(BuiltinMoeSharding):
    """``size / tp`` channels per rank even when that cuts a scale group; each rank pads its channels to
    whole groups and takes the scale groups from the one its range starts in, so a later rank applies
    the straddled group's scale to channels of the next group (and a rank smaller than one group
    shares its group's scale with its neighbours)."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        size, block = weights.intermediate_size, weights.block
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        buffer = -(-part // block) * block
        shards = []
        for r in range(tp):
            offset = r * part
            w = take_channels(weights, gated, offset, part, buffer, r)
            first = offset // block
            scales = pad_dim(weights.w2_scale[..., first : first + buffer // block], -1, buffer // block)
            shards.append(RankShard(replace(w, w2_scale=scales), offset, part))
        return tuple(shards)


class FusedBlockSplit(BuiltinMoeSharding):
    """Splits the fused FC1 tensor as one block of ``F·I`` rows (a column-parallel split of the
    merged tensor instead of per projection): with stacked ``[gate; up]`` rows, rank 0 gets gate rows
    only and the last rank up rows only, each read as ``[gate; up]`` of half as many channels."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        shards = super().shard_moe(weights, gated, tp)
        if not gated:
            return shards
        out = []
        for s in shards:
            buffer = s.weights.intermediate_size

            def block_rows(x: torch.Tensor, dim: int, s: RankShard = s, buffer: int = buffer) -> torch.Tensor:
                return pad_dim(x.narrow(dim, 2 * s.offset, 2 * s.real), dim, 2 * buffer)

            b13 = weights.w13_bias
            w = replace(
                s.weights,
                w13=block_rows(weights.w13, -2),
                w13_scale=block_rows(weights.w13_scale, -2),
                w13_bias=None if b13 is None else block_rows(b13, -1),
            )
            out.append(RankShard(w, s.offset, s.real))
        return tuple(out)


register_contract(CONTRACT, MoeSharding, BuiltinMoeSharding())
register_subject(
    Subject(
        "bad-shard-cuts-groups",
        "MoE TP sharding: an even split that cuts FC2 scale groups, each rank padding its range to whole groups",
        {CONTRACT: EvenSplitCutsGroups()},
        reproduces="docs/vllm-logic.md §15 (Gemma-4-26B-A4B TP=8: 704/8 = 88 channels per rank straddle a 16-group)",
    )
)
register_subject(
    Subject(
        "bad-shard-fused-block",
        "MoE TP sharding: the fused [gate; up] FC1 tensor split as one block of rows",
        {CONTRACT: FusedBlockSplit()},
        reproduces="fused gate/up split as one tensor (rank 0 gets gate rows only; gate/up mispaired)",
    )
)
