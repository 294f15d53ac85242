"""One nightly report from many shards: ``python -m harness.report OUT SHARD_DIR [SHARD_DIR ...]``.

Each host of a fleet runs one shard with ``--results SHARD_DIR --junitxml SHARD_DIR/junit.xml``.
The plugin leaves in ``SHARD_DIR``: ``summary.json`` (contract x backend x hardware outcome
counts), ``run.json`` (host, shard, subject, profile, versions: :func:`run_record`),
``device-*.json`` (which GPU each worker was pinned to) and ``expected-*.json`` (expected
failures per upstream link). This module merges them with the JUnit files into

* ``OUT/report.md``: Markdown for CI logs;
* ``OUT/report.html``: one self-contained page (inline CSS, no scripts, no external resources):
  the contract x backend x hardware matrix, failures with their shrunk configuration and
  reproduction line, expected failures with their upstream links, fixed-bug alerts, and the
  per-host device records;
* ``OUT/summary.json``: the merged matrix and lists, for tools.

Failures are read from JUnit ``<failure>``/``<error>`` elements: the reproduction is the
``reproduce`` property when the plugin attached one, else the ``reproduce:`` line of the
failure text; the configuration is the ``config:`` line Hypothesis printed as a note. A failure
saying that a known upstream bug "no longer fails" is a fixed-bug alert, listed apart.
"""

from __future__ import annotations

import argparse
import html
import json
import platform
import socket
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
FIXED_MARKERS = ("no longer fails", "KnownFailureFixed")


