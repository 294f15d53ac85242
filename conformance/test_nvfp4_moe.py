"""Contract ``nvfp4_moe``: NVFP4 MoE weight alignment for FlashInfer (the Gemma-4 class of bugs).

For every MoE shape a catalogued model produces at any TP degree (and adversarial ones), the
policy under test pads one rank's NVFP4 expert weights so that FlashInfer's preparation accepts
them, and the padding leaves the layer's output unchanged. Each property is a ``check_*``
function; :func:`harness.properties.check` generates its Hypothesis test, and any failure prints
a one-line reproduction. Pinned regressions (``@example``): Gemma-4-26B-A4B at TP=4 (vLLM #46879, the
``M % 128`` assert) and TP=2 (vLLM #55649, silent gate/up mispairing), GLM-4.5-Air TP=8,
Mellum2 TP=4, Qwen3-30B-A3B TP=8 and Nemotron-3-Nano TP=1/2 (non-gated).
"""

from __future__ import annotations

import pytest
import torch

from adapters import flashinfer as fi
from backends import record
from backends.nvfp4_moe import CONTRACT, Nvfp4MoeBackend
from conformance.layers import align_nvfp4
from conformance.moe_checks import (
    assert_bit_identical,
    assert_embedded,
    assert_idempotent,
    assert_minimal,
    assert_shapes,
    output_or_failure,
    pad_rule,
)
from contracts.moe import MoeAlignment
from harness.properties import ALL_BACKENDS, check, record_error
from reference.formats import NVFP4_BLOCK, GlobalScale, nvfp4_dequantize, nvfp4_quantize
from reference.layouts import inverse_permutation, swizzle_128x4, unswizzle_128x4
from reference.moe import GateUpOrder, moe_reference, route
from reference.padding import pad_dim
from strategies.moe import MoeShape, moe_shapes, pinned_shape
from strategies.tensors import dequantize_moe, real_channels, routed_experts_only

pytestmark = [pytest.mark.contract(CONTRACT)]

INTERMEDIATE_DECODE = 2.0**-3
"""Fixed decode global scale of the re-quantized intermediate (a calibrated constant in a real model)."""

REGRESSIONS = (
    pinned_shape("gemma-4-26b-a4b", 4),  # vLLM #46879 / FlashInfer #3206: rows 352
    pinned_shape("gemma-4-26b-a4b", 2),  # vLLM #55649: 352 -> 384 end-padded
    pinned_shape("glm-4.5-air", 8),  # I = 176, rows 352
    pinned_shape("mellum2-12b-a2.5b", 4),  # I = 224, rows 448
    pinned_shape("qwen3-30b-a3b", 8),  # I = 96, rows 192
    pinned_shape("nemotron-3-nano-30b-a3b", 1),  # non-gated I = 1856 (FlashInfer #4653)
    pinned_shape("nemotron-3-nano-30b-a3b", 2),  # non-gated I = 928
)

TRTLLM = [Nvfp4MoeBackend.FLASHINFER_TRTLLM]


