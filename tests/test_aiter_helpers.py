"""AITER's own pure-torch helpers (amd-aiter, loaded without ROCm) against the reference layouts and codecs.

Runs on CPU wherever amd-aiter is installed (scripts/install-cpu.sh installs 0.1.7.post2.dev18);
skips naming what is missing otherwise. Cross-checks, byte for byte:

* ``aiter.ops.shuffle.shuffle_weight(w, (16, 16))`` = ``reference.layouts.aiter_shuffle_weight`` on
  drawn ``[E, N, K/2]`` (``N % 16``, ``K/2 % 32``) and 2-D weights;
* ``aiter.utility.fp4_utils.e8m0_shuffle`` = ``reference.layouts.aiter_e8m0_shuffle`` on every byte
  that comes from the scale (AITER leaves the pad uninitialised), with its padded shape
  ``(ru(m, 256), ru(n, 8))``, and ``aiter_e8m0_unshuffle`` inverts it;
* ``mxfp4_to_f32`` and ``e8m0_to_f32`` on all 256 bytes = ``e2m1_decode`` / ``ue8m0_decode`` (byte 0
  is 2^-127, 0xFF NaN);
* ``f32_to_mxfp4`` = ``e2m1_encode`` (nearest even, saturating) on drawn fp32 values, midpoints included.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from adapters import aiter_triton as at
from adapters.aiter import AiterApiMismatch, AiterUnavailable, gemm_a4w4_api, require_parameters
from reference.formats import (
    E2M1_MAGNITUDES,
    Ue8m0Byte0,
    Ue8m0Byte255,
    e2m1_decode,
    e2m1_encode,
    pack_fp4,
    ue8m0_decode,
    unpack_fp4,
)
from reference.layouts import aiter_e8m0_shuffle, aiter_e8m0_unshuffle, aiter_shuffle_weight
from reference.sizes import round_up


@pytest.fixture(scope="module", autouse=True)
def amd_aiter() -> at.AiterInstall:
    """amd-aiter's files, or a skip naming what is missing."""
    try:
        found = at.install()
        at.aiter_module(at.SHUFFLE)
        at.aiter_module(at.FP4_UTILS)
    except AiterUnavailable as exc:
        pytest.skip(str(exc))
    return found


def test_loaded_without_rocm(amd_aiter: at.AiterInstall) -> None:
    """On a machine without ROCm the helpers come from the installed files under stand-in parents."""
    if torch.version.hip is None:
        assert amd_aiter.mode == "stand-in"
        assert at.aiter_module(at.SHUFFLE).__file__.startswith(str(amd_aiter.root))


@given(
    experts=st.integers(0, 3),
    n_tiles=st.integers(1, 12),
    k_tiles=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_shuffle_weight(experts: int, n_tiles: int, k_tiles: int, seed: int) -> None:
    shape = (*((experts,) if experts else ()), 16 * n_tiles, 32 * k_tiles)
    w = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int64)
    w = w.to(torch.uint8)
    assert torch.equal(at.shuffle_weight(w), aiter_shuffle_weight(w))


@given(rows=st.integers(1, 600), cols=st.integers(1, 40), seed=st.integers(0, 2**16))
@example(rows=2560, cols=20, seed=0)  # Qwen3.8 shared-expert down_proj: padded, not viewable unpadded
@example(rows=256, cols=8, seed=0)
def test_e8m0_shuffle(rows: int, cols: int, seed: int) -> None:
    s = torch.randint(0, 256, (rows, cols), generator=torch.Generator().manual_seed(seed), dtype=torch.int64)
    s = s.to(torch.uint8)
    theirs = at.e8m0_shuffle(s)
    assert tuple(theirs.shape) == (round_up(rows, 256), round_up(cols, 8))
    valid = aiter_e8m0_shuffle(torch.ones_like(s), fill=0).bool()
    assert torch.equal(theirs[valid], aiter_e8m0_shuffle(s)[valid])
    assert torch.equal(aiter_e8m0_unshuffle(theirs, rows, cols), s)


def test_codecs_on_every_byte() -> None:
    b = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    assert torch.equal(at.mxfp4_to_f32(b[None, :]).flatten(), e2m1_decode(unpack_fp4(b)))
    want, got = ue8m0_decode(b, Ue8m0Byte0.POW2, Ue8m0Byte255.NAN), at.e8m0_to_f32(b)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[:255], want[:255])


MIDPOINTS = tuple((a + b) / 2 for a, b in itertools.pairwise(E2M1_MAGNITUDES))


@given(
    st.lists(
        st.one_of(
            st.floats(-8, 8, width=32),
            st.sampled_from(MIDPOINTS + E2M1_MAGNITUDES),
            st.sampled_from(MIDPOINTS).map(lambda v: -v),
            st.floats(width=32, allow_nan=False, allow_infinity=False),
        ),
        min_size=2,
        max_size=64,
    ).map(lambda v: v[: len(v) // 2 * 2])
)
def test_f32_to_mxfp4(values: list[float]) -> None:
    x = torch.tensor([values], dtype=torch.float32)
    assert torch.equal(at.f32_to_mxfp4(x), pack_fp4(e2m1_encode(x)))


def test_gfx950_gemm_a4w4_api_is_detected() -> None:
    """The ASM GEMM adapter calls ``gemm_a4w4`` in the API the installed AITER has: ROCm/aiter main's (``dtype``,
    returning its output; what vLLM 0.33.0 calls) or amd-aiter 0.1.7's (a preallocated ``out``; ``aiter/ops/
    gemm_op_a4w4.py`` of the wheel); a signature matching neither is refused by name."""

    def gemm_a4w4_0_1_7(A, B, A_scale, B_scale, out, bias=None, alpha=1.0, beta=0.0, bpreshuffle=True): ...

    def gemm_a4w4_main(A, B, A_scale, B_scale, bias=None, dtype=None, alpha=1.0, beta=0.0, bpreshuffle=True): ...

    def gemm_a4w4_other(A, B, A_scale, B_scale, bias=None): ...

    assert gemm_a4w4_api(gemm_a4w4_main) == "ROCm/aiter main"
    assert gemm_a4w4_api(gemm_a4w4_0_1_7) == "amd-aiter 0.1.7"
    with pytest.raises(AiterApiMismatch, match="matches none of the known APIs"):
        gemm_a4w4_api(gemm_a4w4_other)
    with pytest.raises(AiterApiMismatch, match=r"lacks \['hidden_pad'\]"):
        require_parameters(gemm_a4w4_other, "fused_moe", ("hidden_pad",))
