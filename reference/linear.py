"""Dense FP4 linear math: an order-fixed fp64 matmul and the dequantized FP4 linear layer.

The matmul accumulates each dot product strictly left to right along K in fp64, one K index at
a time, so appending zero terms (padding along K) leaves every output bit unchanged on every
torch version and device; neither BLAS blocking nor ``cumsum`` (whose CPU kernel is not a plain
sequential scan in every torch release) promises that. Inputs are fp32; products of two fp32
values are exact in fp64.
"""

from __future__ import annotations

import torch

from reference.errors import require
from reference.formats import MxScaleRounding, Quantized, mxfp4_dequantize, mxfp4_quantize


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [T, K] @ b[N, K].T`` in fp32, accumulated left to right along K in fp64.

    Padding K with zeros in both operands (or in either) gives a bit-identical result.
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
    a64, b64 = a.double(), b.double()
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for k in range(a.shape[1]):
        acc += a64[:, k, None] * b64[None, :, k]
    return acc.float()


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
