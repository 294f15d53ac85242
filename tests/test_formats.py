"""Self-tests of ``reference/formats.py``: codebooks, scale decoders, encoders, MX scale rounding.

Cross-checks and their source of truth:

* E2M1 codebook, all 16 codes: the field formula of docs/formats.md §1 (sign bit 3, code 8 = -0.0)
  and ``ml_dtypes.float4_e2m1fn`` (an independent implementation).
* E2M1 encode (round to nearest even, saturate at ±6): the tie table of docs/formats.md §8, and
  ``ml_dtypes.float4_e2m1fn``'s cast (itself verified to be RNE against that table) over
  Hypothesis-drawn fp32 values including exact ties, their neighbours, subnormals, ±inf, -0.0.
  torch 2.13 has no value conversion for ``float4_e2m1fn_x2`` on CPU (``copy_`` is not
  implemented), so torch is used for the packed container only.
* Nibble packing (low nibble = even element): all 256 code pairs against docs/formats.md §2 and the
  c10 ``Float4_e2m1fn_x2`` header (``val1 : val0`` in bits ``7654 : 3210``); the packed uint8
  tensor views as ``torch.float4_e2m1fn_x2`` with the same ``[..., K/2]`` shape and bytes.
* E4M3 decode, all 256 bytes: ``view(torch.float8_e4m3fn)`` and ``ml_dtypes.float8_e4m3fn``;
  the sign conventions (torch signed, cuBLAS UE4M3 ignoring bit 7) against each other.
* E4M3 encode: ``x.to(torch.float8_e4m3fn)`` (RNE, saturating, ±inf -> ±448) over every tie
  and drawn fp32 values; ``ml_dtypes`` where it does not overflow (it returns NaN above 464).
* UE8M0 decode, all 256 bytes, for every (byte 0, byte 0xFF) convention: OCP via
  ``view(torch.float8_e8m0fnu)`` and ``ml_dtypes.float8_e8m0fnu``; FlashInfer's host decode via
  the fp32 bit pattern ``b << 23`` (0 -> 0.0, 0xFF -> +Inf); ``torch.exp2(b - 127)``.
* MX scale rounding: AITER's checked-example table of docs/formats.md §7, and each mode's definition
  re-derived from fp32 bit arithmetic (AITER modes 0-2) or exact powers of two (CEIL) over
  drawn amax; the documented disagreement sets RCEIL/EVEN, RCEIL/FLOOR, CEIL/RCEIL.
* Quantize-dequantize (MXFP4, every rounding mode; NVFP4, both global-scale conventions): the
  result is a nearest point of the E2M1 grid times the block scale (MXFP4, ties to even) and
  within half a grid step times the block scale, plus the clip excess where the mode saturates.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, note
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.formats import (
    E2M1_MAGNITUDES,
    E4M3_MAX,
    E4M3_MAX_BYTE,
    MXFP4_BLOCK,
    NVFP4_BLOCK,
    UE8M0_BIAS,
    E4m3Sign,
    GlobalScale,
    MxScaleRounding,
    Quantized,
    Ue8m0Byte0,
    Ue8m0Byte255,
    e2m1_decode,
    e2m1_decode_packed,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    mx_scale_exponent,
    mxfp4_dequantize,
    mxfp4_quantize,
    nvfp4_dequantize,
    nvfp4_global_scale,
    nvfp4_quantize,
    pack_fp4,
    ue8m0_decode,
    unpack_fp4,
)

ALL_BYTES = torch.arange(256).to(torch.uint8)
ALL_CODES = torch.arange(16).to(torch.uint8)
FP32_MAX = torch.finfo(torch.float32).max


@pytest.fixture(scope="module")
def mld():
    """The ``ml_dtypes`` module (an independent implementation of the OCP/FP8 formats)."""
    return pytest.importorskip("ml_dtypes")


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, inputs: torch.Tensor, what: str) -> None:
    """fp32 bit equality (so -0.0 != 0.0), any NaN matching any NaN; names the first mismatches."""
    got, want = got.float().reshape(-1), want.float().reshape(-1)
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    bad = (nan_g != nan_w) | (~nan_g & ~nan_w & (got.view(torch.int32) != want.view(torch.int32)))
    if bad.any():
        idx = bad.nonzero().flatten()[:6].tolist()
        rows = ", ".join(
            f"{inputs.reshape(-1)[i].item()!r}: got {got[i].item()!r}, want {want[i].item()!r}" for i in idx
        )
        raise AssertionError(f"{what}: {int(bad.sum())} mismatches, e.g. {rows}")


def fp32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fp32(x: float) -> float:
    """Round a Python float to fp32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- E2M1 codebook and packing ------------------------------------------------------------------


