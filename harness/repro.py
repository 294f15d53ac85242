"""Reproductions: a one-line command and a standalone script for every failing example.

Properties are written as *checks*: ``check(config, backend, policy)`` functions decorated with
:func:`check`, run from the Hypothesis test through :func:`run_check`. On failure the exception
gets a note with the one-line command (``python -m harness.repro ...``) and carries its
:class:`Reproduction`, so the plugin writes the script of the example Hypothesis reports
(:func:`reported_reproduction`; when several pinned examples fail, that is the first of them,
not the last one run). Before a GPU kernel check runs, its reproduction is written to
an in-flight file, so a worker killed by a device fault still leaves it behind.

Usage: ``python -m harness.repro MODULE:CHECK --subject NAME [--backend NAME] --config JSON``.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import currently_in_test_context, event, note, target

from contracts.errors import LibraryUnavailable

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Reproduction:
    """Everything needed to rerun one example outside pytest and Hypothesis."""

    check: str
    subject: str
    backend: str | None
    config: dict[str, Any]

    def command(self) -> str:
        parts = ["python", "-m", "harness.repro", self.check, "--subject", self.subject]
        if self.backend:
            parts += ["--backend", self.backend]
        parts += ["--config", json.dumps(self.config, sort_keys=True)]
        return " ".join(shlex.quote(p) for p in parts)

    def script(self, nodeid: str) -> str:
        return (
            f'"""Reproduction of {nodeid} (subject {self.subject}).\n\n'
            f"Run from anywhere: python {{this file}}; it raises as the failing example did.\n"
            f'"""\n\nimport sys\n\nsys.path.insert(0, {str(ROOT)!r})\n\n'
            "from harness.repro import Reproduction, reproduce\n\n"
            f"reproduce(Reproduction(\n    check={self.check!r},\n    subject={self.subject!r},\n"
            f"    backend={self.backend!r},\n    config={self.config!r},\n))\n"
        )


@dataclass
class Context:
    """Set by the plugin around each test call."""

    nodeid: str = ""
    subject: str = "builtin"
    inflight_dir: Path | None = None
    known_failures: tuple[Any, ...] = ()


@dataclass
class NodeStats:
    """Per-test bookkeeping for the benchmark: examples run, and when the first failure came."""

    examples: int = 0
    seconds: float = 0.0  # wall time from the first example to the last one's end
    started: float = 0.0
    first_failure_example: int | None = None
    first_failure_seconds: float | None = None
    counterexample: str | None = None


class KnownFailureFixed(AssertionError):
    """A configuration listed as a known upstream bug no longer fails: the ledger needs updating."""


CONTEXT = Context()
LAST_FAILURE: dict[str, Reproduction] = {}
STATS: dict[str, NodeStats] = {}
EXPECTED_FAILURES: dict[str, int] = {}


def record_event(text: str) -> None:
    """``hypothesis.event`` inside a Hypothesis test, nothing in a standalone reproduction."""
    if currently_in_test_context():
        event(text)


def record_target(value: float, label: str) -> None:
    """``hypothesis.target`` inside a Hypothesis test (steers generation towards large ``value``)."""
    if currently_in_test_context():
        target(value, label=label)


