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
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import torch

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import CheckpointNotServed, UnsupportedConfig
from contracts.moe import MoeWeights, cut_hidden, tiled
from contracts.moe_sharding import ShardRefused
from reference.formats import NVFP4_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1, split_fc1
from subjects.moe_sharding import NAN_BYTE, LoaderSharding
from subjects.vllm.bridge import MXFP4_BACKENDS, NVFP4_BACKENDS, not_mapped, sharding_modules
from subjects.vllm.mxfp4_moe import ROCM_BACKENDS, rocm_platform

PREFIX = "layers.0.mlp.experts"


EP_PLACEMENTS = ("linear", "round_robin")
"""vLLM's ``--expert-placement-strategy`` values (``determine_expert_map``)."""


def parallel_config(v: types.SimpleNamespace, tp: int, rank: int, ep: int = 1):
    """vLLM's ``FusedMoEParallelConfig`` of rank ``rank`` of a ``tp`` x ``ep`` grid, from vLLM's own
    ``FusedMoEParallelConfig.make`` for ``tp·ep`` tensor-parallel ranks (no DP, PCP, SP) with
    ``enable_expert_parallel = ep > 1``: MoE TP ``tp``, or under EP, TP 1 and EP over every rank. vLLM has no
    MoE tensor parallelism inside an EP group, so ``tp > 1`` with ``ep > 1`` is not a vLLM configuration
    (:class:`~contracts.errors.UnsupportedConfig`)."""
    if tp > 1 and ep > 1:
        raise UnsupportedConfig(
            f"vLLM 0.33.0 has no MoE TP={tp} inside EP={ep}: FusedMoEParallelConfig.make gives MoE layers TP=1 "
            "and EP over all ranks when enable_expert_parallel is set"
        )
    flags = types.SimpleNamespace(
        enable_expert_parallel=ep > 1, all2all_backend="allgather_reducescatter", enable_eplb=False
    )
    with mock.patch.object(v.config, "get_tensor_model_parallel_rank", lambda: rank):
        return v.config.FusedMoEParallelConfig.make(
            tp_size_=tp * ep, pcp_size_=1, dp_size_=1, sp_size_=1, vllm_parallel_config=flags
        )


def expert_map(v: types.SimpleNamespace, parallel, experts: int, placement: str):
    """vLLM's ``ExpertMapManager`` of a layer of ``experts`` routed experts (``determine_expert_map`` under the
    ``placement`` strategy; round-robin needs grouped routing, ``num_expert_group > 1``, which it is given)."""
    return v.expert_map.ExpertMapManager(
        max_num_batched_tokens=1, top_k=1, global_num_experts=experts, num_redundant_experts=0,
        num_expert_group=2 if placement == "round_robin" else None, moe_parallel_config=parallel,
        placement_strategy=placement, enable_eplb=False,
    )  # fmt: skip


def moe_config(v: types.SimpleNamespace, experts: int, local: int, hidden: int, size: int, gated: bool, parallel):
    """vLLM's ``FusedMoEConfig`` of a rank of ``parallel`` holding ``local`` of ``experts`` experts;
    ``ShardRefused`` where its ``__post_init__`` asserts ``I % tp == 0``. Non-gated layers need a CUDA-like
    platform there, which the patched ``current_platform`` reports."""
    act = v.activation.MoEActivation
    platform = types.SimpleNamespace(is_cuda_alike=lambda: True, is_xpu=lambda: False)
    try:
        with mock.patch.object(v.config, "current_platform", platform):
            return v.config.FusedMoEConfig(
                num_experts=experts, experts_per_token=1, hidden_dim=hidden, intermediate_size=size,
                num_local_experts=local, num_logical_experts=experts,
                activation=act.SILU if gated else act.RELU2_NO_MUL, device="cpu",
                routing_method=v.config.RoutingMethodType.Renormalize, moe_parallel_config=parallel,
                in_dtype=torch.bfloat16,
            )  # fmt: skip
    except AssertionError as exc:
        raise ShardRefused(
            f"vLLM FusedMoEConfig: intermediate size {size} at TP={parallel.tp_size}: assertion {exc}"
        ) from exc


def experts_layer(cls: type, config, quant_config, method, experts) -> torch.nn.Module:
    """A ``RoutedExperts`` (or subclass) of ``config`` without its constructor: the attributes
    ``weight_loader`` reads and the ``experts`` map manager (:func:`expert_map`)."""
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.moe_config, layer.quant_config, layer.quant_method = config, quant_config, method
    layer._fused_shared_expert_quantizer = None
    layer._loaded_expert_biases = set()
    layer.expert_map_manager = experts
    return layer


