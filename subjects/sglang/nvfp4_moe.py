"""``nvfp4_moe`` for the ``sglang`` subject: SGLang's ModelOpt NVFP4 MoE path (``ModelOptNvFp4FusedMoEMethod``:
``create_weights``, ``FusedMoE.weight_loader``, ``process_weights_after_loading``) per backend of
:data:`subjects.sglang.bridge.NVFP4_BACKENDS`, and how its loader splits a checkpoint over ranks
(:func:`load_nvfp4_rank`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe, MoeWeights
from reference.layouts import grouped_gate_up_interleave, inverse_permutation, unswizzle_128x4
from subjects.engine_tools import pass_through, stand_in_function
from subjects.sglang.bridge import BLACKWELL, NVFP4_BACKENDS, SglangSourceMismatch, not_mapped
from subjects.sglang.layer import sglang_layer_context

NVFP4_PREFIX = "model.layers.0.mlp.experts"


def load_nvfp4_checkpoint(layer: torch.nn.Module, weights: MoeWeights, gated: bool) -> None:
    """Feed one rank's expert tensors to ``FusedMoE.weight_loader`` as a ModelOpt checkpoint does, per expert
    and shard: ``w1`` (gate) and ``w3`` (up) of ``w13_weight`` / ``w13_weight_scale``, ``w2``; per-tensor
    scales of 1.0. The suite's FC1 rows are FlashInfer's ``[up; gate]``; SGLang's loader places the halves."""
    i = weights.intermediate_size
    e4m3 = torch.float8_e4m3fn
    halves = {"w3": slice(0, i), "w1": slice(i, 2 * i)} if gated else {"w1": slice(0, i)}
    for e in range(weights.w13.shape[0]):
        for shard, rows in halves.items():
            layer.weight_loader(layer.w13_weight, weights.w13[e, rows], f"{NVFP4_PREFIX}.w13_weight", shard, e)
            scale = weights.w13_scale[e, rows].view(e4m3)
            layer.weight_loader(layer.w13_weight_scale, scale, f"{NVFP4_PREFIX}.w13_weight_scale", shard, e)
            one = torch.tensor(1.0)
            layer.weight_loader(layer.w13_weight_scale_2, one, f"{NVFP4_PREFIX}.w13_weight_scale_2", shard, e)
            layer.weight_loader(layer.w13_input_scale, one, f"{NVFP4_PREFIX}.w13_input_scale", shard, e)
        layer.weight_loader(layer.w2_weight, weights.w2[e], f"{NVFP4_PREFIX}.w2_weight", "w2", e)
        scale = weights.w2_scale[e].view(e4m3)
        layer.weight_loader(layer.w2_weight_scale, scale, f"{NVFP4_PREFIX}.w2_weight_scale", "w2", e)
        layer.weight_loader(layer.w2_weight_scale_2, torch.tensor(1.0), f"{NVFP4_PREFIX}.w2_weight_scale_2", "w2", e)
        layer.weight_loader(layer.w2_input_scale, torch.tensor(1.0), f"{NVFP4_PREFIX}.w2_input_scale", "w2", e)


@contextlib.contextmanager
def nvfp4_fused_moe(
    backend: Nvfp4MoeBackend,
    experts: int,
    hidden: int,
    intermediate: int,
    gated: bool,
    tp: int = 1,
    rank: int = 0,
    ep: int = 1,
) -> Iterator[tuple[types.SimpleNamespace, torch.nn.Module]]:
    """A real ``FusedMoE`` of rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`~subjects.sglang.layer.parallel_layout`) for a ModelOpt NVFP4 checkpoint (``ModelOptFp4Config``,
    group 16, per-token activation scales where :data:`NVFP4_BACKENDS` says) of global ``intermediate``
    size, under ``--moe-runner-backend`` :data:`NVFP4_BACKENDS` on a B200 (:func:`sglang_layer_context`): its
    constructor picks ``ModelOptNvFp4FusedMoEMethod``, whose ``create_weights`` rounds and allocates."""
    if backend not in NVFP4_BACKENDS:
        raise LibraryUnavailable(not_mapped(backend))
    with sglang_layer_context(NVFP4_BACKENDS[backend].runner, BLACKWELL, tp, rank, ep) as m:
        config = m.modelopt.ModelOptFp4Config(
            is_checkpoint_nvfp4_serialized=True,
            group_size=16,
            use_per_token_activation=NVFP4_BACKENDS[backend].per_token_activation,
        )
        layer = m.FusedMoE(
            num_experts=experts, hidden_size=hidden, intermediate_size=intermediate, layer_id=0, top_k=1,
            quant_config=config, prefix=NVFP4_PREFIX, activation="silu" if gated else "relu2", is_gated=gated,
        )  # fmt: skip
        if not isinstance(layer.quant_method, m.modelopt.ModelOptNvFp4FusedMoEMethod):
            raise SglangSourceMismatch(
                f"ModelOptFp4Config gave FusedMoE a {type(layer.quant_method).__name__}, not ModelOptNvFp4FusedMoEMethod"
            )
        yield m, layer


