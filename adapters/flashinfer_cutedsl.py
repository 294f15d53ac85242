"""FlashInfer 0.7.4's CuteDSL NVFP4 MoE (``flashinfer.fused_moe.cute_dsl``): acceptance rules and weight layout.

The CuteDSL kernels are CuTe DSL (``nvidia-cutlass-dsl``) programs for SM100/SM103 (``cute_dsl_fused_moe``:
"Supported architectures: SM100, SM103, and SM107"); FlashInfer's module does not import without the
``cutlass`` package, so nothing of it runs on a CPU machine. The rules below are read from its source:

* ``blockscaled_contiguous_gather_grouped_gemm_act_fusion.py`` (GEMM1, the fused FC1 + activation)
  raises ``ValueError("GEMM1 output dim n=... must be a multiple of 128")`` for ``n = F·Ip``;
  its ``can_implement`` asks 16-byte-contiguous K for FP4 operands (``K % 32``) and an MMA N tile of
  128 or 256 for gated activations ("SwiGlu Fusion requires even epi_tile counts");
* ``cute_dsl_fused_moe``'s docstring: gated FC1 weights and scales hold "interleaved 64-row up/gate"
  groups (``swap_ab=False``, the layout vLLM 0.33.0 prepares; :func:`reference.layouts.grouped_gate_up_interleave`);
* vLLM 0.33.0 ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`` (``quantization/utils/flashinfer_fp4_moe.py``)
  states the hidden rule: "GEMM1 gathers full 256-element K tiles of activations and their scales
  without a K-tail predicate", so it pads the hidden size to 256. vLLM 0.33.0 pins FlashInfer
  0.7.2.post1; FlashInfer 0.7.4's gather kernel predicates its A and SFA loads on K
  (``sfa_tail_predicate``) and FlashInfer's ``tests/moe/test_cute_dsl_fused_moe.py::test_gather_gemm_k_tail``
  runs K = 128 and 384, so with 0.7.4 the rule may be ``K % 128``. The suite keeps 256 (the pinned
  library's rule) until the kernel runs on an SM100 GPU at ``H % 256 == 128`` (Nemotron's 2688).

Scales are 128x4-swizzled (vLLM's ``swizzle_blockscale``, :func:`reference.layouts.swizzle_128x4`) and then
only re-viewed in the MMA layout (``nvfp4_swizzled_scale_to_cutedsl_mma_view`` asserts the view aliases
the swizzled storage), so the bytes the kernel reads are the swizzled ones.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from adapters import flashinfer as fi
from adapters import flashinfer_moe_kernels as kernels
from adapters.calls import kernel_device, launch
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe
from reference.layouts import grouped_gate_up_interleave, swizzle_128x4
from reference.moe import Activation, ActivationKind, route

FC1_GROUP = 64
"""Rows per up/gate group of gated FC1 (``cute_dsl_fused_moe(swap_ab=False)``; vLLM 0.33.0 ``group_size=64``)."""

GEMM1_N_MULTIPLE = 128
"""GEMM1's output dim ``F·Ip`` must be a multiple of this (FlashInfer's ``ValueError``)."""

HIDDEN_MULTIPLE = 256
"""GEMM1's K tile, read without a K-tail predicate (vLLM 0.33.0's statement of the rule)."""


def cutedsl_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """Why the CuteDSL NVFP4 MoE would reject expert weights of padded sizes ``(Ip, Hp)``; empty if none.

    ``F·Ip % 128`` (GEMM1's N; for gated layers also what the 64-row up/gate interleave and the
    128x4 scale swizzle need to add no FC1 rows), ``Ip % 32`` (FC2's K, 16-byte FP4 rows) and
    ``Hp % 256`` (GEMM1's K tile has no tail predicate).
    """
    f = 2 if gated else 1
    problems: list[str] = []
    if (f * intermediate) % GEMM1_N_MULTIPLE:
        problems.append(
            f"GEMM1 output dim n = {f} x {intermediate} = {f * intermediate} is not a multiple of "
            f"{GEMM1_N_MULTIPLE} (FlashInfer CuteDSL ValueError; gated FC1 also needs whole {FC1_GROUP}-row "
            "up/gate groups)"
        )
    if intermediate % 32:
        problems.append(f"FC2's K = {intermediate} is not a multiple of 32 (16-byte FP4 rows)")
    if hidden % HIDDEN_MULTIPLE:
        problems.append(
            f"hidden size {hidden} is not a multiple of {HIDDEN_MULTIPLE}: GEMM1 reads whole 256-element K "
            "tiles without a K-tail predicate"
        )
    return problems


@dataclass(frozen=True)
class CuteDslFp4Weights:
    """CuteDSL FP4 weights: ``w13`` uint8 ``[E, F·Ip, Hp/2]`` with gated rows in 64-row up/gate groups,
    ``w13_scale`` uint8 ``[E, F·Ip, Hp/16]`` in the same row order, 128x4-swizzled; ``w2`` ``[E, Hp, Ip/2]``
    as padded, ``w2_scale`` ``[E, Hp, Ip/16]`` 128x4-swizzled."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def cutedsl_fp4_weights(
    aligned: AlignedMoe,
    gated: bool,
    swizzle: Callable[[torch.Tensor], torch.Tensor] = swizzle_128x4,
) -> CuteDslFp4Weights:
    """The CuteDSL weight layout of contract-form weights (FC1 ``[up; gate]``, per-half padded): gated FC1
    rows of weights and scales regrouped by :func:`~reference.layouts.grouped_gate_up_interleave` with
    64-row groups, then both scale tensors swizzled by ``swizzle`` (the reference 128x4 swizzle by
    default). ``out.w13[:, i] = w13[:, perm[i]]``; inverting ``perm`` and the swizzle gives the input back."""
    w = aligned.weights
    rows = w.w13.shape[1]
    perm = grouped_gate_up_interleave(rows, FC1_GROUP) if gated else torch.arange(rows)
    return CuteDslFp4Weights(
        w13=w.w13[:, perm].contiguous(),
        w13_scale=swizzle(w.w13_scale[:, perm].contiguous()),
        w2=w.w2,
        w2_scale=swizzle(w.w2_scale),
    )


CUTEDSL_ACTIVATIONS = {
    ActivationKind.SWIGLU: "Swiglu",  # 3
    ActivationKind.GEGLU: "GegluTanh",  # 8: tanh-approximate GeGLU (Gemma-4's gelu_pytorch_tanh)
    ActivationKind.RELU2: "Relu2",  # 6: non-gated ReLU^2
}
"""``flashinfer.ActivationType`` member per activation for ``cute_dsl_fused_moe`` (its docstring's list)."""


@functools.cache
def _cute_dsl() -> tuple[ModuleType, ModuleType]:
    """``flashinfer.fused_moe.cute_dsl`` and ``flashinfer.cute_dsl.utils``; both need ``nvidia-cutlass-dsl``."""
    try:
        return (
            importlib.import_module("flashinfer.fused_moe.cute_dsl"),
            importlib.import_module("flashinfer.cute_dsl.utils"),
        )
    except Exception as exc:
        raise LibraryUnavailable(
            f"FlashInfer's CuteDSL MoE is not importable ({type(exc).__name__}: {exc}); it needs nvidia-cutlass-dsl"
        ) from exc


def run_cutedsl_fp4_moe(
    aligned: AlignedMoe,
    x: torch.Tensor,
    logits: torch.Tensor,
    top_k: int,
    activation: Activation,
    scales: kernels.Nvfp4MoeScales,
) -> torch.Tensor:
    """``cute_dsl_fused_moe(quant_mode="w4a4", swap_ab=False)`` on ``aligned`` (contract FC1 ``[up; gate]``).

    Called as vLLM 0.33.0's ``FlashInferCuteDSLExperts.apply`` calls it, with the weights as
    ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`` and ``nvfp4_swizzled_scale_to_cutedsl_mma_view`` leave
    them: :func:`cutedsl_fp4_weights` (64-row up/gate groups, 128x4-swizzled scales), the scales re-viewed by
    FlashInfer's ``convert_sf_to_mma_layout``. Activations are NVFP4 with linear scales ``[T, Hp/16, 1]``
    (vLLM's ``x_sf``); ``w1_alpha``/``w2_alpha`` are the per-expert decode products (weight x input),
    ``fc2_input_scale`` the intermediate's encode scale; routing on the host (:func:`reference.moe.route`).
    NVFP4 "4over6" is off explicitly. Returns fp32 ``[T, Hp]``. Needs SM100/SM103 and nvidia-cutlass-dsl.
    """
    kernels.require_sm100("cute_dsl_fused_moe (w4a4)")
    moe, utils = _cute_dsl()
    act = kernels._activation_type(CUTEDSL_ACTIVATIONS, activation, "cute_dsl_fused_moe")
    e, hp = aligned.weights.w13.shape[0], aligned.hidden_size
    dev = kernel_device()
    prepared = cutedsl_fp4_weights(aligned, activation.gated)

    def mma_view(swizzled: torch.Tensor) -> torch.Tensor:
        s = swizzled.to(dev).contiguous().view(torch.float8_e4m3fn)
        _, rows, cols = s.shape
        return utils.convert_sf_to_mma_layout(s.reshape(e * rows, cols), m=rows, k=cols * 16, num_groups=e)

    packed, sf = kernels.quantize_activations(x, hp, scales.activation)
    weights, ids = route(logits, top_k)
    out = torch.empty(x.shape[0], hp, dtype=torch.bfloat16, device=dev)
    launch(
        "cute_dsl_fused_moe (w4a4)",
        moe.cute_dsl_fused_moe,
        x=packed.to(dev),
        x_sf=sf.to(dev).view(torch.float8_e4m3fn).unsqueeze(-1),
        token_selected_experts=ids.to(device=dev, dtype=torch.int32),
        token_final_scales=weights.to(device=dev, dtype=torch.float32),
        w1_weight=prepared.w13.to(dev),
        w1_weight_sf=mma_view(prepared.w13_scale),
        w1_alpha=(scales.w13 * scales.activation).float().to(dev),
        fc2_input_scale=torch.full((e,), 1.0 / scales.intermediate, dtype=torch.float32, device=dev),
        w2_weight=prepared.w2.to(dev),
        w2_weight_sf=mma_view(prepared.w2_scale),
        w2_alpha=(scales.w2 * scales.intermediate).float().to(dev),
        num_experts=e,
        top_k=top_k,
        num_local_experts=e,
        local_expert_offset=0,
        moe_output=out,
        activation_type=act,
        quant_mode="w4a4",
        **fi.nvfp4_4over6_off(moe.cute_dsl_fused_moe),
        swap_ab=False,
    )
    return out.float()
