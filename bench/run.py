"""Detection power and speed: the suite against the fixed grids of the libraries' own tests.

Three measurements, written as Markdown and JSON under ``--out``:

1. **Suite.** For every shipped known-bad subject and every seed, the conformance suite runs in
   a fresh pytest process under the ``bench`` Hypothesis profile (no database, no ``@example``
   pins: generation alone), and the plugin's per-test statistics give the examples and wall
   seconds until each property's first failure and the shrunk counterexample.
2. **Fixed grids.** Every grid of :mod:`bench.grids` (shapes from FlashInfer's and vLLM's test
   files, named there) is mapped to the contract's configuration and every check of the
   contract runs on it in-process; a subject is caught by a grid if any check fails on any point.
3. **Throughput.** Examples per second per property for the built-in subject under ``ci``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.hardware import machine
from subjects.registry import Subject, backends, known_bad, named_subjects

ROOT = Path(__file__).resolve().parent.parent
CHECK_MODULES = (
    "conformance.test_nvfp4_moe",
    "conformance.test_mxfp4_moe",
    "conformance.test_mxfp4_linear",
    "conformance.test_shared_expert",
)


def run_suite(
    subject: str, seed: int, profile: str, targets: Iterable[str] = ("conformance",), extra: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """Run the conformance ``targets`` once for ``subject``; returns the plugin's per-test statistics."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--subject", subject, "--hypothesis-profile", profile, f"--hypothesis-seed={seed}",
            "--results", tmp, *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        stats: dict[str, dict[str, Any]] = {}
        for path in Path(tmp).glob("stats-*.json"):
            stats.update(json.loads(path.read_text()))
        return stats


@dataclasses.dataclass
class Detection:
    """How the suite found one known-bad subject over several seeds."""

    subject: str
    reproduces: str
    caught_seeds: int
    seeds: int
    examples: list[int]
    seconds: list[float]
    property: str | None
    counterexample: str | None

    def row(self) -> dict[str, Any]:
        def med(xs: list[float]) -> float | None:
            return statistics.median(xs) if xs else None

        return {
            "subject": self.subject,
            "reproduces": self.reproduces,
            "caught": f"{self.caught_seeds}/{self.seeds}",
            "median_examples": med(self.examples),
            "worst_examples": max(self.examples, default=None),
            "median_seconds": med(self.seconds),
            "worst_seconds": max(self.seconds, default=None),
            "first_property": self.property,
            "shrunk_counterexample": self.counterexample,
        }


def contract_modules(subject: Subject) -> list[str]:
    """The conformance module paths holding checks of the subject's contracts."""
    paths = []
    for module_name in CHECK_MODULES:
        if any(checks_of_module(module_name, c) for c in subject.policies):
            paths.append(module_name.replace(".", "/") + ".py")
    return paths


def detect(subject: Subject, seeds: list[int], quick: bool) -> Detection:
    """How fast the suite finds the subject's bug.

    First the subject's contract modules run under the ``ci`` profile (pinned regressions
    included) to find the properties that catch it; ``quick`` stops there, which is what CI
    asserts. Otherwise every seed reruns those properties under the ``bench`` profile (no
    database, no pins: generation alone), and per seed the property that failed after the fewest
    generated examples counts.
    """
    stats = run_suite(subject.name, seeds[0], "ci", contract_modules(subject), ["-x"] if quick else [])
    failing = [(s["first_failure_example"], node, s) for node, s in stats.items() if s["first_failure_example"]]
    if quick or not failing:
        first = min(failing, key=lambda t: t[0], default=None)
        return Detection(
            subject.name, subject.reproduces, int(first is not None), 1,
            [first[0]] if first else [], [round(first[2]["first_failure_seconds"], 3)] if first else [],
            first[1] if first else None, first[2]["counterexample"] if first else None,
        )  # fmt: skip
    targets = sorted({node for _, node, _ in failing})
    examples, seconds, best = [], [], None
    for seed in seeds:
        stats = run_suite(subject.name, seed, "bench", targets)
        failing = [(s["first_failure_example"], node, s) for node, s in stats.items() if s["first_failure_example"]]
        if not failing:
            continue
        n, node, s = min(failing, key=lambda t: (t[0], t[2]["first_failure_seconds"]))
        examples.append(n)
        seconds.append(round(s["first_failure_seconds"], 3))
        best = best or (node, s["counterexample"])
    return Detection(
        subject.name, subject.reproduces, len(examples), len(seeds), examples, seconds,
        best[0] if best else None, best[1] if best else None,
    )  # fmt: skip