def test_e2m1_codebook_matches_field_formula() -> None:
    """Sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; subnormal 0.5·f (docs/formats.md §1)."""
    want = []
    for c in range(16):
        e, f = (c >> 1) & 3, c & 1
        mag = 0.5 * f if e == 0 else 2.0 ** (e - 1) * (1 + f / 2)
        want.append(-mag if c & 8 else mag)
    assert [abs(v) for v in want[:8]] == list(E2M1_MAGNITUDES)
    assert_same_bits(e2m1_decode(ALL_CODES), torch.tensor(want), ALL_CODES, "e2m1_decode vs field formula")
    assert torch.signbit(e2m1_decode(torch.tensor([8], dtype=torch.uint8))).item(), "code 8 must decode to -0.0"


def test_e2m1_codebook_matches_ml_dtypes(mld) -> None:
    want = torch.from_numpy(ALL_CODES.numpy().view(mld.float4_e2m1fn).astype("float32"))
    assert_same_bits(e2m1_decode(ALL_CODES), want, ALL_CODES, "e2m1_decode vs ml_dtypes float4_e2m1fn")


def test_pack_fp4_low_nibble_first_for_every_code_pair() -> None:
    """``byte = code[2j] | code[2j+1] << 4`` for all 256 pairs; unpack is the inverse (docs/formats.md §2)."""
    even, odd = ALL_BYTES & 0xF, ALL_BYTES >> 4
    codes = torch.stack((even, odd), dim=-1)  # [256, 2]: row b holds the pair that packs into byte b
    assert torch.equal(pack_fp4(codes), ALL_BYTES[:, None])
    assert torch.equal(unpack_fp4(ALL_BYTES[:, None]), codes)


def test_e2m1_decode_packed_is_decode_of_unpack_for_every_byte() -> None:
    """The byte lookup used by the dequantizers equals ``e2m1_decode(unpack_fp4(.))`` bit for bit
    (signed zeros included), for all 256 bytes and a multi-dimensional tensor."""
    packed = torch.cat((ALL_BYTES, ALL_BYTES.flip(0))).reshape(2, 4, 64)
    want = e2m1_decode(unpack_fp4(packed))
    assert torch.equal(e2m1_decode_packed(packed).view(torch.int32), want.view(torch.int32))
    with pytest.raises(ShapeContractError, match="uint8"):
        e2m1_decode_packed(torch.zeros(2, 3, dtype=torch.int32))


def test_packed_bytes_view_as_torch_float4_x2() -> None:
    """A packed ``[..., K/2]`` uint8 tensor is exactly torch's ``float4_e2m1fn_x2`` container.

    The c10 header documents ``val0`` in bits 3..0 (our even element); torch 2.13 CPU has no
    value kernels for this dtype, so only the container (shape, itemsize, bytes) is checked.
    """
    codes = torch.arange(2 * 3 * 8).reshape(2, 3, 8).remainder(16).to(torch.uint8)
    packed = pack_fp4(codes)
    x2 = packed.view(torch.float4_e2m1fn_x2)
    assert x2.shape == (2, 3, 4) and x2.element_size() == 1
    assert torch.equal(x2.view(torch.uint8), packed)
    assert torch.equal(unpack_fp4(x2.view(torch.uint8)), codes)


def test_packing_rejects_bad_input() -> None:
    with pytest.raises(ShapeContractError, match="even"):
        pack_fp4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ShapeContractError, match="uint8"):
        unpack_fp4(torch.zeros(2, 3, dtype=torch.int32))


# --- E2M1 encode --------------------------------------------------------------------------------

E2M1_TIES = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0, 5.9: 6.0, 7.0: 6.0}
"""docs/formats.md §8: ties to even, then saturation."""


