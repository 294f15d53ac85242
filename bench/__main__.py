"""``python -m bench``: detection power and speed of the suite vs. the libraries' fixed grids.

``--quick`` (one seed, no throughput pass) fits in CI and exits non-zero unless the suite
catches every shipped known-bad subject.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.run import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, no throughput; assert every bug is caught")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per known-bad subject (default 5)")
    parser.add_argument("--subject", action="append", help="only these subjects (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("results/bench"), help="output folder")
    args = parser.parse_args(argv)
    seeds = [0] if args.quick else list(range(args.seeds))
    report = run(seeds, args.out, args.quick, args.subject)
    print((args.out / "bench.md").read_text())
    missed = [r["subject"] for r in report["suite"] if not r["caught"].startswith(f"{len(seeds)}/")]
    if args.quick and missed:
        print(f"NOT CAUGHT on every seed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
