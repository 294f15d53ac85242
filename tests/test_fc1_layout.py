"""Self-tests of the fused FC1 row layouts (``reference.layouts.Fc1Layout``, ``docs/layouts.md`` §13) and of
their use in ``contracts.moe`` padding.

Rows are labelled ``gate j -> 100 + j``, ``up j -> 200 + j`` so every layout can be read off.
Cross-checks: vLLM's ``swap_every_two_rows`` (``x.reshape(..., n/2, 2).flip``), its CUTLASS
``[::2]`` / ``[1::2]`` de-interleave plus half swap and its CK ``view(n/2, 2).permute`` written out
here from ``docs/vllm-logic.md`` §8, and FlashInfer's real gated reorder of ``[up; gate]`` (the
trtllm-gen layout) when FlashInfer is installed.
"""

from __future__ import annotations

import pytest
import torch

from contracts.errors import LibraryUnavailable
from contracts.moe import MoeWeights, pad_moe
from reference.errors import ShapeContractError
from reference.layouts import Fc1Layout, join_fc1, relayout_fc1, split_fc1
from subjects.moe_bugs import pad_fused_block_at_end

HALF = 4
GATE, UP = torch.arange(100, 100 + HALF), torch.arange(200, 200 + HALF)
ROWS = {
    Fc1Layout.GATE_UP: [100, 101, 102, 103, 200, 201, 202, 203],
    Fc1Layout.UP_GATE: [200, 201, 202, 203, 100, 101, 102, 103],
    Fc1Layout.GATE_UP_INTERLEAVED: [100, 200, 101, 201, 102, 202, 103, 203],
    Fc1Layout.UP_GATE_INTERLEAVED: [200, 100, 201, 101, 202, 102, 203, 103],
}


@pytest.mark.parametrize("layout", list(Fc1Layout), ids=lambda x: x.name)
def test_join_and_split(layout: Fc1Layout) -> None:
    fused = join_fc1(GATE[:, None], UP[:, None], layout)
    assert fused.flatten().tolist() == ROWS[layout]
    gate, up = split_fc1(fused, layout)
    assert torch.equal(gate.flatten(), GATE) and torch.equal(up.flatten(), UP)
    bias = join_fc1(GATE[None], UP[None], layout, dim=-1)
    assert bias.flatten().tolist() == ROWS[layout]


@pytest.mark.parametrize("source", list(Fc1Layout), ids=lambda x: x.name)
@pytest.mark.parametrize("target", list(Fc1Layout), ids=lambda x: x.name)
def test_relayout(source: Fc1Layout, target: Fc1Layout) -> None:
    x = torch.tensor(ROWS[source])[None, :, None].expand(2, -1, 3)
    assert relayout_fc1(x, source, target)[1, :, 2].tolist() == ROWS[target]


def test_vllm_conversions_of_gpt_oss_rows() -> None:
    """vLLM's per-backend conversions of the interleaved checkpoint (``docs/vllm-logic.md`` §8)."""
    ckpt = torch.tensor(ROWS[Fc1Layout.GATE_UP_INTERLEAVED])
    swapped = ckpt.reshape(HALF, 2).flip(-1).reshape(-1)  # TRTLLM swap_every_two_rows
    assert torch.equal(relayout_fc1(ckpt, Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.UP_GATE_INTERLEAVED, -1), swapped)
    w1, w3 = torch.cat([ckpt[::2], ckpt[1::2]]).chunk(2)  # FLASHINFER_CUTLASS de-interleave, then swap
    assert torch.equal(relayout_fc1(ckpt, Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.UP_GATE, -1), torch.cat([w3, w1]))
    ck = ckpt.view(HALF, 2).permute(1, 0).reshape(-1)  # CK view(n/2, 2).permute
    assert torch.equal(relayout_fc1(ckpt, Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.GATE_UP, -1), ck)


def test_trtllm_layout_is_flashinfers_gated_reorder() -> None:
    """``[u0, g0, u1, g1, ...]`` is FlashInfer's gated reorder of ``[up; gate]`` (``docs/layouts.md`` §6, §13)."""
    from adapters import flashinfer as fi

    try:
        perm = fi.gated_reorder(2 * HALF)
    except LibraryUnavailable as exc:
        pytest.skip(str(exc))
    up_gate = torch.tensor(ROWS[Fc1Layout.UP_GATE])
    assert up_gate[perm].tolist() == ROWS[Fc1Layout.UP_GATE_INTERLEAVED]


def test_split_rejects_odd_rows() -> None:
    with pytest.raises(ShapeContractError, match="even"):
        split_fc1(torch.zeros(3, 2), Fc1Layout.GATE_UP)
    with pytest.raises(ShapeContractError, match="same shape"):
        join_fc1(torch.zeros(2, 2), torch.zeros(3, 2), Fc1Layout.GATE_UP)


def _weights(layout: Fc1Layout) -> MoeWeights:
    """One expert, ``I = 4``, ``H = 64``, 2-element scale groups (small enough to read; the padding
    is group-agnostic): FC1 rows labelled as :data:`ROWS` in weights, scales and bias."""
    rows = torch.tensor(ROWS[layout], dtype=torch.uint8)
    return MoeWeights(
        w13=rows[None, :, None].expand(1, 2 * HALF, 32).clone(),
        w13_scale=rows[None, :, None].expand(1, 2 * HALF, 32).clone(),
        w2=torch.ones(1, 64, HALF // 2, dtype=torch.uint8),
        w2_scale=torch.ones(1, 64, HALF // 2, dtype=torch.uint8),
        block=2,
        fc1_layout=layout,
        w13_bias=rows[None].float(),
        w2_bias=torch.ones(1, 64),
    )


@pytest.mark.parametrize("layout", list(Fc1Layout), ids=lambda x: x.name)
def test_pad_moe_keeps_pairs(layout: Fc1Layout) -> None:
    """Per half for stacked layouts, zero pairs at the end for interleaved ones: every gate row
    still meets its up row, and the padded channels are zero in weights, scales and bias."""
    padded = pad_moe(_weights(layout), True, 6, 128).weights
    zeros = torch.zeros(2, dtype=torch.long)
    for name, column in (
        ("w13", lambda t: t[0, :, 0]),
        ("w13_scale", lambda t: t[0, :, 0]),
        ("w13_bias", lambda t: t[0]),
    ):
        dim = -1 if name == "w13_bias" else -2
        gate, up = split_fc1(getattr(padded, name), layout, dim)
        assert column(gate).long().tolist() == [*GATE.tolist(), *zeros.tolist()], name
        assert column(up).long().tolist() == [*UP.tolist(), *zeros.tolist()], name
    assert padded.fc1_layout is layout
    assert tuple(padded.w2_bias.shape) == (1, 128) and not padded.w2_bias[:, 64:].any()


def test_end_padding_mispairs_stacked_rows() -> None:
    """vLLM #55649's end padding of a stacked block shifts the pairing by ``Ip - I``; bias included."""
    padded = pad_fused_block_at_end(_weights(Fc1Layout.GATE_UP), True, 6, 64).weights
    gate, up = split_fc1(padded.w13_bias, Fc1Layout.GATE_UP, dim=-1)
    assert gate[0].long().tolist() == [100, 101, 102, 103, 200, 201]
    assert up[0].long().tolist() == [202, 203, 0, 0, 0, 0]
