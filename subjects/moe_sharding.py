"""Subjects of the ``moe_sharding`` contract (:mod:`contracts.moe_sharding`): splitting a checkpoint's
FP4 or block-FP8 experts across TP x EP ranks.

The built-in policy places experts in contiguous blocks over the EP ranks (``reference.sizes.expert_blocks``,
vLLM's linear placement) and splits each EP rank's experts over its TP ranks evenly where that keeps whole
groups, else in whole blocks per rank with short or empty last ranks (as the gpt-oss loader does, and vLLM
PR #55867 for block-FP8's 128-channel tiles). Known-bad ones cut groups (each tensor narrowed by its own
stride, scale offsets rounded up, FP8 tiles cut by an even split), refuse
whole-group shares narrower than a 128-wide block, split the fused FC1 tensor as one block, pad a
short rank's fused FC1 block at its end, load other experts than the expert map names (world rank for
EP rank, floor-divided slices, global ids as slots), slice per-expert scales to the first experts instead of
the EP rank's or keep ``w2_bias`` on every TP rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from contracts.moe import MoeWeights, channel_unit, tiled
from contracts.moe_sharding import CONTRACT, MoeSharding, RankShard, ShardRefused, rank_coordinates
from reference.fp8 import ceil_div
from reference.layouts import join_fc1, split_fc1
from reference.padding import pad_dim
from reference.sizes import expert_blocks, whole_block_split
from subjects.moe_bugs import pad_fused_block_at_end
from subjects.registry import Subject, register_contract, register_subject

FIELDS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")
"""The :class:`~contracts.moe.MoeWeights` tensors, each with experts in dim 0."""


def select_experts(weights: MoeWeights, experts: Sequence[int]) -> MoeWeights:
    """``weights`` of the global experts ``experts`` only, in that order (none: an empty expert dimension)."""
    ids = torch.tensor(list(experts), dtype=torch.long)
    picked = {n: getattr(weights, n) for n in FIELDS if getattr(weights, n) is not None}
    return replace(weights, **{n: t.index_select(0, ids) for n, t in picked.items()})


def place(x: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    """``x`` at positions ``[start, start + n)`` of ``dim`` grown to ``size``, zeros elsewhere (a new tensor,
    each element written once: ``x`` between its zero blocks)."""
    before, after = list(x.shape), list(x.shape)
    before[dim], after[dim] = start, size - start - x.shape[dim]
    return torch.cat((x.new_zeros(before), x, x.new_zeros(after)), dim=dim)


def take_channels(
    weights: MoeWeights, gated: bool, offset: int, real: int, buffer: int, tp_rank: int, start: int = 0
) -> MoeWeights:
    """Channels ``[offset, offset + real)`` of ``weights`` (both FC1 projections, FC2 columns, scales and
    ``w13_bias``) at buffer positions ``[start, start + real)`` of ``buffer`` zero-padded channels;
    ``w2_bias`` on TP rank 0 only (zeros on the others). Each tensor is cut in its own units
    (:func:`~contracts.moe.channel_unit`): ``ceil(real / unit)`` of them from the one holding channel
    ``offset`` (the scale a range that cuts a unit starts in)."""
    block = weights.block
    layout = weights.fc1_layout

    def cut(x: torch.Tensor, dim: int, name: str) -> torch.Tensor:
        unit = channel_unit(block, name)
        part = x.narrow(dim, offset // unit, ceil_div(real, unit))
        return place(part, dim, start // unit, ceil_div(buffer, unit))

    def fc1(name: str, dim: int) -> torch.Tensor:
        x = getattr(weights, name)
        halves = split_fc1(x, layout, dim) if gated else (x,)
        parts = [cut(h, dim, name) for h in halves]
        return join_fc1(*parts, layout, dim) if gated else parts[0]

    return MoeWeights(
        w13=fc1("w13", -2),
        w13_scale=fc1("w13_scale", -2),
        w2=cut(weights.w2, -1, "w2"),
        w2_scale=cut(weights.w2_scale, -1, "w2_scale"),
        block=block,
        fc1_layout=layout,
        w13_bias=None if weights.w13_bias is None else fc1("w13_bias", -1),
        w2_bias=None if weights.w2_bias is None else weights.w2_bias * (1 if tp_rank == 0 else 0),
    )


def split_sizes(size: int, tp: int, block: int) -> tuple[int, ...]:
    """Real channels per rank: ``size / tp`` each when that is a whole number of ``block``-element
    groups, else whole blocks per rank (``cdiv(size / block, tp)`` blocks, short or empty last ranks)."""
    part, rem = divmod(size, tp)
    if rem == 0 and part % block == 0:
        return (part,) * tp
    return whole_block_split(size, tp, block)


def shards_of(
    weights: MoeWeights, gated: bool, sizes: tuple[int, ...], experts: tuple[int, ...]
) -> tuple[RankShard, ...]:
    """The TP shards of consecutive channel ranges of ``sizes`` (buffer: the largest) of one EP rank's
    experts ``weights`` (global ids ``experts``)."""
    buffer, offsets = max(sizes), [sum(sizes[:r]) for r in range(len(sizes))]
    return tuple(
        RankShard(take_channels(weights, gated, o, n, buffer, r), o, n, experts)
        for r, (o, n) in enumerate(zip(offsets, sizes, strict=True))
    )


class BuiltinMoeSharding:
    """Correct policy: experts in contiguous blocks over the EP ranks (:meth:`place_experts`), each EP
    rank's experts split over its TP ranks by :func:`split_sizes` in consecutive ranges (:meth:`split_channels`),
    real channels from buffer position 0. The split does not depend on the backend (its buffer padding is
    the ``nvfp4_moe`` / ``mxfp4_moe`` contracts' business)."""

    def place_experts(self, experts: int, ep: int) -> tuple[tuple[int, ...], ...]:
        """The global experts of each EP rank: :func:`reference.sizes.expert_blocks`."""
        return expert_blocks(experts, ep)

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        """The ``tp`` shards of one EP rank's experts ``weights`` (global ids ``experts``)."""
        return shards_of(weights, gated, split_sizes(weights.intermediate_size, tp, weights.block), experts)

    def shard_moe(
        self, weights: MoeWeights, gated: bool, tp: int, *, ep: int = 1, backend=None
    ) -> tuple[RankShard, ...]:
        return tuple(
            shard
            for ids in self.place_experts(weights.w13.shape[0], ep)
            for shard in self.split_channels(select_experts(weights, ids), gated, tp, ids)
        )


class EvenSplitCutsGroups(BuiltinMoeSharding):
    """``size / tp`` channels per rank even when that cuts a scale group; each rank pads its channels to
    whole groups and takes the scale groups from the one its range starts in, so a later rank applies
    the straddled group's scale to channels of the next group (and a rank smaller than one group
    shares its group's scale with its neighbours)."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
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
            shards.append(RankShard(replace(w, w2_scale=scales), offset, part, experts))
        return tuple(shards)


class FusedBlockSplit(BuiltinMoeSharding):
    """Splits the fused FC1 tensor as one block of ``F·I`` rows (a column-parallel split of the
    merged tensor instead of per projection): with stacked ``[gate; up]`` rows, rank 0 gets gate rows
    only and the last rank up rows only, each read as ``[gate; up]`` of half as many channels."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        shards = super().split_channels(weights, gated, tp, experts)
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
            out.append(RankShard(w, s.offset, s.real, experts))
        return tuple(out)


def own_stride(x: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s ``⌊n/tp⌋`` last-dim entries of ``x`` (``n`` of them), as vLLM's ``_load_w2`` narrows."""
    per = x.shape[-1] // tp
    return x[..., rank * per : (rank + 1) * per]


class ScalesOwnStride(BuiltinMoeSharding):
    """vLLM 0.33.0's per-projection loader (``RoutedExperts._load_w2``; vLLM #49949): every checkpoint tensor
    is narrowed by its own size / tp, so rank ``r`` holds channels ``[r·I/tp, (r+1)·I/tp)`` but FC2 scale
    groups ``[r·⌊I/(g·tp)⌋, (r+1)·⌊I/(g·tp)⌋)``, in a buffer of ``I/tp`` channels."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        size = weights.intermediate_size
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        shards = []
        for r in range(tp):
            w = take_channels(weights, gated, r * part, part, part, r)  # FC2 replaced below
            w2, w2_scale = (own_stride(getattr(weights, name), tp, r) for name in ("w2", "w2_scale"))
            shards.append(RankShard(replace(w, w2=w2, w2_scale=w2_scale), r * part, part, experts))
        return tuple(shards)


class CeilScaleOffsets(BuiltinMoeSharding):
    """vLLM #52997's block-scale shard arithmetic (``adjust_block_scale_shard``), applied to FC2's groups:
    a rank of ``p = I/tp`` channels takes ``⌈p/g⌉`` scale groups from group ``⌈r·p/g⌉``, offset and size
    rounded up independently. Ranks whose share is smaller than (or not a multiple of) a group then read
    their neighbour's scales or run past the last group (``narrow`` raises)."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        size, block = weights.intermediate_size, weights.block
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        buffer, n = -(-part // block) * block, -(-part // block)
        shards = []
        for r in range(tp):
            w = take_channels(weights, gated, r * part, part, buffer, r)
            scales = weights.w2_scale.narrow(-1, -(-(r * part) // block), n)
            shards.append(RankShard(replace(w, w2_scale=scales), r * part, part, experts))
        return tuple(shards)


class Fp8EvenSplit(BuiltinMoeSharding):
    """Block-FP8 experts split ``p = I/tp`` channels per rank at offset ``r·p``, each rank's buffer rounded up to
    whole 128-blocks, every FC1 scale row and FC2 scale column the tile its range starts in: the allocation of
    vLLM PR #55867 without its stride (the PR pads "to avoid the scale mismatching" of this split). At
    Qwen3.8-Flash-Next-FP8's I = 640 and TP=8 (vLLM #54178: 80 per rank) rank 1 holds channels 80-159 with
    tile 0's scales, though 128-159 are tile 1's. FP4 checkpoints take the built-in split."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        size, block = weights.intermediate_size, weights.block
        if not tiled(block):
            return super().split_channels(weights, gated, tp, experts)
        if size % tp:
            raise ShardRefused(f"intermediate size {size} is not divisible by TP={tp}")
        part = size // tp
        buffer = ceil_div(part, block) * block
        return tuple(
            RankShard(take_channels(weights, gated, r * part, part, buffer, r), r * part, part, experts)
            for r in range(tp)
        )


REFUSAL_BLOCK = 128
"""ROCm/ATOM's FP8 ``block_n`` whose multiple every rank's share must be (ATOM #1944)."""


class RefusesSubBlockShare(BuiltinMoeSharding):
    """Refuses every degree whose even share ``I/tp`` is not a multiple of a 128-wide block, though it
    splits on whole scale groups (ROCm/ATOM #1944: ``The output_size of gate's and up's weight = 64 is not
    divisible by weight quantization block_n = 128``, where SGLang loads the same checkpoint)."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        part = weights.intermediate_size // tp
        if weights.intermediate_size % tp or part % REFUSAL_BLOCK:
            raise ShardRefused(
                f"The output_size of gate's and up's weight = {part} is not divisible by weight quantization "
                f"block_n = {REFUSAL_BLOCK}."
            )
        return super().split_channels(weights, gated, tp, experts)


class EndPaddedShortRank(BuiltinMoeSharding):
    """The built-in split, but a short rank's fused FC1 block ``[gate; up]`` of ``real`` channels is
    padded at its end to the shared buffer (``subjects.moe_bugs.pad_fused_block_at_end``, vLLM #55649's
    padding), not per half: on a stacked checkpoint the short rank's up rows land in its gate half."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        shards = super().split_channels(weights, gated, tp, experts)
        out = []
        for r, s in enumerate(shards):
            buffer = s.weights.intermediate_size
            if not 0 < s.real < buffer:  # a full or empty rank has no padding to misplace
                out.append(s)
                continue
            own = take_channels(weights, gated, s.offset, s.real, s.real, r)
            padded = pad_fused_block_at_end(own, gated, buffer, weights.hidden_size).weights
            out.append(RankShard(padded, s.offset, s.real, experts))
        return tuple(out)


def slot_weights(weights: MoeWeights, slots: Sequence[int | None]) -> MoeWeights:
    """Expert slots holding the global experts ``slots`` (None: a slot the loader never wrote, zeros)."""
    e = weights.w13.shape[0]
    zero = {n: getattr(weights, n) for n in FIELDS if getattr(weights, n) is not None}
    padded = replace(weights, **{n: torch.cat((t, torch.zeros_like(t[:1]))) for n, t in zero.items()})
    return select_experts(padded, [e if x is None else x for x in slots])


class MisloadedExperts(BuiltinMoeSharding):
    """The built-in expert map (:meth:`place_experts`, what the router is told) with a loader that writes
    other experts into a rank's slots: :meth:`loaded` names, per slot, the global expert the loader wrote
    there (None: none, the slot stays zero)."""

    def loaded(
        self, claimed: tuple[int, ...], experts: int, ep: int, tp: int, ep_rank: int, tp_rank: int
    ) -> tuple[int | None, ...]:
        raise NotImplementedError

    def shard_moe(
        self, weights: MoeWeights, gated: bool, tp: int, *, ep: int = 1, backend=None
    ) -> tuple[RankShard, ...]:
        e, shards = weights.w13.shape[0], []
        for ep_rank, ids in enumerate(self.place_experts(e, ep)):
            for tp_rank in range(tp):
                slots = self.loaded(ids, e, ep, tp, ep_rank, tp_rank)
                shards.append(self.split_channels(slot_weights(weights, slots), gated, tp, ids)[tp_rank])
        return tuple(shards)


def first_slots(ids: Sequence[int], n: int) -> tuple[int | None, ...]:
    """``n`` slots filled with ``ids`` in order, the rest unwritten (None)."""
    return tuple(ids[j] if j < len(ids) else None for j in range(n))


class EpWorldRankSlice(MisloadedExperts):
    """The loader slices the experts of the EP rank numbered by the rank's world rank ``ep_rank·tp + tp_rank``
    instead of its rank in the EP group (vLLM #46441: ``get_ep_group().rank`` where ``rank_in_group`` is meant;
    there the pipeline stage offsets it, here the TP ranks of a TP x EP layer do): a rank whose world rank is
    ``>= ep`` slices past the last expert and silently loads none; the others load another EP rank's experts."""

    def loaded(
        self, claimed: tuple[int, ...], experts: int, ep: int, tp: int, ep_rank: int, tp_rank: int
    ) -> tuple[int | None, ...]:
        if ep == 1:  # no EP group: the loader takes every expert
            return claimed
        world = ep_rank * tp + tp_rank
        return first_slots(expert_blocks(experts, ep)[world] if world < ep else (), len(claimed))


class EpFloorSlice(MisloadedExperts):
    """The loader slices ``[r·⌊E/ep⌋, (r+1)·⌊E/ep⌋)`` for EP rank ``r`` while the expert map gives the first
    ``E % ep`` ranks one expert more (vLLM 0.33.0 ``GptOssModel.load_weights``: ``experts_per_rank = num_experts
    // ep_size`` against ``determine_expert_map``'s balanced linear placement; open fix vLLM PR #51130,
    "uneven expert counts"): with ``E % ep != 0`` ranks load their neighbours' experts and the last
    ``E % ep`` experts are loaded nowhere."""

    def loaded(
        self, claimed: tuple[int, ...], experts: int, ep: int, tp: int, ep_rank: int, tp_rank: int
    ) -> tuple[int | None, ...]:
        per = experts // ep
        return first_slots(range(ep_rank * per, (ep_rank + 1) * per), len(claimed))


class EpGlobalSlot(MisloadedExperts):
    """The loader indexes a rank's expert slots by the global expert id, without the global-to-local map: slot
    ``j`` of every EP rank holds expert ``j``, so every EP rank holds the first experts and only EP rank 0 is
    right (DeepSpeed #6589: "both GPUs are loading the parameters of the first 30 experts"; vllm-gaudi PR #1796,
    global ids in a local table, "for ep_rank == 0 the two conventions coincide")."""

    def loaded(
        self, claimed: tuple[int, ...], experts: int, ep: int, tp: int, ep_rank: int, tp_rank: int
    ) -> tuple[int | None, ...]:
        return first_slots(range(experts), len(claimed))


class EpFirstLocalScales(BuiltinMoeSharding):
    """Weights sliced to the EP rank's experts, their per-expert scales (FC1 and FC2) to the first ``E_local``
    experts of the checkpoint: slot ``j`` of every EP rank scales with expert ``j``'s scales, so only EP rank 0 is
    right. SGLang 0.5.23's ModelOpt NVFP4 MoE loads its per-expert input scales for all experts
    (``_sglang_require_global_experts``) and cuts them to the EP rank's range only on the CuteDSL branch
    (``ModelOptNvFp4FusedMoEMethod.process_weights_after_loading``; SGLang #36597, PR #23531); a ``[:E_local]``
    cut that forgets the rank's offset ``ep_rank·E_local`` is this policy."""

    def shard_moe(
        self, weights: MoeWeights, gated: bool, tp: int, *, ep: int = 1, backend=None
    ) -> tuple[RankShard, ...]:
        shards = []
        for ids in self.place_experts(weights.w13.shape[0], ep):
            first = select_experts(weights, range(len(ids)))
            local = replace(select_experts(weights, ids), w13_scale=first.w13_scale, w2_scale=first.w2_scale)
            shards.extend(self.split_channels(local, gated, tp, ids))
        return tuple(shards)


class W2BiasEveryRank(BuiltinMoeSharding):
    """Every TP rank holds each expert's whole ``w2_bias``, so each adds it before the all-reduce sums the
    ranks: the output bias counts ``tp`` times (torchtitan PR #4245, gpt-oss grouped experts: "Every TP rank
    therefore added the full bias before the Partial output was reduced, multiplying the final bias by the
    TP degree"; the same bug in row-parallel linears: text-generation-inference #1036)."""

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        shards = super().split_channels(weights, gated, tp, experts)
        if weights.w2_bias is None:
            return shards
        return tuple(replace(s, weights=replace(s.weights, w2_bias=weights.w2_bias)) for s in shards)


NAN_BYTE = 0xFF
"""A byte that is never a coordinate (:func:`coordinate_checkpoint`): engine adapters fill memory an engine
allocates uninitialised (``torch.empty``) with it, E4M3 / UE8M0 NaN and a non-zero E2M1 pair."""


def coordinate_checkpoint(ckpt: MoeWeights, gated: bool) -> MoeWeights:
    """``ckpt`` with the FC1 gate row of expert ``e``, channel ``c`` holding ``1 + c % 254``, ``1 + c // 254``,
    ``1 + e % 254``, ``1 + e // 254`` in its first four bytes (its other bytes, the up rows and FC2 zero);
    decoded by :func:`held_coordinates`. Needs ``H >= 8`` (four packed bytes per row)."""
    e, size, cols = ckpt.w13.shape[0], ckpt.intermediate_size, ckpt.w13.shape[-1]
    c, x = torch.arange(size), torch.arange(e)[:, None]
    gate = torch.zeros(e, size, cols, dtype=torch.uint8)
    gate[..., 0], gate[..., 1] = (1 + c % 254).to(torch.uint8), (1 + c // 254).to(torch.uint8)
    gate[..., 2], gate[..., 3] = (1 + x % 254).to(torch.uint8), (1 + x // 254).to(torch.uint8)
    w13 = join_fc1(gate, torch.zeros_like(gate), ckpt.fc1_layout) if gated else gate
    return replace(ckpt, w13=w13, w2=torch.zeros_like(ckpt.w2))


@dataclass(frozen=True)
class Held:
    """What a rank's loaded :func:`coordinate_checkpoint` holds: per expert slot the global expert whose
    rows it holds (None: no real row), and the global channels of the first slot holding any with the
    buffer position of the first of them (``start``)."""

    experts: tuple[int | None, ...]
    channels: tuple[int, ...]
    start: int


def held_coordinates(loaded: MoeWeights, gated: bool) -> Held:
    """Decode a rank's loaded :func:`coordinate_checkpoint` (rows holding 0 or :data:`NAN_BYTE` are not real)."""
    gate = split_fc1(loaded.w13, loaded.fc1_layout)[0] if gated else loaded.w13
    experts, channels, start = [], (), 0
    for rows in gate.long():
        real = ((rows[:, 0] != 0) & (rows[:, 0] != NAN_BYTE)).nonzero().flatten().tolist()
        if not real:
            experts.append(None)
            continue
        x, y = rows[real[0], 2:4].tolist()
        experts.append(x - 1 + 254 * (y - 1))
        if not channels:
            channels = tuple(int(a - 1 + 254 * (b - 1)) for a, b in rows[real, :2].tolist())
            start = real[0]
    return Held(tuple(experts), channels, start)


class LoaderSharding:
    """A policy driven by an engine's weight loader: :meth:`load_rank` returns one rank's experts (FC1 rows
    in the checkpoint's layout) after the engine's loader has read the whole checkpoint.

    What a rank holds is read back, not computed, from the same loader fed a :func:`coordinate_checkpoint`:
    its experts (per slot, the expert whose rows the slot holds; a slot holding no real row is -1, which
    the properties reject, except on a rank holding no channel at all, which takes the experts of the
    first TP rank of its EP rank that holds channels), ``offset`` (the first channel of its first expert
    slot holding any), ``real`` (how many) and ``start`` (that channel's buffer position); an empty rank
    starts where the previous TP rank of its EP rank ends.
    """

    def load_rank(
        self, ckpt: MoeWeights, gated: bool, tp: int, tp_rank: int, *, ep: int, ep_rank: int, backend
    ) -> MoeWeights:
        """Rank ``(ep_rank, tp_rank)`` of a ``tp`` x ``ep`` layer under the kernel backend ``backend``
        (None: the engine's default) after its loader read the whole checkpoint ``ckpt``."""
        raise NotImplementedError

    def loading(self) -> contextlib.AbstractContextManager[object]:
        """Entered around loading every rank of a layer (both checkpoints): what the engine sets up once per
        process rather than once per layer. None by default."""
        return contextlib.nullcontext()

    def shard_moe(
        self, weights: MoeWeights, gated: bool, tp: int, *, ep: int = 1, backend=None
    ) -> tuple[RankShard, ...]:
        probe = coordinate_checkpoint(weights, gated)
        held, loaded = [], []
        with self.loading():
            for rank in range(tp * ep):
                ep_rank, tp_rank = rank_coordinates(rank, tp)
                where = {"ep": ep, "ep_rank": ep_rank, "backend": backend}
                held.append(held_coordinates(self.load_rank(probe, gated, tp, tp_rank, **where), gated))
                loaded.append(self.load_rank(weights, gated, tp, tp_rank, **where))
        shards, end = [], 0
        for rank, (h, w) in enumerate(zip(held, loaded, strict=True)):
            ep_rank, tp_rank = rank_coordinates(rank, tp)
            end = 0 if tp_rank == 0 else end
            peers = [p for p in held[ep_rank * tp : (ep_rank + 1) * tp] if p.channels]
            source = peers[0] if not h.channels and peers else h
            experts = tuple(-1 if x is None else x for x in source.experts)
            if len(experts) != w.w13.shape[0]:  # a peer with another slot count: nothing to read back
                experts = (-1,) * w.w13.shape[0]
            offset = h.channels[0] if h.channels else end
            shards.append(RankShard(w, offset, len(h.channels), experts, h.start))
            end = offset + len(h.channels)
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
        "bad-fp8-shard-even-split",
        "FP8 block-scaled MoE TP sharding: I/tp channels per rank in a buffer rounded to 128, scale tiles cut "
        "(each rank takes the tile its range starts in)",
        {CONTRACT: Fp8EvenSplit()},
        reproduces="vLLM #54178 (Qwen3.8-Flash-Next-FP8 I = 640 at TP8: 80 per rank) without vLLM PR #55867's "
        "whole-block stride",
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
register_subject(
    Subject(
        "bad-shard-ep-world-rank",
        "MoE TP x EP sharding: experts sliced by the world rank (ep_rank·tp + tp_rank) instead of the rank in the "
        "EP group",
        {CONTRACT: EpWorldRankSlice()},
        reproduces="vLLM #46441 (gpt-oss with EP: get_ep_group().rank instead of rank_in_group, an out-of-range "
        "expert slice silently loads nothing)",
    )
)
register_subject(
    Subject(
        "bad-shard-ep-floor-slice",
        "MoE EP sharding: experts sliced floor(E/ep) per rank while the expert map gives the first E % ep ranks "
        "one more",
        {CONTRACT: EpFloorSlice()},
        reproduces="vLLM 0.33.0 GptOssModel.load_weights (experts_per_rank = num_experts // ep_size) vs "
        "determine_expert_map; vLLM PR #51130",
    )
)
register_subject(
    Subject(
        "bad-shard-ep-global-slot",
        "MoE EP sharding: expert slots indexed by the global expert id (no global-to-local map)",
        {CONTRACT: EpGlobalSlot()},
        reproduces="DeepSpeed #6589 (every EP rank loads the first experts); vllm-gaudi PR #1796 (global ids in a "
        "local expert table)",
    )
)
register_subject(
    Subject(
        "bad-shard-ep-first-scales",
        "MoE EP sharding: weights sliced to the EP rank's experts, per-expert scales to the first E_local experts",
        {CONTRACT: EpFirstLocalScales()},
        reproduces="SGLang #36597 / PR #23531 (ModelOpt NVFP4 per-expert input scales loaded for all experts, not "
        "cut to the EP rank's range: SGLang 0.5.23 modelopt_quant.py)",
    )
)
register_subject(
    Subject(
        "bad-shard-w2-bias-every-rank",
        "MoE TP sharding: every TP rank holds the whole w2_bias (added tp times after the all-reduce)",
        {CONTRACT: W2BiasEveryRank()},
        reproduces="torchtitan PR #4245 (gpt-oss grouped-expert output bias multiplied by the TP degree); TGI #1036",
    )
)
