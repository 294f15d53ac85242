"""Self-tests of ``harness.workers``: ``-n auto`` worker count, torch threads per worker, records.

The end-to-end tests run a small self-test module under ``pytest -n N`` in a subprocess and read
the workers' records: two workers split the usable cores (one thread each on a 2-core machine,
where torch's default would be two), a thread count in ``OMP_NUM_THREADS`` wins, and the summary
prints the sizing line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import workers
from tests.test_plugin import run_pytest


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
        {"worker": "gw0", "threads": 2, "cores": 16, "startup_s": 4.0},
        {"worker": "gw1", "threads": 2, "cores": 16, "startup_s": 6.0},
    ]
    line = workers.describe(records)
    assert (
        line
        == "2 process(es) x 2 torch thread(s) on 16 usable core(s); start-up to first test: median 5.0 s, max 6.0 s"
    )
    assert workers.describe([]) is None


@pytest.mark.parametrize(
    ("n", "user_threads"), [(2, None), (1, "1")], ids=["two-workers-split-the-cores", "omp-num-threads-wins"]
)
def test_workers_get_their_share_of_the_cores(
    tmp_path: Path, n: int, user_threads: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in workers.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = {"OMP_NUM_THREADS": user_threads} if user_threads else None
    result = run_pytest("-n", str(n), "tests/test_sizes.py", tmp_path=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    want = int(user_threads) if user_threads else workers.threads_per_worker(workers.usable_cores(), n)
    records = workers.read_records(tmp_path / "results")
    assert [r["worker"] for r in records] == [f"gw{i}" for i in range(n)]
    assert all(r["threads"] == want and r["startup_s"] > 0 for r in records), records
    assert f"xdist workers: {n} process(es) x {want} torch thread(s)" in result.stdout
