"""Contract ``moe_sharding``: every rank's shard of a checkpoint's FP4 or block-FP8 experts, all ranks together.

For a catalogued model's global MoE layer (or adversarial sizes whose even split cuts scale groups,
gives ranks less than one group, or leaves the last ranks short or empty) at TP ∈ {1, 2, 4, 8, 16}
x EP ∈ {1, 2, 4, 8, 16} (``tp·ep <= 16``, expert counts with ``E % ep != 0`` and ``E < ep``), NVFP4 or
MXFP4 groups or block-FP8 128x128 tiles (whole tiles per rank: FC1 scale rows and FC2 scale columns cover
128 channels each), a stacked or (FP4) row-interleaved checkpoint, with or without gpt-oss-style biases, and a
kernel backend of the format, the policy under test splits the layer across ranks. Properties:
every expert lives on exactly one EP rank, held by all of its TP ranks; every real element, scale and
bias lands on exactly one rank, in its place (at the rank's ``start`` buffer position), with whole
groups per rank (a split that would cut a group is refused with the policy's own error, never
padded silently); ``w2_bias`` is held whole by one TP rank of its expert's EP rank; and the
ranks' partial MoE outputs, biases included, sum to the unsharded layer's (a rank without channels
contributes at most the ``w2_bias`` it holds, a rank without experts exactly zero).

Each property runs once per format (``test_NAME_nvfp4``, ``test_NAME_mxfp4``, ``test_NAME_fp8``: the format's
groups are drawn),
with the format's kernel backends as the test's parameter (``--backend`` and the records' markers apply).
Pinned: Gemma-4-26B-A4B at TP=8 (704/8 = 88 channels straddle 16-groups, ``docs/vllm-logic.md §15``),
Qwen3-30B-A3B at TP=16 (768/16 = 48: 3 NVFP4 groups per rank), gpt-oss-120b at TP=8 (2880 = 90 MXFP4
blocks over 8 ranks: 12 blocks each, the last rank 6), gpt-oss-120b with biases at TP=2 x EP=4 over 6
experts (``E % ep = 2``: EP ranks of 2, 2, 1 and 1 experts) and block-FP8 Qwen3.8-Flash-Next (I = 640, five
128-tiles) at TP=8 (vLLM #54178: 80 channels per rank cut a tile; one tile each on ranks 0-4, ranks 5-7
empty) and TP=4 (vLLM PR #55867's "A | B, C | D, E | pad, pad | pad": a short rank 2 and an empty rank 3).
"""

from __future__ import annotations

import enum
import math
from dataclasses import replace
from functools import partial

import pytest
import torch

from conformance.layers import PerConfig
from conformance.moe_checks import PadRule, assert_embedded, assert_shapes, fc1_parts, pad_rule
from conformance.moe_formats import FP8_BLOCK, MXFP4, NVFP4
from contracts.errors import UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, channel_unit, relayout_moe, select_experts
from contracts.moe_sharding import CONTRACT, MoeSharding, RankShard, ShardRefused, rank_coordinates
from harness.properties import check, property_test, record_event
from reference.layouts import Fc1Layout, relayout_fc1
from reference.moe import GateUpOrder, activate, route
from strategies.moe import MoeShape, Sharding
from strategies.moe_sharding import ShardingConfig, pinned_sharding, sharding_configs
from strategies.tensors import MoeCase, dequantize_moe, generator, moe_case

pytestmark = [pytest.mark.contract(CONTRACT)]

REGRESSIONS = {
    NVFP4.name: (pinned_sharding("gemma-4-26b-a4b", 8), pinned_sharding("qwen3-30b-a3b", 16)),
    MXFP4.name: (
        pinned_sharding("gpt-oss-120b", 8, block=32),
        pinned_sharding("gpt-oss-120b", 2, 32, ep=4, experts=6, bias=True),
    ),
    FP8_BLOCK.name: (
        pinned_sharding("qwen3.8-flash-next", 8, FP8_BLOCK.block),
        pinned_sharding("qwen3.8-flash-next", 4, FP8_BLOCK.block),
    ),
}
"""The pinned layers of each format's tests."""

