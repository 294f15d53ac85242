"""``moe_sharding`` for the ``vllm`` subject: vLLM 0.33.0's own MoE weight loaders, driven on CPU for every rank.

For each rank of a TP degree the adapter builds that rank's expert parameters with vLLM's own
``create_weights`` and feeds the whole (unsharded) checkpoint through vLLM's loading code, which
narrows it by ``tp_rank``; the parameters after loading are the rank's shard. Three checkpoint forms:

* NVFP4, ModelOpt (gate, up and down projections per expert, 16-groups):
  ``ModelOptNvFp4FusedMoE.create_weights`` and ``RoutedExperts.weight_loader`` per expert and shard
  (``w1`` gate, ``w3`` up, ``w2`` down; ``_load_w13`` / ``_load_w2`` narrow by ``tp_rank``).
* MXFP4 with per-projection experts (Quark OCP-MX, 32-groups): ``QuarkOCP_MX_MoEMethod.create_weights``
  and the same ``RoutedExperts.weight_loader`` path.
* MXFP4 gpt-oss (fused row-interleaved ``gate_up_proj``, 32-groups): ``GptOssMxfp4MoEMethod.create_weights``
  with the intermediate buffer size ``mxfp4_round_up_hidden_size_and_intermediate_size`` gives
  FLASHINFER_TRTLLM_MXFP4_BF16 (gpt-oss on a B200: ``ru(I/tp, 128)``, so every rank's buffer is padded;
  the hidden rounding is the ``mxfp4_moe`` contract's and is not applied), and ``GptOssModel._load_weights_mxfp4``,
  which narrows each fused tensor by the rank's whole blocks and hands it to ``GptOssRoutedExperts.weight_loader``.

Substituted: the layer objects are built without their constructors (which select a GPU kernel
backend): a ``RoutedExperts`` carries vLLM's real ``FusedMoEConfig`` (whose ``__post_init__`` computes
``intermediate_size_per_partition = I / tp`` and asserts ``I % tp == 0``), the quant config and the
quant method with the attributes ``create_weights`` reads; the expert map is the identity (no EP).
``GptOssModel._load_weights_mxfp4`` runs on a stand-in model exposing the parameters by name, with
vLLM's distributed-group queries patched to the rank's TP group (no DP, PCP or PP). Parameters vLLM
allocates with ``torch.empty`` are filled with NaN codes (0xFF) first, so memory vLLM never writes
shows up as a non-finite scale or non-zero weight instead of whatever the allocator returned.

Which channels a rank holds (``RankShard.offset`` / ``real``) is read back, not computed
(:class:`subjects.moe_sharding.LoaderSharding`: a coordinate checkpoint through the same loader).
vLLM's even-split assertion (``I % tp``) is reported as :class:`~contracts.moe_sharding.ShardRefused`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from unittest import mock

import torch

from contracts.errors import UnsupportedConfig
from contracts.moe import MoeWeights
from contracts.moe_sharding import ShardRefused
from reference.formats import NVFP4_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1, split_fc1
from subjects.moe_sharding import NAN_BYTE, LoaderSharding

PREFIX = "layers.0.mlp.experts"


@functools.cache
def sharding_modules() -> types.SimpleNamespace:
    """vLLM's modules that allocate and load MoE expert weights (``subjects.vllm.vllm_modules`` first:
    it fixes the import order and raises :class:`~subjects.vllm.VllmUnavailable`)."""
    from subjects.vllm import vllm_modules

    vllm_modules()
    return types.SimpleNamespace(
        config=importlib.import_module("vllm.model_executor.layers.fused_moe.config"),
        activation=importlib.import_module("vllm.model_executor.layers.fused_moe.activation"),
        routed=importlib.import_module("vllm.model_executor.layers.fused_moe.routed_experts"),
        mxfp4_oracle=importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4"),
        modelopt=importlib.import_module("vllm.model_executor.layers.quantization.modelopt"),
        quark_moe=importlib.import_module("vllm.model_executor.layers.quantization.quark.quark_moe"),
        mxfp4=importlib.import_module("vllm.model_executor.layers.quantization.mxfp4"),
        gpt_oss=importlib.import_module("vllm.model_executor.models.gpt_oss"),
        parameter=importlib.import_module("vllm.model_executor.parameter"),
    )


def moe_config(v: types.SimpleNamespace, experts: int, hidden: int, size: int, gated: bool, tp: int, rank: int):
    """vLLM's ``FusedMoEConfig`` of rank ``rank`` of a plain TP group (no EP, DP, PCP); ``ShardRefused``
    where its ``__post_init__`` asserts ``I % tp == 0``. Non-gated layers need a CUDA-like platform
    there, which the patched ``current_platform`` reports."""
    parallel = v.config.FusedMoEParallelConfig(
        tp_size=tp, pcp_size=1, dp_size=1, ep_size=1, tp_rank=rank, pcp_rank=0, dp_rank=0, ep_rank=0,
        sp_size=1, use_ep=False, all2all_backend="naive", enable_eplb=False,
    )  # fmt: skip
    act = v.activation.MoEActivation
    platform = types.SimpleNamespace(is_cuda_alike=lambda: True, is_xpu=lambda: False)
    try:
        with mock.patch.object(v.config, "current_platform", platform):
            return v.config.FusedMoEConfig(
                num_experts=experts, experts_per_token=1, hidden_dim=hidden, intermediate_size=size,
                num_local_experts=experts, num_logical_experts=experts,
                activation=act.SILU if gated else act.RELU2_NO_MUL, device="cpu",
                routing_method=v.config.RoutingMethodType.Renormalize, moe_parallel_config=parallel,
                in_dtype=torch.bfloat16,
            )  # fmt: skip
    except AssertionError as exc:
        raise ShardRefused(f"vLLM FusedMoEConfig: intermediate size {size} at TP={tp}: assertion {exc}") from exc


def experts_layer(cls: type, config, quant_config, method) -> torch.nn.Module:
    """A ``RoutedExperts`` (or subclass) of ``config`` without its constructor: the attributes
    ``weight_loader`` reads, an identity expert map (no EP)."""
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.moe_config, layer.quant_config, layer.quant_method = config, quant_config, method
    layer._fused_shared_expert_quantizer = None
    layer._loaded_expert_biases = set()
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: e)
    return layer


def create_weights(
    v: types.SimpleNamespace, layer: torch.nn.Module, method, experts: int, hidden: int, size: int
) -> None:
    """``method.create_weights`` on ``layer`` as ``RoutedExperts.__init__`` calls it; ``torch.empty``
    parameters filled with :data:`NAN_BYTE`; ``vllm.model_executor.parameter``'s TP-group queries
    answer the layer's rank (the parameters record them; the loader reads the layer's config)."""
    par = layer.moe_config.moe_parallel_config
    with (
        mock.patch.object(torch, "empty", functools.partial(_filled, torch.empty)),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_rank", lambda: par.tp_rank),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_world_size", lambda: par.tp_size),
    ):
        method.create_weights(
            layer=layer, num_experts=experts, hidden_size=hidden, unpadded_hidden_size=hidden,
            intermediate_size_per_partition=size, params_dtype=torch.bfloat16, weight_loader=layer.weight_loader,
            global_num_experts=experts,
        )  # fmt: skip


def _filled(empty: Callable[..., torch.Tensor], *args, **kwargs) -> torch.Tensor:
    t = empty(*args, **kwargs)
    return t.view(torch.uint8).fill_(NAN_BYTE).view(t.dtype) if t.element_size() == 1 else t.fill_(float("nan"))


# --- per-projection checkpoints: ModelOpt NVFP4, Quark OCP-MX MXFP4 ----------------------------------


def _method(v: types.SimpleNamespace, block: int, config, has_bias: bool):
    """The quant config and method of a per-projection checkpoint, built without the method's
    constructor (it selects a GPU kernel backend): the attributes ``create_weights`` reads."""
    if block == NVFP4_BLOCK:
        quant_config = v.modelopt.ModelOptNvFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=block)
        method = object.__new__(v.modelopt.ModelOptNvFp4FusedMoE)
        method.quant_config, method.use_global_sf = quant_config, False
    else:
        quant_config = types.SimpleNamespace(get_name=lambda: "quark")
        method = object.__new__(v.quark_moe.QuarkOCP_MX_MoEMethod)
        method.weight_dtype, method.has_bias, method.static_input_scales = "mxfp4", has_bias, False
    method.moe = config
    return quant_config, method


def load_projections(v: types.SimpleNamespace, ckpt: MoeWeights, gated: bool, tp: int, rank: int) -> MoeWeights:
    """Rank ``rank``'s experts after ``RoutedExperts.weight_loader`` read every expert's projections
    (``w1`` gate, ``w3`` up, ``w2`` down; weights, block scales, biases) of the whole checkpoint.
    Returned with FC1 rows in the checkpoint's layout."""
    e, h, size = ckpt.w13.shape[0], ckpt.hidden_size, ckpt.intermediate_size
    config = moe_config(v, e, h, size, gated, tp, rank)
    has_bias = ckpt.w13_bias is not None and ckpt.block != NVFP4_BLOCK
    quant_config, method = _method(v, ckpt.block, config, has_bias)
    layer = experts_layer(v.routed.RoutedExperts, config, quant_config, method)
    create_weights(v, layer, method, e, h, config.intermediate_size_per_partition)
    scale_dtype = torch.float8_e4m3fn if ckpt.block == NVFP4_BLOCK else torch.uint8
    fc1 = {
        "weight": split_fc1(ckpt.w13, ckpt.fc1_layout) if gated else (ckpt.w13,),
        "weight_scale": split_fc1(ckpt.w13_scale, ckpt.fc1_layout) if gated else (ckpt.w13_scale,),
    }
    if has_bias:
        fc1["bias"] = split_fc1(ckpt.w13_bias, ckpt.fc1_layout, -1) if gated else (ckpt.w13_bias,)
    fc2 = {"weight": ckpt.w2, "weight_scale": ckpt.w2_scale, "bias": ckpt.w2_bias if has_bias else None}
    for x in range(e):
        for suffix, halves in fc1.items():
            for shard, half in zip(("w1", "w3")[: len(halves)], halves, strict=True):
                t = half[x].view(scale_dtype) if suffix == "weight_scale" else half[x]
                layer.weight_loader(getattr(layer, f"w13_{suffix}"), t, f"{PREFIX}.w13_{suffix}", shard, x)
        for suffix, t in fc2.items():
            if t is not None:
                t = t[x].view(scale_dtype) if suffix == "weight_scale" else t[x]
                layer.weight_loader(getattr(layer, f"w2_{suffix}"), t, f"{PREFIX}.w2_{suffix}", "w2", x)

    def fc1_rows(t: torch.Tensor, dim: int = -2) -> torch.Tensor:
        return relayout_fc1(t, Fc1Layout.GATE_UP, ckpt.fc1_layout, dim) if gated else t

    return MoeWeights(
        w13=fc1_rows(layer.w13_weight.detach()), w13_scale=fc1_rows(layer.w13_weight_scale.detach().view(torch.uint8)),
        w2=layer.w2_weight.detach(), w2_scale=layer.w2_weight_scale.detach().view(torch.uint8), block=ckpt.block,
        fc1_layout=ckpt.fc1_layout,
        w13_bias=fc1_rows(layer.w13_bias.detach().float(), -1) if has_bias else None,
        w2_bias=layer.w2_bias.detach().float() if has_bias else None,
    )  # fmt: skip


