# `python -m atensor.profiler trace.json`: the summary of a saved trace, in the terminal.
#
# A trace is often looked at far from where it was recorded (a CI artifact, a file attached to
# an issue), where opening Perfetto is a detour. The CLI loads the Chrome trace back into a
# Profile and prints the same summary `prof.summary()` printed live; `--export` converts it, for
# example to the HTML timeline. Errors are one line on stderr and exit status 2, never a
# traceback: a wrong path or a file that is not a trace is a user's mistake, not a crash.
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .collector import Profile

PROG = "python -m atensor.profiler"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status (0 ok, 2 bad input)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Summarize an atensor profile saved with prof.export('trace.json').",
    )
    parser.add_argument("trace", help="a Chrome trace JSON file (.json or .json.gz)")
    parser.add_argument(
        "--export", metavar="PATH", action="append", default=[],
        help="also write the trace as PATH (.html timeline, .json or .json.gz); repeatable",
    )
    parser.add_argument("--kernels", type=int, default=25, metavar="N",
                        help="show the N most expensive kernel names (default 25)")
    args = parser.parse_args(argv)

    try:
        prof = Profile.load(args.trace)
    except FileNotFoundError:
        return _fail(f"no such file: {args.trace}")
    except IsADirectoryError:
        return _fail(f"{args.trace} is a directory, not a trace file")
    except PermissionError:
        return _fail(f"cannot read {args.trace}: permission denied")
    except ValueError as error:
        return _fail(str(error))

    from .summary import format_summary

    print(format_summary(prof.stats(), max_kernels=args.kernels))
    for path in args.export:
        try:
            written = prof.export(path)
        except (ValueError, OSError) as error:
            return _fail(str(error))
        print(f"wrote {written}")
    return 0


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2
