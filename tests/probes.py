"""Probe subjects: deliberately wrong (or deliberately unusual but correct) policies that show a
verdict of the suite is right both ways.

Each probe is importable as an external subject (``--subject tests.probes:NAME``) and is used by
the self-tests of the contract-level rules (inputs unchanged, determinism and result hygiene, dtypes,
pad values, real layer shapes, documented kernel defects).
"""

from __future__ import annotations

import dataclasses
import enum
import random

import numpy as np
import torch

from adapters.flashinfer_moe_kernels import flashinfer_padded
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe import NVFP4_MOE, AlignedMoe, MoeAlignment, MoeWeights
from contracts.mxfp4_linear import PreparedMxfp4Linear
from reference.layouts import Fc1Layout
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment, EndPaddingAlignment
from subjects.registry import Subject

# --- inputs unchanged ------------------------------------------------------------------------------


class ZeroRowThenPad(BuiltinNvfp4MoeAlignment):
    """Zeroes the first FC1 row of the caller's ``w13`` in place, then pads correctly: the padded
    output is consistent with the (now corrupted) input, so only an input check can see it."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        weights.w13[:, 0].zero_()
        return super().align_moe(backend, weights, gated)


class PadThenScribble(BuiltinNvfp4MoeAlignment):
    """Pads correctly, then overwrites a byte of the caller's ``w2_scale``: the padded weights are
    right, the caller's reference is not."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        weights.w2_scale[0, 0, 0] ^= 0x01
        return aligned


# --- determinism and result hygiene (harness.hygiene) --------------------------------------------------

DRAWS = {
    "random": random.random,
    "numpy": lambda: float(np.random.random()),
    "torch": lambda: float(torch.rand(())),
}
"""A draw in ``[0, 1)`` from each global generator a policy might use."""


class FlakyEndPadding(BuiltinNvfp4MoeAlignment):
    """Pads correctly, except on about one call in ten (a draw from the global generator ``source`` below
    0.1), where it end-pads the fused FC1 block (vLLM #55649's mispairing). Hypothesis seeds ``random`` and
    NumPy alike for every example, so every property draws the same value on its first call and passes."""

    def __init__(self, source: str = "random") -> None:
        self.source = source

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if DRAWS[self.source]() < 0.1:
            return EndPaddingAlignment().align_moe(backend, weights, gated)
        return super().align_moe(backend, weights, gated)


class ScribblesOnLastInput(BuiltinNvfp4MoeAlignment):
    """Keeps each call's weights and zeroes the first FC1 row of the kept ones on its next call with other
    weights (a buffer it took for scratch space); pads correctly. No call writes to the tensors it is given,
    nor to any the property reads afterwards."""

    def __init__(self) -> None:
        self.last: MoeWeights | None = None

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if self.last is not None and self.last is not weights:
            self.last.w13[:, 0].zero_()
        self.last = weights
        return super().align_moe(backend, weights, gated)


class ReusesResultBuffer(BuiltinNvfp4MoeAlignment):
    """Pads correctly into one ``w2`` buffer it keeps and hands out again whenever the shape matches: a
    second call overwrites the result of the first, which its caller still holds."""

    def __init__(self) -> None:
        self.w2: torch.Tensor | None = None

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        w2 = aligned.weights.w2
        if self.w2 is None or self.w2.shape != w2.shape:
            self.w2 = torch.empty_like(w2)
        self.w2.copy_(w2)
        return dataclasses.replace(aligned, weights=dataclasses.replace(aligned.weights, w2=self.w2))


