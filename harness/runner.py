"""The property runner: one example of a check, with verdict and bookkeeping around it.

:func:`run_check` calls a bare check ``fn(config, backend, policy)`` once and decides the
example's verdict:

* a check needing a library or hardware this machine lacks raises ``LibraryUnavailable``: the
  test is skipped with that reason, never counted as a failure or an expected failure;
* where the subject's known-failure ledger lists an upstream bug, only the failure the entry
  describes (exception type and message pattern, :class:`subjects.registry.KnownFailure`) is
  recorded as expected; any other exception fails, and a pass raises :class:`KnownFailureFixed`;
  a :class:`contracts.errors.GuardViolation` (the suite's own guards) is never absorbed by an entry;
* an example running past the profile's time limit fails with :class:`ExampleTimeout`, naming
  the test and its reproduction;
* every failure gets the one-line reproduction as a note and carries its :class:`Reproduction`,
  so the plugin writes the script of the example Hypothesis reports (:func:`reported_reproduction`;
  when several pinned examples fail, the first of them); the last failing call is kept as a fallback.

The run's state is one :class:`RunState`, kept in ``config.stash[RUN_STATE]`` by the plugin.
Tests made by :func:`harness.properties.check` pass it explicitly; tests still calling
``run_check`` by hand use the state the plugin activated for this process (:func:`active`).
"""

from __future__ import annotations

import enum
import faulthandler
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import currently_in_test_context, event, note
from hypothesis.errors import UnsatisfiedAssumption

from contracts.errors import GuardViolation, LibraryUnavailable
from harness import records
from harness.repro import Reproduction
from strategies.config import Config


class KnownFailureFixed(AssertionError):
    """A configuration listed as a known upstream bug no longer fails: the ledger needs updating."""


class ExampleTimeout(BaseException):
    """An example ran past the per-example time limit.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that neither a subject's nor a check's
    ``except Exception`` swallows it, and Hypothesis stops at once instead of shrinking a hang.
    """


@dataclass
class NodeStats:
    """Per-test bookkeeping for the benchmark: examples run, and when the first failure came; for a kernel check
    (``kernel``) the test's outcome and its largest error as a fraction of its bound (:func:`note_error`), which
    ``python -m harness.executions`` folds into the kernel execution records."""

    examples: int = 0
    seconds: float = 0.0  # wall time from the first example to the last one's end
    started: float = 0.0
    first_failure_example: int | None = None
    first_failure_seconds: float | None = None
    counterexample: str | None = None
    kernel: bool = False
    outcome: str | None = None  # pytest's outcome of the test's call: passed, failed or skipped
    worst_error: float | None = None


@dataclass
class RunState:
    """What the runner knows of the pytest run (one per pytest process).

    ``time_limit`` is the per-example limit in seconds (None: none): past it the example fails
    with :class:`ExampleTimeout`; an example that cannot be interrupted (stuck in native code)
    is ended at twice the limit by ``faulthandler``, which kills the process; its reproduction
    is then in ``RESULTS/inflight`` and, under xdist, attached to the crashed test's report.
    """

    subject: str = "builtin"
    subject_path: str | None = None
    known_failures: tuple[Any, ...] = ()
    results: Path | None = None
    time_limit: float | None = None
    nodeid: str = ""
    last_failure: dict[str, Reproduction] = field(default_factory=dict)
    stats: dict[str, NodeStats] = field(default_factory=dict)
    expected_failures: dict[str, dict[str, int]] = field(default_factory=dict)
    """Expected-failure examples by the entry's reach (``ReachKind`` value), then upstream link."""

    @property
    def inflight_dir(self) -> Path | None:
        return None if self.results is None else self.results / "inflight"


RUN_STATE = pytest.StashKey[RunState]()

_active: RunState | None = None


def activate(state: RunState | None) -> None:
    """Make ``state`` the one :func:`run_check` uses when no state is passed (set by the plugin)."""
    global _active
    _active = state


def active() -> RunState:
    """The state the plugin activated, or a fresh one outside pytest."""
    return _active if _active is not None else RunState()


