"""gpt-oss MXFP4 on vLLM's Marlin MoE backend: the hidden size is padded to 256 where Marlin needs 128.

`mxfp4_round_up_hidden_size_and_intermediate_size` (`fused_moe/oracle/mxfp4.py`) rounds the hidden size to 256 for
`MARLIN` / `BATCHED_MARLIN` on every platform but XPU (where it rounds to 128, for the same Marlin kernel): gpt-oss's
2880 becomes 3072 where 2944 is enough (Marlin's shape rule in `quantization/utils/marlin_utils.py`,
`(n % 64, k % 128) or (n % 128, k % 64)`, is met by `H % 128` and `I % 64` for both MoE GEMMs). The intermediate rounding to 128 instead of 64 is vLLM PR #56697's subject and is only printed
here.

Runs on CPU against an installed vLLM: vLLM's own rounding function for `Mxfp4MoeBackend.MARLIN` with gpt-oss's
per-rank sizes at TP 1 / 2 / 4 / 8 (hidden 2880, intermediate 2880 / tp); the script prints the expert-weight
memory per GPU for gpt-oss-120b (36 layers x 128 experts) and gpt-oss-20b (24 x 32) with the hidden size vLLM
picks and with 2944 (MXFP4 bytes: `3 * I * H * (1/2 + 1/32)` per expert, biases aside).

Exit status: 1 = the defect reproduces (the sizes and their memory are printed), 0 = the hidden size is padded to
128, 2 = the script broke for another reason (traceback printed).
"""

import datetime
import importlib.util
import sys
import traceback

import torch

HIDDEN = INTERMEDIATE = 2880  # gpt-oss-20b and -120b
MODELS = {"gpt-oss-120b": (36, 128), "gpt-oss-20b": (24, 32)}  # (layers, experts)
MARLIN_HIDDEN_MULTIPLE = 128


def versions() -> str:
    import vllm

    fi = importlib.util.find_spec("flashinfer")
    fi_version = __import__("flashinfer").__version__ if fi else "absent"
    return f"vllm {vllm.__version__}, torch {torch.__version__}, flashinfer {fi_version}"


def gib(layers: int, experts: int, intermediate: int, hidden: int) -> float:
    """Expert weights and E8M0 scales of one GPU, GiB: ``3 * I * H`` FP4 values at 1/2 byte, one scale per 32."""
    return layers * experts * 3 * intermediate * hidden * (1 / 2 + 1 / 32) / 2**30


def main() -> int:
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
        Mxfp4MoeBackend,
        mxfp4_round_up_hidden_size_and_intermediate_size,
    )

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    need_h = -(-HIDDEN // MARLIN_HIDDEN_MULTIPLE) * MARLIN_HIDDEN_MULTIPLE
    over = 0
    for backend in (Mxfp4MoeBackend.MARLIN, Mxfp4MoeBackend.BATCHED_MARLIN):
        print(f"{backend.name}: Marlin needs H % {MARLIN_HIDDEN_MULTIPLE}")
        for tp in (1, 2, 4, 8):
            hp, ip = mxfp4_round_up_hidden_size_and_intermediate_size(backend, HIDDEN, INTERMEDIATE // tp)
            memory = "; ".join(
                f"{model} {gib(*dims, ip, hp):.2f} GiB vs {gib(*dims, ip, need_h):.2f} GiB "
                f"(+{gib(*dims, ip, hp) - gib(*dims, ip, need_h):.2f})"
                for model, dims in MODELS.items()
            )
            flag = "OVER-PADDED" if hp > need_h else "ok"
            over += hp > need_h
            print(f"  TP{tp}: vLLM (I, H) per GPU = ({ip}, {hp}), H needed {need_h}: {flag}; {memory}")
    if over:
        print(f"REPRODUCES: {over} configurations pad the hidden size {HIDDEN} beyond {need_h}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