@check(CONTRACT, MoeShape, strategy=moe_shapes(), pins=REGRESSIONS, backends=ALL_BACKENDS)
def check_flashinfer_accepts(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """The padded sizes pass FlashInfer's real prep helpers and the backend's layout rules."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    problems = record(backend).violations(aligned.intermediate_size, aligned.hidden_size, shape.gated)
    assert not problems, (
        f"{backend.value} rejects Ip={aligned.intermediate_size}, Hp={aligned.hidden_size}: " + "; ".join(problems)
    )


def moe_output(aligned_or_case_weights, case, shape: MoeShape, hidden: int) -> torch.Tensor:
    """Reference MoE output ``[T, hidden]`` of ``[up; gate]`` NVFP4 weights, intermediate re-quantized
    (only the routed experts dequantized: :func:`~strategies.tensors.routed_experts_only`)."""
    weights, ids = route(case.logits, shape.top_k)
    routed, experts, ids = routed_experts_only(aligned_or_case_weights, ids)
    w13, w2 = dequantize_moe(routed, case.w13_decode[experts], case.w2_decode[experts])
    x = pad_dim(case.x, -1, w13.shape[-1])

    def requantize(a: torch.Tensor) -> torch.Tensor:
        q = nvfp4_quantize(a, INTERMEDIATE_DECODE, GlobalScale.DECODE)
        return nvfp4_dequantize(q, INTERMEDIATE_DECODE, GlobalScale.DECODE)

    out = moe_reference(x, w13, w2, weights, ids, shape.activation, GateUpOrder.UP_GATE, requantize=requantize)
    return out[:, :hidden]


@check(CONTRACT, MoeShape, strategy=moe_shapes(), pins=REGRESSIONS, backends=ALL_BACKENDS)
def check_padding_invariance(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """The reference MoE output on the padded weights equals the unpadded output bit for bit."""
    aligned, case = align_nvfp4(shape, backend, policy)
    real = real_channels(case.weights, shape.gated, shape.real_intermediate)
    context = (
        f"padding changed the MoE output (I {shape.intermediate} -> {aligned.intermediate_size}, "
        f"H {shape.hidden} -> {aligned.hidden_size})"
    )
    assert_bit_identical(
        output_or_failure(lambda: moe_output(aligned.weights, case, shape, shape.hidden), context),
        moe_output(real, case, shape, shape.hidden),
        context,
    )


@check(CONTRACT, MoeShape, strategy=moe_shapes(), pins=REGRESSIONS, backends=ALL_BACKENDS)
def check_layout_contract(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """Shapes and dtypes match ``uint8 [E, F·Ip, Hp/2]`` etc., each gate/up half keeps its rows at
    ``[h·Ip, h·Ip+I)``, original columns keep their place, every added weight code is an E2M1 zero and
    every added scale code is finite (:func:`~conformance.moe_checks.pad_rule`)."""
    aligned, case = align_nvfp4(shape, backend, policy)
    f, i, ip = 2 if shape.gated else 1, shape.intermediate, aligned.intermediate_size
    assert ip >= i and aligned.hidden_size >= shape.hidden, f"policy shrank sizes: I {i} -> {ip}"
    assert_shapes(aligned, shape.experts, f)
    for name in ("w13", "w13_scale"):
        src, dst = getattr(case.weights, name), getattr(aligned.weights, name)
        for half in range(f):
            label = f"{name} {('up', 'gate')[half] if f == 2 else 'FC1'} half"
            pad = pad_rule(name, NVFP4_BLOCK)
            assert_embedded(label, src[:, half * i : (half + 1) * i], dst[:, half * ip : (half + 1) * ip], pad)
    for name in ("w2", "w2_scale"):
        assert_embedded(name, getattr(case.weights, name), getattr(aligned.weights, name), pad_rule(name, NVFP4_BLOCK))


@check(CONTRACT, MoeShape, strategy=moe_shapes(), pins=REGRESSIONS, backends=ALL_BACKENDS)
def check_minimal_and_idempotent(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """No smaller whole-group size satisfies the backend, and aligning again changes nothing."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    ip, hp, violations = aligned.intermediate_size, aligned.hidden_size, record(backend).violations
    assert_minimal(lambda i: violations(i, hp, shape.gated), "I", shape.intermediate, ip, NVFP4_BLOCK)
    assert_minimal(lambda h: violations(ip, h, shape.gated), "H", shape.hidden, hp, NVFP4_BLOCK)
    assert_idempotent(policy, backend, aligned, shape.gated)


@check(
    CONTRACT,
    MoeShape,
    strategy=moe_shapes(),
    pins=REGRESSIONS,
    backends=[Nvfp4MoeBackend.FLASHINFER_TRTLLM, Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN],
)
def check_prepare_round_trip(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """Undoing FlashInfer's trtllm-gen shuffles and the 128x4 swizzle gives back the padded tensors."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    prepared = record(backend).prepare(aligned, shape.gated)
    w = aligned.weights
    rows, hidden = w.w13.shape[1], w.w2.shape[1]
    for name, perm in (
        ("w13", fi.fc1_permutation(rows, shape.gated, False)),
        ("w2", fi.fc2_permutation(hidden, False)),
    ):
        assert torch.equal(getattr(prepared, name)[:, inverse_permutation(perm)], getattr(w, name)), (
            f"{name} does not round-trip"
        )
    for name, perm in (
        ("w13_scale", fi.fc1_permutation(rows, shape.gated, True)),
        ("w2_scale", fi.fc2_permutation(hidden, True)),
    ):
        src = getattr(w, name)
        lin = unswizzle_128x4(getattr(prepared, name).view(torch.uint8), src.shape[1], src.shape[2])
        assert torch.equal(lin[:, inverse_permutation(perm)], src), f"{name} does not round-trip"


@check(
    CONTRACT,
    MoeShape,
    strategy=moe_shapes(),
    pins=REGRESSIONS,
    backends=TRTLLM,
    kernel=True,
    kernel_backends=False,
    marks=[pytest.mark.cuda],
)
def check_scale_interleave_kernel(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """FlashInfer's CUDA ``block_scale_interleave`` on the gathered padded scales equals the reference swizzle."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    prepare = record(backend).prepare
    on_gpu = prepare(aligned, shape.gated, lambda s: fi.block_scale_interleave(s).view(swizzle_128x4(s).shape))
    reference = prepare(aligned, shape.gated)
    for name in ("w13_scale", "w2_scale"):
        assert torch.equal(getattr(on_gpu, name).view(torch.uint8), getattr(reference, name).view(torch.uint8)), (
            f"block_scale_interleave differs from the 128x4 reference on {name}"
        )
    record_error(0.0, "exact: block_scale_interleave")
