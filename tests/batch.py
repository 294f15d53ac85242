"""Self-tests' pytest runs, each in a process forked from one pre-imported server: a run is what
``python -m pytest ARGS`` would do from its folder, without the interpreter's start-up.

A self-test that runs the suite end to end (``python -m pytest`` in a subprocess, like a user) pays for a
new interpreter and the imports of torch, Hypothesis and pytest, about 2.5 CPU seconds on the 2-core CPU
machine, before pytest starts. :func:`server` starts, in a process that asks for runs (an xdist worker),
one process that imports them and then waits on a Unix socket (a :mod:`harness.forkserver` server that also
forks whole runs; in a worker forked by the run's fork server, that server forks this one too, so that it starts
with torch and pytest imported); each run is a ``fork()`` of it
(copy-on-write: the imports are shared, nothing else is), so a run costs its own work only.
:func:`shared` runs a module's invocations once per pytest session (one process of the xdist workers asks
for them; the others wait for and read its results), and each test asserts on its own run's exit status,
output and files as before. In a run of eight or more xdist workers (a many-core host) up to four of a
batch's runs go at once (:func:`drivers`), so that a batch does not outlast the rest of the run.

Each run gets what its own process would get: its own process (a crash or ``os._exit`` ends it alone), its
environment, its working folder, ``sys.path`` as ``python -m`` builds it (the working folder, then
``PYTHONPATH``), file descriptors 1 and 2 redirected to its own files, and fresh imports of everything but
the server's packages (the suite's own modules, probe subjects and test modules are imported by the run, as
in a new interpreter). A run that starts xdist workers (``-n 1``) has them forked by the server too
(:func:`harness.forkserver.fork_workers`, unless :attr:`Run.own_workers`), with the CPU seconds of each counted in
the run's. The server is a child of
the process that started it, which stops and waits for it at the end of its session (``tests/conftest.py``), so the
server's CPU time counts in the pytest run's (``bench.scaling``), and each run's CPU seconds count in the test that
asked for it (:func:`harness.workers.charge`).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from harness import forkserver

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    """One ``python -m pytest ARGS`` from ``cwd`` with environment ``env`` (the whole environment).

    ``waits``: the run spends most of its time waiting (a hang run into a time limit, a test that sleeps), so
    :func:`run_all` starts it at once beside the batch's other runs instead of queueing it among them: a queued
    waiting run leaves its core idle while the batch's test holds its xdist worker. ``own_workers``: the run starts
    its xdist workers itself (:mod:`harness.workers`: through a fork server of its own, or as new interpreters), as
    outside the batch; otherwise the batch's server forks them."""

    args: Sequence[str]
    cwd: Path = ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    waits: bool = False
    own_workers: bool = False


@dataclass(frozen=True)
class Ran:
    """A run's exit status and output (the fields of ``subprocess.CompletedProcess`` the tests read)."""

    returncode: int
    stdout: str
    stderr: str


def suite_env(**extra: str) -> dict[str, str]:
    """This process's environment for a run of the suite: ``ci`` profile, outside any xdist worker, plus ``extra``."""
    env = {**os.environ, "FP4_PROFILE": "ci", **extra}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
"""Environment for a run whose expected output is the CPU machine's (the README's pasted verdict, a crash's
records, a kernel property skipped before its first example): the GPUs of a hardware host are hidden from it."""


