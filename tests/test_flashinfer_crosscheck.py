"""Agreement of ``reference/`` with the real FlashInfer 0.7.4 code (the library is the truth).

CPU (pure-torch FlashInfer helpers, marker ``flashinfer``), bit-exact over drawn shapes, and
for every shape either both accept or both refuse (FlashInfer asserts / raises ``ValueError``,
the reference raises :class:`ShapeContractError`):

* ``flashinfer.utils.get_shuffle_matrix_a_row_indices`` vs ``trtllm_row_shuffle`` (tiles 32..256);
* ``flashinfer.utils.get_shuffle_matrix_sf_a_row_indices`` vs ``trtllm_scale_row_shuffle``;
* ``fused_moe.core.get_reorder_rows_for_gated_act_gemm_row_indices`` vs ``gated_reorder``;
* ``fused_moe.core._maybe_get_cached_w3_w1_permute_indices`` vs ``fc1_permutation`` and
  ``get_w2_permute_indices_with_cache`` vs ``fc2_permutation`` (weight and scale variants);
* ``fused_moe.core.deinterleave_gated_rows(x, 1)`` vs ``deinterleave_rows`` (and it undoes
  ``gated_reorder``);
* ``fused_moe.prepare.interleave_moe_scales_for_sm90_mixed_gemm`` vs
  ``sm90_mixed_gemm_scale_interleave``;
* ``fused_moe.core.pad_trtllm_moe_weights`` vs ``reference.padding.pad_fused_rows`` per half +
  ``pad_dim`` (weights 0, scales the neutral 1.0 byte: E4M3 0x38 / UE8M0 127), and the padded
  elements dequantize to exactly 0;
* ``quantization.fp4_quantization._e2m1_and_ufp8sf_scale_to_float_cpu`` (FlashInfer's pure-torch
  dequant fallback) vs ``nvfp4_dequantize`` / ``mxfp4_dequantize``: nibble order, E2M1 LUT,
  signed E4M3, and UE8M0 as ``pow(2, b - 127)`` (byte 0 -> 2^-127, 0xFF -> +Inf).

GPU (markers ``cuda`` + ``flashinfer``; run on an NVIDIA GPU):

* the CUDA ``block_scale_interleave`` kernel vs ``swizzle_128x4`` (2-D and 3-D, uint8 and bf16,
  M not a multiple of 128), bit-exact;
* the C++ host dequant ``e2m1_and_ufp8sf_scale_to_float`` (``fp4Op.cpp``
  ``E2M1AndUFP8SFScaleToFloatV2``, linear layout) vs the reference with FlashInfer's conventions:
  NVFP4 E4M3/16 signed with ``(sf · global)`` first; MXFP4 UE8M0/32 as fp32 bits ``b << 23``
  (byte 0 -> 0.0, 0xFF -> +Inf); every scale byte, bit-exact (NaN matches NaN);
* ``mxfp4_dequantize_host`` vs ``mxfp4_dequantize``, bit-exact. Its source decodes scales with
  CUDA's ``__nv_fp8_e8m0`` -> float conversion (``cuda_fp8.hpp``: byte 0 -> 2^-127, 0xFF -> NaN,
  the OCP convention), not with ``b << 23`` like its sibling above (``docs/formats.md`` §5), so the
  special bytes have their own test.
"""

from __future__ import annotations

import importlib
import math
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch
from hypothesis import event, example, given, note
from hypothesis import strategies as st

from adapters import flashinfer as fi
from reference.errors import ShapeContractError
from reference.formats import (
    MXFP4_BLOCK,
    NVFP4_BLOCK,
    UE8M0_BIAS,
    E4m3Sign,
    GlobalScale,
    Quantized,
    Ue8m0Byte0,
    Ue8m0Byte255,
    e4m3_encode,
    mxfp4_dequantize,
    nvfp4_dequantize,
)
from reference.layouts import (
    deinterleave_rows,
    fc1_permutation,
    fc2_permutation,
    gated_reorder,
    sm90_mixed_gemm_scale_interleave,
    swizzle_128x4,
    trtllm_row_shuffle,
    trtllm_scale_row_shuffle,
)
from reference.padding import pad_dim, pad_fused_rows
from reference.sizes import round_up

