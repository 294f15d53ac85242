"""Vocabulary of the ``mxfp4_linear`` contract: AITER kernel selection and weight preparation of an MXFP4 linear layer.

vLLM's ``AiterMxfp4LinearKernel`` runs a dense MXFP4 layer either on AITER's ASM FP4 GEMM
(``gemm_a4w4`` with ``bpreshuffle``) or on the Triton ``gemm_afp4wfp4``: the contract's two
backends, :class:`backends.mxfp4_linear.AiterLinearPath`. The ASM path needs the weight in
``shuffle_weight`` (16, 16) order and the UE8M0 weight scale ``(N, K/32)`` swizzled by an
**unpadded** 7-D view, which only exists for ``rows % 32 == 0`` and ``cols % 8 == 0``; every other
layer must fall back to Triton, whose scale is stored transposed and contiguous, ``(K/32, N)``.

Protocol (:class:`Mxfp4LinearKernelSelection`), one method per step of the real code, so vLLM's
functions adapt directly:

* ``use_asm_gemm(scale_shape) -> bool``: the guard (``_asm_fp4_scale_swizzle_supported`` on a
  tensor of that shape); it sees any rank, non-2-D shapes must be refused;
* ``prepare_asm_linear(weight, scale)`` / ``prepare_triton_linear(weight, scale)``: each path's
  layout (the two branches of ``process_weights_after_loading``), returning
  :class:`PreparedMxfp4Linear`;
* ``process_mxfp4_linear_weights(weight, scale, asm_enabled)``: the whole
  ``process_weights_after_loading`` with ``use_asm_gemm`` preset to ``asm_enabled`` (the
  ``VLLM_ROCM_USE_AITER_FP4_ASM_GEMM`` switch): guard, then one of the two preparations;
* ``linear_activation_rounding(path)``: the MX scale rounding of the activation quantizer each
  path runs (HIP ``per_1x32_f4_quant``: RoundUp = RCEIL since AITER PR #3212; Triton
  ``dynamic_mxfp4_quant``: Even).

Weights are packed uint8 ``[N, K/2]``; scales are uint8 UE8M0 bytes ``[N, K/32]``. A policy may
raise; the properties report any exception from a preparation as a failure.

What a guard may read: ``use_asm_gemm`` gets the layer's real rank-local scale shape ``(N, K/32)``,
and ``process_mxfp4_linear_weights`` real-shaped tensors, so a guard may route on N and K with any
threshold, and on dtypes and devices; the tensor contents are test data (zero codes, scale 1.0), so
not on values. The token count M is unknown at weight processing and not part of the contract: a
kernel defect that depends on M is routed around per shape, and a shape a guard avoids for a
reason other than the swizzle's layout needs a documented defect record
(:data:`backends.kernel_defects.AITER_LINEAR_DEFECTS`). ``prepare_asm_linear`` and
``prepare_triton_linear`` are layouts, not guards: the numerical properties call them on reduced
tensors (same N mod 32, K mod 256, N above or at most 128), so they must not route.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.formats import MxScaleRounding

CONTRACT = "mxfp4_linear"


@dataclass(frozen=True)
class PreparedMxfp4Linear:
    """A layer after weight processing: ``path`` (an ``AiterLinearPath``) and its tensors.

    ASM: ``weight`` is ``shuffle_weight`` (16, 16) of ``[N, K/2]`` (same shape), ``scale`` the
    unpadded swizzle, ``(N, K/32)``. Triton: ``weight`` unchanged, ``scale`` = ``scale.T`` stored
    contiguous, ``(K/32, N)`` (the GEMM gets its ``.T`` view). Either way the tensors are the policy's own
    (new storage, contiguous): the guard's rules, :mod:`harness.hygiene`.
    """

    path: enum.Enum
    weight: torch.Tensor
    scale: torch.Tensor


@runtime_checkable
class Mxfp4LinearKernelSelection(Protocol):
    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        """Whether a layer whose weight scale has ``scale_shape`` may run on the ASM FP4 GEMM."""
        ...

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        """The ASM layout of ``weight [N, K/2]`` and ``scale [N, K/32]``."""
        ...

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        """The Triton layout of ``weight [N, K/2]`` and ``scale [N, K/32]``."""
        ...

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        """Weight processing after loading: pick the path (ASM only if enabled and guarded), prepare."""
        ...

    def linear_activation_rounding(self, path: enum.Enum) -> MxScaleRounding:
        """The MX scale rounding of the activation quantizer ``path`` (an ``AiterLinearPath``) runs."""
        ...
