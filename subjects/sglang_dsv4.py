"""Subject ``sglang-deepseek-v4``: SGLang 0.5.23's DeepSeek-V4 FP4 expert path, adapted to the suite's protocols.

SGLang loads DeepSeek-V4's MXFP4 routed experts (``quantization_config.quant_method = "fp8"``, FP4 experts
detected by ``ModelConfig.is_fp4_experts``) through ``Fp8Config``, whose ``get_quant_method`` picks, for a
``FusedMoE`` with ``is_fp4_experts`` set (``model_loader/loader.py`` sets it from the model config):

* ``--moe-runner-backend flashinfer_mxfp4`` on SM100: ``Mxfp4FlashinferTrtllmMoEMethod``
  (``quantization/mxfp4_flashinfer_trtllm_moe.py``);
* ``flashinfer_mxfp4`` on SM90 or SM120: ``Mxfp4FlashinferCutlassMoEMethod``
  (``quantization/mxfp4_flashinfer_cutlass_moe.py``; W4A16 on SM90 unless
  ``--flashinfer-mxfp4-moe-precision fp8``, MXFP8 x MXFP4 on SM120);
* ``marlin``: ``Mxfp4MarlinMoEMethod`` (``quantization/mxfp4_marlin_moe.py``).

Unlike ``Mxfp4MoEMethod`` (the ``sglang`` subject's MXFP4 families), these allocate the checkpoint's exact
per-rank sizes (``2·I/tp`` rows of ``H/2`` bytes; Marlin rounds only the hidden size, to 256) and pad, if at
all, in ``process_weights_after_loading``. Everything here is SGLang's: a real ``FusedMoE`` constructed under
SGLang's test hooks (:func:`subjects.sglang.sglang_layer_context`) with ``Fp8Config.from_config`` of
DeepSeek-V4's ``quantization_config`` (:data:`DSV4_QUANT_CONFIG`), the checkpoint's tensors under DeepSeek-V4's
names through ``DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format``,
``FusedMoE.make_expert_params_mapping`` and ``FusedMoE.weight_loader`` (:func:`load_dsv4_experts`), then the
method's ``process_weights_after_loading`` with the calls that need a GPU, or that the properties run
themselves, replaced by the stand-ins :data:`DSV4_BACKENDS` names.

Contracts: ``mxfp4_moe`` (:class:`SglangDsv4MoeAlignment`) and ``moe_sharding``
(:class:`SglangDsv4MoeSharding`). DeepSeek-V4's FP4 experts are gated SwiGLU, stacked per projection
(``w1`` gate, ``w3`` up, ``w2`` down), without biases: a checkpoint with expert biases is not one this path
serves (none of its methods allocates a bias), and raises :class:`~contracts.errors.CheckpointNotServed`.
Upstream bugs the properties meet are :data:`DSV4_KNOWN_FAILURES`.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from adapters import flashinfer as fi
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.errors import CheckpointNotServed, LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, cut_hidden, relayout_moe
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.moe_sharding import ShardRefused
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout, split_fc1
from subjects.moe_sharding import LoaderSharding
from subjects.registry import KnownFailure, Subject, register_subject
from subjects.sglang import (
    FUSED_MOE_LOADERS,
    SGLANG_SOURCE,
    SGLANG_VERSION,
    SglangSourceMismatch,
    _pass_through,
    import_required,
    sglang_layer_context,
    sglang_missing,
    sglang_modules,
    source_matches,
)
from subjects.sglang_sharding import uneven_split_refused

DSV4_REQUIRED_SYMBOLS = {
    "sglang.srt.layers.quantization.fp8": ("Fp8Config", "Fp8MoEMethod"),
    "sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe": (
        "Mxfp4FlashinferTrtllmMoEMethod",
        "_pad_intermediate_size",
        "_USE_OFFICIAL_SHUFFLE",
    ),
    "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe": (
        "Mxfp4FlashinferCutlassMoEMethod",
        "is_flashinfer_available",
    ),
    "sglang.srt.layers.quantization.mxfp4_marlin_moe": ("Mxfp4MarlinMoEMethod",),
    "sglang.srt.layers.quantization.marlin_utils_fp4": (
        "prepare_moe_mxfp4_layer_for_marlin",
        "marlin_make_workspace",
        "_repack_moe_fp4_weight_for_marlin",
        "_permute_moe_fp4_scales_for_marlin",
    ),
    "sglang.srt.models.deepseek_v4": ("DeepseekV4ForCausalLM",),
    "flashinfer.fused_moe": (
        "interleave_moe_weights_for_sm90_mixed_gemm",
        "interleave_moe_scales_for_sm90_mixed_gemm",
    ),
}
"""Every symbol the DeepSeek-V4 adapters call or patch, by module (besides :data:`subjects.sglang.REQUIRED_SYMBOLS`):
:func:`dsv4_modules` checks them all at import, so a moved or renamed one fails loudly, naming it."""

DSV4_ATTRIBUTES = (
    ("DeepseekV4ForCausalLM", "remap_weight_name_to_dpsk_hf_format"),
    ("FusedMoE", "make_expert_params_mapping"),
)
"""Class attributes the loader calls (:func:`load_dsv4_experts`), checked with the symbols."""


@functools.cache
def dsv4_modules() -> types.SimpleNamespace:
    """:func:`subjects.sglang.sglang_modules` plus the modules of :data:`DSV4_REQUIRED_SYMBOLS`, every symbol and
    :data:`DSV4_ATTRIBUTES` checked: :class:`SglangSourceMismatch` names each missing one."""
    m = sglang_modules()
    modules, missing = import_required(DSV4_REQUIRED_SYMBOLS, "SGLang's DeepSeek-V4 path")
    dsv4 = modules["sglang.srt.models.deepseek_v4"]
    owners = {"DeepseekV4ForCausalLM": getattr(dsv4, "DeepseekV4ForCausalLM", None), "FusedMoE": m.FusedMoE}
    missing += [f"{cls}.{attr}" for cls, attr in DSV4_ATTRIBUTES if not hasattr(owners[cls], attr)]
    source_matches(missing)
    return types.SimpleNamespace(
        **vars(m),
        fp8=modules["sglang.srt.layers.quantization.fp8"],
        dsv4_trtllm=modules["sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe"],
        dsv4_cutlass=modules["sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe"],
        dsv4_marlin=modules["sglang.srt.layers.quantization.mxfp4_marlin_moe"],
        dsv4=dsv4,
        fi_fused_moe=modules["flashinfer.fused_moe"],
    )


# --- the stand-ins for calls the properties run themselves or that need a GPU ------------------------


def _flashinfer_gated_reorder(_cache: dict, weight: torch.Tensor, *_: object, **__: object) -> torch.Tensor:
    """Stand-in for FlashInfer's ``_maybe_get_cached_w3_w1_permute_indices(cache, w, epilogue_tile_m,
    num_elts_per_sf=...)``, which chains FlashInfer's gated-activation row reorder
    (``get_reorder_rows_for_gated_act_gemm_row_indices``, ``[w3; w1]`` to ``(w3_j, w1_j)`` pairs) and its
    row shuffle for the kernel's 128-row tiles: the reorder alone, FlashInfer's own
    (:func:`adapters.flashinfer.gated_reorder`); the properties apply the shuffle themselves."""
    return fi.gated_reorder(weight.shape[0])


def _identity_rows(_cache: dict, weight: torch.Tensor, *_: object, **__: object) -> torch.Tensor:
    """Stand-in for ``get_w2_permute_indices_with_cache(cache, w, epilogue_tile_m, ...)`` (FC2's row shuffle
    only, applied by the properties): the rows in order."""
    return torch.arange(weight.shape[0])


def _no_workspace(*_: object, **__: object) -> torch.Tensor:
    """Stand-in for ``marlin_make_workspace`` (it reads the GPU's SM count)."""
    return torch.empty(0, dtype=torch.int)


@dataclass(frozen=True)
class SglangDsv4Backend:
    """How SGLang 0.5.23 runs one of the suite's MXFP4 MoE backends for DeepSeek-V4's FP4 experts.

    ``runner``: the ``--moe-runner-backend``; ``platform``: the platform facts (``override_platform``);
    ``method``: the class ``Fp8Config.get_quant_method`` must return there; ``switches``: module attributes
    SGLang reads at import from the machine or the environment, set as on that GPU with SGLang's defaults
    (``(module, name, value)``, modules in :func:`dsv4_modules`' namespace); ``device_calls``: the calls
    ``process_weights_after_loading`` makes that need a GPU or apply a layout the properties apply themselves,
    ``(module, name, stand_in)``; ``fc1_layout``: the FC1 row order of the buffers those calls get (read from
    the method's source); ``read``: how the prepared buffers are read back (:data:`READERS`).
    """

    runner: str
    platform: dict[str, bool]
    method: str
    switches: tuple[tuple[str, str, Any], ...]
    device_calls: tuple[tuple[str, str, Callable[..., Any]], ...]
    fc1_layout: Fc1Layout
    read: str


DSV4_BACKENDS: dict[Mxfp4MoeBackend, SglangDsv4Backend] = {
    # Mxfp4FlashinferTrtllmMoEMethod.process_weights_after_loading: _pad_intermediate_size (I to 128 per half,
    # scales filled with 1.0), reorder_w1w3_to_w3w1 ([up; gate]), scales cast to E8M0, then per expert
    # FlashInfer's w3/w1 permutation (gated reorder + row shuffle) and block_scale_interleave (CUDA), FC2's
    # row shuffle; SGLANG_MXFP4_USE_OFFICIAL_SHUFFLE defaults to true.
    Mxfp4MoeBackend.FLASHINFER_TRTLLM: SglangDsv4Backend(
        "flashinfer_mxfp4",
        {"is_sm100": True, "is_blackwell": True, "is_sm90": False, "is_sm120": False},
        "Mxfp4FlashinferTrtllmMoEMethod",
        (("dsv4_trtllm", "_USE_OFFICIAL_SHUFFLE", True),),
        (
            ("dsv4_trtllm", "_maybe_get_cached_w3_w1_permute_indices", _flashinfer_gated_reorder),
            ("dsv4_trtllm", "get_w2_permute_indices_with_cache", _identity_rows),
            ("dsv4_trtllm", "block_scale_interleave", _pass_through),
        ),
        Fc1Layout.UP_GATE_INTERLEAVED,
        "scale_inv",
    ),
    # Mxfp4FlashinferCutlassMoEMethod on SM90, W4A16 (the default --flashinfer-mxfp4-moe-precision): loads w13
    # as [up; gate] (load_up_proj_weight_first), no padding, then FlashInfer's SM90 mixed-GEMM weight and scale
    # interleaves (the weight one a CUDA op); its runner calls cutlass_fused_moe(use_w4_group_scaling=True)
    # (moe_runner/flashinfer_cutlass.py), the record's kernel.
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90: SglangDsv4Backend(
        "flashinfer_mxfp4",
        {"is_sm90": True, "is_sm100": False, "is_blackwell": False, "is_sm120": False},
        "Mxfp4FlashinferCutlassMoEMethod",
        (("dsv4_cutlass", "is_flashinfer_available", lambda: True),),
        (
            ("fi_fused_moe", "interleave_moe_weights_for_sm90_mixed_gemm", _pass_through),
            ("fi_fused_moe", "interleave_moe_scales_for_sm90_mixed_gemm", _pass_through),
        ),
        Fc1Layout.UP_GATE,
        "scale_inv",
    ),
    # Mxfp4MarlinMoEMethod on SM90: create_weights keeps I/tp and rounds H to 256; prepare_moe_mxfp4_layer_for_marlin
    # pads each [w1; w3] half to ru(I, 64) (128 where H % 128 != 0) and FC2's K alike, scales as bf16 2^e, then
    # gptq_marlin_repack and marlin_permute_scales per expert (CUDA).
    Mxfp4MoeBackend.MARLIN: SglangDsv4Backend(
        "marlin",
        {"is_sm90": True, "is_sm100": False, "is_blackwell": False, "is_sm120": False},
        "Mxfp4MarlinMoEMethod",
        (),
        (
            ("marlin_fp4", "marlin_make_workspace", _no_workspace),
            ("marlin_fp4", "_repack_moe_fp4_weight_for_marlin", _pass_through),
            ("marlin_fp4", "_permute_moe_fp4_scales_for_marlin", _pass_through),
        ),
        Fc1Layout.GATE_UP,
        "marlin_scale",
    ),
}
"""The suite's MXFP4 MoE backends as SGLang prepares DeepSeek-V4's FP4 experts for them. Not mapped (skip with
a reason): AITER (DeepSeek-V4 on ROCm goes through ``Fp8MoEMethod``'s own FlyDSL arm, 128-aligned, not these
methods), the SM120 CUTLASS MXFP8 x MXFP4 and SM90 Humming W4A8 variants (no suite record) and the backends SGLang
has no DeepSeek-V4 method for."""

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
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`subjects.sglang.parallel_layout`) of a DeepSeek-V4 MXFP4 MoE
    layer after SGLang's loader has read the whole
    ``checkpoint`` (:func:`load_dsv4_experts`), before post-load processing, under ``backend``'s selection
    (:data:`DSV4_BACKENDS`): a real ``FusedMoE`` whose ``Fp8Config`` (:data:`DSV4_QUANT_CONFIG`, with
    ``is_fp4_experts`` and ``is_dsv4_fp4_experts`` set as ``model_loader/loader.py`` sets them) picks the method.
    Raises :class:`~contracts.errors.CheckpointNotServed` for a checkpoint with expert biases."""
    if backend not in DSV4_BACKENDS:
        raise LibraryUnavailable(
            f"SGLang has no DeepSeek-V4 FP4 expert method mapped to MXFP4 MoE backend {backend.value} (DSV4_BACKENDS)"
        )
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


DSV4_SHARDING_BACKEND = Mxfp4MoeBackend.FLASHINFER_TRTLLM
"""The backend whose ``FusedMoE`` loads shards for ``moe_sharding`` (every DeepSeek-V4 method narrows ``I/tp``
channels per tensor through the same ``FusedMoE._load_w13`` / ``_load_w2``)."""


class SglangDsv4MoeSharding(LoaderSharding):
    """SGLang 0.5.23's ``FusedMoE.weight_loader`` for every rank of a DeepSeek-V4 FP4 expert layer
    (:func:`load_dsv4_rank`) under the kernel backend asked for (``None``: :data:`DSV4_SHARDING_BACKEND`).
    Rank ``(ep_rank, tp_rank)`` is SGLang's rank ``ep_rank·tp + tp_rank`` of ``tp·ep``. ``FusedMoE.__init__``'s
    ``I % tp == 0`` and ``E % ep == 0`` assertions and ``Mxfp4FlashinferCutlassMoEMethod.create_weights``'
    128-alignment ``ValueError`` are reported as :class:`~contracts.moe_sharding.ShardRefused`. Not served
    (:class:`~contracts.errors.CheckpointNotServed`): what no DeepSeek-V4 checkpoint or method has (non-gated or
    NVFP4 experts, expert biases, a backend outside :data:`DSV4_BACKENDS`)."""

    def load_rank(
        self, ckpt: MoeWeights, gated: bool, tp: int, tp_rank: int, *, ep: int, ep_rank: int, backend
    ) -> MoeWeights:
        if not gated or ckpt.block != MXFP4_BLOCK:
            raise CheckpointNotServed("DeepSeek-V4's FP4 experts are gated MXFP4 (32-element groups)")
        backend = DSV4_SHARDING_BACKEND if backend is None else backend
        if backend not in DSV4_BACKENDS:
            raise CheckpointNotServed(f"SGLang has no DeepSeek-V4 FP4 expert method for {backend.value}")
        experts = ckpt.w13.shape[0]
        with uneven_split_refused(ckpt.intermediate_size, tp, experts, ep), cutlass_refusal():
            loaded = load_dsv4_rank(backend, ckpt, tp, ep_rank * tp + tp_rank, ep)
        return relayout_moe(loaded, ckpt.fc1_layout)


CUTLASS_REFUSAL = "Mxfp4FlashinferCutlassMoEMethod requires hidden_size and intermediate_size_per_partition"
"""The start of ``Mxfp4FlashinferCutlassMoEMethod.create_weights``' ``ValueError`` for shards not 128-aligned."""


