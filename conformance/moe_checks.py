"""Assertions shared by the MoE alignment contracts (``nvfp4_moe``, ``mxfp4_moe``, ``fp8_moe``).

Each function states one part of a property and raises ``AssertionError`` with the numbers a
triager needs; the contract modules compose them into ``check_*`` functions.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from hypothesis import currently_in_test_context, reject

from adapters.aiter_triton import TritonMoeRun
from adapters.calls import kernel_device
from backends.fp8_moe import triton_fp8_block_tolerance
from contracts.errors import CheckpointNotServed, UnsupportedConfig
from contracts.moe import (
    AlignedMoe,
    MoeAlignment,
    MoeWeights,
    code_width,
    scale_rows,
    scale_width,
    tensor_dtypes,
    tiled,
)
from harness.properties import record_error, record_event
from reference.errors import NanEncodingError
from reference.formats import NVFP4_BLOCK, fp4_bytes_zero, scale_bytes_finite
from reference.fp8 import Fp8Quantized, fp8_token_group_dequantize
from reference.layouts import Fc1Layout, split_fc1
from reference.padding import outside_corner
from strategies.tensors import dequantize_moe, routed_experts_only

TENSORS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")


def align_checked(
    policy: MoeAlignment, backend: enum.Enum, weights: MoeWeights, gated: bool, describe: str
) -> AlignedMoe:
    """``policy.align_moe``; a refusal (:class:`UnsupportedConfig`) of a real shape is a failure. A policy for an
    engine path without a loader for the checkpoint's form (:class:`CheckpointNotServed`: no checkpoint it
    serves has that form) is not judged on it: Hypothesis draws another example (a reproduction re-raises)."""
    try:
        aligned = policy.align_moe(backend, weights, gated)
    except CheckpointNotServed as exc:
        record_event(f"checkpoint form not served: {exc}")
        if currently_in_test_context():
            reject()
        raise
    except UnsupportedConfig as exc:
        raise AssertionError(f"policy refused a shape real models produce ({describe}): {exc}") from exc
    record_event(
        f"I {weights.intermediate_size} -> {aligned.intermediate_size}, H {weights.hidden_size} -> {aligned.hidden_size}"
    )
    return aligned


def assert_shapes(aligned: AlignedMoe, experts: int, halves: int) -> None:
    """The padded tensors are ``w13 [E, F·Ip, Hp/2]``, ``w13_scale [E, F·Ip, Hp/g]``, ``w2 [E, Hp, Ip/2]``,
    ``w2_scale [E, Hp, Ip/g]`` (FP8: ``w13 [E, F·Ip, Hp]``, ``w13_scale [E, F·ceil(Ip/128), ceil(Hp/128)]``,
    ``w2 [E, Hp, Ip]``, ``w2_scale [E, ceil(Hp/128), ceil(Ip/128)]``) and, when present, ``w13_bias [E, F·Ip]``,
    ``w2_bias [E, Hp]``, each of the dtype :func:`~contracts.moe.tensor_dtypes` names (uint8 codes, uint8 FP4
    and fp32 FP8 scales, fp32 biases)."""
    w, ip, hp = aligned.weights, aligned.intermediate_size, aligned.hidden_size
    g = w.block
    for name, dtype in tensor_dtypes(g).items():
        t = getattr(w, name)
        assert t is None or t.dtype == dtype, f"{name} has dtype {t.dtype}, contract says {dtype}"
    expected = {
        "w13": (experts, halves * ip, code_width(g, hp)),
        "w13_scale": (experts, halves * scale_rows(g, ip), scale_width(g, hp)),
        "w2": (experts, hp, code_width(g, ip)),
        "w2_scale": (experts, scale_rows(g, hp), scale_width(g, ip)),
        "w13_bias": (experts, halves * ip),
        "w2_bias": (experts, hp),
    }
    for name, want in expected.items():
        t = getattr(w, name)
        if t is not None:
            assert tuple(t.shape) == want, f"{name} has shape {tuple(t.shape)}, contract says {want} (Ip={ip}, Hp={hp})"


@dataclass(frozen=True)
class PadRule:
    """What an element a policy added to a tensor may hold: ``allowed`` maps elements to a bool mask."""

    what: str
    allowed: Callable[[torch.Tensor], torch.Tensor]


def pad_rule(tensor: str, block: int) -> PadRule:
    """The pad rule of :class:`~subjects.moe.MoeWeights` field ``tensor``, from the formats.

    Added weight codes are E2M1 zeros of either sign (nibble 0x0 or 0x8). Added scale codes are
    any finite code of the block's scale format (E4M3 for 16, UE8M0 for 32): they only scale
    added weight codes, and ``finite · 0 = 0`` while ``NaN · 0 = NaN`` (so E4M3 0x7F / 0xFF and
    UE8M0 0xFF fail). FlashInfer 0.7.4's ``pad_trtllm_moe_weights`` fills scales with the
    format's 1.0 (UE8M0 127, E4M3 0x38), vLLM with 0. Added bias elements are zero.

    FP8 (``block = 128``): added weight bytes are E4M3 zeros (0x00 or 0x80) and added fp32 tile scales are
    finite (FlashInfer 0.7.4's ``valid_intermediate_size`` documentation: "it must hold zeros and finite scales").
    """
    if tiled(block):
        if tensor.endswith("_scale"):
            return PadRule("a finite fp32 scale", torch.isfinite)
        if tensor.endswith("_bias"):
            return PadRule("zero", lambda t: t == 0)
        return PadRule("E4M3 zero codes (0x00 or 0x80)", lambda t: (t & 0x7F) == 0)
    if tensor.endswith("_scale"):
        fmt = "E4M3" if block == NVFP4_BLOCK else "UE8M0"
        return PadRule(f"a finite {fmt} scale code", lambda t: scale_bytes_finite(t, block))
    if tensor.endswith("_bias"):
        return PadRule("zero", lambda t: t == 0)
    return PadRule("E2M1 zero codes (nibbles 0x0 or 0x8)", fp4_bytes_zero)


def fc1_parts(x: torch.Tensor, layout: Fc1Layout, gated: bool, dim: int = -2) -> dict[str, torch.Tensor]:
    """FC1 rows by projection: ``gate`` and ``up`` of a gated layer (read in ``layout``), else the one ``FC1``."""
    return dict(zip(("gate", "up"), split_fc1(x, layout, dim), strict=True)) if gated else {"FC1": x}


def assert_embedded(name: str, src: torch.Tensor, dst: torch.Tensor, pad: PadRule) -> None:
    """``src`` sits in the leading corner of ``dst`` (same leading dims) and every other element
    satisfies ``pad``."""
    corner = tuple(slice(0, n) for n in src.shape)
    assert all(d >= s for d, s in zip(dst.shape, src.shape, strict=True)), (
        f"{name}: padded shape {tuple(dst.shape)} is smaller than the original {tuple(src.shape)}"
    )
    assert torch.equal(dst[corner], src), f"{name}: the original {tuple(src.shape)} block moved or changed"
    bad = [part[~allowed] for part in outside_corner(dst, tuple(src.shape)) if not (allowed := pad.allowed(part)).all()]
    count = sum(b.numel() for b in bad)
    assert count == 0, (
        f"{name}: padding of {tuple(src.shape)} -> {tuple(dst.shape)} holds {count} value(s) that are not "
        f"{pad.what}, e.g. {torch.cat(bad)[:4].tolist()}"
    )


def assert_minimal(violations: Callable[[int], list[str]], what: str, start: int, chosen: int, step: int) -> None:
    """No size in ``start, start + step, ... < chosen`` is accepted (``violations(size)`` non-empty)."""
    for smaller in range(start, chosen, step):
        assert violations(smaller), f"over-padding: {what} {start} was padded to {chosen}, but {smaller} is accepted"


def assert_idempotent(policy: MoeAlignment, backend: enum.Enum, aligned: AlignedMoe, gated: bool) -> None:
    """Aligning already aligned weights keeps the sizes and every tensor."""
    again = policy.align_moe(backend, aligned.weights, gated)
    sizes, again_sizes = (
        (aligned.intermediate_size, aligned.hidden_size),
        (again.intermediate_size, again.hidden_size),
    )
    assert again_sizes == sizes, f"not idempotent: sizes {sizes} -> {again_sizes}"
    for name in TENSORS:
        a, b = getattr(aligned.weights, name), getattr(again.weights, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"not idempotent: {name} changed"


def assert_bit_identical(compute: Callable[[], torch.Tensor], want: torch.Tensor, context: str) -> None:
    """``compute()`` (one side of an invariance property) equals ``want`` bit for bit; the message gives the
    largest difference.

    A NaN that reaches the reference's FP4/FP8 re-quantization inside ``compute`` (weights whose padding
    decodes to NaN) fails the property with its own message, ``"{context}: NaN"``, instead of surfacing as
    a reference encoding error.
    """
    try:
        got = compute()
    except NanEncodingError as exc:
        raise AssertionError(f"{context}: NaN ({exc})") from exc
    if not torch.equal(got, want):
        diff = (got - want).abs().max().item()
        raise AssertionError(
            f"{context}: max |diff| = {diff:.4g} (max |ref| = {want.abs().max().item():.4g}, shape {tuple(want.shape)})"
        )


BF16_UNIT_ROUNDOFF = 2.0**-8
"""bf16's unit roundoff ``u``: the unit kernel errors are stated in (``error / (u · magnitude)``)."""


