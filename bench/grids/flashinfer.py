"""FlashInfer's FP4 MoE test grids: trtllm-gen, CUTLASS fused MoE and the unified-MoE fuzzer (sources and
judgement calls: :mod:`bench.grids`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from bench.grids.model import (
    FI_CUTLASS,
    FI_FUZZ,
    FI_RENORM_FP4,
    FI_TRTLLM_GEN,
    Grid,
    MoeGridPoint,
    dedupe,
    moe_points,
    moe_product,
)

# --------------------------------------------------------------------------------------------------
# FlashInfer trtllm-gen (test_trtllm_gen_fused_moe.py + routing_renormalize_fp4.py), filtered by skip_checks
# --------------------------------------------------------------------------------------------------

# FP4Moe quant modes (QuantMode.FP4_*), with the grid format they map to.
NVFP4 = "NvFP4xNvFP4"
MXFP4_MXFP8 = "MxFP4xMxFP8"
MXFP4_BF16 = "MxFP4xBf16"
_QUANT_FORMAT = {NVFP4: "nvfp4", MXFP4_MXFP8: "mxfp4", MXFP4_BF16: "mxfp4"}

# tests/moe/utils.py: GEGLU_SUPPORTED_QUANT_MODES / NON_GATED_ACTIVATION_SUPPORTED_QUANT_MODES and the
# fp32-logits allow-list, restricted to the FP4 modes.
_GEGLU_QUANTS = frozenset({NVFP4, MXFP4_MXFP8})
_NON_GATED_QUANTS = frozenset({NVFP4})
_FP32_LOGITS_QUANTS = frozenset({NVFP4})
_GATED_ACTIVATIONS = frozenset({"swiglu", "geglu", "situ"})


@dataclass(frozen=True)
class _Routing:
    """The shape-relevant part of one ``routing_config`` dict (FP4Moe is in its ``compatible_moe_impls``)."""

    experts: int
    top_k: int
    compatible_intermediate: tuple[int, ...]
    compatible_activations: tuple[str, ...] | None = None


def _trtllm_gen_skipped(quant: str, tokens: int, hidden: int, inter: int, r: _Routing, act: str, logits: str) -> bool:
    """``skip_checks`` for an FP4Moe case with the Shuffled_MajorK weight layout on SM100."""
    if act == "geglu" and (quant not in _GEGLU_QUANTS or tokens > 128):
        return True
    if act == "swiglu" and (hidden > 1024 or inter > 1024):
        return True
    if r.compatible_activations is not None and act not in r.compatible_activations:
        return True
    if act not in _GATED_ACTIVATIONS and quant not in _NON_GATED_QUANTS:
        return True
    if r.experts > 512 and inter > 512:
        return True
    if inter not in r.compatible_intermediate:
        return True
    return logits == "fp32" and quant not in _FP32_LOGITS_QUANTS


def _trtllm_gen(
    quant: str,
    tokens: Iterable[int],
    hiddens: Iterable[int],
    intermediates: Iterable[int],
    routings: Iterable[_Routing],
    activations: Iterable[str],
    logits: Iterable[str] = ("bf16",),
) -> tuple[MoeGridPoint, ...]:
    """Product of a trtllm-gen test's parametrize lists minus the ``skip_checks`` skips."""
    return dedupe(
        MoeGridPoint(i, h, r.experts, r.top_k, t, act in _GATED_ACTIVATIONS)
        for t, h, i, r, act, lg in itertools.product(tokens, hiddens, intermediates, routings, activations, logits)
        if not _trtllm_gen_skipped(quant, t, h, i, r, act, lg)
    )


def _trtllm_gen_grids(test: str, quants: Iterable[str], source: str = FI_TRTLLM_GEN, **params) -> tuple[Grid, ...]:
    grids = []
    for quant in quants:
        points = _trtllm_gen(quant, **params)
        if points:
            grids.append(
                Grid(
                    name=f"flashinfer/trtllm-gen/{test}/{quant}",
                    source=f"{source}::{test}",
                    format=_QUANT_FORMAT[quant],
                    backend="flashinfer-trtllm",
                    points=points,
                )
            )
    return tuple(grids)