def load_nvfp4_rank(
    backend: Nvfp4MoeBackend, checkpoint: MoeWeights, gated: bool, tp: int, rank: int, ep: int = 1
) -> tuple[MoeWeights, int]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid's expert buffers after SGLang's loader has read the whole
    (unsharded) ``checkpoint``: a real ``FusedMoE`` of that rank (:func:`nvfp4_fused_moe`) and
    ``FusedMoE.weight_loader`` on every full checkpoint tensor of every expert (it maps global expert ids to
    the rank's own, ``_map_global_expert_id_to_local_expert_id``, and skips the others), before any post-load
    processing.
    Returns the buffers (FC1 rows ``[up; gate]``, bytes) and the per-rank intermediate size."""
    e, h, i = checkpoint.w13.shape[0], checkpoint.hidden_size, checkpoint.intermediate_size
    with nvfp4_fused_moe(backend, e, h, i, gated, tp, rank, ep) as (_, layer):
        load_nvfp4_checkpoint(layer, checkpoint, gated)
        loaded = MoeWeights(
            w13=layer.w13_weight.detach().clone(), w13_scale=layer.w13_weight_scale.detach().view(torch.uint8).clone(),
            w2=layer.w2_weight.detach().clone(), w2_scale=layer.w2_weight_scale.detach().view(torch.uint8).clone(),
            block=16,
        )  # fmt: skip
        return loaded, layer.intermediate_size_per_partition


class SglangNvfp4MoeAlignment:
    """SGLang's ModelOpt NVFP4 MoE path (``ModelOptNvFp4FusedMoEMethod``) for FlashInfer TRT-LLM, CUTLASS and CuteDSL.

    A real ``FusedMoE`` at TP 1 holding the rank's experts (:func:`nvfp4_fused_moe`: ``create_weights``'
    intermediate rounding), ``FusedMoE.weight_loader`` for every expert tensor
    (:func:`load_nvfp4_checkpoint`: the per-half placement and zero fill), then
    ``process_weights_after_loading``, per the backend's :class:`SglangNvfp4Backend` (:data:`NVFP4_BACKENDS`):

    * a branch with a ``device_call`` (TRT-LLM, ``align_fp4_moe_weights_for_flashinfer_trtllm``): the FlashInfer shuffles inside
      ``prepare_static_weights_for_trtllm_fp4_moe`` are CUDA kernels; the adapter captures that call's
      inputs (the padded, not yet shuffled weights and the intermediate size it is given) and returns
      them; the properties run FlashInfer's shuffle helpers themselves.
    * a branch without one runs whole (CUTLASS: ``swizzle_blockscale`` is pure torch); the swizzled scales are read
      back with the reference inverse of the 128x4 swizzle, and the intermediate size the kernel sees
      is read off ``w2`` (the CUTLASS runner takes it from the weight shapes). CuteDSL runs the same branch
      after regrouping gated FC1 rows into 64-row ``[up; gate]`` groups (read back through the inverse), with
      FlashInfer's ``convert_sf_to_mma_layout`` (nvidia-cutlass-dsl) stood in (:func:`~subjects.engine_tools.stand_in_function`).

    How SGLang splits a checkpoint over TP ranks (whole padded blocks under TRT-LLM,
    ``reference.sizes.padded_split``) is :func:`load_nvfp4_rank`'s, checked by ``tests/test_sglang_subject.py``.
    """

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        with nvfp4_fused_moe(backend, e, h, i, gated) as (m, layer):
            selection = NVFP4_BACKENDS[backend]
            load_nvfp4_checkpoint(layer, weights, gated)
            if selection.device_call is not None:
                return self._captured(m, selection.device_call, layer)
            with contextlib.ExitStack() as stack:
                for module, name in selection.stand_ins:
                    stack.enter_context(stand_in_function(module, name, pass_through))
                layer.quant_method.process_weights_after_loading(layer)
            return self._cutlass(layer, h, selection.fc1_group if gated else None)

    @staticmethod
    def _captured(m: types.SimpleNamespace, device_call: str, layer: torch.nn.Module) -> AlignedMoe:
        """``process_weights_after_loading`` with ``quant_utils.<device_call>`` (``prepare_static_weights_for_trtllm_fp4_moe``'s
        signature) replaced by a capture: the padded weights and intermediate size SGLang hands it."""
        captured: dict[str, Any] = {}

        def capture(w13, w2, w13_scale, w2_scale, hidden_size, intermediate_size, num_experts, **_: object):
            captured.update(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale, ip=intermediate_size)
            return w13, w13_scale, w2, w2_scale

        with mock.patch.object(m.quant_utils, device_call, capture):
            layer.quant_method.process_weights_after_loading(layer)
        if not captured:
            raise SglangSourceMismatch(
                f"ModelOptNvFp4FusedMoEMethod.process_weights_after_loading did not call {device_call} "
                f"under --moe-runner-backend {m.get_moe_runner_backend().value}"
            )
        aligned = MoeWeights(
            w13=captured["w13"], w13_scale=captured["w13_scale"].view(torch.uint8),
            w2=captured["w2"], w2_scale=captured["w2_scale"].view(torch.uint8), block=16,
        )  # fmt: skip
        return AlignedMoe(aligned, int(captured["ip"]), aligned.hidden_size)

    @staticmethod
    def _cutlass(layer: torch.nn.Module, hidden: int, fc1_group: int | None) -> AlignedMoe:
        """The swizzled branch's buffers in the contract's form: scales through the inverse 128x4 swizzle, FC1
        rows through the inverse ``fc1_group``-row regrouping where the branch regrouped them."""
        w13, w2 = layer.w13_weight.detach().view(torch.uint8), layer.w2_weight.detach()
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        w13_scale = unswizzle_128x4(layer.w13_blockscale_swizzled.detach().view(torch.uint8), rows, hidden // 16)
        if fc1_group is not None:
            order = inverse_permutation(grouped_gate_up_interleave(rows, fc1_group))
            w13, w13_scale = w13[:, order], w13_scale[:, order]
        aligned = MoeWeights(
            w13=w13,
            w13_scale=w13_scale,
            w2=w2,
            w2_scale=unswizzle_128x4(layer.w2_blockscale_swizzled.detach().view(torch.uint8), hidden, ip // 16),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)
