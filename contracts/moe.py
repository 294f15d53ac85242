"""Vocabulary of the MoE alignment contracts (``nvfp4_moe``, ``mxfp4_moe``, ``fp8_moe``): weights, result, protocol.

Protocol: a policy has ``align_moe(backend, weights, gated) -> AlignedMoe``. It gets one rank's
expert weights, FC1 rows in the layout ``weights.fc1_layout`` names (``nvfp4_moe``: FlashInfer's
stacked ``[up; gate]``; ``mxfp4_moe``: the checkpoint's, stacked ``[gate; up]`` or gpt-oss's
row-interleaved pairs; ``fp8_moe``: the checkpoint's stacked ``[gate; up]``), and returns zero-padded weights
plus the sizes handed to the kernel.
It may raise :class:`contracts.errors.UnsupportedConfig` to refuse a configuration; the properties treat a refusal
of a shape real models produce as a failure. The backend (an enum of the contract) says which
format and kernel library the weights are for (its record: :mod:`backends`).

:func:`pad_moe`, :func:`relayout_moe` and :func:`select_experts` are the contract's layout operations on
:class:`MoeWeights` (zero padding per gate/up half, FC1 row order, a subset of the experts), built on
:mod:`reference`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from reference.fp8 import FP8_BLOCK, FP8_TENSOR_BLOCK, ceil_div
from reference.layouts import Fc1Layout, relayout_fc1, split_fc1
from reference.padding import pad_dim, pad_fused_rows

NVFP4_MOE = "nvfp4_moe"
"""Contract name: NVFP4 experts (``block = 16``), FC1 rows in FlashInfer's ``[up; gate]``."""
MXFP4_MOE = "mxfp4_moe"
"""Contract name: MXFP4 experts (``block = 32``), FC1 rows in the checkpoint's layout."""
FP8_MOE = "fp8_moe"
"""Contract name: FP8 E4M3 experts with 128x128 fp32 block scales (``block = 128``), FC1 rows ``[gate; up]``."""
FP8_TENSOR_MOE = "fp8_tensor_moe"
"""Contract name: FP8 E4M3 experts with one fp32 scale per weight (per gated FC1 half; ``block =``
:data:`~reference.fp8.FP8_TENSOR_BLOCK`), FC1 rows ``[gate; up]``."""


def tiled(block: int) -> bool:
    """Whether ``block`` names 2-D scale tiles (FP8's ``block x block``, per-tensor FP8's one tile per weight)
    rather than 1-D row groups (FP4)."""
    return block in (FP8_BLOCK, FP8_TENSOR_BLOCK)


def code_width(block: int, k: int) -> int:
    """Bytes of ``k`` elements along a row: ``k`` E4M3 bytes (FP8), ``k/2`` packed E2M1 pairs (FP4)."""
    return k if tiled(block) else k // 2


def scale_rows(block: int, n: int) -> int:
    """Scale rows of ``n`` weight rows: ``ceil(n/128)`` tiles (FP8), one per row (FP4)."""
    return ceil_div(n, block) if tiled(block) else n


def scale_width(block: int, k: int) -> int:
    """Scale columns of ``k`` elements: ``ceil(k/block)`` (``k/block`` for FP4's whole groups)."""
    return ceil_div(k, block)


def channel_unit(block: int, tensor: str) -> int:
    """Intermediate channels one entry of :class:`MoeWeights` field ``tensor`` covers along its channel
    dimension (FC1 rows, FC2 columns, ``w13_bias``): a ``block``-channel tile of FP8 scales (FC1 rows and FC2
    columns alike), a ``block``-channel group of FP4 FC2 scales, two channels of a packed FP4 FC2 byte, else one.
    A TP split on whole units of every tensor keeps each scale with the channels it scales."""
    if tensor.endswith("_scale"):
        return block if tiled(block) or tensor == "w2_scale" else 1
    return 2 if tensor == "w2" and not tiled(block) else 1


