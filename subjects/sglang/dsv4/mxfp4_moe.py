"""``mxfp4_moe`` for the ``sglang-deepseek-v4`` subject: a real ``FusedMoE`` whose ``Fp8Config`` picks the
DeepSeek-V4 FP4 expert method of :data:`subjects.sglang.dsv4.bridge.DSV4_BACKENDS`, loaded under DeepSeek-V4's
checkpoint names, then the method's ``process_weights_after_loading`` with its GPU-only calls stood in; and how
its loader splits a checkpoint over ranks (:func:`load_dsv4_rank`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.errors import CheckpointNotServed, LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, cut_hidden, relayout_moe
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout, split_fc1
from subjects.sglang.bridge import SglangSourceMismatch
from subjects.sglang.dsv4.bridge import DSV4_BACKENDS, SglangDsv4Backend, dsv4_modules, not_mapped
from subjects.sglang.layer import sglang_layer_context

DSV4_QUANT_CONFIG: dict[str, Any] = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "scale_fmt": "ue8m0",
}
"""DeepSeek-V4's ``quantization_config`` (FP8 block-quantized linear layers; the routed experts' MXFP4 form is
detected from the checkpoint's dtypes, ``configs/deepseek_v4.py:try_detect_fp4_experts``)."""

DSV4_SWIGLU_LIMIT = 10.0
"""DeepSeek-V4's ``swiglu_limit``, which ``DeepseekV2MoE`` passes to ``FusedMoE`` (it does not change the
weights' preparation)."""

DSV4_PREFIX = "model.layers.0.mlp.experts"


# --- the layer: construction, DeepSeek-V4's checkpoint, SGLang's loader ------------------------------


def dsv4_checkpoint(weights: MoeWeights) -> list[tuple[str, torch.Tensor]]:
    """``weights`` (gated, FC1 rows in any layout) under DeepSeek-V4's checkpoint names and dtypes: per expert
    ``layers.0.ffn.experts.{e}.{w1,w3,w2}.weight`` (int8, packed E2M1 pairs, ``[rows, K/2]``) and ``.scale``
    (``float8_e8m0fnu``, ``[rows, K/32]``); ``w1`` is the gate projection, ``w3`` the up one."""
    gate_up = {name: split_fc1(getattr(weights, name), weights.fc1_layout) for name in ("w13", "w13_scale")}
    named = []
    for e in range(weights.w13.shape[0]):
        parts = {
            "w1": (gate_up["w13"][0][e], gate_up["w13_scale"][0][e]),
            "w3": (gate_up["w13"][1][e], gate_up["w13_scale"][1][e]),
            "w2": (weights.w2[e], weights.w2_scale[e]),
        }
        for proj, (w, s) in parts.items():
            prefix = f"layers.0.ffn.experts.{e}.{proj}"
            named += [(f"{prefix}.weight", w.contiguous().view(torch.int8)),
                      (f"{prefix}.scale", s.contiguous().view(torch.float8_e8m0fnu))]  # fmt: skip
    return named


def load_dsv4_experts(m: types.SimpleNamespace, layer: torch.nn.Module, weights: MoeWeights) -> None:
    """Feed :func:`dsv4_checkpoint` to ``layer`` as ``DeepseekV4ForCausalLM.load_weights`` feeds its experts: each
    name through ``remap_weight_name_to_dpsk_hf_format``, then the first ``make_expert_params_mapping`` entry whose
    checkpoint part the name holds gives the parameter, shard and expert for its ``weight_loader``."""
    mapping = m.FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj", ckpt_up_proj_name="up_proj",
        num_experts=weights.w13.shape[0],
    )  # fmt: skip
    params = {f"{DSV4_PREFIX}.{n}": p for n, p in layer.named_parameters()}
    for name, tensor in dsv4_checkpoint(weights):
        name = m.dsv4.DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(name, num_hidden_layers=1)
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name not in name:
                continue
            resolved = name.replace(weight_name, param_name)
            if resolved not in params:
                raise SglangSourceMismatch(f"{type(layer.quant_method).__name__} has no parameter {resolved}")
            param = params[resolved]
            param.weight_loader(param, tensor, resolved, shard_id=shard_id, expert_id=expert_id)
            break
        else:
            raise SglangSourceMismatch(f"FusedMoE.make_expert_params_mapping maps no parameter to {name}")