pytestmark = pytest.mark.flashinfer

SEED = st.integers(0, 2**16)
ROWS = st.one_of(
    st.integers(1, 600), st.integers(1, 24).map(lambda k: 32 * k), st.integers(1, 8).map(lambda k: 128 * k)
)
TILES = st.sampled_from([128, 64, 256, 32])


def flashinfer_module(name: str) -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def random_bytes(seed: int, *shape: int, low: int = 0, high: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).to(torch.uint8)


def outcome(
    call: Callable[[], torch.Tensor], errors: tuple[type[BaseException], ...]
) -> tuple[torch.Tensor | None, str]:
    try:
        return call(), ""
    except errors as exc:
        return None, f"{type(exc).__name__}: {exc}"


def assert_agree(
    reference: Callable[[], torch.Tensor],
    library: Callable[[], torch.Tensor],
    what: str,
    library_errors: tuple[type[BaseException], ...] = (AssertionError,),
) -> None:
    """Both accept with equal results, or both refuse (the reference with ShapeContractError)."""
    ref, ref_err = outcome(reference, (ShapeContractError,))
    lib, lib_err = outcome(library, library_errors)
    note(f"{what}: reference {ref_err or 'accepts'}; FlashInfer {lib_err or 'accepts'}")
    event("both refuse" if ref_err and lib_err else "both accept" if not (ref_err or lib_err) else "disagree")
    assert bool(ref_err) == bool(lib_err), (
        f"{what}: reference {'refuses (' + ref_err + ')' if ref_err else 'accepts'}, "
        f"FlashInfer {'refuses (' + lib_err + ')' if lib_err else 'accepts'}"
    )
    if ref is not None:
        assert ref.dtype == lib.dtype and torch.equal(ref, lib), f"{what}: results differ"


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str, signed_zero: bool = True) -> None:
    """fp32 bit equality, any NaN matching any NaN; ``signed_zero=False`` lets +0.0 match -0.0."""
    got, want = got.float().reshape(-1), want.float().reshape(-1)
    assert got.shape == want.shape, f"{what}: {got.numel()} values vs {want.numel()}"
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    differ = got.view(torch.int32) != want.view(torch.int32)
    if not signed_zero:
        differ &= ~((got == 0) & (want == 0))
    bad = (nan_g != nan_w) | (~nan_g & ~nan_w & differ)
    idx = bad.nonzero().flatten()[:4].tolist()
    assert not idx, f"{what}: {int(bad.sum())} differences, e.g. " + ", ".join(
        f"[{i}] got {got[i].item()!r} want {want[i].item()!r}" for i in idx
    )


# --- row permutations ----------------------------------------------------------------------------


@given(rows=ROWS, tile=TILES)
@example(rows=48, tile=128)  # docs/layouts.md §4: refused at tile 128, accepted at 64
@example(rows=48, tile=64)
def test_row_shuffle(rows: int, tile: int) -> None:
    assert_agree(
        lambda: trtllm_row_shuffle(rows, tile), lambda: fi.row_shuffle(rows, tile), f"row shuffle M={rows} tile={tile}"
    )


@given(rows=ROWS, tile=TILES)
@example(rows=352, tile=128)  # Gemma-4 TP4 FC1 scales: the vLLM #46879 assert
@example(rows=384, tile=128)
def test_scale_row_shuffle(rows: int, tile: int) -> None:
    assert_agree(
        lambda: trtllm_scale_row_shuffle(rows, tile),
        lambda: fi.scale_row_shuffle(rows, tile),
        f"scale row shuffle M={rows} tile={tile}",
    )


@given(rows=st.integers(1, 600))
def test_gated_reorder(rows: int) -> None:
    assert_agree(lambda: gated_reorder(rows), lambda: fi.gated_reorder(rows), f"gated reorder M={rows}")


@given(rows=ROWS, gated=st.booleans(), scales=st.booleans())
@example(rows=352, gated=True, scales=True)  # Gemma-4 TP4: refused
@example(rows=352, gated=True, scales=False)  # the weight variant accepts it
@example(rows=192, gated=True, scales=True)  # Qwen3-30B-A3B TP8: rows % 64 == 0 but not % 128
def test_fc1_permutation(rows: int, gated: bool, scales: bool) -> None:
    assert_agree(
        lambda: fc1_permutation(rows, gated, scales),
        lambda: fi.fc1_permutation(rows, gated, scales),
        f"FC1 permutation M={rows} gated={gated} scales={scales}",
    )