def rank_layer(
    v: types.SimpleNamespace, cls: type, quant_config, method, ckpt: MoeWeights, gated: bool, grid: RankGrid
) -> torch.nn.Module:
    """Rank ``grid.rank``'s ``RoutedExperts`` (``cls``) of ``ckpt``'s global layer, its parameters allocated as
    ``RoutedExperts.__init__`` does: vLLM's parallel config (:func:`parallel_config`) and expert map
    (:func:`expert_map`), the method's ``maybe_roundup_sizes`` (the backend's rounding), then its
    ``create_weights`` for the rank's local experts; ``torch.empty`` parameters filled with :data:`NAN_BYTE`;
    ``vllm.model_executor.parameter``'s TP-group queries answer the layer's rank."""
    e, h, size = ckpt.w13.shape[0], ckpt.hidden_size, ckpt.intermediate_size
    parallel = parallel_config(v, grid.tp, grid.rank, grid.ep)
    experts = expert_map(v, parallel, e, grid.placement)
    config = moe_config(v, e, experts.local_num_experts, h, size, gated, parallel)
    config.has_bias = ckpt.w13_bias is not None
    method.moe = config
    layer = experts_layer(cls, config, quant_config, method, experts)
    with grid.platform():
        hidden, ip = method.maybe_roundup_sizes(h, config.intermediate_size_per_partition, config.in_dtype, parallel)
    with (
        mock.patch.object(torch, "empty", functools.partial(_filled, torch.empty)),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_rank", lambda: parallel.tp_rank),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_world_size", lambda: parallel.tp_size),
    ):
        method.create_weights(
            layer=layer, num_experts=experts.local_num_experts, hidden_size=hidden, unpadded_hidden_size=h,
            intermediate_size_per_partition=ip, params_dtype=torch.bfloat16, weight_loader=layer.weight_loader,
            global_num_experts=e,
        )  # fmt: skip
    return layer


def _filled(empty: Callable[..., torch.Tensor], *args, **kwargs) -> torch.Tensor:
    t = empty(*args, **kwargs)
    return t.view(torch.uint8).fill_(NAN_BYTE).view(t.dtype) if t.element_size() == 1 else t.fill_(float("nan"))


@dataclass(frozen=True)
class RankGrid:
    """Rank ``rank`` (``e·tp + t``) of a ``tp`` x ``ep`` grid, experts placed by ``placement``, MXFP4 buffers
    rounded for vLLM's ``Mxfp4MoeBackend`` member ``mxfp4_backend`` (None: no MXFP4 rounding)."""

    tp: int
    rank: int
    ep: int = 1
    placement: str = "linear"
    mxfp4_backend: Mxfp4MoeBackend | None = None

    def member(self, v: types.SimpleNamespace):
        """vLLM's ``Mxfp4MoeBackend`` member (:data:`subjects.vllm.bridge.MXFP4_BACKENDS`)."""
        return (
            None if self.mxfp4_backend is None else v.mxfp4_oracle.Mxfp4MoeBackend[MXFP4_BACKENDS[self.mxfp4_backend]]
        )

    def platform(self) -> contextlib.AbstractContextManager:
        """The platform vLLM rounds ``mxfp4_backend`` under (a ROCm CDNA4 one for the AITER backends)."""
        if self.mxfp4_backend in ROCM_BACKENDS:
            return rocm_platform(sharding_modules())
        return contextlib.nullcontext()


# --- per-projection checkpoints: ModelOpt NVFP4, Quark OCP-MX MXFP4 ----------------------------------


def _method(v: types.SimpleNamespace, block: int, grid: RankGrid):
    """The quant config and method of a per-projection checkpoint, built without the method's
    constructor (it selects a GPU kernel backend): the attributes ``maybe_roundup_sizes`` and
    ``create_weights`` read (Quark's ``mxfp4_backend``: ``grid``'s)."""
    if block == NVFP4_BLOCK:
        quant_config = v.modelopt.ModelOptNvFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=block)
        method = object.__new__(v.modelopt.ModelOptNvFp4FusedMoE)
        method.quant_config, method.use_global_sf = quant_config, False
    else:
        quant_config = types.SimpleNamespace(get_name=lambda: "quark")
        method = object.__new__(v.quark_moe.QuarkOCP_MX_MoEMethod)
        method.weight_dtype, method.has_bias, method.static_input_scales = "mxfp4", False, False
        method.mxfp4_backend = grid.member(v)
    return quant_config, method


