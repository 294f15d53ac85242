"""SGLang 0.5.23 for the ``sglang`` and ``sglang-deepseek-v4`` subjects: its lazy import with every symbol the
adapters use checked, the errors they raise, and the mapping of the suite's backend records to SGLang's runners.

Importing this module does not import SGLang: :func:`sglang_modules` does, once (:class:`SglangUnavailable`
where it fails, :class:`SglangSourceMismatch` naming each missing symbol). Each contract's backend records map
to how SGLang runs them (:data:`NVFP4_BACKENDS`, :data:`MXFP4_BACKENDS`, :data:`LINEAR_PATHS`,
:data:`FP8_BACKENDS`), or to the reason it cannot (:data:`NVFP4_NOT_MAPPED`, :data:`MXFP4_NOT_MAPPED`,
:data:`FP8_TENSOR_NOT_MAPPED`), all in :data:`BACKEND_MAPS`.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass

from backends.fp8_moe import CONTRACT as FP8_MOE
from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import CONTRACT as FP8_TENSOR_MOE
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from reference.layouts import Fc1Layout
from subjects.engine_tools import BackendMap, StandInPackage, not_mapped_reason

SGLANG_VERSION = "0.5.23"
"""The SGLang release the adapters were written against (``scripts/install-sglang-cpu.sh`` pins it)."""


class SglangUnavailable(RuntimeError):
    """SGLang is not importable here."""


class SglangSourceMismatch(RuntimeError):
    """SGLang no longer has a symbol or structure an adapter relies on: an SGLang change, or an
    adapter to update. Deliberately not a ``ValueError``, which properties read as a refusal."""


REQUIRED_SYMBOLS = {
    "sglang.srt.layers.moe.fused_moe_triton.layer": ("FusedMoE", "narrow_padded_param_and_loaded_weight"),
    "sglang.srt.layers.moe.moe_runner.base": ("MoeRunnerConfig",),
    "sglang.srt.layers.moe.utils": ("MoeA2ABackend", "MoeRunnerBackend", "get_moe_runner_backend"),
    "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm": (
        "align_fp4_moe_weights_for_flashinfer_trtllm",
        "align_fp8_moe_weights_for_flashinfer_trtllm",
        "trtllm_nvfp4_hidden_alignment",
    ),
    "sglang.srt.layers.quantization.modelopt_quant": ("ModelOptFp4Config", "ModelOptNvFp4FusedMoEMethod"),
    "sglang.srt.layers.quantization.fp8": ("Fp8Config", "Fp8MoEMethod", "scaled_fp8_quant"),
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

    Where torchvision is not installed, a :class:`~subjects.engine_tools.StandInPackage` for it is put on ``sys.meta_path``
    first. Raises :class:`SglangUnavailable` when SGLang does not import, and
    :class:`SglangSourceMismatch` naming each missing symbol.
    """
    if importlib.util.find_spec("sglang") is None:
        raise SglangUnavailable("SGLang is not installed; run scripts/install-sglang-cpu.sh")
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(StandInPackage("torchvision"))
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
        fp8=modules["sglang.srt.layers.quantization.fp8"],
        quant_utils=modules["sglang.srt.layers.quantization.utils"],
        ctx=modules["sglang.srt.runtime_context"],
        quark_w4a4=modules["sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4"],
        mxfp4=modules["sglang.srt.layers.quantization.mxfp4"],
        marlin_fp4=modules["sglang.srt.layers.quantization.marlin_utils_fp4"],
        gpt_oss=modules["sglang.srt.models.gpt_oss"],
        quark=modules["sglang.srt.layers.quantization.quark.quark"],
        quark_moe=modules["sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4_moe"],
    )


SGLANG_SOURCE = f"https://github.com/sgl-project/sglang/blob/v{SGLANG_VERSION}/python/sglang/srt"
"""SGLang's source at the adapted release, for ledger entries that cite a line rather than an issue."""


# --- the backend mapping ---------------------------------------------------------------------------


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
    its first argument (:func:`~subjects.engine_tools.stand_in_function`; their outputs are layouts the adapter does not read).
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


