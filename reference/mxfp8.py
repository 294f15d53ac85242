"""MXFP8: OCP MX with FP8 E4M3 elements and one E8M0 (power-of-two) scale per 32 elements along K.

Written from the OCP Microscaling Formats (MX) Specification v1.0, §5 (scale ``X`` is E8M0: bias 127,
byte 0xFF is NaN, no sign) and §6.3 (conversion): for a block of 32 values with ``amax = max |v|``,
the shared exponent is ``floor(log2(amax)) - emax_elem`` with ``emax_elem = 8`` for E4M3 (448 =
1.75·2^8), and each element is ``v / X`` cast to E4M3 with saturation to ±448 (``amax / X`` lies in
[256, 512), so a block's largest values may saturate). An all-zero block gets byte 0 (``2^-127``),
as for MXFP4 (:func:`reference.formats.mx_scale_exponent`).

Shapes: element tensors ``[..., K]`` with ``K % 32 == 0``; codes are E4M3 bytes uint8 ``[..., K]``,
scales UE8M0 bytes uint8 ``[..., K/32]``. Elements are encoded and decoded by
:func:`reference.formats.e4m3_encode` / :func:`reference.formats.e4m3_decode`. Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.errors import ShapeContractError, require
from reference.formats import UE8M0_BIAS, e4m3_decode, e4m3_encode, ue8m0_decode

MXFP8_BLOCK = 32
"""Elements per E8M0 scale along K (OCP MX v1.0 §5, every MX format)."""

E4M3_EMAX = 8
"""``emax_elem`` of E4M3: the exponent of its largest normal, 448 = 1.75·2^8 (OCP MX v1.0 Table 2)."""


@dataclass(frozen=True)
class Mxfp8Quantized:
    """An MXFP8 tensor: E4M3 bytes ``codes [..., K]`` and UE8M0 bytes ``scales [..., K/32]``."""

    codes: torch.Tensor
    scales: torch.Tensor


def mxfp8_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """Unbiased shared exponent (int64) of fp32 block maxima ``amax >= 0``: ``floor(log2(amax)) - 8``,
    clamped to [-127, 127]; -127 (byte 0) for an all-zero block. ``floor(log2)`` is read exactly from
    ``frexp`` (``amax = mant·2^exp``, ``mant ∈ [0.5, 1)`` gives ``exp - 1``), subnormals included."""
    amax = amax.float()
    require(bool((amax >= 0).all()), "mxfp8_scale_exponent: amax must be non-negative")
    _, exp = torch.frexp(amax)
    e = torch.where(amax == 0, -UE8M0_BIAS, exp.to(torch.int64) - 1 - E4M3_EMAX)
    return e.clamp(-UE8M0_BIAS, UE8M0_BIAS)


def mxfp8_quantize(x: torch.Tensor) -> Mxfp8Quantized:
    """MXFP8-quantize ``x [..., K]`` (``K % 32 == 0``, finite): per 32 elements the scale ``2^e``,
    ``e = mxfp8_scale_exponent(amax)``, and codes ``e4m3(x / 2^e)`` (nearest even, saturating at ±448).
    Returns codes uint8 ``[..., K]`` and scale bytes ``e + 127`` uint8 ``[..., K/32]``."""
    k = x.shape[-1]
    if k % MXFP8_BLOCK:
        raise ShapeContractError(f"mxfp8_quantize: K = {k} is not a multiple of the 32-element block")
    blocks = x.float().reshape(*x.shape[:-1], k // MXFP8_BLOCK, MXFP8_BLOCK)
    e = mxfp8_scale_exponent(blocks.abs().amax(-1))
    # in fp64: 2^-e is exact there (2^127 overflows fp32), and so is the product, |x / 2^e| < 512
    inverse = torch.ldexp(torch.ones_like(e, dtype=torch.float64), -e)[..., None]
    codes = e4m3_encode((blocks.double() * inverse).float()).reshape(x.shape)
    return Mxfp8Quantized(codes, (e + UE8M0_BIAS).to(torch.uint8))


def mxfp8_dequantize(q: Mxfp8Quantized) -> torch.Tensor:
    """fp32 ``e4m3(code) · 2^(scale - 127)`` per 32-element block (byte 0xFF decodes to NaN, OCP); ``[..., K]``.

    The product of an E4M3 value (4 significant bits, exponent >= -9) and ``2^(b - 127)`` is computed in
    fp64 and rounded once to fp32 (exact unless it falls below fp32's normal range)."""
    k = q.codes.shape[-1]
    require(
        k % MXFP8_BLOCK == 0 and tuple(q.scales.shape) == (*q.codes.shape[:-1], k // MXFP8_BLOCK),
        f"mxfp8_dequantize: scales {tuple(q.scales.shape)} do not match codes {tuple(q.codes.shape)} "
        "with 32-element blocks",
    )
    vals = e4m3_decode(q.codes).double().reshape(*q.codes.shape[:-1], k // MXFP8_BLOCK, MXFP8_BLOCK)
    scale = torch.ldexp(torch.ones_like(q.scales, dtype=torch.float64), q.scales.to(torch.int64) - UE8M0_BIAS)
    scale = torch.where(torch.isnan(ue8m0_decode(q.scales)), torch.nan, scale)
    return (vals * scale[..., None]).float().reshape(q.codes.shape)
