"""Self-tests of the ``sglang`` subject's adapters (skipped where SGLang is not installed).

* Each adapter returns what SGLang's code decides, with only the documented pieces substituted:
  the NVFP4 MoE path (``create_weights`` rounding, ``FusedMoE.weight_loader`` placement, both
  post-load branches).
* A moved or renamed SGLang symbol fails loudly, naming it (:class:`subjects.sglang.SglangSourceMismatch`).
* The known-failure ledger names only contracts, backends and checks that exist.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from conformance import test_nvfp4_moe
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects import sglang as ss
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment, MoeBackend
from subjects.registry import backends, contracts, resolve

pytestmark = pytest.mark.sglang

NVFP4 = ss.SglangNvfp4MoeAlignment()
CHECK_MODULES = {"nvfp4_moe": test_nvfp4_moe}


def test_subject_policies_implement_their_contracts() -> None:
    subject = resolve("sglang")
    assert set(subject.policies) <= set(contracts())
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_known_failures_name_real_checks_and_backends() -> None:
    for known in ss.SGLANG_KNOWN_FAILURES:
        assert known.link.startswith("https://github.com/")
        assert known.backend is None or known.backend in {b.value for b in backends(known.contract)}
        assert known.check is None or hasattr(CHECK_MODULES[known.contract], known.check), known.check


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    ss.sglang_modules()  # the real import first, so only the symbol check runs again
    module = importlib.import_module("sglang.srt.layers.moe.moe_runner.flashinfer_trtllm")
    monkeypatch.delattr(module, "align_fp4_moe_weights_for_flashinfer_trtllm")
    ss.sglang_modules.cache_clear()
    try:
        with pytest.raises(
            ss.SglangSourceMismatch, match=r"flashinfer_trtllm\.align_fp4_moe_weights_for_flashinfer_trtllm"
        ):
            ss.sglang_modules()
    finally:
        ss.sglang_modules.cache_clear()


def _aligned(model: str, tp: int, backend: MoeBackend):
    shape = pinned_shape(model, tp)
    case = moe_case(shape, 16)
    return shape, case, NVFP4.align_moe(backend, case.weights, shape.gated)


@pytest.mark.parametrize(("model", "tp", "ip"), [("gemma-4-26b-a4b", 4, 192), ("gemma-4-26b-a4b", 2, 384)])
def test_trtllm_create_weights_rounds_gated_to_64(model: str, tp: int, ip: int) -> None:
    """SGLang's ``create_weights`` rounds the gated TRT-LLM intermediate to 64 and its loader places
    each half at ``[h·Ip, h·Ip + I)``: byte for byte the built-in policy where H needs no padding."""
    shape, case, aligned = _aligned(model, tp, MoeBackend.FLASHINFER_TRTLLM)
    assert aligned.intermediate_size == ip
    builtin = BuiltinNvfp4MoeAlignment().align_moe(MoeBackend.FLASHINFER_TRTLLM, case.weights, shape.gated)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name).view(torch.uint8), getattr(builtin.weights, name)), name


def test_trtllm_non_gated_rounds_to_128_and_keeps_hidden() -> None:
    """Non-gated (ReLU2) rounds to 128; the hidden size stays unpadded (static activation scales)."""
    shape, _, aligned = _aligned("nemotron-3-nano-30b-a3b", 2, MoeBackend.FLASHINFER_TRTLLM)
    assert not shape.gated
    assert aligned.intermediate_size == 512 and aligned.hidden_size == shape.hidden


def test_cutlass_gated_padding_is_refused_in_0_5_23() -> None:
    """SGLang #30887 (open fix PR #30888): fails once gated CUTLASS padding lands; then update the ledger."""
    with pytest.raises(AssertionError, match="padding is also implemented for gated activations"):
        _aligned("gemma-4-26b-a4b", 4, MoeBackend.FLASHINFER_CUTLASS)


def test_cutlass_aligned_layer_runs_the_real_swizzle() -> None:
    """Where no padding is needed the CUTLASS branch runs whole; the swizzled scales read back exactly."""
    shape, case, aligned = _aligned("qwen3-30b-a3b", 4, MoeBackend.FLASHINFER_CUTLASS)
    assert (2 * shape.intermediate) % 128 == 0
    assert aligned.intermediate_size == shape.intermediate
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name).view(torch.uint8), getattr(case.weights, name)), name
