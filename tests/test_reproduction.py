"""Self-tests of what a failing property reports: which example it reproduces and its message."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import Phase, example, given, settings

from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.test_nvfp4_moe import check_flashinfer_accepts, check_padding_invariance
from contracts.moe import AlignedMoe
from harness.runner import active, reported_reproduction, run_check
from strategies.moe import moe_shapes, pinned_shape
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment, GatedPad16Alignment

GEMMA_TP4 = pinned_shape("gemma-4-26b-a4b", 4)  # I = 176: both pins fail under the pad-16 policy
GLM_AIR_TP8 = pinned_shape("glm-4.5-air", 8)


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
        run_check(check_flashinfer_accepts, shape, Nvfp4MoeBackend.FLASHINFER_TRTLLM, GatedPad16Alignment())

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
    with pytest.raises(AssertionError, match=r"^padding changed the MoE output \(I 176 -> 192.*\): NaN"):
        check_padding_invariance(GEMMA_TP4, Nvfp4MoeBackend.FLASHINFER_TRTLLM, NanScalePadding())
