"""Tensors built from a drawn shape's seed (Hypothesis draws shapes, never tensors).

Random FP4 bytes cover every E2M1 code; E4M3 block-scale bytes stay in ``0x20..0x48``
(about 0.0078..3.0: finite, positive, no NaN byte 0x7F, no sign bit); NVFP4 global decode scales
are powers of two. A rank whose real channel count is below its buffer holds zeros in the tail,
as the whole-block loader leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.formats import NVFP4_BLOCK, GlobalScale, Quantized, nvfp4_dequantize
from reference.padding import unpad_fused_rows
from strategies.moe import MoeShape
from subjects.nvfp4_moe import Nvfp4MoeWeights

SCALE_BYTES = (0x20, 0x48)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_bytes(gen: torch.Generator, *shape: int, low: int = 0, high: int = 256) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(torch.uint8)


@dataclass(frozen=True)
class Nvfp4MoeCase:
    """One rank's NVFP4 MoE layer: weights (``[up; gate]`` FC1), decode scales ``[E]``, inputs."""

    weights: Nvfp4MoeWeights
    w13_decode: torch.Tensor
    w2_decode: torch.Tensor
    x: torch.Tensor
    logits: torch.Tensor


def nvfp4_moe_case(shape: MoeShape) -> Nvfp4MoeCase:
    """Build the layer of ``shape`` from ``shape.seed``; channels ``>= real_intermediate`` are zero."""
    g = generator(shape.seed)
    e, i, h, f = shape.experts, shape.intermediate, shape.hidden, 2 if shape.gated else 1
    w13 = random_bytes(g, e, f * i, h // 2)
    w13_scale = random_bytes(g, e, f * i, h // NVFP4_BLOCK, low=SCALE_BYTES[0], high=SCALE_BYTES[1])
    w2 = random_bytes(g, e, h, i // 2)
    w2_scale = random_bytes(g, e, h, i // NVFP4_BLOCK, low=SCALE_BYTES[0], high=SCALE_BYTES[1])
    real = shape.real_intermediate
    if real < i:
        for half in range(f):
            w13[:, half * i + real : (half + 1) * i] = 0
            w13_scale[:, half * i + real : (half + 1) * i] = 0
        w2[..., real // 2 :] = 0
        w2_scale[..., -(-real // NVFP4_BLOCK) :] = 0
    w13_decode = torch.ldexp(torch.ones(e), torch.randint(-8, -2, (e,), generator=g))
    w2_decode = torch.ldexp(torch.ones(e), torch.randint(-8, -2, (e,), generator=g))
    x = torch.randn(shape.tokens, h, generator=g)
    logits = torch.randn(shape.tokens, e, generator=g)
    return Nvfp4MoeCase(Nvfp4MoeWeights(w13, w13_scale, w2, w2_scale), w13_decode, w2_decode, x, logits)


def real_channels(weights: Nvfp4MoeWeights, gated: bool, real: int) -> Nvfp4MoeWeights:
    """The weights restricted to the ``real`` channels of each FC1 half and FC2's K."""
    f = 2 if gated else 1
    i = weights.intermediate_size
    return Nvfp4MoeWeights(
        w13=unpad_fused_rows(weights.w13, f, real) if real < i else weights.w13,
        w13_scale=unpad_fused_rows(weights.w13_scale, f, real) if real < i else weights.w13_scale,
        w2=weights.w2[..., : real // 2],
        w2_scale=weights.w2_scale[..., : real // NVFP4_BLOCK],
    )


def dequantize_moe(
    weights: Nvfp4MoeWeights, w13_decode: torch.Tensor, w2_decode: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(w13 [E, F·I, H], w2 [E, H, I])`` with per-expert decode global scales."""
    w13 = nvfp4_dequantize(Quantized(weights.w13, weights.w13_scale), w13_decode[:, None, None], GlobalScale.DECODE)
    w2 = nvfp4_dequantize(Quantized(weights.w2, weights.w2_scale), w2_decode[:, None, None], GlobalScale.DECODE)
    return w13, w2
