"""Self-tests of the fleet gate: ``python -m harness.report OUT SHARD... --strict`` fails closed.

Each probe is a results folder doctored the way a broken fleet leaves it (written with the
plugin's own writers, :mod:`harness.records`), which must exit 1 under ``--strict`` with the
reason named while the report is still written; correct folders must exit 0. The end-to-end
tests run ``python -m pytest`` (as runs of :mod:`tests.batch`, each its own process) on a tiny
module whose test segfaults or hangs past the time limit without ``-n`` (the process dies: its
folder must still say so, naming the test, its contract and backend, and its reproduction), and
a second run on a folder another run holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import records, report
from tests import batch
from tests.test_plugin import REPRO

ROOT = Path(__file__).resolve().parent.parent
ROW = {"contract": "mxfp4_moe", "backend": "marlin", "hardware": "cpu", "passed": 3, "failed": 0, "skipped": 1,
       "xfailed": 0, "xpassed": 0, "skip_reasons": {"needs sm100": 1}}  # fmt: skip
PASSING = (
    '<testsuites><testsuite name="pytest"><testcase classname="conformance.test_x" name="t"/></testsuite></testsuites>'
)
FAILING = (
    '<testsuites><testsuite name="pytest"><testcase classname="conformance.test_x" name="t">'
    '<failure message="AssertionError: padding changed the MoE output">reproduce: python -m harness.repro x</failure>'
    "</testcase></testsuite></testsuites>"
)


def results(folder: Path, shard: str | None = None, rows: list | None = None, junit: str | None = PASSING,
            exitstatus: int | None = 0, **fields: object) -> Path:  # fmt: skip
    """A results folder as the plugin leaves it (``exitstatus=None``: a run still marked running)."""
    folder.mkdir(parents=True)
    record = records.run_record(subject="builtin", profile="ci", shard=shard, workers=None, hardware="cpu",
                                junitxml="junit.xml" if junit is not None else None)  # fmt: skip
    record.update(fields)
    records.start(folder, record)
    records.write_json(folder / records.SUMMARY, [ROW] if rows is None else rows)
    if junit is not None:
        (folder / "junit.xml").write_text(junit)
    if exitstatus is not None:
        records.finish(folder, record, exitstatus)
    return folder


def gate(tmp_path: Path, *folders: Path) -> tuple[int, str]:
    """``python -m harness.report OUT FOLDERS --strict`` in-process: exit status and report.md."""
    status = report.main([str(tmp_path / "report"), *map(str, folders), "--strict"])
    return status, (tmp_path / "report" / "report.md").read_text()


def test_correct_folders_pass(tmp_path: Path) -> None:
    shards = [results(tmp_path / f"s{i}", f"{i}/2") for i in range(2)]
    assert gate(tmp_path / "sharded", *shards)[0] == 0
    status, text = gate(tmp_path / "whole", results(tmp_path / "whole-run"))
    assert status == 0 and "**GREEN**" in text
    two_machines = [results(tmp_path / f"{hw}{i}", f"{i}/2", hardware=hw) for hw in ("b200", "mi355") for i in (0, 1)]
    assert gate(tmp_path / "fleet", *two_machines)[0] == 0


def _killed_after_an_old_green_run(tmp_path: Path) -> list[Path]:
    folder = results(tmp_path / "s0")
    record = records.run_record(subject="builtin", profile="ci", shard=None, workers=None, hardware="cpu",
                                junitxml="junit.xml")  # fmt: skip
    records.start(folder, record)  # the next run starts, then is killed: the old files stay
    return [folder]


def _crashed_without_records(tmp_path: Path) -> list[Path]:
    """A folder of the former plugin's serial crash: only ``inflight/``."""
    inflight = tmp_path / "s0" / records.INFLIGHT
    inflight.mkdir(parents=True)
    (inflight / "main.json").write_text(json.dumps({"nodeid": "conformance/test_x.py::test_y", "command": "c"}))
    return [tmp_path / "s0"]


def _rewritten(name: str, text: str | None):
    """A probe: a correct folder whose file ``name`` is then replaced by ``text`` (None: deleted)."""

    def build(tmp_path: Path) -> list[Path]:
        folder = results(tmp_path / "s0")
        if text is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(text)
        return [folder]

    return build


def _with_empty_folder(tmp_path: Path) -> list[Path]:
    (tmp_path / "s1").mkdir()
    return [results(tmp_path / "s0", "0/2"), tmp_path / "s1"]


