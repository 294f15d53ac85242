"""Subjects of the ``mxfp8_linear`` contract (:mod:`contracts.mxfp8_linear`): MXFP8 linear weight preparation.

The built-in policy pads to the record's sizes (:mod:`backends.mxfp8_linear`) with E4M3 zero bytes and the
scale grid with byte 0, as vLLM 0.33.0's ``swizzle_mxfp8_scale`` and its TRTLLM path do. Known-bad subjects
make one mistake each in the sizes, the fill or the amount of padding.
"""

from __future__ import annotations

import enum

import torch

from backends import record
from backends.mxfp8_linear import Mxfp8LinearBackend, Mxfp8LinearRecord
from contracts.mxfp8_linear import CONTRACT, Mxfp8LinearPreparation, PreparedMxfp8Linear
from reference.padding import pad_dim
from reference.sizes import round_up
from subjects.registry import Subject, register_contract, register_subject


def pad_layer(
    weight: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int], grid: tuple[int, int], scale_fill: int = 0
) -> PreparedMxfp8Linear:
    """``weight [N, K]`` zero-padded to ``shape`` and ``scale`` padded to ``grid`` with ``scale_fill``, new storage."""
    w = pad_dim(pad_dim(weight, 0, shape[0]), 1, shape[1]).clone()
    s = pad_dim(pad_dim(scale, 0, grid[0], scale_fill), 1, grid[1], scale_fill).clone()
    return PreparedMxfp8Linear(w, s)


class BuiltinMxfp8Linear:
    """Correct policy: the record's padded sizes and scale grid, weight bytes 0, scale bytes 0."""

    def prepare_mxfp8_linear(
        self, backend: enum.Enum, weight: torch.Tensor, scale: torch.Tensor
    ) -> PreparedMxfp8Linear:
        r = record(backend)
        assert isinstance(r, Mxfp8LinearRecord)
        shape = r.padded_shape(*weight.shape)
        return pad_layer(weight, scale, shape, r.scale_grid(*shape))


class K16Mxfp8Linear:
    """Rounds K up to a multiple of 16 (NVFP4's block) instead of the MXFP8 block of 32."""

    def prepare_mxfp8_linear(
        self, backend: enum.Enum, weight: torch.Tensor, scale: torch.Tensor
    ) -> PreparedMxfp8Linear:
        r = record(backend)
        assert isinstance(r, Mxfp8LinearRecord)
        n, k = weight.shape
        kp = max(round_up(k, 16 if r.k_multiple == 32 else r.k_multiple), 128)
        shape = (r.padded_shape(n, k)[0], kp)
        return pad_layer(weight, scale, shape, r.scale_grid(*shape))


class NanScalePadMxfp8Linear(BuiltinMxfp8Linear):
    """Pads the scale grid with ``-1`` (byte 0xFF, an E8M0 NaN) instead of 0."""

    def prepare_mxfp8_linear(
        self, backend: enum.Enum, weight: torch.Tensor, scale: torch.Tensor
    ) -> PreparedMxfp8Linear:
        r = record(backend)
        assert isinstance(r, Mxfp8LinearRecord)
        shape = r.padded_shape(*weight.shape)
        return pad_layer(weight, scale, shape, r.scale_grid(*shape), scale_fill=0xFF)


class OverpadNMxfp8Linear:
    """Pads N to a multiple of 128 on every path (the TRTLLM path's rule), where CUTLASS and CuTe-DSL take any
    ``N >= 128``: correct but larger and slower."""

    def prepare_mxfp8_linear(
        self, backend: enum.Enum, weight: torch.Tensor, scale: torch.Tensor
    ) -> PreparedMxfp8Linear:
        r = record(backend)
        assert isinstance(r, Mxfp8LinearRecord)
        n, k = weight.shape
        shape = (round_up(n, 128), r.padded_shape(n, k)[1])
        return pad_layer(weight, scale, shape, r.scale_grid(*shape))


register_contract(CONTRACT, Mxfp8LinearPreparation, BuiltinMxfp8Linear(), tuple(Mxfp8LinearBackend))
register_subject(
    Subject(
        "bad-mxfp8-k16",
        "MXFP8 linear: K rounded up to a multiple of 16 instead of the 32-element MX block",
        {CONTRACT: K16Mxfp8Linear()},
        reproduces="FlashInfer mm_mxfp8 requires K % 32 (vLLM 0.33.0 _check_mm_mxfp8_shape); NVFP4's 16 reused",
    )
)
register_subject(
    Subject(
        "bad-mxfp8-nan-scale-pad",
        "MXFP8 linear: scale grid padded with -1 (byte 0xFF, E8M0 NaN) instead of 0",
        {CONTRACT: NanScalePadMxfp8Linear()},
        reproduces="OCP MX v1.0 §5: E8M0 byte 0xFF is NaN; F.pad(scale, value=-1) on uint8 writes it",
    )
)
register_subject(
    Subject(
        "bad-mxfp8-overpad",
        "MXFP8 linear: N padded to a multiple of 128 on the CUTLASS and CuTe-DSL paths too (not minimal)",
        {CONTRACT: OverpadNMxfp8Linear()},
        reproduces="over-padding (performance class, docs/regressions.md §1 'Over-padding cost')",
    )
)
