"""``fp8_moe`` for the ``sglang`` subject: SGLang's block-FP8 MoE path (``Fp8Config`` with ``weight_block_size``
``[128, 128]``, ``Fp8MoEMethod``: ``create_weights``, ``FusedMoE.weight_loader``'s block-scale branch,
``process_weights_after_loading``) per backend of :data:`subjects.sglang.bridge.FP8_BACKENDS`, and how its loader
splits a checkpoint over ranks (:func:`load_fp8_rank`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch

from backends.fp8_moe import Fp8MoeBackend
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe, MoeWeights, relayout_moe
from reference.fp8 import FP8_BLOCK, ceil_div
from reference.layouts import Fc1Layout
from subjects.sglang.bridge import FP8_BACKENDS, SglangSourceMismatch, not_mapped
from subjects.sglang.layer import sglang_layer_context

FP8_PREFIX = "model.layers.0.mlp.experts"

FP8_BLOCK_SHAPE = [FP8_BLOCK, FP8_BLOCK]
"""``weight_block_size`` of a DeepSeek-V3-style block-FP8 checkpoint's ``quantization_config``."""


def load_fp8_checkpoint(layer: torch.nn.Module, weights: MoeWeights, gated: bool) -> None:
    """Feed a block-FP8 checkpoint (FC1 rows ``[gate; up]``, each half its own 128-row scale tiles) to
    ``FusedMoE.weight_loader`` per expert and shard, as a DeepSeek-V3-style checkpoint is loaded: ``w1`` (gate)
    and ``w3`` (up) of ``w13_weight`` / ``w13_weight_scale_inv``, ``w2``; the loader narrows the rank's channels
    and scale tiles and places the halves."""
    i = weights.intermediate_size
    tiles = ceil_div(i, FP8_BLOCK)
    e4m3 = torch.float8_e4m3fn
    rows = {"w1": slice(0, i), "w3": slice(i, 2 * i)} if gated else {"w1": slice(0, i)}
    scale_rows = {"w1": slice(0, tiles), "w3": slice(tiles, 2 * tiles)} if gated else {"w1": slice(0, tiles)}
    for e in range(weights.w13.shape[0]):
        for shard in rows:
            w13 = weights.w13[e, rows[shard]].view(e4m3)
            layer.weight_loader(layer.w13_weight, w13, f"{FP8_PREFIX}.w13_weight", shard, e)
            scale = weights.w13_scale[e, scale_rows[shard]]
            layer.weight_loader(layer.w13_weight_scale_inv, scale, f"{FP8_PREFIX}.w13_weight_scale_inv", shard, e)
        layer.weight_loader(layer.w2_weight, weights.w2[e].view(e4m3), f"{FP8_PREFIX}.w2_weight", "w2", e)
        scale = weights.w2_scale[e]
        layer.weight_loader(layer.w2_weight_scale_inv, scale, f"{FP8_PREFIX}.w2_weight_scale_inv", "w2", e)


@contextlib.contextmanager
def fp8_fused_moe(
    backend: Fp8MoeBackend,
    experts: int,
    hidden: int,
    intermediate: int,
    gated: bool,
    tp: int = 1,
    rank: int = 0,
    ep: int = 1,
) -> Iterator[tuple[types.SimpleNamespace, torch.nn.Module]]:
    """A real ``FusedMoE`` of rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`~subjects.sglang.layer.parallel_layout`)
    for a block-FP8 checkpoint (``Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])``,
    dynamic activation scales) of global ``intermediate`` size, under :data:`FP8_BACKENDS`' runner and platform
    (:func:`sglang_layer_context`): its constructor rounds (``flashinfer_trtllm``: ``I/tp`` to 128) and picks
    ``Fp8MoEMethod``, whose ``create_weights`` checks ``I/tp % 128`` and allocates."""
    if backend not in FP8_BACKENDS:
        raise LibraryUnavailable(not_mapped(backend))
    selection = FP8_BACKENDS[backend]
    with sglang_layer_context(selection.runner, selection.platform, tp, rank, ep) as m:
        config = m.fp8.Fp8Config(
            is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=FP8_BLOCK_SHAPE
        )
        layer = m.FusedMoE(
            num_experts=experts, hidden_size=hidden, intermediate_size=intermediate, layer_id=0, top_k=1,
            quant_config=config, prefix=FP8_PREFIX, activation="silu" if gated else "relu2", is_gated=gated,
        )  # fmt: skip
        if not isinstance(layer.quant_method, m.fp8.Fp8MoEMethod) or not layer.quant_method.block_quant:
            raise SglangSourceMismatch(
                f"Fp8Config(weight_block_size=[128, 128]) gave FusedMoE a {type(layer.quant_method).__name__} "
                "that is not a block-quantized Fp8MoEMethod"
            )
        yield m, layer


