"""gpt-oss MXFP4 on SGLang: the `flashinfer_mxfp4` CUTLASS paths (SM90, SM120) and Marlin pad the expert weights
further than their kernels need.

* `FusedMoE.__init__` rounds the hidden size to 256 for every `mxfp4` layer under `flashinfer_mxfp4`
  (gpt-oss: 2880 -> 3072), and the SM90 / SM120 CUTLASS post-load processor pads to `round_up(hidden, 128)` of that
  already rounded size. Those kernels need 128 (SGLang's own comment: "CUTLASS mixed-input GEMM dimensions must be
  % 128 == 0"): 2944.
* `Mxfp4MoEMethod.create_weights` under `--moe-runner-backend marlin` rounds the per-rank intermediate size to 128
  and the hidden size to 256; Marlin MXFP4 needs 64 and 128 (SGLang's own DeepSeek-V4 Marlin method,
  `prepare_moe_mxfp4_layer_for_marlin`, pads I to 64 and H to 128 for the same kernel).

Runs on CPU against an installed SGLang: a real `FusedMoE` (`Mxfp4Config`) is built under SGLang's own test hooks as
rank 0 of TP 1 / 2 / 4 / 8 with gpt-oss's sizes (hidden 2880, intermediate 2880) on each path; the script reads the
sizes SGLang allocates (and, on the CUTLASS paths, the sizes its post-load processor pads to) and prints the
expert-weight memory per GPU for gpt-oss-120b (36 layers x 128 experts) and gpt-oss-20b (24 x 32) at those sizes and
at the kernels' own alignment (MXFP4 bytes: `3 * I * H * (1/2 + 1/32)` per expert, biases aside).

Exit status: 1 = the defect reproduces (over-padded sizes and their memory are printed), 0 = every size is minimal,
2 = the script broke for another reason (traceback printed).
"""

import datetime
import importlib.abc
import importlib.machinery
import importlib.util
import math
import os
import sys
import traceback
import types
import warnings
from unittest import mock

import torch

HIDDEN = INTERMEDIATE = 2880  # gpt-oss-20b and -120b
MODELS = {"gpt-oss-120b": (36, 128), "gpt-oss-20b": (24, 32)}  # (layers, experts)
PREFIX = "model.layers.0.mlp.experts"
SM90 = {"is_sm90": True, "is_sm100": False, "is_sm120": False, "is_blackwell": False}
SM120 = {"is_sm120": True, "is_sm100": False, "is_sm90": False, "is_blackwell": True}
PATHS = {  # name: (runner backend, platform, (I, H) multiples the kernel needs)
    "flashinfer_mxfp4 CUTLASS on SM120 (default for gpt-oss)": ("flashinfer_mxfp4", SM120, (128, 128)),
    "flashinfer_mxfp4 CUTLASS on SM90 (--moe-runner-backend flashinfer_mxfp4)": ("flashinfer_mxfp4", SM90, (128, 128)),
    "Marlin on SM90 (--moe-runner-backend marlin)": ("marlin", SM90, (64, 128)),
}


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


def sizes(runner: str, platform: dict, tp: int) -> tuple[int, int]:
    """The per-rank (I, H) SGLang holds the experts at after loading, rank 0 of ``tp``."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.layers.quantization import mxfp4
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform

    parallel = dict(
        tp_size=tp, tp_rank=0, attn_tp_size=tp, attn_tp_rank=0, attn_dp_size=1, attn_dp_rank=0, attn_cp_size=1,
        attn_cp_rank=0, moe_tp_size=tp, moe_tp_rank=0, moe_ep_size=1, moe_ep_rank=0, moe_dp_size=1,
    )  # fmt: skip
    with (
        get_flags().moe.override(runner_backend=MoeRunnerBackend(runner), a2a_backend=MoeA2ABackend.NONE),
        override_platform(**platform),
        get_context().override_server_args(),
        get_parallel().override(**parallel),
        mock.patch.object(mxfp4, "_FI_HAS_SM90_CUTLASS_MXFP4", True),  # FlashInfer >= 0.6.11 on a GPU
    ):
        layer = FusedMoE(
            num_experts=1, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, layer_id=0, top_k=1,
            quant_config=mxfp4.Mxfp4Config(is_checkpoint_mxfp4_serialized=True), prefix=PREFIX,
            activation="silu", gemm1_alpha=1.702, gemm1_clamp_limit=7.0, with_bias=True,
        )  # fmt: skip
        method = layer.quant_method
        if getattr(method, "_fi_kernel", None) in ("cutlass_sm90", "cutlass_sm120"):
            return method._padded_intermediate, method._padded_hidden  # what the post-load processor pads to
        return method.intermediate_size_per_partition, 2 * layer.w13_weight.shape[-1]


def gib(layers: int, experts: int, intermediate: int, hidden: int) -> float:
    """Expert weights and E8M0 scales of one GPU, GiB: ``3 * I * H`` FP4 values at 1/2 byte, one scale per 32."""
    return layers * experts * 3 * intermediate * hidden * (1 / 2 + 1 / 32) / 2**30


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def main() -> int:
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU code paths: is_cpu() is False on a GPU host
    warnings.filterwarnings("ignore", message="Only CUDA")  # AWQ / GGUF import notices on a host without CUDA
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_Torchvision())
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    over = 0
    for name, (runner, platform, (i_multiple, h_multiple)) in PATHS.items():
        print(f"{name}: kernel needs I % {i_multiple}, H % {h_multiple}")
        for tp in (1, 2, 4, 8):
            ip, hp = sizes(runner, platform, tp)
            shard = math.ceil(INTERMEDIATE // 32 / tp) * 32  # the gpt-oss loader's per-rank channels (whole blocks)
            need = (round_up(shard, i_multiple), round_up(HIDDEN, h_multiple))
            memory = "; ".join(
                f"{model} {gib(*dims, ip, hp):.2f} GiB vs {gib(*dims, *need):.2f} GiB "
                f"(+{gib(*dims, ip, hp) - gib(*dims, *need):.2f})"
                for model, dims in MODELS.items()
            )
            flag = "OVER-PADDED" if ip > need[0] or hp > need[1] else "ok"
            over += flag != "ok"
            print(f"  TP{tp}: SGLang (I, H) per GPU = ({ip}, {hp}), needed ({need[0]}, {need[1]}): {flag}; {memory}")
    if over:
        print(f"REPRODUCES: {over} configurations padded beyond the kernel's alignment")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
