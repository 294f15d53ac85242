"""FP4 number formats: E2M1 elements, E4M3 / UE8M0 block scales, NVFP4 and MXFP4.

Written from ``docs/formats.md`` (OCP MX v1.0 for MXFP4, NVIDIA's NVFP4 description).
Pure torch, CPU or GPU, no library under test is imported here.

Conventions that real libraries disagree on are parameters, never hidden choices:

* :class:`E4m3Sign` — whether the sign bit of an E4M3 block scale is read (torch's
  ``float8_e4m3fn``) or ignored (cuBLAS reads NVFP4 block scales as unsigned UE4M3).
* :class:`Ue8m0Byte0` / :class:`Ue8m0Byte255` — what UE8M0 bytes 0 and 0xFF decode to
  (OCP: 2^-127 and NaN; FlashInfer's ``b << 23`` host decode: 0.0 and +Inf).
* :class:`MxScaleRounding` — how the MX block exponent is derived from the block amax.
* :class:`GlobalScale` — whether an NVFP4 global scale is the encode multiplier
  ``gs = 448·6/amax`` or the decode multiplier ``1/gs``.

Shapes: element tensors are ``[..., K]``; packed FP4 is uint8 ``[..., K/2]`` (element ``2j`` in
the low nibble); block scales are uint8 ``[..., K/block]``.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

from reference.errors import NanEncodingError, ShapeContractError, require

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitude of E2M1 codes 0..7; codes 8..15 are the same values negated (code 8 is -0.0)."""
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MAX_BYTE = 0x7E
UE8M0_BIAS = 127
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32


class E4m3Sign(enum.Enum):
    """How the sign bit (0x80) of an E4M3 block-scale byte is read."""

    SIGNED = "signed"  # torch float8_e4m3fn: 0x80..0xFE are negative
    IGNORED = "ignored"  # cuBLAS UE4M3: the sign bit is dropped


class Ue8m0Byte0(enum.Enum):
    """What UE8M0 byte 0 decodes to."""

    POW2 = "2^-127"  # OCP MX, torchao, AITER, torch float8_e8m0fnu
    ZERO = "0.0"  # FlashInfer host dequant and vLLM's MoE test helper (fp32 bits b << 23)


class Ue8m0Byte255(enum.Enum):
    """What UE8M0 byte 0xFF decodes to."""

    NAN = "nan"  # OCP MX, torchao, AITER, torch float8_e8m0fnu
    INF = "inf"  # FlashInfer host dequant, vLLM's MoE test helper, exp2(b - 127)


class MxScaleRounding(enum.Enum):
    """Rule deriving the unbiased MX block exponent ``e`` from ``amax = m·2^E``, ``m ∈ [1, 2)``.

    FLOOR: ``e = E - 2`` (OCP MX §6.3, AITER mode 0 "RoundDown").
    RCEIL: ``e = ceil(log2(fp32(amax / 6)))`` (FlashInfer, torchao RCEIL, AITER mode 1 "RoundUp").
    CEIL:  ``e = ceil(log2(amax)) - 2`` (torchao CEIL, AITER mode 3).
    EVEN:  ``e = E - 2`` if ``m < 1.75`` else ``E - 1`` (AITER mode 2 / Triton ``dynamic_mxfp4_quant``).
    """

    FLOOR = "floor"
    RCEIL = "rceil"
    CEIL = "ceil"
    EVEN = "even"


class GlobalScale(enum.Enum):
    """Which of the two reciprocal NVFP4 per-tensor scales an argument holds.

    ENCODE: ``gs = 448·6 / amax(tensor)``; quantize multiplies by it, dequantize divides by it
    (FlashInfer ``fp4_quantize``, vLLM ``scaled_fp4_quant``, vLLM's test dequant helper).
    DECODE: ``1/gs``; dequantize multiplies by it (ModelOpt ``weight_scale_2``, FlashInfer
    ``e2m1_and_ufp8sf_scale_to_float``, vLLM ``nvfp4_emulation_utils``, torchao).
    """

    ENCODE = "encode"
    DECODE = "decode"


