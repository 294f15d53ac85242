"""vLLM 0.33.0's default FP4 MoE backend for a catalogued model on a hardware class, read from its own oracle.

:func:`default_backend` calls the selection function the model's quantization method calls in its
constructor (``GptOssMxfp4MoEMethod``: ``select_mxfp4_moe_backend``; DeepSeek-V4's FP4 experts:
``select_deepseek_v4_mxfp4_moe_backend``; ``ModelOptNvFp4FusedMoE``: ``select_nvfp4_moe_backend`` with
``kNvfp4Static`` x ``kNvfp4Dynamic``) on vLLM's own ``FusedMoEConfig`` of the model's layer (``moe_backend``
``"auto"``: flags at default), with the platform faked: ``current_platform`` is CUDA of the hardware's
capability, and the libraries vLLM 0.33.0's CUDA wheel requires or vendors (``flashinfer-python==0.7.2.post1``
in its metadata; ``vllm/third_party/triton_kernels``, ``deep_gemm``) are reported present. The model's
checkpoint-declared activation override (``quantization_config.moe``) is absent, as in the public checkpoints.
ROCm (gfx950) is not faked: vLLM's ROCm selection reads ``vllm.platforms.rocm`` and AITER's availability, which
query the GPU at import.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import sys
import types
from collections.abc import Iterator
from unittest import mock

import torch

from reference.moe import ActivationKind
from strategies.catalog import MODELS
from subjects.engine_tools import (
    FP4_CHECKPOINTS,
    DefaultChoice,
    Fp4Checkpoint,
    Hardware,
    UnmappedBackend,
    mapped_member,
)
from subjects.vllm.bridge import MXFP4_BACKENDS, NVFP4_BACKENDS, sharding_modules

VERSION = "vLLM 0.33.0"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle"

LIBRARY_PROBES = (
    "has_flashinfer",
    "has_flashinfer_moe",
    "has_flashinfer_cutlass_fused_moe",
    "has_flashinfer_trtllm_fused_moe",
    "has_flashinfer_cutedsl",
    "has_triton_kernels",
    "has_deep_gemm",
)
"""vLLM's probes for the libraries its CUDA wheel requires or vendors, reported present on the faked GPU."""

SELECTORS = {
    Fp4Checkpoint.GPT_OSS_MXFP4: "mxfp4.select_mxfp4_moe_backend",
    Fp4Checkpoint.DSV4_FP4_EXPERTS: "mxfp4.select_deepseek_v4_mxfp4_moe_backend",
    Fp4Checkpoint.MODELOPT_NVFP4: "nvfp4.select_nvfp4_moe_backend",
}
"""The oracle function each checkpoint's quantization method calls (``quantization/mxfp4.py``, ``modelopt.py``)."""