def layer_fp8_weights(layer: torch.nn.Module, fc1_layout: Fc1Layout, gated: bool) -> MoeWeights:
    """A ``FusedMoE``'s block-FP8 buffers as :class:`MoeWeights` (E4M3 bytes, fp32 tile scales); a gated layer's
    FC1 rows read in ``fc1_layout`` and returned ``[gate; up]`` (:func:`~contracts.moe.relayout_moe`)."""
    weights = MoeWeights(
        w13=layer.w13_weight.detach().view(torch.uint8).clone(),
        w13_scale=layer.w13_weight_scale_inv.detach().float().clone(),
        w2=layer.w2_weight.detach().view(torch.uint8).clone(),
        w2_scale=layer.w2_weight_scale_inv.detach().float().clone(),
        block=FP8_BLOCK,
        fc1_layout=fc1_layout if gated else Fc1Layout.GATE_UP,
    )
    return relayout_moe(weights, Fc1Layout.GATE_UP)


def load_fp8_rank(
    backend: Fp8MoeBackend, checkpoint: MoeWeights, gated: bool, tp: int, rank: int, ep: int = 1
) -> tuple[MoeWeights, int]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid's block-FP8 expert buffers after SGLang's loader has read the whole
    (unsharded) ``checkpoint`` (FC1 ``[gate; up]``): a real ``FusedMoE`` of that rank (:func:`fp8_fused_moe`) and
    ``FusedMoE.weight_loader`` on every full checkpoint tensor of every expert, before post-load processing.
    Returns the buffers (FC1 ``[gate; up]``) and the per-rank intermediate size of the buffer."""
    e, h, i = checkpoint.w13.shape[0], checkpoint.hidden_size, checkpoint.intermediate_size
    with fp8_fused_moe(backend, e, h, i, gated, tp, rank, ep) as (_, layer):
        load_fp8_checkpoint(layer, checkpoint, gated)
        loaded = layer_fp8_weights(layer, FP8_BACKENDS[backend].fc1_layout, gated)
        return loaded, loaded.intermediate_size


class SglangFp8MoeAlignment:
    """SGLang's block-FP8 MoE path (``Fp8MoEMethod``) for its Triton and FlashInfer TRT-LLM runners.

    A real ``FusedMoE`` at TP 1 holding the rank's experts (:func:`fp8_fused_moe`: ``FusedMoE.__init__``'s
    rounding of ``I`` to 128 under ``flashinfer_trtllm``; ``create_fp8_moe_weight_``'s ``ValueError`` "The
    output_size of gate's and up's weight = I is not divisible by weight quantization block_n = 128" otherwise),
    ``FusedMoE.weight_loader`` for every expert tensor (:func:`load_fp8_checkpoint`: the half placement, swapped to
    ``[up; gate]`` under ``flashinfer_trtllm``, and the zero fill of each half's tail), then
    ``process_weights_after_loading`` whole: on a CUDA platform without DeepGEMM its block-quant branch changes
    nothing (``requant_block_scale_ue8m0_for_deepgemm`` returns unless the DeepGEMM runner is selected) and no
    call needs a GPU, so no stand-in is used. The buffers are reported with FC1 rows ``[gate; up]`` (the
    contract's), read in the loader's order (:data:`~subjects.sglang.bridge.FP8_BACKENDS`' ``fc1_layout``).

    How SGLang splits a checkpoint over TP ranks is :func:`load_fp8_rank`'s, checked by
    ``tests/test_sglang_subject.py``.
    """

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        with fp8_fused_moe(backend, e, h, i, gated) as (_, layer):
            load_fp8_checkpoint(layer, weights, gated)
            layer.quant_method.process_weights_after_loading(layer)
            aligned = layer_fp8_weights(layer, FP8_BACKENDS[backend].fc1_layout, gated)
        return AlignedMoe(aligned, aligned.intermediate_size, aligned.hidden_size)
