"""Pinned regressions shared by several property modules: each a real model's configuration that
reproduced an upstream bug, replayed as an ``@example`` before generation (``strategies.pins``)."""

from __future__ import annotations

from strategies.catalog import Parallel
from strategies.linear import pinned_linear
from strategies.moe import pinned_shape
from strategies.mxfp4_moe import pinned_config

NVFP4_MOE_REGRESSIONS = (
    pinned_shape("gemma-4-26b-a4b", 4),  # vLLM #46879 / FlashInfer #3206: rows 352
    pinned_shape("gemma-4-26b-a4b", 2),  # vLLM #55649: 352 -> 384 end-padded
    pinned_shape("glm-4.5-air", 8),  # I = 176, rows 352
    pinned_shape("mellum2-12b-a2.5b", 4),  # I = 224, rows 448
    pinned_shape("qwen3-30b-a3b", 8),  # I = 96, rows 192
    pinned_shape("nemotron-3-nano-30b-a3b", 1),  # non-gated I = 1856 (FlashInfer #4653)
    pinned_shape("nemotron-3-nano-30b-a3b", 2),  # non-gated I = 928
)
"""``nvfp4_moe``: Gemma-4-26B-A4B at TP=4 (vLLM #46879, the ``M % 128`` assert) and TP=2 (vLLM #55649, silent
gate/up mispairing), GLM-4.5-Air TP=8, Mellum2 TP=4, Qwen3-30B-A3B TP=8 and Nemotron-3-Nano TP=1/2 (non-gated)."""

FP8_MOE_REGRESSIONS = (
    pinned_shape("qwen3.8-flash-next", 8),  # I 640 / 8 = 80 per rank: vLLM #54178 (pad to 128)
    pinned_shape("qwen3.8-flash-next", 4),  # I 160 per rank: one whole 128-block and a partial one
    pinned_shape("qwen3-30b-a3b", 8),  # I 96 per rank, H 2048
    pinned_shape("gemma-4-26b-a4b", 2),  # I 352 per rank, H 2816 (22 blocks of 128)
    pinned_shape("nemotron-3-nano-30b-a3b", 2),  # non-gated I 928, H 2688 (21 blocks)
)
"""``fp8_moe``: ranks whose intermediate size is not a whole number of 128-blocks (Qwen3.8-Flash-Next at TP=8,
vLLM #54178 / PR #55867) and hidden sizes that are whole 128-blocks or not."""

FP8_TENSOR_MOE_REGRESSIONS = (
    pinned_shape("qwen3.8-flash-next", 8),  # I 80 per rank: vLLM pads a gated rank to 16, the staged kernel asks 128
    pinned_shape("nemotron-3-nano-30b-a3b", 8),  # non-gated I 232, H 2688: vLLM pads to 128 here
    pinned_shape("qwen3-30b-a3b", 4),  # I 192 per rank, H 2048
)
"""``fp8_tensor_moe``: gated ranks whose intermediate size is a multiple of 16 but not of 128 (vLLM 0.33.0's
``align_moe_weights_for_fi`` pads them to 16) and a non-gated one (padded to 128)."""

MXFP4_MOE_REGRESSIONS = (
    pinned_config("gpt-oss-120b", 4),  # I 736 per rank (docs/models.md §4)
    pinned_config("gpt-oss-120b", 4, rank=-1),  # last rank: 672 real channels of 736
    pinned_config("gpt-oss-120b", 8),  # I 384: 512 at 256, 384 at 128
    pinned_config("gpt-oss-120b", 8, rank=-1),  # last rank: 192 real channels of 384
    pinned_config("deepseek-v4", 8),  # I 384: ROCm 512 ("inter 512/rank", AITER #3933)
    pinned_config("deepseek-v4", 16),  # I 192: SGLang #26250 (SM90 flashinfer_mxfp4)
    pinned_config("minimax-m2", 4),  # MiniMax-M2.1 TP4, I 384: vLLM #35637
    pinned_config("minimax-m2", 8),  # MiniMax-M2.1 TP8, I 192: AITER PR #2642
    pinned_config("deepseek-v4.1-flash", 8),  # I 288: vLLM PR #56697 (Marlin 320, not 384)
    pinned_config("mellum2-12b-a2.5b", 2),  # I 448: EuroEval PR #2079 (trtllm-gen I % 128)
)
"""``mxfp4_moe``: the MXFP4 MoE regressions (docs/models.md §4 and the cited PRs / issues)."""

GDN_SCALES = ((48, 160), (24, 160), (12, 160))
"""Qwen3.8 GDN ``in_proj_ba`` (out 96, K 5120) at TP 2 / 4 / 8: rows fail the 32 rule (vLLM PR #55213)."""

MXFP4_LINEAR_REGRESSIONS = (
    pinned_linear("qwen3.8-flash-next", "shared_expert.down_proj", 1),  # scale (2560, 20)
    pinned_linear("qwen3.8-flash-next", "shared_expert.down_proj", 8, Parallel.REPLICATED),  # TP8+EP replicated
    pinned_linear("qwen3.8-flash-next", "shared_expert.down_proj", 2),  # scale (2560, 10)
    pinned_linear("qwen3.8-flash-next", "shared_expert.gate_up_proj", 2),  # scale (640, 80): ASM
    pinned_linear("qwen3.8-flash-next", "linear_attn.in_proj_ba", 1, tokens=8),  # scale (96, 160)
    pinned_linear("qwen3.8-flash-next", "linear_attn.in_proj_ba", 2),  # scale (48, 160)
    pinned_linear("qwen3.8-flash-next", "linear_attn.in_proj_ba", 4),  # scale (24, 160)
    pinned_linear("qwen3.8-flash-next", "linear_attn.in_proj_ba", 8, tokens=1),  # scale (12, 160)
)
