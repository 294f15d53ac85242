"""Self-tests of what a run prints and writes for its user: the subject's binding, one-line skip reasons,
what a model pin runs, hints that match what is missing, progress on long runs, and the fleet report.

In-process where the piece is a function; the end-to-end tests run ``python -m pytest`` on a few
properties (collection only where the header and the selection are under test).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

from harness import database, hardware, plugin, profiles, progress, records, report
from strategies.pins import Pin, set_pin
from strategies.presence import absent_layers
from subjects.registry import SubjectError, resolve
from tests import batch

ROOT = Path(__file__).resolve().parent.parent


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """This module's end-to-end runs (:mod:`tests.batch`): ``python -m pytest ARGS`` from the checkout (``ci``
    profile, header shown), results under ``folder / name``; the slow probe module from its own folder."""

    def run(name: str, *args: str) -> batch.Run:
        return batch.Run(["-p", "no:cacheprovider", "--results", str(folder / name / "results"), *args],
                         env=batch.suite_env())  # fmt: skip

    runs = {
        "one": run("one", "conformance", "--subject", "bad-gated-pad16", "--collect-only"),
        "pinned": run("pinned", "conformance/test_shared_expert.py", "conformance/test_nvfp4_moe.py", "-n", "1",
                      "--model", "gemma-4-26b-a4b", "--tp", "4", "-k", "shared or backend_accepts and cutlass"),
        "skips": run("skips", "conformance/test_mxfp4_moe.py", "-k", "vllm_cutlass_scale_swizzle", "-rs"),
    }  # fmt: skip
    slow = folder / "slow"
    slow.mkdir(parents=True)
    (slow / "test_slow.py").write_text(SLOW_MODULE)
    runs["slow"] = batch.Run(
        [str(slow / "test_slow.py"), "-p", "harness.plugin", "-p", "no:cacheprovider", "-n", "1", "--fp4-progress",
         "1", "--results", str(slow / "results"), "--rootdir", str(slow)],
        cwd=slow, env=batch.with_path(batch.suite_env(), ROOT), waits=True,
    )  # fmt: skip
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, batch.Ran]:
    """:func:`make_runs`' results, run once per session in one process."""
    return batch.shared(tmp_path_factory, "output", make_runs)[1]


# --- 1. binding is explicit ---------------------------------------------------------------------


def test_bare_policy_of_a_shared_protocol_is_ambiguous() -> None:
    """An ``align_moe`` object fits nvfp4_moe and mxfp4_moe alike: bound to both, an NVFP4-only policy
    failed every MXFP4 example; it must be bound by a ``Subject``."""
    with pytest.raises(
        SubjectError, match=r"several contracts share \(fp8_moe, fp8_tensor_moe, mxfp4_moe, nvfp4_moe\).*Subject\("
    ):
        resolve("subjects.nvfp4_moe:BuiltinNvfp4MoeAlignment")
    assert set(resolve("subjects.moe_sharding:BuiltinMoeSharding").policies) == {"moe_sharding"}


def test_deselection_is_one_line_per_run() -> None:
    from collections import Counter

    counts = Counter({("subject s does not implement them", "mxfp4_moe"): 40, ("subject s does not implement them", "shared_expert"): 3,
                      ("gemma-4-26b-a4b has no shared expert", "shared_expert"): 3})  # fmt: skip
    assert plugin.deselection_line(counts) == (
        "fp4 deselected: 46 tests: 3 of shared_expert (gemma-4-26b-a4b has no shared expert); "
        "40 of mxfp4_moe, 3 of shared_expert (subject s does not implement them)"
    )
    assert plugin.deselection_line(Counter()) is None


@pytest.mark.long(60)  # the first test of this module's batch (the rest read it)
def test_header_names_binding_profile_database_and_deselections(runs: dict[str, batch.Ran]) -> None:
    """A one-contract subject: its binding in the header, the other contracts' tests deselected (not skipped)
    and counted in one line; with ``--model`` a layer the model lacks is deselected, under xdist too."""
    one, pinned = runs["one"], runs["pinned"]
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    lines = one.stdout.splitlines()
    assert "fp4 subject: bad-gated-pad16 is bound to nvfp4_moe (GatedPad16Alignment)" in lines
    assert "fp4 hypothesis: profile ci (25 examples, derandomized), example database none" in lines
    (line,) = [line for line in lines if line.startswith("fp4 deselected: ")]
    assert line.endswith("(subject bad-gated-pad16 does not implement them)") and "of mxfp4_moe" in line
    assert pinned.returncode == 0, pinned.stdout[-3000:] + pinned.stderr[-3000:]
    assert "fp4 deselected: 3 tests: 3 of shared_expert (gemma-4-26b-a4b has no shared expert)" in pinned.stdout
    layers = "routed experts; MXFP4 linear layers: mlp.gate_up_proj; shared expert: no (only these are drawn)"
    assert f"fp4 pin layers: {layers}" in pinned.stdout
    last = pinned.stdout.splitlines()[-1]
    assert "passed" in last and "failed" not in last and "skipped" not in last, last


