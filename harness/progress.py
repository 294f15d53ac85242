"""Progress lines for long runs: one line naming each test still running after ``--fp4-progress`` seconds.

Under xdist the controller prints only a character per finished test, so a run whose last tests
take minutes (kernel properties, engine subjects) looks hung. The controller learns each test's
start from its worker (``pytest_runtest_logstart``) and its end from the teardown report; a daemon
thread checks every second and writes ``fp4 running: NODEID for 60 s`` once per interval a test is
still running. :class:`Progress` holds the timing (a pure function of its clock, tested without
threads); :func:`writer` prints through pytest's terminal reporter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

DEFAULT_AFTER_S = 60.0
POLL_S = 1.0


class Progress:
    """Tests started and not finished, and when each was last named.

    ``due(now)`` returns the lines to print at ``now``: each test running for at least ``every``
    seconds more than when it was last named (or started). ``start_thread=False`` leaves polling to
    the caller (tests drive ``due`` with their own clock).
    """

    def __init__(
        self,
        every: float,
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        *,
        start_thread: bool = True,
    ) -> None:
        self.every, self.write, self.clock = every, write, clock
        self.running: dict[str, tuple[float, float]] = {}  # nodeid -> (started, last named or started)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        if start_thread:
            threading.Thread(target=self._poll, name="fp4-progress", daemon=True).start()

    def started(self, nodeid: str) -> None:
        with self.lock:
            now = self.clock()
            self.running[nodeid] = (now, now)

    def finished(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)

    def due(self, now: float) -> list[str]:
        """The lines due at ``now`` (and mark those tests named)."""
        lines = []
        with self.lock:
            for nodeid, (start, named) in sorted(self.running.items()):
                if now - named >= self.every:
                    lines.append(f"fp4 running: {nodeid} for {now - start:.0f} s")
                    self.running[nodeid] = (start, now)
        return lines

    def stop(self) -> None:
        self.stopped.set()

    def _poll(self) -> None:
        while not self.stopped.wait(min(POLL_S, self.every)):
            for line in self.due(self.clock()):
                self.write(line)


def writer(config: pytest.Config) -> Callable[[str], None]:
    """Write a line through pytest's terminal reporter (on a line of its own), or nowhere without one."""

    def write(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if getattr(reporter._tw, "width_of_current_line", 0):  # after xdist's progress characters
            reporter._tw.line()
        reporter.write_line(line)

    return write
