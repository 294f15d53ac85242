"""Subjects of the ``nvfp4_moe`` contract: padding NVFP4 MoE expert weights for a FlashInfer backend.

The protocol is :class:`contracts.moe.MoeAlignment` with ``block = 16`` weights whose FC1 rows are
in FlashInfer's ``[up; gate]`` order (vLLM swaps ``[w1; w3]`` before aligning); the backends and
their rules are the records of :mod:`backends.nvfp4_moe`. Subjects shipped here: the correct
built-in policy and three known-bad ones reproducing vLLM bugs.
"""

from __future__ import annotations

from backends import record
from backends.nvfp4_moe import CONTRACT, Nvfp4MoeBackend
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, pad_moe
from reference.formats import NVFP4_BLOCK
from reference.sizes import round_up
from subjects.moe_bugs import pad_fused_block_at_end
from subjects.registry import Subject, register_contract, register_subject


def required_sizes(backend: Nvfp4MoeBackend, intermediate: int, hidden: int, gated: bool) -> tuple[int, int]:
    """The smallest ``(Ip, Hp)`` the built-in policy pads to: the backend record's multiples
    (:mod:`backends.nvfp4_moe` states why each backend needs them)."""
    r = record(backend)
    ip = round_up(intermediate, r.intermediate_multiple if gated else r.intermediate_multiple_non_gated)
    return ip, round_up(hidden, r.hidden_multiple_for(gated))


class BuiltinNvfp4MoeAlignment:
    """Correct policy: per-half zero padding to :func:`required_sizes`."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_moe(weights, gated, ip, hp)


class GatedPad16Alignment:
    """vLLM before PR #46880: gated intermediate padded only to 16 (the Gemma-4 TP=4 crash)."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_moe(weights, gated, round_up(weights.intermediate_size, 16) if gated else ip, hp)


class EndPaddingAlignment:
    """vLLM #55649: the fused ``[up; gate]`` block padded at its end, shifting the pairing."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, hp = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_fused_block_at_end(weights, gated, ip, hp)


class HiddenUnpaddedAlignment:
    """vLLM PR #35497: the intermediate size padded as the backend needs, the hidden size left at whole NVFP4
    blocks, while the backend's scale layout pads it (vLLM's CUTLASS MoE at hidden 2880: scales 2944 rows)."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        ip, _ = required_sizes(backend, weights.intermediate_size, weights.hidden_size, gated)
        return pad_moe(weights, gated, ip, round_up(weights.hidden_size, NVFP4_BLOCK))


register_contract(CONTRACT, MoeAlignment, BuiltinNvfp4MoeAlignment(), tuple(Nvfp4MoeBackend))
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
register_subject(
    Subject(
        "bad-hidden-unpadded",
        "NVFP4 MoE hidden size left at whole 16-element blocks where the backend's scale layout pads it",
        {CONTRACT: HiddenUnpaddedAlignment()},
        reproduces="vLLM PR #35497 (CUTLASS NVFP4 MoE, hidden 2880: experts after the first read wrong scales)",
    )
)
