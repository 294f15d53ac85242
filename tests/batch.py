"""Self-tests' pytest runs, each in a process forked from one pre-imported server: a run is what
``python -m pytest ARGS`` would do from its folder, without the interpreter's start-up.

A self-test that runs the suite end to end (``python -m pytest`` in a subprocess, like a user) pays for a
new interpreter and the imports of torch, Hypothesis and pytest, about 2.5 CPU seconds on the 2-core CPU
machine, before pytest starts. :func:`server` starts, in a process that asks for runs (an xdist worker),
one process that imports them and then waits on a Unix socket; each run is a ``fork()`` of it
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
(:func:`_fork_xdist_workers`): execnet gets the same pipes to a worker that has the run's environment, folder and
``sys.path`` of ``python -c``, without the start-up of an interpreter that imports torch. The server is a child of
the process that started it, which stops and waits for it at the end of its session (``tests/conftest.py``), so the
server's CPU time counts in the pytest run's (``bench.scaling``), and each run's CPU seconds count in the test that
asked for it (:func:`harness.workers.charge`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    """One ``python -m pytest ARGS`` from ``cwd`` with environment ``env`` (the whole environment).

    ``waits``: the run spends most of its time waiting (a hang run into a time limit, a test that sleeps), so
    :func:`run_all` starts it at once beside the batch's other runs instead of queueing it among them: a queued
    waiting run leaves its core idle while the batch's test holds its xdist worker."""

    args: Sequence[str]
    cwd: Path = ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    waits: bool = False


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


# --- the client: one xdist worker's side -------------------------------------------------------------------

_SERVER: dict[str, tuple[Path, subprocess.Popen[bytes]]] = {}
"""This process's run server: its socket and process, started by the first run asked of this process."""


def _session_folder(factory: pytest.TempPathFactory) -> Path:
    """The pytest session's temporary folder, shared by its xdist workers (each has its own below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def server(startup: float = 300) -> Path:
    """This process's run server (its socket), started at the first call; every process (each xdist worker) has its
    own and stops it at the end of its session (:func:`stop_server`), so none waits on another's.

    The socket lies in a new folder of the system's temporary folder (a Unix socket's path may hold about 100
    bytes; pytest's folders can be longer)."""
    if "server" in _SERVER:
        return _SERVER["server"][0]
    path = Path(tempfile.mkdtemp(prefix="fp4-batch-")) / "socket"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = path.parent / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.batch", str(path), str(os.getpid())],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + startup
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the self-tests' run server did not start: {log.read_text(errors='replace')}")
        time.sleep(0.02)
    _SERVER["server"] = path, proc
    return path


def stop_server() -> None:
    """Stop this process's run server, if it started one, and wait for it (its CPU time then counts in this
    process's children's, as a subprocess's would)."""
    if "server" not in _SERVER:
        return
    path, proc = _SERVER.pop("server")
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(b"null\n")
        proc.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    shutil.rmtree(path.parent, ignore_errors=True)


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
        name: {"args": list(r.args), "cwd": str(r.cwd), "env": dict(r.env), "out": str(folder / name)}
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


_WORKER_STUB = """\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
entry = {"bootstrap": sys.argv[2], "cwd": os.getcwd(), "env": dict(os.environ)}
socket.send_fds(s, [json.dumps(entry).encode() + b"\\n"], [0, 1, 2])
os.close(0)
os.close(1)
reported = b""
while chunk := s.recv(1 << 16):
    reported += chunk
with open(sys.argv[3], "ab") as cpu:
    cpu.write(reported)
"""
"""What a run starts for an xdist worker (``python -S -c STUB SOCKET BOOTSTRAP CPU_FILE``, no site packages): it hands
its standard streams (execnet's pipes), folder and environment to the run server, which forks the worker from its
pre-imported process (:func:`_worker`), waits until the server has reaped the worker (it then sends the worker's CPU
seconds and closes the socket) and appends them to ``CPU_FILE``."""


def _fork_xdist_workers(socket_path: str, cpu_file: Path) -> None:
    """Have this run's xdist workers forked by the run server at ``socket_path`` instead of started as new
    interpreters (about 1.4 CPU s each on the 2-core machine): execnet starts :data:`_WORKER_STUB` in their place,
    with the same pipes, folder and environment; their CPU seconds are appended to ``cpu_file``. A worker spec that
    names an interpreter is started as named."""
    try:
        from execnet import gateway_io
    except ImportError:  # no xdist here: nothing to start
        return
    started = gateway_io.popen_args

    def popen_args(spec: Any) -> list[str]:  # execnet's XSpec
        if spec.python:
            return started(spec)
        return [sys.executable, "-S", "-c", _WORKER_STUB, socket_path, gateway_io.popen_bootstrapline, str(cpu_file)]

    gateway_io.popen_args = popen_args


