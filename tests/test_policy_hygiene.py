"""The guard's result rules (:mod:`harness.hygiene`): determinism, no aliasing, placement, declared layouts.

Each known-bad probe (:mod:`tests.probes`) passes the contract's properties when called directly (the
properties cannot see its bug) and fails with its own :class:`~contracts.errors.GuardViolation` behind
:func:`harness.inputs.guard_inputs`; the built-in policies pass behind it, and the guard leaves the global
generators where one unguarded call would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_mxfp4_linear as linear
from conformance import test_nvfp4_moe as nvfp4
from conformance.regressions import MXFP4_LINEAR_REGRESSIONS
from contracts.errors import GuardViolation, UnsupportedConfig
from contracts.moe import fc1_layouts_holding, pad_moe
from harness.hygiene import (
    FalseLayoutDeclared,
    NonDeterministic,
    OutputAliased,
    OutputNotContiguous,
    OutputOffDevice,
    differences,
)
from harness.inputs import EarlierCallModified, guard_inputs
from reference.layouts import Fc1Layout
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.mxfp4_moe import BuiltinMxfp4MoeAlignment
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from tests import batch
from tests.probes import (
    DRAWS,
    FlakyEndPadding,
    MislabelledFc1,
    PassesWeightThrough,
    ResultOnDevice,
    ReusesResultBuffer,
    ScribblesOnLastInput,
    StridedResult,
)

ROOT = Path(__file__).resolve().parent.parent
SHAPE = pinned_shape("gemma-4-26b-a4b", 4)
TRTLLM = Nvfp4MoeBackend.FLASHINFER_TRTLLM
CHECKS = (nvfp4.check_padding_invariance, nvfp4.check_gate_up_layout, nvfp4.check_minimal_and_idempotent)


def _seed_like_hypothesis() -> None:
    """What Hypothesis does before every example for ``random`` and NumPy (and here torch too): seed 0."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _examples(n: int):
    return [dataclasses.replace(SHAPE, seed=seed) for seed in range(n)]


@pytest.mark.parametrize("source", sorted(DRAWS))
def test_flaky_policy_passes_every_example_and_fails_the_guard(source: str) -> None:
    for shape in _examples(5):  # unguarded: the same first draw in every example, never below 0.1
        _seed_like_hypothesis()
        nvfp4.check_gate_up_layout(shape, TRTLLM, FlakyEndPadding(source))
    # the second call's draw falls under 0.1 on about one example in ten: 100 examples miss it with probability
    # 0.9^100 (about 3e-5) whatever the second seeds are (harness.inputs derives them); 40 missed it 1.5 % of the time
    for shape in _examples(100):
        _seed_like_hypothesis()
        try:
            nvfp4.check_gate_up_layout(shape, TRTLLM, guard_inputs(FlakyEndPadding(source)))
        except NonDeterministic as exc:
            assert "non-deterministic: FlakyEndPadding.align_moe gave another result" in str(exc)
            assert "result.weights.w13 " in str(exc)
            return
    pytest.fail("a policy wrong on one call in ten passed 100 guarded examples")


def test_refusing_at_random_is_non_deterministic() -> None:
    class RefusesAtRandom(BuiltinNvfp4MoeAlignment):
        def align_moe(self, backend, weights, gated):
            if random.random() < 0.5:
                raise UnsupportedConfig("not today")
            return super().align_moe(backend, weights, gated)

    class AlwaysRefuses(BuiltinNvfp4MoeAlignment):
        def align_moe(self, backend, weights, gated):
            raise UnsupportedConfig("never")

    weights = moe_case(SHAPE, 16).weights
    with pytest.raises(UnsupportedConfig, match="never"):  # the same refusal twice is the policy's answer
        guard_inputs(AlwaysRefuses()).align_moe(TRTLLM, weights, True)
    with pytest.raises(NonDeterministic, match=r"UnsupportedConfig\('not today'\)"):
        for seed in range(20):
            random.seed(seed)
            with contextlib.suppress(UnsupportedConfig):  # refused on both calls: consistent, try the next seed
                guard_inputs(RefusesAtRandom()).align_moe(TRTLLM, weights, True)


