"""Self-tests of what a failing property reports: which example it reproduces and its message."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import Phase, example, given, settings

from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.test_nvfp4_moe import check_backend_accepts, check_padding_invariance
from contracts.moe import AlignedMoe
from harness import repro
from harness.repro import Reproduction
from harness.runner import active, reported_reproduction, run_check
from strategies.moe import moe_shapes, pinned_shape
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment, GatedPad16Alignment
from tests.test_plugin import in_parallel

GEMMA_TP4 = pinned_shape("gemma-4-26b-a4b", 4)  # I = 176: both pins fail under the pad-16 policy
GLM_AIR_TP8 = pinned_shape("glm-4.5-air", 8)
ROOT = Path(__file__).resolve().parent.parent


def test_reported_reproduction_is_the_example_hypothesis_reports() -> None:
    """Two failing pins: the reproduction is the first pin Hypothesis ran (the first of its
    exception group), not the last failing call."""
    ran = []

    @settings(database=None, phases=[Phase.explicit], report_multiple_bugs=True)
    @given(shape=moe_shapes())
    @example(shape=GLM_AIR_TP8)
    @example(shape=GEMMA_TP4)
    def prop(shape):
        ran.append(shape)
        run_check(check_backend_accepts, shape, Nvfp4MoeBackend.FLASHINFER_TRTLLM, GatedPad16Alignment())

    with pytest.raises(BaseException) as info:
        prop()
    assert len(ran) == 2 and ran[0] != ran[1]
    reported = reported_reproduction(info.value)
    assert reported is not None and reported.config == ran[0].to_dict()
    state = active()
    assert state.last_failure[state.nodeid].config == ran[1].to_dict()


class NanScalePadding(BuiltinNvfp4MoeAlignment):
    """Pads correctly, then writes the E4M3 NaN byte 0x7F into FC1's padded scale rows."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        i, ip = weights.intermediate_size, aligned.intermediate_size
        scale = aligned.weights.w13_scale.clone()
        for half in range(2 if gated else 1):
            scale[:, half * ip + i : (half + 1) * ip] = 0x7F
        return AlignedMoe(replace(aligned.weights, w13_scale=scale), ip, aligned.hidden_size)


def test_nan_in_padding_fails_as_changed_output() -> None:
    """NaN reaching the reference's re-quantization reads as the property's own failure."""
    with pytest.raises(
        AssertionError,
        match=r"^padding changed the MoE output \(flashinfer-trtllm reads FC1 rows as up;gate; I 176 -> 192.*\): NaN",
    ):
        check_padding_invariance(GEMMA_TP4, Nvfp4MoeBackend.FLASHINFER_TRTLLM, NanScalePadding())


LAYOUT = "conformance.test_nvfp4_moe:check_gate_up_layout"


@pytest.mark.long(14)
def test_printed_command_runs_as_pasted_without_python_on_the_path(tmp_path: Path) -> None:
    """The ``reproduce:`` line names the running interpreter: pasted into a shell whose ``PATH``
    has no ``python`` at all, it still runs the check (and this one passes)."""
    command = Reproduction(LAYOUT, "builtin", "flashinfer-cutlass", GEMMA_TP4.to_dict()).command()
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty folder: no python, no shell tools
    ran = subprocess.run(["/bin/sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-2000:]
    assert "passed: the check did not fail" in ran.stdout


HOSTILE = 'x"""; open({mark!r}, "w"); """ \' $(touch {mark}) `touch {mark}`'


@pytest.mark.long(14)
def test_a_hostile_subject_spec_stays_data_in_the_command_and_the_script(tmp_path: Path) -> None:
    """A subject spec holding triple quotes, quotes and shell syntax runs no code from either the
    printed command or the written script: both hand the spec, unchanged, to the subject lookup."""
    mark = tmp_path / "injected"
    subject = HOSTILE.format(mark=str(mark))
    r = Reproduction(LAYOUT, subject, "flashinfer-cutlass", GEMMA_TP4.to_dict())
    script = repro.write_script(tmp_path / "results", "test_x.py::test_y[a\"b'c]", r)
    compile(script.read_text(encoding="utf-8"), str(script), "exec")
    runs = [["/bin/sh", "-c", r.command()], [sys.executable, str(script)]]
    done = in_parallel(
        *[lambda a=a: subprocess.run(a, cwd=ROOT, capture_output=True, text=True, timeout=300) for a in runs]
    )
    for argv, ran in zip(runs, done, strict=True):
        assert ran.returncode != 0 and not mark.exists(), f"{argv}: code ran from the subject spec"
        assert "SyntaxError" not in ran.stderr, ran.stderr[-2000:]
        assert subject in ran.stderr or repr(subject) in ran.stderr, ran.stderr[-2000:]
