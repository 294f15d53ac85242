"""Contract ``mxfp4_moe`` on the real Hopper kernel: triton_kernels' ``matmul_ogs`` MoE on the policy's experts.

Property: for every drawn gpt-oss-style MXFP4 MoE layer (``moe_shapes(group=32)`` with SwiGLU-OAI, the
activation triton_kernels fuses; expert biases on both GEMMs) in gpt-oss's row-interleaved checkpoint form,
the policy's experts for ``triton-kernels-sm90``, zero-padded by a further 0 or 128 of ``I`` and of ``H``,
run through the whole MoE as vLLM 0.33.0 composes it (:func:`adapters.matmul_ogs.moe`: routing, gathered
FC1 with the fused SwiGLU, scattered FC2 weighted by the routing) and give an output within
:data:`backends.mxfp4_moe.TRITON_SM90_TOLERANCE` of the dequantized fp32 reference of the unpadded layer;
and the further padding leaves the output bit-identical (``split_k = 1``: each output element is one
fp32 sum in a fixed order, and padding only appends exact zeros to it).

Known-bad subjects that fail it: ``bad-triton-odd-groups`` (I rounded to 32: an odd number of 32-groups
along FC2's K is silently wrong on Hopper) and ``bad-triton-hopper-scale-k`` (H rounded to 32).
Draws whose GEMMs have ``N <= 128`` output columns are rejected: the kernel refuses them at compile
time (:data:`adapters.triton_kernels.REFUSED_OUTPUT_WIDTH`), a loud refusal no padding rule avoids.

Runs on an SM90 GPU with triton_kernels (its own package or vLLM's vendored copy); skips otherwise. The
run's example count, largest error and further-padding pairs are written to
``<results>/mxfp4_moe_triton_kernel[-<worker>].json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import reject
from hypothesis import strategies as st

from adapters import triton_kernels as tk
from backends import record
from backends.mxfp4_moe import CONTRACT, TRITON_SM90_METRIC, Mxfp4MoeBackend
from conformance.moe_checks import BF16_UNIT_ROUNDOFF, align_checked, normalized_error
from contracts.moe import MoeAlignment, pad_moe, relayout_moe
from harness.properties import check, record_error, record_event
from harness.runner import RUN_STATE
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import GateUpOrder, moe_fused_magnitude, moe_reference, route
from reference.padding import pad_dim
from strategies.catalog import GPT_OSS
from strategies.config import Config
from strategies.moe import MoeShape, moe_shapes, pinned_shape
from strategies.tensors import dequantize_moe, generator, moe_case, real_channels

pytestmark = [pytest.mark.contract(CONTRACT)]

EXTRA = 128
"""Further padding drawn on top of the policy's, per size (0 or this)."""
OBSERVED: list[dict[str, object]] = []
"""One row per example run in this process (written out at module teardown)."""


@dataclass(frozen=True)
class TritonKernelCase(Config):
    """A drawn gpt-oss-style MoE layer and padding past the policy's (0 or :data:`EXTRA` each)."""

    shape: MoeShape
    extra_intermediate: int
    extra_hidden: int

    def describe(self) -> str:
        return f"{self.shape.describe()}; +{self.extra_intermediate} I, +{self.extra_hidden} H past the policy's"


@st.composite
def kernel_cases(draw: st.DrawFn) -> TritonKernelCase:
    extra = st.sampled_from((0, EXTRA))
    return TritonKernelCase(draw(moe_shapes(group=MXFP4_BLOCK, activations=(GPT_OSS,))), draw(extra), draw(extra))


REGRESSIONS = (
    TritonKernelCase(pinned_shape("gpt-oss-120b", 1, group=MXFP4_BLOCK), 0, 0),
    TritonKernelCase(pinned_shape("gpt-oss-120b", 4, group=MXFP4_BLOCK), EXTRA, EXTRA),
)


def with_biases(shape: MoeShape, weights):
    """``weights`` (``moe_case``'s ``[up; gate]`` rows) with fp32 expert biases drawn from ``shape.seed``: zero on
    channels past ``shape.real_intermediate``, as a checkpoint's padded channels are."""
    g = generator(shape.seed + 1)
    e, i, h = shape.experts, shape.intermediate, shape.hidden
    b13 = torch.randn(e, 2, i, generator=g)
    b13[..., shape.real_intermediate :] = 0
    return replace(weights, w13_bias=b13.reshape(e, 2 * i), w2_bias=torch.randn(e, h, generator=g))


