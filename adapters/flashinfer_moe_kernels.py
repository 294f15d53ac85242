"""Runs FlashInfer 0.7.4's NVFP4 MoE kernels on one rank's padded expert weights (SM100 only).

Written from FlashInfer's own tests (``tests/moe/trtllm_gen_fused_moe_utils.py``,
``tests/moe/test_trtllm_cutlass_fused_moe.py::test_moe_nvfp4``) and ``docs/kernels.md`` §2-§3, §11:

* :func:`run_trtllm_fp4_moe` drives ``trtllm_fp4_block_scale_moe`` (trtllm-gen cubins). FC1 rows
  ``[up; gate]`` go through FlashInfer's composed gated-reorder + row-shuffle indices, the block
  scales through the scale variant of those indices and the 128x4 swizzle, viewed back as
  ``float8_e4m3fn [E, F·Ip, Hp/16]``; FC2 likewise without the reorder. Activations are NVFP4
  with linear scales ``[T, Hp/16]``; routing runs in the kernel from fp32 logits
  (``RenormalizeNaive``: softmax, top-k, renormalise, as :func:`reference.moe.route`).
* :func:`run_cutlass_fused_moe_nvfp4` drives ``cutlass_fused_moe``: weights ``[up; gate]``
  unshuffled and viewed as ``torch.long``, 128x4-swizzled block scales viewed as ``int32``, the
  six ``quant_scales`` tensors, pre-quantized activations with swizzled scales, host routing.

Global scales follow ``docs/formats.md`` §6; :class:`Nvfp4MoeScales` holds decode scales and the
kernels' encode/decode products are formed here. Activations are quantized by the suite's
reference quantizer, so the caller knows the exact bytes the kernel reads; swizzles are
:func:`reference.layouts.swizzle_128x4`, which equals FlashInfer's ``block_scale_interleave``
(checked on GPU by ``conformance/test_nvfp4_moe.py::test_scale_interleave_kernel``). NVFP4
"4over6" is switched off explicitly so environment variables cannot change the recipe.

Without an SM100 GPU (compute capability 10.x) every runner raises
:class:`contracts.errors.LibraryUnavailable`; the weight preparation and scalar helpers are
pure torch and also run on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adapters import flashinfer as fi
from adapters.calls import kernel_device, launch, planned
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe, MoeWeights
from reference.errors import require
from reference.formats import NVFP4_BLOCK, GlobalScale, nvfp4_quantize
from reference.layouts import swizzle_128x4
from reference.moe import Activation, ActivationKind, route
from reference.padding import pad_dim

TRTLLM_ACTIVATIONS = {
    ActivationKind.SWIGLU: "Swiglu",  # 3
    ActivationKind.GEGLU: "Geglu",  # 4: the only GeGLU trtllm-gen offers (its phi is inside the cubins)
    ActivationKind.RELU2: "Relu2",  # 6
}
"""``flashinfer.ActivationType`` member per activation for ``trtllm_fp4_block_scale_moe``.

gpt-oss's clamped SwiGLU is absent: trtllm-gen applies ``gemm1_beta`` / ``gemm1_clamp_limit``
to the raw (undequantized) accumulator and FlashInfer's tests never run them with NVFP4, so the
units of those scalars cannot be taken from a tested source.
"""

CUTLASS_ACTIVATIONS = {
    ActivationKind.SWIGLU: "Swiglu",  # 3
    ActivationKind.GEGLU: "GegluTanh",  # 8: GELU_taylor, Gemma-4's gelu_pytorch_tanh
    ActivationKind.RELU2: "Relu2",  # 6
    ActivationKind.SWIGLU_OAI: "Swiglu",  # + swiglu_alpha/beta/limit selects SwigluBias
}
"""``flashinfer.ActivationType`` member per activation for ``cutlass_fused_moe`` NVFP4."""


@dataclass(frozen=True)
class Nvfp4MoeScales:
    """NVFP4 per-tensor *decode* scales (``weight_scale_2`` / ``input_scale`` convention).

    ``w13``, ``w2``: fp32 ``[E]`` weight decode scales; ``activation``: decode scale of the
    hidden states fed to FC1; ``intermediate``: decode scale the kernel re-quantizes the activated
    intermediate with before FC2. The encode scales of ``docs/formats.md`` §6 are their reciprocals.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    activation: float
    intermediate: float


