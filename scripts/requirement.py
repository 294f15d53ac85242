"""Print what an installed distribution's own metadata requires of another, as a pip requirement.

``python scripts/requirement.py vllm flashinfer-python`` prints ``flashinfer-python==0.7.2.post1`` for vLLM
0.33.0 (its wheel's ``Requires-Dist``); SGLang 0.5.23's ``flashinfer_python[cu13]==0.7.2`` prints as
``flashinfer-python==0.7.2`` (the name normalized, extras and environment markers dropped: the engine install
scripts install FlashInfer without its CUDA-only dependencies). The scripts read an engine's pins here instead
of retyping them, so each engine subject runs the versions that engine's users run. Exits 1 naming the
distribution when it requires nothing of that name.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement(dist: str, name: str) -> str | None:
    """``name``'s requirement in ``dist``'s ``Requires-Dist`` as ``name<specifier>``, without extras or markers
    (the first unconditional one, else the first of any extra); None if ``dist`` requires no ``name``."""
    wanted = canonicalize_name(name)
    found = [Requirement(r) for r in importlib.metadata.requires(dist) or ()]
    found = [r for r in found if canonicalize_name(r.name) == wanted]
    found.sort(key=lambda r: r.marker is not None)
    return f"{wanted}{found[0].specifier}" if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist", help="the installed distribution whose metadata is read (vllm, sglang)")
    parser.add_argument("name", help="the distribution it requires (flashinfer-python)")
    args = parser.parse_args(argv)
    found = requirement(args.dist, args.name)
    if found is None:
        print(f"{args.dist} {importlib.metadata.version(args.dist)} requires no {args.name}", file=sys.stderr)
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
