"""pytest-xdist worker sizing: ``-n auto`` uses every usable core; torch's threads are split between workers.

* ``pytest -n auto`` starts one worker per usable core (:func:`usable_cores`: the process's CPU
  affinity, capped by a cgroup v2 CPU quota); ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides the
  count, as in pytest-xdist.
* Each worker's torch gets ``cores // workers`` intra-op threads (at least 1,
  :func:`threads_per_worker`): the controller exports ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``
  before the workers start, so torch sizes its pool at import, and each worker calls
  ``torch.set_num_threads`` with the same number. A count already in ``OMP_NUM_THREADS`` wins.
  Without this every worker's torch starts one thread per core, ``W·C`` threads on ``C`` cores,
  and OpenMP threads spinning at the end of each parallel region take the cores from the other
  workers (issue 16: 8 workers on a 16-core H200 host ran 2.2x slower than one).
* GPU pinning stays in :mod:`harness.devices`: worker ``gwN`` sees GPU ``N mod G`` only, so kernel
  properties spread over the GPUs and several workers share one (CUDA time-slices their contexts;
  a device fault kills only its own process, and the plugin reports the example it was running).

* Local workers are forked from one process that has imported torch and pytest
  (:mod:`harness.forkserver`), which starts as pytest loads its plugins (:func:`start_early`, from
  :mod:`harness.early`) or else at the controller's configuration, instead of each starting an interpreter and
  importing them (1.9 s each with 16 at once on a 16-core H100 host); ``FP4_FORK_WORKERS=0`` starts them as new
  interpreters. Each record says which.
* An xdist worker ends its process as soon as it has reported its session's end (:func:`end_worker`),
  instead of waiting for the controller and then freeing torch's interpreter state, which the
  controller would wait for (about 1.3 s per worker on the 2-core CPU machine).

Each test's CPU seconds (user + system of its process and of the child processes it waited for, from
its setup to its teardown: a self-test's ``python -m pytest`` subprocess counts) are attached to its
teardown report as the user property ``cpu_s``, so JUnit XML carries them, with the test's process
(``worker``) and the second after the run's start at which it ended (``ended_s``).

Each process writes ``worker-<id>.json`` (threads, cores, start-up seconds, forked or not) into ``--results``;
``python -m bench.scaling`` reads them, and the terminal summary prints one line from them.
Start-up is the time from the controller's configuration to the process's first test: starting
the interpreter, importing torch and the libraries, and collecting (a fork server started early has done its
imports before the configuration, which this figure then leaves out).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import resource
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from harness import forkserver

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_STATE: dict[str, float | None] = {"run_start": None, "first_test": None}
_THREADS = pytest.StashKey[int]()
_SAVED_ENV = pytest.StashKey[dict[str, str | None]]()
_CPU_AT_SETUP = pytest.StashKey[float]()
_FORK_SERVER = pytest.StashKey[tuple[forkserver.Server, Callable[[], None]]]()
_EARLY: list[tuple[forkserver.Server, int]] = []
"""The fork server :func:`start_early` started, and the torch threads per worker it was started for."""
_FORKED: list[str | None] = [None]
"""The socket of the :mod:`harness.forkserver` server that forked this worker (None: not forked)."""


def usable_cores(cpu_max: Path = _CGROUP_CPU_MAX) -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 quota (``cpu.max``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def threads_per_worker(cores: int, workers: int) -> int:
    """Intra-op threads for each of ``workers`` processes sharing ``cores``: ``cores // workers``, at least 1."""
    return max(1, cores // max(1, workers))


def xdist_workers(config: pytest.Config) -> int:
    """Worker processes this run starts (0 without pytest-xdist distribution)."""
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("dist", "no") == "no":
        return 0
    return len(config.getoption("tx") or [])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    override = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if override:
        try:
            return max(1, int(override))
        except ValueError:
            raise pytest.UsageError(f"PYTEST_XDIST_AUTO_NUM_WORKERS={override!r} is not a number") from None
    return usable_cores()


def requested_workers(args: Sequence[str], env: Mapping[str, str]) -> int:
    """Local xdist workers a command line's ``args`` (after ``PYTEST_ADDOPTS`` in ``env``) ask for, as far as they
    tell before pytest parses them: the last ``-n N`` / ``-nN`` / ``--numprocesses[=]N``, ``auto`` and ``logical``
    being :func:`pytest_xdist_auto_num_workers`' count; 0 without one, or with ``--help`` or ``--version``."""
    words = [*shlex.split(env.get("PYTEST_ADDOPTS", "")), *args]
    value = None
    for word, after in zip(words, [*words[1:], None], strict=True):
        if word == "--":
            break
        if word in ("-h", "--help", "--version", "-V"):
            return 0
        if word in ("-n", "--numprocesses"):
            value = after
        elif word.startswith("--numprocesses="):
            value = word.partition("=")[2]
        elif word.startswith("-n") and not word.startswith("--") and len(word) > 2:
            value = word[2:].removeprefix("=")
    if value in ("auto", "logical"):
        override = env.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
        return int(override) if override.isdigit() else usable_cores()
    return int(value) if value is not None and value.isdigit() else 0


def _threads(workers: int, env: Mapping[str, str]) -> int:
    """Torch threads per worker: ``OMP_NUM_THREADS`` where it holds a count, else :func:`threads_per_worker`."""
    user = env.get("OMP_NUM_THREADS", "")
    return int(user) if user.isdigit() and int(user) > 0 else threads_per_worker(usable_cores(), workers)


def _may_fork() -> bool:
    """Whether this process may start a fork server for its workers: not switched off (``FP4_FORK_WORKERS=0``), and
    not a process whose workers execnet already forks (a self-tests' run, ``tests/batch.py``)."""
    return forkserver.enabled() and not forkserver.forking()


def start_early(args: Sequence[str], env: Mapping[str, str]) -> None:
    """Start the fork server of a pytest run whose arguments ``args`` ask for local xdist workers
    (:func:`requested_workers`) now, before its plugins import torch, where it would otherwise start at the
    controller's configuration after them (:mod:`harness.early` calls this). The configuration uses it if the run
    starts workers with the torch threads it was started for, and stops it otherwise; a server that cannot start is
    left to the configuration, which warns. Not in an xdist worker, nor where execnet already forks this process's
    workers (a self-tests' run, ``tests/batch.py``)."""
    if "PYTEST_XDIST_WORKER" in env or not _may_fork():
        return
    workers = requested_workers(args, env)
    if not workers:
        return
    threads = _threads(workers, env)
    with contextlib.suppress(RuntimeError):
        _EARLY.append((forkserver.start(defaults={name: str(threads) for name in THREAD_VARIABLES}), threads))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand each worker the run's start time and its thread count."""
    node.workerinput["fp4_run_start"] = _STATE["run_start"]
    node.workerinput["fp4_threads"] = node.config.stash[_THREADS]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: size torch's pool before any test runs
        _STATE["run_start"] = workerinput.get("fp4_run_start")
        _FORKED[0] = os.environ.pop(forkserver.FORKED, None)  # not for the processes its tests start
        threads = workerinput.get("fp4_threads")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        return
    _STATE["run_start"], _STATE["first_test"] = time.time(), None
    early = _EARLY.pop() if _EARLY else None
    workers = xdist_workers(config)
    threads = _threads(workers, os.environ) if workers else 0
    wanted = bool(workers) and _may_fork() and not config.getoption("help", False)
    if early is not None and not (wanted and early[1] == threads):
        forkserver.stop(early[0])  # started for another count of workers or threads than the run's
        early = None
    if not workers:
        return
    config.stash[_THREADS] = threads
    config.stash[_SAVED_ENV] = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    if wanted:
        try:  # started early, or now: it imports while this process configures and starts the workers' stubs
            server = early[0] if early is not None else forkserver.start()
        except RuntimeError as exc:  # the workers start as new interpreters, and the summary line says so
            config.issue_config_time_warning(pytest.PytestWarning(str(exc)), stacklevel=2)
        else:
            config.stash[_FORK_SERVER] = server, forkserver.fork_workers(str(server.path))


@pytest.hookimpl(trylast=True)  # after every other plugin's
def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore the controller's thread variables (the run may be one of several in a process); an xdist worker
    then ends its process (:func:`end_worker`)."""
    for name, value in config.stash.get(_SAVED_ENV, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if _FORK_SERVER in config.stash:
        server, undo = config.stash[_FORK_SERVER]
        undo()
        forkserver.stop(server)
    end_worker(config)


def end_worker(config: pytest.Config) -> None:
    """An xdist worker that has reported its session's end: run the exit handlers and end the process now.

    The worker sent its results and ``workerfinished`` in ``pytest_sessionfinish`` (``config.workeroutput`` then
    holds its exit status); xdist's controller counts the worker down on that message, and a channel that closes
    afterwards is no error (``WorkerController.process_from_remote``, pytest-xdist 3.8). Left to itself the process
    waits for the controller's terminate message, sent when the last worker has finished, and then tears down an
    interpreter that holds torch (and maybe a CUDA context), while the controller waits for every worker to exit.
    Here the ``atexit`` handlers run as at any exit (coverage data, logging), the standard streams are flushed, and
    only the interpreter's own teardown (freeing every module and object) is skipped, as multiprocessing's children
    skip it. A worker whose configuration or session failed before it reported keeps the normal exit, so xdist shows
    its error.
    """
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is None or "exitstatus" not in workeroutput:
        return
    atexit._run_exitfuncs()  # the exit step that os._exit skips
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(workeroutput["exitstatus"]))


_CHARGED = [0.0]
"""CPU seconds spent for this process by processes it does not wait for (:func:`charge`)."""


def charge(seconds: float) -> None:
    """Count ``seconds`` of CPU time that another process spent for this one, and that this one does not wait for
    (a self-test's runs forked by a shared server, ``tests/batch.py``), in :func:`cpu_seconds` from now on."""
    _CHARGED[0] += seconds


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, of its finished, waited-for children and :func:`charge`'s."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _CHARGED[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _STATE["first_test"] is None:
        _STATE["first_test"] = time.time()
    item.stash[_CPU_AT_SETUP] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The teardown report carries the test's CPU seconds since its setup as the property ``cpu_s``
    (a module-scoped fixture's work counts in the first test that requests it), the process that ran it
    (``worker``: ``gwN`` or ``main``) and when it ended, in seconds after the run's start (``ended_s``)."""
    outcome = yield
    start = item.stash.get(_CPU_AT_SETUP, None)
    if call.when == "teardown" and start is not None:
        report = outcome.get_result()
        report.user_properties.append(("cpu_s", round(cpu_seconds() - start, 2)))
        report.user_properties.append(("worker", getattr(item.config, "workerinput", {}).get("workerid", "main")))
        if _STATE["run_start"] is not None:
            report.user_properties.append(("ended_s", round(time.time() - _STATE["run_start"], 2)))


def fork_server() -> str | None:
    """The socket of the fork server that forked this xdist worker, or None; it forks other servers for the worker's
    tests too (:func:`harness.forkserver.start`'s ``via``: ``tests/batch.py``'s run server)."""
    return _FORKED[0]


def worker_record(worker: str) -> dict[str, object]:
    """This process's sizing and start-up: ``worker``, ``threads``, ``cores``, ``startup_s``, ``forked``."""
    import torch

    start, first = _STATE["run_start"], _STATE["first_test"]
    return {
        "worker": worker,
        "threads": torch.get_num_threads(),
        "cores": usable_cores(),
        "startup_s": None if start is None or first is None else round(first - start, 3),
        "forked": _FORKED[0] is not None,
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    if xdist_workers(session.config) and not hasattr(session.config, "workerinput"):
        return  # the controller runs no tests
    results = Path(session.config.getoption("results", "results"))
    results.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (results / f"worker-{worker}.json").write_text(json.dumps(worker_record(worker)))


def read_records(results: Path) -> list[dict[str, object]]:
    """The ``worker-*.json`` records of the last run in ``results`` (the controller's last when no worker ran)."""
    records = [json.loads(p.read_text()) for p in sorted(results.glob("worker-gw*.json"))]
    return records or [json.loads(p.read_text()) for p in results.glob("worker-main.json")]


def describe(records: list[dict[str, object]]) -> str | None:
    """One line: workers, threads each, cores, how many were forked (:mod:`harness.forkserver`), start-up median
    and maximum."""
    if not records:
        return None
    threads = sorted({r["threads"] for r in records})
    startups = [r["startup_s"] for r in records if r["startup_s"] is not None]
    line = (
        f"{len(records)} process(es) x {'/'.join(map(str, threads))} torch thread(s) "
        f"on {records[0]['cores']} usable core(s)"
    )
    if records[0]["worker"] != "main":
        forked = sum(bool(r.get("forked")) for r in records)
        line += f", {forked} forked from a pre-imported process" if forked else ", started as new interpreters"
    if startups:
        line += f"; start-up to first test: median {statistics.median(startups):.1f} s, max {max(startups):.1f} s"
    return line


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    line = describe(read_records(Path(config.getoption("results", "results"))))
    if line and xdist_workers(config):
        terminalreporter.write_line(f"xdist workers: {line}")
