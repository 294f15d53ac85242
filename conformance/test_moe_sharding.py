"""Contract ``moe_sharding``: every rank's shard of a checkpoint's FP4 experts, all ranks together.

For a catalogued model's global MoE layer (or adversarial sizes whose even split cuts scale groups,
gives ranks less than one group, or leaves the last ranks short or empty) at TP ∈ {1, 2, 4, 8, 16},
NVFP4 or MXFP4 groups and a stacked or row-interleaved checkpoint, the policy under test splits
the layer across ranks. Properties: every real element and scale lands on exactly one rank, in its
place, with whole groups per rank (a split that would cut a group is refused with the policy's own
error, never padded silently); and the ranks' partial MoE outputs sum to the unsharded layer's
(empty ranks contribute exactly zero). Pinned: Gemma-4-26B-A4B at TP=8 (704/8 = 88 channels straddle
16-groups, ``docs/vllm-logic.md §15``), gpt-oss-120b at TP=8 (2880 = 90 MXFP4 blocks over 8 ranks:
12 blocks each, the last rank 6) and Qwen3-30B-A3B at TP=16 (768/16 = 48: 3 NVFP4 groups per rank).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given

from conformance.moe_checks import assert_embedded, assert_shapes, pad_rule
from contracts.errors import UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, relayout_moe
from contracts.moe_sharding import CONTRACT, MoeSharding, RankShard, ShardRefused
from harness.repro import check, record_event, run_check
from reference.layouts import Fc1Layout, relayout_fc1, split_fc1
from reference.moe import GateUpOrder, activate, route, routed_experts
from strategies.moe import MoeShape, Sharding
from strategies.moe_sharding import ShardingConfig, pinned_sharding, sharding_configs
from strategies.pins import pinned_examples
from strategies.tensors import MoeCase, dequantize_moe, moe_case

pytestmark = [pytest.mark.contract(CONTRACT)]

REGRESSIONS = (
    pinned_sharding("gemma-4-26b-a4b", 8),
    pinned_sharding("gpt-oss-120b", 8, block=32),
    pinned_sharding("qwen3-30b-a3b", 16),
)
pinned = pinned_examples("config", REGRESSIONS)

SUM_TOLERANCE = 2.0**-30
"""Relative to ``S = Σ_j w_j·(|a|·|W2|ᵀ)`` per output element. Both sides are computed in fp64 from
the same FP4 values: each FC1 / FC2 dot product has at most 2^14 terms, so its rounding error is at
most ``2^14·2^-53 = 2^-39`` of its absolute sum, and the activations' derivatives are bounded by
about the magnitude of their inputs; 2^-30 leaves a wide margin and is still about 2^30 below a
misplaced channel or scale (an O(1) relative error)."""


def global_layer(config: ShardingConfig) -> MoeCase:
    """The checkpoint's whole layer from ``config.seed``, FC1 rows in ``config.layout``."""
    shape = MoeShape(
        config.model, config.tp, False, 0, Sharding.NONE, config.intermediate, config.intermediate,
        config.hidden, config.hidden, config.activation, config.experts, config.top_k, config.tokens, config.seed,
    )  # fmt: skip
    case = moe_case(shape, config.block)
    stacked = replace(case.weights, fc1_layout=Fc1Layout.GATE_UP)
    weights = relayout_moe(stacked, config.layout) if config.gated else stacked
    return replace(case, weights=weights)


def shard_checked(config: ShardingConfig, policy: MoeSharding, weights: MoeWeights) -> tuple[RankShard, ...] | None:
    """The policy's shards; a refusal is accepted (None) only where an even split would cut a group. A
    policy without a loader for the checkpoint's form (an engine that serves no such checkpoint) raises
    :class:`~contracts.errors.UnsupportedConfig`: recorded as an event, not a verdict."""
    part, rem = divmod(config.intermediate, config.tp)
    cuts = rem != 0 or part % config.block != 0
    try:
        shards = tuple(policy.shard_moe(weights, config.gated, config.tp))
    except UnsupportedConfig as exc:
        record_event(f"checkpoint form not served: {exc}")
        return None
    except ShardRefused as exc:
        assert cuts, f"policy refused a split that keeps whole {config.block}-groups ({config.describe()}): {exc}"
        record_event("refused (an even split would cut a group)")
        return None
    assert len(shards) == config.tp, f"policy returned {len(shards)} shards for TP={config.tp}"
    return shards


def fc1_parts(x: torch.Tensor, layout: Fc1Layout, gated: bool) -> dict[str, torch.Tensor]:
    """FC1 rows by projection: ``gate`` and ``up`` of a gated layer, else the one ``FC1``."""
    return dict(zip(("gate", "up"), split_fc1(x, layout), strict=True)) if gated else {"FC1": x}


