"""Tensors built from a drawn shape's seed (Hypothesis draws shapes, never tensors).

Random FP4 bytes cover every E2M1 code. NVFP4 E4M3 block-scale bytes stay in ``0x20..0x48``
(about 0.0078..3.0: finite, positive, no NaN byte 0x7F, no sign bit) with power-of-two global
decode scales; MXFP4 UE8M0 bytes stay in ``118..122`` (2^-9..2^-5, as vLLM's MXFP4 MoE tests
draw). FP8 E4M3 weight bytes are any non-NaN byte (0x7F and 0xFF excluded) and their fp32 scales (per 128x128
tile, or per weight) powers of two 2^-9..2^-5. A rank whose real channel count is below its buffer holds zeros in the tail, as the
whole-block loader leaves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from contracts.moe import MoeWeights, code_width, scale_rows, scale_width, select_experts, tiled
from reference.formats import (
    MXFP4_BLOCK,
    NVFP4_BLOCK,
    GlobalScale,
    Quantized,
    Ue8m0Byte0,
    Ue8m0Byte255,
    mxfp4_dequantize,
    nvfp4_dequantize,
)
from reference.fp8 import FP8_TENSOR_BLOCK, Fp8Quantized, fp8_block_dequantize, fp8_tensor_dequantize
from reference.padding import unpad_fused_rows
from strategies.moe import MoeShape

SCALE_BYTES = {NVFP4_BLOCK: (0x20, 0x48), MXFP4_BLOCK: (118, 123)}


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _words(gen: torch.Generator, count: int) -> torch.Tensor:
    """``count`` uniform 64-bit words (int64): one draw of ``gen`` each."""
    return torch.randint(-(2**63), 2**63 - 1, (count,), generator=gen, dtype=torch.int64)


def random_bytes(gen: torch.Generator, *shape: int, low: int = 0, high: int = 256) -> torch.Tensor:
    """uint8 ``shape`` in ``[low, high)``, the bytes of uniform 64-bit words (``torch.randint`` draws one
    random number per element, several times slower on CPU).

    Any byte (``[0, 256)``, the packed FP4 codes): eight bytes per word, uniform. Another range (scale
    bytes): a 16-bit number ``v`` per element (four per word) mapped to ``low + (v·(high - low) >> 16)``;
    each of the ``high - low`` values takes ``2^16 / (high - low)`` inputs rounded up or down, so it is
    uniform within a relative ``(high - low)·2^-16`` (at most 0.4 %)."""
    n = math.prod(shape)
    if (low, high) == (0, 256):
        flat = _words(gen, -(-n // 8)).view(torch.uint8)
        return (flat if n % 8 == 0 else flat[:n].clone()).reshape(shape)  # a storage of exactly n bytes
    v = _words(gen, -(-n // 4)).view(torch.uint16)[:n].to(torch.int32)
    return v.mul_(high - low).bitwise_right_shift_(16).add_(low).to(torch.uint8).reshape(shape)


@dataclass(frozen=True)
class MoeCase:
    """One rank's quantized MoE layer: weights (stacked FC1 halves), decode scales ``[E]``, inputs."""

    weights: MoeWeights
    w13_decode: torch.Tensor
    w2_decode: torch.Tensor
    x: torch.Tensor
    logits: torch.Tensor