_ALL_FP4 = (NVFP4, MXFP4_MXFP8, MXFP4_BF16)
_SIGMOID_128E_TOP8 = _Routing(128, 8, (384, 768, 1024))  # Sigmoid_128e_top8 and TopKSigmoid_128e_top8
_NEMOTRON_3_SUPER = _Routing(512, 22, (2688,), ("relu2",))
_DSV3 = _Routing(256, 8, (512, 1024, 2048), ("swiglu", "geglu"))  # DSv3 and DSv3_DA
_DSV3_FUSED_SHARED = _Routing(256, 8, (512,), ("swiglu",))  # DSv3_fused_shared_{1,2}: S = 1, 2
_TOPK_16E_TOP2 = _Routing(16, 2, (512, 768, 1024))  # TopK and TopK_DA
_LLAMA4 = _Routing(128, 1, (1024, 2048))
_BIAS_8E_TOP2 = _Routing(8, 2, (512, 768, 1024, 2048))
_NGROUP1_384E_TOP6 = _Routing(384, 6, (512,))
_NGROUP1_512E_TOP22 = _Routing(512, 22, (512,))
_LORA_RENORM = _Routing(128, 8, (1024,))
_QWEN3_MOE = _Routing(128, 8, (384, 768, 1024))
_QWEN3_NEXT = _Routing(512, 10, (512,))
_RENORM_LARGE_EXPERTS = _Routing(2048, 32, (384,))

TRTLLM_GEN_GRIDS: tuple[Grid, ...] = (
    *_trtllm_gen_grids(
        "test_sigmoid_routing",
        _ALL_FP4,
        tokens=(8, 3072),
        hiddens=(1024,),
        intermediates=(1024, 768, 384),
        routings=(_SIGMOID_128E_TOP8,),
        activations=("swiglu", "geglu"),
    ),
    *_trtllm_gen_grids(
        "test_deepseekv3_routing",
        _ALL_FP4,
        tokens=(8, 3072),
        hiddens=(1024,),
        intermediates=(2688, 2048, 1024, 512),
        routings=(_NEMOTRON_3_SUPER, _DSV3),
        activations=("swiglu", "geglu", "relu2"),
        logits=("fp32",),
    ),
    *_trtllm_gen_grids(
        "test_deepseekv3_routing[fused_shared]",
        _ALL_FP4,
        tokens=(8, 3072),
        hiddens=(1024,),
        intermediates=(2688, 2048, 1024, 512),
        routings=(_DSV3_FUSED_SHARED,),
        activations=("swiglu", "geglu", "relu2"),
        logits=("fp32",),
    ),
    *_trtllm_gen_grids(
        "test_topk_routing",
        (NVFP4, MXFP4_MXFP8),
        tokens=(8, 128),
        hiddens=(1024,),
        intermediates=(384, 512, 768, 1024),
        routings=(_TOPK_16E_TOP2,),
        activations=("swiglu", "geglu", "situ"),
        logits=("fp32", "bf16"),
    ),
    *_trtllm_gen_grids(
        "test_llama4_routing",
        (NVFP4,),
        tokens=(8, 768, 3072),
        hiddens=(1024,),
        intermediates=(1024, 2048),
        routings=(_LLAMA4,),
        activations=("swiglu",),
    ),
    *_trtllm_gen_grids(
        "test_fp4_moe_gemm_bias",
        (MXFP4_MXFP8, NVFP4),
        tokens=(32, 768, 3072),
        hiddens=(1024,),
        intermediates=(2048, 1024, 768, 512),
        routings=(_BIAS_8E_TOP2,),
        activations=("swiglu",),
    ),
    *_trtllm_gen_grids(
        "test_fp4_moe_gemm_bias_changes_output",
        (MXFP4_MXFP8,),
        tokens=(32,),
        hiddens=(1024,),
        intermediates=(512,),
        routings=(_BIAS_8E_TOP2,),
        activations=("swiglu",),
    ),
    *_trtllm_gen_grids(
        "test_deepseek_ngroup1_block_per_token_routing",
        (NVFP4,),
        tokens=(8, 32),
        hiddens=(512,),
        intermediates=(512,),
        routings=(_NGROUP1_384E_TOP6, _NGROUP1_512E_TOP22),
        activations=("swiglu", "relu2"),
    ),
    *_trtllm_gen_grids(
        "test_moe_lora_delta",
        _ALL_FP4,
        tokens=(8, 128),
        hiddens=(1024,),
        intermediates=(1024,),
        routings=(_LORA_RENORM,),
        activations=("swiglu",),
    ),
    *_trtllm_gen_grids(
        "test_fp4_block_scale_deepseekv3_unfinalized_weight_dtype",
        (NVFP4,),
        tokens=(128,),
        hiddens=(1024,),
        intermediates=(1024,),
        routings=(_Routing(256, 8, (1024,), ("swiglu",)),),
        activations=("swiglu",),
        logits=("fp32",),
    ),
    *_trtllm_gen_grids(
        "test_renormalize_routing",
        _ALL_FP4,
        source=FI_RENORM_FP4,
        tokens=(8, 3072),
        hiddens=(1024,),
        intermediates=(1024, 768, 512, 384),
        routings=(_QWEN3_MOE, _QWEN3_NEXT, _RENORM_LARGE_EXPERTS),
        activations=("swiglu",),
    ),
)

