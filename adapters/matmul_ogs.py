"""triton_kernels' ``matmul_ogs``: the gpt-oss MXFP4 MoE as vLLM's ``TRITON`` backend runs it on Hopper.

The calls follow vLLM 0.33.0 (no triton_kernels code is copied; every kernel and layout is the library's):

* weights: ``_swizzle_mxfp4`` in ``vllm/model_executor/layers/quantization/utils/mxfp4_utils.py`` on an SM90
  GPU: weights ``[E, N, K/2]`` and scales ``[E, N, K/32]`` transposed to put the quantization axis on dim 1,
  the scale groups zero-padded to a multiple of 4 (vLLM PR #47910), ``split_k = 1`` as an opt-flags
  constraint, ``HopperMXValueLayout(mx_axis=1)`` and ``HopperMXScaleLayout(mx_axis=1, num_warps=8)``;
* the layer: ``triton_kernel_moe_forward`` / ``triton_kernel_fused_experts`` in
  ``vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py``: ``routing(logits, k,
  sm_first=False)`` (top-k of the logits, softmax over the k), FC1 with the rows gathered per expert and
  triton_kernels' ``swiglu`` fused (``alpha``, ``limit``; it reads gate/up pairs ``a[..., ::2]``,
  ``a[..., 1::2]`` and computes ``gate·sigmoid(alpha·gate)·(up + 1)``), FC2 scattered back and weighted by
  the routing weights (``gammas``), both with fp32 biases.

:data:`PACKAGES` are tried in order: triton_kernels installed on its own, then vLLM's vendored copy
(``vllm.third_party.triton_kernels``, triton_kernels 3.5.1 in vLLM 0.33.0). Everything here needs an NVIDIA
GPU; a missing GPU or package raises :class:`contracts.errors.LibraryUnavailable`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from adapters.calls import kernel_device, launch, planned
from adapters.triton_kernels import HOPPER_NUM_WARPS, HOPPER_TILE_GROUPS, stored_scale_groups
from contracts.errors import LibraryUnavailable
from contracts.moe import MoeWeights
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import Activation, ActivationKind
from reference.padding import pad_dim

PACKAGES = ("triton_kernels", "vllm.third_party.triton_kernels")
"""Where triton_kernels is imported from, in order."""
SUBMODULES = {
    "matmul": "matmul_ogs",
    "routing": "routing",
    "swiglu": "swiglu",
    "tensor": "tensor",
    "layout": "tensor_details.layout",
    "opt_flags": "matmul_ogs_details.opt_flags",
    "numerics": "numerics",
}
"""The triton_kernels modules vLLM 0.33.0's ``TRITON`` path imports (triton_kernels 3.5.1 names)."""


@functools.cache
def package() -> SimpleNamespace:
    """The first importable of :data:`PACKAGES`, its :data:`SUBMODULES` as attributes and ``name``."""
    if not planned() and (not torch.cuda.is_available() or torch.version.hip is not None):
        raise LibraryUnavailable("triton_kernels' matmul_ogs needs an NVIDIA GPU; this machine has none")
    reasons = []
    for name in PACKAGES:
        try:
            mods: dict[str, ModuleType] = {k: importlib.import_module(f"{name}.{m}") for k, m in SUBMODULES.items()}
        except ImportError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return SimpleNamespace(name=name, path=str(importlib.import_module(name).__path__[0]), **mods)
    raise LibraryUnavailable("triton_kernels is not importable (" + "; ".join(reasons) + ")")


@dataclass(frozen=True)
class HopperWeights:
    """One GEMM's MXFP4 weights as ``matmul_ogs`` takes them: the swizzled value tensor, its precision
    config (holding the swizzled scales) and the scale groups stored before swizzling."""

    weight: Any
    precision: Any
    scale_groups: int


