"""``fp8_tensor_moe`` for the ``sglang`` subject: SGLang's per-tensor FP8 MoE path (``Fp8Config`` without
``weight_block_size``, static activation scales: ``Fp8MoEMethod.create_weights``, ``FusedMoE.weight_loader``'s
per-tensor scale branch, ``process_weights_after_loading`` with ``align_fp8_moe_weights_for_flashinfer_trtllm``)
under ``--moe-runner-backend flashinfer_trtllm`` on a B200.

SGLang 0.5.23 runs none of the suite's per-tensor FP8 records (:data:`~subjects.sglang.bridge.FP8_TENSOR_NOT_MAPPED`:
its runner calls the fused ``trtllm_fp8_per_tensor_scale_moe``, not the staged launcher the record describes), so
the properties skip every backend with that reason; :func:`sglang_per_tensor_fp8` is what SGLang prepares for its
own kernel, pinned by ``tests/test_sglang_subject.py``.
"""

from __future__ import annotations

import contextlib
import enum
from unittest import mock

import torch

from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe, MoeWeights, relayout_moe
from reference.fp8 import FP8_TENSOR_BLOCK
from reference.layouts import Fc1Layout
from subjects.engine_tools import pass_through, stand_in_function
from subjects.sglang.bridge import BLACKWELL, SglangSourceMismatch, not_mapped
from subjects.sglang.layer import sglang_layer_context

PREFIX = "model.layers.0.mlp.experts"

RUNNER = "flashinfer_trtllm"
"""SGLang's only runner that prepares per-tensor FP8 MoE weights for a FlashInfer kernel."""

FLASHINFER_LAYOUT_CALLS = (("flashinfer", "reorder_rows_for_gated_act_gemm"), ("flashinfer", "shuffle_matrix_a"))
"""FlashInfer's row reorder and MMA shuffle that ``align_fp8_moe_weights_for_flashinfer_trtllm`` applies per expert
after padding, passed through: their input is what the adapter reports (the properties run FlashInfer's own)."""


