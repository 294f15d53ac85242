"""Re-run the engine findings' reproductions: ``python -m harness.findings [--engine sglang|vllm] [--write]``.

Each folder of ``findings/`` holds one upstream defect: ``repro.py`` (standalone: it imports only the engine,
torch and the kernel library), ``output.txt`` (what it printed, with versions and date) and ``report.md`` (the text
for the engine's issue tracker). The folder name starts with the engine it is about (``sglang-...``,
``vllm-...``). A reproduction's exit status is its verdict:

* 1, with a line holding :data:`MARK` (the engine's own error or the wrong pairing follows it): the defect
  reproduces (``still reproduces``); 1 without it is Python's own exit status for an uncaught exception;
* 0: it does not (``no longer reproduces``): the engine fixed it, so the finding, its ledger entry and the docs
  need updating;
* anything else: the script broke (``broken``), for example an engine refactor moved a function it calls.

Each script runs with this interpreter (the engine's environment), as many at a time as there are usable cores
(``--jobs``; each is one process, mostly importing the engine); their lines print in name order. The command
fails (exit 1) when a reproduction no longer reproduces or breaks; a finding whose engine is not installed here
is reported as ``not run`` and fails the command only when that engine was asked for (``--engine``).
``--write`` rewrites each run folder's ``output.txt``.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from harness.workers import usable_cores

FINDINGS = Path(__file__).resolve().parents[1] / "findings"
"""The findings folders, one per upstream defect."""

ENGINES = ("sglang", "vllm")
"""Engines a finding can be about: a folder's name starts with one of them and a hyphen."""

MARK = "REPRODUCES"
"""What a reproduction prints before the evidence, on the run that exits 1."""

SCRIPT = "repro.py"
OUTPUT = "output.txt"
TIMEOUT_S = 600.0
"""Seconds one reproduction may run (the SGLang ones take under a minute on two CPU cores)."""


class Status(enum.Enum):
    REPRODUCES = "still reproduces"
    FIXED = "no longer reproduces"
    BROKEN = "broken"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class Finding:
    """One folder of ``findings/``: its ``name`` and the ``engine`` it is about."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def engine(self) -> str:
        prefix = self.name.split("-", 1)[0]
        if prefix not in ENGINES:
            raise ValueError(f"finding folder {self.folder} does not start with an engine name ({', '.join(ENGINES)})")
        return prefix


@dataclass(frozen=True)
class Outcome:
    """A reproduction's verdict: its status, the script's exit code (None when not run) and what it printed."""

    finding: Finding
    status: Status
    returncode: int | None
    output: str

    def line(self) -> str:
        detail = f" (exit {self.returncode})" if self.status is Status.BROKEN else ""
        return f"{self.finding.name}: {self.status.value}{detail}"


def findings(root: Path = FINDINGS) -> list[Finding]:
    """Every finding folder under ``root`` (a folder holding :data:`SCRIPT`), sorted by name. Raises
    ``ValueError`` for a folder without a script or not named for an engine."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    for folder in folders:
        if not (folder / SCRIPT).is_file():
            raise ValueError(f"finding folder {folder} has no {SCRIPT}")
    found = [Finding(folder) for folder in folders]
    for finding in found:
        _ = finding.engine  # a folder not named for an engine is an error, before anything runs
    return found


def engine_installed(engine: str) -> bool:
    """Whether ``engine`` is importable by this interpreter (looked up, not imported)."""
    return importlib.util.find_spec(engine) is not None


def status_of(returncode: int, output: str) -> Status:
    """A reproduction's exit code and output read as its verdict (module docstring)."""
    if returncode == 1 and MARK in output:
        return Status.REPRODUCES
    return Status.FIXED if returncode == 0 else Status.BROKEN


def run(finding: Finding, python: str = sys.executable, timeout: float = TIMEOUT_S) -> Outcome:
    """Run ``finding``'s script with ``python`` in its folder, stdout and stderr together."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(
            [python, SCRIPT], cwd=finding.folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return Outcome(finding, Status.BROKEN, -1, f"{out}\n(timed out after {timeout:g} s)\n")
    return Outcome(finding, status_of(done.returncode, done.stdout), done.returncode, done.stdout)


def write_output(outcome: Outcome) -> None:
    """Rewrite the finding's ``output.txt``: the command, the exit status and what the script printed."""
    header = f"$ python {SCRIPT}  # exit status {outcome.returncode}: {outcome.status.value}\n"
    (outcome.finding.folder / OUTPUT).write_text(header + outcome.output)


def failed(outcomes: Sequence[Outcome], requested: str | None) -> list[Outcome]:
    """The outcomes that fail the command: a reproduction that no longer reproduces or broke, and a finding not
    run because the ``requested`` engine is missing."""
    return [
        o
        for o in outcomes
        if o.status in (Status.FIXED, Status.BROKEN) or (o.status is Status.NOT_RUN and o.finding.engine == requested)
    ]


def run_all(
    root: Path = FINDINGS,
    engine: str | None = None,
    installed: Callable[[str], bool] = engine_installed,
    write: bool = False,
    echo: Callable[[str], None] = print,
    jobs: int = 1,
) -> list[Outcome]:
    """Run every finding of ``engine`` (None: of every engine) under ``root``, ``jobs`` scripts at a time,
    echoing each status line in name order; a finding whose engine is not ``installed`` is not run."""
    chosen = [f for f in findings(root) if engine is None or f.engine == engine]

    def outcome_of(finding: Finding) -> Outcome:
        if not installed(finding.engine):
            return Outcome(finding, Status.NOT_RUN, None, f"{finding.engine} is not installed for {sys.executable}")
        return run(finding)

    outcomes = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # threads: each waits on its own process
        for outcome in pool.map(outcome_of, chosen):
            if outcome.status is Status.NOT_RUN:
                echo(f"{outcome.line()} ({outcome.finding.engine} is not installed)")
            else:
                echo(outcome.line())
                if outcome.status is Status.BROKEN:
                    echo(outcome.output.rstrip())
                if write:
                    write_output(outcome)
            outcomes.append(outcome)
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.findings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES, help="run only this engine's findings (and fail if it is missing)")
    parser.add_argument("--findings", type=Path, default=FINDINGS, help="the findings folder (default: findings/)")
    parser.add_argument("--write", action="store_true", help="rewrite each run finding's output.txt")
    parser.add_argument(
        "--jobs", type=int, default=usable_cores(), help="scripts run at a time (default: the usable cores)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    outcomes = run_all(args.findings, args.engine, write=args.write, jobs=args.jobs)
    bad = failed(outcomes, args.engine)
    counts = {s: sum(o.status is s for o in outcomes) for s in Status}
    print(", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no findings")
    if bad:
        print("FAILED: " + "; ".join(o.line() for o in bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
