"""``python -m harness.findings`` on fake finding folders: each exit status read as its verdict, and which fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import findings as hf

SCRIPTS = {
    "sglang-reproduces": "import sys\nprint('REPRODUCES: the engine error')\nsys.exit(1)\n",
    "sglang-fixed": "print('every configuration loads')\n",
    "sglang-broken": "import no_such_engine_module\n",
    "vllm-reproduces": "import sys\nprint('REPRODUCES')\nsys.exit(1)\n",
}


def make(root: Path, scripts: dict[str, str]) -> Path:
    for name, text in scripts.items():
        (root / name).mkdir(parents=True)
        (root / name / hf.SCRIPT).write_text(text)
    return root


def statuses(outcomes: list[hf.Outcome]) -> dict[str, hf.Status]:
    return {o.finding.name: o.status for o in outcomes}


@pytest.mark.parametrize("jobs", [1, 3])
def test_exit_status_is_the_verdict(tmp_path: Path, jobs: int) -> None:
    """Run one or several at a time, the verdicts are the same and their lines print in name order."""
    lines: list[str] = []
    outcomes = hf.run_all(make(tmp_path, SCRIPTS), installed=lambda _: True, echo=lines.append, jobs=jobs)
    assert [name for line in lines if (name := line.split(":")[0]) in SCRIPTS] == sorted(SCRIPTS)
    assert statuses(outcomes) == {
        "sglang-broken": hf.Status.BROKEN,
        "sglang-fixed": hf.Status.FIXED,
        "sglang-reproduces": hf.Status.REPRODUCES,
        "vllm-reproduces": hf.Status.REPRODUCES,
    }
    broken = next(o for o in outcomes if o.finding.name == "sglang-broken")
    assert broken.returncode == 1 and "ModuleNotFoundError" in broken.output  # Python's exit status, no MARK
    assert {o.finding.name for o in hf.failed(outcomes, None)} == {"sglang-broken", "sglang-fixed"}


def test_a_caught_crash_is_broken(tmp_path: Path) -> None:
    """The findings' scripts catch what is not their defect and exit 2 with the traceback: broken."""
    make(tmp_path, {"sglang-crash": "import sys, traceback\ntry:\n    1 / 0\nexcept Exception:\n"
                                     "    traceback.print_exc()\n    sys.exit(2)\n"})  # fmt: skip
    (outcome,) = hf.run_all(tmp_path, installed=lambda _: True, echo=lambda _: None)
    assert (outcome.status, outcome.returncode) == (hf.Status.BROKEN, 2)
    assert "ZeroDivisionError" in outcome.output


def test_engine_not_installed_fails_only_when_requested(tmp_path: Path) -> None:
    make(tmp_path, {k: v for k, v in SCRIPTS.items() if k.endswith("reproduces")})
    vllm_missing = lambda engine: engine != "vllm"  # noqa: E731
    outcomes = hf.run_all(tmp_path, installed=vllm_missing, echo=lambda _: None)
    assert statuses(outcomes) == {"sglang-reproduces": hf.Status.REPRODUCES, "vllm-reproduces": hf.Status.NOT_RUN}
    assert hf.failed(outcomes, None) == []
    assert hf.failed(outcomes, "sglang") == []
    requested = hf.run_all(tmp_path, engine="vllm", installed=vllm_missing, echo=lambda _: None)
    assert [o.finding.name for o in hf.failed(requested, "vllm")] == ["vllm-reproduces"]


def test_main_exit_code_and_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make(tmp_path, {"vllm-reproduces": SCRIPTS["sglang-reproduces"]})
    assert hf.main(["--findings", str(tmp_path), "--engine", "vllm", "--write"]) in (0, 1)
    out = capsys.readouterr().out
    if hf.engine_installed("vllm"):
        assert "vllm-reproduces: still reproduces" in out
        assert "REPRODUCES: the engine error" in (tmp_path / "vllm-reproduces" / hf.OUTPUT).read_text()
    else:
        assert "vllm-reproduces: not run" in out
    make(tmp_path, {"sglang-fixed": SCRIPTS["sglang-fixed"]})
    if hf.engine_installed("sglang"):
        assert hf.main(["--findings", str(tmp_path), "--engine", "sglang"]) == 1
        assert "sglang-fixed: no longer reproduces" in capsys.readouterr().out


def test_folder_not_named_for_an_engine_is_an_error(tmp_path: Path) -> None:
    make(tmp_path, {"someengine-bug": "pass\n"})
    with pytest.raises(ValueError, match="does not start with an engine name"):
        hf.findings(tmp_path)


def test_the_repository_findings_are_well_formed() -> None:
    """Every folder of findings/ has its script, output and report, and is named for an engine."""
    found = hf.findings()
    assert found
    for finding in found:
        assert finding.engine in hf.ENGINES
        for name in (hf.SCRIPT, hf.OUTPUT, "report.md"):
            assert (finding.folder / name).is_file(), f"{finding.name} has no {name}"
        assert "still reproduces" in (finding.folder / hf.OUTPUT).read_text().splitlines()[0]


def test_docs_reach_counts_match_the_ledgers() -> None:
    """docs/findings.md's reach table counts each engine subject's ledger: entries, defects (distinct reasons) and
    defects per reach."""
    from subjects.registry import ReachKind, named_subjects

    text = (Path(__file__).resolve().parents[1] / "docs" / "findings.md").read_text()
    for name in ("vllm", "sglang", "sglang-deepseek-v4"):
        entries = named_subjects()[name].known_failures
        defects = {(k.reason, k.link): k.reach.kind for k in entries}
        per_reach = [sum(kind is r for kind in defects.values()) for r in ReachKind]
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` ("))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells == [str(n) for n in (len(entries), len(defects), *per_reach)], f"docs/findings.md row {name}"


def test_expected_failures_are_counted_per_reach() -> None:
    """The summary and the merged report list expected failures by reach, default-path ones first, so a latent
    defect never reads like a default-path crash."""
    from collections import Counter

    from harness.report import expected_rows, reach_totals

    expected = {"latent": Counter({"https://b": 5}), "default path": Counter({"https://a": 2, "https://c": 1})}
    assert expected_rows(expected) == [("default path", "https://a", 2), ("default path", "https://c", 1),
                                       ("latent", "https://b", 5)]  # fmt: skip
    assert reach_totals(expected) == "3 default path, 5 latent"
