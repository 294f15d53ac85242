"""Self-tests of ``bench.scaling``'s pure parts: worker counts, JUnit outcomes, rows, Markdown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import scaling
from harness import scheduling, workers


def test_default_worker_counts_double_up_to_auto() -> None:
    assert scaling.default_workers(16) == ["1", "2", "4", "8", "auto"]
    assert scaling.default_workers(12) == ["1", "2", "4", "8", "auto"]
    assert scaling.default_workers(2) == ["1", "auto"]
    assert scaling.default_workers(1) == ["auto"]


def test_a_repeated_worker_count_gets_a_row_of_its_own() -> None:
    """``--workers auto,auto`` measures the same count twice: two rows (and two JUnit files), not one overwritten."""
    assert scaling.row_names(["auto", "auto", "2", "auto"]) == ["auto", "auto-2", "2", "auto-3"]
    assert scaling.row_names(["1", "2", "auto"]) == ["1", "2", "auto"]


def test_outcomes_from_junit(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.test_a" name="test_bad" time="0.1"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_a" name="test_err" time="0.1"><error message="x"/></testcase>'
        '<testcase classname="tests.test_a" name="test_skip" time="0.0"><skipped message="no GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert scaling.outcomes(junit) == {
        "tests.test_a::test_ok": "passed",
        "tests.test_a::test_bad": "failed",
        "tests.test_a::test_err": "failed",
        "tests.test_a::test_skip": "skipped",
    }


def _run(wall: float, outcome: str = "passed", examples: int = 25, took: float = 2.0) -> dict:
    return {
        "wall_s": wall,
        "cpu_s": 2 * wall,
        "load": 0.5,
        "returncode": 0,
        "records": [{"worker": "gw0", "threads": 4, "cores": 16, "startup_s": 3.0}],
        "outcomes": {"t::a": outcome},
        "longest": [("t::a", 2.0)],
        "costliest": [("t::a", 3.5, 2.0)],
        "by_module": {"folders": {"conformance": 30.0, "tests": 5.0}, "modules": [["conformance/test_x.py", 3, 30.0]]},
        "examples": {"t::a": examples},
        "stats": {"t::a": {"examples": examples, "seconds": 2.0}},
        "dealt_by": scaling.dealt_by("2 passed\n" + scheduling.dealing(1, 1) + "\n"),
        "times": {"t::a": (took, "gw0")},
    }


def test_rows_compare_with_the_first_run_and_render() -> None:
    first = _run(100.0)
    same, other = (
        scaling.row("4", _run(25.0), first),
        scaling.row("auto", _run(20.0, examples=24, took=9.5), first, first),
    )
    assert same["slower_than_dealt"] == [] and other["slower_than_dealt"] == [["t::a", "gw0", 2.0, 9.5]]
    assert same["speedup"] == 4.0 and same["same_results"] and same["startup_median_s"] == 3.0
    assert not other["same_results"], "a different example count is a different result"
    report = {
        "date": "2026-12-01 08:00 UTC",
        "host": {"machine": "cpu", "usable_cores": 16, "torch": "2.13", "python": "3.11", "commit": "abc"},
        "targets": ["conformance"],
        "profile": "ci",
        "threads": None,
        "warmup_s": 62.0,
        "warmup": "9 passed, 1109 deselected",
        "runs": [scaling.row("1", first, first), same, other],
        "slowest": scaling.slowest(first),
    }
    report["runs"][-1] |= {"worker_ends_s": [20.0, 22.5, 25.0], "last_tests": [["t::a", "gw3", 15.0, 10.0]]}
    report["baseline"], report["ab"] = "old", [{"property": "t::a", "baseline": 4.0, "this": 12.5, "ratio": 3.12}]
    text = scaling.markdown(report)
    assert "; kernel-property warm-up 62.0 s before the first row (9 passed, 1109 deselected)" in text.splitlines()[2]
    assert "| 4 | 1 x 4 | 25.0 | 50.0 | 0.5 | 4.0x | 3.0 / 3.0 | 1 / 0 / 0 | yes | stored seconds (1/1) |" in text
    assert "| auto | 1 x 4 | 20.0 | 40.0 | 0.5 | 5.0x" in text and "| NO |" in text
    assert "| `t::a` | 25 | 2.0 | 12.5 |" in text
    assert "| `t::a` | 4.0 | 12.5 | 3.12x |" in text
    assert "| `t::a` | 3.5 | 2.0 |" in text  # the most CPU: test, CPU s, wall s
    assert "by folder: `conformance/` 30.0, `tests/` 5.0; the run's other 5.0 s are" in text  # 40 CPU s in all
    assert "| `conformance/test_x.py` | 3 | 30.0 |" in text
    assert "ended 20.0 / 22.5 / 25.0 s (min / median / max)" in text
    assert "- `t::a` (gw3): started at 15.0 s, took 10.0 s" in text
    assert "- `t::a` (gw0): dealt as 2.0 s, took 9.5 s" in text


def test_the_dealing_cell_reads_the_scheduler_s_line() -> None:
    assert scaling.short_dealing(scaling.dealt_by(scheduling.dealing(0, 9))) == "count"
    assert scaling.short_dealing(scaling.dealt_by(scheduling.dealing(812, 1092))) == "stored seconds (812/1092)"
    assert scaling.dealt_by("1 passed") is None and scaling.short_dealing(None) == "-"


def _junit(path: Path, cases: list[tuple[str, float, dict[str, object]]]) -> Path:
    """A JUnit XML report at ``path`` of ``cases``: test ``t::NAME`` (or ``CLASS::NAME``), its seconds and its
    properties."""
    body = ""
    for case, seconds, props in cases:
        cls, _, name = case.rpartition("::")
        listed = "".join(f'<property name="{k}" value="{v}" />' for k, v in props.items())
        body += f'<testcase classname="{cls or "t"}" name="{name}" time="{seconds}">'
        body += (f"<properties>{listed}</properties>" if props else "") + "</testcase>"
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_costliest_reads_each_tests_cpu_property(tmp_path: Path) -> None:
    junit = _junit(tmp_path / "junit.xml", [("a", 1.0, {"cpu_s": 0.5}), ("b", 2.0, {"cpu_s": 4.25}), ("c", 9.0, {})])
    assert scaling.costliest(junit) == [("t::b", 4.2, 2.0), ("t::a", 0.5, 1.0)]


def test_cpu_by_module_splits_the_tests_seconds_by_folder_and_module(tmp_path: Path) -> None:
    cases = [
        ("tests.test_fleet::a", 1.0, {"cpu_s": 2.5}),
        ("tests.test_fleet.TestHosts::b", 1.0, {"cpu_s": 1.0}),  # a test of a class: its module's
        ("conformance.test_moe_sharding::c[x]", 1.0, {"cpu_s": 4.0}),
        ("tests.test_sizes::d", 1.0, {"cpu_s": 0.25}),
        ("tests.test_sizes::e", 1.0, {}),  # no CPU seconds recorded: not counted
    ]
    by = scaling.cpu_by_module(_junit(tmp_path / "junit.xml", cases), n=2)
    assert by == {
        "folders": {"conformance": 4.0, "tests": 3.8},
        "modules": [["conformance/test_moe_sharding.py", 1, 4.0], ["tests/test_fleet.py", 2, 3.5]],
    }
    assert scaling.module_of("t") == "t"  # no test_* part: the class name itself


def test_each_test_reports_its_cpu_seconds() -> None:
    """The teardown report carries the CPU seconds since the test's setup, a waited-for child's included
    (``harness.workers``' report hook, driven as pytest drives a hook wrapper)."""
    item, report = SimpleNamespace(stash=pytest.Stash(), config=SimpleNamespace()), SimpleNamespace(user_properties=[])
    workers.pytest_runtest_setup(item)
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)
    hook = workers.pytest_runtest_makereport(item, SimpleNamespace(when="teardown"))
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(SimpleNamespace(get_result=lambda: report))
    props = dict(report.user_properties)
    assert props["cpu_s"] >= 0.25 and props["worker"] == "main" and props["ended_s"] > 0