def grid_and_neighbours(values: list[float]) -> list[float]:
    """Each fp32 value, its midpoints with the next value, and the fp32 neighbours of both, ± signs."""
    pts = torch.tensor(sorted(set(values)), dtype=torch.float32)
    pts = torch.cat((pts, (pts[:-1] + pts[1:]) / 2))
    up, down = torch.full_like(pts, math.inf), torch.full_like(pts, -math.inf)
    pts = torch.cat((pts, torch.nextafter(pts, up), torch.nextafter(pts, down)))
    return torch.cat((pts, -pts)).tolist()


E2M1_PROBES = grid_and_neighbours([*E2M1_MAGNITUDES, 12.0])
E4M3_PROBES = grid_and_neighbours([*e4m3_decode(torch.arange(0x7F)).tolist(), 480.0, 1e6])
SPECIALS = [0.0, -0.0, math.inf, -math.inf, 1e-40, -1e-40, 2.0**-149, FP32_MAX, -FP32_MAX]


def fp32_values(probes: list[float]) -> st.SearchStrategy[list[float]]:
    """Lists of fp32 values: arbitrary (inf, subnormals, -0.0 included) or on/next to a tie."""
    anything = st.floats(width=32, allow_nan=False)
    tie = st.sampled_from(probes)
    scaled_tie = st.builds(lambda v, k: fp32(math.ldexp(v, k)), tie, st.integers(-12, 12))
    return st.lists(st.one_of(anything, tie, scaled_tie, st.sampled_from(SPECIALS)), min_size=1, max_size=64)


@pytest.mark.parametrize(("x", "want"), sorted(E2M1_TIES.items()))
def test_e2m1_encode_tie_table(x: float, want: float) -> None:
    for sign in (1.0, -1.0):
        got = e2m1_decode(e2m1_encode(torch.tensor([sign * x])))
        assert got.item() == sign * want, f"e2m1({sign * x}) = {got.item()}, docs/formats.md §8 says {sign * want}"


def test_e2m1_encode_signs_small_negatives_as_minus_zero() -> None:
    assert e2m1_encode(torch.tensor([-0.25, -0.0, -1e-40, -0.3])).tolist() == [8, 8, 8, 9]


def test_ml_dtypes_e2m1_cast_rounds_to_nearest_even(mld) -> None:
    """ml_dtypes is only an oracle if it is RNE with saturation: check it against docs/formats.md §8."""
    import numpy as np

    xs = np.array(list(E2M1_TIES), dtype=np.float32)
    got = np.concatenate((xs, -xs)).astype(mld.float4_e2m1fn).astype(np.float32)
    want = np.array(list(E2M1_TIES.values()) + [-v for v in E2M1_TIES.values()], dtype=np.float32)
    assert (got == want).all(), f"ml_dtypes float4_e2m1fn cast is not RNE: {got} vs {want}"


@given(values=fp32_values(E2M1_PROBES))
def test_e2m1_encode_matches_ml_dtypes(values: list[float], mld) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    want = torch.from_numpy(x.numpy().astype(mld.float4_e2m1fn).view("uint8").copy())
    got = e2m1_encode(x)
    assert torch.equal(got, want), (
        f"e2m1_encode vs ml_dtypes: x={x[got != want].tolist()}, got {got[got != want].tolist()}, ml_dtypes {want[got != want].tolist()}"
    )


def test_encoders_refuse_nan() -> None:
    for encode in (e2m1_encode, e4m3_encode):
        with pytest.raises(ShapeContractError, match="NaN"):
            encode(torch.tensor([1.0, math.nan]))


# --- E4M3 ----------------------------------------------------------------------------------------


def test_e4m3_decode_all_bytes_matches_torch() -> None:
    want = ALL_BYTES.view(torch.float8_e4m3fn).float()
    assert_same_bits(e4m3_decode(ALL_BYTES, E4m3Sign.SIGNED), want, ALL_BYTES, "e4m3_decode vs torch float8_e4m3fn")


def test_e4m3_decode_all_bytes_matches_ml_dtypes(mld) -> None:
    want = torch.from_numpy(ALL_BYTES.numpy().view(mld.float8_e4m3fn).astype("float32"))
    assert_same_bits(e4m3_decode(ALL_BYTES, E4m3Sign.SIGNED), want, ALL_BYTES, "e4m3_decode vs ml_dtypes")


