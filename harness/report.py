"""One nightly report from many shards: ``python -m harness.report OUT SHARD_DIR [SHARD_DIR ...]``.

Each host of a fleet runs one shard with ``--results SHARD_DIR --junitxml SHARD_DIR/junit.xml``.
The plugin leaves in ``SHARD_DIR`` (:mod:`harness.records`): ``run.json`` (run id, state, host,
shard, subject, profile, hardware, exit status, versions), ``summary.json`` (contract x backend x
hardware outcome counts), ``inflight/`` (the test each process was running, left by a process
that died), ``device-*.json`` (which GPU each worker was pinned to) and ``expected-*.json``
(expected failures per upstream link). This module merges them with the JUnit files into

* ``OUT/report.md``: Markdown for CI logs;
* ``OUT/report.html``: one self-contained page (inline CSS, no scripts, no external resources):
  the contract x backend x hardware matrix, failures with their shrunk configuration and
  reproduction line, expected failures with their upstream links, fixed-bug alerts, and the
  per-host device records;
* ``OUT/summary.json``: the merged matrix and lists, for tools.

Both pages list the matrix rows with failures first, and failures grouped by root cause (the
exception type and message with numbers normalised, :func:`root_cause`); a message longer than
:data:`SHORT` characters is cut with an ellipsis (the HTML page keeps the whole behind
``<details>``). The command prints only the verdict, its reasons, the totals, the largest root
causes and the three files' paths (:func:`summary_text`).

Failures are read from JUnit ``<failure>``/``<error>`` elements: the reproduction is the
``reproduce`` property when the plugin attached one, else the ``reproduce:`` line of the
failure text; the configuration is the ``config:`` line Hypothesis printed as a note. A failure
saying that a known upstream bug "no longer fails" is a fixed-bug alert, listed apart.

The gate fails closed: the report is RED (and ``--strict`` exits 1) for any reason
:meth:`Report.reasons` lists, from every source of truth:

* the matrix counts (``failed``, ``xpassed``), JUnit ``<failure>``/``<error>`` elements and
  fixed-bug alerts;
* crash records: a run whose ``run.json`` still says ``running`` was killed, crashed or hangs;
  each test its processes were running (``inflight/``) is a failure with its reproduction,
  counted under its contract, backend and hardware;
* missing or unreadable data: a folder that is absent or empty or has no run record, a run
  record of no known state, an exit status other than 0 or 1, a missing ``summary.json``, a run
  that ran no tests, a JUnit file the run recorded that is absent, failures counted without a
  JUnit file, a truncated JSON or XML file (named; the rest of the report is still written);
* the set of shards: the same run given twice, runs of different subjects, profiles or shard
  counts, and per hardware an index of ``COUNT`` (from ``run.json``) absent or given twice.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import records, shard
from subjects.registry import ReachKind

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
RED_OUTCOMES = ("failed", "xpassed")
FIXED_MARKERS = ("no longer fails", "KnownFailureFixed")
EXIT_STATUS = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}
CRASHED = "the process died or hung in this test: no verdict was recorded"
SHORT = 300
"""Characters of a failure message shown inline; the rest is behind an ellipsis (HTML: a ``<details>``)."""


@dataclass
class Failure:
    """One failing test case of one shard."""

    nodeid: str
    host: str
    message: str
    config: str | None = None
    reproduce: str | None = None
    contract: str | None = None
    backend: str | None = None


def short(message: str) -> str:
    """The first line of ``message``, cut at :data:`SHORT` characters; an ellipsis marks anything left out."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    cut = first[:SHORT]
    return cut + "…" if cut != message.strip() else cut


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def root_cause(failure: Failure) -> str:
    """Failures of one root cause share this: the exception type and first line of the message with
    every number replaced by ``N`` (``Ip=176`` and ``Ip=240`` of one rule are one cause)."""
    return _NUMBER.sub("N", short(failure.message).removesuffix("…"))


def grouped(failures: Sequence[Failure]) -> list[list[Failure]]:
    """``failures`` grouped by :func:`root_cause`, largest group first (then in first-seen order)."""
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(root_cause(f), []).append(f)
    return sorted(groups.values(), key=len, reverse=True)


def failing_first(matrix: dict[tuple[str, str, str], Counter]) -> list[tuple[str, str, str]]:
    """The matrix keys, rows with a failed or xpassed count first, each part sorted."""
    return sorted(matrix, key=lambda k: (not any(matrix[k][o] for o in RED_OUTCOMES), k))


