"""Vocabulary of the ``mxfp8_linear`` contract: preparing an MXFP8 linear layer's weight for a GEMM backend.

An MXFP8 linear layer (OCP MX, :mod:`reference.mxfp8`) holds E4M3 weight bytes ``weight`` uint8 ``[N, K]``
and UE8M0 scale bytes ``scale`` uint8 ``[N, ceil(K/32)]``, one per 32 elements along K (a last partial
block when ``K % 32 != 0``, its missing elements zero). A GEMM backend (FlashInfer's ``mm_mxfp8``, a member
of :class:`backends.mxfp8_linear.Mxfp8LinearBackend`) takes only some sizes, and reads the scales as a grid
padded to 128 rows and 4 columns before its own swizzle or shuffle (``F8_128x4``).

Protocol (:class:`Mxfp8LinearPreparation`): ``prepare_mxfp8_linear(backend, weight, scale)`` returns
:class:`PreparedMxfp8Linear`: the weight zero-padded to ``(Np, Kp)``, the padded sizes the backend's record
asks for (:meth:`backends.mxfp8_linear.Mxfp8LinearRecord.padded_shape`), and the scale grid padded to the
record's :meth:`~backends.mxfp8_linear.Mxfp8LinearRecord.scale_grid` of ``(Np, Kp)``, still row-major
(the swizzle or shuffle that follows is the library's and not part of the contract). The original bytes stay
in the top-left corner; padded weight bytes are E4M3 zeros and padded scale bytes finite E8M0 values (what
they scale is zero; vLLM 0.33.0 writes byte 0). The GEMM output's first ``N`` columns are the layer's.
A policy may raise :class:`contracts.errors.UnsupportedConfig`; the properties treat that as a failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

CONTRACT = "mxfp8_linear"


@dataclass(frozen=True)
class PreparedMxfp8Linear:
    """A prepared layer: ``weight`` uint8 E4M3 bytes ``[Np, Kp]``, ``scale`` uint8 UE8M0 grid ``[R, C]``
    (row-major, before the backend's swizzle), each the policy's own storage."""

    weight: torch.Tensor
    scale: torch.Tensor


@runtime_checkable
class Mxfp8LinearPreparation(Protocol):
    def prepare_mxfp8_linear(
        self, backend: enum.Enum, weight: torch.Tensor, scale: torch.Tensor
    ) -> PreparedMxfp8Linear:
        """``weight [N, K]`` and ``scale [N, ceil(K/32)]`` padded for ``backend`` (an ``Mxfp8LinearBackend``)."""
        ...
