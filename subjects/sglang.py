"""Subject ``sglang``: SGLang's own alignment, placement and fallback code, adapted to the suite's protocols.

Enabled when SGLang imports (``scripts/install-sglang-cpu.sh`` installs SGLang 0.5.23 on a CPU
machine). Every decision comes from SGLang's functions: the MoE adapters construct a real
``FusedMoE`` through SGLang's own test hooks (``get_flags().moe.override(runner_backend=...)``,
``override_platform(...)``, ``get_context().override_server_args()``, ``get_parallel().override(...)``),
so its constructor picks the quant method, which allocates and rounds; the linear adapter builds a
``torch.nn.Module`` with parameters. Only calls that need a GPU are replaced, each named in the
adapter's docstring:

* ``nvfp4_moe``: :class:`SglangNvfp4MoeAlignment` (``ModelOptNvFp4FusedMoEMethod.create_weights``,
  ``FusedMoE.weight_loader``, ``process_weights_after_loading``: the TRT-LLM, CUTLASS and CuteDSL branches;
  :data:`NVFP4_NOT_MAPPED`: the backends SGLang has no path to);
* ``mxfp4_linear``: :class:`SglangQuarkMxfp4Linear` (``QuarkW4A4MXFP4.process_weights_after_loading``:
  the AITER ASM guard and each path's weight preparation; the activation quantizer of each path read
  from ``apply_weights``' source);
* ``mxfp4_moe``: :class:`SglangMxfp4MoeAlignment` (``Mxfp4MoEMethod`` per backend: ``create_weights``'
  rounding, the gpt-oss and the stacked per-expert loaders' placement, ``process_weights_after_loading``
  with its GPU-only layout calls passed through, triton_kernels' and DeepGEMM's modules stood in;
  :data:`MXFP4_NOT_MAPPED`: the backends not served by ``Mxfp4MoEMethod``);
* ``moe_sharding``: :class:`subjects.sglang_sharding.SglangMoeSharding` (``FusedMoE.weight_loader`` of a
  real ``FusedMoE`` per rank, :func:`load_nvfp4_rank` and :func:`load_mxfp4_rank`).

How SGLang's loaders split a checkpoint over TP ranks is :func:`load_nvfp4_rank` (whole padded blocks
under TRT-LLM, modelled by ``reference.sizes.padded_split``) and :func:`load_mxfp4_rank` (gpt-oss's whole
32-blocks, ``reference.sizes.whole_block_split``; ``I/tp`` per half for stacked checkpoints).

``shared_expert`` is not adapted: SGLang 0.5.23's Qwen3-Next / Qwen2-MoE block
(``models/qwen2_moe.py``, ``Qwen2MoeSparseMoeBlock.__init__``) fuses the shared expert into the MoE when
``can_fuse_shared_expert`` allows it (AITER or CUDA, equal sizes, no DeepEP/MoRI, the quant config's
``can_fuse_shared_expert``), replicates it (``parallel_group="replicated"``) under the DeepEP, MoRI,
FlashInfer, MegaMoE and Ascend all-to-all backends, and otherwise shards it as a tensor-parallel MLP. It
has no counterpart of vLLM's OCP-MX group-straddle gate (``_should_replicate_misaligned_shared_expert``),
which is what the contract's inputs (group, EP, SP) decide.

Upstream bugs of SGLang 0.5.23 that properties catch are listed in :data:`SGLANG_KNOWN_FAILURES`.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from adapters import triton_kernels as tk
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, relayout_moe
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from contracts.mxfp4_linear import PreparedMxfp4Linear
from reference.formats import MxScaleRounding
from reference.layouts import (
    Fc1Layout,
    aiter_shuffle_weight,
    grouped_gate_up_interleave,
    inverse_permutation,
    unswizzle_128x4,
)
from reference.sizes import round_up
from strategies.catalog import CheckpointForm
from subjects.mxfp4_moe import TRITON_ODD_GROUP_FAILURES
from subjects.registry import KnownFailure, Subject, register_subject
from subjects.sglang_sharding import SglangMoeSharding
from subjects.vllm import QUANTIZER_ROUNDING

SGLANG_VERSION = "0.5.23"
"""The SGLang release the adapters were written against (``scripts/install-sglang-cpu.sh`` pins it)."""


class SglangUnavailable(RuntimeError):
    """SGLang is not importable here."""


class SglangSourceMismatch(RuntimeError):
    """SGLang no longer has a symbol or structure an adapter relies on: an SGLang change, or an
    adapter to update. Deliberately not a ``ValueError``, which properties read as a refusal."""


# --- importing SGLang ------------------------------------------------------------------------------


class _StandInType(type):
    """Metaclass of stand-in classes: any class attribute is another stand-in (``InterpolationMode.BICUBIC``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{cls.__name__}.{name}")


def _stand_in_class(name: str) -> type:
    def unavailable(*_: object, **__: object) -> None:
        raise RuntimeError(f"torchvision is a stand-in here ({name}); SGLang's multimodal processors cannot run")

    return _StandInType(name, (), {"__init__": unavailable, "__call__": unavailable})


class _StandInModule(types.ModuleType):
    """A ``torchvision`` (sub)module whose every public attribute is a stand-in class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{self.__name__}.{name}")


STAND_IN_VERSION = "0.0"
"""What the stand-in reports as ``torchvision.__version__`` (``transformers`` parses it): older than any
release, so no version-gated torchvision path is taken."""


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchvision`` and its submodules as :class:`_StandInModule` objects.

    SGLang imports torchvision only through the multimodal processors its config package imports;
    none of the code under test calls it. The PyPI torchvision cannot be installed beside CPU torch
    2.13 (it replaces torch with a CUDA build), so where torchvision is absent this finder answers
    for it. It has no distribution metadata, so ``transformers`` still reports torchvision as absent.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = STAND_IN_VERSION
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


REQUIRED_SYMBOLS = {
    "sglang.srt.layers.moe.fused_moe_triton.layer": ("FusedMoE", "narrow_padded_param_and_loaded_weight"),
    "sglang.srt.layers.moe.moe_runner.base": ("MoeRunnerConfig",),
    "sglang.srt.layers.moe.utils": ("MoeA2ABackend", "MoeRunnerBackend", "get_moe_runner_backend"),
    "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm": (
        "align_fp4_moe_weights_for_flashinfer_trtllm",
        "trtllm_nvfp4_hidden_alignment",
    ),
    "sglang.srt.layers.quantization.modelopt_quant": ("ModelOptFp4Config", "ModelOptNvFp4FusedMoEMethod"),
    "sglang.srt.layers.quantization.utils": ("prepare_static_weights_for_trtllm_fp4_moe", "swizzle_blockscale"),
    "sglang.srt.runtime_context": ("get_flags", "override_platform"),
    "sglang.srt.layers.quantization.mxfp4": (
        "Mxfp4Config",
        "Mxfp4MoEMethod",
        "_use_aiter",
        "_aiter_k3_opt",
        "_FI_HAS_SM90_CUTLASS_MXFP4",
        "has_triton_kernels",
        "_get_flashinfer_mxfp4_device_permute_indices",
        "_swizzle_mxfp4",
        "_pad_hopper_mxfp4_scale",
        "_mx_block_kwargs",
    ),
    "sglang.srt.layers.quantization.marlin_utils_fp4": (
        "deinterleave_moe_mxfp4_w13_for_marlin",
        "prepare_moe_mxfp4_layer_for_marlin",
    ),
    "sglang.srt.models.gpt_oss": ("GptOssForCausalLM",),
    "sglang.srt.layers.quantization.quark.quark": ("QuarkConfig",),
    "sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4_moe": ("QuarkW4A4MXFp4MoE", "_use_aiter"),
    "sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4": (
        "QuarkW4A4MXFP4",
        "_asm_fp4_scale_swizzle_supported",
        "_use_aiter_asm_fp4_gemm",
        "_dequant_linear_to_bf16",
        "is_gfx95_supported",
    ),
}
"""Every SGLang symbol the adapters call or patch, by module: :func:`sglang_modules` checks them all at
import, so a moved or renamed one fails loudly, naming it."""


def import_required(required: dict[str, tuple[str, ...]], what: str) -> tuple[dict[str, types.ModuleType], list[str]]:
    """Every module of ``required`` imported, and the ``module.symbol`` names of ``required`` they lack.
    Raises :class:`SglangUnavailable` naming ``what`` when a module does not import."""
    modules = {}
    try:
        for name in required:
            modules[name] = importlib.import_module(name)
    except Exception as exc:
        raise SglangUnavailable(
            f"{what} is not importable ({type(exc).__name__}: {exc}); run scripts/install-sglang-cpu.sh"
        ) from exc
    return modules, [f"{m}.{s}" for m, symbols in required.items() for s in symbols if not hasattr(modules[m], s)]


def source_matches(missing: list[str]) -> None:
    """Raise :class:`SglangSourceMismatch` naming each of the ``missing`` symbols (none: return)."""
    if missing:
        raise SglangSourceMismatch(
            f"SGLang no longer defines {', '.join(missing)} (adapters written for {SGLANG_VERSION})"
        )


def sglang_missing() -> str | None:
    """Why the ``sglang`` subject cannot run here (SGLang not installed), without importing SGLang."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed; run scripts/install-sglang-cpu.sh"
    return None


@functools.cache
def sglang_modules() -> types.SimpleNamespace:
    """Import SGLang's modules under test and check every symbol of :data:`REQUIRED_SYMBOLS`.

    Where torchvision is not installed, :class:`_TorchvisionStandIn` is put on ``sys.meta_path``
    first. Raises :class:`SglangUnavailable` when SGLang does not import, and
    :class:`SglangSourceMismatch` naming each missing symbol.
    """
    if importlib.util.find_spec("sglang") is None:
        raise SglangUnavailable("SGLang is not installed; run scripts/install-sglang-cpu.sh")
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_TorchvisionStandIn())
    modules, missing = import_required(REQUIRED_SYMBOLS, "SGLang")
    source_matches(missing)
    sglang = importlib.import_module("sglang")
    layer = modules["sglang.srt.layers.moe.fused_moe_triton.layer"]
    return types.SimpleNamespace(
        version=getattr(sglang, "__version__", "unknown"),
        layer=layer,
        FusedMoE=layer.FusedMoE,
        MoeRunnerConfig=modules["sglang.srt.layers.moe.moe_runner.base"].MoeRunnerConfig,
        MoeRunnerBackend=modules["sglang.srt.layers.moe.utils"].MoeRunnerBackend,
        MoeA2ABackend=modules["sglang.srt.layers.moe.utils"].MoeA2ABackend,
        get_moe_runner_backend=modules["sglang.srt.layers.moe.utils"].get_moe_runner_backend,
        trtllm=modules["sglang.srt.layers.moe.moe_runner.flashinfer_trtllm"],
        modelopt=modules["sglang.srt.layers.quantization.modelopt_quant"],
        quant_utils=modules["sglang.srt.layers.quantization.utils"],
        ctx=modules["sglang.srt.runtime_context"],
        quark_w4a4=modules["sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4"],
        mxfp4=modules["sglang.srt.layers.quantization.mxfp4"],
        marlin_fp4=modules["sglang.srt.layers.quantization.marlin_utils_fp4"],
        gpt_oss=modules["sglang.srt.models.gpt_oss"],
        quark=modules["sglang.srt.layers.quantization.quark.quark"],
        quark_moe=modules["sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4_moe"],
    )