def normalized_error(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor) -> float:
    """``max |got - want| / scale`` over all entries; ``inf`` for a non-finite ``got`` or a difference where ``scale = 0``."""
    if not bool(torch.isfinite(got).all()):
        return math.inf
    diff = (got - want).abs()
    exact = torch.where(diff > 0, math.inf, 0.0)
    ratio = torch.where(scale > 0, diff / scale.clamp_min(torch.finfo(torch.float32).tiny), exact)
    return float(ratio.max()) if ratio.numel() else 0.0


@dataclass(frozen=True)
class GemmStage:
    """One GEMM of a composed MoE run: its output ``got``, the exact product of its own dequantized inputs (fp64)
    and the per-element bound of its kernel."""

    name: str
    got: torch.Tensor
    exact: torch.Tensor
    tolerance: torch.Tensor


def routed_experts(
    w: MoeWeights, ids: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The experts ``ids`` ``[T, k]`` route to, dequantized (:func:`strategies.tensors.dequantize_moe`) on ``device``
    (the kernel properties': :func:`adapters.calls.kernel_device`): fp32 ``(w13 [n, F·I, H], w2 [n, H, I], slots
    [T·k])``, ``slots`` the experts renumbered ``0..n-1`` in slot order (slot ``t·k + j`` reads expert ``ids[t, j]``)."""
    used, _, local = routed_experts_only(w, ids)
    on_device = replace(used, **{name: t.to(device) for name in TENSORS if (t := getattr(used, name)) is not None})
    ones = torch.ones(used.w13.shape[0], device=device)
    w13, w2 = dequantize_moe(on_device, ones, ones)
    return w13, w2, local.reshape(-1).to(device)


def slot_products(x: torch.Tensor, w: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot ``s``: ``x[s] · w[slots[s]]^T`` and ``|x[s]| · |w[slots[s]]|^T`` in float64, ``[S, N]`` on the CPU,
    from ``x`` ``[S, K]`` and the experts ``w`` ``[E, N, K]`` (fp32 values): one GEMM per expert, on ``w``'s device.

    The device does not move a verdict: the product of two fp32 values is exact in float64, and a float64 sum of
    ``K`` of them errs by at most ``K·2^-53·Σ|ab|`` in any order, under ``2^-23`` of the accumulation term of every
    kernel bound they feed (the smallest, :func:`backends.fp8_moe.triton_fp8_block_tolerance`'s, is
    ``3·ceil(K/128)·2^-24·Σ|ab|``; :func:`backends.mxfp4_linear.sm90_dot_scaled_tolerance`'s ``(K/16)·2^-22·Σ|ab|``)."""
    x, slots = x.to(w.device, torch.float64), slots.to(w.device)
    exact = x.new_zeros(x.shape[0], w.shape[1])
    magnitude = torch.zeros_like(exact)
    for e in slots.unique().tolist():
        rows = (slots == e).nonzero().flatten()
        we = w[e].double()
        exact[rows] = x[rows] @ we.T
        magnitude[rows] = x[rows].abs() @ we.abs().T
    return exact.cpu(), magnitude.cpu()


def fp8_block_moe_stages(
    run: TritonMoeRun, w: MoeWeights, routing: torch.Tensor, ids: torch.Tensor
) -> tuple[GemmStage, GemmStage]:
    """The two GEMMs of a block-FP8 MoE run (:func:`adapters.aiter_triton.fp8_block_moe`) on experts ``w``: slot
    ``s = t·k + j`` reads token ``t`` and expert ``ids[t, j]``. FC1: ``x_q[t] · W13[e]^T`` ``[T·k, 2·Ip]``; FC2:
    ``act_q[s] · W2[e]^T · routing[t, j]`` ``[T·k, Hp]``, the experts dequantized by
    :func:`strategies.tensors.dequantize_moe` (each gate/up half on its own tiles, as the checkpoint stores them);
    bounds :func:`backends.fp8_moe.triton_fp8_block_tolerance`
    (FC2 plus ``2^-23 |exact|`` for the fp32 multiply by the routing weight)."""
    k = ids.shape[1]
    w13, w2, slots = routed_experts(w, ids, kernel_device())  # each FC1 half on its own tiles
    xa = fp8_token_group_dequantize(Fp8Quantized(*run.x_q)).repeat_interleave(k, 0)
    exact1, mag1 = slot_products(xa, w13, slots)
    tol1 = triton_fp8_block_tolerance(exact1, mag1, xa.shape[-1])
    aa = fp8_token_group_dequantize(Fp8Quantized(*run.act_q))
    weight = routing.double().reshape(-1, 1)
    exact2, mag2 = (p * weight for p in slot_products(aa, w2, slots))
    tol2 = triton_fp8_block_tolerance(exact2, mag2, aa.shape[-1]) + 2.0**-23 * exact2.abs()
    return GemmStage("FC1", run.fc1, exact1, tol1), GemmStage("FC2 (times the routing weight)", run.fc2, exact2, tol2)


def assert_within(got: torch.Tensor, exact: torch.Tensor, tol: torch.Tensor, what: str, label: str) -> float:
    """Every element of ``got`` within ``tol`` of ``exact``; returns the worst ``|err| / tol`` (a Hypothesis
    target under ``label``)."""
    err = (got.double() - exact).abs()
    ratio = torch.where(tol > 0, err / tol.clamp_min(1e-300), torch.where(err > 0, torch.inf, 0.0)).nan_to_num(
        torch.inf
    )
    worst = ratio.max().item() if ratio.numel() else 0.0
    bad = ~(err <= tol)
    if bad.any():
        at_ = tuple(int(i) for i in bad.nonzero()[ratio[bad].argmax()])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.numel()} elements outside the bound, non-finite "
            f"{int((~torch.isfinite(got)).sum())}; worst |err|/tol = {worst:.3g} at {at_}: kernel {got[at_].item():.6g}, "
            f"exact {exact[at_].item():.6g}, tol {tol[at_].item():.3g}"
        )
    record_error(worst, f"{label} |err|/tol")
    return worst