@dataclass(frozen=True)
class TrtllmFp4Weights:
    """trtllm-gen FP4 weights: ``w13`` uint8 ``[E, F·Ip, Hp/2]`` and ``w13_scale`` float8_e4m3fn
    ``[E, F·Ip, Hp/16]`` (rows permuted, scales swizzled); ``w2`` ``[E, N2, Ip/2]`` and
    ``w2_scale`` ``[E, N2, Ip/16]`` with ``N2`` FC2's output rows (``Hp``, or
    ``ru(valid_hidden, 128)`` when a valid hidden size is declared)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def require_sm100(entry_point: str) -> None:
    """Raise :class:`~contracts.errors.LibraryUnavailable` unless this is an SM100 GPU (cc 10.x) or a plan."""
    if planned():
        return
    cc = fi.cuda_capability()
    if cc is None or torch.version.hip is not None or cc[0] != 10:
        here = "no NVIDIA GPU" if cc is None or torch.version.hip is not None else f"compute capability {cc}"
        raise LibraryUnavailable(
            f"FlashInfer {entry_point} runs only on SM100 (B200/GB200/B300, compute capability 10.x); "
            f"this machine has {here}"
        )


def _activation_type(table: dict[ActivationKind, str], activation: Activation, entry_point: str) -> int:
    name = table.get(activation.kind)
    if name is None:
        raise ValueError(f"{entry_point}: activation {activation} is not supported by this adapter")
    return int(getattr(fi._import("flashinfer").ActivationType, name))


def _check_fp4_moe(weights: MoeWeights, gated: bool, hidden: int, intermediate: int) -> None:
    """Shape contract of NVFP4 MoE weights ``(Ip, Hp)`` before any library call."""
    f = 2 if gated else 1
    e = weights.w13.shape[0]
    require(weights.block == NVFP4_BLOCK, f"NVFP4 MoE kernels need 16-element scale blocks, got {weights.block}")
    require(
        tuple(weights.w13.shape) == (e, f * intermediate, hidden // 2)
        and tuple(weights.w13_scale.shape) == (e, f * intermediate, hidden // NVFP4_BLOCK),
        f"FC1 must be [E, F·Ip, Hp/2] = [{e}, {f * intermediate}, {hidden // 2}] with scales "
        f"[{e}, {f * intermediate}, {hidden // NVFP4_BLOCK}] (gated={gated}); got "
        f"{tuple(weights.w13.shape)} and {tuple(weights.w13_scale.shape)}",
    )
    n2 = weights.w2.shape[1]
    require(
        tuple(weights.w2.shape) == (e, n2, intermediate // 2)
        and tuple(weights.w2_scale.shape) == (e, n2, intermediate // NVFP4_BLOCK),
        f"FC2 must be [E, N, Ip/2] with scales [E, N, Ip/16] for Ip = {intermediate}; got "
        f"{tuple(weights.w2.shape)} and {tuple(weights.w2_scale.shape)}",
    )


def trtllm_fp4_weights(
    aligned: AlignedMoe,
    gated: bool,
    interleave: Callable[[torch.Tensor], torch.Tensor] = swizzle_128x4,
) -> TrtllmFp4Weights:
    """FlashInfer's trtllm-gen FP4 weight preparation, per ``trtllm_gen_fused_moe_utils.py``.

    ``out[e, i] = w[e, g[r[i]]]`` with FlashInfer's own composed indices (the scale variant for the
    scales, whose ``rows % 128`` assert is the Gemma-4 TP4 crash, vLLM #46879); scales are then
    128x4-swizzled per expert by ``interleave`` (``[E, M, Kc] -> [E, Mp, Kp]``: the reference, or
    FlashInfer's CUDA ``block_scale_interleave``) and viewed back as ``[rows, K/16]``, exact only
    when ``(K/16) % 4 == 0``.
    """
    w = aligned.weights
    _check_fp4_moe(w, gated, aligned.hidden_size, aligned.intermediate_size)
    rows, n2 = w.w13.shape[1], w.w2.shape[1]
    p13, s13 = fi.fc1_permutation(rows, gated, scales=False), fi.fc1_permutation(rows, gated, scales=True)
    p2, s2 = fi.fc2_permutation(n2, scales=False), fi.fc2_permutation(n2, scales=True)
    for label, m, kc in (("FC1", rows, w.w13_scale.shape[-1]), ("FC2", n2, w.w2_scale.shape[-1])):
        require(
            kc % 4 == 0,
            f"trtllm-gen {label} scales [{m}, {kc}]: the 128x4-swizzled buffer is viewed back as [rows, K/16], "
            f"which is exact only when K/16 % 4 == 0 (K % 64)",
        )
    device = w.w13.device

    def scales(s: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        return interleave(s[:, perm.to(device)]).contiguous().view(torch.float8_e4m3fn)

    return TrtllmFp4Weights(
        w13=w.w13[:, p13.to(device)].contiguous(),
        w13_scale=scales(w.w13_scale, s13),
        w2=w.w2[:, p2.to(device)].contiguous(),
        w2_scale=scales(w.w2_scale, s2),
    )


def trtllm_output_scales(scales: Nvfp4MoeScales, gated: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(output1_scale_scalar, output1_scale_gate_scalar, output2_scale_scalar)``, each fp32 ``[E]``.

    With encode scales ``a_gs`` (activations), ``w1_gs``, ``w2_gs`` and ``c_gs`` (intermediate):
    gate ``= 1/(w1_gs·a_gs)``; output1 ``= c_gs/(w1_gs·a_gs)`` gated, ``c_gs`` non-gated (the
    dequant then sits in the gate scale, before the nonlinearity); output2 ``= 1/(c_gs·w2_gs)``.
    """
    gate = (scales.w13 * scales.activation).float()
    c_gs = 1.0 / scales.intermediate
    out1 = gate * c_gs if gated else torch.full_like(gate, c_gs)
    out2 = (scales.w2 * scales.intermediate).float()
    return out1, gate, out2


def cutlass_quant_scales(weights: MoeWeights, scales: Nvfp4MoeScales) -> list[torch.Tensor]:
    """The six NVFP4 ``quant_scales`` of ``cutlass_fused_moe`` (``test_moe_nvfp4``'s order).

    ``[a1_gs, swz(w13_scale).view(int32), 1/(a1_gs·w1_gs), a2_gs, swz(w2_scale).view(int32),
    1/(a2_gs·w2_gs)]``: ``a1_gs`` encodes the activations, ``a2_gs`` the intermediate; the block
    scales are 128x4-swizzled ``[E, ru(rows, 128), ru(K/16, 4)]`` bytes, four per int32.
    """
    device = weights.w13.device

    def block(s: torch.Tensor) -> torch.Tensor:
        return swizzle_128x4(s).contiguous().view(torch.int32)

    def scalar(v: float) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float32, device=device)

    return [
        scalar(1.0 / scales.activation),
        block(weights.w13_scale),
        (scales.w13 * scales.activation).float().to(device),
        scalar(1.0 / scales.intermediate),
        block(weights.w2_scale),
        (scales.w2 * scales.intermediate).float().to(device),
    ]


