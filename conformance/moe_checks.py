"""Assertions shared by the MoE alignment contracts (``nvfp4_moe``, ``mxfp4_moe``).

Each function states one part of a property and raises ``AssertionError`` with the numbers a
triager needs; the contract modules compose them into ``check_*`` functions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from contracts.errors import UnsupportedConfig
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights
from harness.repro import record_event
from reference.errors import NanEncodingError

TENSORS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")


def align_checked(
    policy: MoeAlignment, backend: enum.Enum, weights: MoeWeights, gated: bool, describe: str
) -> AlignedMoe:
    """``policy.align_moe``; a refusal (:class:`UnsupportedConfig`) of a real shape is a failure."""
    try:
        aligned = policy.align_moe(backend, weights, gated)
    except UnsupportedConfig as exc:
        raise AssertionError(f"policy refused a shape real models produce ({describe}): {exc}") from exc
    record_event(
        f"I {weights.intermediate_size} -> {aligned.intermediate_size}, H {weights.hidden_size} -> {aligned.hidden_size}"
    )
    return aligned


def assert_shapes(aligned: AlignedMoe, experts: int, halves: int) -> None:
    """The padded tensors are ``w13 [E, F·Ip, Hp/2]``, ``w13_scale [E, F·Ip, Hp/g]``, ``w2 [E, Hp, Ip/2]``,
    ``w2_scale [E, Hp, Ip/g]`` and, when present, ``w13_bias [E, F·Ip]``, ``w2_bias [E, Hp]``."""
    w, ip, hp = aligned.weights, aligned.intermediate_size, aligned.hidden_size
    expected = {
        "w13": (experts, halves * ip, hp // 2),
        "w13_scale": (experts, halves * ip, hp // w.block),
        "w2": (experts, hp, ip // 2),
        "w2_scale": (experts, hp, ip // w.block),
        "w13_bias": (experts, halves * ip),
        "w2_bias": (experts, hp),
    }
    for name, want in expected.items():
        t = getattr(w, name)
        if t is not None:
            assert tuple(t.shape) == want, f"{name} has shape {tuple(t.shape)}, contract says {want} (Ip={ip}, Hp={hp})"


def assert_embedded(name: str, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``src`` sits in the leading corner of ``dst`` (same leading dims) and every other element is zero."""
    corner = tuple(slice(0, n) for n in src.shape)
    assert all(d >= s for d, s in zip(dst.shape, src.shape, strict=True)), (
        f"{name}: padded shape {tuple(dst.shape)} is smaller than the original {tuple(src.shape)}"
    )
    assert torch.equal(dst[corner], src), f"{name}: the original {tuple(src.shape)} block moved or changed"
    mask = torch.ones_like(dst, dtype=torch.bool)
    mask[corner] = False
    assert not dst[mask].any(), f"{name}: padding of {tuple(src.shape)} -> {tuple(dst.shape)} holds non-zero values"


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


def output_or_failure(compute: Callable[[], torch.Tensor], context: str) -> torch.Tensor:
    """``compute()``, the reference output of one side of an invariance property.

    A NaN that reaches the reference's FP4/FP8 re-quantization (weights whose padding decodes to
    NaN) fails the property with its own message, ``"{context}: NaN"``, instead of surfacing as a
    reference encoding error.
    """
    try:
        return compute()
    except NanEncodingError as exc:
        raise AssertionError(f"{context}: NaN ({exc})") from exc


def assert_bit_identical(got: torch.Tensor, want: torch.Tensor, context: str) -> None:
    """``got`` equals ``want`` bit for bit; the message gives the largest difference."""
    if not torch.equal(got, want):
        diff = (got - want).abs().max().item()
        raise AssertionError(
            f"{context}: max |diff| = {diff:.4g} (max |ref| = {want.abs().max().item():.4g}, shape {tuple(want.shape)})"
        )
