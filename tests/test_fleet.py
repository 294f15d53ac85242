"""Self-tests of the nightly-fleet tools: shards, the shared Redis example database, the merged report.

The Redis tests start a real ``redis-server`` (Debian's package) on the loopback address and stop
it afterwards; without the binary they skip, unless ``FP4_REQUIRE_REDIS=1`` (set by ``.ci/run``)
makes its absence a failure, so CI cannot pass them by skipping. Two simulated hosts are two
``pytest`` processes with separate working directories (so separate local databases).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import database, report, shard
from tests import batch
from tests.test_plugin import in_parallel

ROOT = Path(__file__).resolve().parent.parent
PROBE = "tests.fleet_probe:SUBJECT"
PROPERTY = ["conformance/test_nvfp4_moe.py", "-k", "padding_invariance", "--backend", "flashinfer-trtllm"]


def host_run(workdir: Path, *args: str) -> batch.Run:
    """One simulated host: ``python -m pytest`` on this checkout from its own working directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # keep the host's libraries
    full_env = {**os.environ, "PYTHONPATH": path}
    for var in ("PYTEST_XDIST_WORKER", "FP4_PROFILE", "FP4_DB", "CI"):
        full_env.pop(var, None)
    cmd = ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")]
    cmd += ["-p", "no:cacheprovider", "-q", "--results", str(workdir / "results")]
    cmd += [str(ROOT / a) if a.endswith(".py") or a in ("conformance", "tests") else a for a in args]
    return batch.Run(cmd, cwd=workdir, env=full_env)


def run_host(workdir: Path, *args: str) -> batch.Ran:
    """:func:`host_run` now (hosts that must run at once, or between the test's checks), in a process of its own
    (:func:`tests.batch.run`)."""
    return batch.run(host_run(workdir, *args), workdir / "out", timeout=900)


SHARD_HOSTS = {"all": ()} | {f"s{i}": ("--shard", f"{i}/3") for i in range(3)}
TWO = ["conformance/test_nvfp4_moe.py", "-k", "padding_invariance or gate_up_layout", "--backend"]


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """This module's hosts that run on their own (:mod:`tests.batch`: one process, each host its own folder)."""
    runs = {name: host_run(folder / name, "conformance", "--collect-only", *args) for name, args in SHARD_HOSTS.items()}
    runs["bad-shard"] = host_run(folder / "bad-shard", "conformance", "--collect-only", "--shard", "3/3")
    if importlib.util.find_spec("redis") is not None:
        runs["unreachable"] = host_run(folder / "unreachable", *PROPERTY, "--hypothesis-profile", "nightly",
                                       "--fp4-db", f"redis://127.0.0.1:{_free_port()}/0")  # fmt: skip
    for i in range(2):
        host = folder / f"shard{i}"
        runs[f"shard{i}"] = host_run(host, *TWO, "flashinfer-trtllm", "--subject", "bad-end-padding",
                                     "--hypothesis-profile", "ci", "--shard", f"{i}/2", "--junitxml",
                                     str(host / "results" / "junit.xml"))  # fmt: skip
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, batch.Ran]]:
    """:func:`make_runs`' hosts, run once per session: their folder and results."""
    return batch.shared(tmp_path_factory, "fleet", make_runs)


# --- shards ---------------------------------------------------------------------------------


@given(ids=st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=60), count=st.integers(1, 9))
def test_shards_partition_the_tests(ids: list[str], count: int) -> None:
    shards = [shard.keep(ids, i, count) for i in range(count)]
    assert set().union(*shards) == set(ids)
    assert sum(map(len, shards)) == len(ids)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("text", ["3", "1/0", "4/4", "-1/2", "a/b", "1/2/3"])
def test_bad_shard_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--shard"):
        shard.parse_shard(text)


def _collected(result: batch.Ran) -> list[str]:
    return [line for line in result.stdout.splitlines() if "::" in line]


