"""vLLM's FP4 MoE and ROCm MXFP4 linear test grids (sources and judgement calls: :mod:`bench.grids`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from bench.grids.model import (
    VLLM_COSINE,
    VLLM_FI_MOE,
    VLLM_HIDDEN_PAD,
    VLLM_MARLIN_PAD,
    VLLM_MXFP4_MOE,
    VLLM_NVFP4_MOE,
    VLLM_ROCM_MXFP4,
    Grid,
    MoeGridPoint,
    dedupe,
    linear_mkn,
    linear_product,
    moe_points,
    moe_product,
)

# --------------------------------------------------------------------------------------------------
# vLLM FP4 MoE tests
# --------------------------------------------------------------------------------------------------

# test_nvfp4_moe.py MNK_FACTORS (m = tokens, n = intermediate, k = hidden).
_VLLM_NVFP4_MNK = (
    (2, 1024, 1024),
    (2, 1024, 1536),
    (2, 3072, 1024),
    (2, 3072, 1536),
    (64, 1024, 1024),
    (64, 1024, 1536),
    (64, 3072, 1024),
    (64, 2048, 1536),
    (224, 1024, 1024),
    (224, 1024, 1536),
)
# test_flashinfer_moe.py MNK_FACTORS.
_VLLM_FI_MNK = (
    (2, 1024, 1024),
    (2, 3072, 1024),
    (2, 3072, 1536),
    (64, 1024, 1536),
    (64, 3072, 1024),
    (64, 2048, 1536),
    (224, 1024, 1024),
    (224, 1024, 1536),
)
# test_flashinfer_nvfp4_cosine_similarity.py MNK_FACTORS and EXPERT_CONFIGS (E, topk).
_VLLM_COSINE_MNK = ((64, 1024, 1024), (64, 2048, 1024), (224, 1024, 1024))
_VLLM_COSINE_EXPERTS = ((8, 2), (64, 4))


def _mnk_product(
    mnk: Iterable[tuple[int, int, int]], experts_topk: Iterable[tuple[int, int]], gated: Iterable[bool] = (True,)
) -> tuple[MoeGridPoint, ...]:
    return dedupe(
        MoeGridPoint(n, k, e, topk, m, g) for (m, n, k), (e, topk), g in itertools.product(mnk, experts_topk, gated)
    )


_E_40_64_256_TOPK_1_6_8 = tuple(itertools.product((40, 64, 256), (1, 6, 8)))

VLLM_MOE_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="vllm/test_nvfp4_moe/test_cutlass_fp4_moe_no_graph",
        source=f"{VLLM_NVFP4_MOE}::test_cutlass_fp4_moe_no_graph",
        format="nvfp4",
        backend="vllm-cutlass",
        points=_mnk_product(_VLLM_NVFP4_MNK, _E_40_64_256_TOPK_1_6_8),
    ),
    Grid(
        name="vllm/test_flashinfer_moe/test_flashinfer_fp4_moe_no_graph",
        source=f"{VLLM_FI_MOE}::test_flashinfer_fp4_moe_no_graph",
        format="nvfp4",
        backend="flashinfer-cutlass",
        # activation in {silu_and_mul (gated), relu2 (non-gated)}.
        points=_mnk_product(_VLLM_FI_MNK, _E_40_64_256_TOPK_1_6_8, gated=(True, False)),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/gated",
        source=f"{VLLM_COSINE}::test_flashinfer_nvfp4_cosine_similarity_gated",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/relu2",
        source=f"{VLLM_COSINE}::test_flashinfer_nvfp4_cosine_similarity_relu2",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS, gated=(False,)),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/vllm_cutlass_gated_baseline",
        source=f"{VLLM_COSINE}::test_vllm_cutlass_nvfp4_cosine_similarity_gated_baseline",
        format="nvfp4",
        backend="vllm-cutlass",  # runs FlashInfer CUTLASS on the same points too
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS),
    ),
    # test_trtllm_gen_mxfp4_fused_moe: topk [1, 4] x E [32, 128] x tokens [1, 128, 1024] x (I, H) = (3072, 3072)
    # x (alpha, beta, limit) x transpose_optimized; act_type splits the activation format.
    Grid(
        name="vllm/test_mxfp4_moe/test_trtllm_gen_mxfp4_fused_moe/MxFP4xMxFP8",
        source=f"{VLLM_MXFP4_MOE}::test_trtllm_gen_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-trtllm",
        points=moe_product((3072,), (3072,), itertools.product((32, 128), (1, 4)), (1, 128, 1024)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_trtllm_gen_mxfp4_fused_moe/MxFP4xBf16",
        source=f"{VLLM_MXFP4_MOE}::test_trtllm_gen_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-trtllm",
        points=moe_product((3072,), (3072,), itertools.product((32, 128), (1, 4)), (1, 128, 1024)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_flashinfer_cutlass_mxfp4_fused_moe",
        source=f"{VLLM_MXFP4_MOE}::test_flashinfer_cutlass_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=moe_product((3072,), (3072,), ((32, 1), (32, 4)), (1, 128)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_flashinfer_cutlass_mxfp4_mxfp8_fused_moe",
        source=f"{VLLM_MXFP4_MOE}::test_flashinfer_cutlass_mxfp4_mxfp8_fused_moe",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=moe_product((3072,), (3072,), ((32, 1), (32, 4)), (1, 128)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle/aiter",
        source=f"{VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle",
        format="mxfp4",
        backend="aiter-fused-moe",  # AITER_MXFP4_BF16, AITER_MXFP4_FP8 (SWIGLUOAI), AITER_MXFP4_MXFP4 (SILU)
        points=moe_points((256, 256, 8, 4, 16, True)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle/triton",
        source=f"{VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle",
        format="mxfp4",
        backend="vllm-triton-kernels",  # TRITON, TRITON_UNFUSED (SWIGLUOAI)
        points=moe_points((256, 256, 8, 4, 16, True)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle_emulation_exact",
        source=f"{VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle_emulation_exact",
        format="mxfp4",
        backend="vllm-emulation",  # Mxfp4MoeBackend.EMULATION, SILU and SWIGLUOAI
        points=moe_points((256, 256, 8, 1, 8, True)),
    ),
    Grid(
        name="vllm/test_trtllm_nvfp4_hidden_dim_padding",
        source=f"{VLLM_HIDDEN_PAD}::test_shared_nvfp4_input_scales_have_writable_storage+test_align_trtllm_fp4_moe_*",
        format="nvfp4",
        backend="flashinfer-cutlass",  # prepare/align helpers only: FLASHINFER_CUTLASS backend, TRT-LLM alignment
        points=moe_points(
            (2, 2, 3, 1, 0, False),  # writable input-scale storage: w13 (3, 2, 1) bytes, is_act_and_mul=False
            (8, 512, 2, 1, 0, False),  # hidden 512: no-op
            (12, 2688, 2, 1, 0, False),  # hidden 2688 -> 2816
            (160, 32, 1, 1, 0, True),  # per-half intermediate 160 -> 192 (min_alignment 64)
        ),
    ),
    Grid(
        name="vllm/test_marlin_utils_fp4_padding",
        source=f"{VLLM_MARLIN_PAD}::test_pad_w13_*+test_pad_w2_for_marlin_tile_matches_design_table",
        format="nvfp4",
        backend="vllm-marlin",  # group_size 16 (NVFP4 blocks); e = 4, hidden = 32
        points=moe_product((1856, 928, 464, 232), (32,), ((4, 1),), (0,), gated=(False, True)),
    ),
)

# --------------------------------------------------------------------------------------------------
# vLLM ROCm MXFP4 linear GEMMs (test_rocm_mxfp4.py)
# --------------------------------------------------------------------------------------------------

VLLM_LINEAR_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_a4w4_accuracy",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_a4w4_accuracy",
        format="mxfp4",
        backend="aiter-triton",  # gemm_afp4wfp4
        points=linear_mkn((64, 128, 64), (128, 256, 128), (128, 4096, 4096), (256, 4096, 11008), (64, 8192, 28672)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_a4w4_determinism",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_a4w4_determinism",
        format="mxfp4",
        backend="aiter-triton",
        points=linear_mkn((128, 256, 128)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_preshuffled_tuned_shapes",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_preshuffled_tuned_shapes",
        format="mxfp4",
        backend="aiter-triton-preshuffle",  # gemm_afp4wfp4_preshuffle on PRESHUFFLED_SHAPES
        points=linear_mkn((64, 4096, 8192), (32, 8192, 16384)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_skinny_shapes",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_skinny_shapes",
        format="mxfp4",
        backend="aiter-triton",
        points=linear_product((1, 2, 4, 8), ((4096, 4096), (4096, 11008), (8192, 8192))),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_qwen38_tp1_ba_96_row_scale_avoids_broken_asm",
        source=f"{VLLM_ROCM_MXFP4}::test_qwen38_tp1_ba_96_row_scale_avoids_broken_asm",
        format="mxfp4",
        backend="vllm-aiter-linear",  # AiterMxfp4LinearKernel must fall back to Triton; ASM gemm_a4w4 is wrong here
        points=linear_product((8, 64), ((96, 5120),)),
    ),
)
