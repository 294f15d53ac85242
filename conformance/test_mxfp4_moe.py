"""Contract ``mxfp4_moe``: MXFP4 MoE experts rounded, padded and reordered per backend, output unchanged.

For every MoE shape a catalogued model produces at any TP degree (gpt-oss's whole-block split with
its short last rank included) and adversarial ones, with a stacked ``[gate; up]`` or gpt-oss
row-interleaved checkpoint, with or without biases, the policy under test turns one rank's
checkpoint weights into the padded, reordered weights a backend's kernel reads (FlashInfer
TRT-LLM, FlashInfer CUTLASS SM90, AITER CK a4w4 and A16W4, Marlin, vLLM's CUTLASS / DeepGEMM,
FlashInfer b12x, triton_kernels on Hopper). Properties: the backend's library transforms
accept them; the reference MoE output is bit-identical to the unpadded layer's (read in the
kernel's own gate/up order); every gate row keeps its up row; padding is minimal and idempotent;
FlashInfer's / AITER's / triton_kernels' layout transforms round-trip and FlashInfer's padding helper agrees.
Kernel runs (SM100 trtllm-gen, gfx950 AITER) are gated by markers.
"""

from __future__ import annotations

import functools

import pytest
import torch

from adapters import aiter_triton, vllm_cutlass
from adapters import flashinfer as fi
from adapters import flashinfer_mxfp4 as fim
from adapters import triton_kernels as tk
from adapters.calls import kernel_device
from backends import record
from backends.mxfp4_moe import CONTRACT, Mxfp4MoeBackend
from conformance.layers import align_mxfp4, reference_output, silu_no_bias
from conformance.moe_checks import (
    assert_embedded,
    pad_rule,
)
from conformance.moe_formats import MXFP4
from conformance.moe_properties import moe_alignment_properties
from conformance.regressions import MXFP4_MOE_REGRESSIONS
from contracts.errors import LibraryUnavailable
from contracts.moe import MoeAlignment, relayout_moe
from harness.properties import check, record_error
from reference.errors import require
from reference.formats import (
    MXFP4_BLOCK,
    MxScaleRounding,
    Quantized,
    e2m1_decode_packed,
    fp4_bytes_zero,
    mxfp4_dequantize,
    mxfp4_quantize,
)
from reference.layouts import (
    Fc1Layout,
    aiter_e8m0_shuffle,
    aiter_e8m0_unshuffle,
    aiter_shuffle_weight,
    aiter_unshuffle_weight,
    inverse_permutation,
    is_permutation,
    sm90_mixed_gemm_scale_deinterleave,
    sm90_mixed_gemm_scale_interleave,
    split_fc1,
    swizzle_128x4,
    unswizzle_128x4,
    vllm_sm90_scale_interleave,
)
from reference.moe import route
from reference.padding import pad_dim
from strategies.catalog import SWIGLU
from strategies.mxfp4_moe import Mxfp4MoeConfig

pytestmark = [pytest.mark.contract(CONTRACT)]


CONFIGS = MXFP4.strategy


moe_alignment_properties(MXFP4, globals())


# --- FlashInfer TRT-LLM ---------------------------------------------------------------------------