def load_projections(v: types.SimpleNamespace, ckpt: MoeWeights, gated: bool, grid: RankGrid) -> MoeWeights:
    """Rank ``grid.rank``'s experts after ``RoutedExperts.weight_loader`` read every expert's projections
    (``w1`` gate, ``w3`` up, ``w2`` down; weights and block scales) of the whole checkpoint: the loader maps
    each global expert id to the rank's own (``_map_global_expert_id_to_local_expert_id``, the expert map)
    and narrows the rank's channels. Returned with FC1 rows in the checkpoint's layout, the hidden size cut
    back to the checkpoint's. Expert biases: :class:`~contracts.errors.UnsupportedConfig` (vLLM 0.33.0 loads
    them for gpt-oss only, whose ``_load_weights_*`` zero ``w2_bias`` on TP ranks other than 0 first)."""
    if ckpt.w13_bias is not None:
        raise UnsupportedConfig(
            "per-projection MXFP4 experts with biases (Quark gpt-oss) load through GptOssModel._load_weights_quark, "
            "which this adapter does not drive"
        )
    quant_config, method = _method(v, ckpt.block, grid)
    layer = rank_layer(v, v.routed.RoutedExperts, quant_config, method, ckpt, gated, grid)
    scale_dtype = torch.float8_e4m3fn if ckpt.block == NVFP4_BLOCK else torch.uint8
    # each projection contiguous, as a checkpoint's tensors are (split_fc1 of an interleaved layout gives views)
    fc1 = {
        name: tuple(h.contiguous() for h in split_fc1(t, ckpt.fc1_layout)) if gated else (t,)
        for name, t in (("w13_weight", ckpt.w13), ("w13_weight_scale", ckpt.w13_scale))
    }
    for x in range(ckpt.w13.shape[0]):
        for name, halves in fc1.items():
            for shard, half in zip(("w1", "w3")[: len(halves)], halves, strict=True):
                t = half[x].view(scale_dtype) if name.endswith("scale") else half[x]
                layer.weight_loader(getattr(layer, name), t, f"{PREFIX}.{name}", shard, x)
        layer.weight_loader(layer.w2_weight, ckpt.w2[x], f"{PREFIX}.w2_weight", "w2", x)
        scale = ckpt.w2_scale[x].view(scale_dtype)
        layer.weight_loader(layer.w2_weight_scale, scale, f"{PREFIX}.w2_weight_scale", "w2", x)

    def fc1_rows(t: torch.Tensor) -> torch.Tensor:
        return relayout_fc1(t, Fc1Layout.GATE_UP, ckpt.fc1_layout) if gated else t

    loaded = MoeWeights(
        w13=fc1_rows(layer.w13_weight.detach()), w13_scale=fc1_rows(layer.w13_weight_scale.detach().view(torch.uint8)),
        w2=layer.w2_weight.detach(), w2_scale=layer.w2_weight_scale.detach().view(torch.uint8), block=ckpt.block,
        fc1_layout=ckpt.fc1_layout,
    )  # fmt: skip
    return cut_hidden(loaded, ckpt.hidden_size)


# --- gpt-oss: GptOssModel._load_weights_mxfp4 ----------------------------------------------------------


@contextlib.contextmanager
def _rank_groups(v: types.SimpleNamespace, grid: RankGrid) -> Iterator[None]:
    """``gpt_oss``'s distributed queries answering for rank ``grid.rank`` of ``tp·ep`` tensor-parallel
    ranks (vLLM's EP group is then all of them, ``FusedMoEParallelConfig.make``), no DP, PCP or PP."""
    group = types.SimpleNamespace(world_size=1, rank_in_group=0)
    ep_group = types.SimpleNamespace(world_size=grid.ep, rank_in_group=grid.rank if grid.ep > 1 else 0)
    m = v.gpt_oss
    with (
        mock.patch.object(m, "get_tensor_model_parallel_world_size", lambda: grid.tp * grid.ep),
        mock.patch.object(m, "get_tensor_model_parallel_rank", lambda: grid.rank),
        mock.patch.object(m, "get_dp_group", lambda: group),
        mock.patch.object(m, "get_pcp_group", lambda: group),
        mock.patch.object(m, "get_ep_group", lambda: ep_group),
        mock.patch.object(v.config, "get_tensor_model_parallel_rank", lambda: grid.rank),
        mock.patch.object(m, "is_pp_missing_parameter", lambda name, model: False),
    ):
        yield


