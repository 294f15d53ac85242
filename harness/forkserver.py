"""pytest-xdist workers forked from one pre-imported process instead of started as new interpreters.

A worker is normally a new interpreter (``python -u -c BOOTSTRAP``, execnet's popen gateway) that imports torch
and pytest before it collects: about 1.4 CPU seconds on the 2-core CPU machine, and 1.9 s each when
16 start at once on a 16-core H100 host, where the controller has spent 1.4 s on the same imports before it starts
them. :func:`start` starts one process (``python -m harness.forkserver SOCKET PARENT``) that imports them
(:data:`PRELOADED`: torch without touching a GPU, nothing of the suite) and then waits on a Unix socket; :func:`fork_workers` has execnet
start :data:`STUB` for each local worker instead (``python -S -c``: no site packages, a few milliseconds), which
hands the server its standard streams (execnet's pipes), folder, environment and execnet's bootstrap line. The
server forks the worker (copy-on-write: the imports are shared), which takes them over and runs the bootstrap as
``python -u -c`` would (:func:`_worker`).

A forked worker gets what its own interpreter would: its own process, environment and folder, ``sys.path`` as
``python -c`` builds it there (``""``, then ``PYTHONPATH``, then the interpreter's own), ``-B`` where the spec asks
for it, and a fresh import of every module but the server's preloads (the suite's own modules included,
:func:`enter`). It sets ``FP4_FORKED_WORKER`` in its environment to its server's socket, which :mod:`harness.workers` reads
back into its record. Workers of specs that name an interpreter (``--tx popen//python=...``) or another host start as
execnet starts them. A stub whose server is gone says why on its standard error and execs ``python -u -c
BOOTSTRAP``, as execnet would have; a server that cannot start is a warning, and the workers start as new
interpreters (:mod:`harness.workers`). A forked worker's self-tests start their own run server
(``tests/batch.py``) through the same server, which forks it as it forks a worker (:func:`start`'s ``via``).

GPUs: torch initialises CUDA and HIP lazily, at first use; the server never uses a device, so each worker
initialises its own after the fork, after :mod:`harness.devices` has pinned it (the same reason that makes
forking safe for torch's DataLoader workers). CPU time: a worker is the server's child and the server waits
for it, and the controller waits for the server, so the workers' CPU counts in the controller's children
(``bench.scaling``); the stub is told its worker's CPU seconds when the worker ends, for a caller that
counts per run (``tests/batch.py``, whose run server is one of these).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

ENV_SWITCH = "FP4_FORK_WORKERS"
"""``0`` in the controller's environment starts xdist workers as new interpreters (the fork server is off)."""

FORKED = "FP4_FORKED_WORKER"
"""Set in a forked worker's environment to its server's socket (:func:`_worker`); :mod:`harness.workers` takes it out,
and a worker's self-tests start their run server through it (:func:`start`'s ``via``)."""

STARTUP_S = 60.0
"""Seconds :func:`start` waits for a new server's socket (it binds before it imports anything heavy)."""

OWN_PACKAGES = ("harness", "tests")
"""Top-level packages a server may hold that a forked process imports afresh (from its own ``sys.path``)."""

STUB = """\
import json, os, socket, sys
spec = json.loads(sys.argv[1])
entry = {"bootstrap": spec["bootstrap"], "cwd": os.getcwd(), "env": dict(os.environ), "nobytecode": spec["nobytecode"]}
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(spec["socket"])
    socket.send_fds(s, [json.dumps(entry).encode() + b"\\n"], [0, 1, 2])
    reader = s.makefile("rb")
    forked = reader.readline()  # the forked worker's pid: it holds the streams now
except OSError as exc:
    forked = exc
if not isinstance(forked, bytes) or not forked:
    print(f"fp4 fork server: {forked or 'it ended'}; this xdist worker starts as a new interpreter", file=sys.stderr)
    sys.stderr.flush()
    os.execv(spec["python"], spec["fallback"])
os.close(0)
os.close(1)
reported = reader.read()
if spec["cpu_file"]:
    with open(spec["cpu_file"], "ab") as cpu:
        cpu.write(reported)
"""
"""What execnet starts for a forked worker (``python -S -c STUB SPEC``): it hands the server its standard streams,
folder and environment and, once the server has forked the worker (it answers the worker's pid, after its imports),
waits until the server has reaped it (the server then sends the worker's CPU seconds and closes the socket) and,
where the spec names a file, appends them to it. A server that is gone, or that ends the connection instead,
leaves the stub its streams: it says why on its standard error and execs the worker as execnet would have."""


def stub_command(
    socket_path: str, bootstrap: str, fallback: list[str], cpu_file: str = "", nobytecode: bool = False
) -> list[str]:
    """``python -S -c STUB SPEC``: :data:`STUB` asking the server at ``socket_path`` to fork a process that runs
    ``bootstrap`` as ``python -c`` would (with ``-B`` where ``nobytecode``), its CPU seconds appended to ``cpu_file``
    if one is named; where the server is gone, the stub execs ``fallback`` (an argument list; its first item the
    interpreter)."""
    spec = {
        "socket": socket_path,
        "bootstrap": bootstrap,
        "cpu_file": cpu_file,
        "nobytecode": nobytecode,
        "python": fallback[0],
        "fallback": fallback,
    }
    return [sys.executable, "-S", "-c", STUB, json.dumps(spec)]


