"""Self-tests' pytest runs, many in one interpreter: ``python -m tests.batch SPEC`` runs each of SPEC's
``pytest`` invocations in turn, in-process, as ``python -m pytest ARGS`` would run it from its folder.

A self-test that runs the suite end to end (``python -m pytest`` in a subprocess, like a user) pays
for a new interpreter, torch, Hypothesis and the plugin's imports, about 3 CPU seconds on the 2-core
CPU machine, before its first test. :func:`shared` runs a module's invocations in one process instead,
once per pytest session (one process of the xdist workers runs them; the others wait for and read its
results), and each test asserts on its own run's exit status, output and files as before. In a run of eight or
more xdist workers (a many-core host) the batch is split over up to four concurrent processes (:func:`drivers`),
so that it does not outlast the rest of the run.

Each run gets what its own process would get: its environment (``os.environ`` replaced, then restored),
its working folder, ``sys.path`` as ``python -m`` builds it (the working folder, then ``PYTHONPATH``),
file descriptors 1 and 2 redirected to its own files (pytest's, the plugin's and native output alike),
and fresh imports of everything outside the interpreter's installed packages (the suite's own modules,
probe subjects, test modules): modules imported by an earlier run are dropped from ``sys.modules``
first. torch, Hypothesis, pytest and the other installed packages are imported once and kept. A run
that starts xdist workers (``-n 1``) starts them as its own process would, with its environment.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import resource
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    """One ``python -m pytest ARGS`` from ``cwd`` with environment ``env`` (the whole environment)."""

    args: Sequence[str]
    cwd: Path = ROOT
    env: Mapping[str, str] = field(default_factory=dict)


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
    """Driver processes a batch of ``runs`` is split into, in a pytest run of ``workers`` xdist workers: one per
    four workers (at most 4, never more than ``runs``), so that on a many-core host the batch is not the run's
    longest test; 1 (one process, the fewest imports) with up to 7 workers, as on the 2-core CI machine."""
    return max(1, min(4, workers // 4, runs))


def run_all(runs: Mapping[str, Run], folder: Path, timeout: float = 1800, parts: int = 1) -> dict[str, Ran]:
    """Run ``runs`` in ``parts`` concurrent ``python -m tests.batch`` processes, run ``i`` in process ``i % parts``
    (neighbouring runs, often alike in cost, go to different processes); ``{name: Ran}``. ``folder`` holds the
    specs and outputs."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = [
        {"name": name, "args": list(r.args), "cwd": str(r.cwd), "env": dict(r.env), "out": str(folder / name)}
        for name, r in runs.items()
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    procs = []
    for part in range(parts):
        (folder / f"spec-{part}.json").write_text(json.dumps(spec[part::parts]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.batch", str(folder / f"spec-{part}.json")],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ended, deadline = [], time.monotonic() + timeout  # one bound for the whole batch, as with one process
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        ended.append((proc.returncode, stdout, stderr))
    results = {}
    for i, entry in enumerate(spec):
        out = Path(entry["out"])
        status = out / "returncode"
        if not status.exists():  # the batch process died before this run ended: each test reading it fails
            code, stdout, stderr = ended[i % parts]
            why = f"no exit status: the batch process ended with {code}\n{stderr[-3000:]}"
            results[entry["name"]] = Ran(-1, stdout[-3000:], why)
            continue
        results[entry["name"]] = Ran(
            int(status.read_text()),
            (out / "stdout").read_text(errors="replace"),
            (out / "stderr").read_text(errors="replace"),
        )
    return results


def shared(
    factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Mapping[str, Run]]
) -> tuple[Path, dict[str, Ran]]:
    """``make(folder)``'s runs, run once per pytest session: the first xdist worker to ask runs them
    (:func:`run_all`), the others wait for its results. ``folder`` (shared by the workers) is for the
    runs' inputs and ``--results``; returns it and ``{run name: Ran}``."""
    from filelock import FileLock  # a dependency of torch

    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's temporary folder, above each worker's own
    folder = base / f"batch-{name}"
    with FileLock(str(folder) + ".lock"):
        done = folder / "done.json"
        if not done.exists():
            runs = make(folder / "runs")
            workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
            results = run_all(runs, folder / "out", parts=drivers(len(runs), workers))
            done.write_text(json.dumps({k: vars(v) for k, v in results.items()}))
        loaded = json.loads(done.read_text())
    return folder / "runs", {k: Ran(**v) for k, v in loaded.items()}


# --- the driver ---------------------------------------------------------------------------------------


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """The interpreter's standard library and installed-package folders, each ending in a separator."""
    return tuple({sysconfig.get_paths()[key] + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _installed(module: object) -> bool:
    """Whether ``module`` comes from the interpreter's standard library or installed packages (kept between runs)."""
    file = getattr(module, "__file__", None)
    if not file:
        return False  # namespace packages and stand-ins made by the suite's adapters: dropped
    return str(file).startswith(_installed_roots())


def _run_one(entry: dict, base_path: list[str], keep: set[str]) -> int:
    out = Path(entry["out"])
    out.mkdir(parents=True, exist_ok=True)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(entry["env"])
    extra = [p for p in entry["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [entry["cwd"], *extra, *base_path]
    os.chdir(entry["cwd"])
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    with open(out / "stdout", "wb") as stdout, open(out / "stderr", "wb") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            code = int(pytest.main(list(entry["args"])))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - a crash of the run is its result, as in its own process
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
    os.chdir(saved_cwd)
    os.environ.clear()
    os.environ.update(saved_env)
    for name in set(sys.modules) - keep:
        if not _installed(sys.modules[name]):
            del sys.modules[name]
    return code


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (a run's xdist workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    """Run every entry of the spec file ``argv[0]``; each writes ``stdout``, ``stderr``, ``returncode`` in its ``out``."""
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    import hypothesis  # noqa: F401 - imported once, kept for every run
    import torch  # noqa: F401

    here = os.getcwd()
    own_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path if p not in (here, "", *own_path)]
    keep = set(sys.modules)  # this driver's own modules, torch's and Hypothesis's
    # what is alive now (the interpreter's, torch's and Hypothesis's objects) stays alive: out of the cyclic
    # collector's sight, so the collections pytest makes at the end of every run scan only the runs' objects
    gc.collect()
    gc.freeze()
    for entry in spec:
        before, start = _cpu(), time.perf_counter()
        code = _run_one(entry, base_path, keep)
        (Path(entry["out"]) / "cpu").write_text(f"{_cpu() - before:.2f} {time.perf_counter() - start:.2f}")
        (Path(entry["out"]) / "returncode").write_text(str(code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
