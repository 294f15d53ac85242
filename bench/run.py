"""Detection power and speed: the suite against the fixed grids of the libraries' own tests.

Three measurements, written as Markdown and JSON under ``--out``:

1. **Suite.** For every known-bad subject (or the ``--subject`` ones), :mod:`bench.detection`
   calls the conformance checks in-process on the configurations Hypothesis generates under
   each seed: with the pinned ``@example`` s, generation only, and generation after the
   seed-independent prefix (search power).
2. **Fixed grids.** Every grid of :mod:`bench.grids` (shapes from FlashInfer's and vLLM's test
   files, named there) is mapped to the contract's configuration and every check of the
   contract runs on it in-process; a subject is caught by a grid if any check fails on any point.
3. **Throughput.** Examples per second per property for the built-in subject under ``ci``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from bench.detection import GOAL_RATE, GOAL_SEEDS, Draws, detect, properties
from harness import records
from harness.hardware import machine
from harness.inputs import guard_inputs
from harness.workers import threads_per_worker
from subjects.registry import Subject, builtin, known_bad, resolve

ROOT = Path(__file__).resolve().parent.parent


def run_suite(
    subject: str, seed: int, profile: str, targets: Iterable[str] = ("conformance",), extra: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """Run the conformance ``targets`` once in pytest for ``subject``; returns the plugin's per-test statistics.

    The repository root is prepended to ``PYTHONPATH`` (an external subject's own path is kept).
    """
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--subject", subject, "--hypothesis-profile", profile, f"--hypothesis-seed={seed}",
            "--results", tmp, *extra,
        ]  # fmt: skip
        path = os.pathsep.join(p for p in (str(ROOT), os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        stats: dict[str, dict[str, Any]] = {}
        for path in Path(tmp).glob("stats-*.json"):
            stats.update(json.loads(path.read_text()))
        return stats


GRID_VERDICTS = ("caught", "missed", "suite error")
"""A grid's verdict on a subject: a check failed for it on a point where the built-in subject passes;
no check failed; or a check failed for the built-in subject too (a fault of the suite or of the grid
mapping, never counted as a catch)."""


def grid_catches(subject: Subject, contract: str, configs: list[Any]) -> tuple[str, str | None]:
    """The grid verdict (:data:`GRID_VERDICTS`) of ``subject`` on ``configs``, and how it was reached.

    Every property of ``contract`` (its check on the backends its test runs against,
    :func:`bench.detection.properties`) runs on every configuration it takes, the cheapest
    property first, until one catches the subject. A failure is a catch
    only if the same check passes for the built-in subject on that configuration and backend: a
    check that cannot run there (a backend without a preparation step, say) fails for both and is
    no evidence against the subject. Checks that need absent hardware or libraries raise
    ``LibraryUnavailable`` and count as not run.
    """
    from contracts.errors import LibraryUnavailable

    policy, correct = (guard_inputs(s.policy(contract)) for s in (subject, builtin()))
    pairs = list({(p.check, p.backend): None for p in properties(contract)})
    runs = [(fn, b, [c for c in configs if isinstance(c, fn.__fp4_check__[1])]) for fn, b in pairs]
    runs = [r for r in runs if r[2]]
    errors: list[str] = []

    def attempt(fn: Any, backend: Any, config: Any) -> str | None:
        """How ``fn`` catches the subject on ``config`` (None: it does not)."""
        where = f"{fn.__name__}[{getattr(backend, 'value', '-')}] on {config}"
        try:
            fn(config, backend, policy)
        except LibraryUnavailable:
            return None
        except Exception as exc:  # noqa: BLE001 - any failure of a check is a catch ...
            try:
                fn(config, backend, correct)
            except LibraryUnavailable:
                return None
            except Exception as also:  # noqa: BLE001 - ... unless the built-in subject fails it too
                errors.append(f"{where}: built-in subject fails too ({type(also).__name__})")
                return None
            return f"{where}: {type(exc).__name__}"
        return None

    # each check on its first point, timed; then check by check, cheapest first (the verdict is the same)
    cost = {}
    for i, (fn, backend, points) in enumerate(runs):
        began = time.perf_counter()
        if how := attempt(fn, backend, points[0]):
            return "caught", how
        cost[i] = time.perf_counter() - began
    for i in sorted(cost, key=cost.__getitem__):
        fn, backend, points = runs[i]
        for config in points[1:]:
            if how := attempt(fn, backend, config):
                return "caught", how
    error = errors[0] if errors else None
    return ("suite error", error) if error else ("missed", None)


def throughput(seed: int = 0) -> list[dict[str, Any]]:
    """Examples per second per property for the built-in subject under the ``ci`` profile."""
    stats = run_suite("builtin", seed, "ci")
    rows = []
    for node, s in sorted(stats.items()):
        if s["examples"]:
            rows.append(
                {"property": node, "examples": s["examples"], "seconds": round(s["seconds"], 3),
                 "examples_per_second": round(s["examples"] / max(s["seconds"], 1e-9), 1)}
            )  # fmt: skip
    return rows


def _count(x: float | str | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _figure(f: dict[str, Any]) -> str:
    return f"{f['caught']}, {_count(f['median_examples'])} / {_count(f['worst_examples'])}"


def _rate(f: dict[str, Any]) -> str:
    if not f["failing_examples"]:
        return "—"
    failing, examples = map(int, f["failing_examples"].split("/"))
    return f"{100 * failing / examples:.1f} % ({f['failing_examples']})"


def grid_hits(report: dict[str, Any], subject: str) -> tuple[list[str], int]:
    """The fixed grids that catch ``subject``, and how many grids ran on it."""
    hits = [g["name"] for g in report["grids"] if g["catches"].get(subject) == "caught"]
    return hits, sum(subject in g["catches"] for g in report["grids"])


def _grids(report: dict[str, Any], subject: str, shown: int = 2) -> str:
    hits, runs = grid_hits(report, subject)
    if not runs:
        return "—"
    names = ", ".join(hits[:shown]) + (f", … (+{len(hits) - shown})" if len(hits) > shown else "")
    return f"{len(hits)} of {runs}" + (f": {names}" if hits else "")


def markdown(report: dict[str, Any]) -> str:
    """Render the report as Markdown tables."""
    seeds, budget = report["seeds"], report["budget"]
    out = [f"# fp4-conformance bench ({report['date']})", ""]
    out += [f"Machine: {report['machine']}. Versions: {report['versions']}. Wall time: {report['wall_seconds']} s.", ""]
    out += _parts(report)
    out += [f"## Known-bad subjects: detection over {len(seeds)} seeds", ""]
    out += [
        "Caught seeds, then median / worst examples to the first failure per seed (examples counted per "
        f"property; `>{budget}` / `>25`: not caught within the budget). *With pins*: the `ci` profile as "
        "shipped (pinned `@example`s first, 25 generated). *Generation only*: no pins, 25 examples per "
        f"property (the ci-without-pins catch rate) and up to {budget} for the failure rate. *Search power*: "
        f"the {budget}-example generation after the seed-independent prefix (its length in examples in "
        "brackets). Failure rates: failing / generated examples of the subject's best property over "
        f"{report['rate_seeds']} seeds. Goal: ci without pins ≥ {GOAL_SEEDS:.0%} of seeds and search power ≥ "
        f"{GOAL_RATE:.0%}.",
        "",
    ]
    out += [
        "| subject | with pins (ci) | generation only: ci, 25 | generation only: rate "
        f"| search power: {budget} (prefix) | search power: rate | falls short |"
    ]
    out += ["|---|---|---|---|---|---|---|"]
    for r in report["suite"]:
        out.append(
            f"| `{r['subject']}` | {_figure(r['with_pins'])} | {_figure(r['ci_without_pins'])} "
            f"| {_rate(r['generation'])} | {_figure(r['search_power'])} ({r['prefix']}) "
            f"| {_rate(r['search_power'])} | {r['shortfall'] or '—'} |"
        )
    out += ["", "Best property and first search-power counterexample per subject:", ""]
    out += [
        f"- `{r['subject']}` ({r['reproduces']}): `{r['search_power']['best_property']}`; {r['counterexample']}"
        for r in report["suite"]
    ]
    out += ["", "## Fixed grids: which known-bad subjects each catches", ""]
    out += ["| grid | source | distinct shapes run | catches | misses |", "|---|---|---|---|---|"]
    errors = []
    for g in report["grids"]:
        verdicts = {k: v for k, v in g["catches"].items() if ":" not in k}
        caught = ", ".join(k for k, v in verdicts.items() if v == "caught") or "—"
        missed = ", ".join(k for k, v in verdicts.items() if v == "missed") or "—"
        out.append(f"| {g['name']} | {g['source']} | {g['points']} | {caught} | {missed} |")
        errors += [
            f"- {g['name']}, {k}: {g['catches'].get(k + ':how')}" for k, v in verdicts.items() if v == "suite error"
        ]
    if errors:
        out += [
            "",
            "Checks that fail for the built-in subject too on a grid point (not counted as catches):",
            "",
            *errors,
        ]
    out += ["", "Per known-bad subject, the grids that catch it:", ""]
    for r in report["suite"]:
        hits, runs = grid_hits(report, r["subject"])
        out.append(f"- {r['subject']}: {len(hits)} of {runs} grids ({', '.join(hits) or 'none'})")
    if report["throughput"]:
        out += ["", "## Throughput (built-in subject, ci profile)", "", "| property | examples | s | examples/s |"]
        out += ["|---|---|---|---|"]
        out += [
            f"| `{t['property']}` | {t['examples']} | {t['seconds']} | {t['examples_per_second']} |"
            for t in report["throughput"]
        ]
    return "\n".join(out) + "\n"


def _part(report: dict[str, Any]) -> dict[str, Any]:
    """One run of a joined report: its date, the suite's commit or version it measured, its subjects."""
    suite = re.search(r"fp4-conformance ([^,]+)", report.get("versions", ""))
    where = {"date": report["date"], **({"suite": suite.group(1)} if suite else {})}
    if report["suite"]:
        return {**where, "subjects": [s["subject"] for s in report["suite"]]}
    covered = {k for g in report["grids"] for k in g["catches"] if ":" not in k}
    return {**where, "subjects": [], "grids": len(covered)}


def joined(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from runs of different subjects under the same seeds and budgets (a subject measured
    again replaces its earlier row), and from fixed-grid-only runs (``--no-suite``: grid verdicts do
    not depend on seeds); the machine and versions are the last suite run's, the date the latest, the
    wall time the sum, and ``parts`` keeps each run's date and subjects."""
    suites = [r for r in reports if r["suite"]] or reports
    first, last = suites[0], suites[-1]
    conditions = ("seeds", "budget", "rate_seeds", "quick")
    if any(r[k] != first[k] for r in suites for k in conditions):
        raise SystemExit(f"bench: reports measured under different {'/'.join(conditions)} cannot be joined")
    if len(reports) == 1:
        return reports[0]
    rows: dict[str, dict[str, Any]] = {}
    grids: dict[str, dict[str, Any]] = {}
    for r in reports:
        rows.update((row["subject"], row) for row in r["suite"])
        for g in r["grids"]:
            grids.setdefault(g["name"], {**g, "catches": {}})["catches"].update(g["catches"])
    parts = [p for r in reports for p in r.get("parts", [_part(r)])]
    return {
        **last,
        "suite": list(rows.values()),
        "grids": list(grids.values()),
        "throughput": next((r["throughput"] for r in reversed(reports) if r["throughput"]), []),
        "date": max(r["date"] for r in reports),
        "wall_seconds": sum(r["wall_seconds"] for r in reports),
        "parts": parts,
    }


def markers(block: str = "bench") -> tuple[str, str]:
    """The HTML comments around a generated block of results named ``block`` in a Markdown file."""
    return f"<!-- {block}:start -->", f"<!-- {block}:end -->"


README_START, README_END = markers()


def command_of(report: dict[str, Any]) -> str:
    """The ``python -m bench`` options that measured ``report``."""
    if report.get("quick"):
        return "python -m bench --quick"
    return f"python -m bench --seeds {len(report['seeds'])} --budget {report['budget']} --rate-seeds {report['rate_seeds']}"


def _parts(report: dict[str, Any]) -> list[str]:
    """For a joined report (:func:`joined`): when each run's subjects were measured."""
    parts = report.get("parts", [])
    if len(parts) < 2:
        return []

    def what(p: dict[str, Any]) -> str:
        return ", ".join(f"`{s}`" for s in p["subjects"]) or f"fixed grids only, {p.get('grids', 0)} subjects"

    def when(p: dict[str, Any]) -> str:
        return f"{p['date']} ({p['suite']})" if "suite" in p else p["date"]

    runs = "; ".join(f"{when(p)}: {what(p)}" for p in parts)
    return [f"Joined from runs with the same options (the versions above are the last run's): {runs}.", ""]


def readme_section(report: dict[str, Any], block: str = "bench") -> str:
    """The README's bench results, generated from a report: conditions, then one row per subject; between the
    :func:`markers` of ``block``."""
    seeds, budget, command = len(report["seeds"]), report["budget"], command_of(report)
    start, end = markers(block)
    out = [
        start,
        f"Generated by `{command}` on {report['date']}: {report['machine']}; {report['versions']}; "
        f"{report['wall_seconds']} s wall time.",
        "",
        *_parts(report),
        f"Over {seeds} seeds per subject: caught seeds, then median / worst examples to the first failure "
        f"(`>{budget}`: not within the budget). Rates: failing / generated examples of the best property over "
        f"{report['rate_seeds']} seeds x {budget} examples. Fixed grids: of the FlashInfer and vLLM test grids "
        "(`bench/grids/`) run on the subject's contracts, those on which a check fails for the subject and "
        "passes for the built-in one.",
        "",
        "| known-bad subject | with pins (ci) | ci without pins (25 examples) | generation rate "
        "| search power (after the prefix) | search-power rate | fixed grids that catch it | falls short |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["suite"]:
        out.append(
            f"| `{r['subject']}` | {_figure(r['with_pins'])} | {_figure(r['ci_without_pins'])} "
            f"| {_rate(r['generation'])} | {_figure(r['search_power'])} | {_rate(r['search_power'])} "
            f"| {_grids(report, r['subject'])} | {r['shortfall'] or '—'} |"
        )
    return "\n".join([*out, end])


def update_readme(path: Path, section: str, block: str = "bench") -> None:
    """Replace the text between the :func:`markers` of ``block`` in ``path`` (both included) with ``section``."""
    text = path.read_text()
    first, last = markers(block)
    start, end = text.index(first), text.index(last) + len(last)
    path.write_text(text[:start] + section + text[end:])


def versions() -> str:
    """Python and the versions of the libraries the suite runs (:func:`harness.records.library_versions`)."""
    return ", ".join(f"{name} {version}" for name, version in records.library_versions().items())


def chosen_subjects(specs: list[str] | None) -> list[Subject]:
    """The named subjects (registered names or ``package.module:attribute``), else every known-bad one and
    the mutants generation must catch (:data:`bench.mutants.CI_MUTANTS`)."""
    from bench.mutants import CI_MUTANTS

    return [resolve(spec) for spec in specs] if specs else [*known_bad().values(), *CI_MUTANTS]


_JOB: dict[str, Any] = {}
"""What :func:`_measure` works on, set by :func:`run` before worker processes fork."""


def _measure(index: int) -> tuple[dict[str, Any] | None, dict[str, tuple[str, str | None]]]:
    """Subject ``index`` of the run: its detection row (None without the suite measurement) and its
    verdict per fixed grid (by name)."""
    subject, began = _JOB["subjects"][index], time.perf_counter()
    row = None
    if _JOB["with_suite"]:
        row = detect(
            subject, _JOB["seeds"], _JOB["budget"], _JOB["rate_seeds"], _JOB["draws"], _JOB["costs"], not _JOB["quick"]
        ).row()
    verdicts = {
        grid.name: grid_catches(subject, contract, configs)
        for grid, contract, configs in _JOB["grids"]
        if subject.policy(contract) is not None
    }
    print(f"bench: {subject.name} measured in {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    return row, verdicts


def run(
    seeds: list[int],
    out: Path,
    *,
    budget: int,
    rate_seeds: int | None,
    quick: bool = False,
    subjects: list[str] | None = None,
    with_throughput: bool = True,
    with_grids: bool = True,
    with_suite: bool = True,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run all three measurements; write ``bench.md`` and ``bench.json`` into ``out``.

    ``jobs > 1`` measures that many subjects at once in forked worker processes (rows keep the
    subjects' order; the figures do not depend on it). ``with_suite=False`` runs the fixed grids only
    (their verdicts do not depend on seeds or budgets; :func:`joined` adds them to a suite run). ``quick``
    leaves the failure rates out (its gate reads the examples to the first failure only).
    """
    from bench.grids_adapter import grid_configs

    start = time.perf_counter()
    chosen = chosen_subjects(subjects)
    grid_list = [(g, contract, configs) for g, contract, configs in grid_configs()] if with_grids else []
    _JOB.update(subjects=chosen, seeds=seeds, budget=budget, rate_seeds=rate_seeds, draws=Draws(), grids=grid_list)
    _JOB.update(with_suite=with_suite, costs={}, quick=quick)
    if jobs > 1:
        threads = threads_per_worker(torch.get_num_threads(), jobs)
        fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(jobs, mp_context=fork, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
            measured = list(pool.map(_measure, range(len(chosen))))
    else:
        measured = [_measure(i) for i in range(len(chosen))]
    suite = [row for row, _ in measured if row is not None]
    grids = []
    for grid, _, configs in grid_list:
        catches = {}
        for s, (_, verdicts) in zip(chosen, measured, strict=True):
            if grid.name in verdicts:
                catches[s.name], how = verdicts[grid.name]
                if how:
                    catches[s.name + ":how"] = how
        grids.append({"name": grid.name, "source": grid.source, "points": len(configs), "catches": catches})
    report = {
        "machine": machine().describe(),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seeds": seeds,
        "budget": budget,
        "rate_seeds": min(rate_seeds or len(seeds), len(seeds)),
        "quick": quick,
        "suite": suite,
        "grids": grids,
        "throughput": throughput() if with_throughput else [],
    }
    report["wall_seconds"] = round(time.perf_counter() - start)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(markdown(report))
    return report