class StridedResult(BuiltinNvfp4MoeAlignment):
    """Pads correctly but returns ``w2`` as a column slice of a wider buffer (an engine's over-allocated
    scratch): right values, strides a kernel reading contiguous rows would misread."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        w2 = aligned.weights.w2
        wide = w2.new_zeros(*w2.shape[:-1], w2.shape[-1] + 8)
        wide[..., : w2.shape[-1]] = w2
        return dataclasses.replace(aligned, weights=dataclasses.replace(aligned.weights, w2=wide[..., : w2.shape[-1]]))


class ResultOnDevice(BuiltinNvfp4MoeAlignment):
    """Pads correctly, then moves ``w2_scale`` to ``device`` (not the device of its inputs)."""

    def __init__(self, device: str = "meta") -> None:
        self.device = device

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        w = aligned.weights
        return dataclasses.replace(aligned, weights=dataclasses.replace(w, w2_scale=w.w2_scale.to(self.device)))


class MislabelledFc1(BuiltinNvfp4MoeAlignment):
    """Pads correctly, FC1 rows still ``[up; gate]``, but declares ``fc1_layout = layout`` (the order a
    B12X / vLLM CUTLASS kernel reads, as if the policy had swapped the halves). The ``nvfp4_moe``
    properties read the rows as ``[up; gate]`` whatever the label says."""

    def __init__(self, layout: Fc1Layout = Fc1Layout.GATE_UP) -> None:
        self.layout = layout

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        return dataclasses.replace(aligned, weights=dataclasses.replace(aligned.weights, fc1_layout=self.layout))


class PassesWeightThrough(BuiltinMxfp4Linear):
    """The Triton layout with the caller's ``weight`` itself as the prepared weight (the built-in before
    results had to own their tensors): the layer and the checkpoint share one buffer."""

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return dataclasses.replace(super().prepare_triton_linear(weight, scale), weight=weight)


# --- dtypes ------------------------------------------------------------------------------------------


class WidenedDtypes(BuiltinNvfp4MoeAlignment):
    """Correct shapes and values, but every tensor widened to ``dtype`` (float32 / int32)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        w = aligned.weights
        widened = dataclasses.replace(
            w, **{n: getattr(w, n).to(self.dtype) for n in ("w13", "w13_scale", "w2", "w2_scale")}
        )
        return dataclasses.replace(aligned, weights=widened)


# --- pad scale values --------------------------------------------------------------------------------


class FlashInferPadHelper:
    """FlashInfer 0.7.4's own ``pad_trtllm_moe_weights`` (scales padded with the format's 1.0:
    E4M3 0x38 for NVFP4), with the contract's sizes as its alignments (FC2 rows end at ``ru(H, 128)``,
    so ``H`` is aligned to 128 here)."""

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned, _, _ = flashinfer_padded(weights, gated, hidden_alignment=128)
        return aligned


class PadFill:
    """``inner``'s padding, then every added scale byte set to ``fill`` and, with ``negative_zero``,
    every added weight byte to 0x88 (two E2M1 ``-0`` codes). The added positions are found by
    aligning a copy whose tensors are all ones: wherever its output holds 0, ``inner`` added it."""

    def __init__(self, inner: MoeAlignment, fill: int, negative_zero: bool = False) -> None:
        self.inner, self.fill, self.negative_zero = inner, fill, negative_zero

    def align_moe(self, backend: enum.Enum, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = self.inner.align_moe(backend, weights, gated)
        names = ("w13", "w13_scale", "w2", "w2_scale")
        ones = dataclasses.replace(weights, **{n: torch.ones_like(getattr(weights, n)) for n in names})
        marker = self.inner.align_moe(backend, ones, gated).weights
        fills = {"w13_scale": self.fill, "w2_scale": self.fill}
        if self.negative_zero:
            fills |= {"w13": 0x88, "w2": 0x88}
        w = aligned.weights
        new = {n: torch.where(getattr(marker, n) == 0, v, getattr(w, n)).to(torch.uint8) for n, v in fills.items()}
        return dataclasses.replace(aligned, weights=dataclasses.replace(w, **new))


# --- linear guards: the real layer shape, documented defects -----------------------------------------


class LargeLayerShortcut(BuiltinMxfp4Linear):
    """Weight processing trusts layers with ``N >= 4096`` to be ASM-aligned and skips its own guard:
    the unpadded swizzle raises on such a layer whose ``K % 256 != 0``. Only a property that hands
    the processing the real layer shape can see it."""

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        if asm_enabled and scale.shape[0] >= 4096:
            return self.prepare_asm_linear(weight, scale)
        return super().process_mxfp4_linear_weights(weight, scale, asm_enabled)


class AvoidsRows(BuiltinMxfp4Linear):
    """The built-in guard, plus a fallback to Triton for scales of ``rows`` rows."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        return super().use_asm_gemm(scale_shape) and scale_shape[0] != self.rows


# --- probes as subjects (``--subject tests.probes:NAME``): an align_moe policy fits both MoE contracts,
# so each is bound to the NVFP4 one it is written for

ZERO_ROW_THEN_PAD = Subject("probe-zero-row-then-pad", "zeroes an input row, then pads", {NVFP4_MOE: ZeroRowThenPad()})
FLAKY_END_PADDING = Subject("probe-flaky-end-padding", "end-pads one call in ten", {NVFP4_MOE: FlakyEndPadding()})
