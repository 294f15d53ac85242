"""The layer a drawn configuration describes, aligned by the policy under test, and its reference output.

Shared by the property modules of a contract (test modules are not imported as libraries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.moe_checks import align_checked
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, relayout_moe
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1
from reference.moe import GateUpOrder, moe_reference, route
from reference.padding import pad_dim
from strategies.catalog import SWIGLU
from strategies.moe import MoeShape
from strategies.mxfp4_moe import Mxfp4MoeConfig
from strategies.tensors import MoeCase, dequantize_moe, generator, moe_case, real_channels, routed_experts_only


def align_nvfp4(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, MoeCase]:
    """The NVFP4 layer of ``shape`` (:func:`strategies.tensors.moe_case`) and ``policy``'s alignment of it."""
    case = moe_case(shape, NVFP4_BLOCK)
    return align_checked(policy, backend, case.weights, shape.gated, shape.describe()), case


@dataclass(frozen=True)
class Mxfp4Case:
    """``checkpoint``: the loader's shard in the checkpoint's FC1 form (the policy's input);
    ``real``: the rank's real channels only, stacked ``[gate; up]`` (the unpadded layer)."""

    checkpoint: MoeWeights
    real: MoeWeights
    x: torch.Tensor
    logits: torch.Tensor


def _biases(config: Mxfp4MoeConfig) -> dict[str, torch.Tensor]:
    """fp32 ``w13_bias [E, 2I]`` (``[gate; up]``, zero past the real channels) and ``w2_bias [E, H]``,
    bf16 values: MXFP4 checkpoints store expert biases in bf16 (gpt-oss's ``*_proj_bias``), and engines
    hold them in bf16 until post-load processing (SGLang's ``Mxfp4MoEMethod.create_weights``)."""
    s = config.shape
    g = generator(s.seed + 1)
    b13 = (torch.randn(s.experts, 2, s.intermediate, generator=g) / 2).bfloat16().float()
    b13[..., s.real_intermediate :] = 0
    b2 = (torch.randn(s.experts, s.hidden, generator=g) / 2).bfloat16().float()
    return {"w13_bias": b13.flatten(1), "w2_bias": b2}


def build_case(config: Mxfp4MoeConfig) -> Mxfp4Case:
    """The layer of ``config`` from its seed (:func:`strategies.tensors.moe_case`, halves ``[gate; up]``)."""
    case = moe_case(config.shape, MXFP4_BLOCK)
    stacked = replace(case.weights, fc1_layout=Fc1Layout.GATE_UP, **(_biases(config) if config.bias else {}))
    real, b13 = config.shape.real_intermediate, stacked.w13_bias
    unpadded = replace(
        real_channels(stacked, True, real),
        fc1_layout=Fc1Layout.GATE_UP,
        w13_bias=None if b13 is None else b13.unflatten(-1, (2, -1))[..., :real].flatten(1),
        w2_bias=stacked.w2_bias,
    )
    return Mxfp4Case(relayout_moe(stacked, config.form.layout), unpadded, case.x, case.logits)


def align_mxfp4(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, Mxfp4Case]:
    """The MXFP4 layer of ``config`` (:func:`build_case`) and ``policy``'s alignment of its checkpoint."""
    case = build_case(config)
    return align_checked(policy, backend, case.checkpoint, True, config.describe()), case


def reference_output(
    w: MoeWeights,
    layout: Fc1Layout,
    case: Mxfp4Case,
    config: Mxfp4MoeConfig,
    x: torch.Tensor | None = None,
    requantize: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Reference MoE output ``[T, H]`` of MXFP4 experts whose FC1 rows are read in ``layout`` (only the routed
    experts dequantized: :func:`~strategies.tensors.routed_experts_only`)."""
    weights, ids = route(case.logits, config.shape.top_k)
    w, _, ids = routed_experts_only(w, ids)
    ones = torch.ones(w.w13.shape[0])
    w13, w2 = dequantize_moe(w, ones, ones)
    w13 = relayout_fc1(w13, layout, Fc1Layout.GATE_UP)
    b13 = None if w.w13_bias is None else relayout_fc1(w.w13_bias, layout, Fc1Layout.GATE_UP, dim=-1)
    xp = pad_dim(case.x if x is None else x, -1, w13.shape[-1])
    out = moe_reference(
        xp, w13, w2, weights, ids, config.shape.activation, GateUpOrder.GATE_UP, b13, w.w2_bias, requantize
    )
    return out[:, : config.shape.hidden]


def silu_no_bias(config: Mxfp4MoeConfig) -> Mxfp4MoeConfig:
    """``config`` as the a4w4 AITER path runs it for vLLM's Quark method: SiLU-gated, no biases."""
    return replace(config, bias=False, shape=replace(config.shape, activation=SWIGLU))