def test_e4m3_documented_bytes() -> None:
    """docs/formats.md §4: max 448 at 0x7E, 2^-9 at 0x01, 1.0 at 0x38, NaN only at 0x7F/0xFF, 0x80 = -0.0."""
    v = e4m3_decode(ALL_BYTES, E4m3Sign.SIGNED)
    assert v[0x7E].item() == E4M3_MAX == v[:0x7F].max().item()
    assert v[0x01].item() == 2.0**-9 and v[0x38].item() == 1.0
    assert torch.isnan(v).nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert v[0x80].item() == 0.0 and torch.signbit(v[0x80]).item()


def test_e4m3_sign_conventions() -> None:
    """SIGNED reads bit 7 as the sign (torch); IGNORED drops it (cuBLAS UE4M3)."""
    low = ALL_BYTES[:128]
    signed = e4m3_decode(low, E4m3Sign.SIGNED)
    assert_same_bits(e4m3_decode(low | 0x80, E4m3Sign.SIGNED), -signed, low, "SIGNED: b | 0x80 decodes to -decode(b)")
    assert_same_bits(e4m3_decode(low | 0x80, E4m3Sign.IGNORED), signed, low, "IGNORED: bit 7 dropped")
    assert_same_bits(e4m3_decode(low, E4m3Sign.IGNORED), signed, low, "IGNORED equals SIGNED below 0x80")


TORCH_E4M3_CAST_SATURATES = torch.tensor([1e6]).to(torch.float8_e4m3fn).view(torch.uint8).item() == E4M3_MAX_BYTE
"""torch 2.13 saturates out-of-range casts to ±448 (``docs/formats.md`` §4); torch 2.11 (2.11.0+cu130, which the
H200 runs used) gives NaN. The reference saturates, as the kernels' SATFINITE cast does, so the torch oracle is
compared everywhere only where torch saturates, else within ``|x| <= 464`` (the last value that
rounds to 448), and the saturation itself is checked against the spec."""


def assert_matches_torch_cast(x: torch.Tensor) -> None:
    got, want = e4m3_encode(x), x.to(torch.float8_e4m3fn).view(torch.uint8)
    in_range = torch.ones_like(x, dtype=torch.bool) if TORCH_E4M3_CAST_SATURATES else x.abs() <= 464
    bad = (got != want) & in_range
    assert not bad.any(), f"e4m3_encode vs torch cast at x={x[bad].tolist()}"
    beyond = x[~in_range]
    assert torch.equal(e4m3_encode(beyond), E4M3_MAX_BYTE | (torch.signbit(beyond).to(torch.uint8) << 7)), (
        "out-of-range values must saturate to ±448"
    )


def test_e4m3_encode_matches_torch_cast_on_every_tie() -> None:
    assert_matches_torch_cast(torch.tensor(E4M3_PROBES + SPECIALS, dtype=torch.float32))


@given(values=fp32_values(E4M3_PROBES))
def test_e4m3_encode_matches_torch_cast(values: list[float]) -> None:
    assert_matches_torch_cast(torch.tensor(values, dtype=torch.float32))


@given(values=fp32_values(E4M3_PROBES))
def test_e4m3_encode_matches_ml_dtypes_in_range(values: list[float], mld) -> None:
    """ml_dtypes overflows to NaN instead of saturating, so compare where ``|x| <= 448``."""
    x = torch.tensor(values, dtype=torch.float32)
    x = x[x.abs() <= E4M3_MAX]
    want = torch.from_numpy(x.numpy().astype(mld.float8_e4m3fn).view("uint8").copy())
    got = e4m3_encode(x)
    assert torch.equal(got, want), f"e4m3_encode vs ml_dtypes at x={x[got != want].tolist()}"


def test_e4m3_encode_sign_is_bit_7() -> None:
    x = torch.tensor([v for v in E4M3_PROBES + SPECIALS if not math.copysign(1, v) < 0], dtype=torch.float32)
    assert torch.equal(e4m3_encode(-x), e4m3_encode(x) | 0x80)


# --- UE8M0 ---------------------------------------------------------------------------------------

