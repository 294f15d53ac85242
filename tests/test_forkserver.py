"""Self-tests of :mod:`harness.forkserver`: a ``-n 1`` run's worker is forked by the fork server its controller
starts (and is a new interpreter under ``FP4_FORK_WORKERS=0``), with the run's environment and folder and a record
that says which; a stub whose server is gone starts its worker as execnet would have, saying why; a server
that cannot start is one error with its output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import early, forkserver, workers
from tests import batch

ROOT = Path(__file__).resolve().parent.parent

PROBE = """\
import os, pathlib, sys

import pytest

from tests import batch


def parent_of(pid):
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("i", range(4))
def test_worker(worker_id, i):
    controller = int(pathlib.Path("controller").read_text())
    parent = os.getppid()
    how = "new interpreter" if parent == controller else "forked by the run's server" if parent_of(parent) == controller else "neither"
    pathlib.Path(os.environ["FP4_PARENT_LOG"], worker_id).write_text(how)
    assert os.environ["FP4_FORK_PROBE"] == "seen" and pathlib.Path.cwd() == pathlib.Path(__file__).parent
    assert "FP4_FORKED_WORKER" not in os.environ  # read into the record, not left for the test's subprocesses
    assert not hasattr(sys.modules["__main__"], "__file__")  # python -c's main module, not the server's


def test_run_server(tmp_path):
    from harness.workers import fork_server

    if fork_server() is None:  # the run server of a worker started as a new interpreter is its child, as before
        pytest.skip("not forked")
    (tmp_path / "test_inner.py").write_text(INNER)
    try:
        inner = batch.Run([str(tmp_path), "-q", "-p", "no:cacheprovider"], cwd=tmp_path, env=os.environ)
        assert batch.run(inner, tmp_path / "out").returncode == 0
    finally:
        batch.stop_server()
    server_parent = int((tmp_path / "server-parent").read_text())
    how = {os.getpid(): "this worker's child", os.getppid(): "forked by the worker's server"}  # the first: a bug
    pathlib.Path(os.environ["FP4_PARENT_LOG"], "run-server").write_text(how.get(server_parent, "neither"))


INNER = '''
import os, pathlib


def test_parent():  # the run is the run server's child; the server's parent:
    stat = pathlib.Path(f"/proc/{os.getppid()}/stat").read_text()
    pathlib.Path("server-parent").write_text(stat.rsplit(")", 1)[1].split()[1])
'''
"""

CONFTEST = """\
import os, pathlib


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        pathlib.Path("controller").write_text(str(os.getpid()))
"""
"""The probe's folder's conftest: the run's controller writes its pid."""

SWITCH = {"forked": "1", "interpreters": "0"}
"""The two runs: ``FP4_FORK_WORKERS`` of each."""


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """:data:`PROBE` under ``-n 1`` from its own folder, with the fork server on and off; each run starts its
    worker itself (``own_workers``), as outside the self-tests' batch."""
    runs = {}
    for name, switch in SWITCH.items():
        here = folder / name
        (here / "parents").mkdir(parents=True)
        (here / "test_probe.py").write_text(PROBE)
        (here / "conftest.py").write_text(CONFTEST)
        env = batch.with_path(batch.suite_env(FP4_FORK_PROBE="seen", FP4_PARENT_LOG=str(here / "parents")), ROOT) | {
            forkserver.ENV_SWITCH: switch
        }
        runs[name] = batch.workers_run(here / "test_probe.py", 1, env, own_workers=True)
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, batch.Ran]]:
    """:func:`make_runs`' results, run once per session."""
    return batch.shared(tmp_path_factory, "forkserver", make_runs)


@pytest.mark.parametrize(
    "name",
    # the first runs the module's batch (the other reads it): only it is marked long
    [pytest.param("forked", marks=pytest.mark.long(8)), pytest.param("interpreters", marks=pytest.mark.late)],
)
def test_workers_are_forked_unless_switched_off(runs: tuple[Path, dict[str, batch.Ran]], name: str) -> None:
    result, here, forked = runs[1][name], runs[0] / name, name == "forked"
    counts = "5 passed" if forked else "4 passed, 1 skipped"
    assert result.returncode == 0 and counts in result.stdout, result.stdout[-3000:] + result.stderr[-2000:]
    parents = {p.name: p.read_text() for p in (here / "parents").iterdir()}
    # the worker forked by the run's server, or started as a new interpreter by the controller; a forked worker's
    # run server for its self-tests (tests/batch.py) forked by the same server
    assert parents == (
        {"gw0": "forked by the run's server", "run-server": "forked by the worker's server"}
        if forked
        else {"gw0": "new interpreter"}
    )
    assert [r["forked"] for r in workers.read_records(here / "results")] == [forked]
    said = "1 forked from a pre-imported process" if forked else "started as new interpreters"
    assert said in result.stdout, result.stdout[-3000:]