def load_gpt_oss(v: types.SimpleNamespace, ckpt: MoeWeights, grid: RankGrid) -> MoeWeights:
    """Rank ``grid.rank``'s experts after ``GptOssModel.load_weights`` read the whole fused, row-interleaved
    checkpoint (``w13_weight``, ``w13_weight_scale``, ``w2_weight``, ``w2_weight_scale``, biases) of an
    ``mxfp4`` model: it computes the rank's expert range from the EP group (``num_experts // ep_size``
    experts from ``ep_rank·(num_experts // ep_size)``) and hands it to ``_load_weights_mxfp4``, which
    slices whole experts under EP and whole 32-blocks of channels under TP."""
    e, size = ckpt.w13.shape[0], ckpt.intermediate_size
    method = object.__new__(v.mxfp4.GptOssMxfp4MoEMethod)
    method.weight_dtype, method.mxfp4_backend = "gpt_oss_mxfp4", grid.member(v)
    quant_config = object.__new__(v.mxfp4.GptOssMxfp4Config)
    layer = rank_layer(v, v.gpt_oss.GptOssRoutedExperts, quant_config, method, ckpt, True, grid)
    params = {f"{PREFIX}.{name}": p for name, p in layer.named_parameters()}
    model = types.SimpleNamespace(
        named_parameters=lambda: iter(params.items()),
        parallel_config=types.SimpleNamespace(enable_expert_parallel=grid.ep > 1),
        config=types.SimpleNamespace(
            num_local_experts=e, intermediate_size=size, quantization_config={"quant_method": "mxfp4"}
        ),
        _try_load_streamed_expert=v.gpt_oss.GptOssModel._try_load_streamed_expert,
    )
    model._load_weights_mxfp4 = types.MethodType(v.gpt_oss.GptOssModel._load_weights_mxfp4, model)
    tensors = {"w13_weight": ckpt.w13, "w13_weight_scale": ckpt.w13_scale, "w2_weight": ckpt.w2,
               "w2_weight_scale": ckpt.w2_scale, "w13_bias": ckpt.w13_bias, "w2_bias": ckpt.w2_bias}  # fmt: skip
    weights = [(f"{PREFIX}.{n}", t.clone()) for n, t in tensors.items() if t is not None]
    with _rank_groups(v, grid):
        v.gpt_oss.GptOssModel.load_weights(model, iter(weights))
    bias = ckpt.w13_bias is not None
    loaded = MoeWeights(
        w13=layer.w13_weight.detach(), w13_scale=layer.w13_weight_scale.detach(), w2=layer.w2_weight.detach(),
        w2_scale=layer.w2_weight_scale.detach(), block=ckpt.block, fc1_layout=ckpt.fc1_layout,
        w13_bias=layer.w13_bias.detach().float() if bias else None,
        w2_bias=layer.w2_bias.detach().float() if bias else None,
    )  # fmt: skip
    return cut_hidden(loaded, ckpt.hidden_size)


# --- the policy ----------------------------------------------------------------------------------------


def gpt_oss_form(gated: bool, block: int, layout: Fc1Layout) -> bool:
    """Whether a checkpoint is gpt-oss's form (gated MXFP4, fused row-interleaved FC1): loaded by
    ``GptOssModel._load_weights_mxfp4``; every other form by the per-projection ``RoutedExperts`` path."""
    return gated and block != NVFP4_BLOCK and not tiled(block) and layout.interleaved


def cuts_groups_per_projection(config) -> bool:
    """A ``ShardingConfig`` the per-projection path loads (no expert biases; no EP, under which vLLM's MoE TP
    is 1; an MXFP4 backend vLLM selects for such experts) whose even split ``I / tp`` (which vLLM's
    ``FusedMoEConfig`` accepts: ``I % tp == 0``) is not a whole number of groups."""
    part, rem = divmod(config.intermediate, config.tp)
    per_projection = not gpt_oss_form(config.gated, config.block, config.layout) and not config.bias
    served = not tiled(config.block)  # no block-FP8 loader is adapted (FP8_NOT_ADAPTED)
    if not (served and per_projection and config.ep_size == 1 and rem == 0 and part % config.block != 0):
        return False
    backend = config.kernel_backend
    return config.block == NVFP4_BLOCK or backend is None or selected_for_mxfp4_experts(backend)


