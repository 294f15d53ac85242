"""The guard's shortcuts (:mod:`harness.inputs`, :mod:`harness.hygiene`) give what the long way gives.

:func:`~harness.hygiene.raw_words` picks its word from the flat tensor's size and offset instead of through
:func:`~contracts.moe.byte_words`; a tensor an earlier call returned keeps its refreshed copy as the next call's
snapshot, so a change the caller made before that call is its own and a write by the call is still caught.
"""

from __future__ import annotations

import pytest
import torch

from contracts.moe import byte_words
from harness.hygiene import raw_words
from harness.inputs import InputModified, guard_inputs

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