# --- a real FusedMoE: SGLang's own constructor under its test hooks ---------------------------------


@contextlib.contextmanager
def moe_backend(runner_backend: str, **platform: bool) -> Iterator[types.SimpleNamespace]:
    """SGLang's MoE runner backend ``runner_backend`` (a ``MoeRunnerBackend`` value) on a platform with
    the facts ``platform`` (``override_platform``), through SGLang's own test hooks; no a2a backend."""
    m = sglang_modules()
    backend = m.MoeRunnerBackend(runner_backend)
    a2a = m.MoeA2ABackend.NONE
    with m.ctx.get_flags().moe.override(runner_backend=backend, a2a_backend=a2a), m.ctx.override_platform(**platform):
        yield m


def parallel_layout(tp: int, rank: int, ep: int = 1) -> dict[str, int]:
    """SGLang's parallel fields for rank ``rank`` of ``tp·ep`` ranks whose MoE layers are ``tp``-way tensor- and
    ``ep``-way expert-parallel (no DP or CP): attention tensor-parallel over all ranks, and SGLang's numbering
    ``moe_ep_rank = rank // moe_tp_size``, ``moe_tp_rank = rank % moe_tp_size``, as ``_validate_parallel``
    requires (``tp_size == moe_ep_size · moe_dp_size · moe_tp_size``)."""
    world = tp * ep
    return dict(
        tp_size=world, tp_rank=rank, attn_tp_size=world, attn_tp_rank=rank, attn_dp_size=1, attn_dp_rank=0,
        attn_cp_size=1, attn_cp_rank=0, moe_tp_size=tp, moe_tp_rank=rank % tp, moe_ep_size=ep,
        moe_ep_rank=rank // tp, moe_dp_size=1,
    )  # fmt: skip


