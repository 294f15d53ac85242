"""Self-tests of ``harness.workers``: ``-n auto`` worker count, torch threads per worker, records.

The end-to-end tests run a small module of trivial tests under ``pytest -n N`` in a subprocess and
read the workers' records: two workers split the usable cores (one thread each on a 2-core machine,
where torch's default would be two), a thread count in ``OMP_NUM_THREADS`` wins, and the summary
prints the sizing line. The same run checks :mod:`harness.scheduling`: each worker's first test is
a ``long`` one, although the module defines them last. A worker ends its own process only once it has
reported its session's end (:func:`harness.workers.end_worker`).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import scheduling, workers
from tests import batch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("cores", "n", "want"),
    [(2, 2, 1), (16, 1, 16), (16, 8, 2), (16, 16, 1), (16, 32, 1), (128, 16, 8), (3, 2, 1), (4, 0, 4)],
)
def test_threads_split_the_cores(cores: int, n: int, want: int) -> None:
    assert workers.threads_per_worker(cores, n) == want


def test_usable_cores_honours_affinity_and_cgroup_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert workers.usable_cores(cpu_max) == affinity
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs of quota: two workers can use it
    assert workers.usable_cores(cpu_max) == min(affinity, 2)
    assert workers.usable_cores(tmp_path / "absent") == affinity


def test_auto_worker_count_is_the_core_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert workers.pytest_xdist_auto_num_workers(None) == workers.usable_cores()
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert workers.pytest_xdist_auto_num_workers(None) == 3
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "many")
    with pytest.raises(pytest.UsageError, match="not a number"):
        workers.pytest_xdist_auto_num_workers(None)


def test_describe_summarises_the_records() -> None:
    records = [
        {"worker": "gw0", "threads": 2, "cores": 16, "startup_s": 4.0, "forked": True},
        {"worker": "gw1", "threads": 2, "cores": 16, "startup_s": 6.0, "forked": False},
    ]
    assert workers.describe(records) == (
        "2 process(es) x 2 torch thread(s) on 16 usable core(s), 1 forked from a pre-imported process; "
        "start-up to first test: median 5.0 s, max 6.0 s"
    )
    unforked = [{**r, "forked": False} for r in records]
    assert workers.describe(unforked) == (
        "2 process(es) x 2 torch thread(s) on 16 usable core(s), started as new interpreters; "
        "start-up to first test: median 5.0 s, max 6.0 s"
    )
    main = {"worker": "main", "threads": 2, "cores": 2, "startup_s": None, "forked": False}
    assert workers.describe([main]) == "1 process(es) x 2 torch thread(s) on 2 usable core(s)"
    assert workers.describe([]) is None


ORDER_MODULE = """
import os

import pytest