# --- gpt-oss: GptOssModel._load_weights_mxfp4 ----------------------------------------------------------

GPT_OSS_BACKEND = "FLASHINFER_TRTLLM_MXFP4_BF16"
"""The ``Mxfp4MoeBackend`` whose intermediate rounding sizes the gpt-oss buffers (B200's, ``ru(I/tp, 128)``)."""


@contextlib.contextmanager
def _tp_group(v: types.SimpleNamespace, tp: int, rank: int) -> Iterator[None]:
    """``gpt_oss``'s distributed queries (and ``FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp``'s
    rank query) answering for rank ``rank`` of a plain TP group of ``tp``."""
    group = types.SimpleNamespace(world_size=1, rank_in_group=0)
    m = v.gpt_oss
    with (
        mock.patch.object(m, "get_tensor_model_parallel_world_size", lambda: tp),
        mock.patch.object(m, "get_tensor_model_parallel_rank", lambda: rank),
        mock.patch.object(m, "get_dp_group", lambda: group),
        mock.patch.object(m, "get_pcp_group", lambda: group),
        mock.patch.object(v.config, "get_tensor_model_parallel_rank", lambda: rank),
        mock.patch.object(m, "is_pp_missing_parameter", lambda name, model: False),
    ):
        yield


def load_gpt_oss(v: types.SimpleNamespace, ckpt: MoeWeights, tp: int, rank: int) -> MoeWeights:
    """Rank ``rank``'s experts after ``GptOssModel._load_weights_mxfp4`` read the whole fused, row-interleaved
    checkpoint (``w13_weight``, ``w13_weight_scale``, ``w2_weight``, ``w2_weight_scale``, biases)."""
    e, h, size = ckpt.w13.shape[0], ckpt.hidden_size, ckpt.intermediate_size
    config = moe_config(v, e, h, size, True, tp, rank)
    config.has_bias = ckpt.w13_bias is not None
    backend = v.mxfp4_oracle.Mxfp4MoeBackend[GPT_OSS_BACKEND]
    _, buffer = v.mxfp4_oracle.mxfp4_round_up_hidden_size_and_intermediate_size(
        backend, h, config.intermediate_size_per_partition
    )
    method = object.__new__(v.mxfp4.GptOssMxfp4MoEMethod)
    method.moe, method.weight_dtype, method.mxfp4_backend = config, "gpt_oss_mxfp4", backend
    quant_config = object.__new__(v.mxfp4.GptOssMxfp4Config)
    layer = experts_layer(v.gpt_oss.GptOssRoutedExperts, config, quant_config, method)
    create_weights(v, layer, method, e, h, buffer)
    params = {f"{PREFIX}.{name}": p for name, p in layer.named_parameters()}
    model = types.SimpleNamespace(
        named_parameters=lambda: iter(params.items()),
        parallel_config=types.SimpleNamespace(enable_expert_parallel=False),
        config=types.SimpleNamespace(num_local_experts=e, intermediate_size=size),
        _try_load_streamed_expert=v.gpt_oss.GptOssModel._try_load_streamed_expert,
    )
    tensors = {"w13_weight": ckpt.w13, "w13_weight_scale": ckpt.w13_scale, "w2_weight": ckpt.w2,
               "w2_weight_scale": ckpt.w2_scale, "w13_bias": ckpt.w13_bias, "w2_bias": ckpt.w2_bias}  # fmt: skip
    weights = [(f"{PREFIX}.{n}", t.clone()) for n, t in tensors.items() if t is not None]
    with _tp_group(v, tp, rank):
        v.gpt_oss.GptOssModel._load_weights_mxfp4(model, e, 0, iter(weights), [])
    bias = ckpt.w13_bias is not None
    return MoeWeights(
        w13=layer.w13_weight.detach(), w13_scale=layer.w13_weight_scale.detach(), w2=layer.w2_weight.detach(),
        w2_scale=layer.w2_weight_scale.detach(), block=ckpt.block, fc1_layout=ckpt.fc1_layout,
        w13_bias=layer.w13_bias.detach().float() if bias else None,
        w2_bias=layer.w2_bias.detach().float() if bias else None,
    )  # fmt: skip