def test_a_stub_without_its_server_starts_the_worker_itself(tmp_path: Path) -> None:
    fallback = [sys.executable, "-c", "import sys; print('started as', sys.argv[1:])", "worker"]
    stub = forkserver.stub_command(str(tmp_path / "gone"), "", fallback)
    ran = subprocess.run(stub, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout == "started as ['worker']\n", ran
    assert "fp4 fork server: [Errno 2] No such file or directory" in ran.stderr
    assert "this xdist worker starts as a new interpreter" in ran.stderr


def test_a_server_that_cannot_start_is_one_error_with_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with pytest.raises(RuntimeError, match=r"the fork server tests\.no_such_module did not start: .*No module named"):
        forkserver.start(module="tests.no_such_module")


@pytest.mark.parametrize(
    ("args", "env", "want"),
    [
        (["-n", "auto", "tests"], {}, 6),
        (["-n", "logical"], {"PYTEST_XDIST_AUTO_NUM_WORKERS": "3"}, 3),
        (["-n2"], {}, 2),
        (["-n=3"], {}, 3),
        (["--numprocesses", "4"], {}, 4),
        (["--numprocesses=5", "-n", "1"], {}, 1),  # the last one counts, as when pytest parses them
        ([], {"PYTEST_ADDOPTS": "-n 2"}, 2),
        (["-n", "0"], {}, 0),
        (["tests"], {}, 0),
        (["-n", "2", "--help"], {}, 0),
        (["-k", "x", "--", "-n", "2"], {}, 0),
    ],
)
def test_a_command_line_s_workers_are_read_before_pytest_parses_it(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], want: int
) -> None:
    monkeypatch.setattr(workers, "usable_cores", lambda: 6)
    assert workers.requested_workers(args, env) == want


class _Config:
    """The parts of an xdist controller's configuration that :func:`harness.workers.pytest_configure` reads."""

    def __init__(self, workers: int) -> None:
        self.stash, self.warnings = pytest.Stash(), []
        self.pluginmanager = SimpleNamespace(hasplugin=lambda name: name == "xdist")
        self.options = {"dist": "load" if workers else "no", "tx": ["popen"] * workers, "help": False}

    def getoption(self, name: str, default: object = None) -> object:
        return self.options.get(name, default)

    def issue_config_time_warning(self, warning: Warning, stacklevel: int) -> None:
        self.warnings.append(warning)


@pytest.mark.parametrize(
    ("run_workers", "used"),
    [pytest.param(2, True, id="the-same-run"), pytest.param(3, False, id="other-threads"), (0, False)],
)
def test_an_early_server_is_used_or_stopped_at_the_configuration(
    monkeypatch: pytest.MonkeyPatch, run_workers: int, used: bool
) -> None:
    """``-n 2`` on 4 cores starts a server for 2 threads per worker before the plugins are imported; the
    configuration uses it for a run of 2 workers, and stops it for one of 3 (1 thread each: a new one starts) or
    none."""
    started, stopped, forking = [], [], []
    monkeypatch.setattr(forkserver, "start", lambda **kw: started.append(kw) or SimpleNamespace(path=len(started)))
    monkeypatch.setattr(forkserver, "stop", lambda server: stopped.append(server.path))
    monkeypatch.setattr(forkserver, "fork_workers", lambda path: forking.append(path) or (lambda: None))
    monkeypatch.setattr(forkserver, "enabled", lambda: True)
    monkeypatch.setattr(forkserver, "forking", lambda: False)
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    monkeypatch.setattr(workers, "_STATE", dict(workers._STATE))  # this process's run start stays its own
    for name in workers.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)  # set by the configuration; put back after the test
    workers.start_early(["-n", "2"], {})
    assert started == [{"defaults": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}}]
    config = _Config(run_workers)
    workers.pytest_configure(config)
    assert stopped == ([] if used else [1])
    assert len(started) == (2 if run_workers and not used else 1)
    assert forking == (["1"] if used else ["2"] if run_workers else [])  # the workers' server: the early one or new
    assert not config.warnings


@pytest.mark.parametrize(("blocked", "starts"), [((), True), (("harness.workers",), False), (("xdist",), False)])
def test_the_early_plugin_starts_the_server_at_its_own_registration(
    monkeypatch: pytest.MonkeyPatch, blocked: tuple[str, ...], starts: bool
) -> None:
    """``harness.early`` hands the run's invocation arguments to :func:`harness.workers.start_early` once, when it is
    itself registered, unless ``-p no:`` blocked the workers' plugin or xdist."""
    calls = []
    monkeypatch.setattr(workers, "start_early", lambda args, env: calls.append(args))
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=("-n", "2", "tests")))
    manager = SimpleNamespace(get_plugin={"pytestconfig": config}.get, is_blocked=lambda name: name in blocked)
    early.pytest_plugin_registered(workers, manager)  # another plugin's registration
    early.pytest_plugin_registered(early, manager)
    assert calls == ([("-n", "2", "tests")] if starts else [])
