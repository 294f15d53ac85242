"""The backend records' ``violations`` oracles against every measured kernel truth table (:mod:`backends.truth`)."""

from __future__ import annotations

from unittest import mock

import pytest

from adapters import triton_kernels as tk
from backends import truth
from backends.kernel_defects import TRITON_KERNELS_MOE_DEFECTS, covering

TABLES = truth.tables()


def test_tables_are_present_and_well_formed() -> None:
    assert TABLES, f"no kernel truth tables in {truth.TABLES}"
    for table in TABLES:
        for key in ("kernel", "hardware", "versions", "date", "command", "points"):
            assert key in table, f"{table['file']} has no {key!r}"
        assert {p["outcome"] for p in table["points"]} <= set(truth.OUTCOMES), table["file"]
        assert table["kernel"] in truth.ORACLES, f"{table['file']}: no oracle for kernel {table['kernel']!r}"


@pytest.mark.parametrize("table", TABLES, ids=[t["file"] for t in TABLES])
def test_record_agrees_with_measurement(table: dict) -> None:
    """Each loud or silent point is a violation of the record and each correct point is not, unless excused."""
    assert truth.disagreements(table) == []


def test_dropping_the_odd_group_rule_is_caught() -> None:
    """Without the K % 64 rule the triton-kernels-sm90 record calls measured silently-wrong points fine
    (K = 96: 3 groups stored as 4, the 4 the kernel reads)."""
    table = next(t for t in TABLES if t["kernel"] == "triton-kernels-sm90")
    with mock.patch.object(tk, "ODD_GROUPS_K", 1):
        found = truth.disagreements(table)
    assert any("'k': 96," in line and "silent" in line for line in found), found


def test_dropping_the_scale_tile_rule_is_caught() -> None:
    """Without the stored-vs-read rule the record accepts the measured non-finite K = 960 (30 groups, 32 read)."""
    table = next(t for t in TABLES if t["kernel"] == "triton-kernels-sm90")
    with mock.patch.object(tk, "read_scale_groups", lambda k: 0):
        found = truth.disagreements(table)
    assert any("'k': 960," in line for line in found), found


def test_odd_group_defect_record_matches_measurement() -> None:
    """``TRITON_KERNELS_MOE_DEFECTS`` covers exactly the measured odd-group points, each of them silently wrong."""
    table = next(t for t in TABLES if t["kernel"] == "triton-kernels-sm90")
    for point in table["points"]:
        if point["outcome"] == "loud":
            continue
        k, n = int(point["k"]), int(point["n"])
        covered = covering(TRITON_KERNELS_MOE_DEFECTS, "triton-kernels-sm90", (n, k // 32))
        assert bool(covered) == (k % 64 == 32), point
        if covered:
            assert point["outcome"] == "silent", point
