"""Subjects of the ``fp8_moe`` contract: padding block-scaled FP8 MoE expert weights for a kernel.

The protocol is :class:`contracts.moe.MoeAlignment` with ``block = 128`` weights (E4M3 bytes, fp32 128x128
tile scales) whose FC1 rows are in the checkpoint's ``[gate; up]``; the backends and their rules are the
records of :mod:`backends.fp8_moe`. Subjects shipped here: the correct built-in policy and three known-bad
ones reproducing vLLM and AITER bugs.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from backends import record
from backends.fp8_moe import CONTRACT, Fp8MoeBackend
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, pad_moe
from reference.errors import ShapeContractError
from reference.fp8 import FP8_BLOCK
from reference.sizes import round_up
from subjects.registry import Subject, register_contract, register_subject

GARBAGE_CODE = 0x38
"""E4M3 1.0: what the known-bad ``torch.empty`` padding holds here (deterministic, so it fails reproducibly)."""


def required_sizes(backend: Fp8MoeBackend, intermediate: int, hidden: int) -> tuple[int, int]:
    """The smallest ``(Ip, Hp)`` the built-in policy pads to: the backend record's multiples
    (:mod:`backends.fp8_moe` states why each backend needs them)."""
    r = record(backend)
    return round_up(intermediate, r.intermediate_multiple), round_up(hidden, r.hidden_multiple)


def _fp8(weights: MoeWeights) -> MoeWeights:
    if weights.block != FP8_BLOCK:
        raise ShapeContractError(f"fp8_moe takes 128x128 block-scaled FP8 weights, got block {weights.block}")
    return weights


class BuiltinFp8MoeAlignment:
    """Correct policy: per-half zero padding to :func:`required_sizes` (zero scales in added tiles)."""

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size)
        return pad_moe(_fp8(weights), gated, ip, hp)


class PartialBlockAlignment:
    """vLLM #54178 (before PR #55867): a rank's intermediate size is taken as it is, not padded to whole
    128-blocks (Qwen3.8-Flash-Next-FP8 I 640 at TP=8: 80 per rank); the hidden size as the backend needs."""

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        _, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size)
        return pad_moe(_fp8(weights), gated, weights.intermediate_size, hp)


class EmptyPaddingAlignment:
    """vLLM PR #55251: the padded buffers allocated with ``torch.empty``, the checkpoint copied into their
    leading corner and the rest left as it was; here the rest holds :data:`GARBAGE_CODE` weight bytes."""

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size)
        aligned = pad_moe(_fp8(weights), gated, ip, hp)
        ones = replace(weights, w13=torch.ones_like(weights.w13), w2=torch.ones_like(weights.w2))
        kept = pad_moe(ones, gated, ip, hp).weights
        garbage = {
            name: torch.where(getattr(kept, name) == 1, getattr(aligned.weights, name), GARBAGE_CODE).to(torch.uint8)
            for name in ("w13", "w2")
        }
        return replace(aligned, weights=replace(aligned.weights, **garbage))


class UnpaddedAlignment:
    """AITER #5413: no padding of N and K to multiples of 128 for the CK 2-stage FP8 block-scale MoE: the rank's
    sizes are handed to the kernel as they are."""

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        return pad_moe(_fp8(weights), gated, weights.intermediate_size, weights.hidden_size)


register_contract(CONTRACT, MoeAlignment, BuiltinFp8MoeAlignment(), tuple(Fp8MoeBackend))
register_subject(
    Subject(
        "bad-fp8-partial-block",
        "FP8 MoE intermediate size per rank not padded to whole 128-blocks",
        {CONTRACT: PartialBlockAlignment()},
        reproduces="vLLM #54178 / PR #55867 (Qwen3.8-Flash-Next-FP8 TP=8: I 80 per rank)",
    )
)
register_subject(
    Subject(
        "bad-fp8-empty-padding",
        "FP8 MoE padding left uninitialised (torch.empty) instead of zero-filled",
        {CONTRACT: EmptyPaddingAlignment()},
        reproduces="vLLM PR #55251 (padded FP8 expert buffers allocated with torch.empty)",
    )
)
register_subject(
    Subject(
        "bad-fp8-unpadded",
        "FP8 MoE N and K not padded to multiples of 128",
        {CONTRACT: UnpaddedAlignment()},
        reproduces="AITER #5413 (CK 2-stage FP8 block-scale MoE: no N % 128 / K % 128 padding)",
    )
)
