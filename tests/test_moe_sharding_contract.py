"""Self-tests of the ``moe_sharding`` contract: the split arithmetic, and both verdicts on pinned layers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from conformance import test_moe_sharding as sharding
from contracts.moe_sharding import ShardRefused
from reference.layouts import Fc1Layout
from strategies.moe_sharding import ShardingConfig, pinned_sharding, sharding_configs
from subjects.moe_sharding import BuiltinMoeSharding, EvenSplitCutsGroups, FusedBlockSplit, split_sizes
from subjects.registry import contracts, known_bad, resolve

GEMMA_TP8 = pinned_sharding("gemma-4-26b-a4b", 8)  # 704 / 8 = 88: an even split cuts 16-groups
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
}
"""Each moe_sharding known-bad subject and a pinned layer both properties fail it on (the built-in passes)."""


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_known_bad_fails_where_builtin_passes(name: str, check) -> None:
    config = KNOWN_BAD[name]
    check(config, None, BuiltinMoeSharding())
    with pytest.raises((AssertionError, RuntimeError)):
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


@given(config=sharding_configs())
def test_configs_round_trip_and_are_whole_groups(config: ShardingConfig) -> None:
    assert ShardingConfig.from_dict(config.to_dict()) == config
    assert config.intermediate % config.block == 0
