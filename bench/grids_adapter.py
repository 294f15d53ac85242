"""Map the libraries' fixed grids (:mod:`bench.grids`) onto the suite's configurations.

A MoE grid point becomes a TP=1 :class:`~strategies.moe.MoeShape` with the same intermediate
and hidden residues (sizes reduced as the strategies reduce them), a gated point SwiGLU and a
non-gated one relu²; experts, top-k and tokens are capped as the strategies cap them. A linear
grid point becomes the linear contract's configuration through its own constructor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from backends.mxfp4_linear import VLLM_GUARD_TABLE
from bench.grids import GRIDS, VLLM_ROCM_MXFP4, Grid, LinearGridPoint, MoeGridPoint
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from strategies.catalog import RELU2, SWIGLU
from strategies.moe import MoeShape, Sharding, reduce_size


def moe_shape(grid: Grid, p: MoeGridPoint, group: int) -> MoeShape | None:
    """The suite's shape for one grid point, or None when the point breaks the format's group."""
    if p.intermediate % group or p.hidden % group:
        return None
    experts = min(p.experts, 4)
    reduced = reduce_size(p.intermediate)
    return MoeShape(
        model=f"grid:{grid.name}", tp=1, ep=False, rank=0, sharding=Sharding.NONE, intermediate=reduced,
        real_intermediate=reduced, hidden=reduce_size(p.hidden), model_hidden=p.hidden,
        activation=SWIGLU if p.gated else RELU2, experts=experts, top_k=min(p.top_k, experts, 2),
        tokens=min(p.tokens, 6), seed=0,
    )  # fmt: skip


def linear_config(p: LinearGridPoint) -> Any | None:
    """The linear contract's configuration for ``(M, N, K)``, if that contract provides a constructor."""
    try:
        from strategies.linear import grid_layer
    except ImportError:
        return None
    return grid_layer(p.m, p.n, p.k)


def guard_truth_table() -> tuple[Grid, list[Any]]:
    """vLLM's ASM-guard unit-test table as a grid of scale shapes for the ``mxfp4_linear`` guard checks."""
    from strategies.linear import ScaleShapeCase

    source = f"{VLLM_ROCM_MXFP4}::test_asm_fp4_scale_swizzle_supported_shape_rules"
    grid = Grid("vllm/test_rocm_mxfp4/asm-guard-table", source, "mxfp4", "aiter-asm", ())
    return grid, [ScaleShapeCase(shape, "vLLM guard unit test") for shape, _ in VLLM_GUARD_TABLE if len(shape) == 2]


def grid_configs() -> Iterator[tuple[Grid, str, list[Any]]]:
    """``(grid, contract, configurations)`` for every grid a contract can run."""
    table, cases = guard_truth_table()
    yield table, "mxfp4_linear", list(dict.fromkeys(cases))
    for grid in GRIDS:
        if grid.points and isinstance(grid.points[0], MoeGridPoint):
            contract, group = ("nvfp4_moe", NVFP4_BLOCK) if grid.format == "nvfp4" else ("mxfp4_moe", MXFP4_BLOCK)
            configs = [moe_shape(grid, p, group) for p in grid.points]
        else:
            contract = "mxfp4_linear"
            configs = [linear_config(p) for p in grid.points]
        unique = list(dict.fromkeys(c for c in configs if c is not None))
        if unique:
            yield grid, contract, unique