def fork_workers(socket_path: str, cpu_file: Path | None = None) -> Callable[[], None]:
    """Have execnet start this process's local xdist workers through the fork server at ``socket_path`` (their CPU
    seconds appended to ``cpu_file`` if given); returns the function that undoes it. A spec that names an
    interpreter is started as named."""
    from execnet import gateway_io

    started = gateway_io.popen_args

    def popen_args(spec: Any) -> list[str]:  # execnet's XSpec
        own = started(spec)
        if spec.python:
            return own
        cpu = str(cpu_file) if cpu_file else ""
        return stub_command(socket_path, gateway_io.popen_bootstrapline, own, cpu, bool(spec.dont_write_bytecode))

    popen_args.fork_server = socket_path  # type: ignore[attr-defined]  # read by forking()
    gateway_io.popen_args = popen_args

    def undo() -> None:
        gateway_io.popen_args = started

    return undo


def forking() -> bool:
    """Whether execnet already starts this process's workers through a fork server (:func:`fork_workers`)."""
    try:
        from execnet import gateway_io
    except ImportError:
        return False
    return hasattr(gateway_io.popen_args, "fork_server")


def enabled() -> bool:
    """Whether workers are forked here: Linux (``fork`` and Unix sockets that pass file descriptors) and
    :data:`ENV_SWITCH` not ``0`` in this process's environment."""
    return sys.platform.startswith("linux") and os.environ.get(ENV_SWITCH, "1") != "0"


@dataclass(frozen=True)
class Server:
    """A running fork server: its socket and process."""

    path: Path
    process: subprocess.Popen[bytes]