@dataclass(frozen=True)
class MoeWeights:
    """One rank's experts with ``block``-element scale groups (16 NVFP4, 32 MXFP4) or ``block x block`` scale
    tiles (128 FP8).

    FP4: ``w13`` uint8 ``[E, F·I, H/2]``, ``w13_scale`` uint8 ``[E, F·I, H/block]``,
    ``w2`` uint8 ``[E, H, I/2]``, ``w2_scale`` uint8 ``[E, H, I/block]``; ``F = 2`` if gated.
    FP8: ``w13`` uint8 E4M3 bytes ``[E, F·I, H]``, ``w13_scale`` fp32 ``[E, F·ceil(I/128), ceil(H/128)]`` (each
    gate/up half its own tiles), ``w2`` uint8 ``[E, H, I]``, ``w2_scale`` fp32 ``[E, ceil(H/128), ceil(I/128)]``;
    per-tensor FP8 the same with one tile per weight: ``w13_scale [E, F, 1]``, ``w2_scale [E, 1, 1]``
    (:func:`code_width`, :func:`scale_rows`, :func:`scale_width`; dtypes: :func:`tensor_dtypes`).
    ``fc1_layout`` is the row order of gated FC1 tensors (weights, scales and bias alike).
    Optional fp32 biases: ``w13_bias [E, F·I]`` (in ``fc1_layout``) and ``w2_bias [E, H]``.
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    block: int
    fc1_layout: Fc1Layout = Fc1Layout.UP_GATE
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.w2.shape[2] if tiled(self.block) else 2 * self.w2.shape[2]


FC1_TENSORS = ("w13", "w13_scale", "w13_bias")
"""The :class:`MoeWeights` fields whose rows are in ``fc1_layout`` (gated: gate and up projections fused)."""

TENSOR_DTYPES = {
    "w13": torch.uint8,
    "w13_scale": torch.uint8,
    "w2": torch.uint8,
    "w2_scale": torch.uint8,
    "w13_bias": torch.float32,
    "w2_bias": torch.float32,
}
"""The dtype of each :class:`MoeWeights` tensor, in and out of a policy: packed E2M1 codes and block-scale
codes (E4M3 for ``block = 16``, UE8M0 for 32) are bytes, uint8 (an engine's float8 view of a scale is
its own business); biases fp32."""


def tensor_dtypes(block: int) -> dict[str, torch.dtype]:
    """:data:`TENSOR_DTYPES` of ``block``'s format: FP8 block scales are fp32 (vLLM's ``weight_scale_inv``)."""
    if tiled(block):
        return {**TENSOR_DTYPES, "w13_scale": torch.float32, "w2_scale": torch.float32}
    return TENSOR_DTYPES


@dataclass(frozen=True)
class AlignedMoe:
    """Padded weights and the sizes handed to the kernel (``intermediate_size`` is ``Ip``)."""

    weights: MoeWeights
    intermediate_size: int
    hidden_size: int


@runtime_checkable
class MoeAlignment(Protocol):
    def align_moe(self, backend: enum.Enum, weights: MoeWeights, gated: bool) -> AlignedMoe:
        """Return zero-padded weights satisfying ``backend``'s layout contract."""
        ...


def _pad_fc1(x: torch.Tensor, f: int, layout: Fc1Layout, padded_intermediate: int) -> torch.Tensor:
    """Pad FC1 rows (dim -2) to ``F·Ip`` (``Ip`` rows per half, or scale rows per half): per half when stacked;
    at the end when row-interleaved, where each added pair is a zero (gate, up) pair and every real pair stays
    adjacent."""
    if f == 2 and layout.interleaved:
        return pad_dim(x, -2, 2 * padded_intermediate)
    return pad_fused_rows(x, f, padded_intermediate)


def owned(result: torch.Tensor | None, given: torch.Tensor | None) -> torch.Tensor | None:
    """``result``, copied if it shares storage with ``given`` (padding that added nothing returns its input or
    a view of it): a policy's result never shares storage with its inputs (the guard's rule,
    :mod:`harness.hygiene`)."""
    shares = (
        result is not None
        and given is not None
        and result.untyped_storage().data_ptr() == given.untyped_storage().data_ptr()
    )
    return result.clone(memory_format=torch.contiguous_format) if shares else result


def pad_moe(weights: MoeWeights, gated: bool, padded_intermediate: int, padded_hidden: int) -> AlignedMoe:
    """Zero-pad to ``(Ip, Hp)``: FC1 rows per half (at the end of row-interleaved pairs), FC1's hidden
    columns, FC2 rows and FC2's K, and their scales to the padded sizes' scale grid (zero scales, FP8 tiles
    included); ``w13_bias`` like FC1 rows, ``w2_bias`` at its end. Every tensor is new (:func:`owned`), even
    where nothing is added."""
    f = 2 if gated else 1
    ip, hp, block, layout = padded_intermediate, padded_hidden, weights.block, weights.fc1_layout
    b13 = None if weights.w13_bias is None else _pad_fc1(weights.w13_bias[..., None], f, layout, ip)[..., 0]
    rows_i, rows_h = scale_rows(block, ip), scale_rows(block, hp)
    padded = {
        "w13": pad_dim(_pad_fc1(weights.w13, f, layout, ip), -1, code_width(block, hp)),
        "w13_scale": pad_dim(_pad_fc1(weights.w13_scale, f, layout, rows_i), -1, scale_width(block, hp)),
        "w2": pad_dim(pad_dim(weights.w2, -2, hp), -1, code_width(block, ip)),
        "w2_scale": pad_dim(pad_dim(weights.w2_scale, -2, rows_h), -1, scale_width(block, ip)),
        "w13_bias": b13,
        "w2_bias": None if weights.w2_bias is None else pad_dim(weights.w2_bias, -1, hp),
    }
    w = MoeWeights(
        **{name: owned(t, getattr(weights, name)) for name, t in padded.items()}, block=block, fc1_layout=layout
    )
    return AlignedMoe(w, ip, hp)


