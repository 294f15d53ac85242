"""Self-tests: real model sizes and real local expert counts reach the MoE policies, within the weight budget.

The strategies of ``nvfp4_moe``, ``mxfp4_moe`` and ``moe_sharding`` hand a policy hidden and intermediate
sizes above 512 and more than 4 experts on a rank (:class:`strategies.moe.Scale`); the mutants of
:mod:`bench.mutants` that skip padding exactly there fail the properties, and the built-in policies pass
the same examples.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from bench.detection import Costs, Draws, caught_without_pins
from bench.mutants import CI_MUTANTS, LARGE_ONLY, MANY_EXPERTS
from conformance import test_moe_sharding, test_mxfp4_moe, test_nvfp4_moe
from harness.inputs import guard_inputs
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from strategies.catalog import MODELS
from strategies.moe import WEIGHT_BUDGET, MoeShape, Scale, layer_shape, moe_shapes, weight_elements
from strategies.moe_sharding import ShardingConfig, pinned_sharding, sharding_configs
from strategies.mxfp4_moe import Mxfp4MoeConfig, mxfp4_moe_configs
from subjects.registry import builtin

pytestmark = pytest.mark.together  # its tests reuse the real-size layers, draws and costs the first ones build

FIND = settings(max_examples=500, database=None, suppress_health_check=list(HealthCheck))


def nvfp4_sizes(s: MoeShape) -> tuple[int, int, int]:
    return s.hidden, s.intermediate, s.experts


def mxfp4_sizes(c: Mxfp4MoeConfig) -> tuple[int, int, int]:
    return nvfp4_sizes(c.shape)


def sharding_sizes(c: ShardingConfig) -> tuple[int, int, int]:
    """Hidden size, one TP rank's intermediate channels and one EP rank's experts."""
    return c.hidden, math.ceil(c.intermediate / c.tp), math.ceil(c.experts / c.ep_size)


STRATEGIES = {
    "nvfp4_moe": (moe_shapes(), nvfp4_sizes),
    "mxfp4_moe": (mxfp4_moe_configs(), mxfp4_sizes),
    "moe_sharding": (st.one_of(sharding_configs(NVFP4_BLOCK), sharding_configs(MXFP4_BLOCK)), sharding_sizes),
}


@pytest.mark.parametrize("contract", sorted(STRATEGIES))
def test_real_hidden_and_intermediate_sizes_reach_the_policy(contract: str) -> None:
    strategy, sizes = STRATEGIES[contract]
    assert sizes(find(strategy, lambda c: sizes(c)[0] >= 2048, settings=FIND))[0] >= 2048
    assert sizes(find(strategy, lambda c: sizes(c)[1] > 512, settings=FIND))[1] > 512


@pytest.mark.parametrize("contract", sorted(STRATEGIES))
def test_real_local_expert_counts_reach_the_policy(contract: str) -> None:
    strategy, sizes = STRATEGIES[contract]
    assert sizes(find(strategy, lambda c: sizes(c)[2] > 4, settings=FIND))[2] == 5  # shrinks to 5
    assert sizes(find(strategy, lambda c: sizes(c)[2] >= 64, settings=FIND))[2] >= 64


@settings(max_examples=200, database=None)
@given(shape=moe_shapes())
def test_every_moe_shape_fits_the_weight_budget(shape: MoeShape) -> None:
    assert weight_elements(shape.experts, shape.intermediate, shape.hidden) <= WEIGHT_BUDGET


@settings(max_examples=200, database=None)
@given(config=st.one_of(sharding_configs(NVFP4_BLOCK), sharding_configs(MXFP4_BLOCK)))
def test_every_sharding_layer_fits_the_weight_budget(config: ShardingConfig) -> None:
    assert weight_elements(config.experts, config.intermediate, config.hidden) <= WEIGHT_BUDGET


def test_full_width_keeps_the_real_hidden_size_where_the_rank_is_too_wide() -> None:
    m = MODELS["deepseek-v3"]  # TP=1: 2·2048·7168 > budget
    shape = layer_shape(m, 1, False, 0, 16, m.activation, 1, 1, 1, 0, scale=Scale.FULL_WIDTH)
    assert (shape.intermediate, shape.hidden) == (512, 7168)
    shape = layer_shape(m, 8, False, 0, 16, m.activation, 1, 1, 1, 0, scale=Scale.FULL_WIDTH)
    assert (shape.intermediate, shape.hidden) == (256, 7168)


GEMMA = MODELS["gemma-4-26b-a4b"]
GEMMA_TP4_FULL = layer_shape(GEMMA, 4, False, 0, 16, GEMMA.activation, 1, 1, 2, 0, scale=Scale.FULL_WIDTH)
"""I = 176 (padded to 256 by trtllm-gen), H = 2816: a large layer that needs padding."""
GEMMA_TP4_MANY = layer_shape(GEMMA, 4, False, 0, 16, GEMMA.activation, 8, 1, 2, 0, scale=Scale.MANY_EXPERTS)


@pytest.mark.parametrize(
    ("shape", "mutant"), [(GEMMA_TP4_FULL, LARGE_ONLY), (GEMMA_TP4_MANY, MANY_EXPERTS)], ids=["large", "many"]
)
def test_nvfp4_mutants_fail_where_the_builtin_passes(shape: MoeShape, mutant) -> None:
    check, backend = test_nvfp4_moe.check_backend_accepts, Nvfp4MoeBackend.FLASHINFER_TRTLLM
    check(shape, backend, guard_inputs(builtin().policy("nvfp4_moe")))
    with pytest.raises(AssertionError, match="rejects"):
        check(shape, backend, guard_inputs(mutant.policy("nvfp4_moe")))


GPT_OSS = MODELS["gpt-oss-120b"]


@pytest.mark.parametrize(
    ("experts", "scale", "mutant"), [(1, Scale.FULL_WIDTH, LARGE_ONLY), (8, Scale.MANY_EXPERTS, MANY_EXPERTS)]
)
def test_mxfp4_mutants_fail_where_the_builtin_passes(experts: int, scale: Scale, mutant) -> None:
    shape = layer_shape(GPT_OSS, 4, False, 0, 32, GPT_OSS.activation, experts, 1, 2, 0, scale=scale)
    config = Mxfp4MoeConfig(shape, GPT_OSS.checkpoint, GPT_OSS.expert_biases)
    check, backend = test_mxfp4_moe.check_backend_accepts, Mxfp4MoeBackend.FLASHINFER_TRTLLM
    check(config, backend, guard_inputs(builtin().policy("mxfp4_moe")))
    with pytest.raises(AssertionError, match="rejects"):
        check(config, backend, guard_inputs(mutant.policy("mxfp4_moe")))


@pytest.mark.parametrize(("experts", "mutant"), [(2, LARGE_ONLY), (12, MANY_EXPERTS)], ids=["large", "many"])
def test_sharding_mutants_fail_where_the_builtin_passes(experts: int, mutant) -> None:
    config = pinned_sharding("gpt-oss-120b", 8, 32, ep=2, experts=experts)  # 90 blocks over 8: a short last rank
    check = test_moe_sharding.check_every_element_on_one_rank
    check(config, None, guard_inputs(builtin().policy("moe_sharding")))
    with pytest.raises(AssertionError, match="different buffers"):
        check(config, None, guard_inputs(mutant.policy("moe_sharding")))


COSTS: Costs = {}
"""Property costs timed for one mutant, ordering the next one's properties (:class:`bench.detection.Outcomes`)."""

DRAWS = Draws()
"""The properties' generated sequences, drawn for one mutant and read by the next (both mutants' contracts share
them, as ``python -m bench`` shares them between subjects)."""


@pytest.mark.long(5)  # a search over every property of three contracts
@pytest.mark.parametrize("mutant", CI_MUTANTS, ids=lambda s: s.name)
def test_generation_alone_catches_the_size_mutants(mutant) -> None:
    """``python -m bench --quick``'s gate for these mutants: seed 0, the 25 generated examples per property, no pins."""
    assert caught_without_pins(mutant, 0, draws=DRAWS, costs=COSTS) is not None
