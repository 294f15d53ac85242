"""Reproductions: a one-line command and a standalone script for every failing example.

A :class:`Reproduction` names a check (``MODULE:CHECK``), the subject, the backend and the drawn
configuration as JSON, plus the folder an external subject was imported from. The property
runner (:mod:`harness.runner`) attaches its command to every failure; the plugin writes its
script under ``RESULTS/repro/SUBJECT/``. Both work on another machine with the suite's
checkout as the current directory (or the suite installed): nothing in them names the folder
the failing run was started from.

Usage: ``python -m harness.repro MODULE:CHECK --subject NAME [--subject-path DIR] [--backend NAME]
--config JSON``. It calls the bare check once (no Hypothesis, no pytest) and raises exactly as
the failing example did.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.util
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.inputs import guard_inputs

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Reproduction:
    """Everything needed to rerun one example outside pytest and Hypothesis.

    ``subject_path`` is the ``sys.path`` folder an external subject (``module:attribute``) was
    imported from: relative to the checkout when it lies inside it, else as given; None for
    named subjects and installed packages.
    """

    check: str
    subject: str
    backend: str | None
    config: dict[str, Any]
    subject_path: str | None = None

    def argv(self) -> list[str]:
        """The arguments of ``python -m harness.repro`` (see :func:`parse`)."""
        parts = [self.check, "--subject", self.subject]
        if self.subject_path:
            parts += ["--subject-path", self.subject_path]
        if self.backend:
            parts += ["--backend", self.backend]
        return [*parts, "--config", json.dumps(self.config, sort_keys=True)]

    def command(self) -> str:
        """The one-line shell command, run from the suite's checkout by the running interpreter."""
        return shell_command(["-m", "harness.repro", *self.argv()])

    def script(self, nodeid: str) -> str:
        """A standalone script: ``python THIS_FILE`` from the checkout raises as the example did.

        The test id and the arguments are embedded as Python literals (``repr``), never pasted
        into the docstring or the code: a subject spec or parameter id holding quotes or triple quotes
        stays data.
        """
        return (
            '"""Reproduction of one failing example of the fp4-conformance suite.\n\n'
            "Run it from the fp4-conformance checkout (or with the suite installed): python path/to/this_file.py\n"
            'It raises as the failing example did."""\n\n'
            "import os\nimport sys\n\nsys.path.insert(0, os.getcwd())\n\n"
            "from harness.repro import main\n\n"
            f"TEST = {nodeid!r}\n"
            f"SUBJECT = {self.subject!r}\n\n"
            f"main({self.argv()!r})\n"
        )

    def script_name(self, nodeid: str) -> str:
        """A file name unique per test (module, name and parameters) within one subject's folder."""
        module, _, test = nodeid.partition("::")
        return slug(f"{Path(module).stem}__{test}")[:120] + ".py"


def shell_command(args: list[str]) -> str:
    """``args`` run by this interpreter (``sys.executable``, not whatever ``python`` is on the
    reader's ``PATH``), each word shell-quoted: pasted into a POSIX shell it runs as given."""
    return shlex.join([sys.executable, *args])


def slug(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``-``, ``.`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def subject_folder(results: Path, subject: str) -> Path:
    """Where the scripts of ``subject``'s failures go: ``RESULTS/repro/<subject slug>`` (its first
    120 characters: a folder name has at most 255 bytes)."""
    return results / "repro" / slug(subject)[:120]


def write_script(results: Path, nodeid: str, repro: Reproduction, suffix: str = "") -> Path:
    """Write the standalone reproduction script of ``nodeid``; returns its path."""
    folder = subject_folder(results, repro.subject)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / repro.script_name(nodeid)
    if suffix:
        path = path.with_name(f"{path.stem}-{suffix}.py")
    path.write_text(repro.script(nodeid), encoding="utf-8")
    return path


def clean_scripts(results: Path, subject: str) -> None:
    """Remove the scripts an earlier run of ``subject`` left (other subjects' folders are kept)."""
    for stale in subject_folder(results, subject).glob("*.py"):
        stale.unlink()


def import_folder(spec: str, root: Path = ROOT) -> str | None:
    """The ``sys.path`` folder that an external subject ``module:attribute`` is imported from.

    Relative to ``root`` (the checkout) when inside it; None for registered names, modules the
    checkout itself provides, and installed packages (site-packages), which import anywhere.
    """
    if ":" not in spec:
        return None
    top = spec.partition(":")[0].split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        return None
    origin = Path(found.origin).resolve()
    folder = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    if folder.name in ("site-packages", "dist-packages"):
        return None
    try:
        rel = folder.relative_to(root.resolve())
    except ValueError:
        return str(folder)
    return None if rel == Path() else rel.as_posix()


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

    if repro.subject_path:
        sys.path.insert(0, repro.subject_path)
    module, _, name = repro.check.partition(":")
    fn = getattr(importlib.import_module(module), name)
    contract, config_type = fn.__fp4_check__
    policy = guard_inputs(resolve(repro.subject).policy(contract))
    if policy is None:
        raise SystemExit(f"subject {repro.subject} does not implement contract {contract}")
    fn(config_type.from_dict(repro.config), _resolve_backend(contract, repro.backend), policy)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m harness.repro``."""
    p = argparse.ArgumentParser(prog="python -m harness.repro", description=__doc__.splitlines()[0])
    p.add_argument("check", help="MODULE:CHECK, e.g. conformance.test_nvfp4_moe:check_padding_invariance")
    p.add_argument("--subject", default="builtin")
    p.add_argument("--subject-path", help="folder to import an external subject from (added to sys.path)")
    p.add_argument("--backend")
    p.add_argument("--config", required=True, help="JSON configuration printed by the failing test")
    return p


def parse(argv: list[str]) -> Reproduction:
    """The :class:`Reproduction` a command line names (the inverse of :meth:`Reproduction.argv`)."""
    args = parser().parse_args(argv)
    return Reproduction(args.check, args.subject, args.backend, json.loads(args.config), args.subject_path)


def main(argv: list[str] | None = None) -> None:
    repro = parse(sys.argv[1:] if argv is None else argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    reproduce(repro)
    print("passed: the check did not fail for this configuration")


if __name__ == "__main__":
    main()
