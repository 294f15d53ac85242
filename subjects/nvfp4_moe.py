"""Contract ``nvfp4_moe``: padding NVFP4 MoE expert weights for a FlashInfer backend.

The protocol is :class:`subjects.moe.MoeAlignment` with ``block = 16`` weights whose FC1 rows are
in FlashInfer's ``[up; gate]`` order (vLLM swaps ``[w1; w3]`` before aligning). Subjects shipped
here: the correct built-in policy and two known-bad ones reproducing vLLM bugs.
"""

from __future__ import annotations

import enum

from reference.sizes import round_up
from subjects.moe import AlignedMoe, MoeAlignment, MoeWeights, pad_fused_block_at_end, pad_moe
from subjects.registry import Subject, register_contract, register_subject

CONTRACT = "nvfp4_moe"


class MoeBackend(enum.Enum):
    """FlashInfer MoE backends consuming NVFP4 weights."""

    FLASHINFER_TRTLLM = "flashinfer-trtllm"  # trtllm_fp4_block_scale_moe (SM100)
    FLASHINFER_CUTLASS = "flashinfer-cutlass"  # cutlass_fused_moe NVFP4 (SM100+)


def required_sizes(backend: MoeBackend, intermediate: int, hidden: int, gated: bool) -> tuple[int, int]:
    """The smallest ``(Ip, Hp)`` the built-in policy pads to.

    TRT-LLM: FC1 scale rows ``F·Ip`` must be a multiple of 128 (scale row shuffle) and ``Ip/16``
    a multiple of 4 (the swizzled scale is viewed back as ``[rows, Ip/16]``), so ``Ip = ru(I, 64)``
    gated and ``ru(I, 128)`` non-gated; ``Hp = ru(H, 256)`` (FlashInfer 0.7.4: NVFP4 hidden must
    be a multiple of 256). CUTLASS: the 128x4 swizzle must add no FC1 rows, so the same ``Ip``;
    hidden only needs the kernel's TMA alignment for FP4 activations, ``H % 16`` (FlashInfer's own
    tests run H = 160 and 288; its ``prepare_cutlass_nvfp4_weights`` helper asks ``H % 64``, but
    vLLM does not use that helper).
    """
    ip = round_up(intermediate, 64 if gated else 128)
    hp = round_up(hidden, 256 if backend is MoeBackend.FLASHINFER_TRTLLM else 16)
    return ip, hp


class BuiltinNvfp4MoeAlignment:
    """Correct policy: per-half zero padding to :func:`required_sizes`."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_moe(weights, gated, ip, hp)


class GatedPad16Alignment:
    """vLLM before PR #46880: gated intermediate padded only to 16 (the Gemma-4 TP=4 crash)."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_moe(weights, gated, round_up(weights.intermediate_size, 16) if gated else ip, hp)


class EndPaddingAlignment:
    """vLLM #55649: the fused ``[up; gate]`` block padded at its end, shifting the pairing."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_fused_block_at_end(weights, gated, ip, hp)


register_contract(CONTRACT, MoeAlignment, BuiltinNvfp4MoeAlignment(), tuple(MoeBackend))
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