# --- the policy ----------------------------------------------------------------------------------------


def gpt_oss_form(gated: bool, block: int, layout: Fc1Layout) -> bool:
    """Whether a checkpoint is gpt-oss's form (gated MXFP4, fused row-interleaved FC1): loaded by
    ``GptOssModel._load_weights_mxfp4``; every other form by the per-projection ``RoutedExperts`` path."""
    return gated and block != NVFP4_BLOCK and layout.interleaved


def cuts_groups_per_projection(config) -> bool:
    """A plain-TP ``ShardingConfig`` (the adapter drives no EP) the per-projection path loads whose even
    split ``I / tp`` (which vLLM's ``FusedMoEConfig`` accepts: ``I % tp == 0``) is not a whole number of groups."""
    part, rem = divmod(config.intermediate, config.tp)
    per_projection = not gpt_oss_form(config.gated, config.block, config.layout)
    return config.ep_size == 1 and per_projection and rem == 0 and part % config.block != 0


class VllmMoeSharding(LoaderSharding):
    """vLLM 0.33.0's loaders (module docstring): gpt-oss's for row-interleaved MXFP4 checkpoints, the
    per-expert ``RoutedExperts.weight_loader`` (ModelOpt NVFP4, Quark OCP-MX MXFP4) for the rest; the
    ranks' channels are read back (:class:`~subjects.moe_sharding.LoaderSharding`)."""

    def load_rank(
        self, ckpt: MoeWeights, gated: bool, tp: int, rank: int, *, ep: int, ep_rank: int, backend
    ) -> MoeWeights:
        """Plain TP groups only (``ep > 1`` is not driven: :class:`~contracts.errors.UnsupportedConfig`);
        ``backend`` is not read: gpt-oss buffers are :data:`GPT_OSS_BACKEND`'s."""
        if ep != 1:
            raise UnsupportedConfig(f"the vLLM sharding adapter drives plain TP groups only, not EP={ep}")
        v = sharding_modules()
        if gpt_oss_form(gated, ckpt.block, ckpt.fc1_layout):
            return load_gpt_oss(v, ckpt, tp, rank)
        if ckpt.w13_bias is not None:
            raise UnsupportedConfig(
                "per-projection MXFP4 experts with biases (Quark gpt-oss) load through GptOssModel._load_weights_quark, "
                "which this adapter does not drive"
            )
        return load_projections(v, ckpt, gated, tp, rank)
