"""gpt-oss MXFP4 on SGLang's `flashinfer_mxfp4` CUTLASS paths (SM90 / SM120) fails to load at TP 4 and TP 8.

`Mxfp4MoEMethod.create_weights` keeps `I/tp` rows per half for `cutlass_sm90` / `cutlass_sm120` (gpt-oss: 720 at
TP4, 360 at TP8) while `GptOssForCausalLM._load_mxfp4_experts_weights` narrows whole 32-channel blocks per rank
(`ceil(I/32 / tp) * 32`: 736 at TP4, 384 at TP8), so rank 0's copy into `w13_weight` fails.

Runs on CPU against an installed SGLang: a real `FusedMoE` (`Mxfp4Config`) is built under SGLang's own test hooks
(`get_flags().moe.override`, `override_platform`, `override_server_args`, `get_parallel().override`) as rank 0 of a
TP group on an SM120 GPU (the default backend for gpt-oss MXFP4 there) and on an SM90 GPU with
`--moe-runner-backend flashinfer_mxfp4`, and SGLang's gpt-oss loader reads gpt-oss-20b-shaped expert tensors
(2 experts instead of 32; hidden 2880, intermediate 2880).

Exit status: 1 = the defect reproduces (SGLang's own error is printed), 0 = every configuration loads,
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

HIDDEN, INTERMEDIATE, EXPERTS = 2880, 2880, 2  # gpt-oss-20b / -120b hidden and intermediate sizes
PREFIX = "model.layers.0.mlp.experts"
PLATFORMS = {
    "SM120 (default backend)": {"is_sm120": True, "is_sm100": False, "is_sm90": False, "is_blackwell": True},
    "SM90 (--moe-runner-backend flashinfer_mxfp4)": {
        "is_sm90": True, "is_sm100": False, "is_sm120": False, "is_blackwell": False,
    },
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


def load_rank0(platform: dict, tp: int) -> None:
    """Build rank 0 of a TP group's gpt-oss MoE layer and run SGLang's gpt-oss expert loader on it."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.layers.quantization import mxfp4
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
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
        mock.patch.object(mxfp4, "_FI_HAS_SM90_CUTLASS_MXFP4", True),  # FlashInfer >= 0.6.11 on a GPU
    ):
        layer = FusedMoE(
            num_experts=EXPERTS, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, layer_id=0, top_k=1,
            quant_config=mxfp4.Mxfp4Config(is_checkpoint_mxfp4_serialized=True), prefix=PREFIX,
            activation="silu", gemm1_alpha=1.702, gemm1_clamp_limit=7.0, with_bias=True,
        )  # fmt: skip
        method = layer.quant_method
        print(f"  {type(method).__name__}._fi_kernel = {method._fi_kernel!r}")
        print(f"  w13_weight {tuple(layer.w13_weight.shape)} (rows = 2 * {method.intermediate_size_per_partition})")
        # the part of GptOssForCausalLM the loader reads: the layer at PREFIX and config
        root = parent = torch.nn.Module()
        *path, leaf = PREFIX.split(".")
        for part in path:
            parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, layer)
        root.config = types.SimpleNamespace(intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS)
        checkpoint = [
            (f"{PREFIX}.gate_up_proj_blocks", torch.zeros(EXPERTS, 2 * INTERMEDIATE, HIDDEN // 32, 16, dtype=torch.uint8)),
            (f"{PREFIX}.gate_up_proj_scales", torch.full((EXPERTS, 2 * INTERMEDIATE, HIDDEN // 32), 127, dtype=torch.uint8)),
            (f"{PREFIX}.down_proj_blocks", torch.zeros(EXPERTS, HIDDEN, INTERMEDIATE // 32, 16, dtype=torch.uint8)),
            (f"{PREFIX}.down_proj_scales", torch.full((EXPERTS, HIDDEN, INTERMEDIATE // 32), 127, dtype=torch.uint8)),
            (f"{PREFIX}.gate_up_proj_bias", torch.zeros(EXPERTS, 2 * INTERMEDIATE, dtype=torch.bfloat16)),
            (f"{PREFIX}.down_proj_bias", torch.zeros(EXPERTS, HIDDEN, dtype=torch.bfloat16)),
        ]  # fmt: skip
        GptOssForCausalLM._load_mxfp4_experts_weights(root, iter(checkpoint))


def main() -> int:
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU code paths: is_cpu() is False on a GPU host
    warnings.filterwarnings("ignore", message="Only CUDA")  # AWQ / GGUF import notices on a host without CUDA
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_Torchvision())
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    failures = 0
    for name, platform in PLATFORMS.items():
        for tp in (4, 8):
            print(f"gpt-oss MXFP4 MoE, {name}, TP{tp} rank 0:")
            try:
                load_rank0(platform, tp)
            except RuntimeError as exc:
                if "must match the size of tensor b" not in str(exc):
                    raise
                print(f"  REPRODUCES: {type(exc).__name__}: {exc}")
                failures += 1
            else:
                print("  loads")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