# --- 2. skip reasons: one line, the suite's own ----------------------------------------------------


def _skip(reason: str) -> tuple[SimpleNamespace, pytest.TestReport]:
    item = SimpleNamespace(
        path=Path("conformance/test_x.py"),
        location=("conformance/test_x.py", 41, "test_y"),
        config=SimpleNamespace(stash={plugin.SESSION: SimpleNamespace(database=".hypothesis/fp4-nightly")}),
    )
    longrepr = ("/venv/lib/python3.11/site-packages/_pytest/unittest.py", 7, f"Skipped: {reason}")
    return item, pytest.TestReport("conformance/test_x.py::test_y", item.location, {}, "skipped", longrepr, "call")


def test_skip_reason_is_its_first_line() -> None:
    item, rep = _skip(
        "vLLM is not importable\nFailing explicit example: test_y(\n    config=...)\nreproduce: python ..."
    )
    plugin._one_line_skip(item, rep)
    assert rep.longrepr[2] == "Skipped: vLLM is not importable"


def test_replay_without_a_stored_example_skips_with_the_suites_reason() -> None:
    item, rep = _skip("Hypothesis has been told to run no test cases for this test.")
    plugin._one_line_skip(item, rep)
    assert rep.longrepr == (
        "conformance/test_x.py",
        42,
        "Skipped: no stored example of this test in the example database (.hypothesis/fp4-nightly) to replay",
    )


