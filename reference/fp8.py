"""FP8 E4M3 weights with fp32 block scales (DeepSeek-V3 style) or one per-tensor scale.

Elements are OCP FP8 E4M3 (``e4m3fn``: bias 7, no Inf, max 448, NaN at 0x7F / 0xFF), encoded and
decoded by :func:`reference.formats.e4m3_encode` / :func:`reference.formats.e4m3_decode` (the one
statement of the element format). A block-quantized weight ``W [..., N, K]`` holds E4M3 bytes
``uint8 [..., N, K]`` and fp32 scales ``[..., ceil(N/128), ceil(K/128)]``, one per 128x128 tile
(the last row and column of tiles may be partial); ``W ≈ e4m3(code) · scale[n // 128, k // 128]``.
Scales are the dequantization multipliers (vLLM's ``weight_scale_inv``). Pure torch, no library under
test is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.errors import require
from reference.formats import E4M3_MAX, e4m3_decode, e4m3_encode

FP8_BLOCK = 128
"""Rows and columns of one block-scale tile (DeepSeek-V3's ``weight_block_size = [128, 128]``)."""

FP8_TENSOR_BLOCK = 2**31
"""The tile of per-tensor FP8 weights: larger than any dimension, so each weight (each gated FC1 half) is one
tile with one fp32 scale (:func:`block_scale_shape` gives ``(1, 1)``)."""


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


def block_scale_shape(rows: int, cols: int, block: int = FP8_BLOCK) -> tuple[int, int]:
    """The scale grid of a ``[rows, cols]`` weight: ``(ceil(rows/block), ceil(cols/block))``."""
    return ceil_div(rows, block), ceil_div(cols, block)


def expand_block_scales(scales: torch.Tensor, rows: int, cols: int, block: int = FP8_BLOCK) -> torch.Tensor:
    """Per-element scales ``[..., rows, cols]`` of tile scales ``[..., ceil(rows/block), ceil(cols/block)]``:
    element ``(n, k)`` gets ``scales[n // block, k // block]``."""
    require(
        tuple(scales.shape[-2:]) == block_scale_shape(rows, cols, block),
        f"block scales {tuple(scales.shape)} do not tile a [{rows}, {cols}] weight in {block}x{block} blocks",
    )
    full = scales.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return full[..., :rows, :cols]


@dataclass(frozen=True)
class Fp8Quantized:
    """An FP8 weight: E4M3 bytes ``codes [..., N, K]`` and fp32 decode ``scales`` (per tile or a scalar)."""

    codes: torch.Tensor
    scales: torch.Tensor


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448``, and 1.0 for an all-zero block (its codes are zeros whatever the scale)."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def fp8_block_quantize(w: torch.Tensor, block: int = FP8_BLOCK) -> Fp8Quantized:
    """Block-quantize ``w [..., N, K]``: per ``block x block`` tile ``s = amax / 448`` (1.0 for a zero tile),
    codes ``e4m3(w / s)`` (round to nearest even; ``|w / s| <= 448`` by construction). Scales fp32
    ``[..., ceil(N/block), ceil(K/block)]``."""
    w = w.float()
    n, k = w.shape[-2:]
    rn, rk = block_scale_shape(n, k, block)
    padded = torch.zeros(*w.shape[:-2], rn * block, rk * block)
    padded[..., :n, :k] = w
    tiles = padded.unflatten(-2, (rn, block)).unflatten(-1, (rk, block))  # [..., rn, b, rk, b]
    scales = _scale_of(tiles.abs().amax(dim=(-3, -1)))
    codes = e4m3_encode(w / expand_block_scales(scales, n, k, block))
    return Fp8Quantized(codes, scales)


def fp8_block_dequantize(q: Fp8Quantized, block: int = FP8_BLOCK) -> torch.Tensor:
    """fp32 ``e4m3(code) · scale[n // block, k // block]`` of ``q`` (``[..., N, K]``)."""
    n, k = q.codes.shape[-2:]
    return e4m3_decode(q.codes) * expand_block_scales(q.scales.float(), n, k, block)


def fp8_token_group_quantize(x: torch.Tensor, group: int = FP8_BLOCK) -> Fp8Quantized:
    """Quantize activations ``x [M, K]`` per token in ``1 x group`` groups along K (DeepSeek-V3's activation
    tiles; vLLM's ``per_token_group_quant_fp8``): per group ``s = amax / 448`` (1.0 for an all-zero group),
    codes ``e4m3(x / s)``. Returns codes ``[M, K]`` and fp32 scales ``[M, ceil(K/group)]``; each row is
    :func:`fp8_block_quantize` of a ``[1, K]`` weight, whose one tile row covers one token."""
    require(x.dim() == 2, f"token-group quantization takes [M, K] activations, got {tuple(x.shape)}")
    q = fp8_block_quantize(x.unsqueeze(-2), group)
    return Fp8Quantized(q.codes.squeeze(-2), q.scales.squeeze(-2))


def fp8_token_group_dequantize(q: Fp8Quantized, group: int = FP8_BLOCK) -> torch.Tensor:
    """fp32 ``e4m3(codes[m, k]) · scales[m, k // group]`` of :func:`fp8_token_group_quantize`'s output."""
    return fp8_block_dequantize(Fp8Quantized(q.codes.unsqueeze(-2), q.scales.unsqueeze(-2)), group).squeeze(-2)


def fp8_tensor_quantize(w: torch.Tensor) -> Fp8Quantized:
    """Per-tensor quantization: one fp32 scale ``s = amax(w) / 448`` (1.0 for all zeros), codes ``e4m3(w / s)``."""
    w = w.float()
    scale = _scale_of(w.abs().amax())
    return Fp8Quantized(e4m3_encode(w / scale), scale)


def fp8_tensor_dequantize(q: Fp8Quantized) -> torch.Tensor:
    """fp32 ``e4m3(code) · s`` with the one per-tensor scale ``s``: one scale, or a batch of weights
    ``codes [..., N, K]`` with one scale each, ``scales [..., 1, 1]``."""
    batched = q.scales.dim() >= 2 and tuple(q.scales.shape[-2:]) == (1, 1) and q.scales.shape[:-2] == q.codes.shape[:-2]
    require(batched or q.scales.numel() == 1, f"per-tensor FP8 needs one scale per tensor, got {tuple(q.scales.shape)}")
    return e4m3_decode(q.codes) * (q.scales.float() if batched else q.scales.float().reshape(()))
