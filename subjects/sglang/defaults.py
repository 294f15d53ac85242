"""SGLang 0.5.23's default FP4 MoE runner for a catalogued model on a hardware class, read from its own overrides.

SGLang decides a model's ``--moe-runner-backend`` when it is left at ``auto`` in the model-family override
declarations of ``srt/arg_groups/model_overrides/`` (``gpt_oss.py``: ``flashinfer_mxfp4`` on SM100 and, since
SGLang PR #32668, SM120; ``deepseek_v4.py``: ``flashinfer_mxfp4`` on SM90/SM100/SM120 for FP4 experts, SM90
since SGLang PR #35919). :func:`default_backend` calls ``collect_model_override_declarations`` (the function
``ServerArgs`` resolution calls, ``srt/arg_groups/overrides.py``) for the model's architecture on a
``ServerArgs`` with every flag at its default (``device`` ``cuda``, as SGLang resolves it on a GPU), under
``override_platform`` with the hardware's facts (FlashInfer present on CUDA: ``flashinfer_python[cu13]==0.7.2``
is a requirement of the release). The checkpoint enters as a Hugging Face config stand-in carrying its
architecture and ``quantization_config``, and a ``ModelConfig`` stand-in carrying ``quantization``,
``is_fp4_experts`` and ``nvfp4_moe_meta``; an override that reads anything else, or a machine fact a CPU
machine cannot fake (the NVIDIA driver version, whether the optional ``triton_kernels`` package is installed),
makes the cell undetermined, naming it (:class:`~subjects.engine_tools.Undetermined`).

The runner and the hardware map back to the suite's backend record through the subject's own maps
(:data:`subjects.sglang.bridge.MXFP4_BACKENDS` and ``NVFP4_BACKENDS``; DeepSeek-V4's FP4 experts through
:data:`subjects.sglang.dsv4.bridge.DSV4_BACKENDS`): the member whose runner is the one chosen and whose platform
facts the hardware has. ``flashinfer_mxfp4`` on SM120 (FlashInfer's CUTLASS MXFP8 x MXFP4 kernel) has no record;
its weights load as on SM90 (``DefaultChoice.loader``: the SM90 CUTLASS record): ``Mxfp4MoEMethod.create_weights``
allocates ``I/tp`` rows per half in one branch for ``cutlass_sm90`` and ``cutlass_sm120``
(``layers/quantization/mxfp4.py:493-516``), and ``Fp8Config`` maps DeepSeek-V4's FP4 experts to
``Mxfp4FlashinferCutlassMoEMethod`` on both (findings/sglang-gpt-oss-mxfp4-cutlass-tp-load,
findings/sglang-dsv4-cutlass-refuses-default).
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import types
from collections.abc import Mapping
from typing import Any
from unittest import mock

from backends.mxfp4_moe import Mxfp4MoeBackend
from subjects.engine_tools import FP4_CHECKPOINTS, DefaultChoice, Fp4Checkpoint, Hardware, Undetermined
from subjects.sglang.bridge import MXFP4_BACKENDS, NVFP4_BACKENDS, SGLANG_VERSION, sglang_modules
from subjects.sglang.dsv4.bridge import DSV4_BACKENDS
from subjects.sglang.layer import moe_backend

CONSULTED = (
    f"srt/arg_groups/overrides.py:collect_model_override_declarations (SGLang {SGLANG_VERSION})",
    f"srt/arg_groups/model_overrides/*.py (SGLang {SGLANG_VERSION})",
)

HF_CONFIGS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "gpt-oss-20b": ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}, ()),
    "gpt-oss-120b": ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}, ()),
    "deepseek-v4": ({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}, ()),
    "deepseek-v4.1-flash": ({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v41"}, ()),
    "gemma-4-26b-a4b": ({"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4"}, ()),
    "nemotron-3-nano-30b-a3b": (
        {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "mlp_hidden_act": "relu2"},
        (),
    ),
    "kimi-k2": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"}, ("index_topk",)),
    "qwen3.8-flash-next": ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}, ()),
    "minimax-m2": ({"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2"}, ()),
}
"""What SGLang's overrides read of each :data:`~subjects.engine_tools.FP4_CHECKPOINTS` model's ``config.json``
(``architectures``, ``model_type``, ...), and the attributes its config does not have (Kimi-K2's DeepSeek-V3
config has no DSA ``index_topk``); the ``quantization_config`` is the checkpoint kind's."""