@given(rows=ROWS, scales=st.booleans())
@example(rows=2880, scales=True)  # gpt-oss H: refused (docs/layouts.md §7)
@example(rows=2944, scales=True)
def test_fc2_permutation(rows: int, scales: bool) -> None:
    assert_agree(
        lambda: fc2_permutation(rows, scales),
        lambda: fi.fc2_permutation(rows, scales),
        f"FC2 permutation M={rows} scales={scales}",
    )


@given(rows=st.integers(1, 300), cols=st.integers(1, 4), seed=SEED)
def test_deinterleave_gated_rows(rows: int, cols: int, seed: int) -> None:
    core = flashinfer_module("flashinfer.fused_moe.core")
    if not hasattr(core, "deinterleave_gated_rows"):
        pytest.skip(f"flashinfer {fi.flashinfer_version()} has no deinterleave_gated_rows")
    x = random_bytes(seed, rows, cols)
    assert_agree(
        lambda: deinterleave_rows(x, dim=0),
        lambda: core.deinterleave_gated_rows(x, 1),
        f"deinterleave M={rows}",
        (ValueError,),
    )
    if rows % 2 == 0:
        assert torch.equal(core.deinterleave_gated_rows(x[gated_reorder(rows)], 1), x)


# --- SM90 scale interleave ------------------------------------------------------------------------


@given(
    experts=st.integers(1, 3),
    rows=st.one_of(st.integers(1, 260), st.integers(1, 4).map(lambda k: 64 * k)),
    kc=st.one_of(st.integers(1, 17), st.integers(1, 4).map(lambda k: 4 * k)),
    seed=SEED,
)
@example(experts=2, rows=128, kc=8, seed=0)  # docs/layouts.md §9: gives [2, 2, 2, 16, 16]
@example(experts=1, rows=96, kc=4, seed=0)  # refused: rows % 64
def test_sm90_scale_interleave(experts: int, rows: int, kc: int, seed: int) -> None:
    s = random_bytes(seed, experts, rows, kc)
    assert_agree(
        lambda: sm90_mixed_gemm_scale_interleave(s),
        lambda: fi.sm90_scale_interleave(s),
        f"sm90 scale interleave {tuple(s.shape)}",
        (ValueError,),
    )


# --- pad_trtllm_moe_weights ------------------------------------------------------------------------


@dataclass(frozen=True)
class PadCase:
    experts: int
    gated: bool
    block: int  # 16: NVFP4 (E4M3 scales), 32: MXFP4 (UE8M0 scales)
    inter_blocks: int
    hidden_blocks: int
    hidden_alignment: int
    intermediate_alignment: int
    seed: int

    @property
    def inter(self) -> int:
        return self.block * self.inter_blocks

    @property
    def hidden(self) -> int:
        return self.block * self.hidden_blocks


PAD_CASES = st.builds(
    PadCase,
    st.integers(1, 2),
    st.booleans(),
    st.sampled_from([NVFP4_BLOCK, MXFP4_BLOCK]),
    st.integers(1, 12),
    st.integers(1, 20),
    st.sampled_from([128, 256, 512]),
    st.sampled_from([128, 256]),
    SEED,
)


def neutral_scale_byte(block: int) -> int:
    """The reference's encoding of 1.0 in the block-scale format (E4M3 for 16, UE8M0 for 32)."""
    return int(e4m3_encode(torch.tensor([1.0])).item()) if block == NVFP4_BLOCK else UE8M0_BIAS


