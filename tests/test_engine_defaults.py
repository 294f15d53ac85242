"""The engines' default FP4 MoE backends (``subjects/<engine>/defaults.py``), pinned where upstream states them.

Each engine's tests skip where the engine is not installed (its marker). The pinned facts, each checked against
the installed engine's source: SGLang PR #32668 made ``flashinfer_mxfp4`` gpt-oss's default on SM120
(``model_overrides/gpt_oss.py``), SGLang PR #35919 made it DeepSeek-V4's FP4-expert default on SM90, SM100 and
SM120 (``model_overrides/deepseek_v4.py``); vLLM 0.33.0's ``_get_priority_backends_for_gpt_oss`` puts
FlashInfer TRT-LLM first (SM100 only), then AITER, then ``TRITON`` (SM90), and moves ``TRITON`` after Marlin on
SM12x.
"""

from __future__ import annotations

import importlib
from unittest import mock

import pytest

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from strategies.catalog import MODELS
from subjects.engine_tools import FP4_CHECKPOINTS, Hardware
from subjects.sglang import defaults as sglang_defaults
from subjects.sglang.bridge import sglang_modules
from subjects.vllm import defaults as vllm_defaults


def test_every_fp4_checkpoint_is_a_catalogued_model() -> None:
    assert set(FP4_CHECKPOINTS) <= set(MODELS)
    assert set(sglang_defaults.HF_CONFIGS) == set(FP4_CHECKPOINTS)


def test_a_model_without_an_fp4_checkpoint_has_no_default() -> None:
    for default_backend in (vllm_defaults.default_backend, sglang_defaults.default_backend):
        choice = default_backend("llama-4-scout", Hardware.SM100, 1)
        assert choice.backend is None and "no catalogued FP4 checkpoint" in choice.reason


# --- vLLM 0.33.0 ----------------------------------------------------------------------------------------

VLLM_PINNED = [
    ("gpt-oss-120b", Hardware.SM90, Mxfp4MoeBackend.TRITON_SM90, "TRITON"),
    ("gpt-oss-120b", Hardware.SM100, Mxfp4MoeBackend.FLASHINFER_TRTLLM, "FLASHINFER_TRTLLM_MXFP4_BF16"),
    ("gpt-oss-120b", Hardware.SM120, Mxfp4MoeBackend.MARLIN, "MARLIN"),
    ("deepseek-v4", Hardware.SM100, Mxfp4MoeBackend.FLASHINFER_TRTLLM, "FLASHINFER_TRTLLM_MXFP4_MXFP8"),
    ("deepseek-v4", Hardware.SM90, Mxfp4MoeBackend.MARLIN, "MARLIN"),
    ("nemotron-3-nano-30b-a3b", Hardware.SM100, Nvfp4MoeBackend.FLASHINFER_TRTLLM, "FLASHINFER_TRTLLM"),
]


@pytest.mark.vllm
@pytest.mark.parametrize(("model", "hardware", "member", "engine"), VLLM_PINNED, ids=lambda p: getattr(p, "value", p))
def test_vllm_default(model: str, hardware: Hardware, member: object, engine: str) -> None:
    choice = vllm_defaults.default_backend(model, hardware, 4)
    assert choice.backend is member, choice.reason
    assert f"vLLM selects {engine} " in choice.reason
    assert any("select_" in c and "0.33.0" in c for c in choice.consulted)


@pytest.mark.vllm
def test_vllm_default_is_read_from_its_oracle() -> None:
    """Known-bad: an oracle whose gpt-oss priority list is Marlin alone gives Marlin on SM90."""
    from subjects.vllm.bridge import vllm_modules

    oracle = vllm_modules().mxfp4_oracle
    with mock.patch.object(oracle, "_get_priority_backends_for_gpt_oss", lambda: [oracle.Mxfp4MoeBackend.MARLIN]):
        choice = vllm_defaults.default_backend("gpt-oss-120b", Hardware.SM90, 4)
    assert choice.backend is Mxfp4MoeBackend.MARLIN