@contextlib.contextmanager
def sglang_layer_context(
    runner_backend: str, platform: dict[str, bool], tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[Any]:
    """What a real ``FusedMoE(...)`` needs to be constructed: the backend and platform (:func:`moe_backend`),
    a published dummy ``ServerArgs`` (``get_context().override_server_args()``, SGLang's test hook) and the
    MoE parallel layout of rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`parallel_layout`)."""
    with moe_backend(runner_backend, **platform) as m:
        context = m.ctx.get_context()
        with (
            context.override_server_args(),
            m.ctx.get_parallel().override(**parallel_layout(tp, rank, ep)),
        ):
            yield m


@functools.cache
def _importable(module: str) -> bool:
    """Whether ``module`` imports here (FlashInfer's CuteDSL utilities need nvidia-cutlass-dsl)."""
    try:
        importlib.import_module(module)
    except (ImportError, RuntimeError, OSError):  # a missing package, or one that needs CUDA at import
        return False
    return True


@contextlib.contextmanager
def stand_in_function(module: str, name: str, stand_in: Callable[..., Any]) -> Iterator[None]:
    """``module.name`` replaced by ``stand_in`` while the block runs, for code that imports it when it runs
    (``from module import name``). Where ``module`` does not import here, it and each parent package that does
    not import are stand-in modules in ``sys.modules``, holding only ``name``."""
    if _importable(module):
        with mock.patch.object(importlib.import_module(module), name, stand_in):
            yield
        return
    parts = module.split(".")
    prefixes = (".".join(parts[: k + 1]) for k in range(len(parts)))
    stubs = {prefix: types.ModuleType(prefix) for prefix in prefixes if not _importable(prefix)}
    setattr(stubs[module], name, stand_in)
    with mock.patch.dict(sys.modules, stubs):
        yield


def not_mapped(backend: enum.Enum) -> str:
    """Why the subject does not run ``backend`` (:data:`NVFP4_NOT_MAPPED`, :data:`MXFP4_NOT_MAPPED`)."""
    reasons = {**NVFP4_NOT_MAPPED, **MXFP4_NOT_MAPPED}
    return reasons.get(backend, f"the SGLang subject does not map {backend.value}")


# --- nvfp4_moe: ModelOptNvFp4FusedMoEMethod ----------------------------------------------------------


@dataclass(frozen=True)
class SglangNvfp4Backend:
    """How SGLang 0.5.23 runs one of the suite's NVFP4 MoE backends for a ModelOpt checkpoint.

    ``runner``: the ``--moe-runner-backend``; ``device_call``: the function of
    ``quantization/utils.py`` that ``ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`` calls on this
    branch and that needs a GPU, replaced by a capture of its inputs (``None``: the branch runs whole on CPU);
    ``per_token_activation``: ``ModelOptFp4Config(use_per_token_activation=...)``, a ModelOpt checkpoint with
    dynamic per-token activation scales (``SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION``);
    ``fc1_group``: the branch regroups a gated layer's FC1 rows (weights and block scales) into
    ``fc1_group``-row ``[up; gate]`` groups before swizzling (CuteDSL's ``interleave_w13_halves``), read back
    through the inverse (``reference.layouts.grouped_gate_up_interleave``); ``stand_ins``: functions the
    branch imports when it runs and that need a GPU, ``(module, name)``, each replaced by a pass-through of
    its first argument (:func:`stand_in_function`; their outputs are layouts the adapter does not read).
    """

    runner: str
    device_call: str | None
    per_token_activation: bool = False
    fc1_group: int | None = None
    stand_ins: tuple[tuple[str, str], ...] = ()


NVFP4_BACKENDS: dict[Nvfp4MoeBackend, SglangNvfp4Backend] = {
    # align_fp4_moe_weights_for_flashinfer_trtllm, then FlashInfer's shuffles inside
    # prepare_static_weights_for_trtllm_fp4_moe (CUDA kernels)
    Nvfp4MoeBackend.FLASHINFER_TRTLLM: SglangNvfp4Backend(
        "flashinfer_trtllm", "prepare_static_weights_for_trtllm_fp4_moe"
    ),
    # swizzle_blockscale is pure torch
    Nvfp4MoeBackend.FLASHINFER_CUTLASS: SglangNvfp4Backend("flashinfer_cutlass", None),
    # the TRT-LLM branch with trtllm_nvfp4_hidden_alignment(use_per_token_activation=True, is_gated)
    Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN: SglangNvfp4Backend(
        "flashinfer_trtllm", "prepare_static_weights_for_trtllm_fp4_moe", per_token_activation=True
    ),
    # the "CUTLASS processing" branch under _is_cutedsl_v2_standard (no DeepEP): interleave_w13_halves
    # (64-row groups, ValueError unless each half is whole groups), swizzle_blockscale, then FlashInfer's
    # convert_sf_to_mma_layout for CuteDslMoEWrapper (nvidia-cutlass-dsl, a CUDA build)
    Nvfp4MoeBackend.FLASHINFER_CUTEDSL: SglangNvfp4Backend(
        "flashinfer_cutedsl",
        None,
        fc1_group=64,
        stand_ins=(("flashinfer.cute_dsl.utils", "convert_sf_to_mma_layout"),),
    ),
}
"""The suite's NVFP4 MoE backends as SGLang runs them (:data:`NVFP4_NOT_MAPPED`: those it has no path to)."""

NVFP4_NOT_MAPPED: dict[Nvfp4MoeBackend, str] = {
    Nvfp4MoeBackend.B12X: (
        "SGLang 0.5.23 has no path to the b12x NVFP4 MoE: no MoeRunnerBackend member for it "
        "(srt/layers/moe/utils.py) and no module of the release imports b12x"
    ),
    Nvfp4MoeBackend.VLLM_CUTLASS: (
        "SGLang 0.5.23 has no path to vLLM's cutlass_moe_fp4: ModelOptNvFp4FusedMoEMethod.create_moe_runner "
        "raises NotImplementedError for --moe-runner-backend cutlass ('not supported for NVFP4 MoE', "
        "srt/layers/quantization/modelopt_quant.py), whose only MoE kernel is cutlass_fused_experts_fp8 "
        "(srt/layers/moe/cutlass_moe.py); CutlassMoEType.BlockscaledFP4 (srt/layers/moe/cutlass_moe_params.py) "
        "is referenced nowhere"
    ),
}
"""The suite's NVFP4 MoE backends SGLang 0.5.23 cannot run, each with the source that shows it: they skip
with that reason."""

BLACKWELL = {"is_blackwell": True, "is_sm100": True, "is_cuda": True, "is_hip": False}
"""Platform facts of a B200 (SM100), where SGLang runs both NVFP4 FlashInfer backends."""

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
    """A real ``FusedMoE`` of rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`parallel_layout`) for a ModelOpt NVFP4 checkpoint (``ModelOptFp4Config``,
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
      FlashInfer's ``convert_sf_to_mma_layout`` (nvidia-cutlass-dsl) stood in (:func:`stand_in_function`).

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
                    stack.enter_context(stand_in_function(module, name, _pass_through))
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


# --- mxfp4_linear: QuarkW4A4MXFP4 (Quark OCP-MX W4A4 dense layers on AITER) ----------------------------

SGLANG_AITER_QUANTIZERS = {"per_1x32_f4_quant": "per_1x32_f4_quant_hip", "dynamic_mxfp4_quant": "dynamic_mxfp4_quant"}
"""SGLang's custom-op wrappers in ``quark_w4a4_mxfp4.py`` and the AITER quantizer each one calls
(``per_1x32_f4_quant_hip(x, shuffle=True)``, ``aiter.ops.triton.quant.dynamic_mxfp4_quant``)."""

ASM_LAYER_FLAG = "use_aiter_asm_fp4_gemm"
"""The layer attribute ``QuarkW4A4MXFP4.process_weights_after_loading`` sets and ``apply_weights`` branches on."""


def _called_quantizers(stmts: list[ast.stmt]) -> list[str]:
    names = {_call_name(n) for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)}
    return sorted(names & set(SGLANG_AITER_QUANTIZERS))


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def quark_path_quantizers(apply_weights_source: str) -> dict[AiterLinearPath, str]:
    """The AITER activation quantizer each path of ``QuarkW4A4MXFP4.apply_weights`` runs, read from source.

    The ASM path is the body of ``if getattr(layer, "use_aiter_asm_fp4_gemm", False): ...``; the Triton
    path is the rest of the function after it. Each must call exactly one quantizer of
    :data:`SGLANG_AITER_QUANTIZERS`; otherwise :class:`SglangSourceMismatch`. (The fused pre-quantizing
    GEMMs serve pre-quantized tuple inputs, which the dense MXFP4 layers the suite models do not get.)
    """
    function = ast.parse(textwrap.dedent(apply_weights_source)).body[0]
    body = getattr(function, "body", [])
    branch = next(
        (
            i
            for i, s in enumerate(body)
            if isinstance(s, ast.If) and ASM_LAYER_FLAG in ast.unparse(s.test) and not s.orelse
        ),
        None,
    )
    if branch is None:
        raise SglangSourceMismatch(f"QuarkW4A4MXFP4.apply_weights has no 'if getattr(layer, {ASM_LAYER_FLAG!r}...)'")
    paths = {AiterLinearPath.ASM: body[branch].body, AiterLinearPath.TRITON: body[branch + 1 :]}
    found = {path: _called_quantizers(stmts) for path, stmts in paths.items()}
    if any(len(q) != 1 for q in found.values()):
        raise SglangSourceMismatch(
            f"QuarkW4A4MXFP4.apply_weights calls the activation quantizers {found}; the adapter expects exactly one "
            f"of {sorted(SGLANG_AITER_QUANTIZERS)} per path"
        )
    return {path: SGLANG_AITER_QUANTIZERS[q[0]] for path, q in found.items()}


@functools.cache
def sglang_linear_quantizers() -> dict[AiterLinearPath, str]:
    """:func:`quark_path_quantizers` on the installed ``QuarkW4A4MXFP4.apply_weights``."""
    return quark_path_quantizers(inspect.getsource(sglang_modules().quark_w4a4.QuarkW4A4MXFP4.apply_weights))


def _reference_shuffle_weight(weight: torch.Tensor, layout: tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Stand-in for ``aiter.ops.shuffle.shuffle_weight``: the suite's ``reference.layouts.aiter_shuffle_weight``."""
    if tuple(layout) != (16, 16):
        raise SglangSourceMismatch(
            f"SGLang asks AITER's shuffle_weight for layout {layout}; the reference has (16, 16)"
        )
    return aiter_shuffle_weight(weight)


class SglangQuarkMxfp4Linear:
    """SGLang's ``QuarkW4A4MXFP4`` (``quark/schemes/quark_w4a4_mxfp4.py``) on AITER (gfx950).

    * ``process_mxfp4_linear_weights``: ``process_weights_after_loading`` on a ``torch.nn.Module``
      holding ``weight`` and ``weight_scale`` Parameters, with the module's switches set as on an
      MI350x with ``SGLANG_ROCM_USE_AITER_FP4_ASM_GEMM=asm_enabled``: ``_use_aiter_asm_fp4_gemm =
      asm_enabled``, ``is_gfx95_supported() = True``, ``_dequant_linear_to_bf16 = False`` (no
      ``AITER_FORCE_A8W4``). The module imports AITER's ``shuffle_weight`` only on ROCm; where AITER is
      absent the adapter supplies the suite's reference (:func:`_reference_shuffle_weight`). So the
      guard (``_asm_fp4_scale_swizzle_supported`` plus SGLang's ``N <= 128`` rule), the path and the
      ASM scale swizzle are SGLang's; the ASM weight shuffle is the reference's.
    * The path is ASM when the layer's ``use_aiter_asm_fp4_gemm`` is set. On the Triton path SGLang keeps
      the scale as loaded, ``(N, K/32)``, and hands it to ``gemm_afp4wfp4`` as is; the suite's
      :class:`~contracts.mxfp4_linear.PreparedMxfp4Linear` states the Triton scale in vLLM's storage,
      ``(K/32, N)`` whose ``.T`` the GEMM gets, so the adapter reports ``scale.T.contiguous()``: the same
      GEMM operand.
    * ``use_asm_gemm(shape)``: the path that processing takes, ASM enabled, for a layer whose scale has
      that shape (a 2-D shape ``(N, K/32)`` gets an ``[N, K/2]`` weight; other ranks fail SGLang's guard
      before the weight is read).
    * ``linear_activation_rounding``: the rounding of the AITER quantizer ``apply_weights`` calls on that
      path (:func:`sglang_linear_quantizers`, :data:`subjects.vllm.QUANTIZER_ROUNDING`).
    """

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        m = sglang_modules()
        scheme = object.__new__(m.quark_w4a4.QuarkW4A4MXFP4)
        scheme.is_checkpoint_mxfp4_serialized = True
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale.clone(), requires_grad=False)
        shuffle = getattr(m.quark_w4a4, "shuffle_weight", None) or _reference_shuffle_weight
        with (
            mock.patch.object(m.quark_w4a4, "_use_aiter_asm_fp4_gemm", asm_enabled),
            mock.patch.object(m.quark_w4a4, "_dequant_linear_to_bf16", False),
            mock.patch.object(m.quark_w4a4, "is_gfx95_supported", lambda: True),
            mock.patch.object(m.quark_w4a4, "shuffle_weight", shuffle, create=True),
        ):
            scheme.process_weights_after_loading(layer)
        if getattr(layer, ASM_LAYER_FLAG):
            return PreparedMxfp4Linear(AiterLinearPath.ASM, layer.weight.detach(), layer.weight_scale.detach())
        scale = layer.weight_scale.detach()
        return PreparedMxfp4Linear(
            AiterLinearPath.TRITON, layer.weight.detach(), scale.mT.contiguous() if scale.ndim == 2 else scale
        )

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        shape = tuple(scale_shape)
        rows = shape[0] if shape else 0
        weight = torch.zeros(rows, 16 * shape[1] if len(shape) == 2 else 1, dtype=torch.uint8)
        prepared = self.process_mxfp4_linear_weights(weight, torch.zeros(shape, dtype=torch.uint8), asm_enabled=True)
        return prepared.path is AiterLinearPath.ASM

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return QUANTIZER_ROUNDING[sglang_linear_quantizers()[path]]