def dequantize(packed: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    q = Quantized(packed, scales)
    return nvfp4_dequantize(q, 1.0, GlobalScale.DECODE) if block == NVFP4_BLOCK else mxfp4_dequantize(q)


@given(case=PAD_CASES)
@example(case=PadCase(2, True, MXFP4_BLOCK, 45, 90, 512, 128, 0))  # docs/layouts.md §8: H 2880, I 1440 MXFP4
@example(case=PadCase(1, True, NVFP4_BLOCK, 11, 180, 256, 128, 0))  # H 2880, I 176 NVFP4 -> I 256
def test_pad_trtllm_moe_weights(case: PadCase) -> None:
    core = flashinfer_module("flashinfer.fused_moe.core")
    e, f, i, h, blk = case.experts, 2 if case.gated else 1, case.inter, case.hidden, case.block
    w13 = random_bytes(case.seed, e, f * i, h // 2)
    s13 = random_bytes(case.seed + 1, e, f * i, h // blk, low=1, high=0x7F)
    w2 = random_bytes(case.seed + 2, e, h, i // 2)
    s2 = random_bytes(case.seed + 3, e, h, i // blk, low=1, high=0x7F)
    got = core.pad_trtllm_moe_weights(
        w13, s13, w2, s2, h, i,
        is_gated_act=case.gated,
        hidden_alignment=case.hidden_alignment,
        intermediate_alignment=case.intermediate_alignment,
    )  # fmt: skip
    ip, hp, h2 = round_up(i, case.intermediate_alignment), round_up(h, case.hidden_alignment), round_up(h, 128)
    neutral = neutral_scale_byte(blk)
    want = {
        "gemm1_weights": pad_dim(pad_fused_rows(w13, f, ip, 0), -1, hp // 2, 0),
        "gemm1_weights_scale": pad_dim(pad_fused_rows(s13, f, ip, neutral), -1, hp // blk, neutral),
        "gemm2_weights": pad_dim(pad_dim(w2, -2, h2, 0), -1, ip // 2, 0),
        "gemm2_weights_scale": pad_dim(pad_dim(s2, -2, h2, neutral), -1, ip // blk, neutral),
    }
    for name, tensor in want.items():
        lib = getattr(got, name)
        assert lib.shape == tensor.shape and torch.equal(lib, tensor), f"{name}: FlashInfer's padding differs ({case})"
    sizes = (got.hidden_size, got.intermediate_size, got.valid_hidden_size, got.valid_intermediate_size)
    assert sizes == (hp, ip, h, i)
    for half in range(f):  # the last real row and the first pad row of each half, dequantized
        rows = slice(half * ip + i - 1, half * ip + min(i + 1, ip))
        values = dequantize(got.gemm1_weights[:, rows], got.gemm1_weights_scale[:, rows], blk)
        real = dequantize(w13[:, (half + 1) * i - 1], s13[:, (half + 1) * i - 1], blk)
        assert torch.equal(values[:, 0, :h], real), "a real FC1 value moved"
        assert not values[:, 1:].any() and not values[..., h:].any(), "an FC1 pad element is not 0"


# --- FlashInfer's pure-torch dequant fallback --------------------------------------------------------


@given(rows=st.integers(1, 8), blocks=st.integers(1, 4), ue8m0=st.booleans(), seed=SEED)
def test_dequant_cpu_fallback(rows: int, blocks: int, ue8m0: bool, seed: int) -> None:
    """Global scale 1.0, so FlashInfer's ``(e2m1 · sf) · gs`` order cannot differ from ours."""
    quant = flashinfer_module("flashinfer.quantization.fp4_quantization")
    blk = MXFP4_BLOCK if ue8m0 else NVFP4_BLOCK
    packed = random_bytes(seed, rows, blk * blocks // 2)
    scales = random_bytes(seed + 1, rows, blocks)
    got = quant._e2m1_and_ufp8sf_scale_to_float_cpu(packed, scales, torch.tensor([1.0]), blk, 0 if ue8m0 else 1, False)
    q = Quantized(packed, scales)
    if ue8m0:
        want = mxfp4_dequantize(q, Ue8m0Byte0.POW2, Ue8m0Byte255.INF)
    else:
        want = nvfp4_dequantize(q, 1.0, GlobalScale.DECODE, sign=E4m3Sign.SIGNED)
    assert_same_bits(got, want, f"fallback dequant ({'UE8M0/32' if ue8m0 else 'E4M3/16'})")


# --- GPU: CUDA kernel and C++ host ops ----------------------------------------------------------------


@pytest.mark.cuda
@given(
    rows=st.one_of(st.integers(1, 300), st.integers(1, 3).map(lambda k: 128 * k)),
    cols=st.integers(1, 20),
    experts=st.none() | st.integers(1, 3),
    bf16=st.booleans(),
    seed=SEED,
)
@example(rows=352, cols=180, experts=None, bf16=False, seed=0)
@example(rows=200, cols=6, experts=3, bf16=False, seed=0)
@example(rows=130, cols=7, experts=None, bf16=True, seed=0)
def test_block_scale_interleave_kernel(rows: int, cols: int, experts: int | None, bf16: bool, seed: int) -> None:
    shape = (rows, cols) if experts is None else (experts, rows, cols)
    if bf16:
        s = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    else:
        s = random_bytes(seed, *shape)
    got = fi.block_scale_interleave(s)
    want = swizzle_128x4(s).reshape(-1)
    assert got.shape == want.shape, f"kernel buffer {tuple(got.shape)} vs reference {tuple(want.shape)}"
    bits = torch.int16 if bf16 else torch.uint8
    assert torch.equal(got.view(bits), want.view(bits)), f"block_scale_interleave differs from swizzle_128x4 on {shape}"


def fp32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


GLOBAL_DECODE = st.builds(
    lambda m, k: fp32(math.ldexp(m, k)), st.floats(1.0, 2.0, exclude_max=True), st.integers(-20, 4)
)


@pytest.mark.cuda
@given(rows=st.integers(1, 40), blocks=st.integers(1, 4), ue8m0=st.booleans(), global_decode=GLOBAL_DECODE, seed=SEED)
def test_host_dequant(rows: int, blocks: int, ue8m0: bool, global_decode: float, seed: int) -> None:
    """Every scale byte (0..255): FlashInfer reads E4M3 signed and UE8M0 as ``b << 23``."""
    blk = MXFP4_BLOCK if ue8m0 else NVFP4_BLOCK
    packed = random_bytes(seed, rows, blk * blocks // 2)
    scales = random_bytes(seed + 1, rows, blocks)
    got = fi.e2m1_and_ufp8sf_scale_to_float(packed, scales, global_decode, blk, ue8m0)
    q = Quantized(packed, scales)
    if ue8m0:  # the global scale is ignored for UE8M0 (fp4Op.cpp reads it for sfType 1 only)
        want = mxfp4_dequantize(q, Ue8m0Byte0.ZERO, Ue8m0Byte255.INF)
    else:
        want = nvfp4_dequantize(q, global_decode, GlobalScale.DECODE, sign=E4m3Sign.SIGNED)
    assert_same_bits(got, want, f"host dequant ({'UE8M0/32' if ue8m0 else f'E4M3/16, global {global_decode!r}'})")


@pytest.mark.cuda
@given(rows=st.integers(1, 40), blocks=st.integers(1, 4), seed=SEED)
def test_mxfp4_dequantize_host(rows: int, blocks: int, seed: int) -> None:
    packed = random_bytes(seed, rows, MXFP4_BLOCK * blocks // 2)
    scales = random_bytes(seed + 1, rows, blocks, low=1, high=255)
    got = fi.mxfp4_dequantize_host(packed, scales)
    # Measured on the H200: mxfp4_dequantize_host returns +0.0 for E2M1 code 8 (-0.0); every
    # other value, bytes 0 and 0xFF included (OCP: 2^-127 and NaN), matches bit for bit.
    assert_same_bits(got, mxfp4_dequantize(Quantized(packed, scales)), "mxfp4_dequantize_host", signed_zero=False)


@pytest.mark.cuda
def test_mxfp4_dequantize_host_special_bytes() -> None:
    """Scale bytes 0 and 0xFF under every code: OCP decode (2^-127, NaN) per ``__nv_fp8_e8m0``."""
    packed = torch.arange(256).to(torch.uint8).reshape(2, 128).repeat_interleave(2, dim=0)  # 4 rows
    scales = torch.tensor([[0] * 8, [255] * 8, [0] * 8, [255] * 8], dtype=torch.uint8)
    got = fi.mxfp4_dequantize_host(packed, scales)
    want = mxfp4_dequantize(Quantized(packed, scales), Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)
    assert_same_bits(got, want, "mxfp4_dequantize_host at bytes 0 / 0xFF", signed_zero=False)