@check(
    CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.FLASHINFER_TRTLLM]
)
def check_trtllm_round_trip(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """Undoing FlashInfer's row shuffles and the 128x4 swizzle gives back the padded tensors, and
    FlashInfer's own gated reorder reads the FC1 rows as the checkpoint's gate/up pairs."""
    aligned, case = align_mxfp4(config, backend, policy)
    w, prepared = aligned.weights, record(backend).prepare(aligned, swizzle_128x4)
    rows, hp = 2 * aligned.intermediate_size, aligned.hidden_size
    inv13, inv2 = (
        inverse_permutation(fi.fc2_permutation(rows, False)),
        inverse_permutation(fi.fc2_permutation(hp, False)),
    )
    sinv13, sinv2 = (
        inverse_permutation(fi.fc2_permutation(rows, True)),
        inverse_permutation(fi.fc2_permutation(hp, True)),
    )
    back = {
        "w13": prepared.w13[:, inv13],
        "w13_scale": unswizzle_128x4(prepared.w13_scale, rows, hp // MXFP4_BLOCK)[:, sinv13],
        "w13_bias": None if prepared.w13_bias is None else prepared.w13_bias[:, inv13],
        "w2": prepared.w2[:, inv2],
        "w2_scale": unswizzle_128x4(prepared.w2_scale, hp, aligned.intermediate_size // MXFP4_BLOCK)[:, sinv2],
        "w2_bias": None if prepared.w2_bias is None else prepared.w2_bias[:, inv2],
    }
    for name, t in back.items():
        assert (t is None) == (getattr(w, name) is None), f"{name}: present on one side only"
        assert t is None or torch.equal(t, getattr(w, name)), f"{name} does not round-trip through FlashInfer's prep"
    reorder = inverse_permutation(fi.gated_reorder(rows))
    for name, dim in (("w13", -2), ("w13_scale", -2), ("w13_bias", -1)):
        original = getattr(case.checkpoint, name)
        if original is None:
            continue
        up_gate = back[name].index_select(dim, reorder)
        for half, src, dst in zip(
            ("gate", "up"),
            split_fc1(original, case.checkpoint.fc1_layout, dim),
            split_fc1(up_gate, Fc1Layout.UP_GATE, dim),
            strict=True,
        ):
            label = f"{name} {half} rows under FlashInfer's gated reorder"
            assert_embedded(label, src, dst, pad_rule(name, MXFP4_BLOCK))


@check(
    CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.FLASHINFER_TRTLLM]
)
def check_trtllm_matches_flashinfer_padding(
    config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment
) -> None:
    """FlashInfer's ``pad_trtllm_moe_weights`` (alignments 128 for I, 256 for H) on the stacked ``[up; gate]`` checkpoint
    gives the policy's FC1 weight codes, FC2 codes on its ``ru(H, 128)`` rows (a pad code may be ``+0`` or
    ``-0``) and the same dequantized values (FlashInfer pads scales with 127 = 1.0, vLLM with 0; both times
    zero codes)."""
    aligned, case = align_mxfp4(config, backend, policy)
    src = relayout_moe(case.checkpoint, Fc1Layout.UP_GATE)
    theirs = fim.pad_trtllm_moe_weights(
        src.w13,
        src.w13_scale,
        src.w2,
        src.w2_scale,
        hidden=config.shape.hidden,
        intermediate=config.shape.intermediate,
        hidden_alignment=fim.MXFP8_HIDDEN_MULTIPLE,
        intermediate_alignment=fim.TRTLLM_INTERMEDIATE_MULTIPLE,
    )
    sizes = (theirs.intermediate_size, theirs.hidden_size)
    ours = relayout_moe(aligned.weights, Fc1Layout.UP_GATE)
    assert (aligned.intermediate_size, aligned.hidden_size) == sizes, (
        f"FlashInfer pads (I, H) = {(config.shape.intermediate, config.shape.hidden)} to {sizes}; "
        f"the policy to {(aligned.intermediate_size, aligned.hidden_size)}"
    )
    fc2_rows = theirs.gemm2_weights.shape[1]
    pairs = (
        ("FC1", Quantized(ours.w13, ours.w13_scale), Quantized(theirs.gemm1_weights, theirs.gemm1_weights_scale)),
        (
            "FC2",
            Quantized(ours.w2[:, :fc2_rows], ours.w2_scale[:, :fc2_rows]),
            Quantized(theirs.gemm2_weights, theirs.gemm2_weights_scale),
        ),
    )
    for label, a, b in pairs:
        assert torch.equal(e2m1_decode_packed(a.packed), e2m1_decode_packed(b.packed)), (
            f"{label} weight codes differ from FlashInfer's pad_trtllm_moe_weights (beyond the sign of a zero)"
        )
        assert torch.equal(mxfp4_dequantize(a), mxfp4_dequantize(b)), f"{label} dequantized values differ"
    assert fp4_bytes_zero(ours.w2[:, fc2_rows:]).all(), f"FC2 rows past ru(H, 128) = {fc2_rows} must be zero codes"


# --- FlashInfer CUTLASS SM90 ----------------------------------------------------------------------


@check(
    CONTRACT,
    Mxfp4MoeConfig,
    strategy=CONFIGS,
    pins=MXFP4_MOE_REGRESSIONS,
    backends=[Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90],
)
def check_sm90_scale_fold(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """FlashInfer 0.7.4's ``interleave_moe_scales_for_sm90_mixed_gemm`` (what its W4A16 prep and tests
    feed ``cutlass_fused_moe``) accepts the padded scales, equals the reference 64-row fold and
    round-trips; vLLM's ``_interleave_mxfp4_cutlass_sm90`` is a different byte order (vLLM #46585)."""
    aligned, _ = align_mxfp4(config, backend, policy)
    for name in ("w13_scale", "w2_scale"):
        s = getattr(aligned.weights, name)
        theirs = fi.sm90_scale_interleave(s.contiguous())
        assert torch.equal(theirs, sm90_mixed_gemm_scale_interleave(s)), f"{name}: FlashInfer's fold != reference"
        assert torch.equal(sm90_mixed_gemm_scale_deinterleave(theirs), s), f"{name}: the fold does not round-trip"
        where = torch.arange(s.numel()).reshape(s.shape)
        assert not torch.equal(
            sm90_mixed_gemm_scale_interleave(where).flatten(), vllm_sm90_scale_interleave(where).flatten()
        ), f"{name}: vLLM's last-dim-by-4 interleave now places every scale byte where FlashInfer's fold does"


# --- AITER ------------------------------------------------------------------------------------------


@check(CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.AITER])
def check_aiter_shuffle_round_trip(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """vLLM's Quark prep round-trips: ``e8m0_shuffle(scale.view(E·N, -1)).view(E, N, -1)`` keeps the
    scale shape and unshuffles to the padded scales; ``shuffle_weight`` (16, 16) undoes to the weights."""
    aligned, _ = align_mxfp4(config, backend, policy)
    w = aligned.weights
    for name in ("w13_scale", "w2_scale"):
        s = getattr(w, name)
        e, n, kc = s.shape
        shuffled = aiter_e8m0_shuffle(s.reshape(e * n, kc))
        assert shuffled.shape == (e * n, kc), (
            f"{name} [{e}, {n}, {kc}]: e8m0_shuffle pads [{e * n}, {kc}] to {tuple(shuffled.shape)}, so "
            f".view({e}, {n}, -1) gives {shuffled.numel() / (e * n):g} scale columns per row, not {kc}"
        )
        assert torch.equal(aiter_e8m0_unshuffle(shuffled, e * n, kc).reshape(s.shape), s), f"{name}: no round trip"
    for name in ("w13", "w2"):
        t = getattr(w, name)
        assert torch.equal(aiter_unshuffle_weight(aiter_shuffle_weight(t)), t), f"{name}: shuffle_weight round trip"


@check(CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.AITER_A16W4])
def check_aiter_a16w4_shuffle(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """AITER's own ``shuffle_weight_a16w4`` / ``shuffle_scale_a16w4`` (pure torch, any machine) accept the
    padded experts as vLLM's ``AITER_MXFP4_BF16`` prep calls them (FC1 ``gate_up=True``, FC2 ``False``;
    scales viewed ``[E·N, K/32]``) and move every byte exactly once (a permutation of the positions)."""
    aligned, _ = align_mxfp4(config, backend, policy)
    w, e = aligned.weights, config.shape.experts
    for name, gate_up in (("w13", True), ("w2", False)):
        t, s = getattr(w, name), getattr(w, f"{name}_scale")
        n, kc = s.shape[1], s.shape[2]
        calls = (
            (name, t, functools.partial(aiter_triton.shuffle_weight_a16w4, gate_up=gate_up)),
            (
                f"{name}_scale",
                s.reshape(e * n, kc),
                functools.partial(aiter_triton.shuffle_scale_a16w4, experts=e, gate_up=gate_up),
            ),
        )
        for label, tensor, shuffle in calls:
            try:
                out = shuffle(tensor)
                where = shuffle(torch.arange(tensor.numel()).reshape(tensor.shape))
            except LibraryUnavailable:
                raise
            except RuntimeError as exc:  # a view that does not fit
                raise AssertionError(f"AITER's a16w4 shuffle rejects {label} {tuple(tensor.shape)}: {exc}") from exc
            assert out.shape == tensor.shape, f"{label}: shuffled to {tuple(out.shape)}, not {tuple(tensor.shape)}"
            assert where.numel() == tensor.numel() and is_permutation(where), (
                f"{label}: the a16w4 shuffle is not a permutation"
            )
            assert torch.equal(out.flatten(), tensor.flatten()[where.flatten()]), (
                f"{label}: bytes moved unlike positions"
            )


@check(CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.VLLM_CUTLASS])
def check_vllm_cutlass_scale_swizzle(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """vLLM's own ``_swizzle_cutlass_mxfp4_scales`` (torch code; needs vLLM importable) accepts the padded
    scales of both GEMMs, equals the reference 128x4 swizzle per expert and unswizzles back to them."""
    aligned, _ = align_mxfp4(config, backend, policy)
    for name in ("w13_scale", "w2_scale"):
        s = getattr(aligned.weights, name)
        try:
            theirs = vllm_cutlass.swizzle_scales(s)
        except LibraryUnavailable:
            raise
        except RuntimeError as exc:  # the reshape back to [N, K/32] after padding to whole tiles
            raise AssertionError(f"vLLM's CUTLASS scale swizzle rejects {name} {tuple(s.shape)}: {exc}") from exc
        assert torch.equal(theirs.flatten(), swizzle_128x4(s).flatten()), f"{name}: vLLM's swizzle != reference 128x4"
        back = unswizzle_128x4(theirs, s.shape[1], s.shape[2])
        assert torch.equal(back, s), f"{name}: the CUTLASS swizzle does not round-trip"


@check(CONTRACT, Mxfp4MoeConfig, strategy=CONFIGS, pins=MXFP4_MOE_REGRESSIONS, backends=[Mxfp4MoeBackend.TRITON_SM90])
def check_triton_hopper_scale_layout(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """triton_kernels' own ``HopperMXScaleLayout`` (``mx_axis=1``, 8 warps, as vLLM's ``_swizzle_mxfp4``
    calls it) stores at least the scale groups the Hopper ``block_k = 128`` kernel reads for each GEMM's K
    (FC1 ``Hp``, FC2 ``Ip``), the K is one the kernel computes right (:func:`adapters.triton_kernels.gemm_violations`),
    and the layout unswizzles to the padded scales. Needs triton_kernels (its own package or
    vLLM's vendored copy, both import Triton); no GPU: the layout is torch code."""
    aligned, _ = align_mxfp4(config, backend, policy)
    w = aligned.weights
    for name, k in (("w13_scale", aligned.hidden_size), ("w2_scale", aligned.intermediate_size)):
        s = getattr(w, name)
        stored, back = tk.hopper_scale_round_trip(s)
        problems = tk.gemm_violations(k, stored)
        assert not problems, (
            f"{name} [{', '.join(map(str, s.shape))}] through HopperMXScaleLayout: {'; '.join(problems)}"
        )
        assert torch.equal(back, s), f"{name}: HopperMXScaleLayout does not round-trip"


# --- kernels (GPU) --------------------------------------------------------------------------------


def _rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _bf16(a: torch.Tensor) -> torch.Tensor:
    """The bf16 rounding the trtllm-gen MXFP4 x BF16 kernel applies to its FC1 output."""
    return a.to(torch.bfloat16).float()


@check(
    CONTRACT,
    Mxfp4MoeConfig,
    strategy=CONFIGS,
    pins=MXFP4_MOE_REGRESSIONS,
    backends=[Mxfp4MoeBackend.FLASHINFER_TRTLLM],
    kernel=True,
)
def check_trtllm_kernel(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """``trtllm_fp4_block_scale_routed_moe`` on the padded, FlashInfer-prepared experts (MXFP4 x BF16
    and x MXFP8) matches the reference output of the rank's real channels (tolerances: the backend record's)."""
    aligned, case = align_mxfp4(config, backend, policy)
    r = record(backend)
    prepared = r.prepare(aligned, fi.block_scale_interleave)
    routing, ids = route(case.logits, config.shape.top_k)
    runs = [(mxfp8, tol, *r.kernel(prepared, case.x, routing, ids, config.shape.activation, mxfp8)) for mxfp8, tol in (
        (False, r.tolerances["bf16 relative L2"]), (True, r.tolerances["mxfp8 relative L2"])
    )]  # fmt: skip
    for mxfp8, tol, out, fed in runs:
        want = reference_output(
            case.real, Fc1Layout.GATE_UP, case, config.shape, x=fed, requantize=None if mxfp8 else _bf16
        )
        label = "MXFP8" if mxfp8 else "BF16"
        assert torch.isfinite(out).all(), f"trtllm-gen MXFP4 x {label} returned non-finite values"
        err = _rel_l2(out, want)
        assert err <= tol, f"trtllm-gen MXFP4 x {label}: relative L2 error {err:.3g} > {tol}"
        record_error(err / tol, f"{label} relative L2 / tolerance")


@check(
    CONTRACT,
    Mxfp4MoeConfig,
    strategy=CONFIGS.map(silu_no_bias),
    pins=[silu_no_bias(c) for c in MXFP4_MOE_REGRESSIONS],
    backends=[Mxfp4MoeBackend.AITER],
    kernel=True,
)
def check_aiter_kernel(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """``aiter.fused_moe`` (per_1x32, a4w4) on the padded experts matches the reference output of the
    real channels (AITER's logits-diff metric, the backend record's tolerance), and AITER's ``e8m0_shuffle`` equals the reference's."""
    from adapters import aiter as aiter_adapter

    require(
        config.shape.activation == SWIGLU and not config.bias,
        f"the AITER a4w4 MoE test runs SiLU-gated experts without biases, not {config.describe()}",
    )
    aligned, case = align_mxfp4(config, backend, policy)
    w, s = aligned.weights, config.shape
    routing, ids = route(case.logits, s.top_k)
    r = record(backend)
    out, s13, s2 = r.kernel(
        w, case.x, routing, ids, aligned.hidden_size - s.hidden, aligned.intermediate_size - s.real_intermediate
    )
    for name, theirs in (("w13_scale", s13), ("w2_scale", s2)):
        mine = getattr(w, name)
        e, n, kc = mine.shape
        assert torch.equal(theirs.reshape(-1), aiter_e8m0_shuffle(mine.reshape(e * n, kc)).reshape(-1)), (
            f"AITER's e8m0_shuffle of {name} differs from reference.layouts.aiter_e8m0_shuffle"
        )
    act = aiter_adapter.hip_quantize(pad_dim(case.x, -1, aligned.hidden_size).to(kernel_device(), torch.bfloat16))
    fed = mxfp4_dequantize(Quantized(act.packed, act.scales))[:, : s.hidden]

    def requantize(a: torch.Tensor) -> torch.Tensor:
        return mxfp4_dequantize(mxfp4_quantize(a, MxScaleRounding.RCEIL))

    want = reference_output(case.real, Fc1Layout.GATE_UP, case, config.shape, x=fed, requantize=requantize)
    assert torch.isfinite(out).all(), "aiter.fused_moe returned non-finite values (AITER #3117 / #3964 class)"
    x64, y64 = want.double(), out.double()
    diff = 1 - 2 * (x64 * y64).sum().item() / (x64.square() + y64.square()).sum().clamp_min(1e-300).item()
    tol = r.tolerances["logits diff"]
    assert diff <= tol, f"aiter.fused_moe per_1x32: logits diff {diff:.3g} > {tol}"
    record_error(diff / tol, "logits diff / tolerance")
