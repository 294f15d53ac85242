"""Print the distributions that only an extra of fp4-conformance installs, one per line.

``python scripts/extra_only.py dev``, run by the interpreter of a venv that holds the suite with that extra,
prints ``ml-dtypes``, ``redis`` and ``ruff`` for ``.[dev]`` (the extra's requirements and the packages of their
own extras, ``hypothesis[redis]`` -> ``redis``, less what the suite requires without extras). A venv seeded from
the checkout's ``.venv`` (``scripts/seed-venv.sh``) for an installed copy (``scripts/install-cpu.sh --copy``,
no extras) drops them, so that the copy runs with what ``pip install .`` installs.
"""

from __future__ import annotations

import argparse
import importlib.metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SUITE = "fp4-conformance"


def extra_only(extra: str, dist: str = SUITE) -> list[str]:
    """Distributions ``dist[extra]`` adds to ``dist``, one level deep, names canonical, sorted."""
    requires = [Requirement(r) for r in importlib.metadata.requires(dist) or ()]
    core = {canonicalize_name(r.name) for r in requires if r.marker is None}
    added: set[str] = set()
    for req in requires:
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        added.add(canonicalize_name(req.name))
        try:
            subs = importlib.metadata.requires(req.name) or ()
        except importlib.metadata.PackageNotFoundError:  # not installed here: its own extras add nothing here
            subs = ()
        for sub in map(Requirement, subs):
            if (
                sub.marker is not None
                and "extra" in str(sub.marker)
                and any(sub.marker.evaluate({"extra": e}) for e in req.extras)
            ):
                added.add(canonicalize_name(sub.name))
    return sorted(added - core)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extra", help="the extra (dev)")
    print("\n".join(extra_only(parser.parse_args(argv).extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
