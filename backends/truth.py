"""Kernel truth tables: what kernels did when executed, as data the backend records are checked against.

``bench.kernel_truth`` writes one table per kernel and GPU architecture into :data:`TABLES`
(``<kernel>.<arch>.json``: hardware, versions, date, and one row per executed point classified
``correct``, ``loud`` or ``silent``). This module reads them and states, per kernel, how a point maps to
its backend record's ``violations`` oracle (:data:`ORACLES`) and which points the oracle may disagree with,
each with its reason (:data:`EXCEPTIONS`). ``tests/test_kernel_truth.py`` runs the comparison on CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adapters import triton_kernels as tk
from backends import record
from backends.fp8_moe import Fp8MoeBackend
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import Mxfp4MoeBackend

TABLES = Path(__file__).parent / "truth"
"""The folder of measured tables."""
OUTCOMES = ("correct", "loud", "silent")

Point = dict[str, object]


@dataclass(frozen=True)
class TruthException:
    """Points of ``kernel``'s tables (``applies``) where the measurement and the oracle may disagree, and why."""

    kernel: str
    applies: Callable[[Point], bool]
    reason: str


def _triton_sm90(point: Point) -> list[str]:
    """A ``matmul_ogs`` GEMM point (``k``, ``n``, ``groups_to``) through the ``triton-kernels-sm90`` record: FC2
    with ``I`` the point's K as the contract states it (:func:`adapters.triton_kernels.contract_k`: the scale
    groups the preparation stores, then the layout's own padding) and an aligned ``H``."""
    k, groups_to = int(point["k"]), int(point["groups_to"])
    stored = tk.stored_scale_groups(k, max(groups_to, tk.HOPPER_SCALE_ALIGN_K))
    violations = record(Mxfp4MoeBackend.TRITON_SM90).violations
    return violations(tk.contract_k(k, stored) if groups_to > 1 else k, 2 * tk.HOPPER_BLOCK_K, True, 2)


def _aiter_triton(point: Point) -> list[str]:
    """An AITER ``gemm_afp4wfp4`` point (``n``, ``k``, ``m``) through the ``aiter-triton`` record's ``accepts``
    (the weight-scale shape ``(N, K/32)``)."""
    shape = (int(point["n"]), int(point["k"]) // 32)
    return [] if record(AiterLinearPath.TRITON).accepts(shape) else [f"aiter-triton does not accept scale {shape}"]


def _triton_fp8_block(point: Point) -> list[str]:
    """A block-FP8 MoE point (``intermediate``, ``hidden``: a SiLU-gated layer handed over unpadded) through the
    ``triton-fp8-block`` record."""
    return record(Fp8MoeBackend.TRITON).violations(int(point["intermediate"]), int(point["hidden"]), True, 2)


ORACLES: dict[str, Callable[[Point], list[str]]] = {
    Mxfp4MoeBackend.TRITON_SM90.value: _triton_sm90,
    AiterLinearPath.TRITON.value: _aiter_triton,
    Fp8MoeBackend.TRITON.value: _triton_fp8_block,
}
"""Per kernel, its record's violations for one measured point (empty: the record calls it fine)."""

EXCEPTIONS = (
    TruthException(
        Mxfp4MoeBackend.TRITON_SM90.value,
        lambda p: p["outcome"] == "loud" and int(p["n"]) <= tk.REFUSED_OUTPUT_WIDTH,
        "N <= 128 is refused at compile time (tl.static_assert(W_TRANSPOSE)): a loud refusal no padding rule "
        "avoids, at widths no MXFP4 MoE model has (adapters.triton_kernels.REFUSED_OUTPUT_WIDTH)",
    ),
    TruthException(
        Mxfp4MoeBackend.TRITON_SM90.value,
        lambda p: p["outcome"] == "correct" and int(p["groups_to"]) == 1 and int(p["k"]) % tk.HOPPER_BLOCK_K == 64,
        "K % 128 == 64 with the layout's own padding reads two scale groups past the stored ones: right only "
        "while that memory happens to hold zeros (vLLM #47303); K = 960 in the same sweep came out non-finite",
    ),
)


def tables() -> list[dict[str, object]]:
    """Every table in :data:`TABLES`, each with its file name under ``"file"``."""
    return [{**json.loads(path.read_text()), "file": path.name} for path in sorted(TABLES.glob("*.json"))]


def excused(kernel: str, point: Point) -> TruthException | None:
    """The exception that covers ``point`` of ``kernel``, if any."""
    return next((x for x in EXCEPTIONS if x.kernel == kernel and x.applies(point)), None)


def disagreements(table: dict[str, object]) -> list[str]:
    """Points of ``table`` where the record's oracle and the measurement disagree, none excused: a loud or silent
    point the oracle accepts, or a correct point it rejects. Raises ``KeyError`` for a kernel without an oracle."""
    kernel = str(table["kernel"])
    oracle = ORACLES[kernel]
    found = []
    for point in table["points"]:  # type: ignore[union-attr]
        rejected = oracle(point)
        if bool(rejected) == (point["outcome"] != "correct") or excused(kernel, point):
            continue
        said = "; ".join(rejected) if rejected else "no violation"
        found.append(f"{table['file']}: {point} measured {point['outcome']}, the record says {said}")
    return found
