"""``python -m bench.scaling``: wall time of the suite at 1, 2, 4, ... pytest-xdist workers on this host.

Each worker count runs the targets (default ``conformance tests``) once, in a fresh
``python -m pytest -n N`` process under one Hypothesis profile (default ``ci``: derandomized, so
every run draws the same examples), and the report gives per run: workers, torch threads per
worker (from the workers' own records, :mod:`harness.workers`), wall seconds, speed-up over the
first run, worker start-up (spawn to first test, median and maximum), outcome counts, and whether
every test's outcome and example count equal the first run's, the CPU seconds it used (pytest and its
workers, user + system) and the host's one-minute load average at its start. The last row is ``-n auto``.
Also listed: for the last run, when each process's last test ended (min, median, maximum) and the tests
that ended last, which show what a many-worker run waits for at its end, and the tests that took the most beyond the
seconds they were dealt by (the run before stored them); the slowest properties' examples
per second in the first run. Written as ``scaling.md`` and ``scaling.json`` under ``--out``, with each
run's JUnit XML (``junit-WORKERS.xml``; a count given twice, as in ``--workers auto,auto``, names its second
run ``WORKERS-2``). On a GPU host the kernel properties (every hardware marker,
:data:`harness.preflight.HARDWARE`) run once first, untimed, so that JIT builds and caches are not charged to the
first row; the report gives the warm-up's seconds and pytest's closing counts for it.

The runs share a pytest cache of their own (``pytest-cache`` under ``--out``, emptied at the start), so the
first run deals its tests to the workers by count and every later run by the test durations the runs
before it stored (:mod:`harness.scheduling`), as a host's second run of a checkout does; the table's
last column says which.

``--baseline-root PATH`` (another checkout, for example the commit before a speed-up) adds an A/B
of the slowest properties: each checkout runs them in one process with one torch thread, back to
back on this host, and the report gives both examples/s.

The variables ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are removed from the runs' environment
so that the plugin sizes the thread pools; ``--threads T`` sets them to ``T`` instead (for example
to measure the unsplit default, one thread per core in every worker). ``PYTHONDONTWRITEBYTECODE`` is removed
too, as ``.ci/run`` removes it.

The CI speed figure: ``python -m bench.scaling --workers auto --max-wall 60`` runs ``conformance tests`` once at
``-n auto`` and reports its wall time, CPU seconds, ten longest tests, the ten tests that used the most
CPU (each test's CPU seconds, with the subprocesses it waited for, from :mod:`harness.workers`), and the tests' CPU
seconds by folder and by module (:func:`cpu_by_module`: whose work the run is); it exits 1
when the wall time is over 60 s. On a host shared with other jobs the wall time is an upper bound and the CPU seconds (about
``cores x wall`` on an idle host) are the figure to compare between commits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from harness import checkout
from harness.hardware import count_gpus_without_init
from harness.preflight import HARDWARE
from harness.scheduling import DEALING
from harness.workers import THREAD_VARIABLES, read_records, usable_cores

ROOT = Path(__file__).resolve().parent.parent


def default_workers(cores: int) -> list[str]:
    """``1, 2, 4, ...`` below ``cores``, then ``auto`` (which starts ``cores`` workers)."""
    counts, n = [], 1
    while n < cores:
        counts.append(str(n))
        n *= 2
    return [*counts, "auto"]


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | skipped}`` from a JUnit XML report."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        result[key] = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    return result


def longest(times: dict[str, tuple[float, str | None]], n: int = 10) -> list[tuple[str, float]]:
    """The ``n`` longest tests of a run (``times``: :func:`timed`): with many workers they bound the wall time."""
    return [(name, round(t, 1)) for name, (t, _) in sorted(times.items(), key=lambda c: -c[1][0])[:n]]


def _cpu_cases(junit: Path) -> list[tuple[str, str, float, float]]:
    """``(class name, test name, CPU s, wall s)`` of each test of a JUnit XML report with a ``cpu_s`` property.

    A test's CPU seconds are that property (:mod:`harness.workers`: its process's and the subprocesses' it
    waited for, setup to teardown); on a shared host they are the figure to compare."""
    cases = []
    for c in ET.parse(junit).iter("testcase"):
        cpu = next((float(p.get("value") or 0) for p in c.iter("property") if p.get("name") == "cpu_s"), None)
        if cpu is not None:
            cases.append((c.get("classname") or "", c.get("name") or "", cpu, float(c.get("time") or 0)))
    return cases


def costliest(junit: Path, n: int = 10) -> list[tuple[str, float, float]]:
    """The ``n`` tests of a JUnit XML report that used the most CPU: ``(test, CPU s, wall s)``."""
    cases = sorted(_cpu_cases(junit), key=lambda c: -c[2])[:n]
    return [(f"{cls}::{name}", round(cpu, 1), round(wall, 1)) for cls, name, cpu, wall in cases]


def module_of(classname: str) -> str:
    """The test module of a JUnit class name: its parts up to the first named ``test_*`` (``tests.test_fleet`` for
    a test of a class in it, ``tests/test_fleet.py``); the class name itself where no part is."""
    parts = classname.split(".")
    end = next((i for i, part in enumerate(parts) if part.startswith("test_")), None)
    return classname if end is None else "/".join(parts[: end + 1]) + ".py"


def cpu_by_module(junit: Path, n: int = 10) -> dict[str, Any]:
    """Where the tests' CPU seconds of a JUnit XML report went: ``{"folders": {folder: CPU s}, "modules": [[module,
    tests, CPU s], ...]}``, the ``n`` costliest modules (:func:`module_of`) first, a folder being a module's first
    part. The split that shows whose work a run is: on the 2-core CPU machine the self-tests of ``tests/`` took
    two thirds of ``conformance tests`` (docs/measurements.md §6, 2026-12-07)."""
    folders: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for cls, _, cpu, _ in _cpu_cases(junit):
        module = module_of(cls)
        folders[module.split("/")[0]] += cpu
        modules[module] += cpu
        tests[module] += 1
    return {
        "folders": {folder: round(cpu, 1) for folder, cpu in sorted(folders.items())},
        "modules": [[module, tests[module], round(cpu, 1)] for module, cpu in modules.most_common(n)],
    }


def timed(junit: Path) -> dict[str, tuple[float, str | None]]:
    """``{test: (seconds, worker)}`` of a JUnit XML report (the ``worker`` property, :mod:`harness.workers`)."""
    result = {}
    for c in ET.parse(junit).iter("testcase"):
        worker = next((p.get("value") for p in c.iter("property") if p.get("name") == "worker"), None)
        result[f"{c.get('classname')}::{c.get('name')}"] = (float(c.get("time") or 0), worker)
    return result


def slower_than_dealt(
    ran: dict[str, tuple[float, str | None]], dealt: dict[str, tuple[float, str | None]], n: int = 5, over: float = 1.0
) -> list[list[Any]]:
    """The ``n`` tests of a run that took the most seconds beyond those it was dealt by (``dealt``: the run before
    it, whose durations it read from the cache), at least ``over`` more: ``[test, worker, dealt s, took s]``.

    A test that is the first in its process to need what, in the run before, an earlier test of the same process had
    built (a layer, its reference outputs, a library's import) takes longer than it took there; dealt as short, it
    can end a many-worker run late."""
    excess = [
        (took - dealt[name][0], name, worker, dealt[name][0], took)
        for name, (took, worker) in ran.items()
        if name in dealt and took - dealt[name][0] >= over
    ]
    return [
        [name, worker, round(before, 2), round(took, 2)] for _, name, worker, before, took in sorted(excess)[::-1][:n]
    ]


NO_ENDS: dict[str, list[Any]] = {"worker_ends_s": [], "last_tests": []}
""":func:`tail` of a run without JUnit XML, or whose tests carry no ``worker`` and ``ended_s``."""


def tail(junit: Path, n: int = 5) -> dict[str, Any]:
    """When each process's last test ended (seconds after the run's start: min, median, max over the
    processes) and the ``n`` tests that ended last, ``(test, worker, started s, seconds)``: with many
    workers the run ends with its slowest process, and these show what kept it busy.

    Reads the ``worker`` and ``ended_s`` properties (:mod:`harness.workers`); a test's start is its end
    less its JUnit time (setup, call and teardown)."""
    ends: dict[str, float] = {}
    cases = []
    for c in ET.parse(junit).iter("testcase"):
        props = {p.get("name"): p.get("value") for p in c.iter("property")}
        if props.get("ended_s") is None or props.get("worker") is None:
            continue
        end, worker = float(props["ended_s"]), props["worker"]
        ends[worker] = max(ends.get(worker, 0.0), end)
        seconds = float(c.get("time") or 0)
        cases.append(
            (end, f"{c.get('classname')}::{c.get('name')}", worker, round(end - seconds, 1), round(seconds, 1))
        )
    if not ends:
        return NO_ENDS
    last = [list(case[1:]) for case in sorted(cases, key=lambda case: -case[0])[:n]]
    spread = [round(min(ends.values()), 1), round(statistics.median(ends.values()), 1), round(max(ends.values()), 1)]
    return {"worker_ends_s": spread, "last_tests": last}


KERNEL_MARKERS = " or ".join(sorted(HARDWARE))
"""The warm-up's ``-m`` expression: a test with any hardware marker, AITER's Triton kernels on CUDA (``aiter_triton``)
included."""
UNSET = ("PYTHONDONTWRITEBYTECODE",)
"""Removed from the runs' environment, as ``.ci/run`` removes it: with it every process (each xdist worker, each
self-test's run) compiles the suite's modules and pytest rewrites its test modules again."""


def pytest_env(profile: str, threads: int | None, root: Path) -> dict[str, str]:
    """The runs' environment: thread variables removed (or forced to ``threads``) and :data:`UNSET`; profile, root."""
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARIABLES, *UNSET) and k != "PYTEST_XDIST_WORKER"}
    env.update(
        {"FP4_PROFILE": profile, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))}
    )
    if threads is not None:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    return env


