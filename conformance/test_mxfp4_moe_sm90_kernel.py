"""Contract ``mxfp4_moe`` on the real SM90 kernel: FlashInfer's W4A16 ``cutlass_fused_moe`` on the policy's experts.

Property: for every drawn MXFP4 MoE layer (``moe_shapes(group=32)`` with SwiGLU or gpt-oss's
SwiGLU-OAI, the activations FlashInfer's ``test_moe_bf16_mxfp4`` runs) in a stacked ``[gate; up]``
or gpt-oss row-interleaved checkpoint, the policy's experts for ``flashinfer-cutlass-sm90``
(rounded to the binding's ``% 128`` rules and reordered to FlashInfer's ``[up; gate]``), zero-padded
by a further 0 or 128 of ``I`` and of ``H``, give a real-kernel output within the FP4/BF16 error
bound of the dequantized fp32 reference; and where the unpadded layer is itself aligned (``I``,
``H`` multiples of 128) the kernel also runs on it and agrees with both. Known-bad subjects that
fail it: ``bad-sm90-unpadded`` (sizes not multiples of 128) and ``bad-assume-interleaved`` (gate/up
pairs scrambled for stacked checkpoints). Pinned: gpt-oss-120b at TP=1 and TP=4 (``H`` = 2880 is
64 mod 128: padded only) and Qwen3-30B-A3B at TP=1 (aligned: padded and unpadded both run).

Runs on an SM90 GPU whose FlashInfer fused-MoE module is already built
(``scripts/build_fused_moe_sm90_fast.py``); skips otherwise, naming what is missing. Every
example's normalized error is fed to ``hypothesis.target`` and the run's worst values are written
to ``<results>/mxfp4_moe_sm90_kernel[-<worker>].json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st

from adapters import flashinfer_sm90_moe as sm90
from adapters.flashinfer_sm90_moe import SM90_ALIGNMENT
from backends import record
from backends.mxfp4_moe import CONTRACT, Mxfp4MoeBackend
from conformance.moe_checks import BF16_UNIT_ROUNDOFF, align_checked, normalized_error
from contracts.moe import MoeAlignment, pad_moe, relayout_moe
from harness.properties import check, record_error, record_event
from harness.runner import RUN_STATE
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import GateUpOrder, moe_magnitude, moe_reference, route
from strategies.catalog import GPT_OSS, MODELS, SWIGLU
from strategies.config import Config
from strategies.moe import MoeShape, moe_shapes, pinned_shape
from strategies.tensors import dequantize_moe, moe_case, real_channels

pytestmark = [pytest.mark.contract(CONTRACT)]

CHECKPOINT_LAYOUTS = (Fc1Layout.GATE_UP, Fc1Layout.GATE_UP_INTERLEAVED)
"""Stacked ``[gate; up]`` (Quark OCP-MX, DeepSeek-V4, MiniMax) and gpt-oss's ``[g0, u0, g1, u1, ...]``."""

METRIC = "error / (2^-8 · magnitude)"
"""The backend record's tolerance this property uses: ``|kernel - reference| / (2^-8 · M)``,
``M`` = :func:`reference.moe.moe_magnitude` (the bound and its argument:
:data:`backends.mxfp4_moe.SM90_TOLERANCE`)."""

OBSERVED: list[dict[str, object]] = []
"""One row per example run in this process (written out at module teardown)."""


@dataclass(frozen=True)
class Sm90KernelCase(Config):
    """A drawn MXFP4 MoE layer, its checkpoint's FC1 layout, and padding past the policy's (0 or 128 each)."""

    shape: MoeShape
    checkpoint: Fc1Layout
    extra_intermediate: int
    extra_hidden: int

    @property
    def aligned(self) -> bool:
        """Whether the unpadded layer already meets the kernel's ``% 128`` rules (then it runs too)."""
        return self.shape.intermediate % SM90_ALIGNMENT == 0 and self.shape.hidden % SM90_ALIGNMENT == 0

    def describe(self) -> str:
        return (
            f"{self.shape.describe()}; checkpoint {self.checkpoint.value}; "
            f"+{self.extra_intermediate} I, +{self.extra_hidden} H past the policy's padding"
        )


@st.composite
def kernel_cases(draw: st.DrawFn) -> Sm90KernelCase:
    shape = draw(moe_shapes(group=MXFP4_BLOCK, activations=(SWIGLU, GPT_OSS)))
    extra = st.sampled_from((0, SM90_ALIGNMENT))
    return Sm90KernelCase(shape, draw(st.sampled_from(CHECKPOINT_LAYOUTS)), draw(extra), draw(extra))


def _pin(model: str, tp: int, extra_intermediate: int, extra_hidden: int) -> Sm90KernelCase:
    shape = pinned_shape(model, tp, group=MXFP4_BLOCK)
    return Sm90KernelCase(shape, MODELS[model].checkpoint.layout, extra_intermediate, extra_hidden)


REGRESSIONS = (
    _pin("gpt-oss-120b", 1, 0, 0),  # H = 2880 -> 320 here: 64 mod 128, padded only
    _pin("gpt-oss-120b", 4, 0, 128),  # whole-block shards
    _pin("qwen3-30b-a3b", 1, 128, 0),  # aligned: padded and unpadded both run
)


