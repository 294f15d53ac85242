"""Every kernel property has its execution entry (``backends/executions.json``), and a run's results fold into it.

A kernel property (a test generated with ``kernel=True``, one per backend parameter) added without an entry, or
an entry left behind by a renamed or removed property, fails here; ``docs/executions.md`` is regenerated from the
entries (``tests/test_tables.py``). The fold is shown on a results folder as a run leaves it: a kernel test that
passed or failed replaces its entry, a skipped one and a test of no kernel do not, an unknown node id and an
unfinished run are refused; a check's :func:`harness.properties.record_error` reaches the test's statistics.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from contracts.errors import LibraryUnavailable
from harness import executions, records, runner
from harness.checkout import ROOT
from harness.plugin import parametrized_backends
from harness.properties import record_error
from tests import batch


def _marks(obj: object) -> list[pytest.Mark]:
    marks = getattr(obj, "pytestmark", [])
    return [getattr(m, "mark", m) for m in (marks if isinstance(marks, list) else [marks])]


def kernel_properties() -> list[str]:
    """The node ids of the kernel properties of ``conformance/``, as pytest collects them."""
    found = []
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        module = importlib.import_module(f"conformance.{path.stem}")
        for name, test in vars(module).items():
            inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)  # what @given wraps
            if not name.startswith("test_") or not getattr(getattr(inner, "__fp4_spec__", None), "kernel", False):
                continue
            marks = [*_marks(test), *_marks(module)]  # the test's own marks are the closest
            contract = next(m.args[0] for m in marks if m.name == "contract")
            chosen = next((m for m in marks if m.name == "backends"), None)
            for backend in parametrized_backends(contract, chosen):
                found.append(f"conformance/{path.name}::{name}[{backend.value}]")
    return found


def test_every_kernel_property_has_an_execution_entry() -> None:
    properties, data = set(kernel_properties()), executions.load()
    assert len(properties) >= 20  # the enumeration finds the kernel modules' tests
    missing, stale = sorted(properties - set(data)), sorted(set(data) - properties)
    assert not missing, (
        f"kernel properties without an entry in backends/executions.json (null: never executed): {missing}"
    )
    assert not stale, f"entries of backends/executions.json that name no kernel property: {stale}"


def test_entries_state_what_ran() -> None:
    for nodeid, e in executions.load().items():
        if e is None:
            continue
        assert e["outcome"] in executions.RAN, nodeid
        assert e["hardware"] != "cpu" and e["date"] and e["versions"].get("torch") and e["source"], nodeid
        assert e["worst_error"] is None or e["worst_error"] >= 0, nodeid


def _results(folder: Path, state: str, stats: dict[str, dict[str, object]]) -> Path:
    folder.mkdir()
    run = {
        "run_id": "abc",
        "state": state,
        "started": "2026-12-03T10:00:00Z",
        "finished": "2026-12-03T10:05:00Z",
        "subject": "builtin",
        "profile": "ci",
        "hardware": "sm100 (NVIDIA B200 x1)",
        "commit": "1234567",
        "versions": {"python": "3.12.3"},
    }
    records.write_json(folder / records.RUN, run)
    records.write_json(folder / "device-gw0.json", {"worker": "gw0", "versions": {"python": "3.12.3", "torch": "2.11"}})
    records.write_json(folder / "stats-gw0.json", stats)
    return folder


def test_a_run_folds_its_executed_kernel_tests(tmp_path: Path) -> None:
    ran, skipped, cpu = "k.py::test_a[x]", "k.py::test_b[x]", "c.py::test_c"
    data = tmp_path / "executions.json"
    executions.save({ran: None, skipped: None}, data)
    stats = {
        ran: {"kernel": True, "outcome": "failed", "examples": 7, "worst_error": 1.5},
        skipped: {"kernel": True, "outcome": "skipped", "examples": 1, "worst_error": None},
        cpu: {"kernel": False, "outcome": "passed", "examples": 25, "worst_error": None},
    }
    folder = _results(tmp_path / "run", records.COMPLETE, stats)
    assert executions.fold([folder], data) == [ran]
    got = executions.load(data)
    assert got[skipped] is None
    assert got[ran] == {
        "hardware": "sm100 (NVIDIA B200 x1)",
        "date": "2026-12-03",
        "commit": "1234567",
        "versions": {"python": "3.12.3", "torch": "2.11"},
        "subject": "builtin",
        "profile": "ci",
        "outcome": "failed",
        "examples": 7,
        "worst_error": 1.5,
        "source": "results run abc",
    }
    assert f"| `{ran}` | sm100 (NVIDIA B200 x1) | 2026-12-03 |" in executions.table(got, "")
    assert f"| `{skipped}` | never executed |" in executions.table(got, "")


def test_fold_refuses_an_unknown_property_and_an_unfinished_run(tmp_path: Path) -> None:
    data = tmp_path / "executions.json"
    executions.save({}, data)
    stats = {"k.py::test_new[x]": {"kernel": True, "outcome": "passed", "examples": 3, "worst_error": 0.1}}
    with pytest.raises(KeyError, match=r"k\.py::test_new\[x\]"):
        executions.fold([_results(tmp_path / "done", records.COMPLETE, stats)], data)
    with pytest.raises(records.RecordError, match="not complete"):
        executions.fold([_results(tmp_path / "killed", records.RUNNING, stats)], data)
    assert json.loads(data.read_text()) == {}


def test_record_error_keeps_the_worst_ratio_of_a_kernel_test(monkeypatch: pytest.MonkeyPatch) -> None:
    def check_probe(config: object, backend: None, policy: None) -> None:
        record_error(float(config), "probe")  # type: ignore[arg-type]

    check_probe.__fp4_check__ = ("probe", float)  # type: ignore[attr-defined]

    class Ratio(float):
        def to_dict(self) -> dict[str, float]:
            return {"ratio": float(self)}

    state = runner.RunState(nodeid="k.py::test_probe[x]")
    monkeypatch.setattr(runner, "_active", state)
    for ratio in (0.25, 0.75, 0.5):
        runner.run_check(check_probe, Ratio(ratio), None, None, kernel=True, state=state)
    with pytest.raises(pytest.skip.Exception):
        runner.run_check(_unavailable, Ratio(0.0), None, None, kernel=True, state=state)
    stats = state.stats["k.py::test_probe[x]"]
    assert (stats.kernel, stats.examples, stats.worst_error) == (True, 4, 0.75)


@pytest.mark.long(20)
def test_a_run_leaves_what_the_fold_reads(tmp_path: Path) -> None:
    """A real run: a CPU property's statistics carry its outcome, the worker's device record its library versions;
    a kernel property this machine cannot run is skipped before its first example and folds into nothing."""
    kernel = "conformance/test_nvfp4_moe.py::test_scale_interleave_kernel[flashinfer-trtllm]"
    cpu = "conformance/test_shared_expert.py::test_decision_table"
    results = tmp_path / "results"
    args = ["-p", "no:cacheprovider", "-q", "--results", str(results), kernel, cpu]
    proc = batch.run(batch.Run(args, env=batch.suite_env(**batch.CPU_ONLY)), tmp_path / "run", 600)
    assert proc.returncode == 0, proc.stdout[-2000:]
    stats = json.loads((results / "stats-main.json").read_text())
    assert (stats[cpu]["outcome"], stats[cpu]["kernel"]) == ("passed", False)
    assert kernel not in stats or stats[kernel]["outcome"] == "skipped"
    assert json.loads((results / "device-main.json").read_text())["versions"]["torch"]
    assert executions.from_results(results) == {}


def _unavailable(config: object, backend: None, policy: None) -> None:
    raise LibraryUnavailable("no GPU")


_unavailable.__fp4_check__ = ("probe", float)  # type: ignore[attr-defined]