def real_biases(shape: MoeShape, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """The biases of the real channels: ``[E, 2·real]`` (``[up; gate]``) and ``[E, H]``."""
    e, i, real = shape.experts, shape.intermediate, shape.real_intermediate
    return weights.w13_bias.reshape(e, 2, i)[..., :real].reshape(e, 2 * real), weights.w2_bias


@check(
    CONTRACT,
    TritonKernelCase,
    strategy=kernel_cases(),
    pins=REGRESSIONS,
    backends=[Mxfp4MoeBackend.TRITON_SM90],
    kernel=True,
    fixtures=["observed_errors"],
)
def check_matmul_ogs_kernel(case: TritonKernelCase, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """matmul_ogs on the policy's (further padded) experts matches the unpadded-layer reference, and the
    further padding is bit-identical."""
    shape = case.shape
    layer = moe_case(shape, MXFP4_BLOCK)
    weights = with_biases(shape, layer.weights)
    checkpoint = relayout_moe(weights, Fc1Layout.GATE_UP_INTERLEAVED)
    aligned = align_checked(policy, backend, checkpoint, shape.gated, case.describe())
    ip, hp = aligned.intermediate_size + case.extra_intermediate, aligned.hidden_size + case.extra_hidden
    if min(2 * aligned.intermediate_size, aligned.hidden_size) <= tk.REFUSED_OUTPUT_WIDTH:
        record_event(f"rejected: an output width <= {tk.REFUSED_OUTPUT_WIDTH}, which the kernel refuses loudly")
        reject()
    x = layer.x.to(torch.bfloat16).float()
    routing, ids = route(layer.logits, shape.top_k)
    w13, w2 = dequantize_moe(real_channels(weights, True, shape.real_intermediate), layer.w13_decode, layer.w2_decode)
    b13, b2 = real_biases(shape, weights)
    want = moe_reference(x, w13, w2, routing, ids, shape.activation, GateUpOrder.UP_GATE, b13, b2)
    magnitude = moe_fused_magnitude(x, w13, w2, routing, ids, shape.activation, GateUpOrder.UP_GATE, b13, b2)

    run, tolerance = record(backend).kernel, record(backend).tolerances[TRITON_SM90_METRIC]

    def kernel(w, width: int) -> torch.Tensor:
        return run(w, pad_dim(x, -1, width), layer.logits, shape.top_k, shape.activation)[:, : shape.hidden]

    got = kernel(aligned.weights, aligned.hidden_size)
    error = normalized_error(got, want, BF16_UNIT_ROUNDOFF * magnitude)
    record_error(error / tolerance, label="kernel error / (2^-8 * magnitude) / tolerance")
    OBSERVED.append(
        {
            "config": case.to_dict(),
            "error": error,
            "further": (ip, hp) != (aligned.intermediate_size, aligned.hidden_size),
        }
    )
    assert error <= tolerance, (
        f"matmul_ogs on the policy's experts (I {shape.intermediate} -> {aligned.intermediate_size}, H {shape.hidden} "
        f"-> {aligned.hidden_size}) is {error:.3g} x 2^-8 x magnitude from the reference (allowed {tolerance}); "
        f"the record's rule says: {tk.hopper_violations(aligned.intermediate_size, aligned.hidden_size) or 'fine'}"
    )
    if (ip, hp) != (aligned.intermediate_size, aligned.hidden_size):
        further = kernel(pad_moe(aligned.weights, True, ip, hp).weights, hp)
        record_event("further padding: bit-identical" if torch.equal(further, got) else "further padding: differs")
        OBSERVED[-1]["bit_identical"] = torch.equal(further, got)
        assert torch.equal(further, got), (
            f"padding I {aligned.intermediate_size} -> {ip}, H {aligned.hidden_size} -> {hp} moved the kernel output "
            f"by {normalized_error(further, got, BF16_UNIT_ROUNDOFF * magnitude):.3g} x 2^-8 x magnitude"
        )


@pytest.fixture(scope="module")
def observed_errors(request: pytest.FixtureRequest):
    """Collect the run's rows; afterwards write the example count and the largest error to the results folder."""
    OBSERVED.clear()
    yield
    if not OBSERVED:
        return
    worst = max(OBSERVED, key=lambda r: float(r["error"]))
    summary = {
        "examples": len(OBSERVED),
        "tolerance": record(Mxfp4MoeBackend.TRITON_SM90).tolerances[TRITON_SM90_METRIC],
        "worst_error": worst,
        "further_padding_pairs": sum(bool(r["further"]) for r in OBSERVED),
        "bit_identical_pairs": sum(bool(r.get("bit_identical")) for r in OBSERVED),
    }
    results = request.config.stash[RUN_STATE].results
    results.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = f"mxfp4_moe_triton_kernel{'-' + worker if worker else ''}.json"
    (results / name).write_text(json.dumps(summary, indent=2))
