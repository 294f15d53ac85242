"""The preflight catches what would break a kernel property on its hardware, checked on patched copies of the
libraries' own functions (never a mock of the preflight): a renamed keyword, a refused dtype, a missing JIT
source. Each test plans one property as ``python -m harness.preflight`` does, on the installed libraries."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from harness import preflight as pf

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None, reason="needs FlashInfer installed (its functions are patched)"
    ),  # found, not imported: importing FlashInfer at collection would cost every xdist worker's start-up ~1.5 s
    pytest.mark.together,  # its tests reuse FlashInfer's import and the preflight's plan of the first one
]


@functools.cache
def _properties() -> tuple[pf.KernelProperty, ...]:
    return tuple(pf.kernel_properties())


def _plan(test: str, backend: str, target: str) -> pf.PropertyPlan:
    """Plan the kernel property ``test`` on ``backend`` for ``target``."""
    (prop,) = [p for p in _properties() if p.test == test and p.backend is not None and p.backend.value == backend]
    assert prop in pf.for_target(list(_properties()), target)
    return pf.plan(prop, target)


def _verdict(plan: pf.PropertyPlan, call: str) -> pf.CallCheck:
    return next(c for c in plan.checks if c.call == call)


TRTLLM = ("test_nvfp4_moe_kernels.py::test_trtllm_kernel_matches_reference", "flashinfer-trtllm", "sm100")
INTERLEAVE = ("test_nvfp4_moe.py::test_scale_interleave_kernel", "flashinfer-trtllm", "sm100")


def test_installed_flashinfer_passes() -> None:
    """Unpatched, the NVFP4 trtllm-gen call binds and FlashInfer's own code runs to its JIT module."""
    verdict = _verdict(_plan(*TRTLLM), "trtllm_fp4_block_scale_moe")
    assert verdict.status in (pf.Status.READY, pf.Status.FETCH), verdict.detail


def test_renamed_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    """A FlashInfer whose ``trtllm_fp4_block_scale_moe`` renames ``hidden_states_scale_layout`` fails, showing
    the call the adapter makes and the signature the library has."""
    import flashinfer.fused_moe as fused_moe

    original = fused_moe.trtllm_fp4_block_scale_moe
    sig = inspect.signature(original)
    renamed = sig.replace(
        parameters=[
            p.replace(name="hidden_states_sf_layout") if p.name == "hidden_states_scale_layout" else p
            for p in sig.parameters.values()
        ]
    )

    @functools.wraps(original)
    def patched(*args, **kwargs):
        bound = renamed.bind(*args, **kwargs).arguments
        if "hidden_states_sf_layout" in bound:
            bound["hidden_states_scale_layout"] = bound.pop("hidden_states_sf_layout")
        return original(**bound)

    patched.__signature__ = renamed  # type: ignore[attr-defined]
    monkeypatch.setattr(fused_moe, "trtllm_fp4_block_scale_moe", patched)
    plan = _plan(*TRTLLM)
    verdict = _verdict(plan, "trtllm_fp4_block_scale_moe")
    assert verdict.status is pf.Status.FAIL
    assert "signature mismatch" in verdict.detail and "hidden_states_scale_layout=" in verdict.detail
    assert "hidden_states_sf_layout" in verdict.detail
    assert plan in pf.fatal([plan], require_libraries=False, offline=False)


def test_wrong_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """A FlashInfer whose ``block_scale_interleave`` accepts bfloat16 scales only refuses the suite's uint8 ones."""
    import flashinfer.quantization.fp4_quantization as quant

    original = quant.block_scale_interleave

    @functools.wraps(original)
    def patched(unswizzled_sf: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        assert unswizzled_sf.dtype == torch.bfloat16, f"Input dtype must be bfloat16, got {unswizzled_sf.dtype}"
        return original(unswizzled_sf, out=out)

    monkeypatch.setattr(quant, "block_scale_interleave", patched)
    verdict = _verdict(_plan(*INTERLEAVE), "block_scale_interleave")
    assert verdict.status is pf.Status.FAIL
    assert "must be bfloat16, got torch.uint8" in verdict.detail


def test_missing_jit_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JIT spec naming a source file that is not installed fails (the module would not compile)."""
    import flashinfer.quantization.fp4_quantization as quant

    original = quant.gen_fp4_quantization_sm100_module

    def losing_a_source():  # the spec as generated, one source file more
        spec = original()
        return dataclasses.replace(spec, sources=[*spec.sources, Path(spec.sources[0]).with_name(LOST)])

    monkeypatch.setattr(quant, "gen_fp4_quantization_sm100_module", losing_a_source)
    verdict = _verdict(_plan(*INTERLEAVE), "block_scale_interleave")
    assert verdict.status is pf.Status.FAIL
    assert "sources missing" in verdict.detail and LOST in verdict.detail


LOST = "fp4_quantization_lost.cu"


@pytest.mark.long(6.6)  # on an H100 host with AITER installed (0.6 s on the CPU machine)
def test_aiter_gemm_a4w4_follows_the_installed_api() -> None:
    """The gfx950 ASM GEMM is called in the API the installed AITER has, and the table says which."""
    if importlib.util.find_spec("aiter") is None:  # its files only: importing it needs ROCm
        pytest.skip("amd-aiter is not installed")
    from adapters.aiter import gemm_a4w4_api

    installed = gemm_a4w4_api(pf.calls.SourceOnly("aiter.ops.gemm_op_a4w4", "gemm_a4w4", ""))
    plan = _plan("test_mxfp4_linear.py::test_aiter_gemm_kernel", "aiter-asm", "gfx950")
    verdict = _verdict(plan, f"gemm_a4w4 ({installed} API)")
    assert verdict.status is pf.Status.NEEDS_HARDWARE, verdict.detail
    assert "binds to aiter.ops.gemm_op_a4w4.gemm_a4w4" in verdict.detail
