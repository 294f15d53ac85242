"""Kernel defects that upstream reports document, as data: what a fallback guard may route around.

A guard that sends a layer away from a fast kernel the layout allows is needlessly slow, unless a
documented defect of that kernel covers the layer's shape: routing around it is then the point.
Each :class:`KernelDefect` names the kernel path, the shapes it covers (a predicate over what the
guard sees), the report and whether avoiding it is ``required`` (the kernel's result is wrong on
shapes real models run, so a guard that keeps them on the kernel fails) or only allowed. A guard
that refuses a shape no record covers still fails as over-conservative. Like the known-failure
ledger (:class:`subjects.registry.KnownFailure`), a record is removed when the upstream fix lands
and the suite's pinned versions carry it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adapters import triton_kernels as tk
from reference.formats import MXFP4_BLOCK


@dataclass(frozen=True)
class KernelDefect:
    """A documented defect of the kernel behind ``path`` on the shapes ``applies`` accepts.

    ``applies`` gets the layer's weight-scale shape ``(N, K/32)``, the real rank-local shape the
    guard sees.
    """

    path: str
    reason: str
    link: str
    applies: Callable[[tuple[int, ...]], bool]
    required: bool


ASM_FORCE_TRITON_SCALE_ROWS = frozenset({96})
"""Scale row counts whose unpadded swizzle is valid but whose ASM ``gemm_a4w4`` result is wrong at ``M <= 64``
(the record of vLLM PR #58139 below); strategies draw them as special sizes."""

AITER_LINEAR_DEFECTS: tuple[KernelDefect, ...] = (
    KernelDefect(
        "aiter-asm",
        "ASM gemm_a4w4 is numerically wrong for 96-row weight-scale tiles at M <= 64 (measured on MI355X, "
        "Qwen3.8 TP1 GDN in_proj_ba scale (96, 160)); vLLM's guard unit test pins (96, 160) -> Triton",
        "https://github.com/vllm-project/vllm/pull/58139",
        lambda shape: len(shape) == 2 and shape[0] in ASM_FORCE_TRITON_SCALE_ROWS,
        required=True,
    ),
)
"""Documented defects of AITER's MXFP4 linear kernels (the paths of :mod:`backends.mxfp4_linear`)."""


TRITON_KERNELS_MOE_DEFECTS: tuple[KernelDefect, ...] = (
    KernelDefect(
        "triton-kernels-sm90",
        "matmul_ogs with Hopper MXFP4 weights (HopperMXValueLayout / HopperMXScaleLayout, mx_axis=1) returns a "
        "wrong result, with no error, when K holds an odd number of 32-element groups, whatever the scale "
        "padding (measured on an H200 with triton_kernels 3.5.1 as vendored by vLLM 0.33.0: every K % 64 == 32 "
        "from 32 to 2016; scripts/repro_matmul_ogs_odd_k.py reproduces it with torch and triton_kernels alone)",
        "backends/truth/triton-kernels-sm90.sm90.json",
        lambda shape: len(shape) == 2 and tk.odd_groups(shape[1] * MXFP4_BLOCK),
        required=True,
    ),
)
"""Documented defects of triton_kernels' Hopper MXFP4 GEMM: ``applies`` gets a GEMM's scale shape ``(N, K/32)``.
The record's rule (:func:`adapters.triton_kernels.gemm_violations`) states the same condition as a violation."""


def covering(defects: tuple[KernelDefect, ...], path: str, scale_shape: tuple[int, ...]) -> list[KernelDefect]:
    """The records of ``defects`` for ``path`` whose shapes include ``scale_shape``."""
    return [d for d in defects if d.path == path and d.applies(tuple(scale_shape))]