def relayout_moe(weights: MoeWeights, layout: Fc1Layout) -> MoeWeights:
    """The gated weights with FC1 rows (weights, scales, bias) converted to ``layout``; FC2 unchanged."""
    source = weights.fc1_layout
    return replace(
        weights,
        w13=relayout_fc1(weights.w13, source, layout),
        w13_scale=relayout_fc1(weights.w13_scale, source, layout),
        w13_bias=None if weights.w13_bias is None else relayout_fc1(weights.w13_bias, source, layout, dim=-1),
        fc1_layout=layout,
    )


def select_experts(weights: MoeWeights, experts: Sequence[int]) -> MoeWeights:
    """``weights`` of the experts ``experts`` (valid ids), in that order: every tensor's expert dimension (dim 0)."""
    ids = torch.tensor(list(experts), dtype=torch.long)
    names = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")
    return replace(weights, **{n: t.index_select(0, ids) for n in names if (t := getattr(weights, n)) is not None})


def cut_hidden(weights: MoeWeights, hidden: int) -> MoeWeights:
    """``weights`` with the hidden dimension cut back to ``hidden`` (FC1 columns and their scales, FC2 rows
    and their scales, ``w2_bias``): an engine's buffer read back where it pads the hidden size. A cut tensor is
    a contiguous copy (a result's tensors are contiguous, :mod:`harness.hygiene`); an uncut one is returned
    as it is."""
    g = weights.block
    return replace(
        weights,
        w13=weights.w13[..., : code_width(g, hidden)].contiguous(),
        w13_scale=weights.w13_scale[..., : scale_width(g, hidden)].contiguous(),
        w2=weights.w2[..., :hidden, :].contiguous(),
        w2_scale=weights.w2_scale[..., : scale_rows(g, hidden), :].contiguous(),
        w2_bias=None if weights.w2_bias is None else weights.w2_bias[..., :hidden].contiguous(),
    )


def _fc1_dim(name: str) -> int:
    return -1 if name == "w13_bias" else -2


WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16}
"""The word dtypes of :func:`byte_words` by their size in bytes (``harness.hygiene.raw_words`` picks from them too)."""


def _word_size(t: torch.Tensor) -> int:
    """The largest of 8, 4 and 2 that divides ``t``'s last dimension (of stride 1), its other strides and its
    storage offset, for a uint8 or int8 ``t`` of at least one dimension; 1 when none does or ``t`` is another."""
    if t.dtype not in (torch.uint8, torch.int8) or t.dim() == 0 or t.stride(-1) != 1:
        return 1
    return math.gcd(8, t.shape[-1], t.storage_offset(), *t.stride()[:-1])


def byte_words(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``ts`` (uint8 or int8, where equal values are equal bytes) viewed as the widest of int64, int32 and int16
    that divides every one's last dimension (of stride 1), other strides and storage offset: the same bytes, fewer
    elements (``torch.equal`` on words is several times faster on CPU than on bytes); ``ts`` themselves otherwise."""
    dtype = WORDS.get(min(map(_word_size, ts)))
    return ts if dtype is None else tuple(t.view(dtype) for t in ts)


def _leads(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """``src`` is the leading corner of ``dst`` (same rank and dtype, ``dst`` at least as large)."""
    if (
        src.dtype != dst.dtype
        or src.dim() != dst.dim()
        or any(d < s for d, s in zip(dst.shape, src.shape, strict=True))
    ):
        return False
    return bool(torch.equal(*byte_words(dst[tuple(slice(0, n) for n in src.shape)], src)))


def fc1_layout_holds(source: MoeWeights, padded: MoeWeights, name: str, layout: Fc1Layout) -> bool:
    """Whether gated FC1 tensor ``name`` of ``padded`` holds ``source``'s rows in ``layout``.

    It does when :func:`~reference.layouts.split_fc1` of ``padded.name`` in ``layout`` gives a gate and an up
    projection ``[..., Ip, C']`` whose leading ``[..., I, C]`` corners are ``source``'s gate and up projections
    (split in ``source.fc1_layout``): zero padding at the end of each projection and of the columns, as
    :func:`pad_moe` writes it. False when a tensor is missing, their ranks differ or either has an odd number of
    FC1 rows.
    """
    src, dst, dim = getattr(source, name), getattr(padded, name), _fc1_dim(name)
    if src is None or dst is None or src.dim() != dst.dim() or src.shape[dim] % 2 or dst.shape[dim] % 2:
        return False
    gate_up = split_fc1(src, source.fc1_layout, dim)
    return all(_leads(s, d) for s, d in zip(gate_up, split_fc1(dst, layout, dim), strict=True))


def fc1_layouts_holding(source: MoeWeights, padded: MoeWeights, name: str) -> list[Fc1Layout]:
    """The row orders in which gated FC1 tensor ``name`` of ``padded`` holds ``source``'s rows
    (:func:`fc1_layout_holds`). Empty when no layout does (mispaired or reshaped data) or a tensor is missing;
    several when the data cannot tell them apart (for example ``I = 1``).
    """
    return [layout for layout in Fc1Layout if fc1_layout_holds(source, padded, name, layout)]