def _round_to_codebook(magnitude: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of the ascending ``table``, ties to the even index, saturating.

    For E2M1 an entry's index parity is the mantissa LSB, so ties-to-even-index is IEEE
    round-to-nearest-even. Values beyond the last entry (and +inf) saturate to the last index.
    """
    if torch.isnan(magnitude).any():
        raise NanEncodingError("cannot encode NaN into an FP4/FP8 format without NaN handling")
    mids = (table[:-1] + table[1:]) / 2
    low = torch.bucketize(magnitude, mids, right=False)
    high = torch.bucketize(magnitude, mids, right=True)
    return torch.where((low != high) & (low % 2 == 1), high, low)


def _e2m1_table(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, 0..15) of ``x``: round to nearest even, saturate at ±6.

    The sign comes from ``signbit(x)``, so ``-0.0`` and small negatives give code 8 (-0).
    """
    x = x.float()
    mag = _round_to_codebook(x.abs(), _e2m1_table(x.device))
    return (mag | (torch.signbit(x).to(torch.int64) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of E2M1 codes (uint8 0..15); code 8 decodes to -0.0."""
    c = codes.to(torch.int64)
    mag = _e2m1_table(codes.device)[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


@functools.cache
def _e2m1_words(device: torch.device) -> torch.Tensor:
    """int64 ``[256]``: the fp32 values of a packed byte's low and high nibble, in this order in memory
    (``[256, 2]`` fp32 viewed as one 8-byte word per byte)."""
    b = torch.arange(256, device=device)
    return torch.stack((e2m1_decode(b & 0xF), e2m1_decode(b >> 4)), dim=-1).view(torch.int64).flatten()


def e2m1_decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """``e2m1_decode(unpack_fp4(packed))`` (``uint8 [..., K/2]`` -> fp32 ``[..., K]``) by one table
    lookup per byte: the byte's two values as one 8-byte word, viewed back as two fp32 values (the
    same bits; a one-element gather with an int32 index is several times faster on CPU than
    gathering ``[2]`` rows or decoding the nibbles one by one)."""
    require(packed.dtype == torch.uint8, f"e2m1_decode_packed: expected uint8, got {packed.dtype}")
    words = _e2m1_words(packed.device).index_select(0, packed.reshape(-1).int())
    return words.view(torch.float32).view(*packed.shape[:-1], 2 * packed.shape[-1])


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., K]`` into uint8 ``[..., K/2]``: ``byte = code[2j] | code[2j+1] << 4``."""
    require(codes.shape[-1] % 2 == 0, f"pack_fp4: K = {codes.shape[-1]} must be even")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack uint8 ``[..., K/2]`` into codes ``[..., K]`` (low nibble = even element)."""
    require(packed.dtype == torch.uint8, f"unpack_fp4: expected uint8, got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def e4m3_decode(b: torch.Tensor, sign: E4m3Sign = E4m3Sign.SIGNED) -> torch.Tensor:
    """fp32 value of FP8 E4M3 (``fn`` variant) bytes: bias 7, no Inf, NaN at 0x7F / 0xFF.

    ``e = (b >> 3) & 15``, ``f = b & 7``: subnormal ``f/8 · 2^-6`` for ``e == 0``, otherwise
    ``(1 + f/8) · 2^(e - 7)``. With :attr:`E4m3Sign.IGNORED` the sign bit is dropped. The value depends on
    the byte ``b & 0xFF`` only: it is read from the 256 values :func:`_e4m3_formula` gives (one lookup per
    byte, about ten times faster on CPU than the formula per element, the same bits). ``uint8`` bytes index
    the table as int32 directly (no widening to int64 and masking).
    """
    index = b.reshape(-1).int() if b.dtype == torch.uint8 else (b.to(torch.int64) & 0xFF).flatten()
    return _e4m3_values(b.device, sign).index_select(0, index).view(b.shape)


@functools.cache
def _e4m3_values(device: torch.device, sign: E4m3Sign) -> torch.Tensor:
    """fp32 ``[256]``: :func:`_e4m3_formula` of every byte."""
    return _e4m3_formula(torch.arange(256, device=device), sign)


def _e4m3_formula(b: torch.Tensor, sign: E4m3Sign) -> torch.Tensor:
    """:func:`e4m3_decode`'s value of each byte, element by element."""
    v = b.to(torch.int64)
    e, f = (v >> 3) & 0xF, v & 0x7
    mant = torch.where(e == 0, f.double() / 8, 1 + f.double() / 8)
    mag = torch.ldexp(mant, torch.where(e == 0, -6, e - 7))
    mag = torch.where((e == 15) & (f == 7), torch.nan, mag).float()
    if sign is E4m3Sign.IGNORED:
        return mag
    return torch.where((v & 0x80) != 0, -mag, mag)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes of ``x``: round to nearest even, saturate to ±448, sign in bit 7.

    For a magnitude ``m <= 448`` (larger ones and +inf saturate to 448, byte 0x7E) in binade
    ``E = max(floor(log2 m), -6)`` (the subnormals share the lowest normal binade's step), the grid step is
    ``2^(E-3)``: ``q = round_half_even(m / 2^(E-3))`` is in ``[0, 16]`` (exact: a power-of-two division), and
    the byte is ``(E + 6)·8 + q``, which is ``(E + 7) << 3 | (q - 8)`` for a normal, ``q`` for a subnormal
    (``E = -6``, ``q < 8``), and the next binade's first byte when ``q`` rounds up to 16. NaN raises.
    ``floor(log2 m)`` is ``frexp``'s exponent minus one; ``2^(3-E)`` (``E`` in [-6, 8]) is the fp32 whose
    exponent field is ``127 + 3 - E`` and whose fraction is zero. Int32 throughout, in place where possible.
    Matches torch's ``x.to(torch.float8_e4m3fn)`` for every finite input and ±inf.
    """
    x = x.float()
    if torch.isnan(x).any():
        raise NanEncodingError("cannot encode NaN into an FP4/FP8 format without NaN handling")
    m = x.abs().clamp_(max=E4M3_MAX)
    _, exp = torch.frexp(m)
    binade = exp.sub_(1).masked_fill_(m < 2.0**-6, -6)  # int32
    inverse_step = ((130 - binade) << 23).view(torch.float32)
    q = torch.round(m.mul_(inverse_step)).to(torch.int32)
    byte = binade.add_(6).mul_(8).add_(q).bitwise_or_(torch.signbit(x).to(torch.int32) << 7)
    return byte.to(torch.uint8)


def ue8m0_decode(
    b: torch.Tensor,
    byte0: Ue8m0Byte0 = Ue8m0Byte0.POW2,
    byte255: Ue8m0Byte255 = Ue8m0Byte255.NAN,
) -> torch.Tensor:
    """fp32 value ``2^(b - 127)`` of UE8M0 bytes, with bytes 0 and 0xFF per the conventions.

    The value depends on the byte ``b & 0xFF`` only: it is read from the 256 values :func:`_ue8m0_formula`
    gives (one lookup per byte, the same bits).
    """
    index = (b.to(torch.int32) & 0xFF).reshape(-1)
    return _ue8m0_values(b.device, byte0, byte255).index_select(0, index).view(b.shape)


@functools.cache
def _ue8m0_values(device: torch.device, byte0: Ue8m0Byte0, byte255: Ue8m0Byte255) -> torch.Tensor:
    """fp32 ``[256]``: :func:`_ue8m0_formula` of every byte."""
    return _ue8m0_formula(torch.arange(256, device=device), byte0, byte255)


def _ue8m0_formula(b: torch.Tensor, byte0: Ue8m0Byte0, byte255: Ue8m0Byte255) -> torch.Tensor:
    """:func:`ue8m0_decode`'s value of each byte, element by element."""
    v = b.to(torch.int64)
    val = torch.ldexp(torch.ones_like(v, dtype=torch.float64), v - UE8M0_BIAS).float()
    if byte0 is Ue8m0Byte0.ZERO:
        val = torch.where(v == 0, 0.0, val)
    special = torch.nan if byte255 is Ue8m0Byte255.NAN else torch.inf
    return torch.where(v == 0xFF, special, val)


def fp4_bytes_zero(packed: torch.Tensor) -> torch.Tensor:
    """Per packed byte: both E2M1 codes are zero, ``+0`` (0x0) or ``-0`` (0x8), i.e. ``byte & 0x77 == 0``."""
    return (packed & 0x77) == 0


def scale_bytes_finite(b: torch.Tensor, block: int) -> torch.Tensor:
    """Per byte: a finite block-scale code of the format ``block`` names (NVFP4 16: E4M3, NaN at
    0x7F / 0xFF, no Inf; MXFP4 32: UE8M0, 0xFF is NaN (OCP) or +Inf (FlashInfer's host decode))."""
    require(block in (NVFP4_BLOCK, MXFP4_BLOCK), f"no FP4 scale format has {block}-element blocks")
    return torch.isfinite(e4m3_decode(b) if block == NVFP4_BLOCK else ue8m0_decode(b))


def mx_scale_exponent(amax: torch.Tensor, rounding: MxScaleRounding) -> torch.Tensor:
    """Unbiased block exponent (int64) for an fp32 block ``amax >= 0``, clamped to [-127, 127].

    An all-zero block (amax 0) gets exponent -127, i.e. byte 0, as AITER and FlashInfer write.
    RCEIL works on the fp32-rounded quotient ``q = fp32(amax / 6)`` (the division's rounding
    matters); ``q`` is a power of two exactly when its ``frexp`` mantissa is 0.5.
    """
    amax = amax.float()
    require(bool((amax >= 0).all()), "mx_scale_exponent: amax must be non-negative")
    mant, exp = torch.frexp(amax)  # amax = mant · 2^exp, mant ∈ [0.5, 1)
    big_e = exp.to(torch.int64) - 1  # amax = m · 2^E with m = 2·mant ∈ [1, 2)
    m = 2 * mant
    if rounding is MxScaleRounding.FLOOR:
        e = big_e - 2
    elif rounding is MxScaleRounding.CEIL:
        e = torch.where(m == 1, big_e - 2, big_e - 1)
    elif rounding is MxScaleRounding.EVEN:
        e = torch.where(m < 1.75, big_e - 2, big_e - 1)
    elif rounding is MxScaleRounding.RCEIL:
        q_mant, q_exp = torch.frexp(amax / E2M1_MAX)
        e = torch.where(q_mant == 0.5, q_exp - 1, q_exp).to(torch.int64)
    else:
        raise ShapeContractError(f"unknown MX scale rounding {rounding!r}")
    e = torch.where(amax == 0, -UE8M0_BIAS, e)
    return e.clamp(-UE8M0_BIAS, UE8M0_BIAS)


@dataclass(frozen=True)
class Quantized:
    """A block-quantized FP4 tensor: packed codes ``[..., K/2]`` and scale bytes ``[..., K/block]``."""

    packed: torch.Tensor
    scales: torch.Tensor


def _blocks(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    k = x.shape[-1]
    if k % block:
        raise ShapeContractError(f"{what}: K = {k} is not a multiple of the {block}-element quantization block")
    return x.float().reshape(*x.shape[:-1], k // block, block)


def mxfp4_quantize(x: torch.Tensor, rounding: MxScaleRounding = MxScaleRounding.RCEIL) -> Quantized:
    """MXFP4-quantize ``x [..., K]`` (``K % 32 == 0``): UE8M0 scale ``2^e`` per 32 elements.

    ``e = mx_scale_exponent(amax_block, rounding)``; elements ``x / 2^e`` are rounded to E2M1
    (nearest even, saturating at ±6). Returns packed ``[..., K/2]`` and bytes ``e + 127``.
    """
    xb = _blocks(x, MXFP4_BLOCK, "mxfp4_quantize")
    e = mx_scale_exponent(xb.abs().amax(-1), rounding)
    y = xb / torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)[..., None]
    codes = e2m1_encode(y).reshape(x.shape)
    return Quantized(pack_fp4(codes), (e + UE8M0_BIAS).to(torch.uint8))


def mxfp4_dequantize(
    q: Quantized,
    byte0: Ue8m0Byte0 = Ue8m0Byte0.POW2,
    byte255: Ue8m0Byte255 = Ue8m0Byte255.NAN,
) -> torch.Tensor:
    """fp32 ``e2m1(code) · 2^(b - 127)`` for MXFP4 ``q``; ``[..., K]`` with ``K = 2·packed cols``."""
    return _dequantize(q, MXFP4_BLOCK, ue8m0_decode(q.scales, byte0, byte255))


def _dequantize(q: Quantized, block: int, scale: torch.Tensor) -> torch.Tensor:
    vals = e2m1_decode_packed(q.packed)
    k = vals.shape[-1]
    require(
        q.scales.shape == (*vals.shape[:-1], k // block) and k % block == 0,
        f"dequantize: scales {tuple(q.scales.shape)} do not match codes "
        f"{tuple(vals.shape)} with {block}-element blocks",
    )
    blocks = vals.reshape(*vals.shape[:-1], k // block, block)
    return (blocks * scale[..., None]).reshape(vals.shape)


def _decode_multiplier(global_scale: torch.Tensor | float, convention: GlobalScale) -> torch.Tensor:
    g = torch.as_tensor(global_scale, dtype=torch.float32)
    require(bool(torch.isfinite(g).all() and (g > 0).all()), "NVFP4 global scale must be finite and > 0")
    return g if convention is GlobalScale.DECODE else 1 / g


def nvfp4_global_scale(x: torch.Tensor, convention: GlobalScale) -> torch.Tensor:
    """Per-tensor NVFP4 scale of ``x`` in the named convention: ``448·6/amax`` or ``amax/(448·6)``."""
    amax = x.float().abs().amax()
    require(bool(amax > 0), "nvfp4_global_scale: tensor is all zeros")
    encode = (E4M3_MAX * E2M1_MAX) / amax
    return encode if convention is GlobalScale.ENCODE else 1 / encode


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor | float, convention: GlobalScale) -> Quantized:
    """NVFP4-quantize ``x [..., K]`` (``K % 16 == 0``) with a per-tensor global scale.

    With the encode multiplier ``gs`` (``convention`` converts a decode scale to it):
    ``sf = E4M3(gs · amax_block / 6)`` (saturating), ``y = x · (gs / sf)``, code ``= E2M1(y)``;
    a zero ``sf`` gives ``y = 0``. Returns packed ``[..., K/2]`` and E4M3 bytes ``[..., K/16]``.
    """
    xb = _blocks(x, NVFP4_BLOCK, "nvfp4_quantize")
    gs = 1 / _decode_multiplier(global_scale, convention)
    sf_bytes = e4m3_encode(gs * (xb.abs().amax(-1) / E2M1_MAX))
    sf = e4m3_decode(sf_bytes)
    mult = torch.where(sf == 0, torch.zeros_like(sf), gs / torch.where(sf == 0, 1, sf))
    codes = e2m1_encode(xb * mult[..., None]).reshape(x.shape)
    return Quantized(pack_fp4(codes), sf_bytes)


def nvfp4_dequantize(
    q: Quantized,
    global_scale: torch.Tensor | float,
    convention: GlobalScale,
    sign: E4m3Sign = E4m3Sign.IGNORED,
) -> torch.Tensor:
    """fp32 ``e2m1(code) · (sf · g)`` with ``g`` the decode multiplier (``1/gs`` for ENCODE).

    ``(sf · g)`` is formed first, as FlashInfer's host dequant does, for bit-exact comparison.
    """
    g = _decode_multiplier(global_scale, convention)
    return _dequantize(q, NVFP4_BLOCK, e4m3_decode(q.scales, sign) * g)