# --------------------------------------------------------------------------------------------------
# FlashInfer CUTLASS fused MoE (test_trtllm_cutlass_fused_moe.py)
# --------------------------------------------------------------------------------------------------

# Module defaults BATCH_SIZES=[1], HIDDEN_SIZES=[128], NUM_EXPERTS=[2], TOP_K_VALUES=[2], INTERMEDIATE_SIZES=[128].
_CUTLASS_DEFAULT = ((128,), (128,), ((2, 2),), (1,))
# NDIM_PADDING_*: batch [1, 4, 8], hidden [2048], experts [128], top_k [8], intermediate [768, 1024].
_CUTLASS_NDIM = ((768, 1024), (2048,), ((128, 8),), (1, 4, 8))
# W4A16_*_CONFIGS rows are (batch_size, hidden_size, num_experts, top_k, intermediate_size).
_W4A16_CORRECTNESS = (
    (1, 128, 2, 2, 128),
    (4, 128, 4, 2, 128),
    (4, 768, 8, 2, 512),
    (4, 2048, 8, 4, 1024),
    (4, 4096, 8, 4, 2048),
)
_W4A16_COVERAGE = (
    (1, 4096, 256, 6, 2048),
    (4, 2048, 256, 6, 1024),
    (4, 4096, 8, 2, 2048),
    (4, 4096, 256, 1, 2048),
    (4, 4096, 256, 8, 2048),
)
_W4A16_ACTIVATIONS = ((4, 4096, 8, 4, 2048),)  # three (alpha, beta, limit) variants of one shape


def _w4a16(rows: Iterable[tuple[int, int, int, int, int]]) -> tuple[MoeGridPoint, ...]:
    return dedupe(MoeGridPoint(i, h, e, k, m, True) for m, h, e, k, i in rows)


CUTLASS_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4",
        source=f"{FI_CUTLASS}::test_moe_nvfp4",
        format="nvfp4",
        backend="flashinfer-cutlass",
        # activation_type in {Swiglu, SwigluStep} (gated) and Relu2 (non-gated).
        points=moe_product(*_CUTLASS_DEFAULT, gated=(True, False)),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_unaligned_hidden_size",
        source=f"{FI_CUTLASS}::test_moe_nvfp4_unaligned_hidden_size",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=dedupe(
            MoeGridPoint(i, h, 2, 2, t, True)
            for t, (h, i) in itertools.product((1, 4), ((288, 128), (288, 192), (160, 192), (320, 160), (256, 192)))
        ),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_ndim_padding_safety",
        source=f"{FI_CUTLASS}::test_moe_nvfp4_ndim_padding_safety",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=moe_product(*_CUTLASS_NDIM),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_unswizzled_input_sf",
        source=f"{FI_CUTLASS}::test_moe_nvfp4_unswizzled_input_sf",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=moe_points((128, 128, 4, 2, 32, True)),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_mxfp8_mxfp4",
        source=f"{FI_CUTLASS}::test_moe_mxfp8_mxfp4",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=moe_product(*_CUTLASS_DEFAULT),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_mxfp8_mxfp4_ndim_padding_safety",
        source=f"{FI_CUTLASS}::test_moe_mxfp8_mxfp4_ndim_padding_safety",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=moe_product(*_CUTLASS_NDIM),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4",
        source=f"{FI_CUTLASS}::test_moe_bf16_mxfp4",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=moe_product(*_CUTLASS_DEFAULT),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_correctness",
        source=f"{FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_correctness",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_CORRECTNESS),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_coverage",
        source=f"{FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_coverage",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_COVERAGE),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_activations",
        source=f"{FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_activations",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_ACTIVATIONS),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_fp8_mxfp4_humming_prescale_hopper_correctness",
        source=f"{FI_CUTLASS}::test_moe_fp8_mxfp4_humming_prescale_hopper_correctness",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        # PHASE3_HUMMING_E2E_CASES (n = I, k = H, e = local experts): small, ep_rank1 (EP 2, rank 1),
        # wide_offset, small_k384, small_k768, e256_config, e32_config.
        points=moe_points(
            (512, 512, 2, 2, 4, True),
            (384, 384, 8, 2, 16, True),
            (768, 768, 8, 2, 16, True),
            (256, 4096, 256, 1, 8, True),
            (2048, 4096, 32, 1, 8, True),
        ),
    ),
)