# --- mxfp4_moe: Mxfp4MoEMethod (gpt-oss-style MXFP4 checkpoints) -------------------------------------


@dataclass(frozen=True)
class SglangMxfp4Backend:
    """How SGLang 0.5.23 runs one of the suite's MXFP4 MoE backends for gpt-oss-style checkpoints.

    ``runner``: the ``--moe-runner-backend``; ``platform``: the platform facts (``override_platform``);
    ``switches``: module-level switches of ``quantization/mxfp4.py`` that SGLang reads from the
    environment at import; ``device_calls``: the GPU-only calls of ``Mxfp4MoEMethod.process_weights_after_loading``
    on this branch, ``(module, name)`` with ``module`` in :func:`sglang_modules`' namespace or a module the branch
    imports from when it runs (:func:`stand_in_function`), each replaced by a pass-through of its first argument
    or its :data:`DEVICE_STAND_INS` entry (its input is what the adapter reports; the properties run the
    libraries' transforms themselves); ``fc1_layout``: the FC1 row order SGLang's post-load processing leaves in the
    buffer it hands those calls (read from the branch's source); ``stacked_via_quark``: stacked ``[gate; up]``
    checkpoints on this backend are Quark OCP-MX ones, served by ``QuarkW4A4MXFp4MoE`` (:func:`quark_layer`);
    ``triton_kernels``: the branch hands the layer to triton_kernels' ``convert_layout`` (through
    ``_swizzle_mxfp4``), read back by :func:`process_triton_kernels_layer`.
    """

    runner: str
    platform: dict[str, bool]
    switches: dict[str, bool]
    device_calls: tuple[tuple[str, str], ...]
    fc1_layout: Fc1Layout
    stacked_via_quark: bool = False
    triton_kernels: bool = False


