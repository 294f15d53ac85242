"""pytest-xdist scheduling: the long tests start first, each on its own worker.

With many workers a run is never shorter than its longest test plus the workers' start-up, so the
long tests must not wait behind short ones, nor queue behind each other on one worker.

* A test marked ``long(seconds)`` (a self-test that runs pytest in subprocesses, searches with
  Hypothesis, or loads a kernel library: seconds, where a property example takes milliseconds) is
  moved to the front of each xdist worker's collection, the longest first by its ``seconds`` (its
  wall time as ``pytest --durations`` reported it under ``-n 2`` on the shared 2-core CPU machine,
  or on a GPU host where that is longer; only the order matters), then in collection order.
  A test marked ``late`` (it reads what a long test of its module ran, :mod:`tests.batch`) moves to
  the end, so that another worker does not wait for the long test to finish.
  Every worker sorts the same way, so the collections stay identical, as xdist requires; a run
  without xdist keeps pytest's order.
* Under ``-n`` with the default ``--dist load`` the plugin's scheduler, :class:`DealtWorkStealing`,
  deals the whole collection like cards, one *hand* at a time (:func:`hands`): a hand is one test
  function's consecutive parametrizations over the backends (a property on every backend; any
  other test is a hand of its own), and each hand goes to the worker with the fewest tests queued
  so far, the first worker on ties. So the long tests at the front land on different workers and
  each starts at once, and a property's backends run in one process, where they share what that
  process cached for the layers they all draw (the sharding property's reference outputs and
  placement verdicts, the padded reference outputs: ``conformance/test_moe_sharding.py``,
  ``conformance/moe_properties.py``). Dealt one test at a time, the backends of a property went to
  different workers, each of which computed the same reference outputs again. Once a run has stored its
  seconds (below), the tests of a module marked ``together`` (its tests reuse what the first of them builds in a
  process: a layer, FlashInfer's import and the preflight's plan, a search's draws) are one hand as well, its
  ``long`` tests included: spread over 16 workers, each worker paid that first cost again, and the stored seconds
  of a test that happened to pay it elsewhere misled the dealing.
  After that it is xdist's ``WorkStealingScheduling``: a worker whose queue runs low takes half of
  the longest queue's tail, so no worker sits idle at the end while another still has tests queued
  (xdist's ``LoadScheduling`` tops each worker up from a shared pool but never moves what it has
  queued). xdist's own first round sends each worker a contiguous chunk, which would give every
  long test to the first worker.

* A run with pytest's cache (the default; not under ``-p no:cacheprovider``) stores every test's
  seconds (setup, call and teardown, as its reports give them) in the cache under
  :data:`DURATIONS_KEY` when it ends, merged over what earlier runs stored (:func:`record`). The next
  run on that checkout deals by them (:func:`deal`): the hands, longest first, each to the queue with
  the fewest seconds so far (a test the store does not know counts the median of those it knows), so
  that every worker's queue ends at about the same time; a count does not tell a 5 s kernel test on a
  GPU host from a 50 ms unit test. Each queue then runs in the order :func:`by_time` gives it: the ``long``
  tests first, then the queue's tests module by module, the module with the most expected seconds first, and
  the ``late`` tests last (the store also keeps which tests carry those markers and ``together``, from their
  reports' keywords). A long hand thus starts early in its queue instead of waiting at its tail, where a worker that
  ran dry would steal it last (xdist steals half of a queue's tail by count). A run without stored durations
  deals by count, and each queue runs in collection order.

Other ``--dist`` modes (``worksteal``, ``loadscope``, ...) are xdist's, unchanged. The order changes
only when tests run, never what runs nor how it is checked: every property draws its examples from
its own derandomized seed under the ``ci`` profile, so outcomes and example counts do not depend
on it (``python -m bench.scaling`` compares them across worker counts).
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pytest

MARKER = (
    "long(seconds): a long self-test (runs pytest in subprocesses, searches, or loads a kernel library); "
    "under xdist the longest start first"
)
LATE = "late: reads what a long self-test of its module ran; under xdist it runs after the others"
TOGETHER = (
    "together: the test reuses what an earlier test of its module built in its process (a layer, an imported "
    "library); under xdist, once a run has stored its seconds, the module's tests go to one worker"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    config.addinivalue_line("markers", LATE)
    config.addinivalue_line("markers", TOGETHER)
    if not hasattr(config, "workerinput") and getattr(config, "cache", None) is not None:
        config.pluginmanager.register(DurationRecorder(config), "fp4-durations")


def expected_seconds(item: pytest.Item) -> float | None:
    """The ``long`` marker's ``seconds`` (0 when it gives none), or None for an unmarked test."""
    marker = item.get_closest_marker("long")
    if marker is None:
        return None
    return float(marker.kwargs.get("seconds", marker.args[0] if marker.args else 0))


