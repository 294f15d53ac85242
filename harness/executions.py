"""The last execution of every kernel property, as data: ``backends/executions.json``, and the results it comes from.

A kernel property is a test generated with ``kernel=True`` (:func:`harness.properties.check`), one per backend
parameter, named by its pytest node id. :data:`DATA` maps each one to its last execution, or to ``null``: never
executed (``tests/test_executions.py`` fails for a kernel property without an entry, and for an entry without a
property). An execution is::

    {"hardware": "sm90 (NVIDIA H200 x1)", "date": "2026-12-02", "commit": "73a810f" | null,
     "versions": {"python": ..., "torch": ..., ...}, "subject": "builtin", "profile": "ci",
     "outcome": "passed" | "failed", "examples": 52 | null, "worst_error": 0.345 | null, "source": "..."}

``examples`` is the number of examples the test ran, ``worst_error`` the largest error of any of them as a
fraction of the property's bound (:func:`harness.properties.record_error`; 0.0: exact), ``null`` where the run
did not record it, ``source`` where the execution is reported (a document section, or the results folder's
``run_id``).

A run writes what the fold needs into its ``--results`` folder (``run.json``, each worker's ``device-*.json``
with the library versions its tests imported, ``stats-*.json`` with each test's examples, outcome and worst
error). On the machine that ran it::

    FP4_PROFILE=ci python -m pytest -n auto conformance --results results/h200
    python -m harness.executions results/h200          # folds its kernel tests into backends/executions.json
    python -m harness.tables                           # regenerates docs/executions.md

A kernel test that ran (passed or failed, not skipped) replaces its property's entry; other entries are kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import checkout, records

DATA = checkout.ROOT / "backends" / "executions.json"
"""Kernel property node id -> its last execution, or None (never executed)."""
RAN = ("passed", "failed")
"""The outcomes of a kernel test that executed (a skipped one did not)."""

Execution = dict[str, Any]


def load(path: Path = DATA) -> dict[str, Execution | None]:
    """The execution data in ``path``."""
    return json.loads(path.read_text())


def save(data: dict[str, Execution | None], path: Path = DATA) -> None:
    """Write ``data`` sorted by node id, one entry per line group (stable diffs)."""
    path.write_text(json.dumps(dict(sorted(data.items())), indent=1, ensure_ascii=False) + "\n")


def from_results(folder: Path) -> dict[str, Execution]:
    """The kernel tests that executed in the finished run whose results are in ``folder``, node id -> execution.

    Raises :class:`harness.records.RecordError` where the run did not finish (``run.json`` not ``complete``)."""
    run = records.read_json(folder / records.RUN)
    if run.get("state") != records.COMPLETE:
        raise records.RecordError(f"{folder / records.RUN}: the run is {run.get('state')!r}, not complete")
    devices = {d["worker"]: d for d in map(records.read_json, sorted(folder.glob("device-*.json")))}
    found: dict[str, Execution] = {}
    for path in sorted(folder.glob("stats-*.json")):
        worker = path.stem.removeprefix("stats-")
        versions = devices.get(worker, {}).get("versions") or run.get("versions", {})
        for nodeid, stats in records.read_json(path).items():
            if not stats.get("kernel") or stats.get("outcome") not in RAN:
                continue
            found[nodeid] = {
                "hardware": run["hardware"],
                "date": str(run["finished"] or run["started"])[:10],
                "commit": run.get("commit"),
                "versions": versions,
                "subject": run["subject"],
                "profile": run["profile"],
                "outcome": stats["outcome"],
                "examples": stats["examples"],
                "worst_error": stats.get("worst_error"),
                "source": f"results run {run['run_id']}",
            }
    return found


def fold(folders: Sequence[Path], path: Path = DATA) -> list[str]:
    """Fold the kernel executions of the runs in ``folders`` (later folders win) into ``path``; returns the node
    ids replaced. A node id the data does not list is refused (:class:`KeyError`): the property is new or
    renamed, so its entry is added by hand first (``tests/test_executions.py`` names it)."""
    data = load(path)
    ran: dict[str, Execution] = {}
    for folder in folders:
        ran.update(from_results(folder))
    unknown = sorted(set(ran) - set(data))
    if unknown:
        raise KeyError(f"not kernel properties of {path.name}: {', '.join(unknown)}")
    data.update(ran)
    save(data, path)
    return sorted(ran)


def _error(execution: Execution) -> str:
    value = execution.get("worst_error")
    if value is None:
        return "not recorded"
    return "0 (exact)" if value == 0 else f"{value:.3g}"


def table(data: dict[str, Execution | None], header: str) -> str:
    """``docs/executions.md``: one row per kernel property of ``data``, by node id."""
    rows = [
        header,
        "# Kernel executions",
        "",
        "The last execution of every kernel property (a property that runs a GPU kernel: `kernel=True` in",
        "`harness.properties.check`), from `backends/executions.json`; nothing is claimed beyond it. *Examples*:",
        "the examples the test ran; *worst error*: the largest error of any of them as a fraction of the property's",
        "bound (1 is at the bound). How a GPU run adds its row: `harness/executions.py`; what else ran where, with",
        "the commands: [hardware.md](hardware.md).",
        "",
        "| kernel property | hardware | date | versions | outcome | examples | worst error / bound | reported in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for nodeid, e in sorted(data.items()):
        name = f"`{nodeid.removeprefix('conformance/')}`"
        if e is None:
            rows.append(f"| {name} | never executed | — | — | — | — | — | — |")
            continue
        versions = ", ".join(f"{k} {v}" for k, v in e["versions"].items())
        commit = f", commit {e['commit']}" if e.get("commit") else ""
        examples = "not recorded" if e.get("examples") is None else str(e["examples"])
        rows.append(
            f"| {name} | {e['hardware']} | {e['date']} | {versions} | {e['outcome']} ({e['subject']}, "
            f"`{e['profile']}` profile{commit}) | {examples} | {_error(e)} | {e['source']} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.executions", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="--results folders of finished runs")
    args = parser.parse_args(argv)
    try:
        replaced = fold(args.results)
    except (KeyError, records.RecordError) as exc:
        print(f"python -m harness.executions: {exc}", file=sys.stderr)
        return 1
    for nodeid in replaced:
        print(f"{nodeid}: folded")
    print(
        f"{len(replaced)} kernel executions folded into {DATA.relative_to(checkout.ROOT)}; run python -m harness.tables"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