def test_slower_than_dealt_names_the_tests_that_outran_their_stored_seconds(tmp_path: Path) -> None:
    before = scaling.timed(_junit(tmp_path / "before.xml", [("a", 0.05, {}), ("b", 3.0, {}), ("c", 1.0, {})]))
    ran = [("a", 7.6, {"worker": "gw7"}), ("b", 3.5, {"worker": "gw1"}), ("c", 2.5, {"worker": "gw2"}), ("d", 9.0, {})]
    after = scaling.timed(_junit(tmp_path / "after.xml", ran))
    assert after["t::a"] == (7.6, "gw7") and after["t::d"] == (9.0, None)
    # b is 0.5 s over (under the 1 s threshold); d was not in the run before
    assert scaling.slower_than_dealt(after, before) == [["t::a", "gw7", 0.05, 7.6], ["t::c", "gw2", 1.0, 2.5]]
    assert scaling.slower_than_dealt(after, before, n=1) == [["t::a", "gw7", 0.05, 7.6]]


def test_tail_names_the_tests_that_ended_last(tmp_path: Path) -> None:
    cases = [("a", 1.0, ("gw0", 5.0)), ("b", 12.0, ("gw1", 30.0)), ("c", 2.0, ("gw2", 20.0))]
    listed = [(name, t, {"worker": w, "ended_s": end}) for name, t, (w, end) in cases]
    junit = _junit(tmp_path / "junit.xml", [*listed, ("d", 9.0, {})])
    assert scaling.tail(junit, n=2) == {
        "worker_ends_s": [5.0, 20.0, 30.0],
        "last_tests": [["t::b", "gw1", 18.0, 12.0], ["t::c", "gw2", 18.0, 2.0]],
    }


def test_the_warm_up_selects_every_kernel_property() -> None:
    """The warm-up names every hardware marker: a kernel property it misses compiles its kernels in the first row,
    whose wall time is the speed-up's numerator (AITER's Triton properties, marked ``aiter_triton`` only, did)."""
    from conformance import test_aiter_triton_kernels, test_fp8_moe_triton_kernel
    from harness.preflight import HARDWARE

    assert set(scaling.KERNEL_MARKERS.split(" or ")) == HARDWARE
    for module in (test_aiter_triton_kernels, test_fp8_moe_triton_kernel):
        assert {m.name for m in module.pytestmark} & HARDWARE, module.__name__


def test_the_warm_up_reports_what_ran() -> None:
    """The report names the warm-up's counts, so that a warm-up that selected or passed too little shows."""
    out = "F.s\nSKIPPED [1] x.py:3: needs an NVIDIA GPU\n== 1 failed, 1 passed, 1 skipped, 3 deselected in 4.20s ==\n"
    assert scaling.outcome_line(out) == "1 failed, 1 passed, 1 skipped, 3 deselected"
    assert scaling.outcome_line("9 passed, 1109 deselected in 61.99s (0:01:01)") == "9 passed, 1109 deselected"
    assert scaling.outcome_line("ERROR: usage") is None