def checks_of_module(module_name: str, contract: str) -> list[Callable[..., None]]:
    """The ``@check`` functions of ``contract`` defined in one conformance module."""
    module = importlib.import_module(module_name)
    return [fn for fn in vars(module).values() if getattr(fn, "__fp4_check__", (None,))[0] == contract]


def checks_of(contract: str) -> list[Callable[..., None]]:
    """Every ``@check`` function of ``contract`` in the conformance modules."""
    return [fn for module_name in CHECK_MODULES for fn in checks_of_module(module_name, contract)]


def grid_catches(subject: Subject, contract: str, configs: list[Any]) -> tuple[bool, str | None]:
    """Whether any check of ``contract`` fails for ``subject`` on any grid configuration.

    Checks that need absent hardware or libraries raise ``LibraryUnavailable`` and count as not run.
    """
    from contracts.errors import LibraryUnavailable

    policy = subject.policy(contract)
    for config in configs:
        for fn in (f for f in checks_of(contract) if isinstance(config, f.__fp4_check__[1])):
            for backend in backends(contract) or (None,):
                try:
                    fn(config, backend, policy)
                except LibraryUnavailable:
                    continue
                except Exception as exc:  # noqa: BLE001 - any failure of a check is a catch
                    return True, f"{fn.__name__}[{getattr(backend, 'value', '-')}] on {config}: {type(exc).__name__}"
    return False, None


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


def markdown(report: dict[str, Any]) -> str:
    """Render the report as Markdown tables."""
    out = [f"# fp4-conformance bench ({report['machine']}, {report['date']})", ""]
    mode = (
        "quick: `ci` profile with the pinned regressions, first failure only"
        if report["quick"]
        else f"generation only (`bench` profile, no pinned examples), seeds {report['seeds']}"
    )
    out += [f"## Known-bad subjects: the suite ({mode})", ""]
    out += ["| subject | reproduces | caught | median / worst examples | median / worst s | first property |"]
    out += ["|---|---|---|---|---|---|"]
    for r in report["suite"]:
        out.append(
            f"| {r['subject']} | {r['reproduces']} | {r['caught']} | {r['median_examples']} / {r['worst_examples']} "
            f"| {r['median_seconds']} / {r['worst_seconds']} | `{r['first_property']}` |"
        )
    out += ["", "Shrunk counterexamples:", ""]
    out += [f"- {r['subject']}: {r['shrunk_counterexample']}" for r in report["suite"]]
    out += ["", "## Fixed grids: which known-bad subjects each catches", ""]
    out += ["| grid | source | distinct shapes run | catches | misses |", "|---|---|---|---|---|"]
    for g in report["grids"]:
        verdicts = {k: v for k, v in g["catches"].items() if ":" not in k}
        caught = ", ".join(k for k, v in verdicts.items() if v == "caught") or "—"
        missed = ", ".join(k for k, v in verdicts.items() if v == "missed") or "—"
        out.append(f"| {g['name']} | {g['source']} | {g['points']} | {caught} | {missed} |")
    out += ["", "Per known-bad subject, the grids that catch it:", ""]
    for r in report["suite"]:
        hits = [g["name"] for g in report["grids"] if g["catches"].get(r["subject"]) == "caught"]
        runs = [g for g in report["grids"] if r["subject"] in g["catches"]]
        out.append(f"- {r['subject']}: {len(hits)} of {len(runs)} grids ({', '.join(hits) or 'none'})")
    out += ["", "## Throughput (built-in subject, ci profile)", "", "| property | examples | s | examples/s |"]
    out += ["|---|---|---|---|"]
    out += [
        f"| `{t['property']}` | {t['examples']} | {t['seconds']} | {t['examples_per_second']} |"
        for t in report["throughput"]
    ]
    return "\n".join(out) + "\n"


def run(seeds: list[int], out: Path, quick: bool, subjects: list[str] | None = None) -> dict[str, Any]:
    """Run all three measurements; write ``bench.md`` and ``bench.json`` into ``out``."""
    from bench.grids_adapter import grid_configs

    bad = known_bad()
    chosen = [bad[n] if n in bad else named_subjects()[n] for n in subjects] if subjects else list(bad.values())
    suite = [detect(s, seeds, quick).row() for s in chosen]
    grids = []
    for grid, contract, configs in grid_configs():
        catches = {}
        for s in chosen:
            if s.policy(contract) is None:
                continue
            caught, how = grid_catches(s, contract, configs)
            catches[s.name] = "caught" if caught else "missed"
            if how:
                catches[s.name + ":how"] = how
        grids.append({"name": grid.name, "source": grid.source, "points": len(configs), "catches": catches})
    report = {
        "machine": machine().describe(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "seeds": seeds,
        "quick": quick,
        "suite": suite,
        "grids": grids,
        "throughput": [] if quick else throughput(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(markdown(report))
    return report
