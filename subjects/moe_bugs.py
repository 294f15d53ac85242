"""Padding helpers that reproduce historical MoE bugs, for the known-bad subjects only.

A correct policy pads each FC1 gate/up half (:func:`contracts.moe.pad_moe`); these do not.
"""

from __future__ import annotations

from contracts.moe import AlignedMoe, MoeWeights, code_width, owned, pad_moe, scale_rows, scale_width
from reference.padding import pad_dim


def pad_fused_block_at_end(
    weights: MoeWeights, gated: bool, padded_intermediate: int, padded_hidden: int
) -> AlignedMoe:
    """The historical bug (vLLM #55649): FC1's fused block padded at its end, not per half
    (for a stacked layout this shifts the pairing by ``Ip - I``); ``w13_bias`` likewise."""
    f, block = 2 if gated else 1, weights.block
    aligned = pad_moe(weights, gated, padded_intermediate, padded_hidden).weights
    rows = f * padded_intermediate
    w = MoeWeights(
        w13=owned(pad_dim(pad_dim(weights.w13, -2, rows), -1, code_width(block, padded_hidden)), weights.w13),
        w13_scale=owned(
            pad_dim(
                pad_dim(weights.w13_scale, -2, f * scale_rows(block, padded_intermediate)),
                -1,
                scale_width(block, padded_hidden),
            ),
            weights.w13_scale,
        ),
        w2=aligned.w2,
        w2_scale=aligned.w2_scale,
        block=block,
        fc1_layout=weights.fc1_layout,
        w13_bias=owned(None if weights.w13_bias is None else pad_dim(weights.w13_bias, -1, rows), weights.w13_bias),
        w2_bias=aligned.w2_bias,
    )
    return AlignedMoe(w, padded_intermediate, padded_hidden)
