"""A copy of the suite without ``.git`` (an archive, a container layer, an sdist) lists its own
files, stamps no commit and passes its own self-tests, also when it lies inside another git
repository (:mod:`harness.checkout`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checkout import ROOT, commit, git, project_files
from tests import batch
from tests.test_plugin import in_parallel

GIT = ["git", "-c", "user.name=fp4", "-c", "user.email=fp4@example.com", "-c", "init.defaultBranch=main"]


def _repository(folder: Path) -> Path:
    """``folder`` as a git repository with one commit."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([*GIT, "init", "-q"], cwd=folder, check=True)
    subprocess.run([*GIT, "commit", "-q", "--allow-empty", "-m", "outer"], cwd=folder, check=True)
    return folder


def _write(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")


KEPT = ["a.py", "docs/x.md", ".ci/run", "pkg/results.py"]
SKIPPED = ["results/r.py", ".venv/lib/x.py", ".venv-vllm/y.py", "build/lib/b.py", "dist/d.txt", "pkg/__pycache__/c.py"]
SKIPPED += ["pkg.egg-info/PKG-INFO", ".hypothesis/h", ".device/z", ".pytest_cache/v", ".ruff_cache/r"]


def test_a_copy_inside_another_repository_walks_its_own_tree(tmp_path: Path) -> None:
    copy = _repository(tmp_path / "outer") / "copy"
    _write(copy, KEPT + SKIPPED)
    assert sorted(p.relative_to(copy).as_posix() for p in project_files(copy)) == sorted(KEPT)
    assert commit(copy) is None, "the enclosing repository's commit was taken for the copy's"
    assert git(["status"], copy) is None


def test_a_checkout_lists_what_git_tracks_and_its_commit(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo")
    _write(repo, ["tracked.py", "results/untracked.py"])
    subprocess.run([*GIT, "add", "tracked.py"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "one"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    assert project_files(repo) == (repo / "tracked.py",)
    assert commit(repo) == head.stdout.strip()
    (repo / "tracked.py").write_text("changed\n")
    assert commit(repo) == head.stdout.strip() + "-dirty", "a changed tree was stamped with the clean commit"


@pytest.mark.long(30)
def test_a_copy_without_git_passes_its_docs_self_tests_and_stamps_no_commit(tmp_path: Path) -> None:
    """The suite's files copied into a folder of another repository: ``tests/test_docs.py`` passes
    there, and ``bench.scaling`` records no commit."""
    copy = _repository(tmp_path / "outer") / "copy"
    for path in project_files(ROOT):
        if path.is_file():
            (copy / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy / path.relative_to(ROOT))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_XDIST_WORKER")}
    docs, host = in_parallel(
        lambda: batch.run(
            batch.Run(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/test_docs.py"], cwd=copy, env=env),
            tmp_path / "docs",
            300,
        ),
        lambda: subprocess.run(
            [sys.executable, "-c", "from bench import scaling; print(scaling.host()['commit'])"],
            cwd=copy, env=env, capture_output=True, text=True, timeout=300,
        ),
    )  # fmt: skip
    assert docs.returncode == 0, docs.stdout[-3000:] + docs.stderr[-2000:]
    assert host.returncode == 0 and host.stdout.strip() == "None", host.stdout + host.stderr[-2000:]