@contextlib.contextmanager
def cutlass_refusal() -> Iterator[None]:
    """``Mxfp4FlashinferCutlassMoEMethod.create_weights``' refusal, raised inside, as
    :class:`~contracts.moe_sharding.ShardRefused` with SGLang's message (any other ``ValueError`` propagates)."""
    try:
        yield
    except ValueError as exc:
        if CUTLASS_REFUSAL in str(exc):
            raise ShardRefused(str(exc)) from exc
        raise


# --- known upstream bugs -----------------------------------------------------------------------------


def _hidden_not(multiple: int) -> Callable[[Any], bool]:
    """A layer whose hidden size is not a multiple of ``multiple``."""
    return lambda config: config.shape.hidden % multiple != 0


def _not_128_aligned(config: Any) -> bool:
    """A rank whose intermediate or hidden size is not a multiple of 128 (DeepSeek-V4 at TP16: 3072/16 = 192;
    DeepSeek-V4.1-Flash at TP4 / TP8: 576, 288)."""
    return config.shape.intermediate % 128 != 0 or config.shape.hidden % 128 != 0


TRTLLM_HIDDEN_UNPADDED = (
    "Mxfp4FlashinferTrtllmMoEMethod (DeepSeek-V4 FP4 experts on SM100) pads only the intermediate size "
    "(_pad_intermediate_size, to 128) and never the hidden size (Fp8Config is not 'mxfp4', so FusedMoE.__init__ "
    "does not round it either), so H % 256 != 0 reaches trtllm-gen with MXFP8 activations (FlashInfer 0.7.4: "
    "'must be a multiple of 256 for MxFP8') and H % 128 != 0 its FC2 row shuffle; DeepSeek-V4 (7168, 4096) and "
    "V4.1-Flash (5120) are multiples of 256, any other Fp8Config FP4-expert model is not guarded; found by this "
    "suite, not reported upstream"
)