PROBES = {
    "failed-without-junit": (
        lambda t: [results(t / "s0", rows=[{**ROW, "failed": 2}], junit=None)],
        "summary.json counts 2 failed but no JUnit XML",
    ),
    "failed-in-junit-only": (lambda t: [results(t / "s0", junit=FAILING)], "1 failing test(s)"),
    "xpassed": (lambda t: [results(t / "s0", rows=[{**ROW, "xpassed": 1}])], "matrix counts: 1 xpassed"),
    "empty-folder": (_with_empty_folder, "no run record (the folder is empty)"),
    "absent-folder": (lambda t: [t / "nowhere"], "not a results folder (missing)"),
    "only-inflight": (_crashed_without_records, "no run record (no run.json)"),
    "missing-shard": (lambda t: [results(t / "s0", "0/3"), results(t / "s2", "2/3")], "missing shard(s) 1/3 of 3"),
    "killed-midway": (_killed_after_an_old_green_run, "never finished"),
    "duplicate-shard": (
        lambda t: [results(t / "s0", "0/2"), results(t / "s1", "1/2"), results(t / "again", "1/2")],
        "shard 1/2 on cpu given 2 times",
    ),
    "same-folder-twice": (lambda t: [results(t / "s0")] * 2, "given twice"),
    "mixed-subjects": (
        lambda t: [results(t / "s0", "0/2"), results(t / "s1", "1/2", subject="vllm")],
        "runs of different subjects merged",
    ),
    "mixed-profiles": (
        lambda t: [results(t / "s0", "0/2"), results(t / "s1", "1/2", profile="nightly")],
        "runs of different profiles merged",
    ),
    "mixed-counts": (
        lambda t: [results(t / "s0", "0/2"), results(t / "s1", "1/2"), results(t / "s3", "0/1")],
        "runs of different shard counts merged",
    ),
    "interrupted": (lambda t: [results(t / "s0", exitstatus=2)], "exit status 2 (interrupted)"),
    "ran-nothing": (lambda t: [results(t / "s0", rows=[])], "the run ran no tests"),
    "junit-deleted": (_rewritten("junit.xml", None), "the JUnit file the run wrote (junit.xml) is missing"),
    "no-run-state": (_rewritten("run.json", '{"host": "h", "shard": null}'), "records no run state"),
    "truncated-summary": (_rewritten("summary.json", '[{"contract": "mx'), "summary.json: truncated or not JSON"),
    "truncated-run": (_rewritten("run.json", '{"run_id": "ab'), "run.json: truncated or not JSON"),
    "truncated-junit": (_rewritten("junit.xml", FAILING[:70]), "junit.xml: truncated or not XML"),
}


@pytest.mark.parametrize("probe", PROBES)
def test_broken_fleet_data_is_red(tmp_path: Path, probe: str) -> None:
    build, reason = PROBES[probe]
    status, text = gate(tmp_path, *build(tmp_path))
    assert status == 1, text
    head = text.split("## Contract")[0]
    assert "**RED**" in head and reason in head, head
    page = (tmp_path / "report" / "report.html").read_text()
    assert (
        "badge red'>RED" in page and json.loads((tmp_path / "report" / "summary.json").read_text())["verdict"] == "RED"
    )


def test_killed_run_reports_its_in_flight_test_under_its_contract(tmp_path: Path) -> None:
    folder = _killed_after_an_old_green_run(tmp_path)[0]
    test = {"nodeid": "conformance/test_mxfp4_moe.py::test_p[marlin]", "contract": "mxfp4_moe", "backend": "marlin",
            "hardware": "cpu", "command": "python -m pytest 'conformance/test_mxfp4_moe.py::test_p[marlin]'"}  # fmt: skip
    (folder / records.INFLIGHT).mkdir()
    records.write_json(folder / records.INFLIGHT / "main.test.json", test)
    example = {"nodeid": test["nodeid"], "command": "python -m harness.repro m:check_p --config {}", "repro": []}
    records.write_json(folder / records.INFLIGHT / "main.json", example)
    merged = report.merge([folder])
    assert [(f.nodeid, f.contract, f.backend, f.reproduce) for f in merged.failures] == [
        (test["nodeid"], "mxfp4_moe", "marlin", example["command"])
    ]
    assert merged.matrix[("mxfp4_moe", "marlin", "cpu")]["failed"] == 1


def test_a_held_results_folder_refuses_a_second_holder(tmp_path: Path) -> None:
    held = records.lock(tmp_path)
    with pytest.raises(records.ResultsBusy, match=rf"in use by another run \(pid {os.getpid()} on "):
        records.lock(tmp_path)
    held.close()
    records.lock(tmp_path).close()  # released with its holder


def test_help_neither_locks_nor_marks_a_results_folder(tmp_path: Path) -> None:
    """``pytest --help`` (and the other print-and-exit options) runs no session: it works while another run holds
    the folder, and leaves a finished run's records as they are, its workers' included (a `--help` beside a run
    into the same folder once deleted the workers' records the run had written)."""
    (tmp_path / "run.json").write_text('{"state": "complete"}')
    (tmp_path / "worker-gw0.json").write_text("{}")
    held = records.lock(tmp_path)
    try:
        out = batch.run(
            batch.Run(["--help", "-p", "no:cacheprovider", f"--results={tmp_path}"], env=batch.suite_env()),
            tmp_path / "help",
            300,
        )
    finally:
        held.close()
    assert out.returncode == 0 and "--subject" in out.stdout, out.stderr[-2000:]
    assert (tmp_path / "run.json").read_text() == '{"state": "complete"}'
    assert (tmp_path / "worker-gw0.json").exists()


