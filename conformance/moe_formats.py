"""The MoE weight formats, one record each: what the generic MoE properties need to know of a format.

A :class:`MoeFormat` names its contract and backend enum, its scale-group size (the step of the
minimal-padding search and the pad rule's scale format), how a drawn configuration becomes a layer and
the policy's alignment of it (the case builder), the MoE shape of a configuration, the re-quantization of
the intermediate in the reference output, and which FC1 row order the policy's output is in. The
properties themselves are written once, in :mod:`conformance.moe_properties`. Adding a format: its contract
and backend records, a record here, and a test module calling
:func:`conformance.moe_properties.moe_alignment_properties` with it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis.strategies import SearchStrategy

from backends import record
from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.layers import MoeLayer, align_fp8, align_fp8_tensor, align_mxfp4, align_nvfp4
from conformance.moe_checks import PadRule, pad_rule
from conformance.regressions import (
    FP8_MOE_REGRESSIONS,
    FP8_TENSOR_MOE_REGRESSIONS,
    MXFP4_MOE_REGRESSIONS,
    NVFP4_MOE_REGRESSIONS,
)
from contracts.moe import FP8_MOE, FP8_TENSOR_MOE, MXFP4_MOE, NVFP4_MOE, AlignedMoe, MoeAlignment
from reference import fp8
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK, GlobalScale, nvfp4_dequantize, nvfp4_quantize
from reference.layouts import Fc1Layout
from strategies.moe import MoeShape, moe_shapes
from strategies.mxfp4_moe import Mxfp4MoeConfig, mxfp4_moe_configs


@dataclass(frozen=True)
class MoeFormat:
    """One MoE weight format as the generic properties see it.

    ``name``: the format's short name (test names of properties run per format); ``contract``: the contract name (``pytest.mark.contract``, ledgers); ``backends``: its backend enum
    (records: :class:`backends.moe.MoeBackendRecord`); ``block``: elements per scale group; ``config``: the
    configuration type, drawn by ``strategy`` and pinned by ``pins``; ``shape(config)``: its
    :class:`~strategies.moe.MoeShape`; ``align(config, backend, policy)``: the layer and the policy's
    alignment of it (the case builder, :mod:`conformance.layers`); ``requantize``: what the reference applies
    to the activated intermediate before FC2 (``None``: nothing); ``aligned_layout``: the FC1 row order the
    policy returns, fixed by the contract, or ``None`` where the policy reorders to the backend record's
    ``fc1_layout``; ``size_step``: the minimal-padding search's step where it is not ``block`` (a per-tensor
    format has no group).
    """

    name: str
    contract: str
    backends: type[enum.Enum]
    block: int
    config: type
    strategy: SearchStrategy[Any]
    pins: tuple[Any, ...]
    shape: Callable[[Any], MoeShape]
    align: Callable[[Any, Any, MoeAlignment], tuple[AlignedMoe, MoeLayer]]
    requantize: Callable[[torch.Tensor], torch.Tensor] | None
    aligned_layout: Fc1Layout | None
    size_step: int | None = None

    @property
    def step(self) -> int:
        """The step of the minimal-padding search: ``size_step``, else the scale-group size."""
        return self.size_step or self.block

    def fc1_layout(self, backend: enum.Enum) -> Fc1Layout:
        """The FC1 row order of the policy's output for ``backend`` (as the kernel, after the engine's own
        swap where the contract fixes the order, reads it)."""
        return self.aligned_layout or record(backend).fc1_layout

    def pad_rule(self, tensor: str) -> PadRule:
        """What a padded element of ``tensor`` may hold (:func:`conformance.moe_checks.pad_rule`)."""
        return pad_rule(tensor, self.block)


INTERMEDIATE_DECODE = 2.0**-3
"""Fixed decode global scale of the re-quantized NVFP4 intermediate (a calibrated constant in a real model)."""


def nvfp4_requantize(a: torch.Tensor) -> torch.Tensor:
    """The NVFP4 kernels' re-quantization of the activated intermediate, at :data:`INTERMEDIATE_DECODE`."""
    q = nvfp4_quantize(a, INTERMEDIATE_DECODE, GlobalScale.DECODE)
    return nvfp4_dequantize(q, INTERMEDIATE_DECODE, GlobalScale.DECODE)