_OUTCOMES = re.compile(
    r"^=*\s*(\d+ (?:passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)\b.*?) in [\d.]+s\b"
)


def outcome_line(stdout: str) -> str | None:
    """pytest's closing counts (``9 passed, 1109 deselected``) from a run's output; None when it printed none."""
    return next((m.group(1) for line in reversed(stdout.splitlines()) if (m := _OUTCOMES.match(line))), None)


def warm_up(targets: list[str], profile: str, root: Path) -> tuple[float, str]:
    """Run the kernel properties once in one process (JIT builds land in the libraries' caches); seconds, and what
    ran: pytest's closing counts, with its exit status where that is neither 0 nor 5 (no test selected)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        cmd += ["-m", KERNEL_MARKERS, "--hypothesis-profile", profile, "--results", tmp]
        start = time.perf_counter()
        done = subprocess.run(
            cmd, cwd=root, env=pytest_env(profile, None, root), capture_output=True, text=True, timeout=7200
        )
        seconds = time.perf_counter() - start
    ran = outcome_line(done.stdout) or "no counts printed"
    return seconds, ran if done.returncode in (0, 5) else f"{ran}; exit status {done.returncode}"


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children and their waited-for descendants
    (a pytest run and its xdist workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dealt_by(stdout: str) -> str | None:
    """How a run's tests were dealt to its workers, from its summary line (None when it printed none)."""
    return next((line[len(DEALING) :] for line in stdout.splitlines() if line.startswith(DEALING)), None)


