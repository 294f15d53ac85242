"""Hypothesis strategy for MXFP4 activation quantizers: bf16 rows aimed at the rounding rules.

A quantizer reads two things of a 32-element block: its amax (the scale exponent rule, whose
modes differ only for amax mantissas in (1.5, 1.75) and at 1.75) and each element's position
between two E2M1 values after scaling (the element rounding, whose conventions differ only at
exact midpoints). :class:`ActivationTiles` draws sizes, an exponent range, how many elements to
snap onto E2M1 values and midpoints, and a seed; :func:`activation_tile` builds the bf16 tensor.
Shrinking lands on one token, one block, no snapping.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from reference.formats import E2M1_MAGNITUDES, MXFP4_BLOCK, MxScaleRounding, mx_scale_exponent
from strategies.config import Config
from strategies.linear import token_counts

E2M1_MIDPOINTS = tuple((a + b) / 2 for a, b in itertools.pairwise(E2M1_MAGNITUDES))
"""Midpoints between neighbouring E2M1 magnitudes: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5."""

BF16_MANTISSAS = 128
"""bf16 amax mantissas ``1 + j/128``: the (1.5, 1.75) band is ``j`` in 65..95, its edges 64 and 96."""


@dataclass(frozen=True)
class ActivationTiles(Config):
    """bf16 activations ``[tokens, 32·blocks]``.

    Block amax is ``(1 + j/128)·2^E`` with ``j`` drawn per block (a third of the blocks from the
    RCEIL/EVEN band and its edges) and ``E`` in ``[-exponent_range, exponent_range]``; the other
    elements are uniform in ``(-amax, amax)``, and ``snap_percent`` of them are moved onto an
    E2M1 value or a midpoint of the EVEN-scaled grid (never above amax). ``zero_block`` zeroes
    the first block of the first row.
    """

    tokens: int
    blocks: int
    exponent_range: int
    snap_percent: int
    zero_block: bool
    seed: int

    def describe(self) -> str:
        return (
            f"activations [{self.tokens}, {MXFP4_BLOCK * self.blocks}] bf16, block exponents within "
            f"±{self.exponent_range}, {self.snap_percent}% snapped to E2M1 values / midpoints, "
            f"zero block {self.zero_block}, seed={self.seed}"
        )


@st.composite
def activation_tiles(draw: st.DrawFn) -> ActivationTiles:
    """Tokens as decode/prefill sizes (1-65, plus up to 300 for the quantizer's large-M tiles), K up
    to 160 blocks (5120, past the 1024 / 16384 tile thresholds of ``dynamic_mxfp4_quant``)."""
    tokens = draw(st.one_of(token_counts(), st.integers(66, 300)))
    blocks = draw(st.one_of(st.integers(1, 8), st.sampled_from((32, 33, 64, 80, 160)), st.integers(1, 160)))
    return ActivationTiles(
        tokens,
        blocks,
        draw(st.sampled_from((0, 8, 60))),
        draw(st.sampled_from((0, 25, 100))),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


def activation_tile(case: ActivationTiles) -> torch.Tensor:
    """The bf16 ``[tokens, 32·blocks]`` tensor of ``case`` (see :class:`ActivationTiles`)."""
    g = torch.Generator().manual_seed(case.seed)
    t, b = case.tokens, case.blocks
    band = torch.randint(64, 97, (t, b), generator=g)
    anywhere = torch.randint(0, BF16_MANTISSAS, (t, b), generator=g)
    j = torch.where(torch.rand(t, b, generator=g) < 1 / 3, band, anywhere)
    exponent = torch.randint(-case.exponent_range, case.exponent_range + 1, (t, b), generator=g)
    amax = torch.ldexp(1 + j.float() / BF16_MANTISSAS, exponent)  # exact in bf16
    x = (torch.rand(t, b, MXFP4_BLOCK, generator=g) * 2 - 1) * amax[..., None]
    x = x.to(torch.bfloat16).float().clamp(-amax[..., None], amax[..., None])
    pos = torch.randint(MXFP4_BLOCK, (t, b, 1), generator=g)
    sign = torch.where(torch.rand(t, b, 1, generator=g) < 0.5, -1.0, 1.0)
    x.scatter_(-1, pos, sign * amax[..., None])
    scale = torch.ldexp(torch.ones(t, b), mx_scale_exponent(amax, MxScaleRounding.EVEN).int())[..., None]
    grid = torch.tensor(sorted(E2M1_MAGNITUDES + E2M1_MIDPOINTS))
    target = grid[torch.randint(len(grid), (t, b, MXFP4_BLOCK), generator=g)] * scale
    snap = (torch.rand(t, b, MXFP4_BLOCK, generator=g) * 100 < case.snap_percent) & (target <= amax[..., None])
    snap.scatter_(-1, pos, False)
    x = torch.where(snap, torch.copysign(target, x), x)
    if case.zero_block:
        x[0, 0] = 0
    return x.reshape(t, b * MXFP4_BLOCK).to(torch.bfloat16)
