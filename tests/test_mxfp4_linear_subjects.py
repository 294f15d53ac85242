"""Self-tests of the ``mxfp4_linear`` and ``shared_expert`` contracts' machinery (not of a subject).

* Registration: both contracts, their protocols, backends and known-bad subjects resolve.
* Strategies: reduced tensor sizes keep the guard's answer (``N mod 32``, ``N == 96``,
  ``K mod 256``); rank-local shapes follow the sharding; configs round-trip through JSON.
* The contracts' spec tables agree with vLLM's unit tests (the guard table of
  ``test_rocm_mxfp4.py`` and the ``_should_replicate_misaligned_shared_expert`` table).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from backends.mxfp4_linear import VLLM_GUARD_TABLE, AiterLinearPath
from backends.mxfp4_linear import asm_gemm_eligible as asm_supported
from conformance.regressions import MXFP4_LINEAR_REGRESSIONS as REGRESSIONS
from conformance.shared_expert_oracle import REFUSED, VLLM_DECISION_TABLE, expected_placement
from contracts.mxfp4_linear import CONTRACT as LINEAR
from contracts.mxfp4_linear import Mxfp4LinearKernelSelection
from contracts.shared_expert import CONTRACT as SHARED
from contracts.shared_expert import SharedExpertPlacement, SharedExpertPolicy
from strategies.linear import (
    ActivationBlocks,
    Mxfp4LinearShape,
    Parallel,
    ScaleShapeCase,
    activation_blocks,
    linear_shapes,
    pinned_linear,
    reduce_rows,
    scale_shapes,
)
from strategies.shared_expert import SharedExpertCase, dense_layer_shapes, shared_expert_cases
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.registry import backends, builtin, contracts, known_bad, resolve
from subjects.shared_expert import BuiltinSharedExpert

KNOWN_BAD = {
    "bad-no-asm-guard": {LINEAR},
    "bad-overconservative-guard": {LINEAR},
    "bad-asm-96-rows": {LINEAR},
    "bad-single-act-rounding": {LINEAR},
    "bad-fse-after-replicate": {SHARED},
    "bad-pre-55213": {LINEAR, SHARED},
}


def test_contracts_registered() -> None:
    assert contracts()[LINEAR] is Mxfp4LinearKernelSelection
    assert contracts()[SHARED] is SharedExpertPolicy
    assert backends(LINEAR) == (AiterLinearPath.ASM, AiterLinearPath.TRITON)
    assert backends(SHARED) == ()
    assert isinstance(builtin().policy(LINEAR), BuiltinMxfp4Linear)
    assert isinstance(builtin().policy(SHARED), BuiltinSharedExpert)


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_known_bad_subjects(name: str) -> None:
    subject = known_bad()[name]
    assert subject.reproduces, f"{name} does not say what it reproduces"
    assert set(subject.policies) == KNOWN_BAD[name]
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_external_policy_resolves_by_protocol() -> None:
    subject = resolve("subjects.shared_expert:Pre55213")
    assert set(subject.policies) == {LINEAR, SHARED}


@pytest.mark.parametrize(
    ("n", "want"),
    [(12, 12), (96, 96), (128, 128), (160, 160), (192, 160), (2560, 160), (2561, 129), (130, 130), (161, 129)],
)
def test_reduce_rows(n: int, want: int) -> None:
    assert reduce_rows(n) == want


@given(shape=linear_shapes())
def test_reduction_keeps_the_guard_answer(shape: Mxfp4LinearShape) -> None:
    reduced = (shape.n, shape.k // 32)
    assert asm_supported(tuple(shape.scale_shape)) == asm_supported(reduced)
    assert (shape.n > 128) == (shape.scale_shape[0] > 128)  # SGLang's ASM threshold
    assert asm_supported(tuple(shape.scale_shape)) == asm_supported(
        (shape.prep_shape()[0], shape.prep_shape()[1] // 32)
    )
    assert shape.real_n % 32 == shape.n % 32 and shape.real_k % 256 == shape.k % 256
    assert shape.n <= 160 and shape.k <= 512 and shape.k % 32 == 0


@given(shape=linear_shapes())
def test_rank_local_sharding(shape: Mxfp4LinearShape) -> None:
    n, k = shape.real_n, shape.real_k
    if shape.parallel is Parallel.COLUMN:
        assert (n * shape.tp, k) == (shape.out_features, shape.in_features)
    elif shape.parallel is Parallel.ROW:
        assert (n, k * shape.tp) == (shape.out_features, shape.in_features)
    else:
        assert (n, k) == (shape.out_features, shape.in_features)


@given(shape=linear_shapes(), case=scale_shapes(), blocks=activation_blocks(), se=shared_expert_cases())
def test_configs_round_trip_json(shape, case, blocks, se) -> None:
    for config, kind in (
        (shape, Mxfp4LinearShape),
        (case, ScaleShapeCase),
        (blocks, ActivationBlocks),
        (se, SharedExpertCase),
    ):
        assert kind.from_dict(json.loads(config.to_json())) == config


def test_regression_scale_shapes() -> None:
    assert [tuple(s.scale_shape) for s in REGRESSIONS] == [
        (2560, 20),
        (2560, 20),
        (2560, 10),
        (640, 80),
        (96, 160),
        (48, 160),
        (24, 160),
        (12, 160),
    ]
    assert pinned_linear("qwen3.8-flash-next", "shared_expert.down_proj", 8, Parallel.REPLICATED).tp == 8


@pytest.mark.parametrize(("shape", "want"), VLLM_GUARD_TABLE)
def test_guard_spec_matches_vllm_unit_tests(shape: tuple[int, ...], want: bool) -> None:
    assert asm_supported(shape) is want
    assert BuiltinMxfp4Linear().use_asm_gemm(shape) is want


@pytest.mark.parametrize(("case", "want"), VLLM_DECISION_TABLE, ids=lambda v: getattr(v, "describe", lambda: str(v))())
def test_decision_spec_matches_vllm_unit_tests(case: SharedExpertCase, want) -> None:
    assert expected_placement(case.setup()) == want
    if want == REFUSED:
        with pytest.raises(ValueError, match="640"):
            BuiltinSharedExpert().shared_expert_placement(case.setup())
    else:
        assert BuiltinSharedExpert().shared_expert_placement(case.setup()) is want


def test_dense_layers_of_the_a3_regression() -> None:
    """Qwen3.8-Flash-Next TP8 + EP replicated: the dense down_proj holds scale (2560, 20) (vLLM PR #55213)."""
    case = VLLM_DECISION_TABLE[4][0]
    shapes = {
        layer.name: tuple(s.scale_shape) for layer, s in dense_layer_shapes(case, SharedExpertPlacement.REPLICATED)
    }
    assert shapes == {"shared_expert.gate_up_proj": (1280, 80), "shared_expert.down_proj": (2560, 20)}
    sharded = dense_layer_shapes(case, SharedExpertPlacement.SHARDED)
    assert [s for _, s in sharded][1] is None, "640 / 8 = 80 cuts a 32-element group"
    assert dense_layer_shapes(case, SharedExpertPlacement.FUSED) == ()
