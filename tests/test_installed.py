"""An installed copy of the suite (``pip install .``, no ``-e``) runs from any folder, as an engine's CI runs it.

pytest loads the suite's plugins through its ``pytest11`` entry points (``pyproject.toml``), named for their
modules so that the root ``conftest.py``'s ``pytest_plugins`` finds them registered in a checkout; the
properties run with ``--pyargs conformance``; an external subject imports from the caller's folder, and its
reproduction line runs as pasted from there. Here the copy is installed with ``--target`` into a folder
that stands in for ``site-packages`` (``PYTHONPATH`` names it, the checkout is not on ``sys.path``), its pytest runs
go through :mod:`tests.batch` and the pasted reproduction runs in a shell;
``scripts/check-installed.sh`` does the same in a fresh venv, with every property.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.checkout import ROOT, project_files
from tests import batch

BAD_SUBJECT = "bad-fse-after-replicate"  # a known-bad shared-expert subject: its properties run in seconds

EXTERNAL = f'''"""A subject of the caller's own, imported from the folder pytest runs in."""

from subjects.registry import named_subjects

SUBJECT = named_subjects()["{BAD_SUBJECT}"]
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``site-packages`` stand-in holding ``pip install .`` of the checkout's tracked files."""
    source, site = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for path in project_files():
        (source / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, source / path.relative_to(ROOT))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile"]
    if importlib.util.find_spec("setuptools") is not None:  # build with it (venvs of Python >= 3.12 lack it)
        pip.append("--no-build-isolation")
    done = subprocess.run([*pip, "--target", str(site), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def _version(site: Path) -> str:
    """The installed distribution's version, from its ``fp4_conformance-VERSION.dist-info`` folder."""
    (info,) = site.glob("fp4_conformance-*.dist-info")
    return info.name.removeprefix("fp4_conformance-").removesuffix(".dist-info")


def _pytest(args: list[str], cwd: Path, site: Path, out: Path) -> batch.Ran:
    """``python -m pytest ARGS`` from ``cwd`` with the copy in ``site`` on ``PYTHONPATH``, as a run of
    :mod:`tests.batch` (the suite's modules are imported afresh, from where ``sys.path`` finds them), outputs in
    ``out``."""
    return batch.run(batch.Run(args, cwd=cwd, env=batch.suite_env(PYTHONPATH=str(site))), out)


def _run(command: list[str] | str, cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "FP4_PROFILE": "ci"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(command, cwd=cwd, env=env, shell=isinstance(command, str), capture_output=True, text=True)


@pytest.mark.long(45)
def test_an_installed_copy_runs_an_external_subject_and_its_reproduction_from_any_folder(
    installed: Path, tmp_path: Path
) -> None:
    (tmp_path / "my_subject.py").write_text(EXTERNAL, encoding="utf-8")
    imported = _run(
        [sys.executable, "-c", "import conformance, harness.plugin as p; print(p.__file__)"], tmp_path, installed
    )
    assert imported.stdout.strip() == str(installed / "harness" / "plugin.py"), imported.stderr
    pytest_args = ["--pyargs", "conformance.test_shared_expert", "-p", "no:cacheprovider", "--strict-markers"]
    ran = _pytest([*pytest_args, "--subject", "my_subject:SUBJECT"], tmp_path, installed, tmp_path / "run")
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert f"fp4-conformance-{_version(installed)}" in ran.stdout  # the plugins came from the entry points
    run = json.loads((tmp_path / "results" / "run.json").read_text())  # the results folder is the caller's
    assert run["versions"]["fp4-conformance"] == _version(installed)  # no checkout: the installed version
    line = next(s for s in ran.stdout.splitlines() if s.startswith(f"{sys.executable} -m harness.repro "))
    assert f"--subject-path {tmp_path}" in line
    script = next(s for s in ran.stdout.splitlines() if s.startswith("script: ")).removeprefix("script: ")
    for command in (line, f"{sys.executable} {script}"):
        again = _run(command, tmp_path, installed)
        assert again.returncode == 1 and "AssertionError" in again.stderr, again.stdout + again.stderr[-2000:]


@pytest.mark.long(20)
def test_a_checkout_with_the_entry_points_installed_registers_each_plugin_once(installed: Path, tmp_path: Path) -> None:
    """In the checkout the entry points import the checkout's modules (the current folder comes first, as in an
    editable install), and the root conftest.py's ``pytest_plugins`` skips the names already registered."""
    args = ["conformance/test_shared_expert.py", "--collect-only", "-p", "no:cacheprovider"]
    args += ["--results", str(tmp_path / "results")]
    ran = _pytest(args, ROOT, installed, tmp_path / "run")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert f"fp4-conformance-{_version(installed)}" in ran.stdout


def test_a_copy_seeded_from_the_dev_venv_drops_what_only_the_dev_extra_installs() -> None:
    """``scripts/extra_only.py dev`` names the dev extra's packages (its ``hypothesis[redis]`` included) and none
    that ``pip install .`` needs: ``scripts/install-cpu.sh --copy`` removes them from a seeded venv."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        requires("fp4-conformance")
    except PackageNotFoundError:
        pytest.skip("the suite is not installed in this interpreter (scripts/install-cpu.sh)")
    spec = importlib.util.spec_from_file_location("extra_only", ROOT / "scripts" / "extra_only.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dev_only = module.extra_only("dev")
    assert {"ml-dtypes", "ruff", "redis"} <= set(dev_only), dev_only
    assert not {"torch", "numpy", "hypothesis", "pytest", "pytest-xdist"} & set(dev_only), dev_only


@pytest.mark.long(5)
def test_a_checkout_without_the_entry_points_is_refused_before_the_first_test(tmp_path: Path) -> None:
    """A self-test run whose suite is only on ``PYTHONPATH`` names the missing entry points (``tests/conftest.py``)."""
    from tests.conftest import PLUGINS, missing_plugins

    assert missing_plugins(set(PLUGINS)) == []
    assert missing_plugins({"harness.workers", "xdist.plugin"}) == [
        "harness.early",
        "harness.plugin",
        "harness.scheduling",
    ]
    hide = (  # the interpreter sees none of the suite's entry points, as with the checkout only on PYTHONPATH
        "import importlib.metadata as m, sys, pytest; every = m.entry_points; "
        "m.entry_points = lambda **kw: [e for e in every(**kw) if not e.value.startswith('harness.')]; "
        "sys.exit(pytest.main(sys.argv[1:]))"
    )
    args = ["-p", "no:cacheprovider", "-n", "2", "--results", str(tmp_path / "results"), "tests/test_sizes.py"]
    result = subprocess.run([sys.executable, "-c", hide, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout[-2000:] + result.stderr[-2000:]
    assert "INTERNALERROR" not in result.stdout + result.stderr
    assert (
        "entry points harness.early, harness.plugin, harness.workers, harness.scheduling are missing" in result.stderr
    )
