"""``mxfp4_moe`` for the ``sglang`` subject: SGLang's MXFP4 MoE methods per backend of
:data:`subjects.sglang.bridge.MXFP4_BACKENDS` for both checkpoint families (gpt-oss's through ``Mxfp4MoEMethod``,
stacked ones through ``Mxfp4MoEMethod`` or, on AITER, Quark OCP-MX's ``QuarkW4A4MXFp4MoE``), and how their
loaders split a checkpoint over ranks (:func:`load_mxfp4_rank`, :func:`load_quark_mxfp4_rank`)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from adapters import triton_kernels as tk
from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.errors import LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, relayout_moe
from reference.layouts import Fc1Layout
from subjects.engine_tools import cuda_as_identity, pass_through, stand_in_function
from subjects.sglang.bridge import MXFP4_BACKENDS, SglangSourceMismatch, not_mapped
from subjects.sglang.layer import sglang_layer_context

GPT_OSS_PREFIX = "model.layers.0.mlp.experts"

GPT_OSS_MOE: dict[str, Any] = {"activation": "silu", "gemm1_alpha": 1.702, "gemm1_clamp_limit": 7.0, "with_bias": True}
"""The ``FusedMoE`` arguments ``GptOssSparseMoeBlock`` passes for gpt-oss's config (``hidden_act`` silu,
``hidden_act_alpha`` 1.702, ``swiglu_limit`` 7.0, expert biases)."""

GPT_OSS_TENSORS = {
    "gate_up_proj_blocks": "w13",
    "gate_up_proj_scales": "w13_scale",
    "down_proj_blocks": "w2",
    "down_proj_scales": "w2_scale",
    "gate_up_proj_bias": "w13_bias",
    "down_proj_bias": "w2_bias",
}
"""gpt-oss checkpoint tensor suffixes (what ``GptOssForCausalLM._load_mxfp4_experts_weights`` reads) and
the :class:`~contracts.moe.MoeWeights` field each holds."""


def gpt_oss_checkpoint(weights: MoeWeights) -> list[tuple[str, torch.Tensor]]:
    """``weights`` (FC1 rows interleaved) under gpt-oss's checkpoint names and shapes: blocks
    ``[E, N, K/32, 16]`` bytes, scales ``[E, N, K/32]`` UE8M0 bytes, biases bf16 (their dtype there)."""
    if weights.fc1_layout is not Fc1Layout.GATE_UP_INTERLEAVED:
        raise UnsupportedConfig(f"a gpt-oss checkpoint has interleaved FC1 rows, not {weights.fc1_layout.value}")
    e, named = weights.w13.shape[0], []
    for suffix, field in GPT_OSS_TENSORS.items():
        t = getattr(weights, field)
        if t is None:
            continue
        if suffix.endswith("_blocks"):
            t = t.reshape(e, t.shape[1], -1, 16)
        elif suffix.endswith("_bias"):
            t = t.to(torch.bfloat16)
        named.append((f"{GPT_OSS_PREFIX}.{suffix}", t))
    return named


def _gpt_oss_stand_in(layer: torch.nn.Module, experts: int, intermediate: int) -> torch.nn.Module:
    """The part of a ``GptOssForCausalLM`` its expert loader reads: ``layer`` at :data:`GPT_OSS_PREFIX`
    (``get_submodule``, ``named_parameters``) and ``config.intermediate_size`` / ``num_local_experts``."""
    root = parent = torch.nn.Module()
    *path, leaf = GPT_OSS_PREFIX.split(".")
    for part in path:
        child = torch.nn.Module()
        parent.add_module(part, child)
        parent = child
    parent.add_module(leaf, layer)
    root.config = types.SimpleNamespace(intermediate_size=intermediate, num_local_experts=experts)
    return root


STACKED_MOE: dict[str, Any] = {"activation": "silu", "gate_up_interleaved": False, "with_bias": True}
"""The ``FusedMoE`` arguments of SGLang's stacked ``[gate; up]`` MXFP4 models on ``Mxfp4MoEMethod``
(``models/kimi_k3.py``, ``models/minimax_m3.py``: ``gate_up_interleaved=False``, per-expert ``w1``/``w3``
loading), with SiLU gating (the suite's SwiGLU) and bias buffers."""


def load_stacked_experts(layer: torch.nn.Module, weights: MoeWeights) -> None:
    """Feed a stacked ``[gate; up]`` checkpoint to ``FusedMoE.weight_loader`` per expert and shard, as Kimi-K3 and
    MiniMax-M3 do: ``w1`` (gate) and ``w3`` (up) of ``w13_weight`` / ``w13_weight_scale`` / ``w13_weight_bias``,
    ``w2``; the loader narrows the rank's channels."""
    i = weights.intermediate_size
    halves = {"w1": slice(0, i), "w3": slice(i, 2 * i)}
    for e in range(weights.w13.shape[0]):
        for name, field in (("w13_weight", "w13"), ("w13_weight_scale", "w13_scale"), ("w13_weight_bias", "w13_bias")):
            tensor = getattr(weights, field)
            if tensor is None:
                continue
            for shard, rows in halves.items():
                layer.weight_loader(getattr(layer, name), tensor[e, rows], f"{GPT_OSS_PREFIX}.{name}", shard, e)
        for name, field in (("w2_weight", "w2"), ("w2_weight_scale", "w2_scale"), ("w2_weight_bias", "w2_bias")):
            tensor = getattr(weights, field)
            if tensor is not None:
                layer.weight_loader(getattr(layer, name), tensor[e], f"{GPT_OSS_PREFIX}.{name}", "w2", e)


@contextlib.contextmanager
def mxfp4_layer(
    backend: Mxfp4MoeBackend, checkpoint: MoeWeights, tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[tuple[types.SimpleNamespace, torch.nn.Module]]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`~subjects.sglang.layer.parallel_layout`) of an MXFP4 MoE layer after SGLang's loader has read the whole ``checkpoint``.

    A real ``FusedMoE`` (``Mxfp4Config(is_checkpoint_mxfp4_serialized=True)``) built under ``backend``'s
    selection (:data:`MXFP4_BACKENDS`, :func:`sglang_layer_context`): its constructor rounds the hidden
    size (``flashinfer_mxfp4``: 256) and ``Mxfp4MoEMethod.create_weights`` rounds and allocates per backend.
    Then, by family: gpt-oss's for interleaved rows or experts with biases (SGLang's stacked MXFP4 models,
    Kimi-K3 and MiniMax-M3, have no expert biases, and its per-expert loader reads a 1-D ``w2_weight_bias``
    as a weight matrix), stacked otherwise; rows in another order (a kernel's) first take the family's
    checkpoint form (``contracts.moe.relayout_moe``):

    * interleaved (gpt-oss, :data:`GPT_OSS_MOE`): ``GptOssForCausalLM._load_mxfp4_experts_weights`` (on
      :func:`_gpt_oss_stand_in`) narrows the rank's whole 32-blocks (``cdiv(I/32, tp)·32`` channels, the last
      ranks short) and calls ``FusedMoE.weight_loader`` with ``expert_id=None``, which copies them into the
      buffer's leading corner;
    * stacked ``[gate; up]`` (:data:`STACKED_MOE`): :func:`load_stacked_experts`, the loader narrowing
      ``I/tp`` channels per half.

    Yields SGLang's modules and the layer, before post-load processing.
    """
    if backend not in MXFP4_BACKENDS:
        raise LibraryUnavailable(not_mapped(backend))
    runner = MXFP4_BACKENDS[backend]
    e, h, i = checkpoint.w13.shape[0], checkpoint.hidden_size, checkpoint.intermediate_size
    interleaved = gpt_oss_family(checkpoint)
    checkpoint = relayout_moe(checkpoint, Fc1Layout.GATE_UP_INTERLEAVED if interleaved else Fc1Layout.GATE_UP)
    with sglang_layer_context(runner.runner, runner.platform, tp, rank, ep) as m, contextlib.ExitStack() as stack:
        for name, value in runner.switches.items():
            stack.enter_context(mock.patch.object(m.mxfp4, name, value))
        config = m.mxfp4.Mxfp4Config(is_checkpoint_mxfp4_serialized=True)
        layer = m.FusedMoE(
            num_experts=e, hidden_size=h, intermediate_size=i, layer_id=0, top_k=1, quant_config=config,
            prefix=GPT_OSS_PREFIX, **(GPT_OSS_MOE if interleaved else STACKED_MOE),
        )  # fmt: skip
        if not isinstance(layer.quant_method, m.mxfp4.Mxfp4MoEMethod):
            raise SglangSourceMismatch(f"Mxfp4Config gave FusedMoE a {type(layer.quant_method).__name__}")
        if interleaved:
            m.gpt_oss.GptOssForCausalLM._load_mxfp4_experts_weights(
                _gpt_oss_stand_in(layer, e, i), iter(gpt_oss_checkpoint(checkpoint))
            )
        else:
            load_stacked_experts(layer, checkpoint)
        yield m, layer


def _layer_weights(layer: torch.nn.Module, fc1_layout: Fc1Layout, biased: bool) -> MoeWeights:
    """A ``FusedMoE``'s MXFP4 expert tensors as :class:`MoeWeights` (bytes; biases fp32, ``[E, N]``). SGLang
    allocates bias buffers for every CUDA layer; they are reported only for a checkpoint with ``biased``
    experts (zeros otherwise)."""
    w13 = layer.w13_weight.detach().view(torch.uint8)
    e, rows, hp = w13.shape[0], w13.shape[1], 2 * w13.shape[2]
    w2 = layer.w2_weight.detach().view(torch.uint8)
    b13, b2 = (getattr(layer, name, None) if biased else None for name in ("w13_weight_bias", "w2_weight_bias"))
    return MoeWeights(
        w13=w13.clone(), w13_scale=layer.w13_weight_scale.detach().view(torch.uint8).reshape(e, rows, -1).clone(),
        w2=w2.clone(), w2_scale=layer.w2_weight_scale.detach().view(torch.uint8).reshape(e, hp, -1).clone(),
        block=32, fc1_layout=fc1_layout,
        w13_bias=None if b13 is None else b13.detach().float().reshape(e, -1).clone(),
        w2_bias=None if b2 is None else b2.detach().float().reshape(e, -1).clone(),
    )  # fmt: skip


def load_mxfp4_rank(
    backend: Mxfp4MoeBackend, checkpoint: MoeWeights, tp: int, rank: int, ep: int = 1
) -> tuple[MoeWeights, int]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid's expert buffers after SGLang's loader has read the whole (unsharded)
    ``checkpoint`` (:func:`mxfp4_layer`), before any post-load processing: FC1 rows as loaded, in the
    family's layout (gpt-oss's interleaved pairs in the leading corner, padded scales E8M0 127; stacked
    ``[gate; up]`` halves), biases fp32. Returns them and the per-rank intermediate size of the buffer."""
    layout = Fc1Layout.GATE_UP_INTERLEAVED if gpt_oss_family(checkpoint) else Fc1Layout.GATE_UP
    with mxfp4_layer(backend, checkpoint, tp, rank, ep) as (_, layer):
        loaded = _layer_weights(layer, layout, checkpoint.w13_bias is not None)
        return loaded, loaded.intermediate_size


