"""Dense FP4 linear math: an order-fixed fp64 matmul and the dequantized FP4 linear layer.

The matmul is defined as accumulating each dot product strictly left to right along K in fp64,
one K index at a time, so appending zero terms (padding along K) leaves every output bit
unchanged on every torch version and device; neither BLAS blocking nor ``cumsum`` (whose CPU
kernel is not a plain sequential scan in every torch release) promises that by itself. Inputs
are fp32; products of two fp32 values are exact in fp64. Where :func:`order_free` proves that
no order of the sums can round, one fp64 GEMM gives the same bits (:func:`exact_matmul`).
"""

from __future__ import annotations

import torch

from reference.errors import require
from reference.formats import MxScaleRounding, Quantized, mxfp4_dequantize, mxfp4_quantize

_FP32_VALUED = (torch.float32, torch.bfloat16, torch.float16)
_FLOOR = -400  # every fp32 value is a multiple of 2^-149, so of 2^-400
_CEIL = 600  # 2^-600 times an fp32 value is still a normal fp64 number


def lsb_exponent(x: torch.Tensor) -> torch.Tensor:
    """``min_k lsb(x[r, k])`` per row of ``x [R, K]`` with fp32 values (int64 ``[R]``), zeros left out.

    ``lsb(v)`` is the exponent of the least significant set bit of ``v``: ``v = odd · 2^lsb(v)``.
    An FP4 code times a power-of-two scale has at most two significant bits; a random fp32 value
    has 24. From the bits: ``lsb = max(E, 1) - 150 + ctz(fraction)`` with ``E`` the biased
    exponent (``ctz = 23`` for a zero fraction, which ``m & -m`` landing in the exponent field
    gives after the clamp). A row of zeros gives about ``2^31``.
    """
    m = x.float().contiguous().view(torch.int32) & 0x7FFFFFFF
    low = m & -m  # the lowest set bit of the magnitude's bits
    ctz = (low.float().view(torch.int32) >> 23).clamp_max_(150)  # 127 + ctz of the significand
    biased = (m >> 23).clamp_min_(1) + ctz - 128  # >= 0 for non-zeros; -127 for zeros
    return (biased & 0x7FFFFFFF).amin(-1).to(torch.int64) - 149  # zeros: -127 -> 2^31 - 127


def _order_free(a: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor) -> bool:
    if not torch.isfinite(s := a64.abs() @ b64.abs().T).all():
        return False
    need = torch.frexp(s)[1].to(torch.int64) - 52 - lsb_exponent(a)[:, None]
    need = torch.where(s == 0, _FLOOR, need).amax(0).clamp_min(_FLOOR)
    if bool((need > _CEIL).any()):
        return False
    r = b64 * torch.ldexp(torch.ones_like(need, dtype=torch.float64), -need)[:, None]
    return torch.equal(r, r.round())