@pytest.mark.vllm
def test_vllm_rocm_and_quark_are_undetermined() -> None:
    rocm = vllm_defaults.default_backend("gpt-oss-120b", Hardware.GFX950, 4)
    assert rocm.backend is None and "ROCm" in rocm.reason
    quark = vllm_defaults.default_backend("qwen3.8-flash-next", Hardware.SM100, 4)
    assert quark.backend is None and "Quark" in quark.reason


# --- SGLang 0.5.23 --------------------------------------------------------------------------------------

SGLANG_PINNED = [
    ("gpt-oss-120b", Hardware.SM100, Mxfp4MoeBackend.FLASHINFER_TRTLLM),
    ("deepseek-v4", Hardware.SM90, Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90),  # SGLang PR #35919
    ("deepseek-v4", Hardware.SM100, Mxfp4MoeBackend.FLASHINFER_TRTLLM),
    ("gemma-4-26b-a4b", Hardware.SM100, Nvfp4MoeBackend.FLASHINFER_TRTLLM),
    ("nemotron-3-nano-30b-a3b", Hardware.SM120, Nvfp4MoeBackend.FLASHINFER_CUTLASS),
]


@pytest.mark.sglang
@pytest.mark.parametrize(("model", "hardware", "member"), SGLANG_PINNED, ids=lambda p: getattr(p, "value", p))
def test_sglang_default(model: str, hardware: Hardware, member: object) -> None:
    choice = sglang_defaults.default_backend(model, hardware, 4)
    assert choice.backend is member, choice.reason


@pytest.mark.sglang
@pytest.mark.parametrize("model", ["gpt-oss-120b", "deepseek-v4"])
def test_sglang_sm120_default_is_flashinfer_mxfp4_without_a_record(model: str) -> None:
    """SGLang PR #32668 (gpt-oss) and PR #35919 (DeepSeek-V4): ``flashinfer_mxfp4`` on SM120, FlashInfer's CUTLASS
    MXFP8 x MXFP4 kernel, which the suite has no record for: the cell says so."""
    assert sglang_defaults.runner_overrides(model, Hardware.SM120, 4, 1)["moe_runner_backend"] == "flashinfer_mxfp4"
    choice = sglang_defaults.default_backend(model, Hardware.SM120, 4)
    assert choice.backend is None and "SM120" in choice.reason and "MXFP8" in choice.reason


@pytest.mark.sglang
def test_sglang_gpt_oss_on_sm90_hangs_on_triton_kernels() -> None:
    """gpt-oss on SM90 takes ``triton_kernel`` only where the optional triton_kernels package is installed: the
    cell is undetermined and gives both answers."""
    choice = sglang_defaults.default_backend("gpt-oss-120b", Hardware.SM90, 4)
    assert choice.backend is None
    assert "is_triton_kernels_available() True: triton-kernels-sm90" in choice.reason
    assert "is_triton_kernels_available() False: " in choice.reason


@pytest.mark.sglang
def test_sglang_nvfp4_on_rocm_is_refused_by_the_method() -> None:
    choice = sglang_defaults.default_backend("nemotron-3-nano-30b-a3b", Hardware.GFX950, 4)
    assert choice.backend is None and "ModelOptNvFp4FusedMoEMethod refuses" in choice.reason


@pytest.mark.sglang
def test_sglang_default_is_read_from_its_overrides() -> None:
    """Known-bad: without the gpt-oss override declarations, SGLang leaves the runner at ``auto``."""
    sglang_modules()
    model_override_base = importlib.import_module("sglang.srt.arg_groups.model_override_base")
    with mock.patch.dict(model_override_base._MODEL_OVERRIDE_FNS, {"GptOssForCausalLM": []}):
        choice = sglang_defaults.default_backend("gpt-oss-120b", Hardware.SM100, 4)
    assert choice.backend is None and "auto" in choice.reason
