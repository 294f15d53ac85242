"""Self-tests of the ``moe_sharding`` contract: the split arithmetic, and both verdicts on pinned layers."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_moe_sharding as sharding
from conformance.layers import PerConfig
from conformance.test_moe_sharding import assert_placement, partial_output
from contracts.moe_sharding import RankShard, ShardRefused, rank_coordinates
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.sizes import expert_blocks
from strategies.moe_sharding import ShardingConfig, pinned_sharding, sharding_configs
from subjects.moe_sharding import (
    BuiltinMoeSharding,
    EvenSplitCutsGroups,
    FusedBlockSplit,
    LoaderSharding,
    shards_of,
    split_sizes,
    take_channels,
)
from subjects.registry import contracts, known_bad, resolve

GEMMA_TP8 = pinned_sharding("gemma-4-26b-a4b", 8)  # 704 / 8 = 88: an even split cuts 16-groups
GPT_OSS_EP = pinned_sharding("gpt-oss-120b", 2, 32, ep=4, experts=6, bias=True)  # EP ranks of 2, 2, 1, 1 experts
CHECKS = (sharding.check_every_element_on_one_rank, sharding.check_ranks_sum_to_layer)


@pytest.mark.parametrize(
    ("size", "tp", "block", "want"),
    [
        (704, 8, 16, (96, 96, 96, 96, 96, 96, 96, 32)),  # whole 16-groups; the last rank short
        (768, 16, 16, (48,) * 16),  # an even split on whole groups
        (2880, 8, 32, (384,) * 7 + (192,)),  # gpt-oss: 90 blocks, 12 per rank
        (48, 16, 16, (16, 16, 16) + (0,) * 13),  # ranks smaller than a group: empty last ranks
    ],
)
def test_split_sizes(size: int, tp: int, block: int, want: tuple[int, ...]) -> None:
    assert split_sizes(size, tp, block) == want
    assert sum(want) == size


@pytest.mark.parametrize(
    ("experts", "ep", "counts"),
    [
        (8, 4, (2, 2, 2, 2)),
        (30, 8, (4, 4, 4, 4, 4, 4, 3, 3)),  # vLLM PR #21497's example: the first E % ep ranks hold one more
        (6, 4, (2, 2, 1, 1)),
        (2, 4, (1, 1, 0, 0)),  # E < ep: EP ranks without experts
    ],
)
def test_expert_blocks(experts: int, ep: int, counts: tuple[int, ...]) -> None:
    blocks = expert_blocks(experts, ep)
    assert tuple(map(len, blocks)) == counts
    assert [x for b in blocks for x in b] == list(range(experts))  # contiguous, in rank order, each once


@pytest.mark.parametrize("experts", [6, 2, 1])
def test_builtin_tp_ep_split(experts: int) -> None:
    config = replace(GPT_OSS_EP, experts=experts, top_k=min(2, experts))
    shards = BuiltinMoeSharding().shard_moe(sharding.global_layer(config).weights, True, 2, ep=4)
    assert len(shards) == 8
    for r, s in enumerate(shards):
        ep_rank, tp_rank = rank_coordinates(r, 2)
        assert s.experts == expert_blocks(experts, 4)[ep_rank] and s.weights.w13.shape[0] == len(s.experts)
        assert (s.offset, s.real, s.start) == (1440 * tp_rank, 1440, 0)  # 2880 = 90 32-groups: 45 per rank
        assert (s.weights.w2_bias[:, :].any(-1) == (tp_rank == 0)).all()  # w2_bias on TP rank 0 only
    for check in CHECKS:
        check(config, None, BuiltinMoeSharding())


class FrontPadded(BuiltinMoeSharding):
    """A correct split that puts each rank's real channels after ``lead`` zero channels (``start = lead``), or
    with ``honest = False`` reports ``start = 0`` for them."""

    def __init__(self, lead: int, honest: bool = True) -> None:
        self.lead, self.honest = lead, honest

    def split_channels(self, weights, gated, tp, experts):
        sizes = split_sizes(weights.intermediate_size, tp, weights.block)
        buffer, out = max(sizes) + self.lead, []
        for r, s in enumerate(shards_of(weights, gated, sizes, experts)):
            w = take_channels(weights, gated, s.offset, s.real, buffer, r, start=self.lead)
            out.append(RankShard(w, s.offset, s.real, experts, self.lead if self.honest else 0))
        return tuple(out)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_start_offsets(check) -> None:
    check(GPT_OSS_EP, None, FrontPadded(64))  # real channels after two zero 32-groups
    if check is sharding.check_every_element_on_one_rank:  # the sum reads the weights, not ``start``
        with pytest.raises(AssertionError, match="moved or changed"):
            check(GPT_OSS_EP, None, FrontPadded(64, honest=False))
        with pytest.raises(AssertionError, match="cut"):
            check(GPT_OSS_EP, None, FrontPadded(16))  # half a group in front: scale groups straddle


class ViaShards(LoaderSharding):
    """A loader whose ranks load ``policy``'s shards: what it holds is read back from the coordinate checkpoint."""

    def __init__(self, policy) -> None:
        self.policy = policy

    def load_rank(self, ckpt, gated, tp, tp_rank, *, ep, ep_rank, backend):
        return self.policy.shard_moe(ckpt, gated, tp, ep=ep, backend=backend)[ep_rank * tp + tp_rank].weights