@pytest.mark.late
def test_skips_of_pinned_examples_print_one_line(runs: dict[str, batch.Ran]) -> None:
    """vLLM's CUTLASS swizzle skips without vLLM on a pinned example: the summary's reason is one line."""
    if hardware.machine().has("vllm"):
        pytest.skip("vLLM is installed here: the property runs")
    result = runs["skips"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Failing explicit example" not in result.stdout and "reproduce:" not in result.stdout, result.stdout
    assert any(line.strip().startswith("skipped x1: vLLM is not importable") for line in result.stdout.splitlines())


# --- 4. a model pin runs the model's layers ------------------------------------------------------


def test_pinned_model_without_a_layer_deselects_its_contract() -> None:
    assert absent_layers(Pin("gemma-4-26b-a4b", 4)) == {"shared_expert": "gemma-4-26b-a4b has no shared expert"}
    assert absent_layers(Pin("gpt-oss-20b", 2))["mxfp4_linear"].endswith(
        "no catalogued MXFP4 dense layer loadable at TP=2"
    )
    assert absent_layers(Pin("deepseek-v3", 8)) == {} and absent_layers(Pin(tp=4)) == {}


def test_pinned_guard_truth_table_draws_only_the_models_layers() -> None:
    from strategies.linear import scale_shapes

    seen = []

    @settings(max_examples=40, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=scale_shapes())
    def draw(case) -> None:
        seen.append(case.origin)

    set_pin(Pin("gemma-4-26b-a4b", 4, False))
    try:
        draw()
    finally:
        set_pin(Pin())
    assert seen and all(origin.startswith("gemma-4-26b-a4b ") and "TP=4" in origin for origin in seen), set(seen)


# --- 5. hints match the missing piece ----------------------------------------------------------------


CPU_WITH_AITER = hardware.Machine(0, False, None, None, None, frozenset({"amd-aiter", "flashinfer"}))
H200 = hardware.Machine(1, False, (9, 0), None, "NVIDIA H200", frozenset({"flashinfer"}))


def test_hint_names_only_what_is_missing() -> None:
    gpu_only = hardware.missing("aiter_triton", CPU_WITH_AITER)
    assert "an NVIDIA GPU" in gpu_only and "amd-aiter is installed" in gpu_only and "pip install" not in gpu_only
    package_only = hardware.missing("aiter_triton", H200)
    assert "pip install 'fp4-conformance[amd]'" in package_only and "NVIDIA GPU" not in package_only
    assert "pip install" not in hardware.missing("aiter", CPU_WITH_AITER)


def test_hardware_column_shows_a_mode_only_where_it_runs() -> None:
    assert hardware.labels(CPU_WITH_AITER, ["aiter_triton", "contract"]) == "cpu"
    with_aiter = hardware.Machine(1, False, (9, 0), None, "NVIDIA H200", frozenset({"amd-aiter"}))
    assert hardware.labels(with_aiter, ["aiter_triton"]) == "sm90 (NVIDIA H200 x1) · AITER Triton on CUDA"


def test_profile_and_database_are_described(tmp_path: Path) -> None:
    local = DirectoryBasedExampleDatabase(str(tmp_path / "db"))
    assert database.describe(None) == "none"
    assert database.describe(MultiplexedDatabase(local, ReadOnlyDatabase(local))) == (
        f"{tmp_path / 'db'} + {tmp_path / 'db'} (read-only)"
    )
    assert profiles.describe("ci") == "25 examples, derandomized"
    assert profiles.describe("replay") == "stored examples only"


# --- 6. pinned failures and the example database -------------------------------------------------------


def test_why_pinned_failures_are_not_stored_is_documented() -> None:
    """Hypothesis stores no explicit example; the pins are in the source and every generating profile runs them."""
    for name in ("ci", "dev", "nightly", "triage"):
        assert Phase.explicit in settings.get_profile(name).phases, name
    running = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    assert "A failing pinned example" in running and "is not stored" in running


# --- 7. progress on long runs ------------------------------------------------------------------------


def test_progress_names_each_long_test_once_per_interval() -> None:
    now = [0.0]
    watch = progress.Progress(60, print, clock=lambda: now[0], start_thread=False)
    watch.started("a")
    now[0] = 30
    watch.started("b")
    assert watch.due(59) == []
    assert watch.due(61) == ["fp4 running: a for 61 s"]
    assert watch.due(95) == ["fp4 running: b for 65 s"]
    watch.finished("a")
    assert watch.due(125) == []
    assert watch.due(160) == ["fp4 running: b for 130 s"]


SLOW_MODULE = """
import time


def test_sleeps():
    time.sleep(3.5)
"""


@pytest.mark.late
def test_progress_line_under_xdist(runs: dict[str, batch.Ran]) -> None:
    """:data:`SLOW_MODULE` under ``-n 1 --fp4-progress 1`` (:func:`make_runs`)."""
    result = runs["slow"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    named = [line for line in result.stdout.splitlines() if line.startswith("fp4 running: test_slow.py::test_sleeps")]
    assert 2 <= len(named) <= 4, result.stdout


# --- 8. the fleet report ---------------------------------------------------------------------------------


def test_run_record_versions_need_no_import() -> None:
    """The xdist controller never imports FlashInfer or AITER: their versions come from the installed packages."""
    code = "import json, sys; from harness.records import library_versions; print(json.dumps(library_versions()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    versions = json.loads(out.stdout)
    for dist in ("flashinfer-python", "amd-aiter"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        assert dist in versions, versions


def _failure(nodeid: str, message: str) -> report.Failure:
    return report.Failure(nodeid, "h", message, "config: c", "python -m harness.repro x", "nvfp4_moe", "b")


def test_report_groups_cuts_escapes_and_sorts(tmp_path: Path) -> None:
    from collections import Counter

    long = "AssertionError: flashinfer-trtllm rejects Ip=176, Hp=512: " + "x" * 400
    r = report.Report(
        matrix={("a", "-", "cpu"): Counter(passed=3), ("z", "-", "cpu"): Counter(failed=2)},
        failures=[_failure("t::one", long), _failure("t::two", long.replace("176", "240")),
                  _failure("t::three", "ValueError: <script>alert(1)</script>")],
        runs=[{"host": "h", "versions": {"flashinfer-python": "0.7.4"}}],
    )  # fmt: skip
    md, page = report.write(r, tmp_path / "out")
    text, markup = md.read_text(), page.read_text()
    assert text.index("| z | - | cpu |") < text.index("| a | - | cpu |")  # failing rows first
    assert markup.index("<td>z</td>") < markup.index("<td>a</td>")
    assert "- 2 x AssertionError: flashinfer-trtllm rejects Ip=176" in text and text.count(" x ") >= 2
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "…</summary><pre>" + long[:60] in markup and long[-50:] in markup  # cut, with the whole on demand
    assert "<span class='badge green'>0</span>" in markup and "badge amber" not in markup  # no fixed-bug alerts
    assert "flashinfer-python 0.7.4" in markup


def test_report_command_prints_a_summary_not_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "s0"
    folder.mkdir()
    record = records.run_record(subject="builtin", profile="ci", shard=None, workers=None, hardware="cpu",
                                junitxml=None)  # fmt: skip
    records.start(folder, record)
    records.write_json(folder / records.SUMMARY, [{"contract": "c", "backend": "-", "hardware": "cpu", "passed": 1}])
    records.finish(folder, record, 0)
    assert report.main([str(tmp_path / "out"), str(folder), "--strict"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fp4-conformance report: GREEN") and "## Contract" not in out
    assert f"report: {tmp_path / 'out' / 'report.md'}" in out
