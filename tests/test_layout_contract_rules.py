"""The MoE layout contract names each tensor's dtype and states what a pad may hold, from the formats.

Probes: a policy whose tensors have the right shapes but float32 / int32 dtypes (passed before);
FlashInfer 0.7.4's own ``pad_trtllm_moe_weights`` and fills with other finite scale codes or
``-0`` weight codes (failed before, "holds non-zero values"); NaN scale fills (fail, before and
after).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backends import record
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_mxfp4_moe as mxfp4
from conformance import test_nvfp4_moe as nvfp4
from conformance.moe_checks import pad_rule
from reference.errors import ShapeContractError
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK, fp4_bytes_zero, scale_bytes_finite
from strategies.moe import pinned_shape
from strategies.mxfp4_moe import pinned_config
from strategies.tensors import moe_case
from subjects.mxfp4_moe import BuiltinMxfp4MoeAlignment
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from tests.probes import FlashInferPadHelper, PadFill, WidenedDtypes

pytestmark = pytest.mark.together  # its tests reuse the pinned layers and FlashInfer's import of the first ones

TRTLLM = Nvfp4MoeBackend.FLASHINFER_TRTLLM
NVFP4_SHAPES = [pinned_shape("gemma-4-26b-a4b", 4), pinned_shape("nemotron-3-nano-30b-a3b", 2)]
MXFP4_CONFIG = pinned_config("gpt-oss-120b", 4, rank=-1)  # row-interleaved, biases, short last rank
E4M3_ONE, UE8M0_ONE = 0x38, 127


# --- the formats' predicates -----------------------------------------------------------------------


def test_fp4_zero_bytes_are_both_signs_of_zero() -> None:
    b = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    assert b[fp4_bytes_zero(b)].tolist() == [0x00, 0x08, 0x80, 0x88]


def test_finite_scale_codes() -> None:
    b = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    assert b[~scale_bytes_finite(b, NVFP4_BLOCK)].tolist() == [0x7F, 0xFF]  # E4M3 (fn): NaN only, no Inf
    assert b[~scale_bytes_finite(b, MXFP4_BLOCK)].tolist() == [0xFF]  # UE8M0: NaN (OCP) / +Inf (FlashInfer)


# --- dtypes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_layout_contract_names_dtypes(dtype: torch.dtype) -> None:
    with pytest.raises(AssertionError, match=rf"w13 has dtype {dtype}, contract says torch.uint8"):
        nvfp4.check_gate_up_layout(NVFP4_SHAPES[0], TRTLLM, WidenedDtypes(dtype))


def test_mxfp4_pairing_names_dtypes() -> None:
    class Float32(BuiltinMxfp4MoeAlignment):
        def align_moe(self, backend, weights, gated):
            aligned = super().align_moe(backend, weights, gated)
            w = aligned.weights
            widened = {n: getattr(w, n).float() for n in ("w13", "w13_scale", "w2", "w2_scale")}
            return dataclasses.replace(aligned, weights=dataclasses.replace(w, **widened))

    with pytest.raises(AssertionError, match=r"dtype torch\.float32, contract says torch\.uint8"):
        mxfp4.check_gate_up_layout(MXFP4_CONFIG, Mxfp4MoeBackend.FLASHINFER_TRTLLM, Float32())


# --- pad values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", NVFP4_SHAPES, ids=lambda s: s.describe()[:40])
def test_flashinfer_pad_helper_passes(shape) -> None:
    """FlashInfer 0.7.4's ``pad_trtllm_moe_weights`` pads NVFP4 scales with E4M3 1.0 (0x38)."""
    aligned = FlashInferPadHelper().align_moe(TRTLLM, moe_case(shape, NVFP4_BLOCK).weights, shape.gated)
    assert (aligned.weights.w2_scale == E4M3_ONE).any(), "probe: FlashInfer's helper no longer fills scales with 1.0"
    nvfp4.check_gate_up_layout(shape, TRTLLM, FlashInferPadHelper())
    nvfp4.check_padding_invariance(shape, TRTLLM, FlashInferPadHelper())


@pytest.mark.parametrize("fill", [E4M3_ONE, 0x7E, 0x80, 0xFE], ids=hex)
@pytest.mark.parametrize("negative_zero", [False, True], ids=["+0-codes", "-0-codes"])
def test_finite_nvfp4_scale_fills_pass(fill: int, negative_zero: bool) -> None:
    policy = PadFill(BuiltinNvfp4MoeAlignment(), fill, negative_zero)
    for check in (nvfp4.check_gate_up_layout, nvfp4.check_padding_invariance, nvfp4.check_minimal_and_idempotent):
        check(NVFP4_SHAPES[0], TRTLLM, policy)


@pytest.mark.parametrize("fill", [0x7F, 0xFF], ids=hex)
def test_nan_nvfp4_scale_fills_fail(fill: int) -> None:
    policy = PadFill(BuiltinNvfp4MoeAlignment(), fill)
    with pytest.raises(AssertionError, match="not a finite E4M3 scale code"):
        nvfp4.check_gate_up_layout(NVFP4_SHAPES[0], TRTLLM, policy)
    with pytest.raises((AssertionError, ShapeContractError)):  # NaN · 0 = NaN reaches the re-quantized intermediate
        nvfp4.check_padding_invariance(NVFP4_SHAPES[0], TRTLLM, policy)


PADDING_MXFP4_BACKENDS = [
    b for b in Mxfp4MoeBackend if max(record(b).intermediate_multiple, record(b).hidden_multiple) > MXFP4_BLOCK
]
"""Backends whose built-in policy pads (b12x plans for the exact sizes: no pad byte to fill)."""


@pytest.mark.parametrize("backend", PADDING_MXFP4_BACKENDS, ids=lambda b: b.value)
def test_mxfp4_flashinfer_fill_passes_and_nan_fails(backend: Mxfp4MoeBackend) -> None:
    ok = PadFill(BuiltinMxfp4MoeAlignment(), UE8M0_ONE, negative_zero=True)  # FlashInfer's fill, -0 codes
    mxfp4.check_gate_up_layout(MXFP4_CONFIG, backend, ok)
    mxfp4.check_padding_invariance(MXFP4_CONFIG, backend, ok)
    if backend is Mxfp4MoeBackend.FLASHINFER_TRTLLM:
        mxfp4.check_trtllm_round_trip(MXFP4_CONFIG, backend, ok)
        mxfp4.check_trtllm_matches_flashinfer_padding(MXFP4_CONFIG, backend, ok)
    with pytest.raises(AssertionError, match="not a finite UE8M0 scale code"):
        mxfp4.check_gate_up_layout(MXFP4_CONFIG, backend, PadFill(BuiltinMxfp4MoeAlignment(), 0xFF))


def test_pad_rule_for_biases_and_codes() -> None:
    assert pad_rule("w13_bias", MXFP4_BLOCK).allowed(torch.tensor([0.0, -0.0, 1e-30])).tolist() == [True, True, False]
    assert pad_rule("w2", NVFP4_BLOCK).allowed(torch.tensor([0x00, 0x88, 0x01], dtype=torch.uint8)).tolist() == [
        True,
        True,
        False,
    ]