def test_guard_leaves_the_generators_as_one_call_leaves_them() -> None:
    class DrawsEverywhere(BuiltinNvfp4MoeAlignment):
        def align_moe(self, backend, weights, gated):
            for draw in DRAWS.values():
                draw()
            return super().align_moe(backend, weights, gated)

    weights = moe_case(SHAPE, 16).weights
    states = []
    for policy in (DrawsEverywhere(), guard_inputs(DrawsEverywhere())):
        _seed_like_hypothesis()
        policy.align_moe(TRTLLM, weights, True)
        states.append((random.random(), float(np.random.random()), float(torch.rand(()))))
    assert states[0] == states[1]


def test_writing_into_the_last_calls_input_fails() -> None:
    probe = ScribblesOnLastInput()
    for shape in _examples(3):
        for check in CHECKS[1:]:
            check(shape, TRTLLM, probe)  # unguarded: each write lands in a tensor no property reads again
    guarded = guard_inputs(ScribblesOnLastInput())
    first = moe_case(SHAPE, 16).weights
    guarded.align_moe(TRTLLM, first, True)
    with pytest.raises(
        EarlierCallModified,
        match=r"ScribblesOnLastInput\.align_moe wrote to tensors an earlier call was given .*"
        r"ScribblesOnLastInput\.align_moe's earlier input weights\.w13 \[2, \d+, \d+\] torch\.uint8: \d+ byte",
    ):
        guarded.align_moe(TRTLLM, moe_case(_examples(2)[1], 16).weights, True)


def test_reusing_a_result_buffer_fails() -> None:
    for check in CHECKS:
        check(SHAPE, TRTLLM, ReusesResultBuffer())  # unguarded: aligning again writes the same bytes
    with pytest.raises(
        OutputAliased,
        match=r"output aliased: ReusesResultBuffer\.align_moe .*result\.weights\.w2 shares storage with "
        r"ReusesResultBuffer\.align_moe's earlier result result\.weights\.w2",
    ):
        guard_inputs(ReusesResultBuffer()).align_moe(TRTLLM, moe_case(SHAPE, 16).weights, True)


def test_returning_the_callers_tensor_fails() -> None:
    shape = MXFP4_LINEAR_REGRESSIONS[0]
    linear.check_layouts_compute_the_reference(shape, linear.AiterLinearPath.TRITON, PassesWeightThrough())
    with pytest.raises(OutputAliased, match=r"result\.weight shares storage with the input weight"):
        linear.check_layouts_compute_the_reference(
            shape, linear.AiterLinearPath.TRITON, guard_inputs(PassesWeightThrough())
        )


def test_strided_and_moved_results_fail() -> None:
    for check in CHECKS:
        check(SHAPE, TRTLLM, StridedResult())  # unguarded: right values, wrong strides
    weights = moe_case(SHAPE, 16).weights
    with pytest.raises(OutputNotContiguous, match=r"result\.weights\.w2 \[2, \d+, \d+\] has strides"):
        guard_inputs(StridedResult()).align_moe(TRTLLM, weights, True)
    with pytest.raises(OutputOffDevice, match=r"result\.weights\.w2_scale is on meta, its inputs on cpu"):
        guard_inputs(ResultOnDevice("meta")).align_moe(TRTLLM, weights, True)


def test_false_fc1_layout_fails() -> None:
    for check in CHECKS:
        check(SHAPE, TRTLLM, MislabelledFc1())  # unguarded: nvfp4_moe reads [up; gate] whatever the label
    with pytest.raises(
        FalseLayoutDeclared,
        match=r"result\.weights\.w13 holds weights's gate/up rows in up;gate order, but fc1_layout says gate;up",
    ):
        guard_inputs(MislabelledFc1()).align_moe(TRTLLM, moe_case(SHAPE, 16).weights, True)


