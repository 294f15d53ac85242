"""DeepSeek-V4 on SGLang's default MoE backend for Hopper (SM90) and SM120 refuses to load at TP4 / TP8 (V4.1-Flash)
and TP16 (V4-Pro): sgl-project/sglang#26250, now on the default path.

`model_overrides/deepseek_v4.py` picks `--moe-runner-backend flashinfer_mxfp4` for FP4-expert DeepSeek-V4
checkpoints on SM90, SM100 and SM120 when the flag is `auto`; on SM90 / SM120 `Fp8Config.get_quant_method`
returns `Mxfp4FlashinferCutlassMoEMethod`, whose `create_weights` raises `ValueError` unless `I/tp % 128 == 0`
instead of padding the shard after loading (as `Mxfp4FlashinferTrtllmMoEMethod` does on SM100, to 128).

Runs on CPU against an installed SGLang: a real `FusedMoE` (`Fp8Config` with FP4 experts) is built under SGLang's own
test hooks as rank 0 of each TP group, on SM90 and on SM120, under `flashinfer_mxfp4`.

Exit status: 1 = the defect reproduces (SGLang's own error is printed), 0 = every configuration is accepted,
2 = the script broke for another reason (traceback printed).
"""

import datetime
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types
import warnings
from unittest import mock

import torch

PREFIX = "model.layers.0.mlp.experts"
MODELS = {  # routed-expert sizes (hidden, intermediate) and the TP degrees whose I/tp is not a multiple of 128
    "DeepSeek-V4.1-Flash": (5120, 2304, (4, 8)),
    "DeepSeek-V4-Pro": (7168, 3072, (16,)),
}
PLATFORMS = {
    "SM90": {"is_sm90": True, "is_sm100": False, "is_sm120": False, "is_blackwell": False},
    "SM120": {"is_sm120": True, "is_sm100": False, "is_sm90": False, "is_blackwell": True},
}
DSV4_QUANT_CONFIG = {
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
    "scale_fmt": "ue8m0",
}  # fmt: skip


class _StandIn(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(name, (), {})


def _stand_in_attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _StandIn(name, (), {})


class _Torchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torchvision cannot be installed beside CPU torch; SGLang only imports it (multimodal processors)."""

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__version__ = [], "0.0"
        module.__getattr__ = _stand_in_attribute
        return module

    def exec_module(self, module):
        return None


def versions() -> str:
    import sglang

    fi = importlib.util.find_spec("flashinfer")
    fi_version = __import__("flashinfer").__version__ if fi else "absent"
    return f"sglang {sglang.__version__}, torch {torch.__version__}, flashinfer {fi_version}"


def build_rank0(platform: dict, hidden: int, intermediate: int, tp: int) -> None:
    """Rank 0 of a TP group's DeepSeek-V4 FP4-expert MoE layer under ``flashinfer_mxfp4`` on ``platform``."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.layers.quantization import mxfp4_flashinfer_cutlass_moe
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform

    parallel = dict(
        tp_size=tp, tp_rank=0, attn_tp_size=tp, attn_tp_rank=0, attn_dp_size=1, attn_dp_rank=0, attn_cp_size=1,
        attn_cp_rank=0, moe_tp_size=tp, moe_tp_rank=0, moe_ep_size=1, moe_ep_rank=0, moe_dp_size=1,
    )  # fmt: skip
    backend = MoeRunnerBackend("flashinfer_mxfp4")
    with (
        get_flags().moe.override(runner_backend=backend, a2a_backend=MoeA2ABackend.NONE),
        override_platform(**platform),
        get_context().override_server_args(),
        get_parallel().override(**parallel),
        mock.patch.object(mxfp4_flashinfer_cutlass_moe, "is_flashinfer_available", lambda: True),  # a CUDA machine
    ):
        config = Fp8Config.from_config(DSV4_QUANT_CONFIG)
        config.is_fp4_experts = True  # what model_loader/loader.py sets for DeepSeek-V4 FP4-expert checkpoints
        config.is_dsv4_fp4_experts = True
        layer = FusedMoE(
            num_experts=1, hidden_size=hidden, intermediate_size=intermediate, layer_id=0, top_k=1,
            quant_config=config, prefix=PREFIX, swiglu_limit=10.0,
        )  # fmt: skip
        print(f"  {type(layer.quant_method).__name__} accepted I/tp = {layer.intermediate_size_per_partition}")


def main() -> int:
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU code paths: is_cpu() is False on a GPU host
    warnings.filterwarnings("ignore", message="Only CUDA")  # AWQ / GGUF import notices on a host without CUDA
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_Torchvision())
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    refused = 0
    for model, (hidden, intermediate, tps) in MODELS.items():
        for tp in tps:
            for name, platform in PLATFORMS.items():
                print(f"{model} (H {hidden}, I {intermediate}), TP{tp} (I/tp = {intermediate // tp}), "
                      f"flashinfer_mxfp4 on {name}:")  # fmt: skip
                try:
                    build_rank0(platform, hidden, intermediate, tp)
                except ValueError as exc:
                    if "multiples of 128" not in str(exc):
                        raise
                    print(f"  REPRODUCES: {type(exc).__name__}: {exc}")
                    refused += 1
    return 1 if refused else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
