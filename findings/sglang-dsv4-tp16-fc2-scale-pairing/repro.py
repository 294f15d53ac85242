"""DeepSeek-V4.1-Flash on SGLang at plain TP16 on SM100 (default `flashinfer_mxfp4`): FC2 block scales paired with the
wrong channels, silently.

The FP4 experts' FC2 (`w2`, `[H, I]`, MXFP4 groups of 32 along I) is split along I. `Mxfp4FlashinferTrtllmMoEMethod`
(through `Fp8MoEMethod.create_weights`) allocates `I/tp` = 2304 / 16 = 144 channels per rank (4.5 groups) and a
scale buffer of `144 // 32` = 4 groups; `FusedMoE._load_w2` narrows each checkpoint tensor by its own size / tp:
weights at `144 r` channels, scales at `(72 // 16) r = 4 r` groups. Rank r's channel `144 r + j` is then scaled by
group `4 r + j // 32` instead of its own `(144 r + j) // 32`, and groups 64..71 are loaded by no rank.

Runs on CPU against an installed SGLang: a real `FusedMoE` (`Fp8Config` with FP4 experts, as SGLang's loader sets
it for DeepSeek-V4 checkpoints) is built under SGLang's own test hooks as each rank of TP16 on an SM100 GPU with
`flashinfer_mxfp4` (what `model_overrides/deepseek_v4.py` picks there by default) and `FusedMoE.weight_loader`
reads one expert's FC2 with DeepSeek-V4.1-Flash's sizes (hidden 5120, intermediate 2304) and a distinct E8M0 scale
per group; the script compares, per channel, the scale the rank holds with the checkpoint's.

Exit status: 1 = the defect reproduces (the wrong pairings are printed), 0 = every channel keeps its own scale,
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

import torch

HIDDEN, INTERMEDIATE, GROUP, TP = 5120, 2304, 32, 16  # DeepSeek-V4.1-Flash routed experts, plain TP16
PREFIX = "model.layers.0.mlp.experts"
SM100 = {"is_sm100": True, "is_blackwell": True, "is_sm90": False, "is_sm120": False}
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


def load_rank(rank: int, w2: torch.Tensor, w2_scale: torch.Tensor) -> tuple[torch.Tensor, int, str]:
    """Rank ``rank``'s FC2 scale buffer ``[H, groups]`` as E8M0 exponents after SGLang's loader, its channel count
    and its quant method's name."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform

    parallel = dict(
        tp_size=TP, tp_rank=rank, attn_tp_size=TP, attn_tp_rank=rank, attn_dp_size=1, attn_dp_rank=0,
        attn_cp_size=1, attn_cp_rank=0, moe_tp_size=TP, moe_tp_rank=rank, moe_ep_size=1, moe_ep_rank=0, moe_dp_size=1,
    )  # fmt: skip
    backend = MoeRunnerBackend("flashinfer_mxfp4")
    with (
        get_flags().moe.override(runner_backend=backend, a2a_backend=MoeA2ABackend.NONE),
        override_platform(**SM100),
        get_context().override_server_args(),
        get_parallel().override(**parallel),
    ):
        config = Fp8Config.from_config(DSV4_QUANT_CONFIG)
        config.is_fp4_experts = True  # what model_loader/loader.py sets for DeepSeek-V4 FP4-expert checkpoints
        config.is_dsv4_fp4_experts = True
        layer = FusedMoE(
            num_experts=1, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, layer_id=0, top_k=1,
            quant_config=config, prefix=PREFIX, swiglu_limit=10.0,
        )  # fmt: skip
        params = dict(layer.named_parameters())
        # FusedMoE.make_expert_params_mapping: experts.0.down_proj.* -> w2_*, shard "w2"
        for name, tensor in (("w2_weight", w2), ("w2_weight_scale_inv", w2_scale)):
            params[name].weight_loader(params[name], tensor, f"{PREFIX}.{name}", shard_id="w2", expert_id=0)
        held = torch.log2(layer.w2_weight_scale_inv.detach()[0].float()).round().long() + 127
        return held, layer.intermediate_size_per_partition, type(layer.quant_method).__name__


def main() -> int:
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU code paths: is_cpu() is False on a GPU host
    warnings.filterwarnings("ignore", message="Only CUDA")  # AWQ / GGUF import notices on a host without CUDA
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_Torchvision())
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    print(f"DeepSeek-V4.1-Flash FP4 experts (H {HIDDEN}, I {INTERMEDIATE}), flashinfer_mxfp4 on SM100, plain TP{TP}:")
    groups = INTERMEDIATE // GROUP
    w2 = torch.randint(
        -128, 128, (HIDDEN, INTERMEDIATE // 2), dtype=torch.int8, generator=torch.Generator().manual_seed(0)
    )
    # E8M0 exponent byte 100 + g for group g: a distinct power of two per group
    exponents = (torch.arange(groups, dtype=torch.uint8) + 100).expand(HIDDEN, groups).contiguous()
    w2_scale = exponents.view(torch.float8_e8m0fnu)
    wrong, covered = 0, set()
    for rank in range(TP):
        held, channels, method = load_rank(rank, w2, w2_scale)
        if rank == 0:
            print(f"  {method}: {channels} channels per rank, FC2 scale buffer {tuple(held.shape)} per expert")
        loaded = sorted({int(v) - 100 for v in held[0].tolist()})
        covered.update(loaded)
        start, mismatched = rank * channels, []
        for j in range(channels):
            want, col = (start + j) // GROUP, j // GROUP
            got = int(held[0, col]) - 100 if col < held.shape[1] else None
            if got != want:
                mismatched.append((start + j, want, got))
        wrong += len(mismatched)
        first = mismatched[0] if mismatched else None
        print(f"  rank {rank:2}: channels [{start}, {start + channels}), scale groups held {loaded}; "
              f"{len(mismatched)} channels scaled by another group"
              + (f", e.g. channel {first[0]}: group {first[1]}, held {first[2]}" if first else ""))  # fmt: skip
    lost = sorted(set(range(groups)) - covered)
    if wrong:
        print(f"REPRODUCES: {wrong} of {INTERMEDIATE} channels read another group's scale; groups on no rank: {lost}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