@pytest.mark.parametrize("policy", [BuiltinMoeSharding(), FrontPadded(64)], ids=["builtin", "front-padded"])
@pytest.mark.parametrize("config", [GPT_OSS_EP, replace(GPT_OSS_EP, tp=4, ep_size=2, experts=3)], ids=str)
def test_loader_reads_back_experts_channels_and_start(policy, config: ShardingConfig) -> None:
    weights = sharding.global_layer(config).weights
    want = policy.shard_moe(weights, True, config.tp, ep=config.ep_size)
    got = ViaShards(policy).shard_moe(weights, True, config.tp, ep=config.ep_size)
    assert [(s.experts, s.offset, s.real, s.start) for s in got] == [
        (s.experts, s.offset, s.real, s.start) for s in want
    ]


def test_contract_and_known_bad_subjects_registered() -> None:
    assert "moe_sharding" in contracts()
    assert set(KNOWN_BAD) <= set(known_bad())


KNOWN_BAD = {
    "bad-shard-cuts-groups": GEMMA_TP8,
    "bad-shard-fused-block": GEMMA_TP8,
    "bad-shard-scale-stride": GEMMA_TP8,  # 88 channels, 5 scale groups per rank (vLLM #49949)
    "bad-shard-ceil-scale-offset": replace(GEMMA_TP8, intermediate=64),  # 8 channels per rank: half a group
    "bad-shard-refuses-sub-block": pinned_sharding("qwen3-30b-a3b", 16),  # 48 = 3 whole groups, refused
    "bad-shard-end-padded-rank": replace(GEMMA_TP8, layout=Fc1Layout.GATE_UP),  # last rank 32 of 96 channels
    "bad-shard-ep-world-rank": GPT_OSS_EP,  # TP rank 1 of EP rank 0 loads EP rank 1's experts
    "bad-shard-ep-floor-slice": GPT_OSS_EP,  # 6 // 4 = 1 expert sliced per rank, EP ranks 0, 1 hold 2
    "bad-shard-ep-global-slot": GPT_OSS_EP,  # every EP rank holds experts 0, 1
    "bad-shard-w2-bias-every-rank": GPT_OSS_EP,  # both TP ranks add w2_bias
}
"""Each moe_sharding known-bad subject and a pinned layer both properties fail it on (the built-in passes)."""


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_known_bad_fails_where_builtin_passes(name: str, check) -> None:
    config = KNOWN_BAD[name]
    check(config, None, BuiltinMoeSharding())
    with pytest.raises((AssertionError, RuntimeError)):  # bad-shard-ceil-scale-offset's narrow raises
        check(config, None, resolve(name).policy("moe_sharding"))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("layout", [Fc1Layout.GATE_UP, Fc1Layout.GATE_UP_INTERLEAVED], ids=lambda lay: lay.value)
