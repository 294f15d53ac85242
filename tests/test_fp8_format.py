"""FP8 E4M3 weights (:mod:`reference.fp8`) against torch's ``float8_e4m3fn`` and ``ml_dtypes.float8_e4m3fn``.

* every one of the 256 codes: decoding agrees with both libraries bit for bit (NaN at 0x7F / 0xFF only),
  and re-encoding a decoded non-NaN code gives the code back (``-0`` as 0x80), as both libraries' casts do;
* block quantization (128x128 tiles, ragged edges): the scale grid is ``[ceil(N/128), ceil(K/128)]``, each
  scale is its tile's ``amax / 448``, the codes are torch's cast of ``w / scale`` and ml_dtypes' too, and
  dequantization is torch's ``code.view(float8_e4m3fn) · scale``;
* per-tensor quantization likewise with one scale, and per-tensor dequantization of a batch of experts (one
  scale each, the ``fp8_tensor_moe`` format) is torch's and ml_dtypes' ``code · scale``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.formats import E4M3_MAX, e4m3_decode, e4m3_encode
from reference.fp8 import (
    FP8_BLOCK,
    Fp8Quantized,
    block_scale_shape,
    expand_block_scales,
    fp8_block_dequantize,
    fp8_block_quantize,
    fp8_tensor_dequantize,
    fp8_tensor_quantize,
    fp8_token_group_dequantize,
    fp8_token_group_quantize,
)

ALL_BYTES = torch.arange(256).to(torch.uint8)
NAN_BYTES = (0x7F, 0xFF)


@pytest.fixture(scope="module")
def mld():
    """The ``ml_dtypes`` module (an independent implementation of OCP FP8)."""
    return pytest.importorskip("ml_dtypes")


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous().view(torch.int32)


def test_every_code_decodes_as_torch_and_ml_dtypes(mld) -> None:
    ours = e4m3_decode(ALL_BYTES)
    torch_values = ALL_BYTES.view(torch.float8_e4m3fn).float()
    ml_values = torch.from_numpy(ALL_BYTES.numpy().view(mld.float8_e4m3fn).astype(np.float32))
    nan = torch.isnan(ours)
    assert sorted(ALL_BYTES[nan].tolist()) == list(NAN_BYTES), "NaN codes are 0x7F and 0xFF only"
    for name, want in (("torch", torch_values), ("ml_dtypes", ml_values)):
        assert torch.equal(torch.isnan(want), nan), f"{name}: NaN codes differ"
        assert torch.equal(bits(ours[~nan]), bits(want[~nan])), f"{name}: decoded values differ"
    assert ours[~nan].abs().max().item() == E4M3_MAX == torch.finfo(torch.float8_e4m3fn).max


def test_every_code_round_trips_as_torch_and_ml_dtypes(mld) -> None:
    codes = ALL_BYTES[~torch.isnan(e4m3_decode(ALL_BYTES))]
    values = e4m3_decode(codes)
    assert torch.equal(e4m3_encode(values), codes), "encode(decode(code)) != code"
    assert torch.equal(values.to(torch.float8_e4m3fn).view(torch.uint8), codes), "torch cast disagrees"
    ml = torch.from_numpy(values.numpy().astype(mld.float8_e4m3fn).view(np.uint8).copy())
    assert torch.equal(ml, codes), "ml_dtypes cast disagrees"


@pytest.mark.parametrize(("n", "k"), [(1, 1), (128, 128), (129, 127), (200, 300), (256, 384)])
def test_block_scale_shape_is_ceil(n: int, k: int) -> None:
    assert block_scale_shape(n, k) == (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    q = fp8_block_quantize(torch.randn(2, n, k, generator=torch.Generator().manual_seed(n * k)))
    assert q.codes.shape == (2, n, k) and q.codes.dtype == torch.uint8
    assert q.scales.shape == (2, *block_scale_shape(n, k)) and q.scales.dtype == torch.float32


def test_expand_refuses_a_wrong_grid() -> None:
    with pytest.raises(ShapeContractError, match="do not tile"):
        expand_block_scales(torch.ones(1, 2), 129, 129)


@given(
    n=st.integers(1, 300),
    k=st.integers(1, 300),
    seed=st.integers(0, 2**16),
    log_range=st.integers(-12, 12),
)
def test_block_quantize_matches_torch_and_ml_dtypes(n: int, k: int, seed: int, log_range: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 2.0**log_range
    w[: min(n, FP8_BLOCK), : min(k, FP8_BLOCK)] = 0  # one all-zero tile: scale 1.0, zero codes
    q = fp8_block_quantize(w)
    rn, rk = block_scale_shape(n, k)
    padded = torch.zeros(rn * FP8_BLOCK, rk * FP8_BLOCK)
    padded[:n, :k] = w
    amax = padded.view(rn, FP8_BLOCK, rk, FP8_BLOCK).abs().amax(dim=(1, 3))
    assert torch.equal(q.scales, torch.where(amax > 0, amax / E4M3_MAX, 1.0)), "scale is not tile amax / 448"
    scaled = w / expand_block_scales(q.scales, n, k)
    assert torch.equal(q.codes, scaled.to(torch.float8_e4m3fn).view(torch.uint8)), "codes differ from torch's cast"
    ml = pytest.importorskip("ml_dtypes")
    want = torch.from_numpy(scaled.numpy().astype(ml.float8_e4m3fn).view(np.uint8).copy())
    assert torch.equal(q.codes, want), "codes differ from ml_dtypes' cast"
    torch_deq = q.codes.view(torch.float8_e4m3fn).float() * expand_block_scales(q.scales, n, k)
    assert torch.equal(bits(fp8_block_dequantize(q)), bits(torch_deq)), "dequantization differs from torch's"


@given(m=st.integers(1, 9), k=st.integers(1, 400), seed=st.integers(0, 2**16), log_range=st.integers(-12, 12))
def test_token_group_quantize_matches_torch(m: int, k: int, seed: int, log_range: int) -> None:
    """Activation groups are 1 x 128 per token: scale ``amax / 448`` of each token's group, codes torch's cast."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 2.0**log_range
    x[0, : min(k, FP8_BLOCK)] = 0  # an all-zero group: scale 1.0
    q = fp8_token_group_quantize(x)
    groups = -(-k // FP8_BLOCK)
    padded = torch.zeros(m, groups * FP8_BLOCK)
    padded[:, :k] = x
    amax = padded.view(m, groups, FP8_BLOCK).abs().amax(-1)
    assert torch.equal(q.scales, torch.where(amax > 0, amax / E4M3_MAX, 1.0)), "scale is not the group amax / 448"
    per_element = q.scales.repeat_interleave(FP8_BLOCK, -1)[:, :k]
    assert torch.equal(q.codes, (x / per_element).to(torch.float8_e4m3fn).view(torch.uint8))
    torch_deq = q.codes.view(torch.float8_e4m3fn).float() * per_element
    assert torch.equal(bits(fp8_token_group_dequantize(q)), bits(torch_deq))


@given(seed=st.integers(0, 2**16), log_range=st.integers(-12, 12))
def test_tensor_quantize_matches_torch(seed: int, log_range: int) -> None:
    w = torch.randn(3, 70, 90, generator=torch.Generator().manual_seed(seed)) * 2.0**log_range
    q = fp8_tensor_quantize(w)
    assert q.scales.numel() == 1 and q.scales.item() == (w.abs().amax() / E4M3_MAX).item()
    assert torch.equal(q.codes, (w / q.scales).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(bits(fp8_tensor_dequantize(q)), bits(q.codes.view(torch.float8_e4m3fn).float() * q.scales))


def test_zero_tensor_gets_scale_one() -> None:
    q = fp8_tensor_quantize(torch.zeros(4, 4))
    assert q.scales.item() == 1.0 and not q.codes.any()
    with pytest.raises(ShapeContractError, match="one scale"):
        fp8_tensor_dequantize(Fp8Quantized(q.codes, torch.ones(2)))


@given(seed=st.integers(0, 2**16), experts=st.integers(1, 4), log_scale=st.integers(-12, 12))
def test_per_expert_tensor_dequantize_matches_torch_and_ml_dtypes(mld, seed: int, experts: int, log_scale: int) -> None:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (experts, 48, 80), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN code: its product is NaN on every side
    scales = torch.ldexp(torch.ones(experts, 1, 1), torch.randint(-3, 4, (experts, 1, 1), generator=g) + log_scale)
    got = fp8_tensor_dequantize(Fp8Quantized(codes, scales))
    assert torch.equal(bits(got), bits(codes.view(torch.float8_e4m3fn).float() * scales)), "differs from torch's"
    decoded = codes.numpy().view(mld.float8_e4m3fn).astype(np.float32) * scales.numpy()
    assert torch.equal(bits(got), bits(torch.from_numpy(decoded))), "differs from ml_dtypes'"