@dataclass
class Report:
    """Everything the merged report shows."""

    matrix: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    skip_reasons: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    fixed: list[Failure] = field(default_factory=list)
    expected: dict[str, Counter] = field(default_factory=dict)
    """Expected-failure examples by the ledger entry's reach (``ReachKind`` value), then upstream link."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def totals(self) -> Counter:
        total: Counter = Counter()
        for counts in self.matrix.values():
            total.update(counts)
        return total

    def reasons(self) -> list[str]:
        """Why the report is RED, one line per reason; empty means GREEN."""
        total = self.totals()
        reasons = list(self.problems)
        if any(total[k] for k in RED_OUTCOMES):
            reasons.append("matrix counts: " + ", ".join(f"{total[k]} {k}" for k in RED_OUTCOMES if total[k]))
        if self.failures:
            reasons.append(f"{len(self.failures)} failing test(s) (JUnit failures and errors, crash records)")
        if self.fixed:
            reasons.append(f"{len(self.fixed)} fixed-bug alert(s)")
        return reasons


def expected_rows(expected: dict[str, Counter]) -> list[tuple[str, str, int]]:
    """``(reach, link, examples)`` for expected failures keyed by reach then link: default-path reaches first
    (:class:`subjects.registry.ReachKind` order; a reach it does not know last), then by link."""
    order = {kind.value: i for i, kind in enumerate(ReachKind)}
    return [
        (reach, link, n)
        for reach in sorted(expected, key=lambda r: (order.get(r, len(order)), r))
        for link, n in sorted(expected[reach].items())
    ]


def reach_totals(expected: dict[str, Counter]) -> str:
    """``"12 default path, 3 latent"``: the examples of each reach, in :func:`expected_rows`' order."""
    totals: Counter = Counter()
    for reach, _, n in expected_rows(expected):
        totals[reach] += n
    return ", ".join(f"{n} {reach}" for reach, n in totals.items())


def _line(text: str, prefix: str) -> str | None:
    for line in text.splitlines():
        stripped = line.strip().lstrip("E").strip()
        if stripped.startswith(prefix):
            return stripped[len(prefix) :].strip()
    return None


def _nodeid(case: ET.Element) -> str:
    classname, name = case.get("classname", ""), case.get("name", "")
    path = classname.replace(".", "/")
    return f"{path}.py::{name}" if classname else name


def read_junit(path: Path, host: str) -> list[Failure]:
    """The failing test cases of one JUnit XML file (pytest's ``--junitxml`` format)."""
    failures: list[Failure] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            continue
        text = f"{bad.get('message', '')}\n{bad.text or ''}"
        failures.append(
            Failure(
                nodeid=_nodeid(case),
                host=host,
                message=bad.get("message") or "",
                config=_line(text, "config:"),
                reproduce=props.get("reproduce") or _line(text, "reproduce:"),
                contract=props.get("contract"),
                backend=props.get("backend"),
            )
        )
    return failures


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (str(row["contract"]), str(row["backend"]), str(row["hardware"]))


def merge(shard_dirs: Iterable[Path]) -> Report:
    """Merge the result folders of several shards (or hosts) into one :class:`Report`.

    Never raises on bad data: a missing folder, a truncated file or an inconsistent set of
    shards is recorded in ``problems`` and the rest is still merged.
    """
    report = Report()
    for folder in shard_dirs:
        _merge_folder(Path(folder), report)
    report.problems += shard_problems(report.runs)
    return report


def _load(path: Path, report: Report) -> Any:
    """The JSON in ``path``, or None after recording why it cannot be read."""
    try:
        return records.read_json(path)
    except records.RecordError as exc:
        report.problems.append(str(exc))
    except OSError as exc:
        report.problems.append(f"{path}: cannot be read ({exc})")
    return None


def _run_complete(folder: Path, run: dict[str, Any], report: Report) -> bool:
    """Whether ``run`` (a ``run.json``) is a finished run; records a problem when it is not, or
    when pytest did not end with 0 (all passed) or 1 (some failed)."""
    state = run.get("state")
    if state == records.RUNNING:
        report.problems.append(
            f"{folder}: the run started {run.get('started')} on {run.get('host')} (pid {run.get('pid')}) never "
            "finished: it was killed, crashed or hung (or still runs)"
        )
        return False
    if state != records.COMPLETE:
        report.problems.append(f"{folder}: run.json records no run state: it cannot be told from a killed run's")
        return False
    status = run.get("exitstatus")
    if status not in (0, 1):
        report.problems.append(f"{folder}: pytest ended with exit status {status} ({EXIT_STATUS.get(status, '?')})")
    return True