MXFP4_BACKENDS: dict[Mxfp4MoeBackend, SglangMxfp4Backend] = {
    # Mxfp4MoEMethod.process_weights_after_loading, `if self.use_flashinfer:` (trtllm_sm100):
    # swap_every_two_rows, then FlashInfer's row permutations and block_scale_interleave per expert.
    Mxfp4MoeBackend.FLASHINFER_TRTLLM: SglangMxfp4Backend(
        "flashinfer_mxfp4",
        {"is_sm100": True, "is_blackwell": True},
        {},
        (("mxfp4", "_get_flashinfer_mxfp4_device_permute_indices"), ("mxfp4", "nvfp4_block_scale_interleave")),
        Fc1Layout.UP_GATE_INTERLEAVED,
    ),
    # _process_weights_for_sm90_cutlass: de-interleave, pad each half, [up; gate], then FlashInfer's
    # SM90 mixed-GEMM weight and scale interleaves (PR #3084).
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90: SglangMxfp4Backend(
        "flashinfer_mxfp4",
        {"is_sm90": True, "is_sm100": False, "is_blackwell": False},
        {"_FI_HAS_SM90_CUTLASS_MXFP4": True},
        (
            ("mxfp4", "interleave_moe_weights_for_sm90_mixed_gemm"),
            ("mxfp4", "interleave_moe_scales_for_sm90_mixed_gemm"),
        ),
        Fc1Layout.UP_GATE,
    ),
    # `if _use_aiter:` (SGLANG_USE_AITER on ROCm): pairs de-interleaved into [gate; up] halves, then AITER's
    # shuffle_weight / shuffle_scale (a4w4, separated) or, with SGLANG_USE_AITER_MOE_GU_ITLV (default on),
    # shuffle_weight_a16w4 / shuffle_scale_a16w4 (A16W4/A8W4): the same [gate; up] input either way.
    Mxfp4MoeBackend.AITER: SglangMxfp4Backend(
        "auto",
        {"is_hip": True, "is_cuda": False, "is_sm100": False},
        {"_use_aiter": True},
        tuple(("mxfp4", n) for n in ("shuffle_weight", "shuffle_scale", "shuffle_weight_a16w4", "shuffle_scale_a16w4")),
        Fc1Layout.GATE_UP,
        stacked_via_quark=True,
    ),
    # the same branch under SGLang's default SGLANG_USE_AITER_MOE_GU_ITLV: gpt-oss's [gate; up] halves go to
    # shuffle_weight_a16w4 / shuffle_scale_a16w4 (gate_up=True); stacked checkpoints (gate_up_interleaved=False)
    # take the separated shuffle_weight / shuffle_scale, the same [gate; up] input
    Mxfp4MoeBackend.AITER_A16W4: SglangMxfp4Backend(
        "auto",
        {"is_hip": True, "is_cuda": False, "is_sm100": False},
        {"_use_aiter": True},
        tuple(("mxfp4", n) for n in ("shuffle_weight", "shuffle_scale", "shuffle_weight_a16w4", "shuffle_scale_a16w4")),
        Fc1Layout.GATE_UP,
    ),
    # `if self.use_marlin`: check_moe_marlin_supports_layer, deinterleave_moe_mxfp4_w13_for_marlin (gpt-oss's
    # gemm1_alpha is set), then prepare_moe_mxfp4_layer_for_marlin (gptq_marlin_repack, CUDA).
    Mxfp4MoeBackend.MARLIN: SglangMxfp4Backend(
        "marlin",
        {"is_sm90": True, "is_sm100": False},
        {},
        (("marlin_fp4", "prepare_moe_mxfp4_layer_for_marlin"),),
        Fc1Layout.GATE_UP,
    ),
    # --moe-runner-backend triton_kernel on an SM90 GPU (what model_overrides/gpt_oss.py picks there):
    # create_weights rounds I to 64 (has_triton_kernels), the hidden size stays; `if self.use_triton_kernels:`
    # hands the checkpoint's rows to _swizzle_mxfp4, which pads the Hopper scale groups along K to whole
    # 128-element tiles (_pad_hopper_mxfp4_scale, E8M0 127) before convert_layout. The kernel's swiglu reads
    # gate/up pairs: every CUDA layer has bias buffers, so the runner takes triton_kernel_fused_experts_with_bias.
    Mxfp4MoeBackend.TRITON_SM90: SglangMxfp4Backend(
        "triton_kernel",
        {"is_sm90": True, "is_sm100": False, "is_blackwell": False},
        {"has_triton_kernels": True},
        (),
        Fc1Layout.GATE_UP_INTERLEAVED,
        triton_kernels=True,
    ),
    # --moe-runner-backend deep_gemm on SM100 (what model_overrides/minimax_m3.py picks for MXFP8 activations):
    # the record's DEEPGEMM_MXFP4 alias. create_weights keeps the checkpoint's sizes; `if self.use_deep_gemm`
    # views the weights as int8 and hands DeepGEMM's transform_sf_into_required_layout the scales widened to
    # fp32 (recipe (1, 32)); the runner quantizes activations to FP8 in 128-element groups (recipe (1, 128))
    # and reads GEMM1's output as [gate; up] halves (moe_runner/deep_gemm.py, DeepGemmMoeQuantInfo with no
    # biases).
    Mxfp4MoeBackend.VLLM_CUTLASS: SglangMxfp4Backend(
        "deep_gemm",
        {"is_sm100": True, "is_blackwell": True},
        {},
        (("deep_gemm", "transform_sf_into_required_layout"),),
        Fc1Layout.GATE_UP,
    ),
}
"""The suite's MXFP4 MoE backends as SGLang selects and prepares them for ``Mxfp4MoEMethod``
(:data:`MXFP4_NOT_MAPPED`: those it has no path to)."""

MXFP4_NOT_MAPPED: dict[Mxfp4MoeBackend, str] = {
    Mxfp4MoeBackend.B12X: (
        "SGLang 0.5.23 has no path to FlashInfer's b12x MXFP4 MoE: no module of the release imports b12x; "
        "Mxfp4MoEMethod's SM120 branch (_fi_kernel 'cutlass_sm120', srt/layers/quantization/mxfp4.py) runs "
        "cutlass_fused_moe with MXFP8 activations, a kernel the suite has no record for"
    ),
    Mxfp4MoeBackend.FLASHINFER_MOE_EP: (
        "SGLang 0.5.23 feeds FlashInfer's MoE-EP DeepGEMM megakernel (DeepGemmMegaMoeConfig) only from "
        "Fp8MoEMethod's FP4-expert path under --moe-a2a-backend flashinfer_megamoe "
        "(prepare_fp4_moe_weights_for_flashinfer_megamoe, srt/layers/moe/flashinfer_megamoe.py; "
        "srt/layers/quantization/fp8.py): the DeepSeek-V4 FP4 expert family, not Mxfp4MoEMethod"
    ),
}
"""The suite's MXFP4 MoE backends the ``sglang`` subject does not run through ``Mxfp4MoEMethod``, each with the
source that shows why: they skip with that reason."""

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
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`parallel_layout`) of an MXFP4 MoE layer after SGLang's loader has read the whole ``checkpoint``.

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
    """Rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`parallel_layout`) of a Quark OCP-MX MXFP4 MoE layer on AITER after SGLang's loader has read the
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


def _pass_through(x: Any, *_: object, **__: object) -> Any:
    """Stand-in for a GPU-only layout transform: returns its input unchanged."""
    return x


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
    :func:`sglang_modules`' namespace) passed through and ``Tensor.cuda`` kept on the CPU: the buffers SGLang
    hands those calls, read in ``fc1_layout`` (the order the branch's source leaves)."""
    with contextlib.ExitStack() as stack:
        for module, name in device_calls:
            stand_in = DEVICE_STAND_INS.get(name, _pass_through)
            if hasattr(m, module):
                stack.enter_context(mock.patch.object(getattr(m, module), name, stand_in, create=True))
            else:
                stack.enter_context(stand_in_function(module, name, stand_in))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", _pass_through))
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


# --- known upstream bugs -----------------------------------------------------------------------------

SGLANG_SOURCE = f"https://github.com/sgl-project/sglang/blob/v{SGLANG_VERSION}/python/sglang/srt"
"""SGLang's source at the adapted release, for ledger entries that cite a line rather than an issue."""

FUSED_MOE_LOADERS = tuple(
    f"sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE.{f}" for f in ("_load_w13", "_load_w2")
)
"""The per-projection expert loaders whose copy into a method's buffer raises torch's size-mismatch error (the
ledger's ``raised_in``: the same message from an adapter's own code is no upstream bug)."""

GPT_OSS_LOADERS = ("sglang.srt.models.gpt_oss:GptOssForCausalLM._load_mxfp4_experts_weights",)
"""gpt-oss's fused MXFP4 expert loader, whose copy of whole 32-blocks overruns an ``I/tp`` buffer."""


TRTLLM_NVFP4 = tuple(b for b, sel in NVFP4_BACKENDS.items() if sel.runner == "flashinfer_trtllm")
"""The suite's NVFP4 backends SGLang runs on its TRT-LLM branch (static and per-token activation scales)."""


