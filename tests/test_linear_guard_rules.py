"""The MXFP4 linear guard sees the real layer, and routing around a documented kernel defect is allowed.

Probes: a weight processing that skips its guard for layers with ``N >= 4096`` (it passed before,
because layers whose packed weight exceeded 8 MiB were processed at a reduced ``N <= 128``); and a
guard that also falls back for a row count a documented defect record covers (it failed before as
"needless slow path", since no record could say why), while the same guard without a record, or a
guard keeping a shape a required record covers on ASM, still fails.
"""

from __future__ import annotations

import dataclasses

import pytest

from backends.kernel_defects import AITER_LINEAR_DEFECTS, KernelDefect
from conformance import linear_oracle as oracle
from conformance import test_mxfp4_linear as linear
from strategies.linear import LinearLayer, Parallel, ScaleShapeCase, linear_shape
from subjects.mxfp4_linear import BuiltinMxfp4Linear, LayoutOnlyGuardLinear
from tests.probes import AvoidsRows, LargeLayerShortcut

HYPOTHETICAL = KernelDefect(
    "aiter-asm",
    "probe record: a defect report covering 64-row scales",
    "https://example.invalid/probe",
    lambda shape: len(shape) == 2 and shape[0] == 64,
    required=False,
)


BIG = linear_shape(
    LinearLayer("adversarial", "linear", 32 * 300, 4096, Parallel.REPLICATED), 1, Parallel.REPLICATED, 3, 0
)
"""Scale (4096, 300): 19.7 MB of packed weight, K % 256 != 0 (the swizzle needs cols % 8)."""


def test_processing_sees_the_real_layer() -> None:
    assert (BIG.n, BIG.k) != (BIG.real_n, BIG.real_k)  # the reduced stand-in (N 128) hides the shortcut
    linear.check_preparation_never_raises(BIG, None, BuiltinMxfp4Linear())
    with pytest.raises(AssertionError, match=r"weight processing raised for weight \[4096, 4800\]"):
        linear.check_preparation_never_raises(BIG, None, LargeLayerShortcut())


def test_guard_with_a_size_threshold_sees_the_real_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard keeping N < 256 on Triton (with a defect record saying why) answers ASM for the real
    N = 4096; processing a reduced stand-in (N 128) took Triton and failed the layer as a needless fallback."""

    class SmallRowsOnTriton(BuiltinMxfp4Linear):
        def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
            return super().use_asm_gemm(scale_shape) and scale_shape[0] >= 256

    small_rows = dataclasses.replace(HYPOTHETICAL, applies=lambda shape: len(shape) == 2 and shape[0] < 256)
    monkeypatch.setattr(oracle, "AITER_LINEAR_DEFECTS", (*AITER_LINEAR_DEFECTS, small_rows))
    big_aligned = linear_shape(
        LinearLayer("adversarial", "linear", 32 * 304, 4096, Parallel.REPLICATED), 1, Parallel.REPLICATED, 3, 0
    )
    assert big_aligned.n < 256 <= big_aligned.real_n
    linear.check_asm_taken_where_supported(big_aligned, None, SmallRowsOnTriton())
    linear.check_preparation_never_raises(big_aligned, None, SmallRowsOnTriton())
    linear.check_asm_guard_truth_table(ScaleShapeCase((128, 160), "probe"), None, SmallRowsOnTriton())


def test_protocol_says_what_a_guard_may_read() -> None:
    import contracts.mxfp4_linear as module

    assert "What a guard may read" in (module.__doc__ or "")


# --- documented defects --------------------------------------------------------------------------------


def test_fallback_without_a_documented_reason_fails() -> None:
    with pytest.raises(AssertionError, match="no documented ASM defect covers it"):
        linear.check_asm_guard_truth_table(ScaleShapeCase((64, 160), "probe"), None, AvoidsRows(64))


def test_routing_around_a_documented_defect_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "AITER_LINEAR_DEFECTS", (*AITER_LINEAR_DEFECTS, HYPOTHETICAL))
    case = ScaleShapeCase((64, 160), "probe")
    linear.check_asm_guard_truth_table(case, None, AvoidsRows(64))  # avoiding it is allowed ...
    linear.check_asm_guard_truth_table(case, None, BuiltinMxfp4Linear())  # ... not required
    layer = linear_shape(
        LinearLayer("adversarial", "linear", 5120, 64, Parallel.REPLICATED), 1, Parallel.REPLICATED, 3, 0
    )
    linear.check_asm_taken_where_supported(layer, None, AvoidsRows(64))
    with pytest.raises(AssertionError, match="no documented ASM defect covers it"):  # other shapes still need ASM
        linear.check_asm_guard_truth_table(ScaleShapeCase((128, 160), "probe"), None, AvoidsRows(128))


def test_required_defect_fails_with_its_report(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AssertionError, match=r"documented defect covers.*vllm-project/vllm/pull/58139"):
        linear.check_asm_guard_truth_table(ScaleShapeCase((96, 160), "probe"), None, LayoutOnlyGuardLinear())
    linear.check_asm_guard_truth_table(ScaleShapeCase((96, 160), "probe"), None, BuiltinMxfp4Linear())
    required = dataclasses.replace(HYPOTHETICAL, required=True)
    monkeypatch.setattr(oracle, "AITER_LINEAR_DEFECTS", (*AITER_LINEAR_DEFECTS, required))
    with pytest.raises(AssertionError, match=r"example\.invalid/probe"):
        linear.check_asm_guard_truth_table(ScaleShapeCase((64, 160), "probe"), None, BuiltinMxfp4Linear())


def test_every_defect_record_cites_its_report() -> None:
    for defect in AITER_LINEAR_DEFECTS:
        assert defect.link.startswith("https://github.com/") and defect.reason, defect