DSV4_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MXFP4_MOE,
        "Mxfp4FlashinferCutlassMoEMethod.create_weights refuses (ValueError) every rank whose I/tp or H is not a "
        "multiple of 128 instead of padding it after loading: DeepSeek-V4-Pro at TP16 (192), DeepSeek-V4.1-Flash "
        "at TP4 / TP8 (576, 288) cannot use --moe-runner-backend flashinfer_mxfp4 on SM90 (Marlin pads the same "
        "shapes to 64); reported as a feature request, closed inactive",
        "https://github.com/sgl-project/sglang/issues/26250",
        applies=_not_128_aligned,
        raises=ValueError,
        match=r"Mxfp4FlashinferCutlassMoEMethod requires hidden_size and intermediate_size_per_partition to be "
        r"multiples of 128",
        backend=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90.value,
    ),
    KnownFailure(
        MXFP4_MOE,
        "Mxfp4MarlinMoEMethod.create_weights rounds the buffer's hidden size to 256, but FusedMoE._load_w13 / "
        "_load_w2 copy each expert's full checkpoint width into it, so H % 256 != 0 fails at load (the same crash "
        "as Mxfp4MoEMethod's stacked loader in the sglang subject); DeepSeek-V4's hidden sizes are multiples of "
        "256; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_marlin_moe.py",
        applies=_hidden_not(256),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
        backend=Mxfp4MoeBackend.MARLIN.value,
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            TRTLLM_HIDDEN_UNPADDED,
            f"{SGLANG_SOURCE}/layers/quantization/mxfp4_flashinfer_trtllm_moe.py",
            applies=_hidden_not(256),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM.value,
            check=check,
        )
        for check, match in (
            ("check_backend_accepts", r"rejects Ip=\d+, Hp=\d+:.*hidden size \d+ is not a multiple of 256"),
            ("check_trtllm_matches_flashinfer_padding", r"FlashInfer pads \(I, H\) = \(\d+, \d+\) to"),
        )
    ),
    KnownFailure(
        MXFP4_MOE,
        TRTLLM_HIDDEN_UNPADDED,
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_flashinfer_trtllm_moe.py",
        applies=_hidden_not(128),
        raises=AssertionError,
        match=r"input_tensor\.shape\[0\]=\d+ must be a multiple of 128|get_w2_permute_indices_with_cache rejected .*assert M % 128 == 0",
        backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM.value,
        check="check_trtllm_round_trip",
    ),
)
"""Upstream bugs of SGLang 0.5.23's DeepSeek-V4 FP4 expert path that the ``mxfp4_moe`` properties meet."""