def with_path(env: Mapping[str, str], *folders: Path | str) -> dict[str, str]:
    """``env`` with ``folders`` first on its ``PYTHONPATH``."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [*map(str, folders), env.get("PYTHONPATH")]))}


def drivers(runs: int, workers: int) -> int:
    """Runs of a batch of ``runs`` that go at once, in a pytest run of ``workers`` xdist workers: one per four
    workers (at most 4, never more than ``runs``), so that on a many-core host the batch is not the run's longest
    test; 1 (one at a time, beside the other workers' tests) with up to 7 workers, as on the 2-core CI machine."""
    return max(1, min(4, workers // 4, runs))


def workers_run(module: Path, workers: int, env: Mapping[str, str], own_workers: bool = False) -> Run:
    """``python -m pytest MODULE -n WORKERS`` from the module's folder (its rootdir, results in ``results/`` there),
    with the suite's plugins loaded by ``-p`` (the module's folder has no conftest) and no cache."""
    here = module.parent
    return Run(
        [str(module), "-p", "harness.plugin", "-p", "harness.workers", "-p", "harness.scheduling",
         "-p", "no:cacheprovider", "-q", "-n", str(workers), "--results", str(here / "results"), "--rootdir", str(here)],
        cwd=here, env=env, own_workers=own_workers,
    )  # fmt: skip


# --- the client: one xdist worker's side -------------------------------------------------------------------

_SERVER: dict[str, forkserver.Server] = {}
"""This process's run server, started by the first run asked of this process."""


def _session_folder(factory: pytest.TempPathFactory) -> Path:
    """The pytest session's temporary folder, shared by its xdist workers (each has its own below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def server() -> Path:
    """This process's run server (its socket), started at the first call; every process (each xdist worker) has its
    own and stops it at the end of its session (:func:`stop_server`), so none waits on another's."""
    if "server" not in _SERVER:
        from harness.workers import fork_server

        _SERVER["server"] = forkserver.start(module="tests.batch", via=fork_server())
    return _SERVER["server"].path


def stop_server() -> None:
    """Stop this process's run server, if it started one, and wait for it (its CPU time then counts in this
    process's children's, as a subprocess's would)."""
    if "server" in _SERVER:
        forkserver.stop(_SERVER.pop("server"))


def _request(path: Path, entry: dict, deadline: float) -> float:
    """Have the server at ``path`` run ``entry``; the run's CPU seconds (0 when it was killed at ``deadline`` or
    ended without reporting)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall((json.dumps(entry) + "\n").encode())
        reader = s.makefile("r")
        pid = int(reader.readline())
        s.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            line = reader.readline()
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            return 0.0
        return float(line) if line.strip() else 0.0


def run_all(runs: Mapping[str, Run], folder: Path, timeout: float = 1800, parts: int = 1) -> dict[str, Ran]:
    """Run ``runs`` in processes forked by this process's run server, ``parts`` at a time, and those that
    :attr:`Run.waits` all at once beside them; ``{name: Ran}``. ``folder`` holds each run's outputs; their CPU
    seconds count in the calling test (:func:`harness.workers.charge`). A run whose process ended outside pytest
    (``os._exit``, a signal, killed at the batch's ``timeout``) has its process's exit status as ``subprocess`` gives
    it (``-N`` for signal N), or -1 if the server recorded none."""
    from harness.workers import charge

    folder.mkdir(parents=True, exist_ok=True)
    entries = {
        name: {
            "args": list(r.args),
            "cwd": str(r.cwd),
            "env": dict(r.env),
            "out": str(folder / name),
            "own": r.own_workers,
        }
        for name, r in runs.items()
    }
    waiting = [entries[name] for name, r in runs.items() if r.waits]
    queued = [entries[name] for name, r in runs.items() if not r.waits]
    path, deadline = server(), time.monotonic() + timeout  # one bound for the whole batch
    with ThreadPoolExecutor(max(1, len(waiting))) as beside, ThreadPoolExecutor(parts) as pool:
        started = [beside.submit(_request, path, entry, deadline) for entry in waiting]
        cpu = sum(pool.map(lambda entry: _request(path, entry, deadline), queued))
        charge(cpu + sum(f.result() for f in started))
    results = {}
    for name in runs:
        out = folder / name
        stdout, stderr = (
            (out / f).read_text(errors="replace") if (out / f).exists() else "" for f in ("stdout", "stderr")
        )
        status = out / "returncode"
        if status.exists():
            results[name] = Ran(int(status.read_text()), stdout, stderr)
            continue
        ended = _ended(out)
        note = "no exit status" if ended is None else f"exit status {ended}"
        results[name] = Ran(
            -1 if ended is None else ended,
            stdout[-3000:],
            f"{note}: the run's process ended outside pytest\n{stderr[-3000:]}",
        )
    return results


def _ended(out: Path, wait: float = 5.0) -> int | None:
    """The exit status the server recorded for a run that ended outside pytest (``os._exit``, a signal: ``-N`` as
    ``subprocess`` gives it), once it has reaped the process; ``None`` if it records none within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while not (out / ENDED).exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return int((out / ENDED).read_text())


def run(one: Run, folder: Path, timeout: float = 1800) -> Ran:
    """One run (:func:`run_all`), its outputs in ``folder``."""
    return run_all({"run": one}, folder, timeout)["run"]


def shared(
    factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Mapping[str, Run]]
) -> tuple[Path, dict[str, Ran]]:
    """``make(folder)``'s runs, run once per pytest session: the first xdist worker to ask runs them
    (:func:`run_all`), the others wait for its results. ``folder`` (shared by the workers) is for the
    runs' inputs and ``--results``; returns it and ``{run name: Ran}``."""
    from filelock import FileLock  # a dependency of torch

    folder = _session_folder(factory) / f"batch-{name}"
    with FileLock(str(folder) + ".lock"):
        done = folder / "done.json"
        if not done.exists():
            runs = make(folder / "runs")
            workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
            results = run_all(runs, folder / "out", parts=drivers(len(runs), workers))
            done.write_text(json.dumps({k: vars(v) for k, v in results.items()}))
        loaded = json.loads(done.read_text())
    return folder / "runs", {k: Ran(**v) for k, v in loaded.items()}


# --- the server ---------------------------------------------------------------------------------------


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (a run's xdist workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run(entry: dict, base_path: list[str]) -> int:
    """Run ``entry`` in this (forked) process as ``python -m pytest ARGS`` from its folder; its exit status."""
    out = Path(entry["out"])
    out.mkdir(parents=True, exist_ok=True)
    forkserver.enter(entry["env"], entry["cwd"], entry["cwd"], base_path)
    if not entry["own"]:  # a run's -n N: workers forked by this server too
        forkserver.fork_workers(entry["socket"], out / WORKERS_CPU)
    with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            return int(pytest.main(list(entry["args"])))
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - a crash of the run is its result, as in its own process
            traceback.print_exc()
            return 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()


WORKERS_CPU = "workers-cpu"
"""A run's file of its forked xdist workers' CPU seconds, one line each (:data:`harness.forkserver.STUB`)."""


def _child(conn: socket.socket, entry: dict, base_path: list[str]) -> NoReturn:
    """A forked run: its pid to the client (to be killed at the deadline), the run, its files, its CPU seconds
    (its forked xdist workers' included)."""
    try:
        conn.sendall(f"{os.getpid()}\n".encode())
        start = time.perf_counter()
        code = _run(entry, base_path)
        workers = Path(entry["out"]) / WORKERS_CPU
        cpu = _cpu() + (sum(map(float, workers.read_text().split())) if workers.exists() else 0.0)
        (Path(entry["out"]) / "cpu").write_text(f"{cpu:.2f} {time.perf_counter() - start:.2f}")
        (Path(entry["out"]) / "returncode").write_text(str(code))
        conn.sendall(f"{cpu:.3f}\n".encode())
    finally:
        os._exit(0)


ENDED = "ended"
"""A run's file of its process's exit status, written by the server when the run ended outside pytest."""


class _Runs:
    """The server's runs (:class:`harness.forkserver.Runs`): each a forked :func:`_child`; one that ended outside
    pytest gets its process's exit status (:data:`ENDED`)."""

    def run(self, conn: socket.socket, entry: dict, base_path: list[str]) -> NoReturn:
        _child(conn, entry, base_path)

    def ended(self, entry: dict, status: int) -> None:
        out = Path(entry["out"])
        if not (out / "returncode").exists():
            # written whole, then renamed, as the client polls for it; not with harness.records.write_json: the
            # server holds none of the suite's modules but this one, which every run it forks imports afresh
            (out / f"{ENDED}.new").write_text(str(status))
            os.replace(out / f"{ENDED}.new", out / ENDED)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.batch SOCKET PARENT``: a :mod:`harness.forkserver` server that also forks a run per request
    without file descriptors (a JSON line: ``args``, ``cwd``, ``env``, ``out``), until a ``null`` line or until the
    process ``PARENT`` (the xdist worker that started the server) is gone."""
    path, parent = (argv or sys.argv[1:])[:2]
    # Hypothesis too: about 0.1 CPU s of each of the self-tests' runs (whose output ignores the rewrite warnings)
    return forkserver.serve(path, int(parent), _Runs(), ("hypothesis", *forkserver.PRELOADED))


if __name__ == "__main__":
    sys.exit(main())