@check(
    CONTRACT,
    Sm90KernelCase,
    strategy=kernel_cases(),
    pins=REGRESSIONS,
    backends=[Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90],
    kernel=True,
    fixtures=["kernel_module"],
)
def check_padded_kernel(case: Sm90KernelCase, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """The kernel on the policy's (further padded) experts matches the fp32 reference, and the unpadded
    kernel output where that runs. ``moe_case`` builds the layer in FlashInfer's ``[up; gate]`` order;
    the policy gets it in the checkpoint's layout."""
    shape = case.shape
    layer = moe_case(shape, MXFP4_BLOCK)
    checkpoint = relayout_moe(layer.weights, case.checkpoint)
    aligned = align_checked(policy, backend, checkpoint, shape.gated, case.describe())
    ip, hp = aligned.intermediate_size + case.extra_intermediate, aligned.hidden_size + case.extra_hidden
    padded = pad_moe(aligned.weights, shape.gated, ip, hp).weights
    x = layer.x.to(torch.bfloat16).float()
    routing, ids = route(layer.logits, shape.top_k)
    real = real_channels(layer.weights, shape.gated, shape.real_intermediate)
    w13, w2 = dequantize_moe(real, layer.w13_decode, layer.w2_decode)
    want = moe_reference(x, w13, w2, routing, ids, shape.activation, GateUpOrder.UP_GATE)
    scale = BF16_UNIT_ROUNDOFF * moe_magnitude(x, w13, w2, routing, ids, shape.activation, GateUpOrder.UP_GATE)

    run, tolerance = record(backend).kernel, record(backend).tolerances[METRIC]
    got = run(padded, x, routing, ids, shape.activation)
    row: dict[str, object] = {"config": case.to_dict(), "padded_error": normalized_error(got, want, scale)}
    if case.aligned:
        unpadded = run(layer.weights, x, routing, ids, shape.activation)
        row["unpadded_error"] = normalized_error(unpadded, want, scale)
        row["padded_vs_unpadded"] = normalized_error(got, unpadded, scale)
        row["bit_identical"] = torch.equal(got, unpadded)
    OBSERVED.append(row)
    steer(row, tolerance)
    assert row["padded_error"] <= tolerance, (
        f"kernel on padded experts (I {shape.intermediate} -> {ip}, H {shape.hidden} -> {hp}) is "
        f"{row['padded_error']:.3g} x 2^-8 x magnitude from the reference (allowed {tolerance})"
    )
    if case.aligned:
        assert row["unpadded_error"] <= tolerance, (
            f"kernel on the unpadded aligned experts is {row['unpadded_error']:.3g} x 2^-8 x magnitude "
            f"from the reference (allowed {tolerance})"
        )
        assert row["padded_vs_unpadded"] <= 2 * tolerance, (
            f"padding I {shape.intermediate} -> {ip}, H {shape.hidden} -> {hp} moved the kernel output by "
            f"{row['padded_vs_unpadded']:.3g} x 2^-8 x magnitude (allowed {2 * tolerance})"
        )


@pytest.fixture(scope="module")
def kernel_module(request: pytest.FixtureRequest):
    """Skip unless the prebuilt module loads; afterwards write the run's worst errors to the results folder."""
    reason = sm90.unavailable_reason()
    if reason:
        pytest.skip(reason)
    OBSERVED.clear()
    yield sm90.prebuilt_module()[0]
    if not OBSERVED:
        return

    def worst(key: str) -> dict[str, object] | None:
        rows = [r for r in OBSERVED if key in r]
        return max(rows, key=lambda r: r[key]) if rows else None

    summary = {
        "module": sm90.prebuilt_module()[0],
        "examples": len(OBSERVED),
        "aligned_examples": sum("unpadded_error" in r for r in OBSERVED),
        "bit_identical_pairs": sum(bool(r.get("bit_identical")) for r in OBSERVED),
        "tolerance": record(Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90).tolerances[METRIC],
        **{f"worst_{k}": worst(k) for k in ("padded_error", "unpadded_error", "padded_vs_unpadded")},
    }
    results = request.config.stash[RUN_STATE].results
    results.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    (results / f"mxfp4_moe_sm90_kernel{'-' + worker if worker else ''}.json").write_text(json.dumps(summary, indent=2))


def steer(row: dict[str, object], tolerance: float) -> None:
    """Point Hypothesis at larger errors (``target``) and count the kinds of example run (``event``)."""
    record_error(float(row["padded_error"]) / tolerance, label="padded kernel error / (2^-8 * magnitude) / tolerance")
    if "padded_vs_unpadded" in row:
        record_error(
            float(row["padded_vs_unpadded"]) / (2 * tolerance), label="padded vs unpadded / (2^-8 * magnitude) / bound"
        )
        record_event(
            "aligned: padded and unpadded bit-identical" if row["bit_identical"] else "aligned: outputs differ"
        )
    else:
        record_event("unaligned: padded only")