CONVENTIONS = [(b0, b255) for b0 in Ue8m0Byte0 for b255 in Ue8m0Byte255]


@pytest.mark.parametrize(("byte0", "byte255"), CONVENTIONS, ids=lambda c: c.name)
def test_ue8m0_decode_all_bytes(byte0: Ue8m0Byte0, byte255: Ue8m0Byte255) -> None:
    """Bytes 1..254 are 2^(b-127) exactly (torch float8_e8m0fnu); bytes 0 and 0xFF per convention."""
    got = ue8m0_decode(ALL_BYTES, byte0, byte255)
    ocp = ALL_BYTES.view(torch.float8_e8m0fnu).float()
    assert_same_bits(got[1:255], ocp[1:255], ALL_BYTES[1:255], "ue8m0_decode vs torch float8_e8m0fnu")
    assert fp32_bits(got[0].item()) == (0x00400000 if byte0 is Ue8m0Byte0.POW2 else 0), "byte 0"
    assert (math.isnan if byte255 is Ue8m0Byte255.NAN else lambda v: v == math.inf)(got[255].item()), "byte 0xFF"
    assert got[UE8M0_BIAS].item() == 1.0


def test_ue8m0_ocp_matches_torch_and_ml_dtypes(mld) -> None:
    got = ue8m0_decode(ALL_BYTES, Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)
    assert_same_bits(got, ALL_BYTES.view(torch.float8_e8m0fnu).float(), ALL_BYTES, "OCP vs torch")
    want = torch.from_numpy(ALL_BYTES.numpy().view(mld.float8_e8m0fnu).astype("float32"))
    assert_same_bits(got, want, ALL_BYTES, "OCP vs ml_dtypes float8_e8m0fnu")


def test_ue8m0_flashinfer_host_convention_is_b_shl_23() -> None:
    """FlashInfer's ``E2M1AndUFP8SFScaleToFloatV2`` reads UE8M0 as the fp32 bit pattern ``b << 23``."""
    got = ue8m0_decode(ALL_BYTES, Ue8m0Byte0.ZERO, Ue8m0Byte255.INF)
    want = (ALL_BYTES.to(torch.int32) << 23).view(torch.float32)
    assert_same_bits(got, want, ALL_BYTES, "ZERO/INF vs b << 23")


def test_ue8m0_exp2_convention() -> None:
    """``torch.exp2(b - 127)`` in fp32 is the mixed convention: 2^-127 and +Inf (docs/formats.md §5)."""
    got = ue8m0_decode(ALL_BYTES, Ue8m0Byte0.POW2, Ue8m0Byte255.INF)
    assert_same_bits(got, torch.exp2(ALL_BYTES.float() - 127), ALL_BYTES, "POW2/INF vs exp2")


# --- MX scale-exponent rounding -----------------------------------------------------------------

AITER_EXAMPLES = [
    (MxScaleRounding.EVEN, 1.5, 125),
    (MxScaleRounding.EVEN, 1.7, 125),
    (MxScaleRounding.EVEN, 1.7499, 125),
    (MxScaleRounding.EVEN, 1.75, 126),
    (MxScaleRounding.EVEN, 0.0, 0),
    (MxScaleRounding.EVEN, 7.0, 128),
    (MxScaleRounding.EVEN, 1e-40, 0),
    (MxScaleRounding.RCEIL, 1.5, 125),
    (MxScaleRounding.RCEIL, 1.7, 126),
    (MxScaleRounding.RCEIL, 0.0, 0),
    (MxScaleRounding.RCEIL, 7.0, 128),
    # AITER RoundUp gives byte 1 for 1e-40 (denormal quotient); the reference clamps e to -127
    # (byte 0) as FlashInfer's ceil(log2(amax/6)).clamp(-127, 127) does: not pinned here.
    (MxScaleRounding.FLOOR, 7.0, 127),
]


@pytest.mark.parametrize(("mode", "amax", "byte"), AITER_EXAMPLES, ids=lambda v: getattr(v, "name", str(v)))
def test_mx_scale_aiter_checked_examples(mode: MxScaleRounding, amax: float, byte: int) -> None:
    got = mx_scale_exponent(torch.tensor([amax]), mode).item() + UE8M0_BIAS
    assert got == byte, f"{mode.name}: amax {amax} -> byte {got}, AITER's checked example says {byte}"