NVFP4 = MoeFormat(
    name="nvfp4",
    contract=NVFP4_MOE,
    backends=Nvfp4MoeBackend,
    block=NVFP4_BLOCK,
    config=MoeShape,
    strategy=moe_shapes(),
    pins=NVFP4_MOE_REGRESSIONS,
    shape=lambda shape: shape,
    align=align_nvfp4,
    requantize=nvfp4_requantize,
    aligned_layout=Fc1Layout.UP_GATE,  # FlashInfer's [up; gate]; vLLM swaps for a [gate; up] kernel afterwards
)
"""NVFP4 experts (``block = 16``), gated or not, FC1 rows ``[up; gate]`` in and out of the policy."""

MXFP4 = MoeFormat(
    name="mxfp4",
    contract=MXFP4_MOE,
    backends=Mxfp4MoeBackend,
    block=MXFP4_BLOCK,
    config=Mxfp4MoeConfig,
    strategy=mxfp4_moe_configs(),
    pins=MXFP4_MOE_REGRESSIONS,
    shape=lambda config: config.shape,
    align=align_mxfp4,
    requantize=None,
    aligned_layout=None,
)
"""MXFP4 experts (``block = 32``), gated, from a stacked or row-interleaved checkpoint, with or without biases;
the policy reorders FC1 rows to the backend's."""

FP8_BLOCK = MoeFormat(
    name="fp8",
    contract=FP8_MOE,
    backends=Fp8MoeBackend,
    block=fp8.FP8_BLOCK,
    config=MoeShape,
    # ranks split and adversarial sizes drawn in 16-channel units: intermediate sizes per rank that are not
    # whole 128-blocks (80 = 640 / 8) are the format's subject
    strategy=moe_shapes(group=NVFP4_BLOCK, contract=FP8_MOE),
    pins=FP8_MOE_REGRESSIONS,
    shape=lambda shape: shape,
    align=align_fp8,
    requantize=None,
    aligned_layout=Fc1Layout.GATE_UP,  # vLLM's w13 [w1; w3]; the engine swaps for trtllm-gen's [up; gate] afterwards
)
"""Block-scaled FP8 experts (E4M3 bytes, fp32 128x128 tile scales), gated or not, FC1 rows ``[gate; up]`` in and
out of the policy. The reference applies no re-quantization to the intermediate (the kernels' per-token
1x128 activation quantization is not modelled: zero pad channels leave every group's amax unchanged)."""

FP8_TENSOR = MoeFormat(
    name="fp8_tensor",
    contract=FP8_TENSOR_MOE,
    backends=Fp8TensorMoeBackend,
    block=fp8.FP8_TENSOR_BLOCK,
    config=MoeShape,
    strategy=moe_shapes(group=NVFP4_BLOCK, contract=FP8_TENSOR_MOE),
    pins=FP8_TENSOR_MOE_REGRESSIONS,
    shape=lambda shape: shape,
    align=align_fp8_tensor,
    requantize=None,
    aligned_layout=Fc1Layout.GATE_UP,  # vLLM's w13 [w1; w3]; the engine swaps for trtllm-gen's [up; gate] afterwards
    size_step=NVFP4_BLOCK,  # vLLM's 16-channel padding unit: sizes are drawn and searched in it
)
"""Per-tensor FP8 experts (E4M3 bytes, one fp32 scale per weight and gated FC1 half), gated or not, FC1 rows
``[gate; up]`` in and out of the policy; padding adds weight rows and columns, never scales. No re-quantization
of the intermediate in the reference (the kernels' static activation scales are not modelled)."""
