"""Contract ``nvfp4_moe``: padding NVFP4 MoE expert weights for a FlashInfer backend.

Protocol: a policy has ``align_nvfp4_moe(backend, weights, gated) -> AlignedNvfp4Moe``. It gets
one rank's expert weights with FC1 rows in FlashInfer's ``[up; gate]`` order (vLLM swaps
``[w1; w3]`` before aligning, and per-half padding does not depend on the order) and returns
zero-padded weights plus the sizes passed to the kernel. It may raise
:class:`UnsupportedConfig` to refuse a configuration; the properties treat a refusal of a shape
real models produce as a failure.

Subjects shipped here: the correct built-in policy and two known-bad ones reproducing vLLM bugs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.formats import NVFP4_BLOCK
from reference.padding import pad_dim, pad_fused_rows
from reference.sizes import round_up
from subjects.registry import Subject, register_contract, register_subject

CONTRACT = "nvfp4_moe"


class MoeBackend(enum.Enum):
    """FlashInfer MoE backends consuming NVFP4 weights."""

    FLASHINFER_TRTLLM = "flashinfer-trtllm"  # trtllm_fp4_block_scale_moe (SM100)
    FLASHINFER_CUTLASS = "flashinfer-cutlass"  # cutlass_fused_moe NVFP4 (SM100+)


class UnsupportedConfig(Exception):
    """A policy refuses a configuration (for example vLLM's NotImplementedError for gated CUTLASS)."""


@dataclass(frozen=True)
class Nvfp4MoeWeights:
    """One rank's NVFP4 experts; FC1 rows ``[up; gate]`` (``F = 2``) or ``I`` rows (``F = 1``).

    ``w13`` uint8 ``[E, F·I, H/2]``, ``w13_scale`` E4M3 bytes ``[E, F·I, H/16]``,
    ``w2`` uint8 ``[E, H, I/2]``, ``w2_scale`` E4M3 bytes ``[E, H, I/16]``.
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate_size(self) -> int:
        return 2 * self.w2.shape[2]


@dataclass(frozen=True)
class AlignedNvfp4Moe:
    """Padded weights and the sizes handed to the kernel (``intermediate_size`` is ``Ip``)."""

    weights: Nvfp4MoeWeights
    intermediate_size: int
    hidden_size: int


@runtime_checkable
class Nvfp4MoeAlignment(Protocol):
    def align_nvfp4_moe(self, backend: MoeBackend, weights: Nvfp4MoeWeights, gated: bool) -> AlignedNvfp4Moe:
        """Return zero-padded weights satisfying ``backend``'s layout contract."""
        ...


def pad_nvfp4_moe(
    weights: Nvfp4MoeWeights, gated: bool, padded_intermediate: int, padded_hidden: int
) -> AlignedNvfp4Moe:
    """Zero-pad to ``(Ip, Hp)``: FC1 rows per half, hidden columns of FC1, FC2 rows and K."""
    f = 2 if gated else 1
    ip, hp = padded_intermediate, padded_hidden
    w = Nvfp4MoeWeights(
        w13=pad_dim(pad_fused_rows(weights.w13, f, ip), -1, hp // 2),
        w13_scale=pad_dim(pad_fused_rows(weights.w13_scale, f, ip), -1, hp // NVFP4_BLOCK),
        w2=pad_dim(pad_dim(weights.w2, -2, hp), -1, ip // 2),
        w2_scale=pad_dim(pad_dim(weights.w2_scale, -2, hp), -1, ip // NVFP4_BLOCK),
    )
    return AlignedNvfp4Moe(w, ip, hp)


def required_sizes(backend: MoeBackend, intermediate: int, hidden: int, gated: bool) -> tuple[int, int]:
    """The smallest ``(Ip, Hp)`` the built-in policy pads to.

    TRT-LLM: FC1 scale rows ``F·Ip`` must be a multiple of 128 (scale row shuffle) and ``Ip/16``
    a multiple of 4 (the swizzled scale is viewed back as ``[rows, Ip/16]``), so ``Ip = ru(I, 64)``
    gated and ``ru(I, 128)`` non-gated; ``Hp = ru(H, 256)`` (FlashInfer 0.7.4: NVFP4 hidden must
    be a multiple of 256). CUTLASS: the 128x4 swizzle must add no FC1 rows, so the same ``Ip``;
    hidden only needs ``H % 64`` (linear input-scale row stride).
    """
    ip = round_up(intermediate, 64 if gated else 128)
    hp = round_up(hidden, 256 if backend is MoeBackend.FLASHINFER_TRTLLM else 64)
    return ip, hp


class BuiltinNvfp4MoeAlignment:
    """Correct policy: per-half zero padding to :func:`required_sizes`."""

    def align_nvfp4_moe(self, backend: MoeBackend, weights: Nvfp4MoeWeights, gated: bool) -> AlignedNvfp4Moe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_nvfp4_moe(weights, gated, ip, hp)


class GatedPad16Alignment(BuiltinNvfp4MoeAlignment):
    """vLLM before PR #46880: gated intermediate padded only to 16 (the Gemma-4 TP=4 crash)."""

    def align_nvfp4_moe(self, backend: MoeBackend, weights: Nvfp4MoeWeights, gated: bool) -> AlignedNvfp4Moe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        if gated:
            ip = round_up(weights.intermediate_size, 16)
        return pad_nvfp4_moe(weights, gated, ip, hp)


class EndPaddingAlignment(BuiltinNvfp4MoeAlignment):
    """vLLM #55649: the fused ``[up; gate]`` block padded at its end, shifting the pairing."""

    def align_nvfp4_moe(self, backend: MoeBackend, weights: Nvfp4MoeWeights, gated: bool) -> AlignedNvfp4Moe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        aligned = pad_nvfp4_moe(weights, gated, ip, hp).weights
        f = 2 if gated else 1
        w = Nvfp4MoeWeights(
            w13=pad_dim(pad_dim(weights.w13, -2, f * ip), -1, hp // 2),
            w13_scale=pad_dim(pad_dim(weights.w13_scale, -2, f * ip), -1, hp // NVFP4_BLOCK),
            w2=aligned.w2,
            w2_scale=aligned.w2_scale,
        )
        return AlignedNvfp4Moe(w, ip, hp)


register_contract(CONTRACT, Nvfp4MoeAlignment, BuiltinNvfp4MoeAlignment(), tuple(MoeBackend))
register_subject(
    Subject(
        "bad-gated-pad16",
        "gated NVFP4 MoE intermediate padded to a multiple of 16 only",
        {CONTRACT: GatedPad16Alignment()},
        reproduces="vLLM #46879 (Gemma-4-26B-A4B TP=4: assert M % 128 == 0)",
    )
)
register_subject(
    Subject(
        "bad-end-padding",
        "fused gate/up block zero-padded at its end instead of per half",
        {CONTRACT: EndPaddingAlignment()},
        reproduces="vLLM #55649 (Gemma-4-26B-A4B TP=2: silent corruption)",
    )
)