def quantize_activations(x: torch.Tensor, hidden: int, decode: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad ``x [T, H]`` to ``hidden`` columns and NVFP4-quantize it with the reference quantizer.

    Returns packed uint8 ``[T, hidden/2]`` and E4M3 scale bytes ``[T, hidden/16]`` (linear layout).
    """
    require(x.dim() == 2 and x.shape[1] <= hidden, f"activations {tuple(x.shape)} do not fit hidden size {hidden}")
    q = nvfp4_quantize(pad_dim(x.float(), -1, hidden), decode, GlobalScale.DECODE)
    return q.packed, q.scales


def flashinfer_padded(weights: MoeWeights, gated: bool, hidden_alignment: int = 256) -> tuple[AlignedMoe, int, int]:
    """FlashInfer's own padding for its valid-size API: ``pad_trtllm_moe_weights`` (pure torch).

    Returns the padded weights (intermediate to a multiple of 128 per FC1 half, FC1's K to a
    multiple of ``hidden_alignment``, FC2 rows to ``ru(H, 128)``, padded scales E4M3 1.0) and the
    valid ``(intermediate, hidden)`` to pass as ``valid_intermediate_size`` / ``valid_hidden_size``.
    NVFP4 on trtllm-gen needs ``hidden_alignment`` 256 (128 "gives wrong results", 0.7.4 docs);
    with 128 FC1's K equals FC2's rows, the shape ``cutlass_fused_moe`` needs.
    """
    p = fi.function("flashinfer.fused_moe", "pad_trtllm_moe_weights")(
        weights.w13,
        weights.w13_scale,
        weights.w2,
        weights.w2_scale,
        weights.hidden_size,
        weights.intermediate_size,
        is_gated_act=gated,
        hidden_alignment=hidden_alignment,
    )
    padded = MoeWeights(p.gemm1_weights, p.gemm1_weights_scale, p.gemm2_weights, p.gemm2_weights_scale, weights.block)
    return AlignedMoe(padded, p.intermediate_size, p.hidden_size), p.valid_intermediate_size, p.valid_hidden_size


def run_trtllm_fp4_moe(
    aligned: AlignedMoe,
    x: torch.Tensor,
    logits: torch.Tensor,
    top_k: int,
    activation: Activation,
    scales: Nvfp4MoeScales,
    *,
    valid_intermediate_size: int | None = None,
    valid_hidden_size: int | None = None,
) -> torch.Tensor:
    """``trtllm_fp4_block_scale_moe`` on ``aligned`` (FC1 rows ``[up; gate]``), NVFP4 x NVFP4.

    ``x [T, H]`` fp32 on the NVFP4 grid of ``scales.activation`` (zero-padded to ``Hp`` here),
    ``logits [T, E]`` fp32. ``intermediate_size`` is ``aligned.intermediate_size``; the valid sizes
    are passed through unchanged (FlashInfer 0.7.4 semantics). Returns the bf16 output as fp32
    ``[T, valid_hidden_size or Hp]``.
    """
    require_sm100("trtllm_fp4_block_scale_moe")
    flashinfer = fi._import("flashinfer")
    act = _activation_type(TRTLLM_ACTIVATIONS, activation, "trtllm_fp4_block_scale_moe")
    gated = activation.gated
    e = aligned.weights.w13.shape[0]
    require(logits.shape == (x.shape[0], e), f"logits {tuple(logits.shape)} must be [T, E] = [{x.shape[0]}, {e}]")
    dev = kernel_device()
    prepared = trtllm_fp4_weights(aligned, gated)
    packed, sf = quantize_activations(x, aligned.hidden_size, scales.activation)
    out1, gate, out2 = trtllm_output_scales(scales, gated)
    out = launch(
        "trtllm_fp4_block_scale_moe",
        flashinfer.fused_moe.trtllm_fp4_block_scale_moe,
        routing_logits=logits.float().to(dev),
        routing_bias=None,
        hidden_states=packed.to(dev),
        hidden_states_scale=sf.to(dev).view(torch.float8_e4m3fn),
        gemm1_weights=prepared.w13.to(dev),
        gemm1_weights_scale=prepared.w13_scale.to(dev),
        gemm1_bias=None,
        gemm1_alpha=None,
        gemm1_beta=None,
        gemm1_clamp_limit=None,
        gemm2_weights=prepared.w2.to(dev),
        gemm2_weights_scale=prepared.w2_scale.to(dev),
        gemm2_bias=None,
        output1_scale_scalar=out1.to(dev),
        output1_scale_gate_scalar=gate.to(dev),
        output2_scale_scalar=out2.to(dev),
        num_experts=e,
        top_k=top_k,
        n_group=None,
        topk_group=None,
        intermediate_size=aligned.intermediate_size,
        local_expert_offset=0,
        local_num_experts=e,
        routed_scaling_factor=None,
        routing_method_type=int(flashinfer.RoutingMethodType.RenormalizeNaive),
        do_finalize=True,
        activation_type=act,
        valid_hidden_size=valid_hidden_size,
        valid_intermediate_size=valid_intermediate_size,
        hidden_states_scale_layout=flashinfer.SfLayout.layout_linear,
        **fi.nvfp4_4over6_off(flashinfer.fused_moe.trtllm_fp4_block_scale_moe),
    )
    return out[0].float()


def run_cutlass_fused_moe_nvfp4(
    aligned: AlignedMoe,
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    activation: Activation,
    scales: Nvfp4MoeScales,
) -> torch.Tensor:
    """``cutlass_fused_moe`` NVFP4 x NVFP4 on ``aligned`` (FC1 rows ``[up; gate]``, no shuffle).

    ``x [T, H]`` fp32 on the NVFP4 grid of ``scales.activation``; it is quantized here and handed
    over packed with 128x4-swizzled scales ``[ru(T, 128), Hp/16]`` as ``fp4_quantize`` returns them
    (vLLM's path; ``test_moe_nvfp4`` with ``quantized_input``).
    ``expert_ids``/``expert_weights`` ``[T, k]`` are the host routing. Returns fp32 ``[T, Hp]``.
    """
    require_sm100("cutlass_fused_moe (NVFP4)")
    flashinfer = fi._import("flashinfer")
    act = _activation_type(CUTLASS_ACTIVATIONS, activation, "cutlass_fused_moe")
    w = aligned.weights
    _check_fp4_moe(w, activation.gated, aligned.hidden_size, aligned.intermediate_size)
    e = w.w13.shape[0]
    dev = kernel_device()
    packed, sf = quantize_activations(x, aligned.hidden_size, scales.activation)
    swiglu: dict[str, torch.Tensor | None] = {}
    if activation.kind is ActivationKind.SWIGLU_OAI:
        per_expert = {
            "swiglu_alpha": activation.alpha,
            "swiglu_beta": activation.beta,
            "swiglu_limit": activation.limit,
        }
        swiglu = {
            k: None if v is None else torch.full((e,), v, dtype=torch.float32, device=dev)
            for k, v in per_expert.items()
        }
    on_device = MoeWeights(*(t.to(dev) for t in (w.w13, w.w13_scale, w.w2, w.w2_scale)), w.block)
    out = torch.empty(x.shape[0], w.w2.shape[1], dtype=torch.bfloat16, device=dev)
    launch(
        "cutlass_fused_moe (NVFP4)",
        flashinfer.fused_moe.cutlass_fused_moe,
        packed.to(dev),
        expert_ids.to(device=dev, dtype=torch.int32),
        expert_weights.to(device=dev, dtype=torch.float32),
        on_device.w13.contiguous().view(torch.long),
        on_device.w2.contiguous().view(torch.long),
        torch.bfloat16,
        quant_scales=cutlass_quant_scales(on_device, scales),
        input_sf=swizzle_128x4(sf).contiguous().to(dev),
        output=out,
        activation_type=flashinfer.ActivationType(act),
        **fi.nvfp4_4over6_off(flashinfer.fused_moe.cutlass_fused_moe),
        **swiglu,
    )
    return out.float()


def run_cutlass_fp4_moe(
    aligned: AlignedMoe,
    x: torch.Tensor,
    logits: torch.Tensor,
    top_k: int,
    activation: Activation,
    scales: Nvfp4MoeScales,
) -> torch.Tensor:
    """:func:`run_cutlass_fused_moe_nvfp4` with host routing from fp32 ``logits [T, E]``
    (:func:`reference.moe.route`: softmax, top-k, renormalise), the signature of :func:`run_trtllm_fp4_moe`."""
    weights, ids = route(logits, top_k)
    return run_cutlass_fused_moe_nvfp4(aligned, x, ids, weights, activation, scales)