CHECKPOINT_CONFIG: dict[Fp4Checkpoint, tuple[dict[str, Any], dict[str, Any]]] = {
    Fp4Checkpoint.GPT_OSS_MXFP4: ({"quant_method": "mxfp4"}, {"quantization": "mxfp4", "is_fp4_experts": False}),
    Fp4Checkpoint.DSV4_FP4_EXPERTS: (
        {"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
        {"quantization": "fp8", "is_fp4_experts": True, "nvfp4_moe_meta": None},
    ),
    Fp4Checkpoint.MODELOPT_NVFP4: (
        {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        {"quantization": "modelopt_fp4", "is_fp4_experts": False, "nvfp4_moe_meta": None},
    ),
    Fp4Checkpoint.QUARK_MXFP4: ({"quant_method": "quark"}, {"quantization": "quark", "is_fp4_experts": False}),
}
"""Each checkpoint kind's ``quantization_config`` (Hugging Face config) and the ``ModelConfig`` facts SGLang
derives from it (``model_loader/loader.py`` sets ``is_fp4_experts`` for DeepSeek-V4's FP4 experts)."""

_FALSE = ("is_cuda", "is_hip", "is_npu", "is_xpu", "is_musa", "is_mps", "is_sm90", "is_sm100", "is_sm100_or_sm110",
          "is_sm110", "is_sm120", "is_blackwell", "is_hopper_with_cuda_12_3", "has_amx", "has_flashinfer")  # fmt: skip
PLATFORM_FACTS: dict[Hardware, dict[str, Any]] = {
    Hardware.SM90: {"is_cuda": True, "is_sm90": True, "is_hopper_with_cuda_12_3": True, "device_capability": (9, 0)},
    Hardware.SM100: {"is_cuda": True, "is_sm100": True, "is_sm100_or_sm110": True, "is_blackwell": True,
                     "device_capability": (10, 0)},
    Hardware.SM120: {"is_cuda": True, "is_sm120": True, "is_blackwell": True, "device_capability": (12, 0)},
    Hardware.GFX950: {"is_hip": True},
}  # fmt: skip
"""SGLang's platform facts (``runtime_context._PLATFORM_PROBES``) on each hardware class; unnamed ones are false,
``has_flashinfer`` is true on CUDA."""


class _Known(types.SimpleNamespace):
    """A stand-in whose ``absent`` attributes are missing (``AttributeError``) and whose other unknown attributes
    raise :class:`Undetermined` naming them."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in self._absent:
            raise AttributeError(name)
        raise Undetermined(f"the override reads {self._what}.{name}, which the catalogue does not hold")


def _probe(name: str, what: str, answers: Mapping[str, Any]) -> Any:
    """A machine probe: ``answers[name]`` where given, else :class:`Undetermined` naming ``what``."""

    def probe(*_: object, **__: object) -> Any:
        if name in answers:
            return answers[name]
        raise Undetermined(name, f"the override reads {what}, a fact of the deployed machine")

    return probe


MACHINE_PROBES = {
    "get_nvidia_driver_version": "the NVIDIA driver version",
    "is_triton_kernels_available": "whether the optional triton_kernels package is installed (not a requirement "
    "of SGLang 0.5.23)",
}
"""Functions the override modules import that read the machine, each raising :class:`Undetermined` here unless
answered; a yes/no one is answered both ways by :func:`default_backend`."""


def runner_overrides(
    model: str, hardware: Hardware, tp: int, ep: int, answers: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The declarations SGLang's model overrides make for ``model`` on ``hardware`` at ``tp`` x ``ep`` with every
        other flag at its default, merged in SGLang's order (last writer wins); ``answers``: machine probes answered
    (:data:`MACHINE_PROBES`)."""
    sglang_modules()
    server_args_mod = importlib.import_module("sglang.srt.server_args")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    checkpoint, _ = FP4_CHECKPOINTS[model]
    quantization_config, model_facts = CHECKPOINT_CONFIG[checkpoint]
    args = server_args_mod.ServerArgs(model_path="dummy", tp_size=tp * ep, ep_size=ep)
    args.device = "cuda"
    args._model_config = _Known(_what="ModelConfig", _absent=(), **model_facts)
    known, absent = HF_CONFIGS[model]
    hf_config = _Known(_what="hf_config", _absent=absent, quantization_config=quantization_config, **known)
    facts = {fact: False for fact in _FALSE} | {"has_flashinfer": hardware.capability is not None}
    facts |= PLATFORM_FACTS[hardware]
    modules = [importlib.import_module(m) for m in _override_modules()]
    patches = [
        mock.patch.object(module, name, _probe(name, what, answers or {}))
        for module in modules
        for name, what in MACHINE_PROBES.items()
        if hasattr(module, name)
    ]
    with contextlib.ExitStack() as stack:
        stack.enter_context(sglang_modules().ctx.override_platform(**facts))
        for patch in patches:
            stack.enter_context(patch)
        merged: dict[str, Any] = {}
        for _source, declared in overrides.collect_model_override_declarations(
            known["architectures"][0], args, hf_config
        ):
            merged.update(declared)
    return merged


def _override_modules() -> list[str]:
    """The modules of ``srt/arg_groups/model_overrides/`` (SGLang imports each to register it)."""
    package = importlib.import_module("sglang.srt.arg_groups.model_overrides")
    return [
        f"{package.__name__}.{name}" for name in dir(package) if isinstance(getattr(package, name), types.ModuleType)
    ]


def _member(backends: Mapping[enum.Enum, Any], runner: str, facts: dict[str, Any], stacked: bool) -> list[enum.Enum]:
    """The members of ``backends`` (a bridge map) run by ``runner`` whose platform facts ``facts`` has; an MXFP4
    member served through Quark only for stacked checkpoints counts only where ``stacked``."""
    return [
        member
        for member, how in backends.items()
        if how.runner == runner
        and all(facts.get(k, False) == v for k, v in getattr(how, "platform", {}).items())
        and getattr(how, "stacked_via_quark", False) == stacked
    ]


def default_backend(model: str, hardware: Hardware, tp: int, ep: int = 1) -> DefaultChoice:
    """SGLang 0.5.23's default FP4 MoE backend for ``model`` (a :data:`~subjects.engine_tools.FP4_CHECKPOINTS` key)
    on ``hardware`` at ``tp`` x ``ep`` (see the module docstring for what is faked). Where the overrides read a
    yes/no machine probe, the choice is undetermined and the reason gives the backend under either answer."""
    if model not in FP4_CHECKPOINTS:
        return DefaultChoice(None, f"{model} has no catalogued FP4 checkpoint", ())
    try:
        return _choice(model, hardware, runner_overrides(model, hardware, tp, ep).get("moe_runner_backend", "auto"))
    except Undetermined as exc:
        if len(exc.args) != 2:
            return DefaultChoice(None, f"undetermined: {exc}", CONSULTED)
        probe, what = exc.args
    branches = []
    for answer in (True, False):
        try:
            runner = runner_overrides(model, hardware, tp, ep, {probe: answer}).get("moe_runner_backend", "auto")
        except Undetermined as exc:
            branches.append(f"{probe}() {answer}: undetermined, {exc.args[-1]}")
            continue
        chosen = _choice(model, hardware, runner)
        branches.append(f"{probe}() {answer}: {chosen.backend.value if chosen.backend else chosen.reason}")
    return DefaultChoice(None, f"undetermined: {what}; " + "; ".join(branches), CONSULTED)


def _choice(model: str, hardware: Hardware, runner: str) -> DefaultChoice:
    """The suite's record member for SGLang's ``runner`` on ``hardware`` for ``model``'s checkpoint (the inverse
    of the subject's bridge map), or why there is none."""
    checkpoint, _ = FP4_CHECKPOINTS[model]
    said = f"SGLang's model overrides set --moe-runner-backend {runner}"
    if runner == "auto":
        return DefaultChoice(
            None,
            f"{said}: the quantization method resolves auto when the layer is built (its constructor and "
            "create_moe_runner), which this reading of the overrides does not build",
            CONSULTED,
        )
    facts = {fact: False for fact in _FALSE} | PLATFORM_FACTS[hardware]
    if checkpoint is Fp4Checkpoint.DSV4_FP4_EXPERTS:
        members = _member(DSV4_BACKENDS, runner, facts, stacked=False)
    elif checkpoint is Fp4Checkpoint.MODELOPT_NVFP4:
        members = [m for m, how in NVFP4_BACKENDS.items() if how.runner == runner and not how.per_token_activation]
    else:
        members = _member(MXFP4_BACKENDS, runner, facts, stacked=checkpoint is Fp4Checkpoint.QUARK_MXFP4)
    if len(members) == 1 and checkpoint is Fp4Checkpoint.MODELOPT_NVFP4:
        with moe_backend(runner, **facts) as m:
            try:
                m.modelopt.ModelOptNvFp4FusedMoEMethod(
                    m.modelopt.ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16)
                )
            except ValueError as exc:
                return DefaultChoice(None, f"{said}; ModelOptNvFp4FusedMoEMethod refuses it there: {exc}", CONSULTED)
    if len(members) == 1:
        return DefaultChoice(members[0], said, CONSULTED)
    if members:
        return DefaultChoice(None, f"{said}, which the subject's map gives {len(members)} records", CONSULTED)
    if runner == "flashinfer_mxfp4" and hardware is Hardware.SM120:
        reason = f"{said}; on SM120 that is cutlass_fused_moe with MXFP8 activations, which the suite has no record for"
        return DefaultChoice(None, reason, CONSULTED, loader=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90)
    return DefaultChoice(None, f"{said}, which no suite record maps on {hardware.value}", CONSULTED)
