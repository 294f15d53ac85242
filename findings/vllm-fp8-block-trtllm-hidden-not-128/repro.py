"""Block-FP8 MoE on vLLM's FlashInfer TRT-LLM backend: a hidden size that is not a multiple of 128 fails to load.

vLLM never pads the hidden size of a block-FP8 (128x128, DeepSeekFp8) MoE layer, and
`prepare_fp8_moe_layer_for_fi` (`quantization/utils/flashinfer_utils.py`), which `Fp8MoEMethod`'s
`process_weights_after_loading` runs for `Fp8MoeBackend.FLASHINFER_TRTLLM`, hands FC1 `[E, 2I, H]` to
`_shuffle_deepseek_fp8_moe_weights`, which views it as `[E, 2I, H // 128, 128]`: for `H % 128 != 0` the view raises.
`TrtLlmFp8ExpertsMonolithic` keeps the base `_supports_shape` (every hidden size), so `select_fp8_moe_backend`
does not move such a layer to another backend.

Runs on CPU against an installed vLLM and FlashInfer: vLLM's own `prepare_fp8_moe_layer_for_fi` (`is_trtllm=True`)
on one gated expert with I = 256 and H = 2880 (a hidden size that is 22.5 blocks of 128), then the same with
H = 2816 (22 blocks) as the control, and vLLM's `_supports_shape` answer for 2880.

Exit status: 1 = the defect reproduces (vLLM's error is printed), 0 = the unaligned layer is prepared or refused by
selection, 2 = the script broke for another reason (traceback printed).
"""

import datetime
import sys
import traceback
import types

import torch

EXPERTS, INTERMEDIATE, BLOCK = 1, 256, 128
HIDDEN, CONTROL_HIDDEN = 2880, 2816


def versions() -> str:
    import flashinfer
    import vllm

    return f"vllm {vllm.__version__}, torch {torch.__version__}, flashinfer {flashinfer.__version__}"


def prepare(hidden: int) -> None:
    """vLLM's FlashInfer TRT-LLM preparation of one gated block-FP8 expert layer of ``hidden``."""
    import vllm.model_executor.layers.fused_moe  # noqa: F401  # vLLM's import order
    from vllm.model_executor.layers.quantization.utils.flashinfer_utils import prepare_fp8_moe_layer_for_fi

    layer = types.SimpleNamespace(
        weight_block_size=[BLOCK, BLOCK],
        moe_config=types.SimpleNamespace(is_act_and_mul=True),
        activation=types.SimpleNamespace(is_gated=True),
    )
    blocks = -(-hidden // BLOCK)
    w13 = torch.zeros(EXPERTS, 2 * INTERMEDIATE, hidden, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(EXPERTS, hidden, INTERMEDIATE, dtype=torch.float8_e4m3fn)
    w13_scale = torch.ones(EXPERTS, 2 * INTERMEDIATE // BLOCK, blocks)
    w2_scale = torch.ones(EXPERTS, blocks, INTERMEDIATE // BLOCK)
    prepare_fp8_moe_layer_for_fi(layer, w13, w2, w13_scale, None, w2_scale, None, is_trtllm=True)


def main() -> int:
    from vllm.model_executor.layers.fused_moe.experts.trtllm_fp8_moe import TrtLlmFp8ExpertsMonolithic

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {versions()}; CPU")
    prepare(CONTROL_HIDDEN)
    print(f"H = {CONTROL_HIDDEN} (22 blocks of 128): prepared")
    supported = TrtLlmFp8ExpertsMonolithic._supports_shape(HIDDEN)
    print(f"TrtLlmFp8ExpertsMonolithic._supports_shape({HIDDEN}) = {supported}")
    try:
        prepare(HIDDEN)
    except RuntimeError as exc:
        print(f"H = {HIDDEN}: prepare_fp8_moe_layer_for_fi raised RuntimeError: {exc}")
        if supported:
            print(f"REPRODUCES: block-FP8 FLASHINFER_TRTLLM fails to load H = {HIDDEN} (H % 128 != 0, never padded)")
            return 1
    print(f"H = {HIDDEN}: prepared or refused by selection")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001  # anything but the defect: the script broke
        traceback.print_exc()
        sys.exit(2)