@check(CONTRACT, ShardingConfig)
def check_every_element_on_one_rank(config: ShardingConfig, backend: None, policy: MoeSharding) -> None:
    """Ranks hold whole groups of consecutive channels that together cover the layer once; every rank's
    FC1 rows (both projections), FC2 columns and scales are the checkpoint's at its channels, in place,
    in the checkpoint's FC1 layout, padded per the pad rule to a buffer all ranks share."""
    case = global_layer(config)
    src = case.weights
    shards = shard_checked(config, policy, src)
    if shards is None:
        return
    g, buffers = config.block, {s.weights.intermediate_size for s in shards}
    assert len(buffers) == 1, f"ranks have different buffers {sorted(buffers)} (one parameter shape per layer)"
    covered = 0
    for r, s in sorted(enumerate(shards), key=lambda t: (t[1].offset, t[0])):
        assert s.offset % g == 0 and s.real % g == 0, (
            f"rank {r} holds channels [{s.offset}, {s.offset + s.real}), which cut a {g}-element scale group: "
            "padding cannot repair a group straddle (docs/vllm-logic.md §15); refuse or split on whole groups"
        )
        assert s.offset == covered, (
            f"rank {r} starts at channel {s.offset}; channels [{covered}, {s.offset}) are lost or doubled"
        )
        covered += s.real
    assert covered == config.intermediate, f"ranks cover {covered} of {config.intermediate} channels"
    for r, s in enumerate(shards):
        w, o, n = s.weights, s.offset, s.real
        assert_shapes(AlignedMoe(w, w.intermediate_size, config.hidden), config.experts, 2 if config.gated else 1)
        assert w.fc1_layout is src.fc1_layout, f"rank {r}: FC1 rows relabelled {w.fc1_layout.value}"
        for name in ("w13", "w13_scale"):
            full, mine = (
                fc1_parts(getattr(src, name), src.fc1_layout, config.gated),
                fc1_parts(getattr(w, name), w.fc1_layout, config.gated),
            )
            for label in full:
                assert_embedded(
                    f"rank {r} {name} {label} rows", full[label][:, o : o + n], mine[label], pad_rule(name, g)
                )
        for name, per in (("w2", 2), ("w2_scale", g)):
            full = getattr(src, name)[..., o // per : (o + n) // per]
            assert_embedded(f"rank {r} {name} columns", full, getattr(w, name), pad_rule(name, g))
    record_event(f"{sum(s.real == 0 for s in shards)} empty rank(s), {len(buffers)} buffer size")


def partial_output(w: MoeWeights, case: MoeCase, config: ShardingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 ``(out, S)`` ``[T, H]`` of experts ``w``: ``out = Σ_j w_j·act(x W13ᵀ) W2ᵀ`` and the magnitude
    ``S = Σ_j w_j·|act(x W13ᵀ)| |W2|ᵀ`` (no re-quantization: identical per channel on both sides)."""
    w13, w2 = dequantize_moe(w, case.w13_decode, case.w2_decode)
    if config.gated:
        w13 = relayout_fc1(w13, w.fc1_layout, Fc1Layout.GATE_UP)
    weights, ids = route(case.logits, config.top_k)
    x = case.x.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    mag = torch.zeros(x.shape, dtype=torch.float64)
    for expert, tok, slot in routed_experts(ids):
        a = activate(x[tok] @ w13[expert].double().T, config.activation, GateUpOrder.GATE_UP)
        wj = weights[tok, slot, None].double()
        out.index_add_(0, tok, wj * (a @ w2[expert].double().T))
        mag.index_add_(0, tok, wj * (a.abs() @ w2[expert].double().abs().T))
    return out, mag


@check(CONTRACT, ShardingConfig)
def check_ranks_sum_to_layer(config: ShardingConfig, backend: None, policy: MoeSharding) -> None:
    """The TP ranks' partial MoE outputs sum to the unsharded layer's output (within
    :data:`SUM_TOLERANCE` of its magnitude); an empty rank's partial output is exactly zero."""
    case = global_layer(config)
    shards = shard_checked(config, policy, case.weights)
    if shards is None:
        return
    want, mag = partial_output(case.weights, case, config)
    got = torch.zeros_like(want)
    halves = 2 if config.gated else 1
    for r, s in enumerate(shards):
        buffer, g = s.weights.w13.shape[-2] // halves, config.block
        assert buffer % g == 0, (
            f"rank {r}'s buffer of {buffer} channels is not a whole number of {g}-element groups: its FC2 scales "
            f"cover {buffer // g * g} of them, so its channels and scales cannot line up (docs/vllm-logic.md §15)"
        )
        assert_shapes(AlignedMoe(s.weights, buffer, config.hidden), config.experts, halves)
        part, _ = partial_output(s.weights, case, config)
        assert s.real > 0 or not part.any(), f"empty rank {r} contributes {part.abs().max().item():.4g}"
        got += part
    err = (got - want).abs()
    bad = err > SUM_TOLERANCE * mag
    assert not bad.any(), (
        f"the {config.tp} ranks' partial outputs do not sum to the layer's: max |diff| = {err.max().item():.4g} "
        f"(max |out| = {want.abs().max().item():.4g}) at {int(bad.sum())} of {bad.numel()} elements"
    )
    record_event(f"TP={config.tp}: {math.ceil(config.intermediate / config.block)} groups")


@given(config=sharding_configs())
@pinned
def test_every_element_on_one_rank(config: ShardingConfig, policy: MoeSharding) -> None:
    run_check(check_every_element_on_one_rank, config, None, policy)


@given(config=sharding_configs())
@pinned
def test_ranks_sum_to_layer(config: ShardingConfig, policy: MoeSharding) -> None:
    run_check(check_ranks_sum_to_layer, config, None, policy)
