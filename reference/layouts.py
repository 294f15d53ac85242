"""Weight and scale layout transforms, each with its inverse, from ``docs/layouts.md``.

Every transform is defined here once and imported everywhere else. Row permutations are
returned as index tensors ``perm`` with ``out = x[perm]`` (``perm[dst] = src``), the FlashInfer
convention. Shape checks raise :class:`~reference.errors.ShapeContractError` naming the same
constraint the library asserts.

Notation: ``M`` rows, ``Kc`` scale columns, ``Kb`` packed bytes per row, ``ru`` round-up.
"""

from __future__ import annotations

import enum

import torch

from reference.errors import ShapeContractError, require
from reference.sizes import round_up

TRTLLM_EPILOGUE_TILE_M = 128
"""trtllm-gen FP4 weights always use ``epilogue_tile_m = 128`` (shuffle block 32)."""


def is_permutation(perm: torch.Tensor) -> bool:
    """Whether the integer tensor ``perm`` (any shape, ``n`` elements) holds each of ``0..n-1`` exactly once.

    ``n`` values all in ``0..n-1``, none twice, are a bijection; one count per value (``bincount``, O(n))
    decides it without sorting.
    """
    flat = perm.flatten()
    n = flat.numel()
    if n == 0:
        return True
    if int(flat.min()) < 0 or int(flat.max()) >= n:
        return False
    return bool(torch.bincount(flat, minlength=n).eq(1).all())


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``x[perm][inv] == x``; raises unless ``perm`` is a bijection of ``0..n-1``."""
    n = perm.numel()
    require(is_permutation(perm), "index tensor is not a permutation")
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n, device=perm.device)
    return inv


# --- 128x4 scale swizzle (docs/layouts.md §2) -------------------------------------------------------


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """128x4-swizzle linear scales ``[M, Kc]`` or ``[E, M, Kc]`` (FlashInfer ``block_scale_interleave``).

    Pads rows to ``Mp = ru(M, 128)`` and columns to ``Kp = ru(Kc, 4)`` with zeros, then stores each
    128x4 atom as ``[m % 32][(m % 128) // 32][k % 4]``. Returns ``[Mp, Kp]`` (``[E, Mp, Kp]``),
    whose flat byte order is FlashInfer's.
    """
    squeeze = scales.dim() == 2
    require(scales.dim() in (2, 3), f"swizzle_128x4: expected 2-D or 3-D scales, got {scales.dim()}-D")
    s = scales.unsqueeze(0) if squeeze else scales
    e, m, kc = s.shape
    mp, kp = round_up(m, 128), round_up(kc, 4)
    padded = s.new_zeros(e, mp, kp)
    padded[:, :m, :kc] = s
    out = padded.view(e, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(e, mp, kp)
    return out[0] if squeeze else out


def unswizzle_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_128x4`: ``[Mp, Kp]`` (or flat / 3-D) back to ``[rows, cols]`` (a new, contiguous
    tensor)."""
    mp, kp = round_up(rows, 128), round_up(cols, 4)
    squeeze = swizzled.dim() <= 2
    per_expert = swizzled.numel() if squeeze else swizzled.numel() // max(1, swizzled.shape[0])
    require(
        rows > 0 and cols > 0 and per_expert == mp * kp,
        f"unswizzle_128x4: a {tuple(swizzled.shape)} buffer does not hold {'one' if squeeze else 'per expert'} "
        f"[{mp}, {kp}] swizzled block for a [{rows}, {cols}] scale matrix (pass [E, Mp, Kp] for several experts)",
    )
    s = swizzled.reshape(-1, mp * kp)
    e = s.shape[0]
    lin = s.view(e, mp // 128, kp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(e, mp, kp)
    out = lin[:, :rows, :cols].contiguous()
    return out[0] if squeeze else out


# --- trtllm-gen row shuffles (docs/layouts.md §4-§7) -----------------------------------------------


def trtllm_shuffle_block(epilogue_tile_m: int) -> int:
    """Row block of the trtllm shuffle: 32 if ``epilogue_tile_m % 128 == 0`` else 16."""
    return 32 if epilogue_tile_m % 128 == 0 else 16


def trtllm_row_shuffle(rows: int, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M) -> torch.Tensor:
    """Row indices of FlashInfer's ``shuffle_matrix_a``: within each block of B rows (B = 32 for
    tile 128), ``out[8a + t] = x[(B/8)·t + a]``; i.e. ``arange(M).view(M/B, 8, B/8).transpose(1, 2)``.

    Requires ``M % B == 0`` (FlashInfer asserts it).
    """
    b = trtllm_shuffle_block(epilogue_tile_m)
    if rows % b:
        raise ShapeContractError(
            f"trtllm row shuffle: rows = {rows} must be a multiple of {b} (epilogue_tile_m = {epilogue_tile_m})"
        )
    return torch.arange(rows).view(rows // b, 8, b // 8).transpose(1, 2).reshape(rows)


def trtllm_scale_row_shuffle(rows: int, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M) -> torch.Tensor:
    """Row indices of FlashInfer's ``get_shuffle_matrix_sf_a_row_indices``: the weight shuffle,
    after the scale variant's ``M % 128 == 0`` requirement (the assert of vLLM #46879)."""
    if rows % 128:
        raise ShapeContractError(
            f"trtllm scale row shuffle: scale rows = {rows} must be a multiple of 128 "
            f"({rows} % 128 = {rows % 128}); pad the intermediate size (FC1) or hidden size (FC2)"
        )
    return trtllm_row_shuffle(rows, epilogue_tile_m)


def gated_reorder(rows: int) -> torch.Tensor:
    """FlashInfer's gated-row reorder: ``out[2j] = x[j]``, ``out[2j+1] = x[M/2 + j]``.

    With ``[up; gate]`` input the output is ``[u0, g0, u1, g1, ...]``. Requires even ``M``.
    """
    if rows % 2:
        raise ShapeContractError(f"gated row reorder: rows = {rows} must be even")
    return torch.arange(rows).view(2, rows // 2).t().reshape(rows)


def grouped_gate_up_interleave(rows: int, group: int) -> torch.Tensor:
    """Row indices of a gated FC1 interleaved in groups of ``group`` rows: ``[a; b]`` (two halves of
    ``M/2`` rows) becomes ``[a_0..a_{g-1}, b_0..b_{g-1}, a_g..a_{2g-1}, b_g.., ...]``.

    ``out[2g·j + g·h + t] = x[h·M/2 + g·j + t]`` for half ``h``, group ``j``, row ``t < g``; i.e.
    ``arange(M).view(2, M/(2g), g).transpose(0, 1)``. The FC1 layout of FlashInfer's CuteDSL NVFP4 MoE
    (``cute_dsl_fused_moe``: "interleaved 64-row up/gate pair", ``swap_ab=False``; 16-row groups with
    ``swap_ab=True``), built from ``[up; gate]``. Requires ``M % 2g == 0`` (every group whole).
    """
    require(group >= 1, f"grouped gate/up interleave: group must be >= 1, got {group}")
    if rows % (2 * group):
        raise ShapeContractError(
            f"grouped gate/up interleave: rows = {rows} must be a multiple of 2 x {group} "
            f"(each half a whole number of {group}-row groups)"
        )
    return torch.arange(rows).view(2, rows // (2 * group), group).transpose(0, 1).reshape(rows)


def fc1_permutation(
    rows: int, gated: bool, scales: bool, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M
) -> torch.Tensor:
    """Composed FC1 row permutation ``g[r]`` of trtllm-gen FP4 weight prep (``docs/layouts.md`` §7).

    ``g`` is :func:`gated_reorder` (identity if not gated); ``r`` the row shuffle, its scale
    variant (``M % 128``) when ``scales``. ``out[i] = x[g[r[i]]]``.
    """
    shuffle = trtllm_scale_row_shuffle if scales else trtllm_row_shuffle
    r = shuffle(rows, epilogue_tile_m)
    g = gated_reorder(rows) if gated else torch.arange(rows)
    return g[r]


def fc2_permutation(rows: int, scales: bool, epilogue_tile_m: int = TRTLLM_EPILOGUE_TILE_M) -> torch.Tensor:
    """FC2 row permutation of trtllm-gen FP4 weight prep: the row shuffle only."""
    shuffle = trtllm_scale_row_shuffle if scales else trtllm_row_shuffle
    return shuffle(rows, epilogue_tile_m)


def swap_halves(x: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Swap the two halves of ``dim``: ``[w1; w3] -> [w3; w1]`` (vLLM ``reorder_w1w3_to_w3w1``)."""
    n = x.shape[dim]
    require(n % 2 == 0, f"swap_halves: size {n} along dim {dim} must be even")
    a, b = x.split(n // 2, dim=dim)
    return torch.cat((b, a), dim=dim)


def deinterleave_rows(x: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Row-interleaved ``[g0, u0, g1, u1, ...]`` to stacked ``[g; u]`` along ``dim``."""
    require(x.shape[dim] % 2 == 0, f"deinterleave_rows: size {x.shape[dim]} must be even")
    d = dim % x.dim()
    pairs = x.unflatten(d, (-1, 2))
    return torch.cat((pairs.select(d + 1, 0), pairs.select(d + 1, 1)), dim=d)


def interleave_rows(x: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Inverse of :func:`deinterleave_rows`: stacked ``[a; b]`` to ``[a0, b0, a1, b1, ...]``."""
    n = x.shape[dim]
    require(n % 2 == 0, f"interleave_rows: size {n} must be even")
    a, b = x.split(n // 2, dim=dim)
    d = dim % x.dim()
    return torch.stack((a, b), dim=d + 1).flatten(d, d + 1)


# --- SM90 mixed-GEMM scale interleaves (docs/layouts.md §9) ------------------------------------------


def sm90_mixed_gemm_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's ``interleave_moe_scales_for_sm90_mixed_gemm`` for uint8 UE8M0, group 32.

    ``[E, rows, K/32] -> [E, rows/64, K/128, 16, 16]``: within each 64-row x 128-K block, row
    ``16·s + f`` and group ``g`` go to ``[f][4·s + g]``. Requires 3-D, ``rows % 64 == 0`` and
    ``(K/32) % 4 == 0``.
    """
    require(scales.dim() == 3, f"sm90 scale interleave: expected [E, rows, K/32], got {tuple(scales.shape)}")
    e, rows, kc = scales.shape
    require(rows % 64 == 0, f"sm90 scale interleave: rows = {rows} must be a multiple of 64")
    require(kc % 4 == 0, f"sm90 scale interleave: K/32 = {kc} must be a multiple of 4 (K % 128)")
    return (
        scales.reshape(e, rows // 64, 4, 16, kc // 4, 4)
        .permute(0, 1, 4, 3, 2, 5)
        .reshape(e, rows // 64, kc // 4, 16, 16)
    )


def sm90_mixed_gemm_scale_deinterleave(interleaved: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`sm90_mixed_gemm_scale_interleave`: back to ``[E, rows, K/32]``."""
    require(
        interleaved.dim() == 5 and tuple(interleaved.shape[3:]) == (16, 16),
        f"sm90 scale deinterleave: expected [E, rows/64, K/128, 16, 16], got {tuple(interleaved.shape)}",
    )
    e, rb, kb = interleaved.shape[:3]
    return interleaved.reshape(e, rb, kb, 16, 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(e, rb * 64, kb * 4)


def vllm_sm90_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """vLLM's ``_interleave_mxfp4_cutlass_sm90``: ``out[e, kb, 4n + j] = s[e, n, 4kb + j]``.

    ``[E, N, K/32] -> [E, (K/32)/4, 4N]``; requires ``(K/32) % 4 == 0``. Not FlashInfer's order.
    """
    require(scales.dim() == 3, f"vLLM sm90 scale interleave: expected [E, N, K/32], got {tuple(scales.shape)}")
    e, n, kc = scales.shape
    require(kc % 4 == 0, f"vLLM sm90 scale interleave: K/32 = {kc} must be a multiple of 4")
    return scales.view(e, n, kc // 4, 4).permute(0, 2, 1, 3).reshape(e, kc // 4, n * 4)


def vllm_sm90_scale_deinterleave(interleaved: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`vllm_sm90_scale_interleave`: ``[E, (K/32)/4, 4N] -> [E, N, K/32]``."""
    require(
        interleaved.dim() == 3 and interleaved.shape[2] % 4 == 0,
        f"vLLM sm90 scale deinterleave: expected [E, K/128, 4N], got {tuple(interleaved.shape)}",
    )
    e, kb, n4 = interleaved.shape
    return interleaved.reshape(e, kb, n4 // 4, 4).permute(0, 2, 1, 3).reshape(e, n4 // 4, kb * 4)


# --- AITER layouts (docs/layouts.md §10-§11) ---------------------------------------------------------


def _e8m0_permute(padded: torch.Tensor) -> torch.Tensor:
    sm, sn = padded.shape
    return padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().view(sm, sn)


def aiter_e8m0_shuffle(scales: torch.Tensor, fill: int = 0) -> torch.Tensor:
    """AITER ``e8m0_shuffle``: pad ``[m, n]`` to ``[ru(m, 256), ru(n, 8)]`` and permute.

    AITER leaves the pad uninitialised (``torch.empty``); the reference writes ``fill`` and
    callers compare bytes only in the valid region. Flat offset of ``(r, c)`` with padded ``sn``:
    ``(r//32)·32·sn + (c//8)·256 + (c%4)·64 + (r%16)·4 + ((c%8)//4)·2 + (r%32)//16``.
    """
    require(scales.dim() == 2, f"e8m0_shuffle: expected 2-D scales, got {scales.dim()}-D")
    m, n = scales.shape
    padded = scales.new_full((round_up(m, 256), round_up(n, 8)), fill)
    padded[:m, :n] = scales
    return _e8m0_permute(padded)


def aiter_e8m0_unshuffle(shuffled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`aiter_e8m0_shuffle` (and of :func:`vllm_asm_scale_swizzle`), cropped."""
    require(shuffled.dim() == 2, f"e8m0_unshuffle: expected 2-D scales, got {shuffled.dim()}-D")
    sm, sn = shuffled.shape
    require(
        sm % 32 == 0 and sn % 8 == 0 and rows <= sm and cols <= sn,
        f"e8m0_unshuffle: shuffled shape ({sm}, {sn}) must be multiples of (32, 8) and cover ({rows}, {cols})",
    )
    lin = shuffled.view(sm // 32, sn // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2).reshape(sm, sn)
    return lin[:rows, :cols]


def asm_scale_swizzle_ok(rows: int, cols: int) -> bool:
    """Whether vLLM's unpadded 7-D view accepts a 2-D scale ``(rows, cols)``: rows % 32, cols % 8, rows >= 32."""
    return rows >= 32 and rows % 32 == 0 and cols >= 8 and cols % 8 == 0


def vllm_asm_scale_swizzle(scales: torch.Tensor) -> torch.Tensor:
    """vLLM ``AiterMxfp4LinearKernel``'s unpadded swizzle of the e8m0 weight scale ``(sm, sn)``:
    ``view(sm/32, 2, 16, sn/8, 2, 4, 1).permute(0, 3, 5, 2, 4, 1, 6)``, AITER's permutation
    without padding. Raises where torch's view would (``rows % 32`` or ``cols % 8``).
    """
    require(scales.dim() == 2, f"ASM scale swizzle: expected 2-D scales, got {scales.dim()}-D")
    sm, sn = scales.shape
    if not asm_scale_swizzle_ok(sm, sn):
        raise ShapeContractError(
            f"ASM FP4 scale swizzle needs rows % 32 == 0 and cols % 8 == 0 without padding; "
            f"scale shape ({sm}, {sn}) gives the view [{sm // 32}, 2, 16, {sn // 8}, 2, 4, 1] "
            f"which does not cover {sm * sn} elements"
        )
    return _e8m0_permute(scales)


def aiter_shuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """AITER ``shuffle_weight(w, layout=(16, 16))`` on packed FP4 bytes ``[..., N, Kb]``.

    ``view(-1, N/16, 16, Kb/32, 2, 16).permute(0, 1, 3, 4, 2, 5)``; requires ``N % 16`` and
    ``Kb % 32`` (logical ``K % 64``).
    """
    require(w.dim() >= 2, f"shuffle_weight: expected [..., N, K/2] bytes, got {tuple(w.shape)}")
    n, kb = w.shape[-2:]
    require(n % 16 == 0, f"shuffle_weight: N = {n} must be a multiple of 16")
    require(kb % 32 == 0, f"shuffle_weight: packed K = {kb} bytes must be a multiple of 32 (K % 64)")
    return w.reshape(-1, n // 16, 16, kb // 32, 2, 16).permute(0, 1, 3, 4, 2, 5).reshape(w.shape)


def aiter_unshuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`aiter_shuffle_weight`."""
    require(
        w.dim() >= 2 and w.shape[-2] % 16 == 0 and w.shape[-1] % 32 == 0,
        f"unshuffle_weight: expected [..., N, K/2] with N % 16 and K/2 % 32, got {tuple(w.shape)}",
    )
    n, kb = w.shape[-2:]
    return w.reshape(-1, n // 16, kb // 32, 2, 16, 16).permute(0, 1, 4, 2, 3, 5).reshape(w.shape)


# --- Fused gated FC1 row layouts (docs/layouts.md §13) -----------------------------------------------


class Fc1Layout(enum.Enum):
    """Row order of a fused gated FC1 tensor ``[..., 2I, C]`` (a bias ``[..., 2I]`` along its last dim).

    Stacked layouts hold two halves of ``I`` rows; interleaved ones hold row pairs, pair ``j``
    being channel ``j`` of both projections.
    """

    GATE_UP = "gate;up"  # vLLM canonical [w1; w3], Marlin, AITER fused_moe (GateMode.SEPARATED)
    UP_GATE = "up;gate"  # FlashInfer cutlass_fused_moe ``w31``, trtllm-gen before its gated reorder
    GATE_UP_INTERLEAVED = "g0,u0,g1,u1"  # gpt-oss checkpoints
    UP_GATE_INTERLEAVED = "u0,g0,u1,g1"  # trtllm-gen after its gated reorder (vLLM ``swap_every_two_rows``)

    @property
    def interleaved(self) -> bool:
        return self in (Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.UP_GATE_INTERLEAVED)

    @property
    def gate_first(self) -> bool:
        return self in (Fc1Layout.GATE_UP, Fc1Layout.GATE_UP_INTERLEAVED)


def split_fc1(x: torch.Tensor, layout: Fc1Layout, dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate, up)``, each ``I`` rows along ``dim``, from a fused FC1 tensor in ``layout``: views of ``x``.

    Interleaved: ``gate = x[0::2]``, ``up = x[1::2]`` for ``GATE_UP_INTERLEAVED`` (swapped for
    ``UP_GATE_INTERLEAVED``), strided views; stacked: the two halves in the named order. Nothing is
    copied: a caller that keeps, writes or hands on a part copies it (``.contiguous()``, ``clone``).
    """
    require(x.shape[dim] % 2 == 0, f"split_fc1: {x.shape[dim]} FC1 rows along dim {dim} must be even")
    if layout.interleaved:
        d = dim % x.dim()
        pairs = x.unflatten(d, (-1, 2))
        first, second = pairs.select(d + 1, 0), pairs.select(d + 1, 1)
    else:
        first, second = x.chunk(2, dim=dim)
    return (first, second) if layout.gate_first else (second, first)


def join_fc1(gate: torch.Tensor, up: torch.Tensor, layout: Fc1Layout, dim: int = -2) -> torch.Tensor:
    """Inverse of :func:`split_fc1`: fuse ``gate`` and ``up`` (``I`` rows each) into ``layout``, one new
    contiguous tensor (interleaved: the two stacked along a new axis after ``dim``, then flattened)."""
    require(
        gate.shape == up.shape,
        f"join_fc1: gate {tuple(gate.shape)} and up {tuple(up.shape)} projections must have the same shape",
    )
    first, second = (gate, up) if layout.gate_first else (up, gate)
    if layout.interleaved:
        d = dim % gate.dim()
        return torch.stack((first, second), dim=d + 1).flatten(d, d + 1)
    return torch.cat((first, second), dim=dim)


def relayout_fc1(x: torch.Tensor, source: Fc1Layout, target: Fc1Layout, dim: int = -2) -> torch.Tensor:
    """Convert fused FC1 rows from ``source`` to ``target`` layout (``x`` itself when they agree).

    ``GATE_UP_INTERLEAVED -> UP_GATE_INTERLEAVED`` is vLLM's ``swap_every_two_rows``;
    ``GATE_UP_INTERLEAVED -> UP_GATE`` its de-interleave plus half swap for FlashInfer CUTLASS.
    """
    return x if source is target else join_fc1(*split_fc1(x, source, dim), target, dim)