QUARK_OCP_MX_CONFIG: dict[str, Any] = {
    "quant_method": "quark",
    "global_quant_config": {
        "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "is_dynamic": False, "scale_format": "e8m0"},
        "input_tensors": {
            "dtype": "fp4", "qscheme": "per_group", "group_size": 32, "is_dynamic": True, "scale_format": "e8m0",
        },
        "output_tensors": None,
        "bias": None,
    },
    "layer_quant_config": {},
    "layer_type_quant_config": {},
    "packed_modules_mapping": {},
    "exclude": [],
    "export": {"kv_cache_group": [], "pack_method": "reorder"},
}  # fmt: skip
"""The ``quantization_config`` of a Quark OCP-MX W4A4 MXFP4 checkpoint (weights and activations fp4, 32-element
groups, E8M0 scales), which ``QuarkConfig.from_config`` reads."""


@contextlib.contextmanager
def quark_layer(
    checkpoint: MoeWeights, tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[tuple[types.SimpleNamespace, torch.nn.Module]]:
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`~subjects.sglang.layer.parallel_layout`) of a Quark OCP-MX MXFP4 MoE layer on AITER after SGLang's loader has read the
    whole stacked ``[gate; up]`` ``checkpoint``, before post-load processing.

    A real ``FusedMoE`` with ``QuarkConfig.from_config(QUARK_OCP_MX_CONFIG)`` under :data:`MXFP4_BACKENDS`'
    AITER selection (``QuarkW4A4MXFp4MoE``'s module switches ``_use_aiter`` and ``_is_shuffle_moe_mxfp4`` set,
    as ``SGLANG_USE_AITER`` on a gfx950): its ``create_weights`` sizes the buffers with
    ``get_moe_weight_sizes(is_aiter_moe=True)`` (``I/tp`` rounded to 256, the hidden size unpadded) and wraps
    the loader in ``_rank_chunk_padding_loader``, which zero-pads each rank's ``I/tp`` chunk to the buffer;
    :func:`load_stacked_experts` feeds it per expert.
    """
    if checkpoint.w13_bias is not None:
        raise UnsupportedConfig("QuarkW4A4MXFp4MoE has no expert biases")
    runner = MXFP4_BACKENDS[Mxfp4MoeBackend.AITER]
    e, h, i = checkpoint.w13.shape[0], checkpoint.hidden_size, checkpoint.intermediate_size
    checkpoint = relayout_moe(checkpoint, Fc1Layout.GATE_UP)
    with sglang_layer_context(runner.runner, runner.platform, tp, rank, ep) as m, contextlib.ExitStack() as stack:
        for name in QUARK_SWITCHES:
            stack.enter_context(mock.patch.object(m.quark_moe, name, True))
        config = m.quark.QuarkConfig.from_config(QUARK_OCP_MX_CONFIG)
        layer = m.FusedMoE(
            num_experts=e, hidden_size=h, intermediate_size=i, layer_id=0, top_k=1, quant_config=config,
            prefix=GPT_OSS_PREFIX, activation="silu",
        )  # fmt: skip
        if not isinstance(getattr(layer, "scheme", None), m.quark_moe.QuarkW4A4MXFp4MoE):
            raise SglangSourceMismatch(f"QuarkConfig gave FusedMoE a {type(layer.scheme).__name__} scheme")
        load_stacked_experts(layer, checkpoint)
        yield m, layer


QUARK_SWITCHES = ("_use_aiter", "_is_shuffle_moe_mxfp4")
"""Module switches of ``quark_w4a4_mxfp4_moe.py`` read from the platform at import (ROCm with
``SGLANG_USE_AITER``; gfx950's MXFP4 weight preshuffle), set for an MI350x."""

QUARK_DEVICE_CALLS = (("quark_moe", "e8m0_shuffle"), ("quark_moe", "shuffle_weight"))
"""AITER's layout calls in ``QuarkW4A4MXFp4MoE.process_weights_after_loading`` on gfx950 (``e8m0_shuffle`` of the
scales viewed ``[E·N, K/32]``, ``shuffle_weight(w, (16, 16))``), passed through by :func:`process_mxfp4_layer`."""


def load_quark_mxfp4_rank(checkpoint: MoeWeights, tp: int, rank: int, ep: int = 1) -> tuple[MoeWeights, int]:
    """:func:`quark_layer`'s buffers (FC1 ``[gate; up]`` halves) and the per-rank intermediate size of the buffer."""
    with quark_layer(checkpoint, tp, rank, ep) as (_, layer):
        loaded = _layer_weights(layer, Fc1Layout.GATE_UP, False)
        return loaded, loaded.intermediate_size


def _identity_permutation(x: torch.Tensor, *_: object, **__: object) -> torch.Tensor:
    """Stand-in for ``_get_flashinfer_mxfp4_device_permute_indices``: the rows of ``x`` in order."""
    return torch.arange(x.shape[0])


def _e8m0_scales(scales: torch.Tensor, *_: object, **__: object) -> torch.Tensor:
    """Stand-in for DeepGEMM's ``transform_sf_into_required_layout``: the fp32 scales SGLang widened from E8M0
    (exact powers of two, NaN for byte 255) back as E8M0, in the layout given."""
    return scales.to(torch.float8_e8m0fnu)


DEVICE_STAND_INS: dict[str, Callable[..., Any]] = {
    "_get_flashinfer_mxfp4_device_permute_indices": _identity_permutation,
    "transform_sf_into_required_layout": _e8m0_scales,
}
"""Stand-ins for the GPU-only calls of :data:`MXFP4_BACKENDS` that are not pass-throughs of their first argument."""


def process_mxfp4_layer(
    m: types.SimpleNamespace,
    layer: torch.nn.Module,
    device_calls: tuple[tuple[str, str], ...],
    fc1_layout: Fc1Layout,
    biased: bool,
) -> AlignedMoe:
    """The layer's ``quant_method.process_weights_after_loading``, ``device_calls`` (``(module, name)`` in
    :func:`~subjects.sglang.bridge.sglang_modules`' namespace) passed through and ``Tensor.cuda`` kept on the CPU: the buffers SGLang
    hands those calls, read in ``fc1_layout`` (the order the branch's source leaves)."""
    with contextlib.ExitStack() as stack:
        for module, name in device_calls:
            stand_in = DEVICE_STAND_INS.get(name, pass_through)
            if hasattr(m, module):
                stack.enter_context(mock.patch.object(getattr(m, module), name, stand_in, create=True))
            else:
                stack.enter_context(stand_in_function(module, name, stand_in))
        stack.enter_context(cuda_as_identity())
        layer.quant_method.process_weights_after_loading(layer)
    weights = _layer_weights(layer, fc1_layout, biased)
    return AlignedMoe(weights, weights.intermediate_size, weights.hidden_size)


@contextlib.contextmanager
def handed_to_triton_kernels(m: types.SimpleNamespace) -> Iterator[list[torch.Tensor]]:
    """Run SGLang's triton_kernels preparation on the CPU, recording what it hands ``convert_layout``.

    The triton_kernels modules are ``adapters.triton_kernels.recorded_hand_over``'s stand-ins, which record
    what ``convert_layout`` is handed (the yielded list: weights ``[E, K/2, N]``, scales ``[E, K/32, N]``, in
    ``_swizzle_mxfp4``'s order); ``_mx_block_kwargs`` (the ``PrecisionConfig`` field probe) returns no
    keywords. So the scale padding (``_pad_hopper_mxfp4_scale`` on SM90) and every transpose are SGLang's.
    """
    with tk.recorded_hand_over() as handed, mock.patch.object(m.mxfp4, "_mx_block_kwargs", dict):
        yield handed


def process_triton_kernels_layer(m: types.SimpleNamespace, layer: torch.nn.Module, biased: bool) -> AlignedMoe:
    """The layer's ``Mxfp4MoEMethod.process_weights_after_loading`` on its triton_kernels branch
    (:func:`handed_to_triton_kernels`): what SGLang hands ``convert_layout``, in the contract's form
    (``adapters.triton_kernels.handed_weights``), with the fp32 biases it keeps on the layer."""
    with handed_to_triton_kernels(m) as handed:
        layer.quant_method.process_weights_after_loading(layer)
    if len(handed) != 4:
        raise SglangSourceMismatch(
            f"Mxfp4MoEMethod's triton_kernels branch handed convert_layout {len(handed)} tensors, not 4"
        )
    b13, b2 = (getattr(layer, name).detach() if biased else None for name in ("w13_weight_bias", "w2_weight_bias"))
    weights = tk.handed_weights(handed, b13, b2)
    return AlignedMoe(weights, weights.intermediate_size, weights.hidden_size)


def gpt_oss_family(weights: MoeWeights) -> bool:
    """Whether SGLang loads ``weights`` as a gpt-oss checkpoint: FC1 rows interleaved, or expert biases (SGLang's
    stacked MXFP4 models, Kimi-K3 and MiniMax-M3, have none, and its per-expert loader reads a 1-D
    ``w2_weight_bias`` as a weight matrix)."""
    return weights.fc1_layout.interleaved or weights.w13_bias is not None


class SglangMxfp4MoeAlignment:
    """SGLang's MXFP4 MoE methods per backend (:data:`MXFP4_BACKENDS`), for both checkpoint families.

    * gpt-oss's interleaved pairs (and any checkpoint with expert biases, :func:`gpt_oss_family`), and stacked
      ``[gate; up]`` checkpoints on FlashInfer TRT-LLM, FlashInfer SM90 and Marlin (Kimi-K3, MiniMax-M3):
      ``Mxfp4MoEMethod`` (``quantization/mxfp4.py``, :func:`mxfp4_layer`);
    * stacked ``[gate; up]`` checkpoints on AITER: Quark OCP-MX's ``QuarkW4A4MXFp4MoE``
      (``quark/schemes/quark_w4a4_mxfp4_moe.py``, :func:`quark_layer`), with its own rounding (``I`` to 256,
      ``H`` unpadded).

    ``align_moe`` builds a real ``FusedMoE`` at TP 1 sized for the rank's checkpoint, loads it with SGLang's
    loader for the family (SGLang's placement into the padded buffer) and runs the method's
    ``process_weights_after_loading`` with its GPU-only layout calls passed through
    (:func:`process_mxfp4_layer`): sizes, placement, pad values and FC1 row order are SGLang's. How SGLang
    splits a checkpoint over TP ranks is :func:`load_mxfp4_rank`'s and :func:`load_quark_mxfp4_rank`'s,
    checked against ``reference.sizes`` by ``tests/test_sglang_subject.py``.

    Under ``triton_kernel`` the post-load branch hands the layer to triton_kernels, read back from what it hands
    ``convert_layout`` (:func:`process_triton_kernels_layer`); under ``deep_gemm`` DeepGEMM's scale transform is
    stood in (:data:`DEVICE_STAND_INS`).

    Not adapted: DeepSeek-V4's FP4 experts under ``Fp8Config`` (``Mxfp4FlashinferTrtllmMoEMethod``,
    ``Mxfp4FlashinferCutlassMoEMethod``, ``Mxfp4MarlinMoEMethod``: unpadded buffers, padded after loading).
    """

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if not gated:
            raise UnsupportedConfig("SGLang's MXFP4 MoE methods run gated experts only")
        if backend not in MXFP4_BACKENDS:
            raise LibraryUnavailable(not_mapped(backend))
        runner = MXFP4_BACKENDS[backend]
        if runner.stacked_via_quark and not gpt_oss_family(weights):
            with quark_layer(weights) as (m, layer):
                return process_mxfp4_layer(m, layer, QUARK_DEVICE_CALLS, Fc1Layout.GATE_UP, False)
        with mxfp4_layer(backend, weights) as (m, layer):
            if runner.triton_kernels:
                return process_triton_kernels_layer(m, layer, weights.w13_bias is not None)
            return process_mxfp4_layer(m, layer, runner.device_calls, runner.fc1_layout, weights.w13_bias is not None)