def run_once(
    workers: str,
    targets: list[str],
    profile: str,
    threads: int | None,
    root: Path,
    cache: Path,
    out: Path | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One ``pytest -n workers`` run of ``targets`` with pytest's cache in ``cache`` (where the scheduler reads the
    test durations earlier runs stored, and stores this run's: :mod:`harness.scheduling`); wall time, records,
    outcomes and example counts. With ``out``, its JUnit XML is kept there as ``junit-NAME.xml`` (``name``, by
    default ``workers``; every test's time, CPU, worker and end)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        cmd = [
            sys.executable, "-m", "pytest", *targets, "-q", "-o", f"cache_dir={cache}", "-n", workers,
            "--hypothesis-profile", profile, "--results", str(results), "--junitxml", str(results / "junit.xml"),
        ]  # fmt: skip
        env = pytest_env(profile, threads, root)
        load, before = os.getloadavg()[0], children_cpu()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=7200)
        wall = time.perf_counter() - start
        cpu = children_cpu() - before
        records = read_records(results)
        stats: dict[str, dict[str, Any]] = {}
        for path in results.glob("stats-*.json"):
            stats.update(json.loads(path.read_text()))
        junit = results / "junit.xml"
        times = timed(junit) if junit.exists() else {}
        if junit.exists() and out is not None:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(junit, out / f"junit-{name or workers}.xml")
        return {
            "returncode": proc.returncode,
            "tail": proc.stdout[-2000:] if proc.returncode not in (0, 1) else "",
            "wall_s": wall,
            "cpu_s": cpu,
            "load": load,
            "records": records,
            "outcomes": outcomes(junit) if junit.exists() else {},
            "longest": longest(times),
            "costliest": costliest(junit) if junit.exists() else [],
            "by_module": cpu_by_module(junit) if junit.exists() else {"folders": {}, "modules": []},
            "ends": tail(junit) if junit.exists() else NO_ENDS,
            "times": times,
            "dealt_by": dealt_by(proc.stdout),
            "examples": {node: s["examples"] for node, s in stats.items()},
            "stats": stats,
        }