def run_record(*, subject: str, profile: str, shard: str | None, workers: int | None) -> dict[str, Any]:
    """What ``run.json`` says about this run: host, time, options and library versions."""
    versions: dict[str, str] = {"python": platform.python_version()}
    for name in ("torch", "hypothesis", "flashinfer", "vllm", "sglang", "aiter"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            versions[name] = str(module.__version__)
    return {
        "host": socket.gethostname(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "subject": subject,
        "profile": profile,
        "shard": shard,
        "workers": workers,
        "versions": versions,
    }


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


@dataclass
class Report:
    """Everything the merged report shows."""

    matrix: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    skip_reasons: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    fixed: list[Failure] = field(default_factory=list)
    expected: Counter = field(default_factory=Counter)
    runs: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)

    def totals(self) -> Counter:
        total: Counter = Counter()
        for counts in self.matrix.values():
            total.update(counts)
        return total


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
                message=(bad.get("message") or "").splitlines()[0][:300] if bad.get("message") else "",
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
    """Merge the result folders of several shards (or hosts) into one :class:`Report`."""
    report = Report()
    for folder in shard_dirs:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a results folder")
        run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
        host = run.get("host", folder.name)
        report.runs.append({"folder": str(folder), **run})
        summary = folder / "summary.json"
        for row in json.loads(summary.read_text()) if summary.exists() else []:
            key = _key(row)
            report.matrix.setdefault(key, Counter()).update({k: int(row.get(k, 0)) for k in OUTCOMES})
            report.skip_reasons.setdefault(key, Counter()).update(row.get("skip_reasons", {}))
        for path in sorted(folder.glob("device-*.json")):
            record = json.loads(path.read_text())
            if record.get("name"):
                report.devices.append({"host": host, **record})
        for path in sorted(folder.glob("expected-*.json")):
            report.expected.update(json.loads(path.read_text()))
        for path in sorted(folder.glob("*.xml")):
            for failure in read_junit(path, host):
                fixed = any(m in failure.message for m in FIXED_MARKERS)
                (report.fixed if fixed else report.failures).append(failure)
    return report


def _md_escape(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report) -> str:
    """The report as Markdown (for CI logs)."""
    total = report.totals()
    out = ["# fp4-conformance nightly report", ""]
    out.append(
        f"{len(report.runs)} shard(s); " + ", ".join(f"{total.get(k, 0)} {k}" for k in OUTCOMES) + f"; "
        f"{len(report.failures)} failing test(s), {len(report.fixed)} fixed-bug alert(s)."
    )
    out += ["", "## Contract x backend x hardware", ""]
    out.append("| contract | backend | hardware | " + " | ".join(OUTCOMES) + " |")
    out.append("|---|---|---|" + "---|" * len(OUTCOMES))
    for key in sorted(report.matrix):
        counts = report.matrix[key]
        out.append(
            "| " + " | ".join(map(_md_escape, key)) + " | " + " | ".join(str(counts[k]) for k in OUTCOMES) + " |"
        )
    sections = (("Failures", report.failures), ("Fixed-bug alerts (update the known-failure ledger)", report.fixed))
    for title, failures in sections:
        out += ["", f"## {title}", ""]
        if not failures:
            out.append("none")
        for f in failures:
            out.append(f"- `{f.nodeid}` on {f.host}: {_md_escape(f.message)}")
            if f.config:
                out.append(f"  - config: `{f.config}`")
            if f.reproduce:
                out.append(f"  - reproduce: `{f.reproduce}`")
    out += ["", "## Expected failures (known upstream bugs)", ""]
    out += [f"- {link}: {n} examples" for link, n in sorted(report.expected.items())] or ["none"]
    out += ["", "## Hosts and devices", ""]
    for run in report.runs:
        versions = ", ".join(f"{k} {v}" for k, v in run.get("versions", {}).items())
        out.append(
            f"- {run.get('host', '?')}: shard {run.get('shard') or 'all'}, subject {run.get('subject', '?')}, "
            f"profile {run.get('profile', '?')}, finished {run.get('finished', '?')} ({versions})"
        )
    for d in report.devices:
        out.append(
            f"  - {d['host']} worker {d['worker']}: CUDA_VISIBLE_DEVICES={d.get('CUDA_VISIBLE_DEVICES')} "
            f"{d.get('name')} {d.get('uuid')}"
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


def to_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    e = html.escape
    total = report.totals()
    red = bool(report.failures or report.fixed)
    badge = ("red", "RED") if red else ("green", "GREEN")
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>fp4-conformance nightly report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>fp4-conformance nightly report <span class='badge {badge[0]}'>{badge[1]}</span></h1>",
        f"<p>{len(report.runs)} shard(s): "
        + ", ".join(f"{total.get(k, 0)} {k}" for k in OUTCOMES)
        + f". {len(report.failures)} failing test(s), {len(report.fixed)} fixed-bug alert(s), "
        f"{sum(report.expected.values())} expected failure example(s).</p>",
        "<h2>Contract × backend × hardware</h2><table><tr><th>contract</th><th>backend</th><th>hardware</th>",
        *(f"<th>{k}</th>" for k in OUTCOMES),
        "<th>skip reasons</th></tr>",
    ]
    for key in sorted(report.matrix):
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
        parts.append(f"<h2>{e(title)} <span class='badge {color}'>{len(failures)}</span></h2>")
        if not failures:
            parts.append("<p>none</p>")
            continue
        parts.append("<ul>")
        for f in failures:
            parts.append(f"<li><code>{e(f.nodeid)}</code> <small>on {e(f.host)}</small><br>{e(f.message)}")
            if f.config:
                parts.append(f"<br>config: <code>{e(f.config)}</code>")
            if f.reproduce:
                parts.append(f"<br>reproduce: <code>{e(f.reproduce)}</code>")
            parts.append("</li>")
        parts.append("</ul>")
    parts.append("<h2>Expected failures (known upstream bugs)</h2>")
    if report.expected:
        parts.append("<table><tr><th>upstream bug</th><th>examples</th></tr>")
        for link, n in sorted(report.expected.items()):
            target = link if link.startswith("http") else None
            label = f"<a href='{e(target)}'>{e(link)}</a>" if target else e(link)
            parts.append(f"<tr><td>{label}</td><td class=n>{n}</td></tr>")
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
        "expected": dict(report.expected),
        "runs": report.runs,
        "devices": report.devices,
    }
    (out / "summary.json").write_text(json.dumps(merged, indent=2))
    return md, page


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.md, report.html and summary.json")
    parser.add_argument("shards", type=Path, nargs="+", help="the --results folders of the shards")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any shard failed or a known bug is fixed")
    args = parser.parse_args(argv)
    report = merge(args.shards)
    md, _ = write(report, args.out)
    sys.stdout.write(md.read_text())
    return 1 if args.strict and (report.failures or report.fixed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
