"""Hypothesis strategies for MXFP8 dense linear layers (``mxfp8_linear``): sizes and a tensor seed.

``N`` and ``K`` are drawn small (any size up to 600) or on, just below and just above a multiple of 32, 128
or 256, the alignments the ``mm_mxfp8`` backends ask for (:mod:`backends.mxfp8_linear`), so every record's
rounding and its 128 minimum meet sizes on both sides. ``K`` need not be a multiple of 32 (a last partial
scale block). Tensors are built from the seed (:func:`mxfp8_linear_case`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from reference.mxfp8 import MXFP8_BLOCK, Mxfp8Quantized, mxfp8_quantize
from reference.padding import pad_dim
from reference.sizes import round_up
from strategies.config import Config

ALIGNMENTS = (32, 128, 256)
OFFSETS = (-31, -16, -1, 0, 1, 15, 16, 17)


@dataclass(frozen=True)
class Mxfp8LinearShape(Config):
    """An MXFP8 linear layer ``[N, K]`` and ``tokens`` activation rows; ``seed`` builds the tensors."""

    n: int
    k: int
    tokens: int
    seed: int


def sizes() -> st.SearchStrategy[int]:
    """Small sizes, or a multiple of an alignment moved by one of :data:`OFFSETS` (never below 1)."""
    near = st.builds(
        lambda a, m, o: max(1, a * m + o), st.sampled_from(ALIGNMENTS), st.integers(1, 4), st.sampled_from(OFFSETS)
    )
    return st.one_of(st.integers(1, 600), near)


def mxfp8_linear_shapes() -> st.SearchStrategy[Mxfp8LinearShape]:
    return st.builds(Mxfp8LinearShape, n=sizes(), k=sizes(), tokens=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))


@dataclass(frozen=True)
class Mxfp8LinearCase:
    """Tensors of a shape: ``layer`` (codes ``[N, K]``, scales ``[N, ceil(K/32)]``) and activations ``x [T, K]``."""

    layer: Mxfp8Quantized
    x: torch.Tensor


def mxfp8_linear_case(shape: Mxfp8LinearShape) -> Mxfp8LinearCase:
    """A weight of normal values times ``2^u`` (``u`` in [-8, 8] per element) MXFP8-quantized with its last
    partial block's missing elements zero, and fp32 normal activations."""
    g = torch.Generator().manual_seed(shape.seed)
    w = torch.randn(shape.n, shape.k, generator=g) * torch.exp2(
        torch.randint(-8, 9, (shape.n, shape.k), generator=g).float()
    )
    q = mxfp8_quantize(pad_dim(w, 1, round_up(shape.k, MXFP8_BLOCK)))
    x = torch.randn(shape.tokens, shape.k, generator=g)
    return Mxfp8LinearCase(Mxfp8Quantized(q.codes[:, : shape.k].contiguous(), q.scales), x)
