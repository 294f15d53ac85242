"""The self-tests' one precondition: the suite's pytest plugins are installed as entry points.

Many self-tests run pytest as a user would, from a folder outside the checkout (a temporary folder, an installed
copy's working folder). There the root ``conftest.py`` does not load the plugins; only the ``pytest11`` entry points
of an installed suite (``pip install -e .``, as ``scripts/install-cpu.sh`` does) do. A checkout that is only on
``PYTHONPATH`` would fail those self-tests with unrelated errors (an unknown ``--results`` option), so the run stops
before its first test with one line that says what to do.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from tests import batch

PLUGINS = ("harness.early", "harness.plugin", "harness.workers", "harness.scheduling")
"""The suite's ``pytest11`` entry points (``pyproject.toml``)."""


def missing_plugins(registered: set[str]) -> list[str]:
    """The names of :data:`PLUGINS` not among the ``registered`` ``pytest11`` entry points, in order."""
    return [name for name in PLUGINS if name not in registered]


def pytest_configure(config: pytest.Config) -> None:
    """Refuse the run (before xdist starts its workers) when the entry points are missing."""
    missing = missing_plugins({ep.name for ep in entry_points(group="pytest11")})
    if missing:
        raise pytest.UsageError(
            f"the self-tests need the suite installed (its pytest11 entry points {', '.join(missing)} are missing: "
            "runs from other folders would not load the plugins); run `python -m pip install -e .` in the checkout"
        )


def pytest_sessionfinish() -> None:
    """Stop this process's run server for the self-tests' pytest runs (:mod:`tests.batch`), if it started one."""
    batch.stop_server()
