"""The records a run leaves in its ``--results`` folder, written so that no reader can take a
killed, crashed or concurrent run for a finished one.

``RESULTS/`` holds:

* ``.lock``: held (``flock``) by the run's controller process from its configuration to its
  end. A second run on the same folder stops with a usage error before its first test
  (:func:`lock`); the kernel drops the lock when the holder dies, however it dies, so a crashed
  run leaves no stale lock. One folder per concurrent run: nothing is ever merged or lost.
* ``run.json`` (:func:`run_record`): written when the run starts, with ``state: "running"``, and
  rewritten when the session ends with ``state: "complete"`` and pytest's exit status. A record
  still saying ``running`` belongs to a run that was killed, crashed or hangs: never a result.
* ``summary.json``: the contract x backend x hardware counts, emptied at the start and rewritten
  after every test, so a crashed run's counts cover the tests before the crash.
* ``inflight/WORKER.test.json`` (:func:`write_test_record`): the test a process is running (node
  id, contract, backend, hardware, a pytest command), removed when the test ends;
  ``inflight/WORKER.json``: the example it is running (its ``python -m harness.repro`` command,
  :mod:`harness.runner`). What a dead process leaves here (:func:`inflight`) names the test and
  example it died in, attributed to its contract and backend.
* ``unfinished/STARTED-RUNID/``: the records of an earlier run in this folder that never
  finished, moved aside (not deleted) by the next run (:func:`start`).

Every record is written atomically (a temporary file in the same folder, then ``os.replace``):
a reader sees the old file or the new one, never a truncated one.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import socket
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from harness import checkout

RUN = "run.json"
SUMMARY = "summary.json"
INFLIGHT = "inflight"
UNFINISHED = "unfinished"
LOCK = ".lock"
RUNNING, COMPLETE = "running", "complete"


class RecordError(ValueError):
    """A record that cannot be read: truncated, not JSON, or not what a run writes."""


class ResultsBusy(RuntimeError):
    """Another live run holds the results folder."""


def now() -> str:
    """UTC time stamp of the records."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def worker_name() -> str:
    """This process's name in per-process records: the xdist worker id (``gw0`` ...) or ``main``."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file in the same folder, then ``os.replace``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON in ``path``; :class:`RecordError` naming the file if it is truncated or not JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: truncated or not JSON ({exc})") from None


def run_record(
    *,
    subject: str,
    profile: str,
    shard: str | None,
    workers: int | None,
    hardware: str,
    junitxml: str | None,
) -> dict[str, Any]:
    """What ``run.json`` says about a run when it starts: host, options, library versions, a fresh
    ``run_id`` and ``state: "running"`` (:func:`finish` completes it)."""
    return {
        "run_id": uuid.uuid4().hex,
        "state": RUNNING,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": now(),
        "finished": None,
        "exitstatus": None,
        "subject": subject,
        "profile": profile,
        "shard": shard,
        "workers": workers,
        "hardware": hardware,
        "junitxml": junitxml,
        "versions": library_versions(),
        "commit": checkout.commit(),
    }


LIBRARIES = {
    "torch": "torch",
    "hypothesis": "hypothesis",
    "flashinfer": "flashinfer-python",
    "aiter": "amd-aiter",
    "triton": "triton",
    "triton_kernels": "triton-kernels",
    "vllm": "vllm",
    "sglang": "sglang",
}
"""The suite's libraries: module name -> distribution name (PyPI's ``aiter`` is another project)."""


def library_versions() -> dict[str, str]:
    """Python's version, the suite's (:func:`harness.checkout.provenance`) and those of the suite's
    :data:`LIBRARIES`, keyed by distribution name (absent ones left out).

    Read from the installed packages' metadata, not from imported modules: the xdist controller that writes
    ``run.json`` never imports FlashInfer or AITER (its workers do). A library imported without a distribution
    (vLLM's vendored ``triton_kernels``) is recorded as ``unversioned (its file)``."""
    versions: dict[str, str] = {"python": platform.python_version(), checkout.DISTRIBUTION: checkout.provenance()}
    for module, dist in LIBRARIES.items():
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            if (found := sys.modules.get(module)) is not None:
                versions[dist] = f"unversioned ({getattr(found, '__file__', None) or 'namespace package'})"
    return versions


def lock(folder: Path) -> IO[str]:
    """Hold ``folder/.lock`` for this process's lifetime (keep the returned file open).

    Raises :class:`ResultsBusy` naming the holder (pid, host, start) when another live process
    holds it. ``flock`` locks belong to the open file: they vanish when the holder exits or is
    killed, so no stale lock survives a crash.
    """
    handle = (folder / LOCK).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ResultsBusy(
            f"--results {str(folder)!r} is in use by another run ({holder}); give each concurrent run its own folder"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {now()}")
    handle.flush()
    return handle


def start(folder: Path, record: dict[str, Any]) -> Path | None:
    """Mark ``folder`` as holding a running run (``run.json`` with ``state: "running"``), after
    moving an earlier unfinished run's records (``run.json``, ``summary.json``, ``inflight/``,
    JUnit ``*.xml``) to ``unfinished/STARTED-RUNID/``; returns that folder, or None.

    Call it holding :func:`lock`. The caller then clears the earlier run's other records.
    """
    moved = None
    previous = folder / RUN
    if previous.exists():
        try:
            old = read_json(previous)
        except RecordError:
            old = None
        old = old if isinstance(old, dict) else {}
        if old.get("state") != COMPLETE:
            stamp = str(old.get("started") or "unknown").replace(":", "")
            moved = folder / UNFINISHED / f"{stamp}-{str(old.get('run_id') or uuid.uuid4().hex)[:8]}"
            moved.mkdir(parents=True, exist_ok=True)
            for path in [previous, folder / SUMMARY, folder / INFLIGHT, *folder.glob("*.xml")]:
                if path.exists():
                    shutil.move(str(path), moved / path.name)
    write_json(folder / RUN, record)
    return moved


def finish(folder: Path, record: dict[str, Any], exitstatus: int) -> None:
    """Rewrite ``run.json`` as complete, with pytest's exit status and the installed versions."""
    record.update(state=COMPLETE, finished=now(), exitstatus=int(exitstatus), versions=library_versions())
    write_json(folder / RUN, record)


def write_test_record(folder: Path, payload: dict[str, Any]) -> Path:
    """Record the test this process starts (``inflight/WORKER.test.json``); unlink the path when it ends."""
    path = folder / INFLIGHT / f"{worker_name()}.test.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, payload, indent=None)
    return path


def inflight(folder: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The in-flight records under ``folder/inflight``: one dict per node id (the test record's
    fields, then the example record's ``command``/``repro`` over them), and the files that could
    not be read (a message each)."""
    found: dict[str, dict[str, Any]] = {}
    unreadable: list[str] = []
    paths = sorted((folder / INFLIGHT).glob("*.json"), key=lambda p: (not p.name.endswith(".test.json"), p.name))
    for path in paths:
        try:
            data = read_json(path)
        except RecordError as exc:
            unreadable.append(str(exc))
            continue
        if isinstance(data, dict) and isinstance(data.get("nodeid"), str):
            found.setdefault(data["nodeid"], {}).update(data)
        else:
            unreadable.append(f"{path}: not an in-flight record")
    return found, unreadable