# --------------------------------------------------------------------------------------------------
# FlashInfer unified-MoE fuzzer (test_unified_moe_fuzz.py)
# --------------------------------------------------------------------------------------------------

FUZZ_HIDDEN: tuple[int, ...] = (256, 512, 1024, 1536, 2048, 3072)
FUZZ_INTERMEDIATE: tuple[int, ...] = (256, 512, 768, 1024, 1408, 1536)
FUZZ_EXPERTS: tuple[int, ...] = (8, 16, 32, 64, 72, 128, 160, 256, 512)
FUZZ_TOPK: tuple[int, ...] = (1, 2, 4, 6, 8)
FUZZ_TOKENS: tuple[int, ...] = (1, 2, 3, 7, 17, 64, 127, 129, 256, 1024, 2048, 4095, 4096, 4097)
FUZZ_WEIGHT_ELEM_BUDGET = 500_000_000


def _fuzz_weight_elems(experts: int, hidden: int, intermediate: int) -> int:
    """``_weight_elems``: ``E * (2*I*H + H*I)`` bf16 weight elements of w13 plus w2."""
    return experts * (2 * intermediate * hidden + hidden * intermediate)


_FUZZ_POOL: tuple[MoeGridPoint, ...] = tuple(
    MoeGridPoint(i, h, e, k, t, True)
    for i, h, e, k, t in itertools.product(FUZZ_INTERMEDIATE, FUZZ_HIDDEN, FUZZ_EXPERTS, FUZZ_TOPK, FUZZ_TOKENS)
    if k <= e and _fuzz_weight_elems(e, h, i) <= FUZZ_WEIGHT_ELEM_BUDGET
)

FUZZ_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="flashinfer/fuzz-pool/nvfp4",
        source=f"{FI_FUZZ}::test_unified_moe_fuzz[_gen pools, seeded random sample]",
        format="nvfp4",
        backend="flashinfer-unified-moe",  # CuteDslConfig, TrtllmFp4Config
        points=_FUZZ_POOL,
    ),
    Grid(
        name="flashinfer/fuzz-pool/mxfp4",
        source=f"{FI_FUZZ}::test_unified_moe_fuzz[_gen pools, seeded random sample]",
        format="mxfp4",
        backend="flashinfer-unified-moe",  # variants mxfp4 (TrtllmFp4Config), w4a16 (TrtllmFp4Config, CutlassW4A16Config)
        points=_FUZZ_POOL,
    ),
    Grid(
        name="flashinfer/fuzz-curated/nvfp4",
        source=f"{FI_FUZZ}::test_unified_moe_fuzz[_CURATED]",
        format="nvfp4",
        backend="flashinfer-unified-moe",
        # Seeds 900001-900008, 900024/900028 (EP: 32 local of 128 global), 900045 (fused shared S=1).
        points=moe_points(
            (512, 1024, 256, 8, 256, True),
            (1024, 2048, 64, 8, 4096, True),
            (1024, 1024, 128, 6, 2048, True),
            (512, 512, 512, 4, 512, True),
            (512, 1024, 256, 8, 256, True),
            (512, 1024, 64, 6, 512, True),
            (512, 512, 128, 4, 256, True),
            (768, 1024, 128, 8, 1024, True),
            (512, 512, 32, 4, 64, True),
            (512, 1024, 32, 8, 32, True),
        ),
    ),
    Grid(
        name="flashinfer/fuzz-curated/mxfp4",
        source=f"{FI_FUZZ}::test_unified_moe_fuzz[_CURATED]",
        format="mxfp4",
        backend="flashinfer-unified-moe",
        # mxfp4 seeds 900017, 900019, 900042, 900046 (fused shared S=2); w4a16 seeds 900018, 900021, 900043,
        # 900044 (fused shared S=1).
        points=moe_points(
            (512, 1024, 16, 4, 128, True),
            (512, 1024, 16, 4, 64, True),
            (512, 1024, 32, 8, 32, True),
        ),
    ),
    Grid(
        name="flashinfer/fuzz-cache-coherence/nvfp4",
        source=f"{FI_FUZZ}::test_autotune_cache_coherence",
        format="nvfp4",
        backend="flashinfer-unified-moe",
        # _CACHE_BASES (E, H, I) x _CACHE_TOKEN_SEQ [16, 256, 4095, 4096, 4097, 256, 16] on one layer, top_k 4.
        points=moe_product((512,), (1024,), ((32, 4),), (16, 256, 4095, 4096, 4097))
        + moe_product((512,), (512,), ((128, 4),), (16, 256, 4095, 4096, 4097)),
    ),
)
