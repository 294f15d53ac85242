"""MXFP8 (:mod:`reference.mxfp8`) against torch's ``float8_e4m3fn`` / ``float8_e8m0fnu`` and ml_dtypes.

* the shared exponent is ``floor(log2(amax)) - 8`` (OCP MX v1.0 §6.3), so every block's ``amax / X`` lies
  in [256, 512), and an all-zero block gets byte 0;
* the codes are torch's and ml_dtypes' ``float8_e4m3fn`` cast of ``x / X`` saturated to ±448;
* every one of the 256 scale bytes decodes as torch's and ml_dtypes' ``float8_e8m0fnu`` (0xFF NaN);
* dequantization is torch's ``code.view(float8_e4m3fn) · scale.view(float8_e8m0fnu)``, and
  quantizing a dequantized tensor gives it back (MXFP8 values are a fixed point).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.formats import E4M3_MAX, ue8m0_decode
from reference.mxfp8 import MXFP8_BLOCK, Mxfp8Quantized, mxfp8_dequantize, mxfp8_quantize

ALL_BYTES = torch.arange(256).to(torch.uint8)


@pytest.fixture(scope="module")
def mld():
    """The ``ml_dtypes`` module (an independent implementation of OCP FP8 and E8M0)."""
    return pytest.importorskip("ml_dtypes")


def sample(seed: int, rows: int, k: int, spread: int) -> torch.Tensor:
    """``[rows, k]`` normal values times ``2^u``, ``u`` uniform in ``[-spread, spread]`` per element, with
    one all-zero block when there is room."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(
        torch.randint(-spread, spread + 1, (rows, k), generator=g).float()
    )
    if k >= 2 * MXFP8_BLOCK:
        x[0, :MXFP8_BLOCK] = 0
    return x


SHAPES = st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 6), st.integers(0, 30))


@given(SHAPES)
def test_scale_is_ocp_floor_and_codes_are_saturating_casts(case: tuple[int, int, int, int]) -> None:
    seed, rows, blocks, spread = case
    x = sample(seed, rows, blocks * MXFP8_BLOCK, spread)
    q = mxfp8_quantize(x)
    assert q.codes.shape == x.shape and q.scales.shape == (rows, blocks)
    xb = x.view(rows, blocks, MXFP8_BLOCK)
    amax = xb.abs().amax(-1)
    scale = ue8m0_decode(q.scales).double()
    ratio = amax.double() / scale
    nonzero = amax > 0
    assert bool(((ratio[nonzero] >= 256) & (ratio[nonzero] < 512)).all()), "amax / X must lie in [256, 512)"
    assert bool((q.scales[~nonzero] == 0).all()), "an all-zero block has scale byte 0"
    want = (xb.double() / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).float().reshape(x.shape)
    assert torch.equal(q.codes, want.to(torch.float8_e4m3fn).view(torch.uint8))


@given(SHAPES)
def test_codes_match_ml_dtypes(mld, case: tuple[int, int, int, int]) -> None:
    seed, rows, blocks, spread = case
    x = sample(seed, rows, blocks * MXFP8_BLOCK, spread)
    q = mxfp8_quantize(x)
    scale = ue8m0_decode(q.scales).double()[..., None]
    y = (x.view(rows, blocks, MXFP8_BLOCK).double() / scale).clamp(-E4M3_MAX, E4M3_MAX).float().reshape(x.shape)
    want = y.numpy().astype(mld.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(q.codes.numpy(), want)


def test_scale_bytes_decode_as_e8m0fnu(mld) -> None:
    ours = ue8m0_decode(ALL_BYTES)
    torch_vals = ALL_BYTES.view(torch.float8_e8m0fnu).float()
    mld_vals = torch.from_numpy(ALL_BYTES.numpy().view(mld.float8_e8m0fnu).astype(np.float32))
    for theirs in (torch_vals, mld_vals):
        assert torch.equal(torch.isnan(ours), torch.isnan(theirs)) and bool(torch.isnan(ours[0xFF]))
        finite = ~torch.isnan(ours)
        assert torch.equal(ours[finite], theirs[finite])


@given(SHAPES)
def test_dequantize_is_torch_fp8_product_and_a_fixed_point(case: tuple[int, int, int, int]) -> None:
    seed, rows, blocks, spread = case
    q = mxfp8_quantize(sample(seed, rows, blocks * MXFP8_BLOCK, spread))
    w = mxfp8_dequantize(q)
    codes = q.codes.view(torch.float8_e4m3fn).double().view(rows, blocks, MXFP8_BLOCK)
    scales = q.scales.view(torch.float8_e8m0fnu).double()[..., None]
    assert torch.equal(w, (codes * scales).float().reshape(w.shape))
    again = mxfp8_quantize(w)
    assert torch.equal(mxfp8_dequantize(again), w)


def test_nan_scale_and_bad_shapes() -> None:
    q = Mxfp8Quantized(torch.full((1, MXFP8_BLOCK), 0x38, dtype=torch.uint8), torch.tensor([[0xFF]], dtype=torch.uint8))
    assert bool(torch.isnan(mxfp8_dequantize(q)).all()), "scale byte 0xFF is NaN (OCP MX v1.0 §5)"
    with pytest.raises(ShapeContractError):
        mxfp8_quantize(torch.ones(2, 48))
    with pytest.raises(ShapeContractError):
        mxfp8_dequantize(Mxfp8Quantized(torch.zeros(2, 64, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8)))
