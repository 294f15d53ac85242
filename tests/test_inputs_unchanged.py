"""Every protocol call leaves its inputs unchanged (:mod:`harness.inputs`).

Probes: a policy that zeroes a row of the caller's ``w13`` and then pads correctly (every property
passed it before the guard) and one that pads and then scribbles on its input (it failed with the
misleading "padding changed the MoE output"). Both must fail with the guard's own message.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch

from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_nvfp4_moe as nvfp4
from contracts.errors import UnsupportedConfig
from contracts.mxfp4_linear import Mxfp4LinearKernelSelection
from harness.inputs import InputModified, guard_inputs
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from subjects.registry import named_subjects
from tests import batch
from tests.probes import PadThenScribble, ZeroRowThenPad

ROOT = Path(__file__).resolve().parent.parent
SHAPE = pinned_shape("gemma-4-26b-a4b", 4)
TRTLLM = Nvfp4MoeBackend.FLASHINFER_TRTLLM
CHECKS = (nvfp4.check_padding_invariance, nvfp4.check_gate_up_layout, nvfp4.check_minimal_and_idempotent)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_zeroing_the_callers_rows_fails_with_input_modified(check) -> None:
    check(SHAPE, TRTLLM, ZeroRowThenPad())  # unguarded, the corruption is invisible to the property
    with pytest.raises(InputModified, match=r"input modified: ZeroRowThenPad\.align_moe .*weights\.w13 "):
        check(SHAPE, TRTLLM, guard_inputs(ZeroRowThenPad()))


def test_scribbling_after_padding_fails_with_input_modified() -> None:
    with pytest.raises(AssertionError, match="padding changed the MoE output"):
        nvfp4.check_padding_invariance(SHAPE, TRTLLM, PadThenScribble())  # the misleading verdict
    with pytest.raises(
        InputModified,
        match=r"weights\.w2_scale \[2, \d+, 11\] torch\.uint8: 1 byte\(s\) changed, first at element \[0, 0, 0\]",
    ):
        nvfp4.check_padding_invariance(SHAPE, TRTLLM, guard_inputs(PadThenScribble()))


@pytest.mark.parametrize("name", sorted(n for n, s in named_subjects().items() if s.policy("nvfp4_moe")))
def test_shipped_subjects_leave_inputs_unchanged(name: str) -> None:
    if name in ("vllm", "sglang"):
        pytest.importorskip(name)
    policy = guard_inputs(named_subjects()[name].policy("nvfp4_moe"))
    for backend in Nvfp4MoeBackend:
        with contextlib.suppress(UnsupportedConfig):  # a refusal is the properties' business, not the guard's
            policy.align_moe(backend, moe_case(SHAPE, 16).weights, SHAPE.gated)


def test_guard_reports_resizes_and_keeps_protocols() -> None:
    class Resize(BuiltinMxfp4Linear):
        def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor):
            weight.resize_(1, 1)
            return super().prepare_triton_linear(weight, scale)

    guarded = guard_inputs(Resize())
    assert isinstance(guarded, Mxfp4LinearKernelSelection)
    assert guard_inputs(guarded) is guarded
    assert guarded.use_asm_gemm((32, 8)) is True
    w, s = torch.zeros(32, 128, dtype=torch.uint8), torch.full((32, 8), 127, dtype=torch.uint8)
    with pytest.raises(InputModified, match=r"weight was \[32, 128\] torch\.uint8 .* now \[1, 1\]"):
        guarded.prepare_triton_linear(w, s)


def test_guard_compares_bytes_not_values() -> None:
    class NegateZeroBias(BuiltinNvfp4MoeAlignment):
        def align_moe(self, backend, weights, gated):
            weights.w2_bias.neg_()  # 0.0 -> -0.0: equal values, different bytes
            return super().align_moe(backend, dataclasses.replace(weights, w2_bias=None), gated)

    case = moe_case(SHAPE, 16).weights
    weights = dataclasses.replace(case, w2_bias=torch.zeros(2, SHAPE.hidden))
    with pytest.raises(InputModified, match=r"weights\.w2_bias"):
        guard_inputs(NegateZeroBias()).align_moe(TRTLLM, weights, True)


@pytest.mark.long(21)
def test_suite_run_reports_input_modified(tmp_path: Path) -> None:
    """End to end: the external probe subject fails the suite with the guard's message."""
    cmd = [
        "-p", "no:cacheprovider", "-q", "-x", "conformance/test_nvfp4_moe.py",
        "--subject", "tests.probes:ZERO_ROW_THEN_PAD", "-k", "gate_up_layout and trtllm",
        "--results", str(tmp_path / "results"),
    ]  # fmt: skip
    out = batch.run(batch.Run(cmd, env=batch.suite_env()), tmp_path / "run", 600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "InputModified: input modified: ZeroRowThenPad.align_moe" in out.stdout