def row_names(labels: list[str]) -> list[str]:
    """Each run's name: its worker count, and ``COUNT-2``, ``COUNT-3``, ... where ``--workers`` repeats a count
    (``auto,auto`` measures the same count twice, the second run dealt by the first one's durations)."""
    seen: Counter[str] = Counter()
    names = []
    for label in labels:
        seen[label] += 1
        names.append(label if seen[label] == 1 else f"{label}-{seen[label]}")
    return names


def row(label: str, run: dict[str, Any], first: dict[str, Any], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's row for one run, compared with the first (and, where it was dealt by stored seconds, with the
    run ``before`` it, which stored them)."""
    startups = [r["startup_s"] for r in run["records"] if r.get("startup_s") is not None]
    counts = {k: list(run["outcomes"].values()).count(k) for k in ("passed", "failed", "skipped")}
    return {
        "workers": label,
        "processes": len(run["records"]),
        "threads_per_worker": sorted({r["threads"] for r in run["records"]}),
        "wall_s": round(run["wall_s"], 1),
        "cpu_s": round(run["cpu_s"], 1),
        "load": round(run["load"], 1),
        "speedup": round(first["wall_s"] / run["wall_s"], 2),
        "startup_median_s": round(statistics.median(startups), 2) if startups else None,
        "startup_max_s": round(max(startups), 2) if startups else None,
        **counts,
        "returncode": run["returncode"],
        "longest_tests_s": run["longest"],
        "costliest_tests_cpu_s": run.get("costliest", []),
        "tests_cpu_s_by_folder": run.get("by_module", {}).get("folders", {}),
        "costliest_modules_cpu_s": run.get("by_module", {}).get("modules", []),
        **run.get("ends", NO_ENDS),
        "dealt_by": run.get("dealt_by"),
        "slower_than_dealt": slower_than_dealt(run.get("times", {}), before.get("times", {})) if before else [],
        "failed_tests": sorted(k for k, v in run["outcomes"].items() if v == "failed"),
        "same_results": run["outcomes"] == first["outcomes"] and run["examples"] == first["examples"],
    }


def slowest(run: dict[str, Any], n: int = 8) -> list[dict[str, Any]]:
    """The ``n`` properties with the fewest examples per second in ``run``."""
    rows = [
        {"property": node, "examples": s["examples"], "seconds": round(s["seconds"], 2),
         "examples_per_second": round(s["examples"] / max(s["seconds"], 1e-9), 1)}
        for node, s in run["stats"].items() if s["examples"]
    ]  # fmt: skip
    return sorted(rows, key=lambda r: r["examples_per_second"])[:n]


def throughput(nodes: list[str], profile: str, root: Path) -> dict[str, float]:
    """Examples per second of ``nodes`` run in one process with one torch thread in checkout ``root``."""
    if not nodes:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pytest", *nodes, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        cmd += ["--hypothesis-profile", profile, "--results", tmp]
        subprocess.run(cmd, cwd=root, env=pytest_env(profile, 1, root), capture_output=True, timeout=7200)
        stats: dict[str, dict[str, Any]] = {}
        for path in Path(tmp).glob("stats-*.json"):
            stats.update(json.loads(path.read_text()))
    return {n: round(s["examples"] / max(s["seconds"], 1e-9), 1) for n, s in stats.items() if s["examples"]}


def compare(nodes: list[str], profile: str, root: Path, baseline: Path) -> list[dict[str, Any]]:
    """``nodes``' examples/s in ``baseline`` and in ``root``, measured back to back."""
    before, after = throughput(nodes, profile, baseline), throughput(nodes, profile, root)
    return [
        {"property": n, "baseline": before.get(n), "this": after.get(n),
         "ratio": round(after[n] / before[n], 2) if before.get(n) and after.get(n) else None}
        for n in nodes
    ]  # fmt: skip


