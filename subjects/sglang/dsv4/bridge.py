"""SGLang 0.5.23's DeepSeek-V4 FP4 expert path for the ``sglang-deepseek-v4`` subject: the modules and symbols
it needs beyond :mod:`subjects.sglang.bridge`'s (:func:`dsv4_modules`), the stand-ins for its GPU-only calls and
the mapping of the suite's MXFP4 MoE backend records to SGLang's FP4 expert methods (:data:`BACKEND_MAPS`)."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adapters import flashinfer as fi
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from reference.layouts import Fc1Layout
from subjects.engine_tools import BackendMap, not_mapped_reason, pass_through
from subjects.sglang.bridge import import_required, sglang_modules, source_matches

DSV4_REQUIRED_SYMBOLS = {
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
"""Every symbol the DeepSeek-V4 adapters call or patch, by module (besides :data:`subjects.sglang.bridge.REQUIRED_SYMBOLS`,
which holds ``Fp8Config`` and ``Fp8MoEMethod``: ``m.fp8``):
:func:`dsv4_modules` checks them all at import, so a moved or renamed one fails loudly, naming it."""

DSV4_ATTRIBUTES = (
    ("DeepseekV4ForCausalLM", "remap_weight_name_to_dpsk_hf_format"),
    ("FusedMoE", "make_expert_params_mapping"),
)
"""Class attributes the loader calls (:func:`load_dsv4_experts`), checked with the symbols."""


@functools.cache
def dsv4_modules() -> types.SimpleNamespace:
    """:func:`subjects.sglang.bridge.sglang_modules` plus the modules of :data:`DSV4_REQUIRED_SYMBOLS`, every symbol and
    :data:`DSV4_ATTRIBUTES` checked: :class:`~subjects.sglang.bridge.SglangSourceMismatch` names each missing one."""
    m = sglang_modules()
    modules, missing = import_required(DSV4_REQUIRED_SYMBOLS, "SGLang's DeepSeek-V4 path")
    dsv4 = modules["sglang.srt.models.deepseek_v4"]
    owners = {"DeepseekV4ForCausalLM": getattr(dsv4, "DeepseekV4ForCausalLM", None), "FusedMoE": m.FusedMoE}
    missing += [f"{cls}.{attr}" for cls, attr in DSV4_ATTRIBUTES if not hasattr(owners[cls], attr)]
    source_matches(missing)
    return types.SimpleNamespace(
        **vars(m),
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
    the method's source); ``read``: how the prepared buffers are read back (:data:`subjects.sglang.dsv4.mxfp4_moe.READERS`).
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
            ("dsv4_trtllm", "block_scale_interleave", pass_through),
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
            ("fi_fused_moe", "interleave_moe_weights_for_sm90_mixed_gemm", pass_through),
            ("fi_fused_moe", "interleave_moe_scales_for_sm90_mixed_gemm", pass_through),
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
            ("marlin_fp4", "_repack_moe_fp4_weight_for_marlin", pass_through),
            ("marlin_fp4", "_permute_moe_fp4_scales_for_marlin", pass_through),
        ),
        Fc1Layout.GATE_UP,
        "marlin_scale",
    ),
}
"""The suite's MXFP4 MoE backends as SGLang prepares DeepSeek-V4's FP4 experts for them (:data:`DSV4_NOT_MAPPED`:
those it has no such method for). The SM120 CUTLASS MXFP8 x MXFP4 and SM90 Humming W4A8 variants of these methods
have no suite record."""

_FP4_EXPERT_METHODS = (
    "Fp8Config.get_quant_method gives FP4 experts a method of their own only under --moe-runner-backend marlin, "
    "humming and flashinfer_mxfp4 (srt/layers/quantization/fp8.py)"
)

DSV4_NOT_MAPPED: dict[Mxfp4MoeBackend, str] = {
    **dict.fromkeys(
        (Mxfp4MoeBackend.AITER, Mxfp4MoeBackend.AITER_A16W4),
        "SGLang 0.5.23 runs DeepSeek-V4's FP4 experts on ROCm in Fp8MoEMethod's own AITER arm "
        "(process_weights_after_loading_block_quant, 'if _use_aiter and self.is_fp4_expert': the FlyDSL kernel, "
        "K padded to 128; srt/layers/quantization/fp8.py), not in an FP4 expert method this subject adapts",
    ),
    Mxfp4MoeBackend.B12X: (
        "SGLang 0.5.23 has no path to FlashInfer's b12x MXFP4 MoE: no module of the release imports b12x; on SM120 "
        "Mxfp4FlashinferCutlassMoEMethod runs MXFP8 x MXFP4, a kernel the suite has no record for"
    ),
    Mxfp4MoeBackend.VLLM_CUTLASS: (
        f"{_FP4_EXPERT_METHODS}; under deep_gemm they stay in Fp8MoEMethod, whose FP4 arm (DeepGEMM's "
        "transform_sf_into_required_layout) this subject does not adapt"
    ),
    Mxfp4MoeBackend.TRITON_SM90: (
        f"{_FP4_EXPERT_METHODS}; under triton_kernel they stay in Fp8MoEMethod, not a triton_kernels MXFP4 method"
    ),
    Mxfp4MoeBackend.FLASHINFER_MOE_EP: (
        "SGLang 0.5.23 feeds FlashInfer's MoE-EP DeepGEMM megakernel DeepSeek-V4's FP4 experts only from "
        "Fp8MoEMethod's FP4 arm under --moe-a2a-backend flashinfer_megamoe "
        "(prepare_fp4_moe_weights_for_flashinfer_megamoe, srt/layers/moe/flashinfer_megamoe.py; "
        "srt/layers/quantization/fp8.py), an expert-parallel all-to-all path this subject does not adapt"
    ),
}
"""The suite's MXFP4 MoE backends SGLang 0.5.23 has no DeepSeek-V4 FP4 expert method for, each with the source
that shows it: they skip with that reason."""

BACKEND_MAPS: dict[str, BackendMap] = {MXFP4_MOE: BackendMap(DSV4_BACKENDS, DSV4_NOT_MAPPED)}
"""Every backend record of the contracts the ``sglang-deepseek-v4`` subject implements, mapped or not
(``moe_sharding`` loads under the MXFP4 MoE ones)."""


def not_mapped(backend: Mxfp4MoeBackend) -> str:
    """Why the ``sglang-deepseek-v4`` subject does not run ``backend`` (:data:`BACKEND_MAPS`; a backend it neither
    maps nor explains raises :class:`~subjects.engine_tools.UnmappedBackend`)."""
    return not_mapped_reason(BACKEND_MAPS, backend, "the sglang-deepseek-v4 subject")