def long_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the ``long``-marked tests first, longest first, and the ``late``-marked ones (not long) last;
    a stable sort (ties keep their order)."""

    def key(item: pytest.Item) -> tuple[int, float]:
        seconds = expected_seconds(item)
        if seconds is not None:
            return (0, -seconds)
        return (2 if item.get_closest_marker("late") else 1, 0.0)

    return sorted(items, key=key)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker
        items[:] = long_first(items)


def hands(nodeids: list[str], backends: Collection[str], together: Collection[int] = ()) -> list[list[int]]:
    """The indices of ``nodeids`` cut into hands, in order of their first index. A hand is a maximal run of
    consecutive ids of one test function whose parameters are a backend's name (``m::p[aiter-ck]``: a property
    on each backend), or all of one module's ids in ``together`` (tests that reuse what the first of them built in
    its process); every other id is a hand of its own (a long self-test's cases go to different workers). With
    ``backends`` ``{"x", "y"}``, ``["m::p[x]", "m::p[y]", "m::q[x]", "m::s[1]", "m::s[2]"]`` gives
    ``[[0, 1], [2], [3], [4]]``, and with ``together`` ``{2, 4}`` as well, ``[[0, 1], [2, 4], [3]]``."""
    out: list[list[int]] = []
    modules: dict[str, list[int]] = {}
    last = None
    for index, nodeid in enumerate(nodeids):
        function, _, parameters = nodeid.partition("[")
        if index in together:
            module = nodeid.partition("::")[0]
            if module not in modules:
                out.append(modules.setdefault(module, []))
            modules[module].append(index)
            last = None
            continue
        key = function if parameters[:-1] in backends else None
        if key is not None and key == last:
            out[-1].append(index)
        else:
            out.append([index])
        last = key
    return out


def total_seconds(indices: Iterable[int], seconds: Mapping[int, float]) -> float:
    """The expected seconds of the tests ``indices``: each its ``seconds``, or the median of ``seconds`` where it
    has none (0 when it is empty)."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    return sum(seconds.get(index, default) for index in indices)


def deal(dealt: list[list[int]], workers: int, seconds: Mapping[int, float] | None = None) -> list[list[int]]:
    """Deal the hands ``dealt`` over ``workers`` queues; each queue in index order.

    Without ``seconds`` (no stored durations): in order, each hand whole to the queue with the fewest tests so
    far, the first such queue on ties (so the singleton hands of the long tests at the front go round-robin).
    With ``seconds`` (``{index: expected seconds}``; an index it lacks counts the median of its values): longest
    hand first (ties in order), each to the queue with the fewest expected seconds so far, the first on ties
    (greedy longest-processing-time scheduling: no queue ends more than one hand after the others)."""
    queues: list[list[int]] = [[] for _ in range(workers)]
    if seconds is None:
        for hand in dealt:
            min(queues, key=len).extend(hand)
        return queues
    weight = [total_seconds(hand, seconds) for hand in dealt]
    load = [0.0] * workers
    for h in sorted(range(len(dealt)), key=lambda h: -weight[h]):
        queue = min(range(workers), key=load.__getitem__)
        queues[queue].extend(dealt[h])
        load[queue] += weight[h]
    return [sorted(queue) for queue in queues]


DURATIONS_KEY = "fp4-conformance/durations"
"""pytest cache key of the stored test durations: ``{node id: seconds}``."""

PLACEMENT_KEY = "fp4-conformance/placement"
"""pytest cache key of the stored tests marked ``long``, ``late`` or ``together``: ``{node id: marker}``."""

PLACEMENTS = ("together", "long", "late")
"""The markers that place a test, the first a test carries counting: ``together`` in one hand with its module's other
such tests (:func:`hands`; its ``long`` ones included, which the collection already lists first and its ``late`` ones
last), ``long`` first in its queue, ``late`` last."""


def by_time(
    queue: list[int], seconds: Mapping[int, float], modules: Sequence[str], placement: Mapping[int, str]
) -> list[int]:
    """``queue`` (indices into the collection, in order) in the order its worker runs it when durations are known.

    First the indices ``placement`` calls ``long``, in order; then the others module by module (``modules[i]`` is
    index ``i``'s test file), the module with the most expected seconds in this queue first (ties in order), each
    module's tests in order, so that its module-scoped fixtures are set up once; last those it calls ``late``, in
    order. ``seconds`` as in :func:`deal` (an index it lacks counts the median). With ``modules`` ``["a", "b",
    "b"]``, nothing placed and ``{0: 1.0, 1: 2.0, 2: 0.5}``, ``[0, 1, 2]`` becomes ``[1, 2, 0]``."""
    blocks: dict[str, list[int]] = {}
    for index in queue:
        if placement.get(index) not in ("long", "late"):
            blocks.setdefault(modules[index], []).append(index)
    weight = {module: total_seconds(block, seconds) for module, block in blocks.items()}
    middle = [i for module in sorted(blocks, key=lambda m: -weight[m]) for i in blocks[module]]
    return [
        *(i for i in queue if placement.get(i) == "long"),
        *middle,
        *(i for i in queue if placement.get(i) == "late"),
    ]


def from_cache(config: pytest.Config, key: str) -> dict[str, Any]:
    """What earlier runs stored under ``key`` in this checkout's pytest cache; empty without the cache."""
    cache = getattr(config, "cache", None)
    value = cache.get(key, {}) if cache is not None else {}
    return value if isinstance(value, dict) else {}


def stored_durations(config: pytest.Config) -> dict[str, float]:
    """The test durations earlier runs stored (:data:`DURATIONS_KEY`)."""
    return from_cache(config, DURATIONS_KEY)


def record(stored: Mapping[str, float], ran: Mapping[str, float]) -> dict[str, float]:
    """The store after a run: ``stored`` with each test that ``ran`` at its new seconds (rounded to 1 ms)."""
    return {**stored, **{node: round(seconds, 3) for node, seconds in ran.items()}}


def record_placement(stored: Mapping[str, str], ran: Collection[str], placed: Mapping[str, str]) -> dict[str, str]:
    """The placement store after a run: ``stored`` without the tests that ``ran``, plus those of them ``placed``
    (a test that lost its marker loses its entry)."""
    return {**{node: p for node, p in stored.items() if node not in ran}, **placed}


class DurationRecorder:
    """Sums each test's reported seconds (setup, call, teardown) in the process that receives every report (the
    xdist controller, or the one process of a run without xdist), notes the tests marked ``long`` or ``late``
    (their reports' keywords hold their markers' names), and stores both when the run ends."""

    def __init__(self, config: pytest.Config) -> None:
        self.config, self.ran = config, collections.defaultdict(float)
        self.placed: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ran[report.nodeid] += report.duration
        marker = next((m for m in PLACEMENTS if m in report.keywords), None)  # in PLACEMENTS' order
        if marker is not None:
            self.placed[report.nodeid] = marker

    def pytest_sessionfinish(self) -> None:
        if self.ran:
            self.config.cache.set(DURATIONS_KEY, record(stored_durations(self.config), self.ran))
            placement = record_placement(from_cache(self.config, PLACEMENT_KEY), self.ran, self.placed)
            self.config.cache.set(PLACEMENT_KEY, placement)


DEALT = pytest.StashKey[tuple[int, int]]()
"""How :class:`DealtWorkStealing` dealt the run: (tests with stored seconds, tests)."""


DEALING = "xdist dealing: "
"""The start of the summary's line on how the run was dealt (:func:`dealing`; ``bench.scaling`` reads it)."""


def dealing(known: int, total: int) -> str:
    """The summary's line on how the run was dealt, ``known`` of its ``total`` tests having stored seconds."""
    if not known:
        return f"{DEALING}by count (no stored durations)"
    return f"{DEALING}by the stored seconds of {known} of {total} tests (pytest cache {DURATIONS_KEY})"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if DEALT in config.stash:
        terminalreporter.write_line(dealing(*config.stash[DEALT]))


def _scheduler_class() -> type:
    from xdist.scheduler import WorkStealingScheduling

    class DealtWorkStealing(WorkStealingScheduling):
        """xdist's ``WorkStealingScheduling`` with the collection dealt in hands at the start (:func:`hands`, :func:`deal`)."""

        def schedule(self) -> None:
            collected = list(self.node2collection.values())
            if self.collection is None and collected[0] and all(c == collected[0] for c in collected):
                self.collection = collected[0]
                from subjects.registry import all_backends

                backends = {member.value for member in all_backends()}
                durations, placed = stored_durations(self.config), from_cache(self.config, PLACEMENT_KEY)
                known = {i: durations[node] for i, node in enumerate(self.collection) if node in durations}
                placement = {i: placed[node] for i, node in enumerate(self.collection) if node in placed}
                together = {i for i, p in placement.items() if p == "together"} if known else set()
                queues = deal(hands(self.collection, backends, together), len(self.nodes), known or None)
                if known:
                    modules = [node.partition("::")[0] for node in self.collection]
                    queues = [by_time(queue, known, modules, placement) for queue in queues]
                self.config.stash[DEALT] = len(known), len(self.collection)
                for node, queue in zip(self.nodes, queues, strict=True):
                    if queue:
                        self.node2pending[node].extend(queue)
                        node.send_runtest_some(queue)
                self.check_schedule()  # a worker dealt fewer than two tests steals or is told to finish
                return
            # later calls, an empty or mismatched collection (xdist reports it): WorkStealingScheduling's own
            super().schedule()

    return DealtWorkStealing


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist load`` (the default of ``-n``): :class:`DealtWorkStealing`; other modes stay xdist's."""
    if config.getvalue("dist") != "load":
        return None
    return _scheduler_class()(config, log)