def host() -> dict[str, Any]:
    """What the numbers were measured on: cores, machine, versions, commit."""
    import torch

    from harness.hardware import machine

    return {
        "usable_cores": usable_cores(),
        "machine": machine().describe(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": checkout.commit(ROOT),  # None outside a git checkout of the suite
    }


def short_dealing(dealt: str | None) -> str:
    """The table's cell for a row's dealing: ``count``, ``stored seconds (K/N)``, or ``-`` (no xdist scheduler line)."""
    if not dealt:
        return "-"
    counts = re.search(r"(\d+) of (\d+) tests", dealt)  # "by the stored seconds of K of N tests ..."
    return f"stored seconds ({counts[1]}/{counts[2]})" if counts else "count"


def markdown(report: dict[str, Any]) -> str:
    h = report["host"]
    out = [
        f"# Worker scaling ({h['machine']}, {h['usable_cores']} usable cores, {report['date']})",
        "",
        f"`pytest -n N {' '.join(report['targets'])}`, profile `{report['profile']}`; torch {h['torch']}, "
        f"Python {h['python']}, commit {h['commit'] or 'unknown'}"
        + (f"; every worker forced to {report['threads']} threads" if report["threads"] else "")
        + (
            f"; kernel-property warm-up {report['warmup_s']} s before the first row ({report['warmup']})"
            if report["warmup_s"]
            else ""
        ),
        "",
        "| workers | processes x torch threads | wall s | CPU s | load at start | speed-up | start-up median / max s "
        "| passed / failed / skipped | same results as first row | dealt by |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        threads = "/".join(map(str, r["threads_per_worker"])) or "?"
        out.append(
            f"| {r['workers']} | {r['processes']} x {threads} | {r['wall_s']} | {r['cpu_s']} | {r['load']} "
            f"| {r['speedup']}x "
            f"| {r['startup_median_s']} / {r['startup_max_s']} | {r['passed']} / {r['failed']} / {r['skipped']} "
            f"| {'yes' if r['same_results'] else 'NO'} | {short_dealing(r.get('dealt_by'))} |"
        )
    last = report["runs"][-1]
    out += [
        "",
        f"Longest tests at `-n {last['workers']}` (a run is never shorter than its longest test plus start-up):",
    ]
    out += [""] + [f"- `{name}`: {t} s" for name, t in last["longest_tests_s"]]
    if last.get("worker_ends_s"):
        first, median, final = last["worker_ends_s"]
        out += [
            "",
            f"Each process's last test ended {first} / {median} / {final} s (min / median / max) after the run's "
            "start; the tests that ended last:",
            "",
        ]
        out += [
            f"- `{name}` ({worker}): started at {at} s, took {took} s" for name, worker, at, took in last["last_tests"]
        ]
    if last.get("slower_than_dealt"):
        out += [
            "",
            f"Tests at `-n {last['workers']}` that took the most beyond the seconds they were dealt by (often the first "
            "test in its process to need what an earlier test of the same process had built in the run before):",
            "",
        ]
        out += [
            f"- `{name}` ({worker}): dealt as {dealt} s, took {took} s"
            for name, worker, dealt, took in last["slower_than_dealt"]
        ]
    if last.get("costliest_tests_cpu_s"):
        out += ["", f"Tests using the most CPU at `-n {last['workers']}` (with the subprocesses they waited for):", ""]
        out += ["| test | CPU s | wall s |", "|---|---|---|"]
        out += [f"| `{name}` | {cpu} | {wall} |" for name, cpu, wall in last["costliest_tests_cpu_s"]]
    if last.get("tests_cpu_s_by_folder"):
        folders = last["tests_cpu_s_by_folder"]
        rest = round(last["cpu_s"] - sum(folders.values()), 1)
        out += [
            "",
            f"The tests' CPU seconds at `-n {last['workers']}` by folder: "
            + ", ".join(f"`{folder}/` {cpu}" for folder, cpu in folders.items())
            + f"; the run's other {rest} s are the controller, the workers' start-up and the end. The modules "
            "using the most:",
            "",
            "| module | tests | CPU s |",
            "|---|---|---|",
        ]
        out += [f"| `{module}` | {count} | {cpu} |" for module, count, cpu in last["costliest_modules_cpu_s"]]
    out += ["", f"Slowest properties in the first run ({report['runs'][0]['workers']} worker(s)):", ""]
    out += ["| property | examples | s | examples/s |", "|---|---|---|---|"]
    out += [
        f"| `{s['property']}` | {s['examples']} | {s['seconds']} | {s['examples_per_second']} |"
        for s in report["slowest"]
    ]
    if report.get("ab"):
        out += ["", f"Slowest properties, one process, one torch thread: `{report['baseline']}` vs this checkout", ""]
        out += ["| property | baseline examples/s | this examples/s | ratio |", "|---|---|---|---|"]
        out += [f"| `{r['property']}` | {r['baseline']} | {r['this']} | {r['ratio']}x |" for r in report["ab"]]
    return "\n".join(out) + "\n"


def write(report: dict[str, Any], out: Path) -> None:
    """``scaling.json`` and ``scaling.md`` in ``out`` (rewritten after every run)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(report, indent=2))
    (out / "scaling.md").write_text(markdown(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", help="comma-separated worker counts, 'auto' allowed (default 1,2,4,...,auto)")
    parser.add_argument("--targets", nargs="+", default=["conformance", "tests"], help="pytest targets")
    parser.add_argument("--profile", default="ci", help="Hypothesis profile (default ci)")
    parser.add_argument("--threads", type=int, help="force this many torch threads in every worker")
    parser.add_argument("--require-speedup", type=float, help="exit 1 unless the last row is this much faster")
    parser.add_argument("--max-wall", type=float, help="exit 1 when the last row's wall time is over this (s)")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to run (default: this one)")
    parser.add_argument("--baseline-root", type=Path, help="another checkout: A/B of the slowest properties")
    parser.add_argument("--out", type=Path, default=Path("results/scaling"), help="output folder")
    args = parser.parse_args(argv)
    labels = args.workers.split(",") if args.workers else default_workers(usable_cores())
    root = args.root.resolve()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host": host(),
        "targets": args.targets,
        "profile": args.profile,
        "threads": args.threads,
        "warmup_s": None,
        "warmup": None,
        "runs": [],
        "slowest": [],
        "baseline": str(args.baseline_root) if args.baseline_root else None,
        "ab": [],
        "errors": {},
    }
    if count_gpus_without_init():
        seconds, report["warmup"] = warm_up(args.targets, args.profile, root)
        report["warmup_s"] = round(seconds, 1)
    names = row_names(labels)
    runs: dict[str, dict[str, Any]] = {}
    before: dict[str, str] = {}  # a row -> the row run just before it, whose stored durations dealt it
    cache = args.out.resolve() / "pytest-cache"  # the rows' own pytest cache, empty at the start
    shutil.rmtree(cache, ignore_errors=True)
    # the first count, then the largest first, so that a run cut short still has the widest row
    for i in [0, *reversed(range(1, len(labels)))]:
        if runs:
            before[names[i]] = list(runs)[-1]
        runs[names[i]] = run_once(labels[i], args.targets, args.profile, args.threads, root, cache, args.out, names[i])
        print(f"-n {labels[i]}: {runs[names[i]]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        first = runs[names[0]]
        report["runs"] = [
            row(name, runs[name], first, runs[before[name]] if name in before else None)
            for name in names
            if name in runs
        ]
        report["slowest"] = slowest(first)
        report["errors"] = {name: run["tail"] for name, run in runs.items() if run["tail"]}
        write(report, args.out)
    if args.baseline_root:
        nodes = [s["property"] for s in slowest(runs[names[0]], 4)]
        report["ab"] = compare(nodes, args.profile, root, args.baseline_root.resolve())
        write(report, args.out)
    print(markdown(report))
    last = report["runs"][-1]
    if not all(r["same_results"] for r in report["runs"]):
        print("results differ between worker counts", file=sys.stderr)
        return 1
    if args.require_speedup and last["speedup"] < args.require_speedup:
        print(f"-n {last['workers']} is {last['speedup']}x, below {args.require_speedup}x", file=sys.stderr)
        return 1
    if args.max_wall and last["wall_s"] > args.max_wall:
        print(f"-n {last['workers']} took {last['wall_s']} s, over {args.max_wall} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