def hopper_weights(w: torch.Tensor, scale: torch.Tensor, *, groups_to: int = HOPPER_TILE_GROUPS) -> HopperWeights:
    """``w [E, N, K/2]`` (E2M1 pairs, low nibble first) and ``scale [E, N, G]`` (UE8M0 bytes) swizzled for the
    Hopper kernel as vLLM 0.33.0's ``_swizzle_mxfp4`` does, on the current CUDA device. ``groups_to``: the scale
    groups are zero-padded to a multiple of it first (4: vLLM PR #47910; 1: only the layout's own padding)."""
    tk = package()
    tk.opt_flags.update_opt_flags_constraints({"split_k": 1})
    groups = stored_scale_groups(MXFP4_BLOCK * scale.shape[-1], groups_to)
    scale = pad_dim(scale, -1, groups)
    value = tk.tensor.wrap_torch_tensor(w.to(kernel_device()).transpose(-2, -1), dtype=tk.tensor.FP4)
    value = tk.tensor.convert_layout(value, tk.layout.HopperMXValueLayout, mx_axis=1)
    scales = tk.tensor.wrap_torch_tensor(scale.to(kernel_device()).transpose(-2, -1))
    scales = tk.tensor.convert_layout(scales, tk.layout.HopperMXScaleLayout, mx_axis=1, num_warps=HOPPER_NUM_WARPS)
    flex = tk.matmul.FlexCtx(rhs_data=tk.numerics.InFlexData())
    return HopperWeights(value, tk.matmul.PrecisionConfig(weight_scale=scales, flex_ctx=flex), groups)


def batched_gemm(x: torch.Tensor, weights: HopperWeights) -> torch.Tensor:
    """``y[e] = x[e] · W[e]^T`` for ``x [E, M, K]`` (cast to bf16) through ``matmul_ogs`` without routing;
    returns fp32 ``[E, M, N]`` on the GPU."""
    tk = package()
    y = launch(
        "matmul_ogs",
        tk.matmul.matmul_ogs,
        x.to(kernel_device(), torch.bfloat16),
        weights.weight,
        None,
        precision_config=weights.precision,
    )
    return y.float()


def swiglu_args(act: Activation) -> tuple[float, float]:
    """``(alpha, limit)`` for triton_kernels' ``swiglu``, which computes gpt-oss's SwiGLU with ``beta = 1`` and a
    clamp; any other activation is refused (``ValueError``), as vLLM refuses it for this backend."""
    if act.kind is not ActivationKind.SWIGLU_OAI or act.beta != 1.0 or act.limit is None:
        raise ValueError(f"triton_kernels' swiglu computes swiglu_oai(beta=1) with a limit, not {act}")
    return act.alpha, act.limit


def moe(weights: MoeWeights, x: torch.Tensor, logits: torch.Tensor, top_k: int, act: Activation) -> torch.Tensor:
    """The MoE layer ``weights`` (gated, FC1 rows as gpt-oss's gate/up pairs) on ``x [T, H]`` routed by
    ``logits [T, E]`` (fp32), as vLLM 0.33.0's ``triton_kernel_moe_forward`` runs it; fp32 ``[T, H]`` on the
    CPU. ``x`` is cast to bf16; biases (``None``: zero) go in as fp32."""
    if weights.fc1_layout is not Fc1Layout.GATE_UP_INTERLEAVED or weights.block != MXFP4_BLOCK:
        raise ValueError(
            f"matmul_ogs reads MXFP4 gate/up pairs, not {weights.fc1_layout.value} / block {weights.block}"
        )
    tk = package()
    alpha, limit = swiglu_args(act)
    e, rows, _ = weights.w13.shape
    h = weights.w2.shape[1]
    fc1, fc2 = hopper_weights(weights.w13, weights.w13_scale), hopper_weights(weights.w2, weights.w2_scale)
    b13 = torch.zeros(e, rows) if weights.w13_bias is None else weights.w13_bias
    b2 = torch.zeros(e, h) if weights.w2_bias is None else weights.w2_bias
    dev = kernel_device()
    routing, gather, scatter = launch("routing", tk.routing.routing, logits.float().to(dev), top_k, sm_first=False)
    activation = tk.matmul.FusedActivation(
        tk.matmul.FnSpecs("swiglu", tk.swiglu.swiglu_fn, ("alpha", "limit")), (alpha, limit), 2
    )
    xb = x.to(dev, torch.bfloat16)
    hidden = launch(
        "matmul_ogs (FC1)", tk.matmul.matmul_ogs, xb, fc1.weight, b13.float().to(dev), routing, gather_indx=gather,
        precision_config=fc1.precision, fused_activation=activation,
    )  # fmt: skip
    out = launch(
        "matmul_ogs (FC2)", tk.matmul.matmul_ogs, hidden, fc2.weight, b2.float().to(dev), routing, scatter_indx=scatter,
        precision_config=fc2.precision, gammas=routing.gate_scal,
    )  # fmt: skip
    return out.float().cpu()