@pytest.mark.long(90)  # the first test of this module's batch (the rest read it)
def test_shards_of_the_real_suite_cover_it_once(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    full, *parts = (_collected(runs[1][name]) for name in SHARD_HOSTS)
    assert full and sorted(p for part in parts for p in part) == sorted(full)
    sizes = [len(p) for p in parts]
    assert max(sizes) <= 1.25 * min(sizes), sizes


@pytest.mark.late
def test_bad_shard_option_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    result = runs[1]["bad-shard"]
    assert result.returncode == 4 and "--shard '3/3'" in result.stderr, result.stderr[-2000:]


# --- database --------------------------------------------------------------------------------


def test_database_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_text("")
    with pytest.raises(database.DatabaseError, match="is a file"):
        database.open_database(str(path))


def test_database_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(database.DatabaseError, match="not writable"):
        database.open_database(str(tmp_path / "f" / "db"))


@pytest.mark.parametrize("url", ["redis://", "redis://host:port/0", "redis://localhost:6379/x"])
def test_bad_redis_url_is_refused(url: str) -> None:
    with pytest.raises(database.DatabaseError, match=r"Redis URL|must be integers"):
        database.open_database(url)


PASSWORD = "s3cret-Pw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{PASSWORD}@h:6379/0", "redis://:***@h:6379/0"),
        (f"rediss://fleet:{PASSWORD}@h/2", "rediss://fleet:***@h/2"),
        (f"redis://h:6379/0?password={PASSWORD}&socket_timeout=3", "redis://h:6379/0?password=***&socket_timeout=3"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("/var/cache/fp4-db", "/var/cache/fp4-db"),
    ],
)
def test_redacted_url_hides_the_password(url: str, shown: str) -> None:
    assert database.redacted(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@/0",  # no host
        f"redis://:{PASSWORD}@localhost:port/0",  # bad port
        f"redis://:{PASSWORD}@localhost:6379/x",  # bad database number
        f"redis://user:{PASSWORD}@127.0.0.1:1/0?password={PASSWORD}",  # unreachable
    ],
)
def test_database_errors_never_show_the_password(url: str) -> None:
    pytest.importorskip("redis", reason="needs the redis client (pip install 'hypothesis[redis]')")
    with pytest.raises(database.DatabaseError) as info:
        database.open_database(url)
    assert PASSWORD not in str(info.value) and "***" in str(info.value), str(info.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.late
def test_unreachable_redis_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    pytest.importorskip("redis", reason="needs the redis client (pip install 'hypothesis[redis]')")
    url = f"redis://127.0.0.1:{_free_port()}/0"
    with pytest.raises(database.DatabaseError, match="does not answer"):
        database.open_database(url)
    result = runs[1]["unreachable"]  # a host given another free port's URL (:func:`make_runs`)
    assert result.returncode == 4 and "does not answer" in result.stderr, result.stderr[-2000:]


def test_readonly_needs_a_shared_database() -> None:
    with pytest.raises(database.DatabaseError, match="redis://"):
        database.open_database(None, readonly=True)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``redis-server`` on 127.0.0.1, stopped after the module's tests."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("FP4_REQUIRE_REDIS"):
            pytest.fail("FP4_REQUIRE_REDIS is set but redis-server is not installed (apt-get install redis-server)")
        pytest.skip("needs redis-server (Debian package redis-server)")
    port = _free_port()
    folder = tmp_path_factory.mktemp("redis")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_wrong_redis_password_is_refused_without_showing_it(redis_url: str) -> None:
    """The server has no password: AUTH with one fails, and neither message shows it."""
    with pytest.raises(database.DatabaseError, match="does not answer") as info:
        database.open_database(redis_url.replace("redis://", f"redis://fleet:{PASSWORD}@"))
    assert PASSWORD not in str(info.value) and "***" in str(info.value), str(info.value)


def _redis_members(url: str) -> set[tuple[bytes, bytes]]:
    import redis

    client = redis.Redis.from_url(url)
    return {(key, m) for key in client.keys("hypothesis-example:*") for m in client.smembers(key)}


def _first_failure(results: Path) -> tuple[int | None, str | None]:
    """Examples to the first failure and the counterexample, from the plugin's per-test statistics."""
    for path in results.glob("stats-*.json"):
        for stats in json.loads(path.read_text()).values():
            if stats.get("first_failure_example"):
                return stats["first_failure_example"], stats.get("counterexample")
    return None, None


@pytest.mark.long(135)
def test_two_hosts_share_failures_through_redis(tmp_path: Path, redis_url: str) -> None:
    """Host A searches (no pins) and stores the failure; host B, read-only, replays it first."""
    host_a = run_host(tmp_path / "host-a", *PROPERTY, "--subject", PROBE, "--hypothesis-profile", "bench",
                      "--fp4-db", redis_url)  # fmt: skip
    assert host_a.returncode == 1, host_a.stdout[-3000:] + host_a.stderr[-2000:]
    found_at, shrunk = _first_failure(tmp_path / "host-a" / "results")
    stored = _redis_members(redis_url)
    assert found_at is not None and stored, "host A's failure was not stored in Redis"

    host_b, builtin = in_parallel(  # two read-only hosts replay at once
        lambda: run_host(tmp_path / "host-b", *PROPERTY, "--subject", PROBE, "--hypothesis-profile", "replay",
                         "--fp4-db", redis_url, "--fp4-db-readonly"),
        lambda: run_host(tmp_path / "host-c", *PROPERTY, "--hypothesis-profile", "replay", "--fp4-db", redis_url,
                         "--fp4-db-readonly"),
    )  # fmt: skip
    assert host_b.returncode == 1, host_b.stdout[-3000:] + host_b.stderr[-2000:]
    replayed_at, replayed = _first_failure(tmp_path / "host-b" / "results")
    assert replayed_at == 1 and replayed == shrunk
    assert _redis_members(redis_url) == stored, "a read-only host wrote to the shared database"
    print(f"host A found the failure by search at example {found_at}; host B replayed it at example {replayed_at}")
    assert builtin.returncode == 0, builtin.stdout[-3000:]


# --- merged report ---------------------------------------------------------------------------


@pytest.mark.late
def test_merged_report_of_two_failing_shards(tmp_path: Path, runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """Two shards of a known-bad subject (one failing property each, :func:`make_runs`) merge into one report."""
    hosts = [runs[0] / f"shard{i}" for i in range(2)]
    for result in (runs[1]["shard0"], runs[1]["shard1"]):
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    dirs = [host / "results" for host in hosts]
    merged = report.merge(dirs)
    md, page = report.write(merged, tmp_path / "report")
    assert [run["shard"] for run in merged.runs] == ["0/2", "1/2"]
    assert len({f.nodeid for f in merged.failures}) == 2, merged.failures
    for failure in merged.failures:
        assert failure.reproduce and "harness.repro" in failure.reproduce and failure.config
    text, markup = md.read_text(), page.read_text()
    assert "nvfp4_moe" in text and all(f.nodeid in text for f in merged.failures)
    assert "<table>" in markup and not any(tag in markup for tag in ("<script", " src=", "<link"))  # self-contained