SUM_TOLERANCE = 2.0**-30
"""Relative to ``S = Σ_j w_j·(|a|·|W2|ᵀ)`` per output element. Both sides are computed in fp64 from
the same FP4 values: each FC1 / FC2 dot product has at most 2^14 terms, so its rounding error is at
most ``2^14·2^-53 = 2^-39`` of its absolute sum, and the activations' derivatives are bounded by
about the magnitude of their inputs; 2^-30 leaves a wide margin and is still about 2^30 below a
misplaced channel or scale (an O(1) relative error)."""


def global_layer(config: ShardingConfig) -> MoeCase:
    """The checkpoint's whole layer from ``config.seed``, FC1 rows in ``config.layout``; with
    ``config.bias``, ``w13_bias [E, F·I]`` and ``w2_bias [E, H]`` drawn from ``seed + 1``: fp32 tensors of
    bf16 values, as gpt-oss checkpoints store them (engines keep expert biases in bf16)."""
    shape = MoeShape(
        config.model, config.tp, False, 0, Sharding.NONE, config.intermediate, config.intermediate,
        config.hidden, config.hidden, config.activation, config.experts, config.top_k, config.tokens, config.seed,
    )  # fmt: skip
    case = moe_case(shape, config.block)
    stacked = replace(case.weights, fc1_layout=Fc1Layout.GATE_UP)
    if config.bias:
        g, rows = generator(config.seed + 1), stacked.w13.shape[1]
        b13, b2 = (torch.randn(config.experts, n, generator=g).bfloat16().float() for n in (rows, config.hidden))
        stacked = replace(stacked, w13_bias=b13, w2_bias=b2)
    weights = relayout_moe(stacked, config.layout) if config.gated else stacked
    return replace(case, weights=weights)


def refusable(config: ShardingConfig) -> str | None:
    """Why a policy may refuse ``config`` (None: it may not): an even TP split would cut a group, or
    ``E % ep != 0`` (SGLang's ``FusedMoE`` asserts ``E % ep == 0``)."""
    part, rem = divmod(config.intermediate, config.tp)
    if rem != 0 or part % config.block != 0:
        return "an even split would cut a group"
    if config.experts % config.ep_size:
        return f"E = {config.experts} is not a multiple of EP = {config.ep_size}"
    return None


def shard_checked(
    config: ShardingConfig, backend: enum.Enum | None, policy: MoeSharding, weights: MoeWeights
) -> tuple[RankShard, ...] | None:
    """The policy's shards for the kernel ``backend``'s layer; a refusal is accepted (None) only where :func:`refusable`. A policy without a
    loader for the checkpoint's form (an engine that serves no such checkpoint) raises
    :class:`~contracts.errors.UnsupportedConfig`: recorded as an event, not a verdict."""
    try:
        shards = tuple(policy.shard_moe(weights, config.gated, config.tp, ep=config.ep_size, backend=backend))
    except UnsupportedConfig as exc:
        record_event(f"checkpoint form not served: {exc}")
        return None
    except ShardRefused as exc:
        why = refusable(config)
        assert why, (
            f"policy refused a split that keeps whole {config.block}-groups and experts ({config.describe()}): {exc}"
        )
        record_event(f"refused ({why})")
        return None
    assert len(shards) == config.ranks, f"policy returned {len(shards)} shards for TP={config.tp} x EP={config.ep_size}"
    return shards