def start(module: str = "harness.forkserver", via: str | None = None, defaults: dict[str, str] | None = None) -> Server:
    """Start a fork server for this process, ``python -m MODULE SOCKET PID`` (it ends when this process does, or at
    :func:`stop`); returns once its socket exists, before its imports (requests that come meanwhile wait in its
    queue). Raises :class:`RuntimeError` with the server's output if it ends first or takes :data:`STARTUP_S`.

    ``defaults``: environment variables the server gets where this process's environment lacks them.

    ``via``: the socket of a running fork server (the one that forked this xdist worker) that forks the new server
    as it forks a worker (:data:`STUB`, whose process is the returned one), so that it starts with that server's
    imports instead of its own; ``MODULE`` is imported afresh in it. The stub execs ``python -m MODULE`` where that
    server is gone.

    The socket lies in a new folder of the system's temporary folder (a Unix socket's path may hold about 100
    bytes; pytest's folders can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="fp4-fork-")) / "socket"
    env = {**(defaults or {}), **{k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}}
    root = str(Path(__file__).resolve().parent.parent)  # the folder that holds this package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    args = [str(path), str(os.getpid())]
    command = [sys.executable, "-m", module, *args]
    if via is not None:
        command = stub_command(via, f"from {module} import main; main({args!r})", command)
    with open(path.parent / "server.log", "wb") as log:
        process = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + STARTUP_S
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            output = (path.parent / "server.log").read_text(errors="replace")
            shutil.rmtree(path.parent, ignore_errors=True)
            raise RuntimeError(f"the fork server {module} did not start: {output.strip() or 'no output'}")
        time.sleep(0.005)
    return Server(path, process)


def stop(server: Server) -> None:
    """Ask ``server`` to end once its workers have, and wait for it (its CPU time, its workers' included, then
    counts in this process's children)."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(server.path))
            s.sendall(b"null\n")
        server.process.wait(timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        server.process.kill()
        server.process.wait()
    shutil.rmtree(server.path.parent, ignore_errors=True)


# --- the server ---------------------------------------------------------------------------------------


def enter(env: dict[str, str], cwd: str, first: str, base_path: list[str]) -> None:
    """This forked process takes ``env``, the folder ``cwd`` and ``sys.path`` as ``python -m`` (``first``: the
    folder) or ``python -c`` (``first``: ``""``) builds it, and imports anew the server's own packages
    (:data:`OWN_PACKAGES`: a process started elsewhere finds its own copy of them, as a new interpreter would)."""
    for name in [n for n in sys.modules if n.split(".")[0] in OWN_PACKAGES]:
        del sys.modules[name]
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    os.chdir(cwd)


def _worker(conn: socket.socket, entry: dict, fds: list[int], base_path: list[str], server: str) -> NoReturn:
    """A forked xdist worker (or server, :func:`start`'s ``via``) of the server at ``server``: the stub's standard
    streams as its own, its folder, environment and ``sys.path`` (of ``python -c``), then execnet's bootstrap line,
    as ``python -u -c BOOTSTRAP`` would run it; its exit status is that of a ``SystemExit`` it raises, else 0, or 1
    after an uncaught exception."""
    conn.close()  # the server's copy stays open until the worker ends
    status = 0
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        enter({**entry["env"], FORKED: server}, entry["cwd"], "", base_path)
        sys.dont_write_bytecode = bool(entry.get("nobytecode"))
        sys.argv = ["-c"]
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stream, for its life
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        main = sys.modules["__main__"] = types.ModuleType("__main__")  # python -c's: no file (not the server's)
        exec(entry["bootstrap"], main.__dict__)  # execnet's own bootstrap line
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - the worker's end, as in its own process
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


class Runs(Protocol):
    """What a server does for requests without file descriptors (``tests/batch.py``'s whole pytest runs)."""

    def run(self, conn: socket.socket, entry: dict, base_path: list[str]) -> NoReturn:
        """In the forked child: carry out ``entry`` and end the process."""

    def ended(self, entry: dict, status: int) -> None:
        """In the server: the run's process ended with exit status ``status`` (``-N`` for signal ``N``)."""


def _reap(children: dict[int, tuple[dict, socket.socket | None]], runs: Runs | None, block: bool) -> None:
    """Wait for ended children (every one with ``block``): a worker's stub gets the worker's CPU seconds
    (``wait4``'s, a worker killed by a signal included) and then the connection's end; a run goes to ``runs``."""
    for pid, (entry, stub) in list(children.items()):
        done, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
        if not done:
            continue
        del children[pid]
        if stub is not None:
            with contextlib.suppress(OSError):  # a stub killed with its run
                stub.sendall(f"{usage.ru_utime + usage.ru_stime:.3f}\n".encode())
            stub.close()
        elif runs is not None:
            runs.ended(entry, os.waitstatus_to_exitcode(status))


def _gone(parent: int) -> Callable[[], bool]:
    """A check of whether the process ``parent`` has ended: by this process's parent where ``parent`` is it (a server
    it started), else by a pidfd of it (a server another server forked for it, :func:`start`'s ``via``), which
    becomes readable when it ends, before it is reaped."""
    if os.getppid() == parent:
        return lambda: os.getppid() != parent
    try:
        pidfd = os.pidfd_open(parent)
    except ProcessLookupError:
        return lambda: True
    except OSError:  # no pidfds (an old kernel, a sandbox): by signal 0, which an unreaped process still takes
        return lambda: not _exists(parent)
    return lambda: bool(select.select([pidfd], [], [], 0)[0])


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PRELOADED = ("pytest", "torch")
"""What a server imports for its workers. Not Hypothesis: pytest marks a plugin distribution's modules for assertion
rewriting, and a worker that found them imported would warn that it cannot rewrite them."""


def serve(path: str, parent: int, runs: Runs | None = None, preload: tuple[str, ...] = PRELOADED) -> int:
    """Listen on ``path``, import ``preload`` (those not imported yet), then fork a worker per request that brings
    file descriptors (a stub's) and hand the others to ``runs``, until a ``null`` line or until the process
    ``parent`` is gone; wait for every child before returning."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".new")
    listener.listen(256)
    os.rename(path + ".new", path)  # the socket appears listening; requests wait in its queue until the imports end
    here = os.getcwd()
    own_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path if p not in (here, "", *own_path)]
    for module in preload:  # imported once, shared by every child
        importlib.import_module(module)
    # what is alive now stays alive and unchanged in every child: out of the cyclic collector's sight, so the
    # children's collections neither scan nor write to (and so copy) these pages
    gc.collect()
    gc.freeze()
    gone = _gone(parent)
    listener.settimeout(0.02)  # an ended child is reaped within 20 ms
    children: dict[int, tuple[dict, socket.socket | None]] = {}
    while True:
        _reap(children, runs, block=False)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if gone():
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
        if entry is None or (not fds and runs is None):
            conn.close()
            if entry is None:
                break
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            for _, stub in children.values():  # other workers' stubs: their connections end when the server closes them
                if stub is not None:
                    stub.close()
            if fds:
                _worker(conn, entry, fds, base_path, path)
            assert runs is not None
            runs.run(conn, {**entry, "socket": path}, base_path)
        for fd in fds:  # the worker's pipes: only it holds them, so its end closes them
            os.close(fd)
        if fds:
            conn.sendall(f"{pid}\n".encode())  # the stub's streams are the worker's now
            children[pid] = entry, conn  # the stub waits on it for the worker's CPU seconds
        else:
            children[pid] = entry, None
            conn.close()
    listener.close()
    os.unlink(path)
    _reap(children, runs, block=True)
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    """``python -m harness.forkserver SOCKET PARENT``: a fork server for the xdist controller ``PARENT``. It ends
    without tearing down its interpreter (torch's modules and objects: about half a second on a GPU host, which
    the controller would wait for at the end of every run); its children have ended by then."""
    path, parent = (argv or sys.argv[1:])[:2]
    status = serve(path, int(parent))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
