"""`python -m bench`: the benchmark suite's command line (bench/registry.py lists what it runs)."""
from __future__ import annotations

import argparse
import sys

from . import report, suite
from .registry import BENCHMARKS, by_name


def _list() -> None:
    for bench in BENCHMARKS:
        state = "core" if bench.core else "extra"
        if not bench.path.exists():
            state += ", absent" if bench.optional else ", MISSING"
        print(f"{bench.name:22} {bench.area:9} [{state}] bench/{bench.script}: {bench.measures}")
        print(f"{'':33}peers: {', '.join(bench.peers) or '-'}; limit: {bench.limit or '-'}")
        print(f"{'':33}full: {bench.command()}; quick: {bench.command(quick=True)}"
              f"{'; needs ' + ', '.join(bench.needs) if bench.needs else ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="each benchmark's short options (~5 minutes in all)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks (see --list)")
    parser.add_argument("--all", action="store_true", help="every registered benchmark, not only the core ones")
    parser.add_argument("--list", action="store_true", help="list the registered benchmarks and exit")
    parser.add_argument("--report", action="store_true", help="write docs/benchmarks.md from bench/results and exit")
    parser.add_argument("--baseline", metavar="REV", help="also run each chosen benchmark in a git worktree of REV, "
                                                           "alternating rounds; writes bench/results/ab_<name>.json")
    parser.add_argument("--rounds", type=int, default=3, help="--baseline: alternating rounds (default 3)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds one benchmark may run before it is stopped (default 600 quick, 1800 full)")
    args = parser.parse_args(argv)
    if args.list:
        _list()
        return 0
    if args.report:
        print("wrote", report.write())
        return 0
    known = by_name()
    if args.only:
        unknown = [n for n in args.only if n not in known]
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from: {', '.join(known)}")
        chosen = [known[n] for n in args.only]
    else:
        chosen = [b for b in BENCHMARKS if b.core or args.all]
    timeout = args.timeout or (600.0 if args.quick else 1800.0)
    if args.baseline:
        for bench in chosen:
            print("wrote", suite.compare(bench, args.baseline, args.rounds, args.quick, timeout))
        return 0
    outcomes = suite.run_all(chosen, args.quick, timeout, record=not args.only)
    bad = [o for o in outcomes if o.status.startswith(("failed", "timed out"))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