def _merge_crashes(folder: Path, run: dict[str, Any], report: Report) -> None:
    """A run that did not finish: each test left in flight is a failure, counted under its key."""
    found, unreadable = records.inflight(folder)
    report.problems += unreadable
    host = run.get("host", folder.name)
    for nodeid, data in found.items():
        contract, backend = data.get("contract"), data.get("backend")
        report.failures.append(Failure(nodeid, host, CRASHED, None, data.get("command"), contract, backend))
        key = (str(contract or "?"), str(backend or "-"), str(data.get("hardware") or run.get("hardware") or "?"))
        report.matrix.setdefault(key, Counter())["failed"] += 1
        report.skip_reasons.setdefault(key, Counter())


def _merge_summary(folder: Path, complete: bool, report: Report) -> int:
    """Add ``summary.json``'s rows to the matrix; the number of failed tests it counts."""
    path = folder / records.SUMMARY
    if not path.exists():
        if complete:
            report.problems.append(f"{path}: missing")
        return 0
    rows = _load(path, report)
    if rows is None:
        return 0
    if not isinstance(rows, list):
        report.problems.append(f"{path}: not a list of matrix rows")
        return 0
    if complete and not rows:
        report.problems.append(f"{folder}: the run ran no tests")
    failed = 0
    for row in rows:
        try:
            key, counts = _key(row), {k: int(row.get(k, 0)) for k in OUTCOMES}
        except (KeyError, TypeError, ValueError, AttributeError):
            report.problems.append(f"{path}: malformed matrix row {row!r}")
            continue
        report.matrix.setdefault(key, Counter()).update(counts)
        report.skip_reasons.setdefault(key, Counter()).update(row.get("skip_reasons", {}))
        failed += counts["failed"]
    return failed


def _merge_junit(folder: Path, run: dict[str, Any], complete: bool, failed: int, report: Report) -> None:
    """The folder's JUnit files; the one a finished run names in ``run.json`` must be there, and
    counted failures need one."""
    host = run.get("host", folder.name)
    read = 0
    for path in sorted(folder.glob("*.xml")):
        try:
            found = read_junit(path, host)
        except ET.ParseError as exc:
            report.problems.append(f"{path}: truncated or not XML ({exc})")
            continue
        read += 1
        for failure in found:
            fixed = any(m in failure.message for m in FIXED_MARKERS)
            (report.fixed if fixed else report.failures).append(failure)
    named = run.get("junitxml")
    if complete and named and not Path(named).is_absolute() and not (folder / named).exists():
        report.problems.append(f"{folder}: the JUnit file the run wrote ({named}) is missing")
    if failed and not read:
        report.problems.append(f"{folder}: summary.json counts {failed} failed but no JUnit XML gives their details")


def _merge_folder(folder: Path, report: Report) -> None:
    """Merge one results folder, recording each problem with it."""
    if not folder.is_dir():
        report.problems.append(f"{folder}: not a results folder (missing)")
        return
    run_path = folder / records.RUN
    run = _load(run_path, report) if run_path.exists() else None
    if not run_path.exists():
        what = "the folder is empty" if not any(folder.iterdir()) else "no run.json"
        report.problems.append(f"{folder}: no run record ({what}): no run of the suite started here")
    elif run is not None and not isinstance(run, dict):
        report.problems.append(f"{run_path}: not a run record")
    run = run if isinstance(run, dict) else {}
    report.runs.append({"folder": str(folder), **run})
    complete = bool(run) and _run_complete(folder, run, report)
    if not complete:
        _merge_crashes(folder, run, report)
    failed = _merge_summary(folder, complete, report)
    host = run.get("host", folder.name)
    for path in sorted(folder.glob("device-*.json")):
        record = _load(path, report)
        if isinstance(record, dict) and record.get("name"):
            report.devices.append({"host": host, **record})
    for path in sorted(folder.glob("expected-*.json")):
        expected = _load(path, report)
        if isinstance(expected, dict):
            for reach, by_link in expected.items():
                report.expected.setdefault(reach, Counter()).update(by_link)
    _merge_junit(folder, run, complete, failed, report)


