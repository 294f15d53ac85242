"""Self-tests of the kernel properties' stage references (``conformance/moe_checks.py``): the routed experts'
dequantization and the per-slot float64 products against the direct formulas they replace (every expert
dequantized, gathered per slot, one einsum). Values are small dyadic numbers, so every float64 sum is exact and
the two agree bit for bit in any order of summation."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.moe_checks import routed_experts, slot_products
from contracts.moe import MoeWeights
from reference.formats import MXFP4_BLOCK, Quantized, mxfp4_dequantize
from reference.layouts import Fc1Layout


def dyadic(g: torch.Generator, *shape: int) -> torch.Tensor:
    """fp32 multiples of 1/4 in ``[-8, 8]``: products and their sums are exact in float64."""
    return torch.randint(-32, 33, shape, generator=g).float() / 4


@given(
    experts=st.integers(1, 5),
    slots=st.integers(1, 9),
    n=st.integers(1, 6),
    k=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_slot_products_are_the_gathered_einsum(experts: int, slots: int, n: int, k: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, w = dyadic(g, slots, k), dyadic(g, experts, n, k)
    ids = torch.randint(0, experts, (slots,), generator=g)
    exact, magnitude = slot_products(x, w, ids)
    gathered = w.double()[ids]
    assert torch.equal(exact, torch.einsum("sk,snk->sn", x.double(), gathered))
    assert torch.equal(magnitude, torch.einsum("sk,snk->sn", x.double().abs(), gathered.abs()))
    assert exact.dtype == torch.float64 and exact.device.type == "cpu"


@given(
    experts=st.integers(1, 6),
    tokens=st.integers(1, 5),
    top_k=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_routed_experts_are_the_dequantized_experts_in_slot_order(
    experts: int, tokens: int, top_k: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    intermediate, hidden = MXFP4_BLOCK, 2 * MXFP4_BLOCK

    def fp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = torch.randint(0, 256, (experts, rows, cols // 2), generator=g, dtype=torch.uint8)
        return packed, torch.randint(120, 135, (experts, rows, cols // MXFP4_BLOCK), generator=g, dtype=torch.uint8)

    w = MoeWeights(*fp4(2 * intermediate, hidden), *fp4(hidden, intermediate), MXFP4_BLOCK, Fc1Layout.GATE_UP)
    ids = torch.randint(0, experts, (tokens, top_k), generator=g)
    w13, w2, slots = routed_experts(w, ids, torch.device("cpu"))
    full13 = mxfp4_dequantize(Quantized(w.w13, w.w13_scale))
    full2 = mxfp4_dequantize(Quantized(w.w2, w.w2_scale))
    assert torch.equal(w13[slots], full13[ids.reshape(-1)])
    assert torch.equal(w2[slots], full2[ids.reshape(-1)])
    assert len(w13) == len(ids.unique())  # only the routed experts are dequantized
