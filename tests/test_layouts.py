"""Self-tests of ``reference/layouts.py`` and ``reference/padding.py``.

Every transform is applied to distinct labels ``1..n`` (0 marks padding), so "bijection on the
unpadded region" reads: every label appears exactly once and everything else is the fill.

Cross-checks and their source of truth (``docs/layouts.md``):

* ``swizzle_128x4`` (2-D and 3-D, any M, Kc): the flat-offset formula of §2
  (``get_sf_out_offset_128x4`` / ``computeSFIndex``) and FlashInfer's test reshape form
  ``view(Mp/128, 4, 32, Kp/4, 4).permute(0, 3, 2, 1, 4)``; pad 0; ``unswizzle_128x4`` inverts it.
* trtllm row shuffles: the closed form of §4 (``out[B·b + 8a + t] = x[B·b + (B/8)·t + a]``),
  the documented first indices, block 32 vs 16 by ``epilogue_tile_m``; the scale variant's
  ``M % 128`` rule (§5). Gated reorder (§6: ``arange(8) -> [0,4,1,5,2,6,3,7]``), FC1/FC2
  compositions (§7: the 128-row gated example), swap_halves, (de)interleave_rows (§13).
* SM90 interleaves (§9): FlashInfer's 64-row fold ``[f][4·s + g]``, vLLM's ``4n + j`` order,
  and the documented difference between the two on one 64x128 block; both inverses.
* AITER ``e8m0_shuffle`` (§10.1): padded shapes of the doc's examples, the flat-offset formula,
  pad = ``fill``; vLLM's unpadded 7-D view equals ``e8m0_shuffle(s)[:rows]`` exactly when its
  guard holds, and the guard is exactly where torch's ``view`` accepts the shape (§10.2).
* AITER ``shuffle_weight`` (§11): the flat-offset formula per expert; inverse.
* Per-half FC1 padding (``docs/vllm-logic.md`` §2): halves stay at ``[h·Ip, h·Ip + I)``, pad = fill.
* Every violated constraint raises :class:`ShapeContractError` with a message.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given, note
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.layouts import (
    aiter_e8m0_shuffle,
    aiter_e8m0_unshuffle,
    aiter_shuffle_weight,
    aiter_unshuffle_weight,
    asm_scale_swizzle_ok,
    deinterleave_rows,
    fc1_permutation,
    fc2_permutation,
    gated_reorder,
    grouped_gate_up_interleave,
    interleave_rows,
    inverse_permutation,
    is_permutation,
    sm90_mixed_gemm_scale_deinterleave,
    sm90_mixed_gemm_scale_interleave,
    swap_halves,
    swizzle_128x4,
    trtllm_row_shuffle,
    trtllm_scale_row_shuffle,
    trtllm_shuffle_block,
    unswizzle_128x4,
    vllm_asm_scale_swizzle,
    vllm_sm90_scale_deinterleave,
    vllm_sm90_scale_interleave,
)
from reference.padding import pad_dim, pad_fused_rows, unpad_fused_rows
from reference.sizes import round_up

PAD = 0


def labels(*shape: int) -> torch.Tensor:
    """Distinct int64 labels ``1..n`` shaped ``shape`` (0 is left for padding)."""
    return torch.arange(1, math.prod(shape) + 1).reshape(shape)


def assert_holds_each_label_once(out: torch.Tensor, n: int, fill: int = PAD) -> None:
    """``out`` holds labels ``1..n`` exactly once each, and ``fill`` everywhere else."""
    real = out[out != fill]
    assert torch.equal(real.sort().values, torch.arange(1, n + 1)), "labels lost or duplicated"
    assert int((out == fill).sum()) == out.numel() - n, "padding count is wrong"


def assert_permutation(perm: torch.Tensor, n: int) -> None:
    assert perm.shape == (n,) and perm.dtype == torch.int64
    assert torch.equal(perm.sort().values, torch.arange(n)), f"not a permutation of 0..{n - 1}"
    x = labels(n)
    assert torch.equal(x[perm][inverse_permutation(perm)], x)


def test_is_permutation_counts_each_value_once() -> None:
    assert is_permutation(torch.tensor([[2, 0], [3, 1]])) and is_permutation(torch.tensor([], dtype=torch.long))
    for bad in ([0, 0, 1], [0, 1, 3], [-1, 0, 1], [1, 2, 3]):
        assert not is_permutation(torch.tensor(bad)), bad
    with pytest.raises(ShapeContractError, match="not a permutation"):
        inverse_permutation(torch.tensor([0, 2, 2]))


# --- 128x4 swizzle --------------------------------------------------------------------------------


def offset_128x4(m: torch.Tensor, k: torch.Tensor, kp: int) -> torch.Tensor:
    """docs/layouts.md §2 flat offset of ``S[m, k]`` in one expert's swizzled buffer."""
    return (m // 128) * (kp // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4)


@given(
    rows=st.integers(1, 300),
    cols=st.integers(1, 20),
    experts=st.none() | st.integers(1, 3),
)
@example(rows=352, cols=180, experts=None)
@example(rows=200, cols=6, experts=3)
def test_swizzle_128x4(rows: int, cols: int, experts: int | None) -> None:
    shape = (rows, cols) if experts is None else (experts, rows, cols)
    s = labels(*shape)
    out = swizzle_128x4(s)
    mp, kp = round_up(rows, 128), round_up(cols, 4)
    assert out.shape == ((mp, kp) if experts is None else (experts, mp, kp))
    assert_holds_each_label_once(out, s.numel())
    assert torch.equal(unswizzle_128x4(out, rows, cols), s)
    if experts is None:
        assert torch.equal(unswizzle_128x4(out.reshape(-1), rows, cols), s), "inverse of the flat buffer"
    m, k = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    per_expert = out.reshape(-1, mp * kp)
    for e, lin in enumerate(s.reshape(-1, rows, cols)):
        assert torch.equal(per_expert[e][offset_128x4(m, k, kp)], lin), "§2 offset formula"
        padded = torch.zeros(mp, kp, dtype=s.dtype)
        padded[:rows, :cols] = lin
        fi_form = padded.view(mp // 128, 4, 32, kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
        assert torch.equal(per_expert[e], fi_form), "FlashInfer test reshape form"


# --- trtllm row shuffles, gated reorder, compositions ---------------------------------------------

TILES = st.sampled_from([128, 256, 64, 32])


def closed_form_shuffle(rows: int, block: int) -> torch.Tensor:
    """docs/layouts.md §4: ``out[B·b + 8a + t] = x[B·b + (B/8)·t + a]``, ``a < B/8``, ``t < 8``."""
    b, a, t = torch.meshgrid(torch.arange(rows // block), torch.arange(block // 8), torch.arange(8), indexing="ij")
    perm = torch.empty(rows, dtype=torch.int64)
    perm[(block * b + 8 * a + t).reshape(-1)] = (block * b + (block // 8) * t + a).reshape(-1)
    return perm


@given(blocks=st.integers(0, 40), tile=TILES)
def test_trtllm_row_shuffle(blocks: int, tile: int) -> None:
    block = trtllm_shuffle_block(tile)
    assert block == (32 if tile % 128 == 0 else 16)
    rows = block * blocks
    perm = trtllm_row_shuffle(rows, tile)
    assert_permutation(perm, rows)
    assert torch.equal(perm, closed_form_shuffle(rows, block))
    with pytest.raises(ShapeContractError, match=f"multiple of {block}"):
        trtllm_row_shuffle(rows + 8, tile)


def test_trtllm_row_shuffle_documented_prefixes() -> None:
    assert trtllm_row_shuffle(32)[:16].tolist() == [*range(0, 32, 4), *range(1, 32, 4)]
    assert trtllm_row_shuffle(16, 64)[:16].tolist() == [*range(0, 16, 2), *range(1, 16, 2)]


@given(rows=st.integers(1, 20).map(lambda k: 32 * k), tile=TILES)
@example(rows=352, tile=128)  # Gemma-4 TP4 FC1 scale rows (vLLM #46879)
@example(rows=2880, tile=128)  # gpt-oss hidden size (FC2 scale rows)
def test_trtllm_scale_row_shuffle(rows: int, tile: int) -> None:
    """The scale variant is the weight shuffle, refused unless ``rows % 128 == 0``."""
    if rows % 128 == 0:
        assert torch.equal(trtllm_scale_row_shuffle(rows, tile), trtllm_row_shuffle(rows, tile))
    else:
        with pytest.raises(ShapeContractError, match="multiple of 128"):
            trtllm_scale_row_shuffle(rows, tile)


@given(half=st.integers(1, 200))
def test_gated_reorder(half: int) -> None:
    rows = 2 * half
    g = gated_reorder(rows)
    assert_permutation(g, rows)
    assert torch.equal(g[0::2], torch.arange(half)) and torch.equal(g[1::2], torch.arange(half, rows))
    x = labels(rows, 3)
    assert torch.equal(x[g], interleave_rows(x, dim=0))
    assert torch.equal(deinterleave_rows(x[g], dim=0), x)
    with pytest.raises(ShapeContractError, match="even"):
        gated_reorder(rows + 1)


def test_gated_reorder_documented_example() -> None:
    assert gated_reorder(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@given(groups=st.integers(1, 12), group=st.sampled_from([1, 8, 16, 64]))
def test_grouped_gate_up_interleave(groups: int, group: int) -> None:
    """Row ``2g·j + g·h + t`` holds half ``h``'s row ``g·j + t``; ``group = 1`` is the gated reorder."""
    half = groups * group
    rows = 2 * half
    p = grouped_gate_up_interleave(rows, group)
    assert_permutation(p, rows)
    for j in range(groups):
        for h in range(2):
            start = 2 * group * j + group * h
            assert torch.equal(p[start : start + group], torch.arange(h * half + group * j, h * half + group * (j + 1)))
    x = labels(rows, 3)
    assert torch.equal(x[p][inverse_permutation(p)], x)
    if group == 1:
        assert torch.equal(p, gated_reorder(rows))
    with pytest.raises(ShapeContractError, match=f"multiple of 2 x {group}"):
        grouped_gate_up_interleave(rows + 2 * group - 1 if group > 1 else rows + 1, group)


def test_grouped_gate_up_interleave_documented_example() -> None:
    """CuteDSL's 64-row up/gate groups: ``[up; gate]`` with I = 128 gives up 0-63, gate 0-63, up 64-127, ..."""
    p = grouped_gate_up_interleave(256, 64)
    assert p.view(4, 64)[:, 0].tolist() == [0, 128, 64, 192]


@given(blocks=st.integers(1, 24), gated=st.booleans(), scales=st.booleans())
@example(blocks=11, gated=True, scales=True)  # 352 rows: the scale variant refuses
def test_fc1_and_fc2_permutations(blocks: int, gated: bool, scales: bool) -> None:
    """FC1 = ``g[r]`` (``g`` identity when not gated); FC2 = ``r``; the scale variants need M % 128."""
    rows = 32 * blocks
    if scales and rows % 128:
        for build in (lambda: fc1_permutation(rows, gated, scales), lambda: fc2_permutation(rows, scales)):
            with pytest.raises(ShapeContractError, match="multiple of 128"):
                build()
        return
    r = trtllm_row_shuffle(rows)
    g = gated_reorder(rows) if gated else torch.arange(rows)
    fc1 = fc1_permutation(rows, gated, scales)
    assert_permutation(fc1, rows)
    assert torch.equal(fc1, g[r])
    assert torch.equal(fc2_permutation(rows, scales), r)
    x = labels(rows, 2)
    assert torch.equal(x[fc1], x[g][r]), "FC1 is the gated reorder, then the row shuffle"


def test_fc1_documented_example() -> None:
    """docs/layouts.md §7: (128, 8) uint8, gated, scale variant starts [0,2,...,14,64,66,68,70]."""
    assert fc1_permutation(128, gated=True, scales=True)[:12].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 64, 66, 68, 70]


# --- swap_halves, (de)interleave_rows --------------------------------------------------------------

SHAPES = st.lists(st.integers(1, 5), min_size=1, max_size=3)


@given(shape=SHAPES, half=st.integers(1, 6), data=st.data())
def test_swap_and_interleave_rows(shape: list[int], half: int, data: st.DataObject) -> None:
    dim = data.draw(st.integers(-len(shape) - 1, len(shape)), label="dim")
    full = list(shape)
    full.insert(dim % (len(shape) + 1), 2 * half)
    x = labels(*full)
    note(f"shape {full}, dim {dim}")
    a, b = x.split(half, dim=dim)
    assert torch.equal(swap_halves(x, dim), torch.cat((b, a), dim=dim))
    assert torch.equal(swap_halves(swap_halves(x, dim), dim), x)
    inter = interleave_rows(x, dim)
    assert torch.equal(inter.narrow(dim, 0, 1), a.narrow(dim, 0, 1))
    assert torch.equal(inter.narrow(dim, 1, 1), b.narrow(dim, 0, 1))
    assert torch.equal(deinterleave_rows(inter, dim), x)
    assert torch.equal(interleave_rows(deinterleave_rows(x, dim), dim), x)
    assert_holds_each_label_once(inter, x.numel())
    pairs = deinterleave_rows(x, dim)
    assert torch.equal(pairs.narrow(dim, 0, 1), x.narrow(dim, 0, 1))
    assert torch.equal(pairs.narrow(dim, half, 1), x.narrow(dim, 1, 1)), "[g0, u0, ...] -> [g; u]"


# --- SM90 interleaves ----------------------------------------------------------------------------


@given(experts=st.integers(1, 3), row_blocks=st.integers(1, 3), k128=st.integers(1, 3))
def test_sm90_mixed_gemm_scale_interleave(experts: int, row_blocks: int, k128: int) -> None:
    """docs/layouts.md §9: row ``64·rb + 16·s + f`` and group ``4·kb + g`` go to ``[rb, kb, f, 4·s + g]``."""
    rows, kc = 64 * row_blocks, 4 * k128
    s = labels(experts, rows, kc)
    out = sm90_mixed_gemm_scale_interleave(s)
    assert out.shape == (experts, row_blocks, k128, 16, 16)
    assert_holds_each_label_once(out, s.numel())
    assert torch.equal(sm90_mixed_gemm_scale_deinterleave(out), s)
    e, r, c = (t.reshape(-1) for t in torch.meshgrid(*(torch.arange(n) for n in s.shape), indexing="ij"))
    rb, s_, f = r // 64, (r % 64) // 16, r % 16
    kb, g = c // 4, c % 4
    assert torch.equal(out[e, rb, kb, f, 4 * s_ + g], s[e, r, c])


@given(experts=st.integers(1, 3), n=st.integers(1, 40), k4=st.integers(1, 4))
def test_vllm_sm90_scale_interleave(experts: int, n: int, k4: int) -> None:
    """docs/layouts.md §9: ``out[e, kb, 4n + j] = s[e, n, 4kb + j]``; the inverse undoes it."""
    s = labels(experts, n, 4 * k4)
    out = vllm_sm90_scale_interleave(s)
    assert out.shape == (experts, k4, 4 * n)
    assert_holds_each_label_once(out, s.numel())
    assert torch.equal(vllm_sm90_scale_deinterleave(out), s)
    e, r, c = (t.reshape(-1) for t in torch.meshgrid(*(torch.arange(v) for v in s.shape), indexing="ij"))
    assert torch.equal(out[e, c // 4, 4 * r + c % 4], s[e, r, c])


def test_sm90_orders_differ_as_documented() -> None:
    """One 64x128 block: vLLM puts ``(r, g)`` at ``4r + g``, FlashInfer at ``16·(r%16) + 4·(r//16) + g``."""
    s = labels(1, 64, 4)
    r, g = torch.meshgrid(torch.arange(64), torch.arange(4), indexing="ij")
    assert torch.equal(vllm_sm90_scale_interleave(s).reshape(-1)[4 * r + g], s[0])
    assert torch.equal(sm90_mixed_gemm_scale_interleave(s).reshape(-1)[16 * (r % 16) + 4 * (r // 16) + g], s[0])
    assert not torch.equal(vllm_sm90_scale_interleave(s).reshape(-1), sm90_mixed_gemm_scale_interleave(s).reshape(-1))


# --- AITER layouts -------------------------------------------------------------------------------


def offset_e8m0(r: torch.Tensor, c: torch.Tensor, sn: int) -> torch.Tensor:
    """docs/layouts.md §10.1 flat offset of ``(r, c)`` with padded column count ``sn``."""
    return (r // 32) * 32 * sn + (c // 8) * 256 + (c % 4) * 64 + (r % 16) * 4 + ((c % 8) // 4) * 2 + (r % 32) // 16


@given(rows=st.integers(1, 600), cols=st.integers(1, 40), fill=st.sampled_from([0, -1, 10**9]))
@example(rows=2560, cols=20, fill=0)
@example(rows=33, cols=3, fill=-1)
def test_aiter_e8m0_shuffle(rows: int, cols: int, fill: int) -> None:
    s = labels(rows, cols)
    out = aiter_e8m0_shuffle(s, fill)
    sm, sn = round_up(rows, 256), round_up(cols, 8)
    assert out.shape == (sm, sn)
    assert_holds_each_label_once(out, s.numel(), fill)
    assert torch.equal(aiter_e8m0_unshuffle(out, rows, cols), s)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    assert torch.equal(out.reshape(-1)[offset_e8m0(r, c, sn)], s), "§10.1 offset formula"


def test_aiter_e8m0_shuffle_documented_shapes() -> None:
    for (m, n), want in {(2560, 20): (2560, 24), (96, 160): (256, 160), (33, 3): (256, 8)}.items():
        assert tuple(aiter_e8m0_shuffle(torch.zeros(m, n, dtype=torch.uint8)).shape) == want


def view_accepts(rows: int, cols: int) -> bool:
    """Whether vLLM's unpadded ``view(sm/32, 2, 16, sn/8, 2, 4, 1)`` accepts a ``(rows, cols)`` tensor."""
    try:
        torch.zeros(rows, cols, dtype=torch.uint8).view(rows // 32, 2, 16, cols // 8, 2, 4, 1)
    except RuntimeError:
        return False
    return True


ASM_ROWS = st.one_of(st.integers(1, 300), st.integers(1, 10).map(lambda k: 32 * k))
ASM_COLS = st.one_of(st.integers(1, 40), st.integers(1, 5).map(lambda k: 8 * k))


@given(rows=ASM_ROWS, cols=ASM_COLS)
@example(rows=2560, cols=20)  # vLLM PR #55213's view error
@example(rows=2560, cols=24)
def test_vllm_asm_scale_swizzle(rows: int, cols: int) -> None:
    """Equals ``e8m0_shuffle(s)[:rows]`` exactly when the guard holds; the guard is torch's view rule."""
    ok = asm_scale_swizzle_ok(rows, cols)
    assert ok == view_accepts(rows, cols), f"guard disagrees with torch's view for ({rows}, {cols})"
    s = labels(rows, cols)
    if ok:
        assert torch.equal(vllm_asm_scale_swizzle(s), aiter_e8m0_shuffle(s)[:rows])
        assert torch.equal(aiter_e8m0_unshuffle(vllm_asm_scale_swizzle(s), rows, cols), s)
    else:
        with pytest.raises(ShapeContractError, match="rows % 32 == 0 and cols % 8 == 0"):
            vllm_asm_scale_swizzle(s)


def offset_shuffle_weight(n: torch.Tensor, kb: torch.Tensor, bytes_per_row: int) -> torch.Tensor:
    """docs/layouts.md §11 flat offset of byte ``(n, kb)``."""
    return (n // 16) * 16 * bytes_per_row + (kb // 32) * 512 + ((kb % 32) // 16) * 256 + (n % 16) * 16 + kb % 16


@given(experts=st.none() | st.integers(1, 3), n16=st.integers(1, 6), k32=st.integers(1, 4))
def test_aiter_shuffle_weight(experts: int | None, n16: int, k32: int) -> None:
    n, kb = 16 * n16, 32 * k32
    w = labels(n, kb) if experts is None else labels(experts, n, kb)
    out = aiter_shuffle_weight(w)
    assert out.shape == w.shape
    assert_holds_each_label_once(out, w.numel())
    assert torch.equal(aiter_unshuffle_weight(out), w)
    r, c = torch.meshgrid(torch.arange(n), torch.arange(kb), indexing="ij")
    for e, lin in enumerate(w.reshape(-1, n, kb)):
        assert torch.equal(out.reshape(-1, n * kb)[e][offset_shuffle_weight(r, c, kb)], lin), "§11 offset formula"


# --- per-half FC1 padding ------------------------------------------------------------------------


@given(
    halves=st.sampled_from([1, 2]), half=st.integers(1, 20), extra=st.integers(0, 20), fill=st.sampled_from([0, 0x38])
)
def test_pad_fused_rows(halves: int, half: int, extra: int, fill: int) -> None:
    padded_half, cols = half + extra, 3
    x = labels(2, halves * half, cols)
    out = pad_fused_rows(x, halves, padded_half, fill=-1 if fill else 0)
    pad = -1 if fill else 0
    assert out.shape == (2, halves * padded_half, cols)
    for h in range(halves):
        assert torch.equal(out[:, h * padded_half : h * padded_half + half], x[:, h * half : (h + 1) * half])
        assert bool((out[:, h * padded_half + half : (h + 1) * padded_half] == pad).all())
    assert torch.equal(unpad_fused_rows(out, halves, half), x)
    assert torch.equal(pad_dim(x, -1, cols + extra, pad)[..., :cols], x)


# --- constraint violations -------------------------------------------------------------------------

U8 = torch.uint8
VIOLATIONS: dict[str, Callable[[], object]] = {
    "swizzle_128x4 1-D": lambda: swizzle_128x4(torch.zeros(4, dtype=U8)),
    "swizzle_128x4 4-D": lambda: swizzle_128x4(torch.zeros(1, 1, 4, 4, dtype=U8)),
    "unswizzle_128x4 wrong size": lambda: unswizzle_128x4(torch.zeros(128 * 4 + 1, dtype=U8), 128, 4),
    "unswizzle_128x4 rows too large": lambda: unswizzle_128x4(torch.zeros(128, 4, dtype=U8), 129, 4),
    "unswizzle_128x4 flat, two experts": lambda: unswizzle_128x4(torch.zeros(2 * 128 * 4, dtype=U8), 128, 4),
    "row shuffle M % 32": lambda: trtllm_row_shuffle(48),
    "row shuffle M % 16 at tile 64": lambda: trtllm_row_shuffle(40, 64),
    "scale row shuffle M % 128": lambda: trtllm_scale_row_shuffle(352),
    "gated reorder odd": lambda: gated_reorder(7),
    "fc1 scales M % 128": lambda: fc1_permutation(352, gated=True, scales=True),
    "fc2 weights M % 32": lambda: fc2_permutation(2880 + 16, scales=False),
    "fc2 scales M % 128": lambda: fc2_permutation(2880, scales=True),
    "swap_halves odd": lambda: swap_halves(torch.zeros(3, 2)),
    "deinterleave odd": lambda: deinterleave_rows(torch.zeros(5, 2)),
    "interleave odd": lambda: interleave_rows(torch.zeros(2, 5), dim=-1),
    "sm90 2-D": lambda: sm90_mixed_gemm_scale_interleave(torch.zeros(64, 4, dtype=U8)),
    "sm90 rows % 64": lambda: sm90_mixed_gemm_scale_interleave(torch.zeros(1, 96, 4, dtype=U8)),
    "sm90 K % 128": lambda: sm90_mixed_gemm_scale_interleave(torch.zeros(1, 64, 6, dtype=U8)),
    "sm90 inverse wrong shape": lambda: sm90_mixed_gemm_scale_deinterleave(torch.zeros(1, 1, 1, 16, 15, dtype=U8)),
    "vllm sm90 K % 128": lambda: vllm_sm90_scale_interleave(torch.zeros(1, 8, 6, dtype=U8)),
    "vllm sm90 2-D": lambda: vllm_sm90_scale_interleave(torch.zeros(8, 8, dtype=U8)),
    "vllm sm90 inverse odd width": lambda: vllm_sm90_scale_deinterleave(torch.zeros(1, 2, 6, dtype=U8)),
    "e8m0 shuffle 3-D": lambda: aiter_e8m0_shuffle(torch.zeros(1, 32, 8, dtype=U8)),
    "e8m0 unshuffle unpadded": lambda: aiter_e8m0_unshuffle(torch.zeros(33, 8, dtype=U8), 33, 8),
    "e8m0 unshuffle crop too large": lambda: aiter_e8m0_unshuffle(torch.zeros(256, 8, dtype=U8), 257, 8),
    "asm swizzle (2560, 10)": lambda: vllm_asm_scale_swizzle(torch.zeros(2560, 10, dtype=U8)),
    "asm swizzle rows < 32": lambda: vllm_asm_scale_swizzle(torch.zeros(16, 8, dtype=U8)),
    "shuffle_weight N % 16": lambda: aiter_shuffle_weight(torch.zeros(24, 32, dtype=U8)),
    "shuffle_weight K % 64": lambda: aiter_shuffle_weight(torch.zeros(16, 330, dtype=U8)),
    "shuffle_weight 1-D": lambda: aiter_shuffle_weight(torch.zeros(32, dtype=U8)),
    "unshuffle_weight N % 16": lambda: aiter_unshuffle_weight(torch.zeros(24, 32, dtype=U8)),
    "inverse_permutation duplicate": lambda: inverse_permutation(torch.tensor([0, 0, 1])),
    "pad_dim shrink": lambda: pad_dim(torch.zeros(4, 4), 0, 3),
    "pad_fused_rows halves 3": lambda: pad_fused_rows(torch.zeros(6, 2), 3, 4),
    "pad_fused_rows odd rows": lambda: pad_fused_rows(torch.zeros(5, 2), 2, 4),
    "pad_fused_rows shrink": lambda: pad_fused_rows(torch.zeros(8, 2), 2, 3),
    "unpad_fused_rows too long": lambda: unpad_fused_rows(torch.zeros(8, 2), 2, 5),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_constraint_violation_raises_shape_contract_error(case: str) -> None:
    with pytest.raises(ShapeContractError) as info:
        VIOLATIONS[case]()
    assert str(info.value).strip(), f"{case}: empty message"
