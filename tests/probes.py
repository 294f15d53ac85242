"""Probe subjects: deliberately wrong (or deliberately unusual but correct) policies that show a
verdict of the suite is right both ways.

Each probe is importable as an external subject (``--subject tests.probes:NAME``) and is used by
the self-tests of the contract-level rules (inputs unchanged, dtypes, pad values, real layer
shapes, documented kernel defects).
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from adapters.flashinfer_moe_kernels import flashinfer_padded
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights
from contracts.mxfp4_linear import PreparedMxfp4Linear
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment

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