def run_check(
    fn: Callable[..., None],
    config: Any,
    backend: enum.Enum | None,
    policy: Any,
    kernel: bool = False,
    *,
    state: RunState | None = None,
    nodeid: str | None = None,
) -> None:
    """Run one example of the check ``fn`` (a :func:`harness.properties.check`) and judge it.

    ``kernel`` marks a check that runs a GPU kernel: its reproduction is written to an in-flight
    file first, so a worker killed by a device fault leaves it behind (with a time limit every
    example writes it). ``state`` and ``nodeid`` default to the active state and its current test.
    The configuration is first bound to ``backend`` (:meth:`strategies.config.Config.for_backend`), so the
    reproduction and the known-failure ledger see the configuration the check runs.
    """
    state = state or active()
    nodeid = nodeid or state.nodeid
    if backend is not None and isinstance(config, Config):
        config = config.for_backend(backend)
    repro = Reproduction(
        f"{fn.__module__}:{fn.__name__}",
        state.subject,
        backend.value if backend else None,
        config.to_dict(),
        state.subject_path,
    )
    describe = getattr(config, "describe", None)
    summary = describe() if describe else str(config)
    if currently_in_test_context():
        note(f"config: {summary}")
        note(f"reproduce: {repro.command()}")
    stats = state.stats.setdefault(nodeid, NodeStats(started=time.perf_counter()))
    stats.examples += 1
    stats.kernel = stats.kernel or kernel
    inflight = _write_inflight(state, nodeid, repro) if kernel or state.time_limit else None
    contract = fn.__fp4_check__[0]
    known = [k for k in state.known_failures if k.matches(contract, fn.__name__, repro.backend, config)]
    try:
        with _time_limit(state.time_limit, nodeid, repro):
            if known:
                _expect_failure(fn, config, backend, policy, known, state)
            else:
                fn(config, backend, policy)
    except LibraryUnavailable as exc:
        pytest.skip(str(exc))
    except UnsatisfiedAssumption:  # the example was rejected (conformance.moe_checks.align_checked), not failed
        raise
    except BaseException as exc:
        state.last_failure[nodeid] = repro
        stats.counterexample = summary
        if stats.first_failure_example is None:
            stats.first_failure_example = stats.examples
            stats.first_failure_seconds = time.perf_counter() - stats.started
        if hasattr(exc, "add_note") and not isinstance(exc, ExampleTimeout):
            exc.add_note(f"reproduce: {repro.command()}")
        exc.__fp4_reproduction__ = repro  # type: ignore[attr-defined]
        raise
    finally:
        stats.seconds = time.perf_counter() - stats.started
        if inflight is not None:
            inflight.unlink(missing_ok=True)


def note_error(ratio: float) -> None:
    """Keep ``ratio`` (an example's error as a fraction of its bound) as the current test's ``worst_error`` when
    it is the largest so far (a no-op outside a test that :func:`run_check` runs)."""
    state = active()
    stats = state.stats.get(state.nodeid)
    if stats is not None:
        stats.worst_error = ratio if stats.worst_error is None else max(stats.worst_error, ratio)


def reported_reproduction(exc: BaseException | None) -> Reproduction | None:
    """The reproduction of the failure Hypothesis raised: ``exc``'s own, or for an exception group
    (several failing examples) that of its first member, in the order Hypothesis ran them."""
    if exc is None:
        return None
    found = getattr(exc, "__fp4_reproduction__", None)
    if found is None:  # an exception group (``exceptions``: its members)
        found = next((r for e in getattr(exc, "exceptions", ()) if (r := reported_reproduction(e)) is not None), None)
    return found


def _expect_failure(
    fn: Callable[..., None], config: Any, backend: Any, policy: Any, known: list[Any], state: RunState
) -> None:
    """Run a check where known upstream bugs apply: only a failure one of them describes is expected."""
    try:
        fn(config, backend, policy)
    except (LibraryUnavailable, UnsatisfiedAssumption, GuardViolation):  # a guard error is never an upstream bug
        raise
    except Exception as exc:
        bug = next((k for k in known if k.recognises(exc)), None)
        if bug is None:
            if hasattr(exc, "add_note"):
                for k in known:
                    exc.add_note(
                        f"not the known upstream bug {k.link} listed for this configuration: "
                        f"that one fails with {k.describe()}"
                    )
            raise
        by_link = state.expected_failures.setdefault(bug.reach.kind.value, {})
        by_link[bug.link] = by_link.get(bug.link, 0) + 1
        if currently_in_test_context():
            event(f"expected failure: {bug.link}")
        return
    raise KnownFailureFixed(
        f"known upstream bug {known[0].link} ({known[0].reason}) no longer fails here: "
        "remove it from the subject's known_failures"
    )


@contextmanager
def _time_limit(seconds: float | None, nodeid: str, repro: Reproduction) -> Iterator[None]:
    """Fail the block with :class:`ExampleTimeout` after ``seconds`` (SIGALRM, main thread only),
    and end the process with a traceback dump after twice that (``faulthandler``)."""
    if not seconds:
        yield
        return
    message = (
        f"{nodeid}: one example ran past the per-example time limit of {seconds:g} s "
        f"(a hang in the subject or kernel?); reproduce: {repro.command()}"
    )

    def on_alarm(signum: int, frame: Any) -> None:
        raise ExampleTimeout(message)

    soft = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, on_alarm) if soft else None
    if soft:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _write_inflight(state: RunState, nodeid: str, repro: Reproduction) -> Path | None:
    """Record the example about to run (``inflight/WORKER.json``, atomically: :mod:`harness.records`)."""
    if state.inflight_dir is None:
        return None
    state.inflight_dir.mkdir(parents=True, exist_ok=True)
    path = state.inflight_dir / f"{records.worker_name()}.json"
    payload = {"nodeid": nodeid, "command": repro.command(), "repro": repro.argv(), "subject": repro.subject}
    records.write_json(path, payload, indent=None)
    return path