def selected_for_mxfp4_experts(backend: Mxfp4MoeBackend) -> bool:
    """Whether vLLM's ``select_mxfp4_moe_backend`` (gpt-oss and Quark OCP-MX experts) can pick ``backend``: its
    member is in ``_get_priority_backends_for_gpt_oss``."""
    v = sharding_modules()
    return RankGrid(1, 0, mxfp4_backend=backend).member(v) in v.mxfp4_oracle._get_priority_backends_for_gpt_oss()


def gpt_oss_uneven_experts(config) -> bool:
    """A gpt-oss ``ShardingConfig`` under EP whose expert count is not a multiple of the EP degree:
    ``GptOssModel.load_weights`` slices ``E // ep`` experts per rank, ``determine_expert_map`` gives the
    first ``E % ep`` ranks one more."""
    if not gpt_oss_form(config.gated, config.block, config.layout):
        return False
    served = config.kernel_backend is None or selected_for_mxfp4_experts(config.kernel_backend)
    return served and config.ep_size > 1 and config.tp == 1 and config.experts % config.ep_size != 0


GPT_OSS_BACKEND = Mxfp4MoeBackend.FLASHINFER_TRTLLM
"""The MXFP4 backend gpt-oss checkpoints load under when none is given (a B200's: ``ru(I/tp, 128)``)."""

QUARK_BACKEND = Mxfp4MoeBackend.AITER
"""The MXFP4 backend Quark OCP-MX checkpoints load under when none is given (an MI350x's W4A4: ``ru(I/tp, 128)``)."""


FP8_NOT_ADAPTED = (
    "this adapter loads FP4 checkpoints only: vLLM 0.33.0's block-FP8 MoE loader is driven for one rank by the "
    "fp8_moe adapter (subjects/vllm/fp8_moe.py), not for a TP x EP grid"
)
"""Why a block-FP8 checkpoint is not served here (recorded by the properties as not served, not judged)."""


class VllmMoeSharding(LoaderSharding):
    """vLLM 0.33.0's loaders (module docstring): gpt-oss's for row-interleaved MXFP4 checkpoints, the
    per-expert ``RoutedExperts.weight_loader`` (ModelOpt NVFP4, Quark OCP-MX MXFP4) for the rest, experts
    placed by ``placement`` under EP; the ranks' channels and experts are read back
    (:class:`~subjects.moe_sharding.LoaderSharding`)."""

    def __init__(self, placement: str = "linear") -> None:
        if placement not in EP_PLACEMENTS:
            raise ValueError(f"placement must be one of {EP_PLACEMENTS}, not {placement!r}")
        self.placement = placement

    def load_rank(
        self,
        ckpt: MoeWeights,
        gated: bool,
        tp: int,
        tp_rank: int,
        *,
        ep: int,
        ep_rank: int,
        backend: Nvfp4MoeBackend | Mxfp4MoeBackend | None,
    ) -> MoeWeights:
        """Rank ``(ep_rank, tp_rank)`` of a ``tp`` x ``ep`` layer: vLLM's rank ``ep_rank·tp + tp_rank`` of
        ``tp·ep`` ranks (:func:`parallel_config`), its buffers sized for ``backend`` (MXFP4:
        :data:`subjects.vllm.bridge.MXFP4_BACKENDS`; vLLM's NVFP4 loader allocates alike for every backend)."""
        if tiled(ckpt.block):
            raise CheckpointNotServed(FP8_NOT_ADAPTED)
        v = sharding_modules()
        nvfp4 = ckpt.block == NVFP4_BLOCK
        table = NVFP4_BACKENDS if nvfp4 else MXFP4_BACKENDS
        if backend is not None and backend not in table:
            raise UnsupportedConfig(not_mapped(backend))
        interleaved = gpt_oss_form(gated, ckpt.block, ckpt.fc1_layout)
        mxfp4 = None if nvfp4 else backend or (GPT_OSS_BACKEND if interleaved else QUARK_BACKEND)
        grid = RankGrid(tp, ep_rank * tp + tp_rank, ep, self.placement, mxfp4)
        if mxfp4 is not None and not selected_for_mxfp4_experts(mxfp4):
            raise UnsupportedConfig(
                f"vLLM 0.33.0's select_mxfp4_moe_backend never picks {grid.member(v).name} for gpt-oss or Quark "
                "OCP-MX experts (_get_priority_backends_for_gpt_oss)"
            )
        if interleaved:
            return load_gpt_oss(v, ckpt, grid)
        return load_projections(v, ckpt, gated, grid)
