"""The grids' data model (:class:`Grid` of :class:`MoeGridPoint` / :class:`LinearGridPoint`), the upstream
revisions they were read from, and the helpers that spell their points (conventions: :mod:`bench.grids`)."""

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

FI = "flashinfer-ai/flashinfer@fb28d7242b35"
FI_TRTLLM_GEN = f"{FI}:tests/moe/test_trtllm_gen_fused_moe.py"
FI_RENORM_FP4 = f"{FI}:tests/moe/test_trtllm_gen_fused_moe_routing_renormalize_fp4.py"
FI_CUTLASS = f"{FI}:tests/moe/test_trtllm_cutlass_fused_moe.py"
FI_FUZZ = f"{FI}:tests/moe/test_unified_moe_fuzz.py"

VLLM_NVFP4_MOE = "vllm-project/vllm@07b13497a9b5:tests/kernels/moe/test_nvfp4_moe.py"
VLLM_FI_MOE = "vllm-project/vllm@07bd9393a2ba:tests/kernels/moe/test_flashinfer_moe.py"
VLLM_COSINE = "vllm-project/vllm@978a6a5e220b:tests/kernels/moe/test_flashinfer_nvfp4_cosine_similarity.py"
VLLM_MXFP4_MOE = "vllm-project/vllm@main-2026(newest-stored):tests/kernels/moe/test_mxfp4_moe.py"
VLLM_HIDDEN_PAD = "vllm-project/vllm@12fef2fce577:tests/quantization/test_trtllm_nvfp4_hidden_dim_padding.py"
VLLM_ROCM_MXFP4 = "vllm-project/vllm@01aae91ba16d:tests/kernels/quantization/test_rocm_mxfp4.py"
VLLM_MARLIN_PAD = "vllm-project/vllm@c47bfadcf684:tests/kernels/quantization/test_marlin_utils_fp4_padding.py"


def dedupe(points: Iterable[MoeGridPoint]) -> tuple[MoeGridPoint, ...]:
    """Drop repeated points, keeping first-seen order."""
    return tuple(dict.fromkeys(points))


def moe_product(
    intermediates: Iterable[int],
    hiddens: Iterable[int],
    experts_topk: Iterable[tuple[int, int]],
    tokens: Iterable[int],
    gated: Iterable[bool] = (True,),
) -> tuple[MoeGridPoint, ...]:
    """Cartesian product of parametrize lists (``experts_topk`` pairs are zipped, as the tests zip them)."""
    return dedupe(
        MoeGridPoint(i, h, e, k, t, g)
        for i, h, (e, k), t, g in itertools.product(intermediates, hiddens, experts_topk, tokens, gated)
    )


def moe_points(*rows: tuple[int, int, int, int, int, bool]) -> tuple[MoeGridPoint, ...]:
    """Literal points ``(intermediate, hidden, experts, top_k, tokens, gated)``."""
    return dedupe(MoeGridPoint(*row) for row in rows)


def linear_product(ms: Iterable[int], nks: Iterable[tuple[int, int]]) -> tuple[LinearGridPoint, ...]:
    """``M`` list times ``(N, K)`` list."""
    return tuple(LinearGridPoint(m, n, k) for m, (n, k) in itertools.product(ms, nks))


def linear_mkn(*rows: tuple[int, int, int]) -> tuple[LinearGridPoint, ...]:
    """Points written ``(M, K, N)`` in the source test."""
    return tuple(LinearGridPoint(m, n, k) for m, k, n in rows)