def test_next_run_moves_an_unfinished_run_aside(tmp_path: Path) -> None:
    folder = _killed_after_an_old_green_run(tmp_path)[0]
    (folder / records.INFLIGHT).mkdir()
    (folder / records.INFLIGHT / "main.test.json").write_text('{"nodeid": "t"}')
    fresh = records.run_record(subject="builtin", profile="ci", shard=None, workers=None, hardware="cpu", junitxml=None)
    moved = records.start(folder, fresh)
    assert moved is not None and moved.parent == folder / records.UNFINISHED
    assert sorted(p.name for p in moved.iterdir()) == ["inflight", "junit.xml", "run.json", "summary.json"]
    assert records.read_json(folder / records.RUN)["run_id"] == fresh["run_id"]


# --- end to end: a serial crash or hang, a second run on a held folder --------------------------------------------


DYING_MODULE = """
import ctypes
import os
import signal
from dataclasses import dataclass

import pytest

from harness.properties import check
from harness.runner import run_check
from strategies.config import Config

pytestmark = pytest.mark.contract("mxfp4_moe")


@dataclass(frozen=True)
class Size(Config):
    n: int


@check("mxfp4_moe", Size)
def check_dies(size, backend, policy):
    if os.environ["FP4_GATE_PROBE"] == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)  # a native crash
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # a hang no signal interrupts
    ctypes.CDLL(None).sleep(600)


def test_fine(backend):
    assert backend.value


def test_dies(backend):
    run_check(check_dies, Size(n=7), backend, None)
"""


def module_run(tmp_path: Path, folder: Path, *args: str, probe: str = "segfault") -> batch.Run:
    """``python -m pytest`` on :data:`DYING_MODULE` (marlin only), results and JUnit in ``folder``: a run of
    :mod:`tests.batch`, whose exit status is its process's (``-11`` for a segfault)."""
    module = tmp_path / "test_dying.py"
    module.write_text(DYING_MODULE)
    env = batch.suite_env(**batch.CPU_ONLY, FP4_GATE_PROBE=probe, PYTHONPATH=str(ROOT))
    return batch.Run(
        [str(module), "-p", "harness.plugin", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path),
         "--backend", "marlin", "--results", str(folder), "--junitxml", str(folder / "junit.xml"), *args],
        cwd=tmp_path, env=env,
    )  # fmt: skip


def _died_in_its_test(tmp_path: Path, folder: Path, reproduce: str) -> None:
    """``folder`` holds a run that died in ``test_dies[marlin]``: the gate is RED and says where."""
    assert records.read_json(folder / records.RUN)["state"] == records.RUNNING
    merged = report.merge([folder])
    assert [(f.nodeid, f.contract, f.backend) for f in merged.failures] == [
        ("test_dying.py::test_dies[marlin]", "mxfp4_moe", "marlin")
    ]
    assert merged.failures[0].reproduce.startswith(reproduce), merged.failures[0]
    counts = merged.matrix[("mxfp4_moe", "marlin", "cpu")]
    assert (counts["passed"], counts["failed"]) == (1, 1)
    assert report.main([str(tmp_path / "report"), str(folder), "--strict"]) == 1


@pytest.mark.long(45)
def test_serial_segfault_leaves_a_failing_record_and_a_held_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    (tmp_path / "held").mkdir()
    held = records.lock(tmp_path / "held")
    ran = batch.run_all(
        {"died": module_run(tmp_path, folder), "refused": module_run(tmp_path, tmp_path / "held", "-k", "fine")},
        tmp_path / "runs",
        parts=2,
    )
    died, refused = ran["died"], ran["refused"]
    held.close()
    assert died.returncode == -11, died.stdout[-3000:]  # SIGSEGV
    _died_in_its_test(tmp_path, folder, f"{REPRO} test_dying:check_dies --subject builtin")
    out = refused.stdout + refused.stderr
    assert refused.returncode == 4 and "passed" not in out, out[-3000:]
    assert f"--results '{tmp_path / 'held'}' is in use by another run (pid {os.getpid()}" in refused.stderr
    rerun = batch.run(module_run(tmp_path, folder, "-k", "fine"), tmp_path / "rerun")  # green, the crash kept aside
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert report.main([str(tmp_path / "report"), str(folder), "--strict"]) == 0
    assert list((folder / records.UNFINISHED).glob(f"*/{records.INFLIGHT}/main.test.json"))


@pytest.mark.long(30)
def test_serial_hang_past_the_time_limit_leaves_a_failing_record(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    died = batch.run(module_run(tmp_path, folder, "--example-time-limit", "1", probe="hang"), tmp_path / "run")
    assert died.returncode == 1 and "passed" not in died.stdout, died.stdout[-3000:]  # faulthandler ended it
    _died_in_its_test(tmp_path, folder, f"{REPRO} test_dying:check_dies --subject builtin")