@contextlib.contextmanager
def dsv4_layer(
    backend: Mxfp4MoeBackend, checkpoint: MoeWeights, tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[tuple[types.SimpleNamespace, torch.nn.Module]]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`subjects.sglang.layer.parallel_layout`) of a DeepSeek-V4 MXFP4 MoE
    layer after SGLang's loader has read the whole
    ``checkpoint`` (:func:`load_dsv4_experts`), before post-load processing, under ``backend``'s selection
    (:data:`DSV4_BACKENDS`): a real ``FusedMoE`` whose ``Fp8Config`` (:data:`DSV4_QUANT_CONFIG`, with
    ``is_fp4_experts`` and ``is_dsv4_fp4_experts`` set as ``model_loader/loader.py`` sets them) picks the method.
    Raises :class:`~contracts.errors.CheckpointNotServed` for a checkpoint with expert biases."""
    if backend not in DSV4_BACKENDS:
        raise LibraryUnavailable(not_mapped(backend))
    if checkpoint.w13_bias is not None or checkpoint.w2_bias is not None:
        raise CheckpointNotServed("SGLang's DeepSeek-V4 FP4 expert methods allocate no expert biases")
    selection = DSV4_BACKENDS[backend]
    e, h, i = checkpoint.w13.shape[0], checkpoint.hidden_size, checkpoint.intermediate_size
    with (
        sglang_layer_context(selection.runner, selection.platform, tp, rank, ep) as base,
        contextlib.ExitStack() as stack,
    ):
        m = dsv4_modules()
        for module, name, value in selection.switches:
            stack.enter_context(mock.patch.object(getattr(m, module), name, value))
        config = m.fp8.Fp8Config.from_config(DSV4_QUANT_CONFIG)
        config.is_fp4_experts = True
        config.is_dsv4_fp4_experts = True
        layer = base.FusedMoE(
            num_experts=e, hidden_size=h, intermediate_size=i, layer_id=0, top_k=1, quant_config=config,
            prefix=DSV4_PREFIX, swiglu_limit=DSV4_SWIGLU_LIMIT,
        )  # fmt: skip
        if type(layer.quant_method).__name__ != selection.method:
            raise SglangSourceMismatch(
                f"Fp8Config gave a DeepSeek-V4 FusedMoE under --moe-runner-backend {selection.runner} a "
                f"{type(layer.quant_method).__name__}, not {selection.method}"
            )
        load_dsv4_experts(m, layer, checkpoint)
        yield m, layer


def _e8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """A scale buffer as UE8M0 bytes: E8M0 / byte buffers viewed; float buffers (SGLang's float32 staging, Marlin's
    bf16 ``2^e``) cast to ``float8_e8m0fnu`` as SGLang casts them (``w13_scale.to(torch.float8_e8m0fnu)``,
    ``mxfp4_marlin_process_scales``), exact for every power of two; a zero (Marlin's pad) becomes byte 0."""
    if scale.dtype.is_floating_point and scale.dtype not in (torch.float8_e8m0fnu, torch.float8_e4m3fn):
        scale = scale.to(torch.float8_e8m0fnu)
    return scale.contiguous().view(torch.uint8)


READERS = {
    "scale_inv": ("w13_weight_scale_inv", "w2_weight_scale_inv"),
    "marlin_scale": ("w13_weight_scale", "w2_weight_scale"),
}
"""Where each method leaves its scales: the loader's ``*_weight_scale_inv`` (TRT-LLM: E8M0 bytes viewed as
``float8_e4m3fn`` after its shuffle stand-ins; CUTLASS: the bytes), or Marlin's ``*_weight_scale`` (bf16)."""


def layer_experts(layer: torch.nn.Module, fc1_layout: Fc1Layout, read: str = "scale_inv") -> MoeWeights:
    """The layer's expert buffers as :class:`MoeWeights` bytes (FC1 rows in ``fc1_layout``)."""
    w13 = layer.w13_weight.detach().contiguous().view(torch.uint8)
    w2 = layer.w2_weight.detach().contiguous().view(torch.uint8)
    e, rows, hp, ip = w13.shape[0], w13.shape[1], 2 * w13.shape[2], 2 * w2.shape[2]
    s13, s2 = (_e8m0_bytes(getattr(layer, name).detach()) for name in READERS[read])
    return MoeWeights(
        w13=w13.clone(), w13_scale=s13.reshape(e, rows, hp // MXFP4_BLOCK).clone(),
        w2=w2.clone(), w2_scale=s2.reshape(e, w2.shape[1], ip // MXFP4_BLOCK).clone(),
        block=MXFP4_BLOCK, fc1_layout=fc1_layout,
    )  # fmt: skip


def process_dsv4_layer(m: types.SimpleNamespace, layer: torch.nn.Module, selection: SglangDsv4Backend) -> AlignedMoe:
    """The layer's ``quant_method.process_weights_after_loading`` with ``selection.device_calls`` replaced by their
    stand-ins and ``torch.cuda.empty_cache`` a no-op: the buffers SGLang hands those calls."""
    with contextlib.ExitStack() as stack:
        for module, name, stand_in in selection.device_calls:
            stack.enter_context(mock.patch.object(getattr(m, module), name, stand_in, create=True))
        stack.enter_context(mock.patch.object(torch.cuda, "empty_cache", lambda: None))
        layer.quant_method.process_weights_after_loading(layer)
    weights = layer_experts(layer, selection.fc1_layout, selection.read)
    return AlignedMoe(weights, weights.intermediate_size, weights.hidden_size)


class SglangDsv4MoeAlignment:
    """SGLang's DeepSeek-V4 FP4 expert methods per backend (:data:`DSV4_BACKENDS`).

    ``align_moe`` builds a real ``FusedMoE`` at TP 1 sized for the rank's experts (:func:`dsv4_layer`:
    ``Fp8Config.get_quant_method`` and the method's ``create_weights``), loads them under DeepSeek-V4's names
    (:func:`load_dsv4_experts`; any FC1 layout is first split into ``w1`` / ``w3``) and runs the method's
    ``process_weights_after_loading`` (:func:`process_dsv4_layer`): sizes, placement, pad values and FC1 row
    order are SGLang's. How SGLang splits the checkpoint over TP ranks is :func:`load_dsv4_rank`'s.
    """

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if not gated:
            raise UnsupportedConfig("SGLang's DeepSeek-V4 FP4 expert methods run gated experts only")
        with dsv4_layer(backend, relayout_moe(weights, Fc1Layout.GATE_UP)) as (m, layer):
            return process_dsv4_layer(m, layer, DSV4_BACKENDS[backend])


def load_dsv4_rank(backend: Mxfp4MoeBackend, checkpoint: MoeWeights, tp: int, rank: int, ep: int = 1) -> MoeWeights:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid's expert buffers (its ``E/ep`` local experts) after SGLang's loader
    has read the whole (unsharded) ``checkpoint`` (:func:`dsv4_layer`), before post-load processing: FC1 rows ``[gate; up]`` (a method whose
    ``load_up_proj_weight_first`` is set, CUTLASS's, loads ``[up; gate]``: read as such and converted) and the
    hidden size cut back to the checkpoint's (Marlin's buffer rounds it to 256)."""
    with dsv4_layer(backend, relayout_moe(checkpoint, Fc1Layout.GATE_UP), tp, rank, ep) as (_, layer):
        up_first = getattr(layer.quant_method, "load_up_proj_weight_first", False)
        loaded = layer_experts(layer, Fc1Layout.UP_GATE if up_first else Fc1Layout.GATE_UP)
    return cut_hidden(relayout_moe(loaded, Fc1Layout.GATE_UP), checkpoint.hidden_size)