def check(contract: str, config: type) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark ``fn(config, backend, policy)`` as a property check of ``contract`` on ``config``."""

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        fn.__fp4_check__ = (contract, config)  # type: ignore[attr-defined]
        return fn

    return deco


def run_check(
    fn: Callable[..., None], config: Any, backend: enum.Enum | None, policy: Any, kernel: bool = False
) -> None:
    """Run one example of a property check, with reproduction bookkeeping around it.

    A check that needs a library or hardware this machine lacks raises ``LibraryUnavailable``;
    the test is then skipped with that reason (markers gate most of them before they start).
    """
    repro = Reproduction(
        f"{fn.__module__}:{fn.__name__}",
        CONTEXT.subject,
        backend.value if backend else None,
        config.to_dict(),
    )
    describe = getattr(config, "describe", None)
    summary = describe() if describe else str(config)
    if currently_in_test_context():
        note(f"config: {summary}")
        note(f"reproduce: {repro.command()}")
    stats = STATS.setdefault(CONTEXT.nodeid, NodeStats(started=time.perf_counter()))
    stats.examples += 1
    inflight = _write_inflight(repro) if kernel else None
    contract = fn.__fp4_check__[0]
    known = next((k for k in CONTEXT.known_failures if k.matches(contract, fn.__name__, repro.backend, config)), None)
    try:
        if known is not None:
            _expect_failure(fn, config, backend, policy, known)
        else:
            fn(config, backend, policy)
    except LibraryUnavailable as exc:
        pytest.skip(str(exc))
    except BaseException as exc:
        LAST_FAILURE[CONTEXT.nodeid] = repro
        stats.counterexample = summary
        if stats.first_failure_example is None:
            stats.first_failure_example = stats.examples
            stats.first_failure_seconds = time.perf_counter() - stats.started
        if hasattr(exc, "add_note"):
            exc.add_note(f"reproduce: {repro.command()}")
        exc.__fp4_reproduction__ = repro  # type: ignore[attr-defined]
        raise
    finally:
        stats.seconds = time.perf_counter() - stats.started
        if inflight is not None:
            inflight.unlink(missing_ok=True)


def reported_reproduction(exc: BaseException | None) -> Reproduction | None:
    """The reproduction of the failure Hypothesis raised: ``exc``'s own, or for an exception group
    (several failing examples) that of its first member, in the order Hypothesis ran them."""
    if exc is None:
        return None
    found = getattr(exc, "__fp4_reproduction__", None)
    if found is None:  # an exception group (``exceptions``: its members)
        found = next((r for e in getattr(exc, "exceptions", ()) if (r := reported_reproduction(e)) is not None), None)
    return found


def _expect_failure(fn: Callable[..., None], config: Any, backend: Any, policy: Any, known: Any) -> None:
    """Run a check that a known upstream bug makes fail; raise if it unexpectedly passes."""
    try:
        fn(config, backend, policy)
    except Exception:  # noqa: BLE001 - the listed bug may raise anything
        EXPECTED_FAILURES[known.link] = EXPECTED_FAILURES.get(known.link, 0) + 1
        record_event(f"expected failure: {known.link}")
        return
    raise KnownFailureFixed(
        f"known upstream bug {known.link} ({known.reason}) no longer fails here: "
        "remove it from the subject's known_failures"
    )


def _write_inflight(repro: Reproduction) -> Path | None:
    if CONTEXT.inflight_dir is None:
        return None
    CONTEXT.inflight_dir.mkdir(parents=True, exist_ok=True)
    path = CONTEXT.inflight_dir / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json"
    path.write_text(
        json.dumps({"nodeid": CONTEXT.nodeid, "command": repro.command(), "script": repro.script(CONTEXT.nodeid)})
    )
    return path


def write_script(results: Path, nodeid: str, repro: Reproduction) -> Path:
    """Write the standalone reproduction script for ``nodeid``; returns its path."""
    folder = results / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() else "_" for c in nodeid.split("::")[-1])[:80]
    path = folder / f"{name}.py"
    path.write_text(repro.script(nodeid))
    return path


def _resolve_backend(contract: str, name: str | None) -> enum.Enum | None:
    from subjects.registry import backends

    if name is None:
        return None
    for backend in backends(contract):
        if backend.value == name:
            return backend
    raise SystemExit(f"unknown backend {name!r} for contract {contract}")


def reproduce(repro: Reproduction) -> None:
    """Rerun the check of ``repro`` once, raising exactly as the failing example did."""
    from subjects.registry import resolve

    module, _, name = repro.check.partition(":")
    fn = getattr(importlib.import_module(module), name)
    contract, config_type = fn.__fp4_check__
    policy = resolve(repro.subject).policy(contract)
    if policy is None:
        raise SystemExit(f"subject {repro.subject} does not implement contract {contract}")
    fn(config_type.from_dict(repro.config), _resolve_backend(contract, repro.backend), policy)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.repro", description=__doc__.splitlines()[0])
    parser.add_argument("check", help="MODULE:CHECK, e.g. conformance.test_nvfp4_moe:check_padding_invariance")
    parser.add_argument("--subject", default="builtin")
    parser.add_argument("--backend")
    parser.add_argument("--config", required=True, help="JSON configuration printed by the failing test")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    reproduce(Reproduction(args.check, args.subject, args.backend, json.loads(args.config)))
    print("passed: the check did not fail for this configuration")


if __name__ == "__main__":
    main()
