"""Shared machinery of the MoE alignment contracts (``nvfp4_moe`` and ``mxfp4_moe``).

Protocol: a policy has ``align_moe(backend, weights, gated) -> AlignedMoe``. It gets one rank's
expert weights, FC1 rows stacked as two halves in the backend's order (FlashInfer's
``[up; gate]``; per-half padding does not depend on the order), and returns zero-padded weights
plus the sizes handed to the kernel. It may raise :class:`UnsupportedConfig` to refuse a
configuration; the properties treat a refusal of a shape real models produce as a failure.
The backend (an enum of the contract) says which format and kernel library the weights are for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.padding import pad_dim, pad_fused_rows


class UnsupportedConfig(Exception):
    """A policy refuses a configuration (for example vLLM's NotImplementedError for gated CUTLASS)."""


@dataclass(frozen=True)
class MoeWeights:
    """One rank's FP4 experts with ``block``-element scale groups (16 NVFP4, 32 MXFP4).

    ``w13`` uint8 ``[E, F·I, H/2]``, ``w13_scale`` bytes ``[E, F·I, H/block]``,
    ``w2`` uint8 ``[E, H, I/2]``, ``w2_scale`` bytes ``[E, H, I/block]``; ``F = 2`` if gated.
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    block: int

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate_size(self) -> int:
        return 2 * self.w2.shape[2]


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


def pad_moe(weights: MoeWeights, gated: bool, padded_intermediate: int, padded_hidden: int) -> AlignedMoe:
    """Zero-pad to ``(Ip, Hp)``: FC1 rows per half, FC1's hidden columns, FC2 rows and FC2's K."""
    f = 2 if gated else 1
    ip, hp, block = padded_intermediate, padded_hidden, weights.block
    w = MoeWeights(
        w13=pad_dim(pad_fused_rows(weights.w13, f, ip), -1, hp // 2),
        w13_scale=pad_dim(pad_fused_rows(weights.w13_scale, f, ip), -1, hp // block),
        w2=pad_dim(pad_dim(weights.w2, -2, hp), -1, ip // 2),
        w2_scale=pad_dim(pad_dim(weights.w2_scale, -2, hp), -1, ip // block),
        block=block,
    )
    return AlignedMoe(w, ip, hp)


def pad_fused_block_at_end(
    weights: MoeWeights, gated: bool, padded_intermediate: int, padded_hidden: int
) -> AlignedMoe:
    """The historical bug (vLLM #55649): FC1's fused block padded at its end, not per half."""
    f, block = 2 if gated else 1, weights.block
    aligned = pad_moe(weights, gated, padded_intermediate, padded_hidden).weights
    w = MoeWeights(
        w13=pad_dim(pad_dim(weights.w13, -2, f * padded_intermediate), -1, padded_hidden // 2),
        w13_scale=pad_dim(pad_dim(weights.w13_scale, -2, f * padded_intermediate), -1, padded_hidden // block),
        w2=aligned.w2,
        w2_scale=aligned.w2_scale,
        block=block,
    )
    return AlignedMoe(w, padded_intermediate, padded_hidden)