@dataclass(frozen=True)
class SglangMxfp4Backend:
    """How SGLang 0.5.23 runs one of the suite's MXFP4 MoE backends for gpt-oss-style checkpoints.

    ``runner``: the ``--moe-runner-backend``; ``platform``: the platform facts (``override_platform``);
    ``switches``: module-level switches of ``quantization/mxfp4.py`` that SGLang reads from the
    environment at import; ``device_calls``: the GPU-only calls of ``Mxfp4MoEMethod.process_weights_after_loading``
    on this branch, ``(module, name)`` with ``module`` in :func:`sglang_modules`' namespace or a module the branch
    imports from when it runs (:func:`~subjects.engine_tools.stand_in_function`), each replaced by a pass-through of its first argument
    or its :data:`subjects.sglang.mxfp4_moe.DEVICE_STAND_INS` entry (its input is what the adapter reports; the properties run the
    libraries' transforms themselves); ``fc1_layout``: the FC1 row order SGLang's post-load processing leaves in the
    buffer it hands those calls (read from the branch's source); ``stacked_via_quark``: stacked ``[gate; up]``
    checkpoints on this backend are Quark OCP-MX ones, served by ``QuarkW4A4MXFp4MoE`` (:func:`subjects.sglang.mxfp4_moe.quark_layer`);
    ``triton_kernels``: the branch hands the layer to triton_kernels' ``convert_layout`` (through
    ``_swizzle_mxfp4``), read back by :func:`subjects.sglang.mxfp4_moe.process_triton_kernels_layer`.
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


@dataclass(frozen=True)
class SglangFp8Backend:
    """How SGLang 0.5.23 runs one of the suite's FP8 MoE backends for an ``Fp8Config`` checkpoint (``Fp8MoEMethod``).

    ``runner``: the ``--moe-runner-backend``; ``platform``: the platform facts (``override_platform``);
    ``fc1_layout``: the FC1 row order ``FusedMoE.weight_loader`` leaves in ``w13_weight`` (under
    ``flashinfer_trtllm`` ``_weight_loader_impl`` swaps the ``w1`` / ``w3`` shard ids of an ``Fp8MoEMethod``
    layer, so up lands first).
    """

    runner: str
    platform: dict[str, bool]
    fc1_layout: Fc1Layout


HOPPER = {"is_sm90": True, "is_sm100": False, "is_blackwell": False, "is_cuda": True, "is_hip": False}
"""Platform facts of an H100 / H200 (SM90), where SGLang's block-FP8 MoE default is the Triton runner."""

BLACKWELL = {"is_blackwell": True, "is_sm100": True, "is_cuda": True, "is_hip": False}
"""Platform facts of a B200 (SM100), where SGLang runs the FlashInfer TRT-LLM MoE kernels."""

FP8_BACKENDS: dict[Fp8MoeBackend, SglangFp8Backend] = {
    # --moe-runner-backend triton (what `auto` resolves to without DeepGEMM or AITER, Fp8MoEMethod.create_moe_runner):
    # the buffers as create_fp8_moe_weight_ allocates them (I/tp, refused unless a multiple of block_n = 128);
    # process_weights_after_loading_block_quant leaves them (requant_block_scale_ue8m0_for_deepgemm is DeepGEMM's)
    Fp8MoeBackend.TRITON: SglangFp8Backend("triton", HOPPER, Fc1Layout.GATE_UP),
    # --moe-runner-backend flashinfer_trtllm: FusedMoE.__init__ rounds I/tp up to 128 for every method but
    # ModelOpt NVFP4, the loader swaps the halves ([up; gate]) and zero-fills each half's tail; the kernel
    # (trtllm_fp8_block_scale_moe, DeepSeekFp8) reads the buffers as loaded
    Fp8MoeBackend.FLASHINFER_TRTLLM: SglangFp8Backend("flashinfer_trtllm", BLACKWELL, Fc1Layout.UP_GATE),
}
"""The suite's block-FP8 MoE backends as SGLang selects and loads them for ``Fp8MoEMethod``."""

FP8_TENSOR_NOT_MAPPED: dict[Fp8TensorMoeBackend, str] = {
    Fp8TensorMoeBackend.FLASHINFER_TRTLLM_STAGED: (
        "SGLang 0.5.23 has no path to FlashInfer's staged per-tensor FP8 MoE (trtllm_moe_run_routing_fp8_per_tensor): "
        "its per-tensor FP8 runner calls the fused trtllm_fp8_per_tensor_scale_moe "
        "(srt/layers/moe/moe_runner/flashinfer_trtllm.py _run_fp8_per_tensor_scale_moe -> "
        "srt/layers/moe/flashinfer_trtllm_moe.py trtllm_fp8_per_tensor_scale_moe_wrapper), a kernel the suite "
        "has no record for; no module of the release names the staged entry point"
    ),
}
"""The suite's per-tensor FP8 MoE backends SGLang 0.5.23 cannot run, each with the source that shows it."""


LINEAR_PATHS: dict[AiterLinearPath, bool] = {AiterLinearPath.ASM: True, AiterLinearPath.TRITON: False}
"""The suite's AITER linear paths as the layer's ``use_aiter_asm_fp4_gemm`` after
``QuarkW4A4MXFP4.process_weights_after_loading``, on which ``apply_weights`` branches: ASM where set, Triton
otherwise."""

BACKEND_MAPS: dict[str, BackendMap] = {
    NVFP4_MOE: BackendMap(NVFP4_BACKENDS, NVFP4_NOT_MAPPED),
    MXFP4_MOE: BackendMap(MXFP4_BACKENDS, MXFP4_NOT_MAPPED),
    MXFP4_LINEAR: BackendMap(LINEAR_PATHS, {}),
    FP8_MOE: BackendMap(FP8_BACKENDS, {}),
    FP8_TENSOR_MOE: BackendMap({}, FP8_TENSOR_NOT_MAPPED),
}
"""Every backend record of the contracts the ``sglang`` subject implements, mapped or not (``moe_sharding`` has
no backend records of its own; it loads under the MoE ones)."""


def not_mapped(backend: enum.Enum) -> str:
    """Why the ``sglang`` subject does not run ``backend`` (:data:`BACKEND_MAPS`; a backend it neither maps nor
    explains raises :class:`~subjects.engine_tools.UnmappedBackend`)."""
    return not_mapped_reason(BACKEND_MAPS, backend, "the sglang subject")