@contextlib.contextmanager
def cuda_platform(capability: tuple[int, int]) -> Iterator[None]:
    """vLLM's ``current_platform`` answering as a CUDA GPU of ``capability`` (its class's ``_enum`` and
    ``get_device_capability``, which ``is_device_capability*`` and ``has_device_capability`` read), and every
    loaded vLLM module's :data:`LIBRARY_PROBES` answering ``True``."""
    from vllm.platforms import PlatformEnum, current_platform
    from vllm.platforms.interface import DeviceCapability

    cls = type(current_platform)
    patches = [
        mock.patch.object(cls, "_enum", PlatformEnum.CUDA),
        mock.patch.object(
            cls, "get_device_capability", classmethod(lambda c, device_id=0: DeviceCapability(*capability))
        ),
        mock.patch.object(cls, "device_name", f"sm{capability[0]}{capability[1]}", create=True),
    ]
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and module is not None:
            patches += [
                mock.patch.object(module, probe, lambda: True)
                for probe in LIBRARY_PROBES
                if getattr(getattr(module, probe, None), "__module__", "").startswith("vllm.utils")
            ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def _moe_config(v: types.SimpleNamespace, model: str, checkpoint: Fp4Checkpoint, tp: int, ep: int):
    """vLLM's ``FusedMoEConfig`` of ``model``'s routed experts at ``tp`` x ``ep`` (``FusedMoEParallelConfig.make``
    as in :mod:`subjects.vllm.sharding`), with the activation, biases and routing the model's vLLM class passes."""
    m, act = MODELS[model], v.activation.MoEActivation
    activation = {
        ActivationKind.SWIGLU_OAI: act.SWIGLUOAI,
        ActivationKind.GEGLU: act.GELU_TANH,  # Gemma4MoE passes "gelu_tanh"
        ActivationKind.RELU2: act.RELU2_NO_MUL,
    }.get(m.activation.kind, act.SILU)
    flags = types.SimpleNamespace(
        enable_expert_parallel=ep > 1, all2all_backend="allgather_reducescatter", enable_eplb=False
    )
    with mock.patch.object(v.config, "get_tensor_model_parallel_rank", lambda: 0):
        parallel = v.config.FusedMoEParallelConfig.make(
            tp_size_=tp * ep, pcp_size_=1, dp_size_=1, sp_size_=1, vllm_parallel_config=flags
        )
    routing = v.config.RoutingMethodType
    return v.config.FusedMoEConfig(
        num_experts=m.experts, experts_per_token=m.top_k, hidden_dim=m.hidden, intermediate_size=m.moe_intermediate,
        num_local_experts=m.experts // ep, num_logical_experts=m.experts, activation=activation, device="cpu",
        routing_method=routing.DeepseekV4 if checkpoint is Fp4Checkpoint.DSV4_FP4_EXPERTS else routing.Renormalize,
        moe_parallel_config=parallel, in_dtype=torch.bfloat16, has_bias=m.expert_biases,
    )  # fmt: skip


def _suite_member(v: types.SimpleNamespace, engine_backend: object, nvfp4: bool) -> enum.Enum:
    """The suite's record member for vLLM's chosen backend (the inverse of :data:`NVFP4_BACKENDS` /
    :data:`MXFP4_BACKENDS`); an MXFP4 member of vLLM's ``TRTLLM_BACKENDS`` (one weight format) maps as its
    BF16-activation variant does."""
    if nvfp4:
        return mapped_member(NVFP4_BACKENDS, (engine_backend.name, False))
    name = engine_backend.name
    if engine_backend in v.mxfp4_oracle.TRTLLM_BACKENDS:
        name = v.mxfp4_oracle.Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_BF16.name
    return mapped_member(MXFP4_BACKENDS, name)


def default_backend(model: str, hardware: Hardware, tp: int, ep: int = 1) -> DefaultChoice:
    """vLLM 0.33.0's default FP4 MoE backend for ``model`` (a :data:`~subjects.engine_tools.FP4_CHECKPOINTS` key)
    on ``hardware`` at ``tp`` x ``ep``, every flag at its default (see the module docstring for what is faked)."""
    if model not in FP4_CHECKPOINTS:
        return DefaultChoice(None, f"{model} has no catalogued FP4 checkpoint", ())
    checkpoint, _ = FP4_CHECKPOINTS[model]
    selector = SELECTORS.get(checkpoint)
    if selector is None:
        return DefaultChoice(
            None,
            f"{checkpoint.value}: QuarkOCP_MX_MoEMethod's selection depends on the checkpoint's declared "
            "activation scheme, which the catalogue does not hold",
            (),
        )
    consulted = (f"{ORACLE}/{selector.replace('.', '.py:')} ({VERSION})",)
    if hardware.capability is None:
        return DefaultChoice(
            None,
            "vLLM's ROCm selection reads vllm.platforms.rocm and AITER's availability, which query the GPU at "
            "import; not faked on CPU",
            consulted,
        )
    v = sharding_modules()
    module, function = selector.split(".")
    select = getattr(importlib.import_module(f"vllm.model_executor.layers.fused_moe.oracle.{module}"), function)
    oracle = v.mxfp4_oracle  # its get_current_vllm_config: no quantization_config override (flags at default)
    no_override = types.SimpleNamespace(model_config=types.SimpleNamespace(quantization_config=None))
    nvfp4 = checkpoint is Fp4Checkpoint.MODELOPT_NVFP4
    with cuda_platform(hardware.capability), mock.patch.object(oracle, "get_current_vllm_config", lambda: no_override):
        try:
            config = _moe_config(v, model, checkpoint, tp, ep)
        except AssertionError as exc:
            return DefaultChoice(None, f"vLLM's FusedMoEConfig refuses TP={tp} EP={ep}: {exc}", consulted)
        try:
            if nvfp4:
                qu = importlib.import_module("vllm.model_executor.layers.quantization.utils.quant_utils")
                chosen, kernel = select(config, qu.kNvfp4Static, qu.kNvfp4Dynamic)
            else:
                chosen, kernel = select(config)
        except (NotImplementedError, ValueError) as exc:
            return DefaultChoice(None, f"vLLM selects no backend: {exc}", consulted)
    said = f"vLLM selects {chosen.name} ({kernel.__name__})"
    try:
        return DefaultChoice(_suite_member(v, chosen, nvfp4), said, consulted)
    except UnmappedBackend:
        return DefaultChoice(None, f"{said}, a kernel the suite has no backend record for", consulted)
