"""``python -m bench``: detection power and speed of the suite vs. the libraries' fixed grids.

``--quick`` (one seed, 25-example budget, no failure rates, no throughput pass) fits in CI and exits non-zero
unless the ``ci`` run with its pins catches every chosen known-bad subject, and generation alone
(no pins) every mutant of :data:`bench.mutants.CI_MUTANTS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.mutants import CI_MUTANTS
from bench.run import joined, markdown, readme_section, run, update_readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one seed, budget 25, no throughput; assert every bug is caught"
    )
    parser.add_argument("--seeds", type=int, default=20, help="Hypothesis seeds 0..N-1 per subject (default 20)")
    parser.add_argument(
        "--budget",
        type=int,
        default=200,
        help="generated examples per property and seed beyond the ci budget (default 200)",
    )
    parser.add_argument(
        "--rate-seeds", type=int, default=5, help="seeds of the budget-example figures and failure rates (default 5)"
    )
    parser.add_argument(
        "--subject", action="append", help="only these subjects: a registered name or package.module:attr (repeatable)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="subjects measured at once in worker processes (default 1)")
    parser.add_argument("--no-throughput", action="store_true", help="skip the pytest throughput pass")
    parser.add_argument("--no-grids", action="store_true", help="skip the fixed-grid comparison")
    parser.add_argument(
        "--no-suite", action="store_true", help="fixed grids only (join with a suite run by --from-json)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/bench"), help="output folder")
    parser.add_argument(
        "--readme", type=Path, help="also rewrite the bench section of this file (docs/measurements.md)"
    )
    parser.add_argument(
        "--readme-block",
        default="bench",
        help="the generated block --readme rewrites, between <!-- NAME:start --> and <!-- NAME:end --> (default bench)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        action="append",
        help="render bench.json files written earlier instead of measuring (repeatable: their subjects joined)",
    )
    args = parser.parse_args(argv)
    if args.from_json:
        report = joined([json.loads(path.read_text()) for path in args.from_json])
    else:
        report = run(
            [0] if args.quick else list(range(args.seeds)),
            args.out,
            budget=25 if args.quick else args.budget,
            rate_seeds=1 if args.quick else args.rate_seeds,
            quick=args.quick,
            subjects=args.subject,
            with_throughput=not (args.quick or args.no_throughput),
            with_grids=not args.no_grids,
            with_suite=not args.no_suite,
            jobs=args.jobs,
        )
    print(markdown(report))
    if args.readme:
        update_readme(args.readme, readme_section(report, args.readme_block), args.readme_block)
    seeds, unpinned = len(report["seeds"]), {s.name for s in CI_MUTANTS}
    missed = [
        r["subject"]
        for r in report["suite"]
        if not r["ci_without_pins" if r["subject"] in unpinned else "with_pins"]["caught"].startswith(f"{seeds}/")
    ]
    if args.quick and missed:
        print(f"NOT CAUGHT on every seed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
