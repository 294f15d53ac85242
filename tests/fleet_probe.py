"""A probe subject for the fleet tests: wrong only where no pinned example looks.

Its NVFP4 MoE policy pads the fused ``[up; gate]`` block at its end (vLLM #55649's bug) when the
hidden size is not a multiple of 256, and is correct otherwise. Every catalogued model's hidden
size is a multiple of 256, so the pinned regressions pass and only search (adversarial hidden
sizes) finds the bug: what a nightly host finds and the other hosts must replay.
"""

from __future__ import annotations

from subjects.registry import Subject, resolve

_GOOD = resolve("builtin").policy("nvfp4_moe")
_BAD = resolve("bad-end-padding").policy("nvfp4_moe")


class EndPadsOffGridHidden:
    def align_moe(self, backend, weights, gated):
        policy = _BAD if weights.hidden_size % 256 else _GOOD
        return policy.align_moe(backend, weights, gated)


SUBJECT = Subject("fleet-probe", "end-pads the fused block when H % 256 != 0", {"nvfp4_moe": EndPadsOffGridHidden()})