def _enter(env: dict[str, str], cwd: str, first: str, base_path: list[str]) -> None:
    """This forked process takes ``env``, the folder ``cwd`` and ``sys.path`` as ``python -m`` (``first``: the
    folder) or ``python -c`` (``first``: ``""``) builds it, and imports anew everything but the server's packages."""
    sys.modules.pop("tests", None)  # the server's own package: a run from another folder imports that folder's
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    os.chdir(cwd)


def _run(entry: dict, base_path: list[str]) -> int:
    """Run ``entry`` in this (forked) process as ``python -m pytest ARGS`` from its folder; its exit status."""
    out = Path(entry["out"])
    out.mkdir(parents=True, exist_ok=True)
    _enter(entry["env"], entry["cwd"], entry["cwd"], base_path)
    _fork_xdist_workers(entry["socket"], out / WORKERS_CPU)
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
"""A run's file of its forked xdist workers' CPU seconds, one line each (:data:`_WORKER_STUB`)."""


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


def _worker(conn: socket.socket, entry: dict, fds: list[int], base_path: list[str]) -> NoReturn:
    """A forked xdist worker: the stub's standard streams as its own, its folder, environment and ``sys.path`` (of
    ``python -c``), then execnet's bootstrap line, as ``python -u -c BOOTSTRAP`` would run it. The server tells the
    stub the worker's CPU seconds when it reaps it (:func:`_reap`)."""
    conn.close()  # the server's copy stays open until then
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _enter(entry["env"], entry["cwd"], "", base_path)
        sys.argv = ["-c"]
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stream, for its life
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        exec(entry["bootstrap"], {"__name__": "__main__"})  # execnet's own bootstrap line
    except BaseException:  # noqa: BLE001 - the worker's end, as in its own process
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


ENDED = "ended"
"""A run's file of its process's exit status, written by the server when the run ended outside pytest."""


def _reap(children: dict[int, str | socket.socket], block: bool) -> None:
    """Wait for ended runs and workers (every one with ``block``). A run (its ``out`` folder) that has no exit status
    of pytest gets its process's (:data:`ENDED`); a worker's stub (its connection) gets the worker's CPU seconds
    (``wait4``'s, a worker killed by a signal included) and then the connection's end."""
    for pid, held in list(children.items()):
        done, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
        if not done:
            continue
        del children[pid]
        if isinstance(held, socket.socket):
            with contextlib.suppress(OSError):  # a stub killed with its run
                held.sendall(f"{usage.ru_utime + usage.ru_stime:.3f}\n".encode())
            held.close()
        elif not (Path(held) / "returncode").exists():
            # written whole, then renamed, as the client polls for it; not with harness.records.write_json: the server
            # imports none of the suite's modules, which every run it forks imports afresh
            (Path(held) / f"{ENDED}.new").write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(Path(held) / f"{ENDED}.new", Path(held) / ENDED)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.batch SOCKET PARENT``: import torch, Hypothesis and pytest, listen on ``SOCKET`` and fork a
    run per request (a JSON line: ``args``, ``cwd``, ``env``, ``out``) until a ``null`` line or until the process
    ``PARENT`` (the xdist worker that started the server) is gone."""
    path, parent = (argv or sys.argv[1:])[:2]
    import hypothesis  # noqa: F401 - imported once, shared by every run
    import torch  # noqa: F401

    here = os.getcwd()
    own_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path if p not in (here, "", *own_path)]
    # what is alive now stays alive and unchanged in every run: out of the cyclic collector's sight, so the runs'
    # collections neither scan nor write to (and so copy) these pages
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the client waits for the socket to appear: it appears listening
    listener.settimeout(0.02)  # an ended run is reaped (and its exit status recorded) within 20 ms
    children: dict[int, str | socket.socket] = {}  # pid -> a run's out folder, or a worker's stub connection
    while True:
        _reap(children, block=False)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != int(parent):
                break
            continue
        conn.settimeout(None)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while data and not data.endswith(b"\n"):
            more = conn.recv(1 << 16)
            if not more:
                break
            data += more
        entry = json.loads(data or b"null")
        if entry is None:
            conn.close()
            break
        pid = os.fork()
        if pid == 0:
            listener.close()
            for held in children.values():  # other workers' stubs: their connections end when the server closes them
                if isinstance(held, socket.socket):
                    held.close()
            if fds:
                _worker(conn, entry, fds, base_path)
            _child(conn, {**entry, "socket": path}, base_path)
        for fd in fds:  # the worker's pipes: only it holds them, so its end closes them
            os.close(fd)
        if fds:
            children[pid] = conn  # the stub waits on it for the worker's CPU seconds (_reap)
        else:
            children[pid] = entry["out"]
            conn.close()
    listener.close()
    os.unlink(path)
    _reap(children, block=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
