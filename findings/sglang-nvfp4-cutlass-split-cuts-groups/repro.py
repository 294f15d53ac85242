"""Nemotron-3-Nano NVFP4 on SGLang's `flashinfer_cutlass` MoE runner at TP8: ranks >= 1 get the wrong FC2 block scales.

`ModelOptNvFp4FusedMoEMethod.create_weights` allocates `I/tp` channels per rank (1856 / 8 = 232, not a multiple of
the 16-element NVFP4 group) and `FusedMoE._load_w2` narrows every checkpoint tensor by its own size / tp: the
weights at `232 r` channels, the block scales at `floor(116 / 8) r = 14 r` groups. Rank r's channel `232 r + j`
is then paired with scale group `14 r + j // 16`, while its own group is `(232 r + j) // 16`: from rank 1 on,
channels are scaled with their neighbours' scales, without an error. vLLM's twin: vllm-project/vllm#49949.

Runs on CPU against an installed SGLang: a real `FusedMoE` (`ModelOptFp4Config`, group 16, non-gated `relu2` as
Nemotron-H) is built under SGLang's own test hooks as each rank of TP8 on an SM120 GPU (where
`nemotron_h`'s model override picks `flashinfer_cutlass` for ModelOpt NVFP4 by default) and
`FusedMoE.weight_loader` reads one expert with Nemotron-3-Nano's sizes (hidden 2688, intermediate 1856) and
distinct scale bytes; the script then compares, per channel, the FC2 scale the rank holds with the checkpoint's.

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

HIDDEN, INTERMEDIATE, GROUP, TP = 2688, 1856, 16, 8  # Nemotron-3-Nano-30B-A3B NVFP4, TP8
PREFIX = "model.layers.0.mlp.experts"
SM120 = {"is_sm120": True, "is_sm100": False, "is_sm90": False, "is_blackwell": True}


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


def load_rank(rank: int, w13: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rank ``rank``'s FC2 scale buffer ``[H, cols]`` (bytes) after SGLang's loader, and its channel count."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform

    parallel = dict(
        tp_size=TP, tp_rank=rank, attn_tp_size=TP, attn_tp_rank=rank, attn_dp_size=1, attn_dp_rank=0,
        attn_cp_size=1, attn_cp_rank=0, moe_tp_size=TP, moe_tp_rank=rank, moe_ep_size=1, moe_ep_rank=0, moe_dp_size=1,
    )  # fmt: skip
    backend = MoeRunnerBackend("flashinfer_cutlass")
    with (
        get_flags().moe.override(runner_backend=backend, a2a_backend=MoeA2ABackend.NONE),
        override_platform(**SM120),
        get_context().override_server_args(),
        get_parallel().override(**parallel),
    ):
        config = ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=GROUP)
        layer = FusedMoE(
            num_experts=1, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, layer_id=0, top_k=1,
            quant_config=config, prefix=PREFIX, activation="relu2", is_gated=False,
        )  # fmt: skip
        if rank == 0:
            print(f"  {type(layer.quant_method).__name__}: w2_weight {tuple(layer.w2_weight.shape[1:])}, "
                  f"w2_weight_scale {tuple(layer.w2_weight_scale.shape[1:])} per expert")  # fmt: skip
        e4m3, one = torch.float8_e4m3fn, torch.tensor(1.0)
        layer.weight_loader(layer.w13_weight, w13, f"{PREFIX}.w13_weight", "w1", 0)
        layer.weight_loader(layer.w2_weight, w2, f"{PREFIX}.w2_weight", "w2", 0)
        layer.weight_loader(layer.w2_weight_scale, w2_scale.view(e4m3), f"{PREFIX}.w2_weight_scale", "w2", 0)
        for name in ("w13_weight_scale_2", "w13_input_scale"):
            layer.weight_loader(getattr(layer, name), one, f"{PREFIX}.{name}", "w1", 0)
        for name in ("w2_weight_scale_2", "w2_input_scale"):
            layer.weight_loader(getattr(layer, name), one, f"{PREFIX}.{name}", "w2", 0)
        return layer.w2_weight_scale.detach()[0].view(torch.uint8).clone(), layer.intermediate_size_per_partition


def main() -> int:
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # SGLang's GPU code paths: is_cpu() is False on a GPU host
    warnings.filterwarnings("ignore", message="Only CUDA")  # AWQ / GGUF import notices on a host without CUDA
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_Torchvision())
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    print(f"Nemotron-3-Nano NVFP4 MoE (H {HIDDEN}, I {INTERMEDIATE}, non-gated), flashinfer_cutlass on SM120, TP{TP}:")
    gen = torch.Generator().manual_seed(0)
    groups = INTERMEDIATE // GROUP
    w13 = torch.randint(0, 256, (INTERMEDIATE, HIDDEN // 2), dtype=torch.uint8, generator=gen)
    w2 = torch.randint(0, 256, (HIDDEN, INTERMEDIATE // 2), dtype=torch.uint8, generator=gen)
    # distinct E4M3 scale bytes per group (finite, 0x01..0x74), so each column of scales names its group
    w2_scale = (torch.arange(groups, dtype=torch.uint8) + 1).expand(HIDDEN, groups).contiguous()
    wrong = 0
    for rank in range(TP):
        held, channels = load_rank(rank, w13, w2, w2_scale)
        start = rank * channels
        mismatched = []
        for j in range(channels):
            want = (start + j) // GROUP  # the checkpoint's group of channel start + j
            col = j // GROUP  # the rank's scale column for its local channel j
            got = int(held[0, col]) - 1 if col < held.shape[1] else None
            if got != want:
                mismatched.append((start + j, want, got))
        wrong += len(mismatched)
        first = mismatched[0] if mismatched else None
        print(f"  rank {rank}: channels [{start}, {start + channels}), scale columns held {held.shape[1]} "
              f"(checkpoint groups {sorted({int(v) - 1 for v in held[0].tolist()})}); "
              f"{len(mismatched)} of {channels} channels paired with another channel group's scale"
              + (f", e.g. channel {first[0]}: its group {first[1]}, held {first[2]}" if first else ""))  # fmt: skip
    if wrong:
        print(f"REPRODUCES: {wrong} of {INTERMEDIATE} channels read a scale that is not their own (silently)")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
