"""The suite's own files and commit, in a git checkout or in a copy without ``.git``.

An archive, a container layer or an sdist of the suite has no ``.git``, and it may lie inside
another git repository (a home folder, an image's build context): git, run there, answers for
that repository, listing none of the suite's files and naming its commit. So git is asked only
when the suite's root is git's top level; otherwise the files come from walking the tree (minus
the folders :data:`SKIPPED`, as ``.gitignore`` ignores them) and the commit is unknown (None).
An installed copy (``pip install .``) has ``site-packages`` as its root: no commit, and the
installed distribution's version names what ran (:func:`provenance`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "fp4-conformance"
"""The suite's distribution name (``pyproject.toml``)."""

SKIPPED = frozenset(
    {".git", ".device", ".whl", ".hypothesis", ".pytest_cache", ".ruff_cache", ".mypy_cache", "__pycache__"}
    | {"results", "build", "dist"}
)
"""Folders a walk skips (with ``.venv*`` and ``*.egg-info``): environments, caches, build outputs, results."""


def skipped(name: str) -> bool:
    """Whether a walk of the tree skips the folder ``name``."""
    return name in SKIPPED or name.startswith(".venv") or name.endswith(".egg-info")


def _git(args: list[str], root: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git(args: list[str], root: Path = ROOT) -> str | None:
    """The output of ``git ARGS`` in ``root`` when ``root`` is the top level of a git work tree;
    None when it is not (no ``.git``, or a folder inside another repository) or git fails."""
    top = _git(["rev-parse", "--show-toplevel"], root)
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return None
    return _git(args, root)


def commit(root: Path = ROOT) -> str | None:
    """The short commit of the checkout at ``root``, ``-dirty`` appended when tracked files differ from it
    (``git describe --dirty``'s mark); None when ``root`` is not a checkout."""
    out = git(["rev-parse", "--short", "HEAD"], root)
    if out is None or not out.strip():
        return None
    changed = git(["status", "--porcelain", "--untracked-files=no"], root)
    return out.strip() + ("-dirty" if changed else "")


@functools.cache
def provenance(root: Path = ROOT) -> str:
    """Which suite ran, for run records: ``commit abc1234`` in a checkout (editable installs
    included), else the installed distribution's version (``0.1.0``), else ``unknown``."""
    sha = commit(root)
    if sha is not None:
        return f"commit {sha}"
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def project_files(root: Path = ROOT) -> tuple[Path, ...]:
    """The suite's files: those git tracks in a checkout, else every file of the tree outside
    the :func:`skipped` folders (sorted, symbolic links to folders not followed)."""
    listed = git(["ls-files", "-z"], root)
    if listed is not None:
        return tuple(root / p for p in listed.split("\0") if p)
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not skipped(d))
        found += [Path(folder) / name for name in sorted(files)]
    return tuple(found)
