"""Subjects of the ``moe_sharding`` contract (:mod:`contracts.moe_sharding`): splitting a checkpoint's
FP4 experts across tensor-parallel ranks.

The built-in policy splits evenly where that keeps whole groups, else in whole blocks per rank with
short or empty last ranks (as the gpt-oss loader does); known-bad ones cut groups (each tensor narrowed
by its own stride, scale offsets rounded up), refuse whole-group shares narrower than a 128-wide block,
split the fused FC1 tensor as one block, or pad a short rank's fused FC1 block at its end.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from contracts.moe import MoeWeights
from contracts.moe_sharding import CONTRACT, MoeSharding, RankShard, ShardRefused
from reference.layouts import join_fc1, split_fc1
from reference.padding import pad_dim
from reference.sizes import whole_block_split
from subjects.moe_bugs import pad_fused_block_at_end
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


def own_stride(x: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s ``⌊n/tp⌋`` last-dim entries of ``x`` (``n`` of them), as vLLM's ``_load_w2`` narrows."""
    per = x.shape[-1] // tp
    return x[..., rank * per : (rank + 1) * per]


class ScalesOwnStride(BuiltinMoeSharding):
    """vLLM 0.33.0's per-projection loader (``RoutedExperts._load_w2``; vLLM #49949): every checkpoint tensor
    is narrowed by its own size / tp, so rank ``r`` holds channels ``[r·I/tp, (r+1)·I/tp)`` but FC2 scale
    groups ``[r·⌊I/(g·tp)⌋, (r+1)·⌊I/(g·tp)⌋)``, in a buffer of ``I/tp`` channels."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        size = weights.intermediate_size
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        fc1_only = replace(weights, w2=weights.w2[..., :0], w2_scale=weights.w2_scale[..., :0])  # FC2 below
        shards = []
        for r in range(tp):
            w = take_channels(fc1_only, gated, r * part, part, part, r)
            w2, w2_scale = (own_stride(getattr(weights, name), tp, r) for name in ("w2", "w2_scale"))
            shards.append(RankShard(replace(w, w2=w2, w2_scale=w2_scale), r * part, part))
        return tuple(shards)


class CeilScaleOffsets(BuiltinMoeSharding):
    """vLLM #52997's block-scale shard arithmetic (``adjust_block_scale_shard``), applied to FC2's groups:
    a rank of ``p = I/tp`` channels takes ``⌈p/g⌉`` scale groups from group ``⌈r·p/g⌉``, offset and size
    rounded up independently. Ranks whose share is smaller than (or not a multiple of) a group then read
    their neighbour's scales or run past the last group (``narrow`` raises)."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        size, block = weights.intermediate_size, weights.block
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        buffer, n = -(-part // block) * block, -(-part // block)
        shards = []
        for r in range(tp):
            w = take_channels(weights, gated, r * part, part, buffer, r)
            scales = weights.w2_scale.narrow(-1, -(-(r * part) // block), n)
            shards.append(RankShard(replace(w, w2_scale=scales), r * part, part))
        return tuple(shards)


REFUSAL_BLOCK = 128
"""ROCm/ATOM's FP8 ``block_n`` whose multiple every rank's share must be (ATOM #1944)."""


class RefusesSubBlockShare(BuiltinMoeSharding):
    """Refuses every degree whose even share ``I/tp`` is not a multiple of a 128-wide block, though it
    splits on whole scale groups (ROCm/ATOM #1944: ``The output_size of gate's and up's weight = 64 is not
    divisible by weight quantization block_n = 128``, where SGLang loads the same checkpoint)."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        part = weights.intermediate_size // tp
        if weights.intermediate_size % tp or part % REFUSAL_BLOCK:
            raise ShardRefused(
                f"The output_size of gate's and up's weight = {part} is not divisible by weight quantization "
                f"block_n = {REFUSAL_BLOCK}."
            )
        return super().shard_moe(weights, gated, tp)


class EndPaddedShortRank(BuiltinMoeSharding):
    """The built-in split, but a short rank's fused FC1 block ``[gate; up]`` of ``real`` channels is
    padded at its end to the shared buffer (``subjects.moe_bugs.pad_fused_block_at_end``, vLLM #55649's
    padding), not per half: on a stacked checkpoint the short rank's up rows land in its gate half."""

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        shards = super().shard_moe(weights, gated, tp)
        out = []
        for r, s in enumerate(shards):
            buffer = s.weights.intermediate_size
            if not 0 < s.real < buffer:  # a full or empty rank has no padding to misplace
                out.append(s)
                continue
            own = take_channels(weights, gated, s.offset, s.real, s.real, r)
            padded = pad_fused_block_at_end(own, gated, buffer, weights.hidden_size).weights
            out.append(RankShard(padded, s.offset, s.real))
        return tuple(out)


NAN_BYTE = 0xFF
"""A byte that is never a coordinate (:func:`coordinate_checkpoint`): engine adapters fill memory an engine
allocates uninitialised (``torch.empty``) with it, E4M3 / UE8M0 NaN and a non-zero E2M1 pair."""


def coordinate_checkpoint(ckpt: MoeWeights, gated: bool) -> MoeWeights:
    """``ckpt`` with every FC1 gate row of channel ``c`` holding ``1 + c % 254``, ``1 + c // 254`` in its
    first two bytes (its other bytes, the up rows and FC2 zero); decoded by :func:`held_channels`."""
    e, size, cols = ckpt.w13.shape[0], ckpt.intermediate_size, ckpt.w13.shape[-1]
    c = torch.arange(size)
    gate = torch.zeros(e, size, cols, dtype=torch.uint8)
    gate[..., 0], gate[..., 1] = (1 + c % 254).to(torch.uint8), (1 + c // 254).to(torch.uint8)
    w13 = join_fc1(gate, torch.zeros_like(gate), ckpt.fc1_layout) if gated else gate
    return replace(ckpt, w13=w13, w2=torch.zeros_like(ckpt.w2))


def held_channels(loaded: MoeWeights, gated: bool) -> list[int]:
    """The global channels whose gate rows a rank's loaded :func:`coordinate_checkpoint` holds, in row order."""
    gate = split_fc1(loaded.w13, loaded.fc1_layout)[0] if gated else loaded.w13
    rows = gate[0].long()
    real = (rows[:, 0] != 0) & (rows[:, 0] != NAN_BYTE)
    return [int(a - 1 + 254 * (b - 1)) for a, b in rows[real, :2].tolist()]


class LoaderSharding:
    """A policy driven by an engine's weight loader: :meth:`load_rank` returns one rank's experts (FC1 rows
    in the checkpoint's layout) after the engine's loader has read the whole checkpoint. Which channels a
    rank holds is read back, not computed: the channels a :func:`coordinate_checkpoint` put in its gate
    rows give ``offset`` (the first) and ``real`` (how many); an empty rank starts where the previous ends."""

    def load_rank(self, ckpt: MoeWeights, gated: bool, tp: int, rank: int) -> MoeWeights:
        raise NotImplementedError

    def shard_moe(self, weights: MoeWeights, gated: bool, tp: int) -> tuple[RankShard, ...]:
        probe = coordinate_checkpoint(weights, gated)
        shards, end = [], 0
        for rank in range(tp):
            channels = held_channels(self.load_rank(probe, gated, tp, rank), gated)
            offset = channels[0] if channels else end
            shards.append(RankShard(self.load_rank(weights, gated, tp, rank), offset, len(channels)))
            end = offset + len(channels)
        return tuple(shards)


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
register_subject(
    Subject(
        "bad-shard-scale-stride",
        "MoE TP sharding: each checkpoint tensor narrowed by its own size / tp (FC2 scales at r·floor(I/(g·tp)) "
        "groups while weights start at r·I/tp)",
        {CONTRACT: ScalesOwnStride()},
        reproduces="vLLM #49949 (Nemotron-3-Nano NVFP4 I = 1856 at TP8: 232 channels, 14 scale groups per rank)",
    )
)
register_subject(
    Subject(
        "bad-shard-ceil-scale-offset",
        "MoE TP sharding: FC2 scale offset and size rounded up independently (ceil(r·p/g), ceil(p/g))",
        {CONTRACT: CeilScaleOffsets()},
        reproduces="vLLM #52997 (block-FP8 shards smaller than a quantization block: overlapping or overflowing "
        "scale rows), on FP4 groups",
    )
)
register_subject(
    Subject(
        "bad-shard-refuses-sub-block",
        "MoE TP sharding: refuses whole-group shares that are not a multiple of a 128-wide block",
        {CONTRACT: RefusesSubBlockShare()},
        reproduces="ROCm/ATOM #1944 (Qwen3.6-35B-A3B-FP8 at TP8: 512/8 = 64 refused; SGLang loads it)",
    )
)
register_subject(
    Subject(
        "bad-shard-end-padded-rank",
        "MoE TP sharding: a short rank's fused [gate; up] FC1 block padded at its end, not per half",
        {CONTRACT: EndPaddedShortRank()},
        reproduces="vLLM #55649's end-padded fused block, on the short last rank of a whole-block split",
    )
)