def test_builtin_passes_and_known_bad_fail(check, layout: Fc1Layout) -> None:
    config = replace(GEMMA_TP8, layout=layout)
    check(config, None, BuiltinMoeSharding())
    with pytest.raises(AssertionError):
        check(config, None, EvenSplitCutsGroups())
    if layout is Fc1Layout.GATE_UP:  # row-interleaved pairs survive a split of the fused block
        with pytest.raises(AssertionError):
            check(config, None, FusedBlockSplit())
    else:
        check(config, None, FusedBlockSplit())


def test_refusing_a_group_cutting_split_is_allowed() -> None:
    class Refuses(BuiltinMoeSharding):
        def shard_moe(self, weights, gated, tp, *, ep=1, backend=None):
            part, rem = divmod(weights.intermediate_size, tp)
            if rem or part % weights.block:
                raise ShardRefused(f"TP={tp} would cut a {weights.block}-group")
            return super().shard_moe(weights, gated, tp, ep=ep, backend=backend)

    for check in CHECKS:
        check(GEMMA_TP8, None, Refuses())  # 88 channels per rank: refusing is fine

    class AlwaysRefuses(BuiltinMoeSharding):
        def shard_moe(self, weights, gated, tp, *, ep=1, backend=None):
            raise ShardRefused("no")

    with pytest.raises(AssertionError, match="refused a split that keeps whole 16-groups"):
        sharding.check_every_element_on_one_rank(pinned_sharding("qwen3-30b-a3b", 16), None, AlwaysRefuses())


@given(config=st.one_of(sharding_configs(NVFP4_BLOCK), sharding_configs(MXFP4_BLOCK)))
def test_configs_round_trip_and_are_whole_groups(config: ShardingConfig) -> None:
    assert ShardingConfig.from_dict(config.to_dict()) == config
    assert config.intermediate % config.block == 0


def test_per_config_values_are_computed_once_and_the_oldest_dropped() -> None:
    calls: list[str] = []
    kept = PerConfig[str](kept=2)

    def compute(key: str) -> str:
        calls.append(key)
        return key.upper()

    inputs = torch.zeros(3)
    assert [kept.get(k, inputs, lambda k=k: compute(k)) for k in ("a", "b", "a", "c", "a")] == list("ABACA")
    assert calls == ["a", "b", "c", "a"], "a read its kept value once, then was dropped for c"
    inputs[1] = 1.0  # changed in place: a new key
    assert kept.get("a", inputs, lambda: compute("a")) == "A" and calls == ["a", "b", "c", "a", "a"]


def test_backends_share_the_layers_reference_outputs_and_placement_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configuration bound to each backend (``for_backend``, as the runner binds it) keys the caches by the
    drawn layer alone: a policy that shards the same way for two backends gets one layer output, one output per
    rank and one placement check."""
    outputs, placements = [], []
    monkeypatch.setattr(sharding, "_LAYER_OUTPUTS", PerConfig())
    monkeypatch.setattr(sharding, "_RANK_OUTPUTS", PerConfig())
    monkeypatch.setattr(sharding, "_PLACEMENTS", PerConfig())
    monkeypatch.setattr(sharding, "partial_output", lambda *a: outputs.append(a) or partial_output(*a))
    monkeypatch.setattr(sharding, "assert_placement", lambda *a: placements.append(1) or assert_placement(*a))
    for backend in (Nvfp4MoeBackend.FLASHINFER_TRTLLM, Nvfp4MoeBackend.FLASHINFER_CUTLASS):
        config = GEMMA_TP8.for_backend(backend)
        sharding.check_ranks_sum_to_layer(config, backend, BuiltinMoeSharding())
        sharding.check_every_element_on_one_rank(config, backend, BuiltinMoeSharding())
    assert len(outputs) == 1 + GEMMA_TP8.ranks and len(placements) == 1, (len(outputs), len(placements))
