"""Fixed FP4 MoE / MXFP4 shape grids of FlashInfer's and vLLM's own tests, as plain data.

Every :class:`Grid` names the repository, revision, file and test function it was read from, and holds the
shapes that test actually runs: the cartesian product of its ``pytest.mark.parametrize`` lists minus the
combinations the test (or its shared ``skip_checks``) skips. Points that differ only in dtype, bias, autotune,
layout flags, LoRA mode or other non-shape parameters are deduplicated. All these tests are single-GPU, so
every point is per rank (TP=1).

Conventions
-----------
* ``MoeGridPoint.intermediate`` is the per-expert intermediate size I (``w13`` has ``2*I`` rows when
  ``gated``, ``I`` rows otherwise); ``hidden`` is H; ``experts`` is the number of routed experts whose
  weights this rank holds (the EP shard size where a test shards); ``tokens`` is the number of token rows
  fed to the layer.
* ``tokens == 0`` marks a weight-preparation-only test (no forward pass, no routing); ``top_k`` is then 1
  as a placeholder.
* Fused shared experts (FlashInfer ``num_fused_shared_experts = S``) are not counted in ``experts``; those
  layers carry ``experts + S`` weight rows. They are named in the grid names (``fused_shared``).
* ``LinearGridPoint`` is a dense GEMM: activations ``(m, k)`` times weight ``(n, k)``, output ``(m, n)``.
* Format ``"mxfp4"`` covers MXFP4 weights with any activation (MXFP8, BF16, FP8, MXFP4); the grid name says
  which. Format ``"nvfp4"`` is NVFP4 weights (and NVFP4 activations unless the name says otherwise).

Sources read (the grids below cite them)
----------------------------------------
* flashinfer-ai/flashinfer @ ``fb28d7242b3506a2348265962041acc1fb56cca4`` (main, 2026-08-22,
  ``version.txt`` 0.6.18), the newest revision read. The installed flashinfer-python 0.7.4 wheel
  was built from ``77039051b0be921788dc2784ec41423b558878ec``, which that revision does not contain, and the
  wheel ships no tests; so these grids may differ from the 0.7.4 tag.

  - ``tests/moe/test_trtllm_gen_fused_moe.py``: FP4 (``FP4Moe``) cases of ``test_sigmoid_routing``,
    ``test_deepseekv3_routing``, ``test_topk_routing``, ``test_llama4_routing``, ``test_fp4_moe_gemm_bias``,
    ``test_fp4_moe_gemm_bias_changes_output``, ``test_deepseek_ngroup1_block_per_token_routing``,
    ``test_moe_lora_delta`` and ``test_fp4_block_scale_deepseekv3_unfinalized_weight_dtype``, filtered by
    ``tests/moe/utils.py::skip_checks`` (reproduced in :func:`_trtllm_gen_skipped`).
  - ``tests/moe/test_trtllm_gen_fused_moe_routing_renormalize_fp4.py::test_renormalize_routing``: at this
    revision the FP4 Renormalize grid (``RENORMALIZE_*`` lists in ``trtllm_gen_fused_moe_utils.py``) lives
    in this sibling file, not in ``test_trtllm_gen_fused_moe.py``; it is included.
  - ``tests/moe/test_trtllm_cutlass_fused_moe.py``: ``test_moe_nvfp4``, ``test_moe_nvfp4_unaligned_hidden_size``,
    ``test_moe_nvfp4_ndim_padding_safety``, ``test_moe_nvfp4_unswizzled_input_sf``, ``test_moe_mxfp8_mxfp4``,
    ``test_moe_mxfp8_mxfp4_ndim_padding_safety``, ``test_moe_bf16_mxfp4`` (SM90 W4A16),
    ``test_moe_bf16_mxfp4_hopper_{correctness,coverage,activations}`` (SM90 W4A16) and
    ``test_moe_fp8_mxfp4_humming_prescale_hopper_correctness`` (SM90 FP8 x MXFP4).
  - ``tests/moe/test_unified_moe_fuzz.py``: the random pools ``_HIDDEN``, ``_INTERMED``, ``_EXPERTS``,
    ``_TOPK``, ``_TOKENS`` and ``_WEIGHT_ELEM_BUDGET``, the FP4 entries of ``_CURATED`` and
    ``test_autotune_cache_coherence``.

* vllm-project/vllm (main, 2026), each file at the commit named:

  - ``tests/kernels/moe/test_nvfp4_moe.py`` @ ``07b13497a9b52274d334090a9a8e04d5ec9ca7e9``
  - ``tests/kernels/moe/test_flashinfer_moe.py`` @ ``07bd9393a2bad56513f86d70a9e95d477aa597f0`` (the
    version at ``3ff2de9c96353a55f7e7a818b9d0c63b9f1e7eeb`` has the same grid)
  - ``tests/kernels/moe/test_flashinfer_nvfp4_cosine_similarity.py`` @ ``978a6a5e220bb6da7f3b50d65a730cae0fe911ae``
  - ``tests/kernels/moe/test_mxfp4_moe.py``: the newest revision read (83,682 characters; it has the SM90
    interleave, the MXFP8 x MXFP4 CUTLASS test and the ROCm oracle tests), whose commit was not recorded;
    the older versions at ``a485508d4114aa673cb266fa7e43b447f697451b`` and
    ``02d0c80196fc2e858c5c53f7751ef93a628a1217`` have the same trtllm-gen grid.
  - ``tests/quantization/test_trtllm_nvfp4_hidden_dim_padding.py`` @ ``12fef2fce5771cb157a72ca45f009bdd71b8615a``
  - ``tests/kernels/quantization/test_rocm_mxfp4.py`` @ ``01aae91ba16d313a628cf6e777178037f5f38ffa`` (the
    version at ``0ae1b30ba1d3a0a5e0bd59536ab69e70a07d8716`` is older and lacks the ASM guard tests)
  - ``tests/kernels/quantization/test_marlin_utils_fp4_padding.py`` @ ``c47bfadcf6847993a26bc0148b88db0f6a5ef158``

Ambiguities and judgement calls
-------------------------------
* trtllm-gen ``skip_checks`` skips SwiGLU when ``H > 1024`` or ``I > 1024`` ("for testing speed"), skips
  GeGLU above 128 tokens or outside NVFP4 / MXFP4xMXFP8, allows non-gated Relu2 only for NVFP4 among the FP4
  modes, and skips fp32 routing logits for both MXFP4 modes. ``MxFP4xBf16`` on SM103 is an xfail, not a skip;
  it is kept (these grids assume SM100).
* ``test_deepseekv3_routing`` runs fp32 logits only, so its MXFP4 cases are all skipped: it contributes NVFP4
  points only.
* ``test_topk_routing``'s ``Situ`` activation is gated (``flashinfer.tllm_enums._GATED_ACTIVATION_TYPES``).
* The fuzzer samples its pools with ``random.Random(seed)`` (seeds ``FLASHINFER_UMOE_FUZZ_SEED + i`` for 160
  tests by default). ``FUZZ_POOL_*`` is the full product of the size pools under the weight budget with
  non-EP experts; the fuzzer additionally draws EP shards (``local = E/2`` or ``E/4``, about 30 % of
  pre-routed draws when ``E >= 16``), forces ``top_k = 1`` for Llama4, restricts DeepSeekV3 ``top_k`` to
  experts reachable after the group mask, caps in-kernel-routed experts per method
  (``_FROMLOGITS_MAX_EXPERTS``), and always uses SwiGLU. It is a superset of what any seed draws.
* vLLM ``test_mxfp4_moe.py`` also parametrises Quark model-loading smoke tests (model ids, TP 1-8); they have
  no explicit layer shapes and are not encoded.
* In vLLM's ``test_trtllm_nvfp4_hidden_dim_padding.py`` and ``test_marlin_utils_fp4_padding.py`` the tensors
  are synthetic (scale tensors need not match the weight sizes); the points record the dimension each test
  pads, read from the weight tensors, with ``tokens = 0``.
* ``test_rocm_mxfp4.py`` writes A4W4 and preshuffled shapes as ``(M, K, N)`` and skinny shapes as ``M`` x
  ``(N, K)``; both are normalised to ``LinearGridPoint(m, n, k)`` here. Its ASM-swizzle truth table is keyed by
  the weight-scale shape ``(N, K/32)``: it lives once, as ``backends.mxfp4_linear.VLLM_GUARD_TABLE``, and
  :mod:`bench.grids_adapter` runs its 2-D rows as a grid, not as GEMM points.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoeGridPoint:
    """One MoE layer shape exactly as the test runs it (per rank; these tests are single-GPU, TP=1)."""

    intermediate: int
    hidden: int
    experts: int
    top_k: int
    tokens: int
    gated: bool


@dataclass(frozen=True)
class LinearGridPoint:
    """Dense MXFP4 GEMM: activations ``(m, k)`` times weight ``(n, k)``."""

    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Grid:
    """A named grid of points from one test function (``source`` = ``repo@rev:path::test_fn``)."""

    name: str
    source: str
    format: str
    backend: str
    points: tuple[MoeGridPoint, ...] | tuple[LinearGridPoint, ...]


# --------------------------------------------------------------------------------------------------
# Revisions and small helpers
# --------------------------------------------------------------------------------------------------

_FI = "flashinfer-ai/flashinfer@fb28d7242b35"
_FI_TRTLLM_GEN = f"{_FI}:tests/moe/test_trtllm_gen_fused_moe.py"
_FI_RENORM_FP4 = f"{_FI}:tests/moe/test_trtllm_gen_fused_moe_routing_renormalize_fp4.py"
_FI_CUTLASS = f"{_FI}:tests/moe/test_trtllm_cutlass_fused_moe.py"
_FI_FUZZ = f"{_FI}:tests/moe/test_unified_moe_fuzz.py"

_VLLM_NVFP4_MOE = "vllm-project/vllm@07b13497a9b5:tests/kernels/moe/test_nvfp4_moe.py"
_VLLM_FI_MOE = "vllm-project/vllm@07bd9393a2ba:tests/kernels/moe/test_flashinfer_moe.py"
_VLLM_COSINE = "vllm-project/vllm@978a6a5e220b:tests/kernels/moe/test_flashinfer_nvfp4_cosine_similarity.py"
_VLLM_MXFP4_MOE = "vllm-project/vllm@main-2026(newest-stored):tests/kernels/moe/test_mxfp4_moe.py"
_VLLM_HIDDEN_PAD = "vllm-project/vllm@12fef2fce577:tests/quantization/test_trtllm_nvfp4_hidden_dim_padding.py"
VLLM_ROCM_MXFP4 = "vllm-project/vllm@01aae91ba16d:tests/kernels/quantization/test_rocm_mxfp4.py"
_VLLM_MARLIN_PAD = "vllm-project/vllm@c47bfadcf684:tests/kernels/quantization/test_marlin_utils_fp4_padding.py"


def _dedupe(points: Iterable[MoeGridPoint]) -> tuple[MoeGridPoint, ...]:
    """Drop repeated points, keeping first-seen order."""
    return tuple(dict.fromkeys(points))


def _moe_product(
    intermediates: Iterable[int],
    hiddens: Iterable[int],
    experts_topk: Iterable[tuple[int, int]],
    tokens: Iterable[int],
    gated: Iterable[bool] = (True,),
) -> tuple[MoeGridPoint, ...]:
    """Cartesian product of parametrize lists (``experts_topk`` pairs are zipped, as the tests zip them)."""
    return _dedupe(
        MoeGridPoint(i, h, e, k, t, g)
        for i, h, (e, k), t, g in itertools.product(intermediates, hiddens, experts_topk, tokens, gated)
    )


def _moe_points(*rows: tuple[int, int, int, int, int, bool]) -> tuple[MoeGridPoint, ...]:
    """Literal points ``(intermediate, hidden, experts, top_k, tokens, gated)``."""
    return _dedupe(MoeGridPoint(*row) for row in rows)


def _linear_product(ms: Iterable[int], nks: Iterable[tuple[int, int]]) -> tuple[LinearGridPoint, ...]:
    """``M`` list times ``(N, K)`` list."""
    return tuple(LinearGridPoint(m, n, k) for m, (n, k) in itertools.product(ms, nks))


def _linear_mkn(*rows: tuple[int, int, int]) -> tuple[LinearGridPoint, ...]:
    """Points written ``(M, K, N)`` in the source test."""
    return tuple(LinearGridPoint(m, n, k) for m, k, n in rows)


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
    return _dedupe(
        MoeGridPoint(i, h, r.experts, r.top_k, t, act in _GATED_ACTIVATIONS)
        for t, h, i, r, act, lg in itertools.product(tokens, hiddens, intermediates, routings, activations, logits)
        if not _trtllm_gen_skipped(quant, t, h, i, r, act, lg)
    )


def _trtllm_gen_grids(test: str, quants: Iterable[str], source: str = _FI_TRTLLM_GEN, **params) -> tuple[Grid, ...]:
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
        source=_FI_RENORM_FP4,
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
    return _dedupe(MoeGridPoint(i, h, e, k, m, True) for m, h, e, k, i in rows)


CUTLASS_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4",
        source=f"{_FI_CUTLASS}::test_moe_nvfp4",
        format="nvfp4",
        backend="flashinfer-cutlass",
        # activation_type in {Swiglu, SwigluStep} (gated) and Relu2 (non-gated).
        points=_moe_product(*_CUTLASS_DEFAULT, gated=(True, False)),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_unaligned_hidden_size",
        source=f"{_FI_CUTLASS}::test_moe_nvfp4_unaligned_hidden_size",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_dedupe(
            MoeGridPoint(i, h, 2, 2, t, True)
            for t, (h, i) in itertools.product((1, 4), ((288, 128), (288, 192), (160, 192), (320, 160), (256, 192)))
        ),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_ndim_padding_safety",
        source=f"{_FI_CUTLASS}::test_moe_nvfp4_ndim_padding_safety",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_moe_product(*_CUTLASS_NDIM),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_nvfp4_unswizzled_input_sf",
        source=f"{_FI_CUTLASS}::test_moe_nvfp4_unswizzled_input_sf",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_moe_points((128, 128, 4, 2, 32, True)),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_mxfp8_mxfp4",
        source=f"{_FI_CUTLASS}::test_moe_mxfp8_mxfp4",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=_moe_product(*_CUTLASS_DEFAULT),
    ),
    Grid(
        name="flashinfer/cutlass/test_moe_mxfp8_mxfp4_ndim_padding_safety",
        source=f"{_FI_CUTLASS}::test_moe_mxfp8_mxfp4_ndim_padding_safety",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=_moe_product(*_CUTLASS_NDIM),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4",
        source=f"{_FI_CUTLASS}::test_moe_bf16_mxfp4",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_moe_product(*_CUTLASS_DEFAULT),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_correctness",
        source=f"{_FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_correctness",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_CORRECTNESS),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_coverage",
        source=f"{_FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_coverage",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_COVERAGE),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_bf16_mxfp4_hopper_activations",
        source=f"{_FI_CUTLASS}::test_moe_bf16_mxfp4_hopper_activations",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_w4a16(_W4A16_ACTIVATIONS),
    ),
    Grid(
        name="flashinfer/cutlass-sm90/test_moe_fp8_mxfp4_humming_prescale_hopper_correctness",
        source=f"{_FI_CUTLASS}::test_moe_fp8_mxfp4_humming_prescale_hopper_correctness",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        # PHASE3_HUMMING_E2E_CASES (n = I, k = H, e = local experts): small, ep_rank1 (EP 2, rank 1),
        # wide_offset, small_k384, small_k768, e256_config, e32_config.
        points=_moe_points(
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
        source=f"{_FI_FUZZ}::test_unified_moe_fuzz[_gen pools, seeded random sample]",
        format="nvfp4",
        backend="flashinfer-unified-moe",  # CuteDslConfig, TrtllmFp4Config
        points=_FUZZ_POOL,
    ),
    Grid(
        name="flashinfer/fuzz-pool/mxfp4",
        source=f"{_FI_FUZZ}::test_unified_moe_fuzz[_gen pools, seeded random sample]",
        format="mxfp4",
        backend="flashinfer-unified-moe",  # variants mxfp4 (TrtllmFp4Config), w4a16 (TrtllmFp4Config, CutlassW4A16Config)
        points=_FUZZ_POOL,
    ),
    Grid(
        name="flashinfer/fuzz-curated/nvfp4",
        source=f"{_FI_FUZZ}::test_unified_moe_fuzz[_CURATED]",
        format="nvfp4",
        backend="flashinfer-unified-moe",
        # Seeds 900001-900008, 900024/900028 (EP: 32 local of 128 global), 900045 (fused shared S=1).
        points=_moe_points(
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
        source=f"{_FI_FUZZ}::test_unified_moe_fuzz[_CURATED]",
        format="mxfp4",
        backend="flashinfer-unified-moe",
        # mxfp4 seeds 900017, 900019, 900042, 900046 (fused shared S=2); w4a16 seeds 900018, 900021, 900043,
        # 900044 (fused shared S=1).
        points=_moe_points(
            (512, 1024, 16, 4, 128, True),
            (512, 1024, 16, 4, 64, True),
            (512, 1024, 32, 8, 32, True),
        ),
    ),
    Grid(
        name="flashinfer/fuzz-cache-coherence/nvfp4",
        source=f"{_FI_FUZZ}::test_autotune_cache_coherence",
        format="nvfp4",
        backend="flashinfer-unified-moe",
        # _CACHE_BASES (E, H, I) x _CACHE_TOKEN_SEQ [16, 256, 4095, 4096, 4097, 256, 16] on one layer, top_k 4.
        points=_moe_product((512,), (1024,), ((32, 4),), (16, 256, 4095, 4096, 4097))
        + _moe_product((512,), (512,), ((128, 4),), (16, 256, 4095, 4096, 4097)),
    ),
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
    return _dedupe(
        MoeGridPoint(n, k, e, topk, m, g) for (m, n, k), (e, topk), g in itertools.product(mnk, experts_topk, gated)
    )


_E_40_64_256_TOPK_1_6_8 = tuple(itertools.product((40, 64, 256), (1, 6, 8)))

VLLM_MOE_GRIDS: tuple[Grid, ...] = (
    Grid(
        name="vllm/test_nvfp4_moe/test_cutlass_fp4_moe_no_graph",
        source=f"{_VLLM_NVFP4_MOE}::test_cutlass_fp4_moe_no_graph",
        format="nvfp4",
        backend="vllm-cutlass",
        points=_mnk_product(_VLLM_NVFP4_MNK, _E_40_64_256_TOPK_1_6_8),
    ),
    Grid(
        name="vllm/test_flashinfer_moe/test_flashinfer_fp4_moe_no_graph",
        source=f"{_VLLM_FI_MOE}::test_flashinfer_fp4_moe_no_graph",
        format="nvfp4",
        backend="flashinfer-cutlass",
        # activation in {silu_and_mul (gated), relu2 (non-gated)}.
        points=_mnk_product(_VLLM_FI_MNK, _E_40_64_256_TOPK_1_6_8, gated=(True, False)),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/gated",
        source=f"{_VLLM_COSINE}::test_flashinfer_nvfp4_cosine_similarity_gated",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/relu2",
        source=f"{_VLLM_COSINE}::test_flashinfer_nvfp4_cosine_similarity_relu2",
        format="nvfp4",
        backend="flashinfer-cutlass",
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS, gated=(False,)),
    ),
    Grid(
        name="vllm/test_flashinfer_nvfp4_cosine_similarity/vllm_cutlass_gated_baseline",
        source=f"{_VLLM_COSINE}::test_vllm_cutlass_nvfp4_cosine_similarity_gated_baseline",
        format="nvfp4",
        backend="vllm-cutlass",  # runs FlashInfer CUTLASS on the same points too
        points=_mnk_product(_VLLM_COSINE_MNK, _VLLM_COSINE_EXPERTS),
    ),
    # test_trtllm_gen_mxfp4_fused_moe: topk [1, 4] x E [32, 128] x tokens [1, 128, 1024] x (I, H) = (3072, 3072)
    # x (alpha, beta, limit) x transpose_optimized; act_type splits the activation format.
    Grid(
        name="vllm/test_mxfp4_moe/test_trtllm_gen_mxfp4_fused_moe/MxFP4xMxFP8",
        source=f"{_VLLM_MXFP4_MOE}::test_trtllm_gen_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-trtllm",
        points=_moe_product((3072,), (3072,), itertools.product((32, 128), (1, 4)), (1, 128, 1024)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_trtllm_gen_mxfp4_fused_moe/MxFP4xBf16",
        source=f"{_VLLM_MXFP4_MOE}::test_trtllm_gen_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-trtllm",
        points=_moe_product((3072,), (3072,), itertools.product((32, 128), (1, 4)), (1, 128, 1024)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_flashinfer_cutlass_mxfp4_fused_moe",
        source=f"{_VLLM_MXFP4_MOE}::test_flashinfer_cutlass_mxfp4_fused_moe",
        format="mxfp4",
        backend="flashinfer-cutlass-sm90",
        points=_moe_product((3072,), (3072,), ((32, 1), (32, 4)), (1, 128)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_flashinfer_cutlass_mxfp4_mxfp8_fused_moe",
        source=f"{_VLLM_MXFP4_MOE}::test_flashinfer_cutlass_mxfp4_mxfp8_fused_moe",
        format="mxfp4",
        backend="flashinfer-cutlass",
        points=_moe_product((3072,), (3072,), ((32, 1), (32, 4)), (1, 128)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle/aiter",
        source=f"{_VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle",
        format="mxfp4",
        backend="aiter-fused-moe",  # AITER_MXFP4_BF16, AITER_MXFP4_FP8 (SWIGLUOAI), AITER_MXFP4_MXFP4 (SILU)
        points=_moe_points((256, 256, 8, 4, 16, True)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle/triton",
        source=f"{_VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle",
        format="mxfp4",
        backend="vllm-triton-kernels",  # TRITON, TRITON_UNFUSED (SWIGLUOAI)
        points=_moe_points((256, 256, 8, 4, 16, True)),
    ),
    Grid(
        name="vllm/test_mxfp4_moe/test_rocm_mxfp4_moe_oracle_emulation_exact",
        source=f"{_VLLM_MXFP4_MOE}::test_rocm_mxfp4_moe_oracle_emulation_exact",
        format="mxfp4",
        backend="vllm-emulation",  # Mxfp4MoeBackend.EMULATION, SILU and SWIGLUOAI
        points=_moe_points((256, 256, 8, 1, 8, True)),
    ),
    Grid(
        name="vllm/test_trtllm_nvfp4_hidden_dim_padding",
        source=f"{_VLLM_HIDDEN_PAD}::test_shared_nvfp4_input_scales_have_writable_storage+test_align_trtllm_fp4_moe_*",
        format="nvfp4",
        backend="flashinfer-cutlass",  # prepare/align helpers only: FLASHINFER_CUTLASS backend, TRT-LLM alignment
        points=_moe_points(
            (2, 2, 3, 1, 0, False),  # writable input-scale storage: w13 (3, 2, 1) bytes, is_act_and_mul=False
            (8, 512, 2, 1, 0, False),  # hidden 512: no-op
            (12, 2688, 2, 1, 0, False),  # hidden 2688 -> 2816
            (160, 32, 1, 1, 0, True),  # per-half intermediate 160 -> 192 (min_alignment 64)
        ),
    ),
    Grid(
        name="vllm/test_marlin_utils_fp4_padding",
        source=f"{_VLLM_MARLIN_PAD}::test_pad_w13_*+test_pad_w2_for_marlin_tile_matches_design_table",
        format="nvfp4",
        backend="vllm-marlin",  # group_size 16 (NVFP4 blocks); e = 4, hidden = 32
        points=_moe_product((1856, 928, 464, 232), (32,), ((4, 1),), (0,), gated=(False, True)),
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
        points=_linear_mkn((64, 128, 64), (128, 256, 128), (128, 4096, 4096), (256, 4096, 11008), (64, 8192, 28672)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_a4w4_determinism",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_a4w4_determinism",
        format="mxfp4",
        backend="aiter-triton",
        points=_linear_mkn((128, 256, 128)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_preshuffled_tuned_shapes",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_preshuffled_tuned_shapes",
        format="mxfp4",
        backend="aiter-triton-preshuffle",  # gemm_afp4wfp4_preshuffle on PRESHUFFLED_SHAPES
        points=_linear_mkn((64, 4096, 8192), (32, 8192, 16384)),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_aiter_fp4_gemm_skinny_shapes",
        source=f"{VLLM_ROCM_MXFP4}::test_aiter_fp4_gemm_skinny_shapes",
        format="mxfp4",
        backend="aiter-triton",
        points=_linear_product((1, 2, 4, 8), ((4096, 4096), (4096, 11008), (8192, 8192))),
    ),
    Grid(
        name="vllm/test_rocm_mxfp4/test_qwen38_tp1_ba_96_row_scale_avoids_broken_asm",
        source=f"{VLLM_ROCM_MXFP4}::test_qwen38_tp1_ba_96_row_scale_avoids_broken_asm",
        format="mxfp4",
        backend="vllm-aiter-linear",  # AiterMxfp4LinearKernel must fall back to Triton; ASM gemm_a4w4 is wrong here
        points=_linear_product((8, 64), ((96, 5120),)),
    ),
)

# --------------------------------------------------------------------------------------------------
# Everything
# --------------------------------------------------------------------------------------------------

GRIDS: tuple[Grid, ...] = (*TRTLLM_GEN_GRIDS, *CUTLASS_GRIDS, *FUZZ_GRIDS, *VLLM_MOE_GRIDS, *VLLM_LINEAR_GRIDS)