def _fp8_bytes(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Random E4M3 bytes ``shape``: any of the 254 bytes but the NaN ones (0x7F, 0xFF), both signs alike:
    ``m`` in ``[0, 254)``, and ``m + 1`` from ``0x7F`` on (``0..0x7E``, then ``0x80..0xFE``)."""
    m = random_bytes(gen, *shape, high=254)
    return m + (m >= 0x7F).to(torch.uint8)


def _fp8_scales(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """fp32 tile scales ``shape``, powers of two 2^-9..2^-5."""
    return torch.ldexp(torch.ones(shape), torch.randint(-9, -4, shape, generator=gen))


KEPT_BYTES = 1 << 28
"""Most bytes of built layers :func:`moe_case` keeps in one process, the least recently used dropped first."""


class _Kept:
    """Built layers by ``(shape, block)``, the most recently used last, with their bytes in all."""

    def __init__(self) -> None:
        self.cases: dict[tuple[MoeShape, int], tuple[MoeCase, int]] = {}
        self.bytes = 0

    def get(self, key: tuple[MoeShape, int]) -> MoeCase:
        """The layer of ``key``, built unless kept; then the least recently used go while over :data:`KEPT_BYTES`."""
        case, size = self.cases.pop(key, (None, 0))
        if case is None:
            case = _build_case(*key)
            w = case.weights
            size = sum(t.nbytes for t in (w.w13, w.w13_scale, w.w2, w.w2_scale, case.x, case.logits))
            self.bytes += size
        self.cases[key] = case, size
        while self.bytes > KEPT_BYTES and len(self.cases) > 1:
            self.bytes -= self.cases.pop(next(iter(self.cases)))[1]
        return case


_KEPT = _Kept()


def _copied(value: MoeCase | MoeWeights) -> MoeCase | MoeWeights:
    """``value`` with every tensor, its weights' included, cloned."""
    changes = {}
    for f in fields(value):
        item = getattr(value, f.name)
        if isinstance(item, torch.Tensor):
            changes[f.name] = item.clone()
        elif isinstance(item, MoeWeights):
            changes[f.name] = _copied(item)
    return replace(value, **changes)


def moe_case(shape: MoeShape, block: int) -> MoeCase:
    """Build the layer of ``shape`` from ``shape.seed`` with ``block``-element scale groups
    (16 NVFP4, 32 MXFP4) or ``block x block`` tiles (128 FP8); channels ``>= real_intermediate`` are zero,
    bytes and (whole-group or whole-tile) scales alike.

    The layer is a function of ``(shape, block)`` alone, so it is built once per process and every call gets
    a copy, tensors of its own (a caller that writes into them changes no other caller's): the backends of one
    property draw the same shapes, and copying runs at memory speed where drawing the random bytes again does
    not. At most :data:`KEPT_BYTES` of layers are kept."""
    return _copied(_KEPT.get((shape, block)))


def _build_case(shape: MoeShape, block: int) -> MoeCase:
    """The layer :func:`moe_case` hands out, drawn from ``shape.seed``."""
    g = generator(shape.seed)
    e, i, h, f = shape.experts, shape.intermediate, shape.hidden, 2 if shape.gated else 1
    fp8 = tiled(block)
    if fp8:
        w13, w2 = _fp8_bytes(g, e, f * i, h), _fp8_bytes(g, e, h, i)
        w13_scale = _fp8_scales(g, e, f * scale_rows(block, i), scale_width(block, h))
        w2_scale = _fp8_scales(g, e, scale_rows(block, h), scale_width(block, i))
    else:
        low, high = SCALE_BYTES[block]
        w13 = random_bytes(g, e, f * i, h // 2)
        w13_scale = random_bytes(g, e, f * i, h // block, low=low, high=high)
        w2 = random_bytes(g, e, h, i // 2)
        w2_scale = random_bytes(g, e, h, i // block, low=low, high=high)
    real = shape.real_intermediate
    if real < i:
        rows, tail = scale_rows(block, i), scale_rows(block, real) if fp8 else real
        for half in range(f):
            w13[:, half * i + real : (half + 1) * i] = 0
            w13_scale[:, half * rows + tail : (half + 1) * rows] = 0
        w2[..., code_width(block, real) :] = 0
        w2_scale[..., -(-real // block) :] = 0
    nvfp4 = block == NVFP4_BLOCK
    w13_decode = torch.ldexp(torch.ones(e), torch.randint(-8, -2, (e,), generator=g)) if nvfp4 else torch.ones(e)
    w2_decode = torch.ldexp(torch.ones(e), torch.randint(-8, -2, (e,), generator=g)) if nvfp4 else torch.ones(e)
    x = torch.randn(shape.tokens, h, generator=g)
    logits = torch.randn(shape.tokens, e, generator=g)
    return MoeCase(MoeWeights(w13, w13_scale, w2, w2_scale, block), w13_decode, w2_decode, x, logits)


def real_channels(weights: MoeWeights, gated: bool, real: int) -> MoeWeights:
    """The weights restricted to the ``real`` channels of each FC1 half and FC2's K (and the scale rows and
    columns that cover them)."""
    f, g = 2 if gated else 1, weights.block
    i = weights.intermediate_size
    return MoeWeights(
        w13=unpad_fused_rows(weights.w13, f, real) if real < i else weights.w13,
        w13_scale=unpad_fused_rows(weights.w13_scale, f, scale_rows(g, real)) if real < i else weights.w13_scale,
        w2=weights.w2[..., : code_width(g, real)],
        w2_scale=weights.w2_scale[..., : scale_width(g, real)],
        block=g,
    )


def dequantize_moe(
    weights: MoeWeights, w13_decode: torch.Tensor, w2_decode: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(w13 [E, F·I, H], w2 [E, H, I])``.

    NVFP4: E4M3 scales times per-expert decode global scales. MXFP4: UE8M0 scales decoded the
    OCP way (zero-padded blocks carry byte 0 = 2^-127, finite, so their zero codes stay 0). FP8: E4M3 bytes
    times their fp32 128x128 tile scale (:func:`reference.fp8.fp8_block_dequantize`), each FC1 half on its own tiles.
    """

    def deq(packed: torch.Tensor, scales: torch.Tensor, decode: torch.Tensor, halves: int) -> torch.Tensor:
        if tiled(weights.block):  # each gated FC1 half has its own tiles (per-tensor: its one scale)
            parts = zip(packed.chunk(halves, dim=-2), scales.chunk(halves, dim=-2), strict=True)
            if weights.block == FP8_TENSOR_BLOCK:
                return torch.cat([fp8_tensor_dequantize(Fp8Quantized(p, s)) for p, s in parts], dim=-2)
            return torch.cat([fp8_block_dequantize(Fp8Quantized(p, s), weights.block) for p, s in parts], dim=-2)
        q = Quantized(packed, scales)
        if weights.block == NVFP4_BLOCK:
            return nvfp4_dequantize(q, decode[:, None, None], GlobalScale.DECODE)
        return mxfp4_dequantize(q, Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)

    fc1_halves = weights.w13.shape[-2] // weights.intermediate_size
    return (
        deq(weights.w13, weights.w13_scale, w13_decode, fc1_halves),
        deq(weights.w2, weights.w2_scale, w2_decode, 1),
    )


def routed_experts_only(weights: MoeWeights, ids: torch.Tensor) -> tuple[MoeWeights, torch.Tensor, torch.Tensor]:
    """``(weights of the experts ids [T, k] route to, their ids [n] ascending, ids renumbered 0..n-1)``.

    :func:`reference.moe.moe_reference` runs the routed experts in ascending id, so on the renumbered
    ids it gives the same bits as on all experts, dequantizing ``n <= T·k`` of them (a rank of a real
    model holds up to hundreds)."""
    experts, local = ids.unique(return_inverse=True)
    return select_experts(weights, experts.tolist()), experts, local