def fp32_field(x: float) -> tuple[int, int]:
    """(exponent field, mantissa field) of fp32 ``x``."""
    bits = fp32_bits(x)
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def definition_byte(amax: float, mode: MxScaleRounding) -> int:
    """Scale byte of fp32 ``amax`` (normal, with a normal ``amax/6``) from each mode's definition.

    FLOOR (AITER RoundDown): exponent field of fp32 ``amax/4``. RCEIL (AITER RoundUp): exponent
    field of ``q = fp32(amax/6)``, +1 if any mantissa bit is set. EVEN (AITER mode 2): fp32 bits
    of amax plus 0x200000, masked to the exponent, divided by 4. CEIL: smallest ``e`` with
    ``amax <= 4·2^e``, i.e. ``ceil(log2 amax) - 2``, found by exact power-of-two comparison.
    """
    if mode is MxScaleRounding.FLOOR:
        return fp32_field(fp32(amax / 4))[0]
    if mode is MxScaleRounding.RCEIL:
        exp, mant = fp32_field(fp32(amax / 6))
        return exp + (mant != 0)
    if mode is MxScaleRounding.EVEN:
        return (((fp32_bits(amax) + 0x200000) >> 23) & 0xFF) - 2
    e = math.frexp(amax)[1] - 3
    while math.ldexp(4.0, e - 1) >= amax:
        e -= 1
    while math.ldexp(4.0, e) < amax:
        e += 1
    return e + UE8M0_BIAS


MIN_AMAX = fp32(6 * 2.0**-126)  # amax/6 normal and no exponent clamping in any mode
THRESHOLDS = (1.0, 1.5, 1.75, 2.0)


def near_thresholds() -> st.SearchStrategy[float]:
    """``m·2^E`` with ``m`` on or one fp32 ulp around 1, 1.5, 1.75 (and just below 2)."""
    ulp = 2.0**-23

    def near_threshold(t: float, k: int, exp: int) -> float:
        m = min(max(t + k * ulp * (0.5 if t == 2.0 else 1), 1.0), 2 - ulp)
        return fp32(math.ldexp(m, exp))

    return st.builds(near_threshold, st.sampled_from(THRESHOLDS), st.integers(-2, 2), st.integers(-120, 126))


AMAX = st.one_of(
    st.floats(min_value=MIN_AMAX, max_value=FP32_MAX, width=32, allow_subnormal=False),
    near_thresholds(),
)


@given(amax=st.lists(AMAX, min_size=1, max_size=32), mode=st.sampled_from(MxScaleRounding))
def test_mx_scale_matches_mode_definitions(amax: list[float], mode: MxScaleRounding) -> None:
    got = (mx_scale_exponent(torch.tensor(amax), mode) + UE8M0_BIAS).tolist()
    want = [definition_byte(a, mode) for a in amax]
    bad = [(a, g, w) for a, g, w in zip(amax, got, want, strict=True) if g != w]
    assert not bad, f"{mode.name}: (amax, reference byte, definition byte) {bad[:5]}"


def mantissa(amax: float) -> float:
    """``m`` in ``amax = m·2^E``, ``m ∈ [1, 2)``."""
    return 2 * math.frexp(amax)[0]


@given(amax=st.lists(AMAX, min_size=1, max_size=32))
def test_mx_modes_disagree_exactly_where_documented(amax: list[float]) -> None:
    """docs/formats.md §7: RCEIL≠EVEN iff 1.5 < m < 1.75; RCEIL≠FLOOR iff m > 1.5; CEIL≠RCEIL iff 1 < m ≤ 1.5."""
    t = torch.tensor(amax)
    e = {mode: mx_scale_exponent(t, mode).tolist() for mode in MxScaleRounding}
    r = MxScaleRounding
    for i, a in enumerate(amax):
        m = mantissa(a)
        note(f"amax {a!r}, m {m!r}, exponents { {k.name: v[i] for k, v in e.items()} }")
        assert (e[r.RCEIL][i] != e[r.EVEN][i]) == (1.5 < m < 1.75), f"RCEIL vs EVEN at amax {a!r} (m = {m!r})"
        assert (e[r.RCEIL][i] != e[r.FLOOR][i]) == (m > 1.5), f"RCEIL vs FLOOR at amax {a!r} (m = {m!r})"
        assert (e[r.CEIL][i] != e[r.RCEIL][i]) == (1 < m <= 1.5), f"CEIL vs RCEIL at amax {a!r} (m = {m!r})"