def _hidden_left_unpadded(backend: Nvfp4MoeBackend, rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``rule``, on the shapes whose hidden size SGLang's TRT-LLM branch leaves unpadded on ``backend``
    (``trtllm_nvfp4_hidden_alignment`` is 1, except 512 for per-token activation scales and non-gated layers)."""
    per_token = NVFP4_BACKENDS[backend].per_token_activation
    return lambda shape: (shape.gated or not per_token) and rule(shape)


def _gated_rows_not_128(shape: Any) -> bool:
    """A gated NVFP4 layer whose fused FC1 rows ``2I`` the 128x4 scale swizzle would pad."""
    return shape.gated and (2 * shape.intermediate) % 128 != 0


def _hidden_not_128(shape: Any) -> bool:
    """A hidden size FlashInfer's FC2 row shuffle and 128x4 swizzle reject unpadded (``H % 128``)."""
    return shape.hidden % 128 != 0


def _hidden_128_not_256(shape: Any) -> bool:
    """A hidden size that is a multiple of 128 but not of 256 (Nemotron-3-Nano's 2688)."""
    return shape.hidden % 128 == 0 and shape.hidden % 256 != 0


def _gated_halves_not_64(shape: Any) -> bool:
    """A gated NVFP4 layer whose gate/up halves are not whole 64-row groups (``2I % 128 != 0``)."""
    return shape.gated and shape.intermediate % 64 != 0


def _cutedsl_hidden_not_256(shape: Any) -> bool:
    """A hidden size not a multiple of 256 that SGLang's CuteDSL branch reaches (it refuses gated layers with
    partial 64-row groups first, :func:`_gated_halves_not_64`)."""
    return shape.hidden % 256 != 0 and not _gated_halves_not_64(shape)


def _small_n_asm_capable(config: Any) -> bool:
    """A 2-D scale the layout guard accepts (``rows % 32``, ``cols % 8``, not 96 rows) with ``N <= 128``:
    the suite's contract sends it to ASM, SGLang 0.5.23 keeps it on Triton."""
    shape = tuple(config.shape if hasattr(config, "shape") else config.scale_shape)
    return len(shape) == 2 and shape[0] % 32 == 0 and shape[1] % 8 == 0 and shape[0] <= 128 and shape[0] != 96


def _hidden_256_over_128(config: Any) -> bool:
    """An MXFP4 MoE hidden size that rounding to 256 pads further than rounding to 128 (gpt-oss 2880)."""
    h = config.shape.hidden
    return round_up(h, 256) != round_up(h, 128)


def _stacked_hidden_padded(config: Any) -> bool:
    """A stacked ``[gate; up]`` MXFP4 checkpoint without biases (with biases the adapter loads it as gpt-oss's,
    :func:`mxfp4_layer`) whose hidden size every SGLang MXFP4 backend pads (to 256)."""
    return config.form is CheckpointForm.STACKED and not config.bias and config.shape.hidden % 256 != 0


def _quark_hidden_not_256(config: Any) -> bool:
    """A stacked checkpoint without biases (Quark OCP-MX on AITER) whose hidden size is not a multiple of 256."""
    return config.form is CheckpointForm.STACKED and not config.bias and config.shape.hidden % 256 != 0


def _deep_gemm_k_not_128(config: Any) -> bool:
    """An MXFP4 MoE shape whose GEMM K (``H`` for FC1, ``I`` for FC2) is not whole 128-element activation groups."""
    return config.shape.hidden % 128 != 0 or config.shape.intermediate % 128 != 0


def _gpt_oss_form(config: Any) -> bool:
    """A checkpoint SGLang loads as gpt-oss's (row-interleaved pairs, or expert biases: :func:`gpt_oss_family`)."""
    return config.form.layout.interleaved or config.bias


def _marlin_refused_hidden(config: Any) -> bool:
    """A hidden size SGLang's Marlin check refuses before padding it (``hidden_size % 64``)."""
    return config.shape.hidden % 64 != 0


def _inter_128_over_64(config: Any) -> bool:
    """An MXFP4 MoE intermediate size that rounding to 128 pads further than rounding to 64 (288, 192)."""
    i = config.shape.intermediate
    return round_up(i, 128) != round_up(i, 64)


HIDDEN_256_BACKENDS = (
    Mxfp4MoeBackend.FLASHINFER_TRTLLM,
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90,
    Mxfp4MoeBackend.AITER_A16W4,
    Mxfp4MoeBackend.MARLIN,
)
"""The backends whose ``Mxfp4MoEMethod`` buffers round the hidden size to 256 (``FusedMoE.__init__`` for
``flashinfer_mxfp4``, ``create_weights`` for AITER and Marlin)."""


SGLANG_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        NVFP4_MOE,
        "flashinfer_cutlass: process_weights_after_loading asserts 'The intermediate size required padding, but "
        "padding is also implemented for gated activations' when the 128x4 swizzle pads gated FC1 rows "
        "(Gemma-4-26B-A4B TP=2, Step-3.7-Flash TP=8); open fix: PR #30888",
        "https://github.com/sgl-project/sglang/issues/30887",
        applies=_gated_rows_not_128,
        raises=AssertionError,
        match=r"The intermediate size required padding, but padding is also implemented for gated activations",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTLASS.value,
    ),
    KnownFailure(
        NVFP4_MOE,
        "flashinfer_cutedsl: ModelOptNvFp4FusedMoEMethod.process_weights_after_loading regroups gated FC1 rows "
        "with interleave_w13_halves(group_size=64) before any padding, which raises 'Expected split dim divisible "
        "by group_size=64' when I/tp % 64 != 0 (Gemma-4-26B-A4B TP=4: 176); the CUTLASS branch's #30887 at the "
        "step before it (issue closed as inactive; its fix PR #30888, open, pads each half before the CuteDSL "
        "interleave too)",
        "https://github.com/sgl-project/sglang/issues/30887",
        applies=_gated_halves_not_64,
        raises=ValueError,
        match=r"Expected split dim divisible by group_size=64",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTEDSL.value,
    ),
    KnownFailure(
        NVFP4_MOE,
        "Disputed: SGLang runs NVFP4 CuteDSL MoE (flashinfer_cutedsl) with the hidden size unpadded, vLLM 0.33.0 "
        "pads it to 256 for GEMM1's K tile, which has no tail predicate in the FlashInfer 0.7.2 both pin "
        "(FlashInfer 0.7.4's gather kernel predicates K tails); settled by cute_dsl_fused_moe (w4a4) on a B200 "
        "with FlashInfer 0.7.2 at H = 2688 (Nemotron-3-Nano) against the reference",
        f"{SGLANG_SOURCE}/layers/quantization/modelopt_quant.py",
        applies=_cutedsl_hidden_not_256,
        raises=AssertionError,
        match=r"hidden size \d+ is not a multiple of 256",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTEDSL.value,
        check="check_backend_accepts",
    ),
    *(
        KnownFailure(
            NVFP4_MOE,
            "flashinfer_trtllm: align_fp4_moe_weights_for_flashinfer_trtllm pads the hidden size only to "
            "trtllm_nvfp4_hidden_alignment (1, or 512 for per-token non-gated), so H % 128 != 0 (gpt-oss "
            "H = 2880) reaches FlashInfer's FC2 shuffle, which asks callers to zero-pad hidden_size to 128; "
            "found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/flashinfer_trtllm.py",
            applies=_hidden_left_unpadded(backend, _hidden_not_128),
            raises=AssertionError,
            match=r"rejected FC2 scales with \d+ rows: input_tensor\.shape\[0\]=\d+ must be a multiple of 128",
            backend=backend.value,
            check=check,
        )
        for check in ("check_backend_accepts", "check_prepare_round_trip")
        for backend in TRTLLM_NVFP4
    ),
    *(
        KnownFailure(
            NVFP4_MOE,
            "Disputed: SGLang runs NVFP4 TRT-LLM MoE (static, and per-token gated) with H % 256 == 128 unpadded (its docstring: 'Every other "
            "variant runs unpadded', measured with FlashInfer 0.7.0.post1), FlashInfer 0.7.4's valid_hidden_size "
            "docstring says 'For NVFP4 the padded hidden_size must be a multiple of 256 (128 gives wrong results)'; "
            "settled by trtllm_fp4_block_scale_moe on a B200 at H = 2688 against the reference",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/flashinfer_trtllm.py",
            applies=_hidden_left_unpadded(backend, _hidden_128_not_256),
            raises=AssertionError,
            match=r"hidden size \d+ is not a multiple of 256 \(FlashInfer 0\.7\.4: 128 gives wrong results\)",
            backend=backend.value,
            check="check_backend_accepts",
        )
        for backend in TRTLLM_NVFP4
    ),
    *(
        KnownFailure(
            MXFP4_LINEAR,
            "Disputed: QuarkW4A4MXFP4 keeps every layer with N <= 128 on the Triton GEMM (_ASM_FP4_UNSAFE_MAX_N: "
            "'gemm_a4w4's untuned ASM heuristic returns wrong rows 1..M-1 for N <= 128 at 2 <= M <= 64', measured "
            "on ROCm/aiter@e7d2453f2, MI355X, with 'TODO: link the AITER issue': no upstream report, so no "
            "backends.kernel_defects record); vLLM PR #58139 forces only 96-row scales to Triton and keeps "
            "(128, 160) on ASM. Settled by conformance.test_mxfp4_linear:check_aiter_gemm_kernel on the ASM path "
            "(the builtin subject keeps N <= 128 on gemm_a4w4) on an MI350x/MI355x (gfx950) at N = 32, 64, 128 "
            "(N = 160 as control), M = 2..64",
            f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4.py",
            applies=_small_n_asm_capable,
            raises=AssertionError,
            match=r"guard falls back to Triton for scale \(\d+, \d+\)",
            check=check,
        )
        for check in ("check_asm_guard_truth_table", "check_asm_taken_where_supported")
    ),
    KnownFailure(
        MXFP4_MOE,
        "flashinfer_mxfp4 on SM90 (CUTLASS mixed GEMM, K % 128): FusedMoE.__init__ rounds the hidden size to 256 "
        "for every flashinfer_mxfp4 layer, the SM100 trtllm-gen rule (gpt-oss 2880 -> 3072, not 2944; "
        "Mxfp4MoEMethod's comment notes it); found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=_hidden_256_over_128,
        raises=AssertionError,
        match=r"over-padding: H \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90.value,
        check="check_minimal_and_idempotent",
    ),
    KnownFailure(
        MXFP4_MOE,
        "marlin: Mxfp4MoEMethod.create_weights rounds the intermediate to 128 and the hidden size to 256 where "
        "Marlin needs ru(I, 64) and H % 128 (DeepSeek-V4.1-Flash TP8 288 -> 384, not 320; gpt-oss H 2880 -> "
        "3072, not 2944): the over-padding vLLM PR #56697 removes from vLLM; found by this suite, not reported "
        "to SGLang",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
        applies=lambda config: _inter_128_over_64(config) or _hidden_256_over_128(config),
        raises=AssertionError,
        match=r"over-padding: [IH] \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.MARLIN.value,
        check="check_minimal_and_idempotent",
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3: Mxfp4MoEMethod with gate_up_interleaved=False, "
            "per-expert w1/w3 loading) on FlashInfer TRT-LLM, FlashInfer SM90 and Marlin: the buffer's hidden size is "
            "rounded to 256 (FusedMoE.__init__ for flashinfer_mxfp4, create_weights for Marlin), but FusedMoE._load_w13 / "
            "_load_w2 copy the expert's full checkpoint width into that row, so H % 256 != 0 fails at load; no SGLang "
            "model with stacked MXFP4 experts has such H (K3 7168, MiniMax-M3 3072); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
            applies=_stacked_hidden_padded,
            raises=RuntimeError,
            match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
            backend=backend.value,
            raised_in=FUSED_MOE_LOADERS,
        )
        for backend in HIDDEN_256_BACKENDS
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm (DeepGEMM's fp8 x MXFP4 grouped GEMM): Mxfp4MoEMethod.create_weights keeps the checkpoint's "
        "sizes ('no padding'), while the runner quantizes activations to FP8 in 128-element groups along K "
        "(recipe (1, 128)): H % 128 != 0 or I/tp % 128 != 0 reach the kernel unpadded (MiniMax-M2-shaped "
        "I = 1536 at TP8: 192); SGLang's deep_gemm MXFP4 models run H 7168 / 3072; found by this suite, not "
        "reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
        applies=_deep_gemm_k_not_128,
        raises=AssertionError,
        match=r"DeepGEMM quantizes activations in 128-element groups",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
        check="check_backend_accepts",
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "deep_gemm: gpt-oss-form MXFP4 experts (row-interleaved gate/up pairs, expert biases) are handed to "
            "DeepGEMM as loaded: the branch does not de-interleave them (Mxfp4MoEMethod.process_weights_after_loading "
            "only views and re-lays the scales), the runner's activation reads GEMM1's output as [gate; up] halves, "
            "and DeepGemmMoeQuantInfo carries no biases; nothing keeps gpt-oss off --moe-runner-backend deep_gemm "
            "(model_overrides/gpt_oss.py picks it only for MUSA bf16); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
            applies=_gpt_oss_form,
            raises=AssertionError,
            match=r"reads them \(gate;up\)|reads FC1 rows as gate;up",
            backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
            check=check,
        )
        for check in ("check_gate_up_layout", "check_padding_invariance")
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm: the gpt-oss pairs handed to DeepGEMM as loaded (the entry above) sit in buffers whose layout is "
        "the [gate; up] halves the runner reads, so the policy's result declares an fc1_layout its rows are not in "
        "(harness.hygiene.FalseLayoutDeclared, raised on every call before the properties look)",
        f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
        applies=_gpt_oss_form,
        raises=AssertionError,
        match=r"holds \w+'s gate/up rows in g0,u0,g1,u1 order, but fc1_layout says gate;up\b",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm, gpt-oss-form experts with biases: the entry above seen by re-aligning the output; its rows are "
        "gpt-oss's pairs where the kernel reads [gate; up], so loading them again as gpt-oss's (biases) reorders them",
        f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
        applies=lambda config: config.bias,
        raises=AssertionError,
        match=r"not idempotent: w13 changed",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
        check="check_minimal_and_idempotent",
    ),
    KnownFailure(
        MXFP4_MOE,
        "triton_kernel: stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3: per-expert w1/w3/w2 loading into "
        "Mxfp4MoEMethod) do not load: FusedMoE._load_w13 / _load_w2 transpose every non-bias checkpoint tensor "
        "when use_triton_kernels (the unquantized triton_kernels layout), but Mxfp4MoEMethod's buffers keep the "
        "checkpoint's [E, N, K/2] orientation, so the copy raises; gpt-oss's fused loader (expert_id=None) is "
        "not affected. Were it loaded, the branch would hand triton_kernels stacked halves where its swiglu reads "
        "gate/up pairs; no guard keeps these models off --moe-runner-backend triton_kernel; found by this suite, "
        "not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: config.form is CheckpointForm.STACKED and not config.bias,
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        backend=Mxfp4MoeBackend.TRITON_SM90.value,
        raised_in=FUSED_MOE_LOADERS,
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "triton_kernel on SM90 rounds I to 64 and keeps H; _swizzle_mxfp4 pads only each GEMM's scale groups "
            "(_pad_hopper_mxfp4_scale): with H % 64 == 32 FC1's K holds an odd number of 32-element groups, which "
            "triton_kernels' Hopper matmul_ogs computes wrongly without an error whatever the scale padding (measured "
            "on an H200: backends/truth/triton-kernels-sm90.sm90.json); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
            applies=lambda config: tk.odd_groups(config.shape.hidden),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.TRITON_SM90.value,
            check=check,
        )
        for check, match in TRITON_ODD_GROUP_FAILURES
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "aiter: QuarkW4A4MXFp4MoE.create_weights (get_moe_weight_sizes(is_aiter_moe=True)) pads I to 256 but "
            "leaves H unpadded, so H % 256 != 0 reaches AITER's per_1x32 MoE: process_weights_after_loading's "
            "e8m0_shuffle pads the [E·N, H/32] scales to 8 columns and .view(E, N, -1) no longer gives H/32, and the "
            "gfx950 stage-1 kernels are built for tile_k = 256 (vLLM PR #55104); found by this suite, not reported "
            "upstream",
            f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4_moe.py",
            applies=_quark_hidden_not_256,
            raises=AssertionError,
            match=r"aiter-ck rejects|w(13|2)_scale \[.*\]: e8m0_shuffle pads",
            backend=backend.value,
            check=check,
        )
        for backend, selection in MXFP4_BACKENDS.items()
        if selection.stacked_via_quark
        for check in ("check_backend_accepts", "check_aiter_shuffle_round_trip")
    ),
    KnownFailure(
        MXFP4_MOE,
        "marlin: Mxfp4MoEMethod.process_weights_after_loading refuses the layer ('Current MXFP4 MoE layer is not "
        "supported by Marlin.') when the unpadded hidden size is not a multiple of 64 "
        "(check_moe_marlin_supports_layer with allow_tile_padding), although create_weights has padded it to 256: "
        "a loud refusal of shapes no catalogued model has; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/marlin_utils.py",
        applies=_marlin_refused_hidden,
        raises=RuntimeError,
        match=r"Current MXFP4 MoE layer is not supported by Marlin",
        backend=Mxfp4MoeBackend.MARLIN.value,
    ),
)