def _log(name):
    with open(os.environ["FP4_ORDER_LOG"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + " " + name + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_short(i):
    _log(f"short{i}")


@pytest.mark.long
@pytest.mark.parametrize("i", range(2))
def test_long(i):
    _log(f"long{i}")
"""


SPLITS = {"two-workers-split-the-cores": (2, None), "omp-num-threads-wins": (1, "1")}


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """:data:`ORDER_MODULE` under ``pytest -n N`` from its own folder, for each of :data:`SPLITS`
    (:mod:`tests.batch`: the controllers share one process; each run's workers are its own processes)."""
    runs = {}
    for name, (n, user_threads) in SPLITS.items():
        here = folder / name
        here.mkdir(parents=True)
        (here / "test_order.py").write_text(ORDER_MODULE)
        env = {k: v for k, v in os.environ.items() if k not in (*workers.THREAD_VARIABLES, "PYTEST_XDIST_WORKER")}
        env.update(
            FP4_PROFILE="ci",
            FP4_ORDER_LOG=str(here / "order.log"),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        )
        if user_threads:
            env["OMP_NUM_THREADS"] = user_threads
        runs[name] = batch.workers_run(here / "test_order.py", n, env)
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, batch.Ran]]:
    """:func:`make_runs`' results, run once per session in one process."""
    return batch.shared(tmp_path_factory, "workers", make_runs)


@pytest.mark.parametrize(
    "split",
    # the first runs the module's batch (the other reads it): only it is marked long
    [pytest.param("two-workers-split-the-cores", marks=pytest.mark.long(66)),
     pytest.param("omp-num-threads-wins", marks=pytest.mark.late)],
)  # fmt: skip
def test_workers_get_their_share_of_the_cores(runs: tuple[Path, dict[str, batch.Ran]], split: str) -> None:
    n, user_threads = SPLITS[split]
    result, here = runs[1][split], runs[0] / split
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    want = int(user_threads) if user_threads else workers.threads_per_worker(workers.usable_cores(), n)
    records = workers.read_records(here / "results")
    assert [r["worker"] for r in records] == [f"gw{i}" for i in range(n)]
    assert all(r["threads"] == want and r["startup_s"] > 0 for r in records), records
    assert f"xdist workers: {n} process(es) x {want} torch thread(s)" in result.stdout
    order = [line.split() for line in (here / "order.log").read_text().splitlines()]
    assert len(order) == 8
    firsts = [next(name for w, name in order if w == f"gw{i}") for i in range(n)]
    assert all(name.startswith("long") for name in firsts), order  # each worker starts with a long test


def test_only_a_worker_that_reported_ends_its_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(workers.atexit, "_run_exitfuncs", lambda: calls.append("exit handlers"))
    monkeypatch.setattr(workers.os, "_exit", lambda status: calls.append(("os._exit", status)))
    workers.end_worker(SimpleNamespace())  # the controller, or a run without xdist
    worker = SimpleNamespace(workeroutput={})
    workers.end_worker(worker)  # configuration or session failed before it reported: xdist shows the error
    assert calls == []
    worker.workeroutput["exitstatus"] = 1
    workers.end_worker(worker)
    assert calls == ["exit handlers", ("os._exit", 1)]


def test_deal_spreads_the_head_over_the_workers() -> None:
    assert scheduling.deal([[i] for i in range(8)], 3) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert scheduling.deal([[0]], 2) == [[0], []]


def test_a_property_s_backends_are_dealt_to_one_worker() -> None:
    ids = ["t.py::long[1]", "t.py::long[2]", "t.py::p[x]", "t.py::p[y]", "t.py::p[z]", "t.py::q[x]", "u.py::p[x]"]
    dealt = scheduling.hands(ids, {"x", "y", "z"})
    assert dealt == [[0], [1], [2, 3, 4], [5], [6]]  # a long test's cases stay apart
    assert scheduling.deal(dealt, 2) == [[0, 2, 3, 4], [1, 5, 6]]


def test_a_together_module_is_one_hand() -> None:
    """A module's tests marked ``together`` go in one hand, wherever they lie; its other tests keep their hands."""
    ids = ["t.py::a", "t.py::long[1]", "t.py::b", "u.py::p[x]", "u.py::p[y]", "t.py::c"]
    assert scheduling.hands(ids, {"x", "y"}, {0, 2, 5}) == [[0, 2, 5], [1], [3, 4]]
    assert scheduling.deal(scheduling.hands(ids, {"x", "y"}, {0, 2, 5}), 2, {i: 1.0 for i in range(6)}) == [
        [0, 2, 5],
        [1, 3, 4],
    ]


def test_stored_durations_deal_by_time() -> None:
    """Longest hand first, each to the queue with the fewest seconds; an unknown test counts the median."""
    dealt = [[0], [1], [2, 3], [4], [5]]
    seconds = {0: 1.0, 1: 9.0, 2: 3.0, 3: 3.0, 5: 0.5}  # 4 unknown: the median, 3.0
    assert scheduling.deal(dealt, 2, seconds) == [[0, 1], [2, 3, 4, 5]]  # 10 s and 9.5 s
    assert scheduling.deal(dealt, 3, seconds) == [[1], [2, 3], [0, 4, 5]]
    assert scheduling.deal(dealt, 2, {}) == [[0, 1, 2, 3, 4, 5], []]  # nothing known: all weigh 0


def test_a_queue_dealt_by_time_runs_long_first_heavy_modules_next_and_late_last() -> None:
    """Module by module, the heaviest first (each module's tests together, in order), between the ``long`` and
    the ``late`` tests; a heavy hand at a queue's tail moves to its front."""
    modules = ["a.py", "a.py", "b.py", "c.py", "c.py", "b.py", "a.py"]
    seconds = {0: 9.0, 1: 0.1, 2: 0.2, 3: 3.0, 4: 4.0, 5: 0.1, 6: 5.0}
    placement = {0: "long", 6: "late"}
    assert scheduling.by_time([0, 1, 2, 3, 4, 5, 6], seconds, modules, placement) == [0, 3, 4, 2, 5, 1, 6]
    assert scheduling.by_time([1, 2, 5], seconds, modules, {}) == [2, 5, 1]  # b.py 0.3 s, a.py 0.1 s
    assert scheduling.by_time([1, 2], {}, modules, {}) == [1, 2]  # nothing known: collection order
    assert scheduling.by_time([1, 3], {3: 1.0}, modules, {}) == [1, 3]  # 1 unknown: the median, a tie
    together = {**placement, 1: "together", 5: "together"}  # placed in their hand, run with their module
    assert scheduling.by_time([0, 1, 2, 3, 4, 5, 6], seconds, modules, together) == [0, 3, 4, 2, 5, 1, 6]


def test_a_run_stores_each_test_s_seconds_and_placement_over_the_earlier_runs() -> None:
    cache: dict[str, object] = {
        scheduling.DURATIONS_KEY: {"m::a": 2.0, "m::gone": 1.0},
        scheduling.PLACEMENT_KEY: {"m::a": "late", "m::gone": "long"},
    }
    config = SimpleNamespace(
        cache=SimpleNamespace(get=lambda key, default: cache.get(key, default), set=cache.__setitem__)
    )
    recorder = scheduling.DurationRecorder(config)
    reports = [
        ("m::a", 0.1, {}),
        ("m::a", 0.5, {}),
        ("m::b", 0.25, {"long": 1, "together": 1}),
        ("m::c", 0.0, {"together": 1}),
        ("m::a", 0.0004, {}),
    ]
    for nodeid, duration, keywords in reports:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration, keywords=keywords))
    recorder.pytest_sessionfinish()
    assert cache[scheduling.DURATIONS_KEY] == {"m::a": 0.6, "m::gone": 1.0, "m::b": 0.25, "m::c": 0.0}
    # m::a ran without its marker: its entry goes; m::gone did not run: its entry stays; together wins over long
    assert cache[scheduling.PLACEMENT_KEY] == {"m::gone": "long", "m::b": "together", "m::c": "together"}
    assert scheduling.stored_durations(SimpleNamespace(cache=None)) == {}


class _Item:
    """A stand-in for a pytest item: a name and its ``long`` or ``late`` marker, if any."""

    def __init__(self, name: str, marker: pytest.MarkDecorator | None = None) -> None:
        self.name, self.marker = name, marker.mark if marker else None

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marker if self.marker is not None and self.marker.name == name else None


def test_long_tests_lead_longest_first_and_the_rest_keep_their_order() -> None:
    long = pytest.mark.long
    items = [
        _Item("a"),
        _Item("b", long(5)),
        _Item("c"),
        _Item("d", long),
        _Item("e", long(seconds=20)),
        _Item("f", long(5)),
    ]
    assert [i.name for i in scheduling.long_first(items)] == ["e", "b", "f", "d", "a", "c"]
    assert [scheduling.expected_seconds(i) for i in items] == [None, 5.0, None, 0.0, 20.0, 5.0]


def test_late_tests_follow_the_rest() -> None:
    """A test reading a long test's runs (``late``) comes after every other test, in its own order."""
    late, long = pytest.mark.late, pytest.mark.long
    items = [_Item("a", late), _Item("b"), _Item("c", long(9)), _Item("d", late), _Item("e")]
    assert [i.name for i in scheduling.long_first(items)] == ["c", "b", "e", "a", "d"]