E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def static_fp8_quant(
    x: torch.Tensor, scale: torch.Tensor | None = None, **_: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for ``sglang.kernels.ops.quantization.fp8_kernel.scaled_fp8_quant`` with a static scale, which on
    CUDA calls ``sgl_per_tensor_quant_fp8`` (undefined off CUDA): ``clamp(x / scale, ±448)`` cast to E4M3, the
    formula of SGLang's own native fallback (``_native_static_quant_fp8``, defined there for ROCm only)."""
    if scale is None or scale.numel() != 1:
        raise SglangSourceMismatch("Fp8MoEMethod called scaled_fp8_quant without a static per-tensor scale")
    return torch.clamp(x / scale, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def load_per_tensor_checkpoint(layer: torch.nn.Module, weights: MoeWeights, gated: bool) -> None:
    """Feed a per-tensor FP8 checkpoint (FC1 ``[gate; up]``, one scale per projection) to ``FusedMoE.weight_loader``
    per expert and shard: ``w1`` / ``w3`` of ``w13_weight`` and ``w13_weight_scale``, ``w2``; activation scales 1.0."""
    i = weights.intermediate_size
    e4m3 = torch.float8_e4m3fn
    shards = {"w1": (slice(0, i), 0), "w3": (slice(i, 2 * i), 1)} if gated else {"w1": (slice(0, i), 0)}
    one = torch.tensor(1.0)
    for e in range(weights.w13.shape[0]):
        for shard, (rows, half) in shards.items():
            layer.weight_loader(layer.w13_weight, weights.w13[e, rows].view(e4m3), f"{PREFIX}.w13_weight", shard, e)
            scale = weights.w13_scale[e, half, 0]
            layer.weight_loader(layer.w13_weight_scale, scale, f"{PREFIX}.w13_weight_scale", shard, e)
            layer.weight_loader(layer.w13_input_scale, one, f"{PREFIX}.w13_input_scale", shard, e)
        layer.weight_loader(layer.w2_weight, weights.w2[e].view(e4m3), f"{PREFIX}.w2_weight", "w2", e)
        layer.weight_loader(layer.w2_weight_scale, weights.w2_scale[e, 0, 0], f"{PREFIX}.w2_weight_scale", "w2", e)
        layer.weight_loader(layer.w2_input_scale, one, f"{PREFIX}.w2_input_scale", "w2", e)


def sglang_per_tensor_fp8(weights: MoeWeights, gated: bool) -> AlignedMoe:
    """SGLang's per-tensor FP8 MoE preparation for FlashInfer TRT-LLM of one rank's experts.

    A real ``FusedMoE`` at TP 1 (``Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")``,
    ``flashinfer_trtllm`` on a B200): ``FusedMoE.__init__`` rounds ``I`` to 128 for every method but ModelOpt NVFP4,
    ``create_weights`` allocates, the loader places ``[up; gate]`` (it swaps the ``w1`` / ``w3`` shard ids) and
    zero-fills each half's tail. ``process_weights_after_loading`` then takes each expert's maximum of its two FC1
    scales and re-quantizes both halves to it (``per_tensor_dequantize``, then ``scaled_fp8_quant``, a CUDA kernel,
    stood in by :func:`static_fp8_quant`), and ``align_fp8_moe_weights_for_flashinfer_trtllm`` pads to 16 (gated) or 128 before FlashInfer's layout
    calls (:data:`FLASHINFER_LAYOUT_CALLS`, passed through).
    Returns the buffers with FC1 rows ``[gate; up]``, both halves' scale the expert's one FC1 scale."""
    e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
    with sglang_layer_context(RUNNER, BLACKWELL) as m:
        config = m.fp8.Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")
        layer = m.FusedMoE(
            num_experts=e, hidden_size=h, intermediate_size=i, layer_id=0, top_k=1, quant_config=config,
            prefix=PREFIX, activation="silu" if gated else "relu2", is_gated=gated,
        )  # fmt: skip
        if not isinstance(layer.quant_method, m.fp8.Fp8MoEMethod) or layer.quant_method.block_quant:
            raise SglangSourceMismatch(
                f"Fp8Config (per-tensor) gave FusedMoE a {type(layer.quant_method).__name__} that is not a "
                "per-tensor Fp8MoEMethod"
            )
        load_per_tensor_checkpoint(layer, weights, gated)
        with contextlib.ExitStack() as stack:
            for module, name in FLASHINFER_LAYOUT_CALLS:
                stack.enter_context(stand_in_function(module, name, pass_through))
            stack.enter_context(mock.patch.object(m.fp8, "scaled_fp8_quant", static_fp8_quant))
            layer.quant_method.process_weights_after_loading(layer)
        f = 2 if gated else 1
        scale = layer.w13_weight_scale.detach().float()
        loaded = MoeWeights(
            w13=layer.w13_weight.detach().view(torch.uint8).clone(),
            w13_scale=scale.reshape(e, 1, 1).expand(e, f, 1).clone(),
            w2=layer.w2_weight.detach().view(torch.uint8).clone(),
            w2_scale=layer.w2_weight_scale.detach().float().reshape(e, 1, 1).clone(),
            block=FP8_TENSOR_BLOCK,
            fc1_layout=Fc1Layout.UP_GATE if gated else Fc1Layout.GATE_UP,
        )
    aligned = relayout_moe(loaded, Fc1Layout.GATE_UP) if gated else loaded
    return AlignedMoe(aligned, aligned.intermediate_size, aligned.hidden_size)


class SglangFp8TensorMoeAlignment:
    """SGLang's per-tensor FP8 MoE path: every backend record of ``fp8_tensor_moe`` is one SGLang 0.5.23 has no
    path to (:data:`~subjects.sglang.bridge.FP8_TENSOR_NOT_MAPPED`), so each skips with that reason; what SGLang
    prepares for its own fused kernel is :func:`sglang_per_tensor_fp8`."""

    def align_moe(self, backend: enum.Enum, weights: MoeWeights, gated: bool) -> AlignedMoe:
        raise LibraryUnavailable(not_mapped(backend))
