"""Probe subjects: deliberately wrong (or deliberately unusual but correct) policies that show a
verdict of the suite is right both ways.

Each probe is importable as an external subject (``--subject tests.probes:NAME``) and is used by
the self-tests of the contract-level rules (inputs unchanged, dtypes, pad values, real layer
shapes, documented kernel defects).
"""

from __future__ import annotations

import dataclasses

import torch

from adapters import flashinfer as fi
from subjects.moe import AlignedMoe, MoeWeights
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment, MoeBackend

# --- inputs unchanged ------------------------------------------------------------------------------


class ZeroRowThenPad(BuiltinNvfp4MoeAlignment):
    """Zeroes the first FC1 row of the caller's ``w13`` in place, then pads correctly: the padded
    output is consistent with the (now corrupted) input, so only an input check can see it."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        weights.w13[:, 0].zero_()
        return super().align_moe(backend, weights, gated)


class PadThenScribble(BuiltinNvfp4MoeAlignment):
    """Pads correctly, then overwrites a byte of the caller's ``w2_scale``: the padded weights are
    right, the caller's reference is not."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        weights.w2_scale[0, 0, 0] ^= 0x01
        return aligned


# --- dtypes ------------------------------------------------------------------------------------------


class WidenedDtypes(BuiltinNvfp4MoeAlignment):
    """Correct shapes and values, but every tensor widened to ``dtype`` (float32 / int32)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
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

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        core = fi._import("flashinfer.fused_moe.core")
        out = core.pad_trtllm_moe_weights(
            weights.w13,
            weights.w13_scale,
            weights.w2,
            weights.w2_scale,
            weights.hidden_size,
            weights.intermediate_size,
            is_gated_act=gated,
            hidden_alignment=128,
            intermediate_alignment=128,
        )
        padded = MoeWeights(
            out.gemm1_weights, out.gemm1_weights_scale, out.gemm2_weights, out.gemm2_weights_scale, weights.block
        )
        return AlignedMoe(padded, out.intermediate_size, out.hidden_size)


class ScaleFill(BuiltinNvfp4MoeAlignment):
    """Correct padding, then every added scale byte set to ``fill`` (and, with ``negative_zero``, every
    added weight nibble to E2M1 code 8 = -0)."""

    def __init__(self, fill: int, negative_zero: bool = False) -> None:
        self.fill, self.negative_zero = fill, negative_zero

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        aligned = super().align_moe(backend, weights, gated)
        f, i, ip = 2 if gated else 1, weights.intermediate_size, aligned.intermediate_size

        def refill(src: torch.Tensor, dst: torch.Tensor, fc1: bool, value: int) -> torch.Tensor:
            keep = torch.zeros_like(dst, dtype=torch.bool)
            if fc1:
                for half in range(f):
                    keep[:, half * ip : half * ip + i, : src.shape[2]] = True
            else:
                keep[:, : src.shape[1], : src.shape[2]] = True
            return torch.where(keep, dst, torch.full_like(dst, value))

        w = aligned.weights
        new = {
            "w13_scale": refill(weights.w13_scale, w.w13_scale, True, self.fill),
            "w2_scale": refill(weights.w2_scale, w.w2_scale, False, self.fill),
        }
        if self.negative_zero:
            new |= {"w13": refill(weights.w13, w.w13, True, 0x88), "w2": refill(weights.w2, w.w2, False, 0x88)}
        return dataclasses.replace(aligned, weights=dataclasses.replace(w, **new))