def order_free(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether every sum ``Σ_k a[t, k]·b[n, k]`` (fp32 values) is exact in fp64 in any order.

    Proof. Let ``S = Σ_k |a[t, k]·b[n, k]|`` and let every ``a[t, k]`` be an integer multiple of
    ``2^qa`` and every ``b[n, k]`` one of ``2^qb``. A product of two fp32 values is exact in fp64
    (at most 48 significant bits, exponents within [-298, 256]) and a multiple of ``2^q``,
    ``q = qa + qb``; so is any partial sum of any subset of the products, in any grouping, and
    its magnitude is at most ``S``. If ``S < 2^(q+53)`` each such number is ``m·2^q`` with
    ``|m| < 2^53``, which fp64 represents: every addition (or fused multiply-add) of any fp64
    evaluation returns its exact result, whatever the order, blocking or number of
    accumulators, so every evaluation, the left-to-right loop included, yields the exact sum.

    The test: ``qa`` is ``a``'s row minimum of :func:`lsb_exponent`; ``S`` is computed in fp64 as
    ``S'`` by a GEMM of ``|a|`` and ``|b|``, and a sum of ``K`` non-negative terms in any order
    is within a factor ``(1 - 2^-53)^(K-1) > 1/2`` of the truth, so ``S' < 2^e`` (``e`` its frexp
    exponent) gives ``S < 2^(e+1)``. Row ``b[n]`` must then be a multiple of
    ``2^need[n]``, ``need[n] = max_t (e[t, n] - 52 - qa[t])`` (raising it to ``-400``, which
    every fp32 value meets, only makes the test stricter); scaling ``b[n]`` by
    ``2^-need[n]`` is exact in fp64 and gives integers exactly then. An Inf or NaN input makes
    ``S'`` non-finite and the answer False.

    Dequantized FP4 weights (two significant bits, a few scale exponents per row) times fp32
    activations pass for most shapes the suite draws; large cancelling terms spread over many
    binades fail, and :func:`exact_matmul` then runs the loop.
    """
    if a.dtype not in _FP32_VALUED or b.dtype not in _FP32_VALUED:
        return False
    return _order_free(a, a.double(), b.double())


def sequential_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [T, K] @ b [N, K].T`` summed left to right along K in fp64 from +0.0 (fp64 ``[T, N]``):
    the definition of :func:`exact_matmul`, ``acc = acc + a[:, k]·b[:, k]`` for ``k = 0..K-1``.

    Two shortcuts leave every bit of that loop unchanged:

    * K indices whose products are all ±0 (``a[:, k]`` all zero and ``b[:, k]`` finite, or the
      other way round) are skipped. Under round-to-nearest an fp64 sum is -0.0 only when both
      addends are -0.0 (``+0 + -0 = +0``, ``x + -x = +0``, and a non-zero exact sum never rounds
      to zero, underflow being gradual), so the accumulator, +0.0 at the start, is never -0.0;
      and ``acc + ±0`` returns ``acc`` itself for every other ``acc`` (a NaN as it was). Zero
      padding along K in either operand is thus never visited.
    * For fp32-valued operands each product is exact in fp64 (at most 48 significant bits,
      exponents within [-298, 256]), so ``acc.addcmul_(a, b)`` rounds once, to the same bits as
      the add of the separately computed product, whether or not it runs as a fused multiply-add.
      Other dtypes (fp64) keep the separate multiply and add.
    """
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    if acc.numel() == 0:
        return acc
    amax, bmax = a.abs().amax(0), b.abs().amax(0)  # per K index; a NaN propagates
    zero = ((amax == 0) & bmax.isfinite()) | ((bmax == 0) & amax.isfinite())
    at, bt = a.T.contiguous(), b.T.contiguous()  # [K, T], [K, N]: transposed in their own dtype, then widened
    if bool(zero.any()):  # only the K indices visited, in order: [K', T], [K', N]
        kept = (~zero).nonzero().flatten()
        at, bt = at.index_select(0, kept), bt.index_select(0, kept)
    at, bt = at.double(), bt.double()
    fused = a.dtype in _FP32_VALUED and b.dtype in _FP32_VALUED
    for ak, bk in zip(at[:, :, None].unbind(0), bt[:, None, :].unbind(0), strict=True):
        if fused:
            acc.addcmul_(ak, bk)
        else:
            acc += ak * bk
    return acc


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [T, K] @ b[N, K].T`` in fp32, accumulated left to right along K in fp64.

    Padding K with zeros in both operands (or in either) gives a bit-identical result. When
    :func:`order_free` holds, one fp64 GEMM gives the same bits as the loop (both are the exact
    sums; ``+ 0.0`` turns a GEMM's ``-0.0`` into the loop's ``+0.0``); otherwise the loop
    (:func:`sequential_matmul`) runs. ``a`` is the operand with few rows (tokens).
    """
    require(
        a.dim() == 2 and b.dim() == 2,
        f"exact_matmul: expected 2-D operands, got {tuple(a.shape)} and {tuple(b.shape)}",
    )
    require(
        a.shape[1] == b.shape[1],
        f"exact_matmul: reduction sizes differ: activations K = {a.shape[1]}, weights K = {b.shape[1]}",
    )
    if a.shape[1] == 0 or a.shape[0] == 0 or b.shape[0] == 0:
        return a.new_zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    if a.dtype in _FP32_VALUED and b.dtype in _FP32_VALUED:
        a64, b64 = a.double(), b.double()
        if _order_free(a, a64, b64):
            return (a64 @ b64.T + 0.0).float()
    return sequential_matmul(a, b).float()


def mxfp4_linear(x: torch.Tensor, w: Quantized, act_rounding: MxScaleRounding) -> torch.Tensor:
    """MXFP4 x MXFP4 linear layer ``y = Q(x) · W^T`` on the dequantized operands.

    ``x [T, K]`` is quantized per 32 elements with ``act_rounding`` (the mode of the path under
    test); ``w`` is packed ``[N, K/2]`` with UE8M0 scales ``[N, K/32]``. Returns fp32 ``[T, N]``.
    """
    require(
        x.shape[-1] == 2 * w.packed.shape[-1],
        f"mxfp4_linear: activations K = {x.shape[-1]} but weight holds K = {2 * w.packed.shape[-1]}",
    )
    xq = mxfp4_dequantize(mxfp4_quantize(x, act_rounding))
    return exact_matmul(xq, mxfp4_dequantize(w))