def test_mx_scale_zero_block_and_bad_amax() -> None:
    for mode in MxScaleRounding:
        assert mx_scale_exponent(torch.zeros(3), mode).tolist() == [-UE8M0_BIAS] * 3
        for bad in (-1.0, math.nan):
            with pytest.raises(ShapeContractError):
                mx_scale_exponent(torch.tensor([1.0, bad]), mode)


# --- quantize / dequantize ------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockData:
    """``rows x blocks`` quantization blocks; each block gets a random power-of-two magnitude."""

    rows: int
    blocks: int
    spread: int
    seed: int

    def tensor(self, block: int) -> torch.Tensor:
        """Half the blocks are ``k/8`` grids (many exact E2M1 ties after scaling), half Gaussian."""
        g = torch.Generator().manual_seed(self.seed)
        shape = (self.rows, self.blocks, block)
        gauss = torch.randn(shape, generator=g)
        dyadic = torch.randint(-48, 49, shape, generator=g) / 8
        x = torch.where(torch.rand(self.rows, self.blocks, 1, generator=g) < 0.5, dyadic, gauss)
        exps = torch.randint(-self.spread, self.spread + 1, (self.rows, self.blocks, 1), generator=g)
        return torch.ldexp(x, exps).reshape(self.rows, self.blocks * block).float()


def block_data(max_spread: int) -> st.SearchStrategy[BlockData]:
    return st.builds(BlockData, st.integers(1, 4), st.integers(1, 4), st.integers(0, max_spread), st.integers(0, 2**16))


GRID = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)