def _sharding_backend(config: Any) -> Nvfp4MoeBackend | Mxfp4MoeBackend:
    """The backend whose runner loads a ``ShardingConfig``'s shards (:mod:`subjects.sglang_sharding`'s default
    where none is drawn)."""
    from subjects.sglang_sharding import MXFP4_BACKEND, NVFP4_BACKEND

    return config.kernel_backend or (NVFP4_BACKEND if config.block == 16 else MXFP4_BACKEND)


def _nvfp4_unrounded(config: Any) -> bool:
    """An NVFP4 ``ShardingConfig`` whose runner allocates ``I/tp`` channels (every mapped one but TRT-LLM's)."""
    runner = NVFP4_BACKENDS.get(_sharding_backend(config))
    return runner is not None and runner.runner != "flashinfer_trtllm"


def _stacked_mxfp4(config: Any, via_quark: bool) -> bool:
    """A stacked ``[gate; up]`` MXFP4 ``ShardingConfig`` without biases loaded by Quark OCP-MX's
    ``QuarkW4A4MXFp4MoE`` (``via_quark``: the AITER backends) or else by ``Mxfp4MoEMethod``'s per-expert loader
    (the triton_kernel runner aside: it does not load them at all)."""
    runner = MXFP4_BACKENDS.get(_sharding_backend(config))
    stacked = config.gated and config.block == 32 and not config.layout.interleaved and not config.bias
    return stacked and runner is not None and runner.stacked_via_quark is via_quark and not runner.triton_kernels