def assert_placed(name: str, src: torch.Tensor, dst: torch.Tensor, dim: int, start: int, pad: PadRule) -> None:
    """``src`` sits at position ``start`` of ``dst``'s dimension ``dim`` (and in the leading corner of the
    others, :func:`~conformance.moe_checks.assert_embedded`); every other element satisfies ``pad``."""
    front = dst.narrow(dim, 0, start)
    allowed = pad.allowed(front)
    assert allowed.all(), f"{name}: {int((~allowed).sum())} value(s) in front of the real channels are not {pad.what}"
    assert_embedded(name, src, dst.narrow(dim, start, dst.shape[dim] - start), pad)


def assert_experts_placed(config: ShardingConfig, shards: tuple[RankShard, ...]) -> None:
    """Every TP rank of an EP rank holds the same experts, and every expert lives on exactly one EP rank."""
    owner: dict[int, int] = {}
    for r, s in enumerate(shards):
        ep_rank, tp_rank = rank_coordinates(r, config.tp)
        lead = shards[ep_rank * config.tp]
        assert s.experts == lead.experts, (
            f"rank {r} (EP rank {ep_rank}, TP rank {tp_rank}) holds experts {list(s.experts)}, its TP rank 0 "
            f"{list(lead.experts)}: the TP ranks of one EP rank split the same experts"
        )
        held = s.weights.w13.shape[0]
        assert held == len(s.experts), f"rank {r} has {held} expert slots for experts {list(s.experts)}"
        bad = [x for x in s.experts if not 0 <= x < config.experts]
        assert not bad, f"rank {r} claims experts {bad} outside 0..{config.experts - 1} (-1: a slot holding none)"
        if tp_rank:
            continue
        for x in s.experts:
            assert x not in owner, f"expert {x} on EP ranks {owner[x]} and {ep_rank} (and the router sends it to one)"
            owner[x] = ep_rank
    lost = sorted(set(range(config.experts)) - set(owner))
    assert not lost, f"experts {lost} are on no EP rank: tokens routed to them are dropped"


def assert_whole_groups(rank: int, shard: RankShard, g: int, consequence: str) -> None:
    """``shard``'s channels ``[offset, offset + real)`` at buffer position ``start`` are whole ``g``-element
    scale groups (channels that cut one are paired with the wrong FC2 scales); ``consequence`` ends the message."""
    assert shard.offset % g == 0 and shard.real % g == 0 and shard.start % g == 0, (
        f"rank {rank} holds channels [{shard.offset}, {shard.offset + shard.real}) at buffer position {shard.start}, "
        f"which cut a {g}-element scale group: {consequence}"
    )


