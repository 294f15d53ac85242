"""Built layers are kept per process and handed out as copies (:func:`strategies.tensors.moe_case`).

A property's backends draw the same shapes, so a layer is built once; a caller that writes into its copy (a
policy behind no guard) must change no later caller's layer.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.layers import digest
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from strategies import tensors
from strategies.moe import pinned_shape

SHAPE = pinned_shape("gemma-4-26b-a4b", 4)


def test_a_copy_written_to_changes_no_later_call(monkeypatch: pytest.MonkeyPatch) -> None:
    first = tensors.moe_case(SHAPE, NVFP4_BLOCK)
    first.weights.w13.zero_()
    first.x.fill_(1.0)
    again = tensors.moe_case(SHAPE, NVFP4_BLOCK)
    monkeypatch.setattr(tensors, "_KEPT", tensors._Kept())
    assert digest(again) == digest(tensors.moe_case(SHAPE, NVFP4_BLOCK))  # as built afresh
    assert again.weights.w13.any()


def test_the_least_recently_used_layer_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "_KEPT", tensors._Kept())
    tensors.moe_case(SHAPE, NVFP4_BLOCK)
    size = tensors._KEPT.bytes
    monkeypatch.setattr(tensors, "KEPT_BYTES", 2 * size)
    tensors.moe_case(SHAPE, MXFP4_BLOCK)
    tensors.moe_case(SHAPE, NVFP4_BLOCK)  # used again: now the most recent
    tensors.moe_case(replace(SHAPE, seed=SHAPE.seed + 1), NVFP4_BLOCK)  # the MXFP4 layer goes
    assert [block for (_, block) in tensors._KEPT.cases] == [NVFP4_BLOCK, NVFP4_BLOCK]
    assert [shape.seed for (shape, _) in tensors._KEPT.cases] == [SHAPE.seed, SHAPE.seed + 1]