UNROUNDED_MXFP4_BACKENDS = (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, Mxfp4MoeBackend.VLLM_CUTLASS)
"""The backends whose ``Mxfp4MoEMethod.create_weights`` allocates ``I/tp`` rows per half unrounded (the SM90
CUTLASS branch pads after loading; ``deep_gemm`` keeps the checkpoint's sizes)."""


def _stacked_hidden_crash(config: Any) -> bool:
    """A stacked ``ShardingConfig`` whose ``Mxfp4MoEMethod`` buffer rounds the hidden size to 256
    (:data:`HIDDEN_256_BACKENDS`) past the checkpoint's, so ``FusedMoE._load_w13`` / ``_load_w2`` fail to copy."""
    backend = _sharding_backend(config)
    return _stacked_mxfp4(config, via_quark=False) and backend in HIDDEN_256_BACKENDS and config.hidden % 256 != 0


def _even_split_cuts_groups(config: Any) -> bool:
    """A ``ShardingConfig`` SGLang's ``FusedMoE`` accepts (``I % tp``, ``E % ep``) whose even split ``I/tp``
    is not a whole number of groups."""
    part, rem = divmod(config.intermediate, config.tp)
    return rem == 0 and config.experts % config.ep_size == 0 and part % config.block != 0


SGLANG_SHARDING_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MOE_SHARDING,
        "stacked [gate; up] MXFP4 experts: the mxfp4_moe ledger's load crash (the HIDDEN_256_BACKENDS allocate the "
        "hidden size rounded to 256, FusedMoE._load_w13 / _load_w2 copy the checkpoint's full width) hits every "
        "rank's load when H % 256 != 0; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: _stacked_hidden_crash(config) and config.experts % config.ep_size == 0,
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
    ),
    KnownFailure(
        MOE_SHARDING,
        "stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3 form): FusedMoE._load_w13 / _load_w2 narrow each "
        "projection evenly, I/tp channels per rank, into the backend's buffer, so where (I/tp) % 32 != 0 "
        "a rank's channels straddle 32-groups and pair with the wrong scales: silently wrong output (the vLLM #49949 "
        "split); no SGLang model with stacked MXFP4 experts has such I/tp; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _stacked_mxfp4(config, via_quark=False)
            and not _stacked_hidden_crash(config)
            and _even_split_cuts_groups(config)
        ),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
    ),
    KnownFailure(
        MOE_SHARDING,
        "flashinfer_cutlass and flashinfer_cutedsl NVFP4 (ModelOptNvFp4FusedMoEMethod): create_weights allocates "
        "I/tp channels (only the TRT-LLM branch rounds them, to 64) and FusedMoE._load_w13 / _load_w2 narrow every "
        "tensor by its own size / tp, so where (I/tp) % 16 != 0 (Gemma-4-26B-A4B I = 704 at TP 16: 44) a rank's "
        "channels straddle 16-groups and pair with the wrong scales (the vLLM #49949 split); found by this suite, "
        "not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: config.block == 16 and _nvfp4_unrounded(config) and _even_split_cuts_groups(config),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
    ),
    KnownFailure(
        MOE_SHARDING,
        "flashinfer_mxfp4 on SM90 (CUTLASS mixed GEMM) and deep_gemm: Mxfp4MoEMethod.create_weights allocates I/tp "
        "rows per half "
        "(padding comes after loading), but GptOssForCausalLM._load_mxfp4_experts_weights narrows whole 32-blocks, "
        "cdiv(I/32, tp)·32 channels, so where (I/tp) % 32 != 0 a full rank does not fit its buffer (gpt-oss I = 2880 "
        "at TP 4: 736 > 720); found by this suite, not reported upstream (the path came with PR #24816)",
        f"{SGLANG_SOURCE}/models/gpt_oss.py",
        applies=lambda config: (
            _sharding_backend(config) in UNROUNDED_MXFP4_BACKENDS
            and config.block == 32
            and config.layout.interleaved
            and _even_split_cuts_groups(config)
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=GPT_OSS_LOADERS,
    ),
    KnownFailure(
        MOE_SHARDING,
        "Quark OCP-MX MXFP4 on AITER (QuarkW4A4MXFp4MoE): _rank_chunk_padding_loader narrows I/tp channels per rank "
        "and zero-pads them to ru(I/tp, 256), so where (I/tp) % 32 != 0 (DeepSeek-V4.1-Flash I = 2304 at TP 16: "
        "144) a rank's channels straddle 32-groups and pair with the wrong scales; found by this suite, not reported "
        "upstream",
        f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4_moe.py",
        applies=lambda config: _stacked_mxfp4(config, via_quark=True) and _even_split_cuts_groups(config),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
    ),
    KnownFailure(
        MOE_SHARDING,
        "triton_kernel: stacked [gate; up] MXFP4 experts do not load (the mxfp4_moe ledger's: FusedMoE._load_w13 / "
        "_load_w2 transpose every non-bias tensor under use_triton_kernels, Mxfp4MoEMethod's buffers keep [E, N, K/2]) "
        "on any rank; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _sharding_backend(config) is Mxfp4MoeBackend.TRITON_SM90
            and config.gated
            and not config.layout.interleaved
            and not config.bias
            and config.intermediate % config.tp == 0
            and config.experts % config.ep_size == 0
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
    ),
)
"""Upstream bugs of SGLang 0.5.23 that the ``moe_sharding`` properties meet (:mod:`subjects.sglang_sharding`)."""


register_subject(
    Subject(
        "sglang",
        f"SGLang's real alignment, placement and fallback functions (scripts/install-sglang-cpu.sh, SGLang {SGLANG_VERSION})",
        {
            NVFP4_MOE: SglangNvfp4MoeAlignment(),
            MXFP4_LINEAR: SglangQuarkMxfp4Linear(),
            MXFP4_MOE: SglangMxfp4MoeAlignment(),
            MOE_SHARDING: SglangMoeSharding(),
        },
        known_failures=SGLANG_KNOWN_FAILURES + SGLANG_SHARDING_FAILURES,
        missing=sglang_missing,
    )
)
