"""The guard's shortcuts (:mod:`harness.inputs`, :mod:`harness.hygiene`) give what the long way gives.

:func:`~harness.hygiene.raw_words` picks its word from the flat tensor's size and offset instead of through
:func:`~contracts.moe.byte_words`; a tensor an earlier call returned keeps its refreshed copy as the next call's
snapshot, so a change the caller made before that call is its own and a write by the call is still caught; a
second result equal to the first is not read again for the declared-layout rule, and one that differs is.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe import AlignedMoe, MoeWeights, byte_words
from harness import hygiene
from harness.hygiene import FalseLayoutDeclared, NonDeterministic, raw_words
from harness.inputs import InputModified, guard_inputs
from reference.layouts import Fc1Layout
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment

BASE = torch.arange(48, dtype=torch.uint8)
TENSORS = {
    "uint8 3x16": BASE.reshape(3, 16),
    "uint8 odd offset": BASE[1:],
    "uint8 offset 4": BASE[4:16],
    "float32 strided": BASE.view(torch.float32).reshape(3, 4)[:, 1:],
    "bfloat16": BASE.view(torch.bfloat16)[1:4],
    "float64 scalar": torch.tensor(1.5, dtype=torch.float64),
    "empty": torch.zeros(0, 3),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_raw_words_are_byte_words_of_the_flat_bytes(name: str) -> None:
    t = TENSORS[name]
    (want,) = byte_words(t.reshape(-1).contiguous().view(torch.uint8))
    got = raw_words(t)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert torch.equal(got, want)


class _Echo:
    """Returns a copy of ``x`` plus one; writes ``fill`` into ``x`` first when set."""

    fill: int | None = None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        if self.fill is not None:
            x.fill_(self.fill)
        return x + 1


def test_a_result_passed_back_keeps_its_refreshed_copy() -> None:
    policy = _Echo()
    guarded = guard_inputs(policy)
    out = guarded.step(torch.zeros(4))
    out.add_(5)  # the caller's own change: refreshed, not blamed on the next call
    assert torch.equal(guarded.step(out), torch.full((4,), 7.0))
    policy.fill = 9
    with pytest.raises(InputModified, match=r"Echo\.step wrote to the tensors it was given.*x \[4\]"):
        guarded.step(out)


class _SecondCallMislabels(BuiltinNvfp4MoeAlignment):
    """Correct on its first call; on its second, the same rows labelled ``[gate; up]`` (they are ``[up; gate]``)."""

    def __init__(self) -> None:
        self.calls = 0

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        self.calls += 1
        aligned = super().align_moe(backend, weights, gated)
        if self.calls % 2:
            return aligned
        return dataclasses.replace(aligned, weights=dataclasses.replace(aligned.weights, fc1_layout=Fc1Layout.GATE_UP))


def test_the_layout_rule_reads_a_second_result_only_where_it_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = moe_case(pinned_shape("gemma-4-26b-a4b", 4), 16).weights
    backend = Nvfp4MoeBackend.FLASHINFER_TRTLLM
    read = []
    every = hygiene.declared_layouts
    monkeypatch.setattr(hygiene, "declared_layouts", lambda named, result: read.append(result) or every(named, result))
    guard_inputs(BuiltinNvfp4MoeAlignment()).align_moe(backend, weights, True)
    assert len(read) == 1  # the second result equals the first: same data, same fc1_layout, same verdict
    read.clear()
    with pytest.raises(FalseLayoutDeclared, match=r"w13 holds weights's gate/up rows in up;gate order"):
        guard_inputs(_SecondCallMislabels()).align_moe(backend, weights, True)  # the rule comes before determinism
    assert len(read) == 2
    monkeypatch.setattr(hygiene, "declared_layouts", lambda named, result: [])
    with pytest.raises(NonDeterministic, match=r"result\.weights\.fc1_layout: <Fc1Layout\.UP_GATE"):
        guard_inputs(_SecondCallMislabels()).align_moe(backend, weights, True)