def shard_problems(runs: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with a set of run records as one run of the suite: the same run twice, a mix
    of subjects, profiles or shard counts, and per hardware a shard index absent or given twice
    (an unsharded run is shard ``0/1``). Folders without a run record are left out (each is a
    problem already)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    unique = []
    for run in runs:
        if not run.get("run_id"):
            continue
        if run["run_id"] in seen:
            problems.append(f"{run['folder']}: the same run as {seen[run['run_id']]} (given twice)")
            continue
        seen[run["run_id"]] = run["folder"]
        unique.append(run)
    for name in ("subject", "profile"):
        values = _folders_by(unique, lambda r, name=name: str(r.get(name)))
        if len(values) > 1:
            problems.append(f"runs of different {name}s merged: " + "; ".join(f"{v} ({f})" for v, f in values.items()))
    placed = []
    for run in unique:
        try:
            index, count = shard.parse_shard(run["shard"]) if run.get("shard") else (0, 1)
        except ValueError as exc:
            problems.append(f"{run['folder']}: {exc}")
            continue
        placed.append({"folder": run["folder"], "slot": (str(run.get("hardware", "?")), index, count)})
    slots: dict[tuple[str, int, int], list[str]] = {}
    for run in placed:
        slots.setdefault(run["slot"], []).append(run["folder"])
    counts = _folders_by(placed, lambda r: r["slot"][2])
    if len(counts) > 1:
        problems.append("runs of different shard counts merged: " + "; ".join(f"{c} ({f})" for c, f in counts.items()))
        return problems
    for (hardware, index, count), folders in sorted(slots.items()):
        if len(folders) > 1:
            problems.append(f"shard {index}/{count} on {hardware} given {len(folders)} times: {', '.join(folders)}")
    for hardware in sorted({k[0] for k in slots}):
        count = next(k[2] for k in slots if k[0] == hardware)
        missing = [f"{i}/{count}" for i in range(count) if (hardware, i, count) not in slots]
        if missing:
            problems.append(f"missing shard(s) {', '.join(missing)} of {count} (COUNT from run.json) on {hardware}")
    return problems


def _folders_by(runs: Iterable[dict[str, Any]], value: Any) -> dict[Any, str]:
    """The runs' folders grouped by ``value(run)``, each group as one comma-separated string."""
    groups: dict[Any, list[str]] = {}
    for run in runs:
        groups.setdefault(value(run), []).append(str(run["folder"]))
    return {k: ", ".join(v) for k, v in groups.items()}


def _md_escape(text: object) -> str:
    """Text for a Markdown line or table cell: raw HTML escaped, ``|`` escaped, one line."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _md_code(text: object) -> str:
    """``text`` as an inline code span (Markdown shows its content literally; a backtick inside is doubled around)."""
    text = str(text).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def to_markdown(report: Report) -> str:
    """The report as Markdown (for CI logs)."""
    total = report.totals()
    reasons = report.reasons()
    out = ["# fp4-conformance nightly report", "", f"**{'RED' if reasons else 'GREEN'}**", ""]
    out += [f"- {_md_escape(r)}" for r in reasons] + ([""] if reasons else [])
    out.append(
        f"{len(report.runs)} shard(s); " + ", ".join(f"{total.get(k, 0)} {k}" for k in OUTCOMES) + f"; "
        f"{len(report.failures)} failing test(s), {len(report.fixed)} fixed-bug alert(s)."
    )
    out += ["", "## Contract x backend x hardware", ""]
    out.append("| contract | backend | hardware | " + " | ".join(OUTCOMES) + " |")
    out.append("|---|---|---|" + "---|" * len(OUTCOMES))
    for key in failing_first(report.matrix):
        counts = report.matrix[key]
        out.append(
            "| " + " | ".join(map(_md_escape, key)) + " | " + " | ".join(str(counts[k]) for k in OUTCOMES) + " |"
        )
    sections = (("Failures", report.failures), ("Fixed-bug alerts (update the known-failure ledger)", report.fixed))
    for title, failures in sections:
        out += ["", f"## {title}", ""]
        if not failures:
            out.append("none")
        for group in grouped(failures):
            out.append(f"- {len(group)} x {_md_escape(short(group[0].message))}")
            for f in group:
                out.append(f"  - {_md_code(f.nodeid)} on {_md_escape(f.host)}")
                if f.config:
                    out.append(f"    - config: {_md_code(f.config)}")
                if f.reproduce:
                    out.append(f"    - reproduce: {_md_code(f.reproduce)}")
    out += ["", "## Expected failures (known upstream bugs)", ""]
    out += [f"- {_md_escape(link)}: {n} examples ({reach})" for reach, link, n in expected_rows(report.expected)] or [
        "none"
    ]
    out += ["", "## Hosts and devices", ""]
    for run in report.runs:
        versions = ", ".join(f"{k} {v}" for k, v in run.get("versions", {}).items())
        out.append(
            _md_escape(
                f"- {run.get('host', '?')}: shard {run.get('shard') or 'all'}, subject {run.get('subject', '?')}, "
                f"profile {run.get('profile', '?')}, finished {run.get('finished') or 'never'} ({versions})"
            )
        )
    for d in report.devices:
        out.append(
            _md_escape(
                f"  - {d['host']} worker {d['worker']}: CUDA_VISIBLE_DEVICES={d.get('CUDA_VISIBLE_DEVICES')} "
                f"{d.get('name')} {d.get('uuid')}"
            )
        )
    return "\n".join(out) + "\n"


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1d1d1f;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.fail td{background:#fde2e2}tr.ok td.st{color:#126b12}tr.fail td.st{color:#a40000;font-weight:600}
code{background:#f6f6f6;padding:1px 4px;border-radius:3px;word-break:break-all}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.red{background:#b3261e}.green{background:#2e7d32}.amber{background:#a86b00}
li{margin:.35em 0}small{color:#666}
"""


def _html_message(message: str) -> str:
    """A failure message: its first :data:`SHORT` characters, and when cut, an ellipsis and the whole
    message behind a ``<details>`` (no script needed)."""
    shown = short(message)
    if not shown.endswith("…"):
        return html.escape(shown)
    return f"<details><summary>{html.escape(shown)}</summary><pre>{html.escape(message)}</pre></details>"


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    e = html.escape
    total = report.totals()
    reasons = report.reasons()
    badge = ("red", "RED") if reasons else ("green", "GREEN")
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>fp4-conformance nightly report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>fp4-conformance nightly report <span class='badge {badge[0]}'>{badge[1]}</span></h1>",
        *([f"<ul>{''.join(f'<li>{e(r)}</li>' for r in reasons)}</ul>"] if reasons else []),
        f"<p>{len(report.runs)} shard(s): "
        + ", ".join(f"{total.get(k, 0)} {k}" for k in OUTCOMES)
        + f". {len(report.failures)} failing test(s), {len(report.fixed)} fixed-bug alert(s), "
        f"{sum(n for *_, n in expected_rows(report.expected))} expected failure example(s)"
        + (f" ({reach_totals(report.expected)})" if report.expected else "")
        + ".</p>",
        "<h2>Contract × backend × hardware</h2><table><tr><th>contract</th><th>backend</th><th>hardware</th>",
        *(f"<th>{k}</th>" for k in OUTCOMES),
        "<th>skip reasons</th></tr>",
    ]
    for key in failing_first(report.matrix):
        counts = report.matrix[key]
        css = "fail" if counts["failed"] or counts["xpassed"] else "ok"
        reasons = "<br>".join(f"{e(r)} ×{n}" for r, n in sorted(report.skip_reasons.get(key, Counter()).items()))
        parts.append(
            f"<tr class={css}>"
            + "".join(f"<td>{e(k)}</td>" for k in key)
            + "".join(f"<td class='n{' st' if k == 'failed' else ''}'>{counts[k]}</td>" for k in OUTCOMES)
            + f"<td><small>{reasons}</small></td></tr>"
        )
    parts.append("</table>")
    for title, failures, color in (
        ("Failures", report.failures, "red"),
        ("Fixed-bug alerts: update the known-failure ledger", report.fixed, "amber"),
    ):
        parts.append(f"<h2>{e(title)} <span class='badge {color if failures else 'green'}'>{len(failures)}</span></h2>")
        if not failures:
            parts.append("<p>none</p>")
            continue
        parts.append("<ul>")
        for group in grouped(failures):
            parts.append(f"<li><b>{len(group)} ×</b> {_html_message(group[0].message)}<ul>")
            for f in group:
                parts.append(f"<li><code>{e(f.nodeid)}</code> <small>on {e(f.host)}</small>")
                if f.message != group[0].message:
                    parts.append(f"<br>{_html_message(f.message)}")
                if f.config:
                    parts.append(f"<br>config: <code>{e(f.config)}</code>")
                if f.reproduce:
                    parts.append(f"<br>reproduce: <code>{e(f.reproduce)}</code>")
                parts.append("</li>")
            parts.append("</ul></li>")
        parts.append("</ul>")
    parts.append("<h2>Expected failures (known upstream bugs)</h2>")
    if report.expected:
        parts.append("<table><tr><th>reach</th><th>upstream bug</th><th>examples</th></tr>")
        for reach, link, n in expected_rows(report.expected):
            target = link if link.startswith("http") else None
            label = f"<a href='{e(target)}'>{e(link)}</a>" if target else e(link)
            parts.append(f"<tr><td>{e(reach)}</td><td>{label}</td><td class=n>{n}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>none</p>")
    parts.append(
        "<h2>Hosts and devices</h2><table><tr><th>host</th><th>shard</th><th>subject</th>"
        "<th>profile</th><th>finished</th><th>versions</th></tr>"
    )
    for run in report.runs:
        versions = ", ".join(f"{k} {v}" for k, v in run.get("versions", {}).items())
        parts.append(
            "<tr>"
            + "".join(
                f"<td>{e(str(run.get(k) or '-'))}</td>" for k in ("host", "shard", "subject", "profile", "finished")
            )
            + f"<td><small>{e(versions)}</small></td></tr>"
        )
    parts.append("</table>")
    if report.devices:
        parts.append(
            "<table><tr><th>host</th><th>worker</th><th>CUDA_VISIBLE_DEVICES</th><th>GPU</th><th>UUID</th></tr>"
        )
        for d in report.devices:
            cells = (d["host"], d.get("worker"), d.get("CUDA_VISIBLE_DEVICES"), d.get("name"), d.get("uuid"))
            parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    else:
        parts.append("<p><small>no GPU workers</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write(report: Report, out: Path) -> tuple[Path, Path]:
    """Write ``report.md``, ``report.html`` and ``summary.json`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    md, page = out / "report.md", out / "report.html"
    md.write_text(to_markdown(report))
    page.write_text(to_html(report))
    merged = {
        "matrix": [
            {"contract": k[0], "backend": k[1], "hardware": k[2], **{o: report.matrix[k][o] for o in OUTCOMES}}
            for k in sorted(report.matrix)
        ],
        "failures": [asdict(f) for f in report.failures],
        "fixed": [asdict(f) for f in report.fixed],
        "expected": {reach: dict(by_link) for reach, by_link in report.expected.items()},
        "runs": report.runs,
        "devices": report.devices,
        "problems": report.problems,
        "verdict": "RED" if report.reasons() else "GREEN",
        "reasons": report.reasons(),
    }
    (out / "summary.json").write_text(json.dumps(merged, indent=2))
    return md, page


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.md, report.html and summary.json")
    parser.add_argument("shards", type=Path, nargs="+", help="the --results folders of the shards")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if the report is RED: a failure, a fixed known bug, or missing, unfinished or inconsistent data",
    )
    args = parser.parse_args(argv)
    report = merge(args.shards)
    md, page = write(report, args.out)
    sys.stdout.write(summary_text(report, md, page))
    return 1 if args.strict and report.reasons() else 0


def summary_text(report: Report, md: Path, page: Path) -> str:
    """What the command prints: the verdict, its reasons, the totals and where the full report is
    (a fleet's report can run to thousands of lines; CI logs get the verdict, the files the rest)."""
    total, reasons = report.totals(), report.reasons()
    lines = [f"fp4-conformance report: {'RED' if reasons else 'GREEN'}", *(f"  - {r}" for r in reasons)]
    lines.append(
        f"{len(report.runs)} shard(s); "
        + ", ".join(f"{total.get(k, 0)} {k}" for k in OUTCOMES)
        + f"; {len(report.failures)} failing test(s) in {len(grouped(report.failures))} root cause(s)"
    )
    for group in grouped(report.failures)[:10]:
        lines.append(f"  {len(group)} x {short(group[0].message)}")
    lines += [f"report: {md}", f"html: {page}", f"json: {md.parent / 'summary.json'}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