def test_layouts_holding_reads_the_data() -> None:
    weights = dataclasses.replace(moe_case(SHAPE, 16).weights, fc1_layout=Fc1Layout.UP_GATE)
    padded = pad_moe(weights, True, 256, SHAPE.hidden).weights
    assert fc1_layouts_holding(weights, padded, "w13") == [Fc1Layout.UP_GATE]
    mx = dataclasses.replace(moe_case(pinned_shape("qwen3-30b-a3b", 8), 32).weights, fc1_layout=Fc1Layout.UP_GATE)
    aligned = BuiltinMxfp4MoeAlignment().align_moe(Mxfp4MoeBackend.MARLIN, mx, True).weights  # to [gate; up]
    assert fc1_layouts_holding(mx, aligned, "w13") == [Fc1Layout.GATE_UP] == [aligned.fc1_layout]
    zeros = dataclasses.replace(weights, w13=torch.zeros_like(weights.w13))
    assert fc1_layouts_holding(zeros, pad_moe(zeros, True, 256, SHAPE.hidden).weights, "w13") == list(Fc1Layout)


@pytest.mark.parametrize("backend", [TRTLLM, Nvfp4MoeBackend.VLLM_CUTLASS], ids=lambda b: b.value)
def test_builtin_policies_pass_where_nothing_is_padded(backend: Nvfp4MoeBackend) -> None:
    """Aligning aligned weights pads nothing; the built-ins still return tensors of their own."""
    guarded = guard_inputs(BuiltinNvfp4MoeAlignment())
    aligned = guarded.align_moe(backend, moe_case(SHAPE, 16).weights, True)
    again = guarded.align_moe(backend, aligned.weights, True)
    assert not differences(aligned, again, "aligned")
    weight, scale = torch.zeros(32, 16, dtype=torch.uint8), torch.full((32, 1), 127, dtype=torch.uint8)
    guard_inputs(BuiltinMxfp4Linear()).prepare_triton_linear(weight, scale)  # scale.T is contiguous already


def test_differences_compare_bytes_through_containers() -> None:
    a = {"x": (torch.tensor([0.0, float("nan")]), 1)}
    assert differences(a, {"x": (torch.tensor([0.0, float("nan")]), 1)}, "r") == []  # NaN bytes equal
    assert differences(a, {"x": (torch.tensor([-0.0, float("nan")]), 1)}, "r") == [
        "r['x'][0] [2] torch.float32: 1 byte(s) differ, first at element [0]"
    ]
    assert differences(a, {"x": (torch.tensor([0.0, float("nan")]), 2)}, "r") == ["r['x'][1]: 1 vs 2"]


def test_guard_errors_are_guard_violations() -> None:
    errors = (NonDeterministic, OutputAliased, OutputNotContiguous, OutputOffDevice, EarlierCallModified)
    assert all(issubclass(e, GuardViolation) and not issubclass(e, AssertionError) for e in errors)


def test_a_false_layout_is_a_property_failure() -> None:
    """A false ``fc1_layout`` judges the weights (an engine can hand its kernel the wrong rows), so a ledger entry
    naming that engine bug may expect it: an ``AssertionError``, never a guard error."""
    assert issubclass(FalseLayoutDeclared, AssertionError) and not issubclass(FalseLayoutDeclared, GuardViolation)


@pytest.mark.long(40)
def test_suite_run_reports_non_determinism(tmp_path: Path) -> None:
    """End to end: the flaky probe fails a ``ci`` run of one property with the guard's message. Pinned to
    Gemma-4-26B-A4B at TP=4 (I = 176, gated): end padding differs from per-half padding on every example there,
    so each second call that draws below 0.1 shows it (an aligned or non-gated layer would hide it)."""
    cmd = [
        "-p", "no:cacheprovider", "-q", "-x", "conformance/test_nvfp4_moe.py",
        "--subject", "tests.probes:FLAKY_END_PADDING", "-k", "gate_up_layout and trtllm",
        "--model", "gemma-4-26b-a4b", "--tp", "4",
        "--results", str(tmp_path / "results"),
    ]  # fmt: skip
    out = batch.run(batch.Run(cmd, env=batch.suite_env()), tmp_path / "run", 600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "NonDeterministic: non-deterministic: FlakyEndPadding.align_moe" in out.stdout
