"""Hypothesis settings profiles: ``ci``, ``nightly``, ``triage`` (and ``dev``, the default locally; ``smoke``).

Selected by ``--hypothesis-profile NAME`` or the environment variable ``FP4_PROFILE``; an
unknown name is a usage error. Each profile also sets the per-example time limit
(:data:`TIME_LIMITS`, overridden by ``--example-time-limit``): an example running longer fails,
naming its test and its reproduction.

* ``ci``: derandomized, 25 examples, no database, quick on 2 CPU cores.
* ``smoke``: derandomized, the pins and 3 generated examples, no database: shows that every property runs
  where the suite was installed (``scripts/check-installed.sh``), not a search.
* ``nightly``: 500 examples, deadline off for GPU kernels, example database at ``--fp4-db`` /
  ``FP4_DB`` (default ``.hypothesis/fp4-nightly``; ``redis://...`` shares it across a fleet,
  :mod:`harness.database`) so failures replay the next night, on every host.

An explicit ``--fp4-db`` / ``FP4_DB`` gives every profile but ``ci`` that database (``bench``
then saves what its search finds, for a triage host to replay); ``ci`` is derandomized and
refuses one.
* ``bench``: no database and no ``@example`` pins, up to 200 generated examples per property: measures how
  fast generation alone finds a bug (``python -m bench``).
* ``replay``: only replays the example database (``--fp4-db``), no pins, no generation: a
  pre-merge run that re-checks the fleet's stored failures (with ``--fp4-db-readonly``).
* ``triage``: replays the database and ``@example`` pins first (explicit + reuse phases run
  before generation), stops at the first bug, verbose, statistics printed.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

PROFILES = ("ci", "smoke", "nightly", "triage", "dev", "bench", "replay")
NO_DATABASE_PROFILES = ("ci", "smoke")  # derandomized: an example database would change nothing
DATABASE_PROFILES = ("nightly", "triage", "replay")  # profiles that use the example database without --fp4-db
DEFAULT_DB = ".hypothesis/fp4-nightly"

TIME_LIMITS: dict[str, float] = {
    "ci": 300,
    "smoke": 300,
    "dev": 300,
    "bench": 300,
    "nightly": 1800,
    "triage": 1800,
    "replay": 1800,
}
"""Per-example time limit in seconds. Generous: the first example of a kernel property may
compile a JIT module (minutes for FlashInfer on a cold cache) and the first vLLM example imports
vLLM; a hang is caught all the same, with its reproduction, instead of running until CI's limit."""
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


def register_profiles(database_path: str | None = None) -> None:
    """Register the suite's profiles (re-registering updates the database path)."""
    db = DirectoryBasedExampleDatabase(database_path or os.environ.get("FP4_DB", DEFAULT_DB))
    # Every profile derives from Hypothesis's own ``default`` profile, not from the profile loaded at import:
    # under a ``CI`` variable Hypothesis loads its ``ci`` profile (derandomized), which would make ``nightly``
    # draw the same examples every night.
    common = dict(
        parent=settings.get_profile("default"), deadline=None, print_blob=True, suppress_health_check=_SUPPRESS
    )
    settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **common)
    settings.register_profile("smoke", max_examples=3, derandomize=True, database=None, **common)
    settings.register_profile("dev", max_examples=50, **common)
    settings.register_profile("nightly", max_examples=500, database=db, **common)
    settings.register_profile(
        "bench", max_examples=200, database=None, phases=(Phase.generate, Phase.target, Phase.shrink), **common
    )
    settings.register_profile("replay", database=db, phases=(Phase.reuse,), report_multiple_bugs=False, **common)
    settings.register_profile(
        "triage",
        max_examples=200,
        database=db,
        report_multiple_bugs=False,
        verbosity=Verbosity.verbose,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        **common,
    )


def with_database(name: str, database: ExampleDatabase | None, *, explicit: bool) -> str:
    """The profile to load: ``name`` with ``database`` (when given), registered as ``name``.

    ``explicit`` (the user named a database) with one of :data:`NO_DATABASE_PROFILES` is a ValueError.
    """
    if database is None:
        return name
    if explicit and name in NO_DATABASE_PROFILES:
        raise ValueError(f"the {name} profile is derandomized and uses no example database; drop --fp4-db or FP4_DB")
    settings.register_profile(name, parent=settings.get_profile(name), database=database)
    return name


def selected_profile(option: str | None, env: dict[str, str] = os.environ) -> str:
    """Profile name from the command line, else ``FP4_PROFILE``, else ``ci`` under CI, else ``dev``."""
    name = option or env.get("FP4_PROFILE") or ("ci" if env.get("CI") else "dev")
    if name not in PROFILES:
        source = "--hypothesis-profile" if option else "FP4_PROFILE" if env.get("FP4_PROFILE") else "profile"
        raise ValueError(f"unknown Hypothesis profile {name!r} ({source}); choose one of {', '.join(PROFILES)}")
    return name


def check_writable_folder(path: str | Path) -> None:
    """Create ``path`` if needed and prove a file can be written in it; raise ``OSError`` saying why not.

    Used before the first test for ``--results``, so a run that could not record its verdict
    stops at once instead of at the end (the example database is checked by :mod:`harness.database`).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{uuid.uuid4().hex}"
    probe.write_text("")
    probe.unlink()


def describe(name: str) -> str:
    """What profile ``name`` runs, for the header: examples per test, derandomized, or stored examples only."""
    profile = settings.get_profile(name)
    if Phase.generate not in profile.phases:
        return "stored examples only" + (" and pins" if Phase.explicit in profile.phases else "")
    return f"{profile.max_examples} examples{', derandomized' if profile.derandomize else ''}"