def _served_shard(config: Any) -> bool:
    """A ``moe_sharding`` configuration :class:`SglangDsv4MoeSharding` loads (gated MXFP4, no biases, a backend of
    :data:`DSV4_BACKENDS` or the default, ``E % ep == 0``)."""
    backend = config.kernel_backend
    return (
        config.gated
        and config.block == MXFP4_BLOCK
        and not config.bias
        and config.experts % config.ep_size == 0
        and (backend is None or backend in DSV4_BACKENDS)
    )


DSV4_SHARDING_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MOE_SHARDING,
        "DeepSeek-V4 FP4 experts: FusedMoE.__init__ sizes every method's buffer for I/tp channels (exact, no rounding) "
        "and FusedMoE._load_w13 / _load_w2 narrow each checkpoint tensor by its own size / tp, so where "
        "(I/tp) % 32 != 0 a rank's FC2 scale groups start at r·floor(I/(32·tp)) while its channels start at r·I/tp: "
        "channels and scales mispair, silently (the vLLM #49949 split). DeepSeek-V4.1-Flash at TP16 (2304/16 = 144) "
        "on SM100 flashinfer_mxfp4 (Mxfp4FlashinferTrtllmMoEMethod) loads this way; Marlin refuses it "
        "(check_moe_marlin_supports_layer), CUTLASS SM90 refuses every I/tp % 128; found by this suite, not reported "
        "upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is not Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90  # refuses first
            and not (config.kernel_backend is Mxfp4MoeBackend.MARLIN and config.hidden % 256)  # load crash first
            and config.intermediate % config.tp == 0
            and (config.intermediate // config.tp) % MXFP4_BLOCK != 0
        ),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
    ),
    KnownFailure(
        MOE_SHARDING,
        "Mxfp4FlashinferCutlassMoEMethod.create_weights refuses every rank whose I/tp (or H) is not a multiple of "
        "128, also where I/tp is whole 32-groups (DeepSeek-V4-Pro TP16: 192; V4.1-Flash TP4 / TP8: 576, 288), "
        "instead of padding after loading; reported as a feature request, closed inactive",
        "https://github.com/sgl-project/sglang/issues/26250",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90
            and config.intermediate % config.tp == 0
            and (config.intermediate // config.tp) % MXFP4_BLOCK == 0
            and ((config.intermediate // config.tp) % 128 != 0 or config.hidden % 128 != 0)
        ),
        raises=AssertionError,
        match=r"policy refused a split that keeps whole 32-groups .*" + CUTLASS_REFUSAL,
    ),
    KnownFailure(
        MOE_SHARDING,
        "Mxfp4MarlinMoEMethod: the mxfp4_moe ledger's load crash (the buffer's H rounded to 256, the loader copying "
        "the checkpoint's width) on every rank where H % 256 != 0; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_marlin_moe.py",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is Mxfp4MoeBackend.MARLIN
            and config.intermediate % config.tp == 0
            and config.hidden % 256 != 0
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
    ),
)
"""Upstream bugs of SGLang 0.5.23's DeepSeek-V4 loader that the ``moe_sharding`` properties meet."""


register_subject(
    Subject(
        "sglang-deepseek-v4",
        f"SGLang's DeepSeek-V4 FP4 expert methods under Fp8Config (TRT-LLM, CUTLASS SM90, Marlin; "
        f"scripts/install-sglang-cpu.sh, SGLang {SGLANG_VERSION})",
        {MXFP4_MOE: SglangDsv4MoeAlignment(), MOE_SHARDING: SglangDsv4MoeSharding()},
        known_failures=DSV4_KNOWN_FAILURES + DSV4_SHARDING_FAILURES,
        missing=sglang_missing,
    )
)