def half_step_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scale · (h(min(y, 6)) + max(0, y - 6))`` with ``y = |x|/scale`` and ``h`` half the E2M1
    grid spacing around ``y`` (0.25 up to 2, 0.5 up to 4, 1 up to 6): the error of an exact RNE
    quantizer plus the clip excess of a saturating scale."""
    y = x.abs() / scale
    half = torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, 1.0))
    return scale * (half + (y - 6).clamp(min=0))


def expand(per_block: torch.Tensor, block: int) -> torch.Tensor:
    return per_block.double().repeat_interleave(block, dim=-1)


@given(data=block_data(max_spread=30), mode=st.sampled_from(MxScaleRounding))
@example(data=BlockData(1, 1, 0, 0), mode=MxScaleRounding.FLOOR)
def test_mxfp4_quantize_dequantize_error(data: BlockData, mode: MxScaleRounding) -> None:
    """Every element dequantizes to a nearest point of ``±E2M1 · 2^e`` (ties to the even code),
    within half a grid step of ``x`` plus the clip excess; RCEIL and CEIL never clip."""
    x = data.tensor(MXFP4_BLOCK)
    q = mxfp4_quantize(x, mode)
    deq, xd = mxfp4_dequantize(q).double(), x.double()
    scale = expand(ue8m0_decode(q.scales), MXFP4_BLOCK)
    err = (deq - xd).abs()
    dist = (torch.cat((GRID, -GRID)) * scale[..., None] - xd[..., None]).abs()
    nearest = dist.min(-1).values
    note(f"x {x.tolist()}\nscale bytes {q.scales.tolist()}")
    assert torch.equal(err, nearest), f"{mode.name}: not a nearest grid point at x={xd[err != nearest].tolist()[:4]}"
    ties = (dist == nearest[..., None]).sum(-1) > 1
    codes = unpack_fp4(q.packed)
    assert not (ties & (codes & 1 == 1)).any(), f"{mode.name}: a tie rounded to an odd code"
    bound = half_step_bound(xd, scale)
    assert bool((err <= bound).all()), f"{mode.name}: error above half a step at x={xd[err > bound].tolist()[:4]}"
    if mode in (MxScaleRounding.RCEIL, MxScaleRounding.CEIL):
        assert bool((xd.abs() <= 6 * scale).all()), f"{mode.name} clipped an element"


@dataclass(frozen=True)
class Nvfp4Case:
    data: BlockData
    power_of_two: int | None  # None: gs from the tensor amax; k: encode scale 2^k (may saturate)


@given(case=st.builds(Nvfp4Case, block_data(max_spread=6), st.none() | st.integers(-12, 12)))
def test_nvfp4_quantize_dequantize_error(case: Nvfp4Case) -> None:
    """NVFP4 error ≤ half a step times the block scale ``sf·g`` (+ clip excess) in both conventions.

    Slack: the quantizer forms ``y = x·fp32(gs/sf)`` in fp32 (so a tie may go either way, the
    half-step bound still holds up to 2^-20 relative) and the dequantizer ``code·fp32(sf·g)``
    (one fp32 rounding, 2^-23 of |deq|). A block whose scale underflows to E4M3 0 must have
    ``gs·amax/6 <= 2^-10`` and dequantize to 0.
    """
    x = case.data.tensor(NVFP4_BLOCK)
    xd = x.double()
    enc = (
        nvfp4_global_scale(x, GlobalScale.ENCODE) if case.power_of_two is None else torch.tensor(2.0**case.power_of_two)
    )
    for convention, gs in ((GlobalScale.ENCODE, enc), (GlobalScale.DECODE, 1 / enc)):
        q = nvfp4_quantize(x, gs, convention)
        deq = nvfp4_dequantize(q, gs, convention).double()
        sf = expand(e4m3_decode(q.scales), NVFP4_BLOCK)
        scale = sf / enc.double()
        err = (deq - xd).abs()
        zero = sf == 0
        bound = half_step_bound(xd, scale.where(~zero, 1.0)) * (1 + 2.0**-20) + deq.abs() * 2.0**-23
        ok = torch.where(zero, (deq == 0) & (xd.abs() * enc.double() / 6 <= 2.0**-10), err <= bound)
        note(f"{convention.name}: gs {enc.item()!r}, scale bytes {q.scales.tolist()}")
        assert bool(ok.all()), (
            f"{convention.name}: error bound broken at x={xd[~ok].tolist()[:4]}, deq={deq[~ok].tolist()[:4]}"
        )


@given(data=block_data(max_spread=8), gs=st.floats(2.0**-10, 2.0**13, width=32))
def test_nvfp4_global_scale_conventions_agree(data: BlockData, gs: float) -> None:
    """An encode scale ``gs`` and its fp32 reciprocal as a decode scale give identical bytes and values."""
    x = data.tensor(NVFP4_BLOCK)
    enc = torch.tensor(gs, dtype=torch.float32)
    dec = 1 / enc
    a, b = nvfp4_quantize(x, enc, GlobalScale.ENCODE), nvfp4_quantize(x, dec, GlobalScale.DECODE)
    assert torch.equal(a.packed, b.packed) and torch.equal(a.scales, b.scales)
    da, db = nvfp4_dequantize(a, enc, GlobalScale.ENCODE), nvfp4_dequantize(b, dec, GlobalScale.DECODE)
    assert_same_bits(da, db, x, "dequantized values differ between conventions")
    assert_same_bits(
        nvfp4_global_scale(x, GlobalScale.DECODE), 1 / nvfp4_global_scale(x, GlobalScale.ENCODE), x[:1, :1], "gs"
    )


def test_quantizers_reject_bad_shapes_and_scales() -> None:
    with pytest.raises(ShapeContractError, match="32-element"):
        mxfp4_quantize(torch.ones(2, 48))
    with pytest.raises(ShapeContractError, match="16-element"):
        nvfp4_quantize(torch.ones(2, 24), 1.0, GlobalScale.DECODE)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ShapeContractError, match="global scale"):
            nvfp4_quantize(torch.ones(1, 16), bad, GlobalScale.ENCODE)
    with pytest.raises(ShapeContractError, match="all zeros"):
        nvfp4_global_scale(torch.zeros(4), GlobalScale.ENCODE)
    q = mxfp4_quantize(torch.ones(2, 64))
    with pytest.raises(ShapeContractError, match="do not match"):
        mxfp4_dequantize(Quantized(q.packed, q.scales[:, :1]))