def assert_scales_local(rank: int, shard: RankShard, src: MoeWeights, config: ShardingConfig) -> None:
    """Each expert slot of ``shard`` holds its own expert's FC1 and FC2 scales (for the rank's channels): a slot
    holding another expert's names it. Per-expert scales are sliced to the EP rank's experts like its weights
    (SGLang #36597 / PR #23531: ModelOpt NVFP4 input scales loaded for all experts and never cut to the local
    range on the generic branch)."""
    o, n, at, g = shard.offset, shard.real, shard.start, config.block
    if n == 0:
        return
    for name, dim in (("w13_scale", -2), ("w2_scale", -1)):
        u = channel_unit(g, name)

        def cut(x: torch.Tensor, layout: Fc1Layout, position: int, name: str = name, dim: int = dim, u: int = u):
            parts = fc1_parts(x, layout, config.gated, dim).values() if name == "w13_scale" else (x,)
            return torch.cat([p.narrow(dim, position // u, math.ceil(n / u)) for p in parts], dim=dim)

        held, every = cut(getattr(shard.weights, name), src.fc1_layout, at), cut(getattr(src, name), src.fc1_layout, o)
        for slot, x in enumerate(shard.experts):
            if torch.equal(held[slot], every[x]):
                continue
            owners = [y for y in range(config.experts) if torch.equal(held[slot], every[y])]
            assert not owners, (
                f"rank {rank}'s expert slot {slot} (expert {x}) holds the {name} of expert(s) {owners}: per-expert "
                "scales are sliced to the EP rank's own experts, like its weights (SGLang #36597)"
            )


@check(CONTRACT, ShardingConfig)
def check_every_element_on_one_rank(config: ShardingConfig, backend: enum.Enum | None, policy: MoeSharding) -> None:
    """Every expert lives on one EP rank, split by all of its TP ranks; within an EP rank the TP ranks hold
    whole groups of consecutive channels that together cover the layer once; every rank's FC1 rows (both
    projections), FC2 columns, scales and ``w13_bias`` are the checkpoint's at its experts and channels, at
    buffer positions ``[start, start + real)``, in the checkpoint's FC1 layout, the rest padding per the pad
    rule in a buffer all ranks share; each expert's ``w2_bias`` is held whole by one TP rank of its EP rank
    and is zero on the others."""
    src = global_layer(config).weights
    shards = shard_checked(config, backend, policy, src)
    if shards is None:
        return
    _PLACEMENTS.get(config.layer_key, shards, partial(assert_placement, config, src, shards))
    empty = sum(s.real == 0 for s in shards), sum(not s.experts for s in shards)
    record_event(f"{empty[0]} rank(s) without channels, {empty[1]} without experts, EP={config.ep_size}")


_PLACEMENTS: PerConfig[None] = PerConfig(kept=256)
"""Shardings that passed :func:`assert_placement`, by layer key and the shards' digest: a policy that shards a
layer the same way for several backends gets the same verdict for each (the check reads only the layer, which
the key fixes, and the shards). A failure raises before anything is kept."""


def assert_placement(config: ShardingConfig, src: MoeWeights, shards: tuple[RankShard, ...]) -> None:
    """The assertions of :func:`check_every_element_on_one_rank` on the policy's ``shards`` of ``src``."""
    assert_experts_placed(config, shards)
    g, buffers = config.block, {s.weights.intermediate_size for s in shards}
    assert len(buffers) == 1, f"ranks have different buffers {sorted(buffers)} (one parameter shape per layer)"
    (buffer,) = buffers
    for ep_rank in range(config.ep_size):
        group = shards[ep_rank * config.tp : (ep_rank + 1) * config.tp]
        covered = 0
        for t, s in sorted(enumerate(group), key=lambda item: (item[1].offset, item[0])):
            r = ep_rank * config.tp + t
            assert_whole_groups(
                r,
                s,
                g,
                "padding cannot repair a group straddle (docs/vllm-logic.md §15); refuse or split on whole groups",
            )
            assert s.offset == covered, (
                f"rank {r} starts at channel {s.offset}; channels [{covered}, {s.offset}) are lost or doubled"
            )
            assert s.start >= 0 and s.start + s.real <= buffer, (
                f"rank {r}: channels at [{s.start}, {s.start + s.real}) overrun its buffer of {buffer}"
            )
            covered += s.real
        # an EP rank without experts (E < ep) holds no channel to cover (a loader-driven policy reads none back)
        assert covered == config.intermediate or not group[0].experts, (
            f"EP rank {ep_rank}'s TP ranks cover {covered} of {config.intermediate} channels"
        )
    w2_bias_holders: dict[int, list[int]] = {}
    for r, s in enumerate(shards):
        w, o, n, at = s.weights, s.offset, s.real, s.start
        mine = select_experts(src, s.experts)
        assert_shapes(AlignedMoe(w, w.intermediate_size, config.hidden), len(s.experts), 2 if config.gated else 1)
        assert w.fc1_layout is src.fc1_layout, f"rank {r}: FC1 rows relabelled {w.fc1_layout.value}"
        assert_scales_local(r, s, src, config)
        for name in ("w13", "w13_scale", "w13_bias"):
            if getattr(src, name) is None:
                continue
            assert getattr(w, name) is not None, f"rank {r} dropped the checkpoint's {name}"
            dim, u = -1 if name == "w13_bias" else -2, channel_unit(g, name)
            full = fc1_parts(getattr(mine, name), src.fc1_layout, config.gated, dim)
            held = fc1_parts(getattr(w, name), w.fc1_layout, config.gated, dim)
            for label in full:
                part = full[label].narrow(dim, o // u, math.ceil(n / u))
                assert_placed(f"rank {r} {name} {label} rows", part, held[label], dim, at // u, pad_rule(name, g))
        for name in ("w2", "w2_scale"):
            u = channel_unit(g, name)
            full = getattr(mine, name).narrow(-1, o // u, math.ceil(n / u))
            assert_placed(f"rank {r} {name} columns", full, getattr(w, name), -1, at // u, pad_rule(name, g))
        if src.w2_bias is not None:
            assert w.w2_bias is not None, f"rank {r} dropped the checkpoint's w2_bias"
            for slot, x in enumerate(s.experts):
                if torch.equal(w.w2_bias[slot], mine.w2_bias[slot]):
                    w2_bias_holders.setdefault(x, []).append(r)
                else:
                    assert not w.w2_bias[slot].any(), (
                        f"rank {r} holds expert {x}'s w2_bias neither whole nor zero (w2_bias is added after the "
                        "TP all-reduce sums the ranks: once per expert)"
                    )
    if src.w2_bias is not None:
        for x in range(config.experts):
            holders = w2_bias_holders.get(x, [])
            assert len(holders) == 1, (
                f"expert {x}'s w2_bias is held by ranks {holders}: the TP ranks' partial outputs are summed, so it "
                f"must be added by exactly one of them ({len(holders)}x bias otherwise)"
            )


def partial_output(
    w: MoeWeights, experts: tuple[int, ...], case: MoeCase, config: ShardingConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 ``(out, bias, S)`` ``[T, H]`` of the experts ``w`` (global ids ``experts``), for the tokens
    routed to them: ``out = Σ_j w_j·act(x W13ᵀ + b13) W2ᵀ``, ``bias = Σ_j w_j·b2`` and the magnitude
    ``S = Σ_j w_j·(|act(x W13ᵀ + b13)| |W2|ᵀ + |b2|)`` (no re-quantization: identical per channel on both
    sides). Only routed experts are dequantized; their ``R`` FC1 and FC2 products are batched over all ``T``
    tokens, and ``c [R, T]`` (the token's routing weight where it picked the expert, else 0) selects them."""
    weights, ids = route(case.logits, config.top_k)
    x = case.x.double()
    local = {e: slot for slot, e in enumerate(experts)}
    routed = [e for e in ids.unique().tolist() if e in local]
    if not routed:
        return tuple(torch.zeros(x.shape, dtype=torch.float64) for _ in range(3))
    picked = select_experts(w, tuple(local[e] for e in routed))
    idx = torch.tensor(routed, dtype=torch.long)
    w13, w2 = (t.double() for t in dequantize_moe(picked, case.w13_decode[idx], case.w2_decode[idx]))
    if config.gated:
        w13 = relayout_fc1(w13, w.fc1_layout, Fc1Layout.GATE_UP)
    hid = torch.matmul(x, w13.mT)  # [R, T, F·I]
    if picked.w13_bias is not None:
        b13 = picked.w13_bias.double()
        hid = hid + (relayout_fc1(b13, w.fc1_layout, Fc1Layout.GATE_UP, -1) if config.gated else b13)[:, None]
    a = activate(hid, config.activation, GateUpOrder.GATE_UP)  # [R, T, I]
    c = ((ids[None] == idx[:, None, None]) * weights.double()[None]).sum(-1)  # [R, T]; top-k ids are distinct
    out = (c[..., None] * torch.matmul(a, w2.mT)).sum(0)
    mag = (c[..., None] * torch.matmul(a.abs(), w2.abs().mT)).sum(0)
    bias = torch.zeros_like(out)
    if picked.w2_bias is not None:
        b2 = picked.w2_bias.double()
        bias = c.T @ b2
        mag = mag + c.T @ b2.abs()
    return out, bias, mag


_LAYER_OUTPUTS: PerConfig[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = PerConfig()
"""The unsharded layer's :func:`partial_output` by :attr:`~strategies.moe_sharding.ShardingConfig.layer_key`
(every backend's test draws the same layers)."""

_RANK_OUTPUTS: PerConfig[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = PerConfig(kept=4096)
"""A rank's :func:`partial_output` by layer key and experts, and its weights' digest (bytes, block, FC1 layout):
a policy that shards a layer the same way for several backends gives the same shards."""


@check(CONTRACT, ShardingConfig)
def check_ranks_sum_to_layer(config: ShardingConfig, backend: enum.Enum | None, policy: MoeSharding) -> None:
    """The TP x EP ranks' partial MoE outputs (biases included) sum to the unsharded layer's output
    (within :data:`SUM_TOLERANCE` of its magnitude); a rank without channels contributes nothing but
    the ``w2_bias`` it holds, a rank without experts exactly zero."""
    case = global_layer(config)
    shards = shard_checked(config, backend, policy, case.weights)
    if shards is None:
        return
    layer_key = config.layer_key
    out, bias, mag = _LAYER_OUTPUTS.get(
        layer_key, case, lambda: partial_output(case.weights, tuple(range(config.experts)), case, config)
    )
    want = out + bias
    got = torch.zeros_like(want)
    halves = 2 if config.gated else 1
    for r, s in enumerate(shards):
        buffer, g = s.weights.w13.shape[-2] // halves, config.block
        assert buffer % g == 0, (
            f"rank {r}'s buffer of {buffer} channels is not a whole number of {g}-element groups: its FC2 scales "
            f"cover {buffer // g * g} of them, so its channels and scales cannot line up (docs/vllm-logic.md §15)"
        )
        assert_shapes(AlignedMoe(s.weights, buffer, config.hidden), len(s.experts), halves)
        assert len(set(s.experts)) == len(s.experts) and all(0 <= x < config.experts for x in s.experts), (
            f"rank {r} claims experts {list(s.experts)} of 0..{config.experts - 1}"
        )
        key = (layer_key, s.experts)
        part, part_bias, _ = _RANK_OUTPUTS.get(
            key, s.weights, partial(partial_output, s.weights, s.experts, case, config)
        )
        assert s.real > 0 or not part.any(), f"rank {r} without channels contributes {part.abs().max().item():.4g}"
        got += part + part_bias
    err = (got - want).abs()
    bad = err > SUM_TOLERANCE * mag
    for r, s in enumerate(shards) if bad.any() else ():  # the cause, where a rank's channels cut a group
        assert_whole_groups(
            r, s, config.block, f"the ranks' partial outputs do not sum to the layer's (max |diff| = {err.max():.4g})"
        )
    assert not bad.any(), (
        f"the {config.ranks} ranks' partial outputs do not sum to the layer's: max |diff| = {err.max().item():.4g} "
        f"(max |out| = {want.abs().max().item():.4g}, max |bias part| = {bias.abs().max().item():.4g}) at "
        f"{int(bad.sum())} of {bad.numel()} elements"
    )
    record_event(f"TP={config.tp} EP={config.ep_size}: {math.ceil(config.intermediate / config.block)} groups")


for _check in (check_every_element_on_one_rank, check_ranks_sum_to_layer):
    for _fmt in (NVFP4, MXFP4, FP8_BLOCK):
        property_test(
            _check,
            name=f"test_{_check.__name__.removeprefix('check_')}_{_fmt.name}",
            strategy=sharding_configs(_fmt.block),
            pins=REGRESSIONS[_fmt.name],
            backends=tuple(_fmt.backends),
        )

del _check, _fmt
