"""The cost of one `atensor.jit` replay: awaited wall time and the caller's host CPU, trio and asyncio.

    python bench/jit_replay.py [--calls 2000] [--rounds 3] [--baseline /work/main] [--profile trio-1]

A jitted `async def` of `x + 1` (one kernel) and of three and of a hundred chained `(x + 1).contiguous()`
on 16 float32 elements (CPU:0), both tiny plans (run on the caller's thread when its queue is idle), and `x + 1` on
256 KiB (handed to the queue's worker), replayed:
`y = await step(y)`. Per call, medians over `--calls` calls after warm-up: the wall time of the
awaited call end to end, and the CPU time of the calling thread (time.thread_time: the host's own
Python, not the queue's worker nor waiting). Also a plain `def` jitted and called blocking
(`step(y)`, no event loop). `--baseline OTHER_CHECKOUT` A/Bs a change: rounds alternate between
that checkout's atensor and this tree's, each in a fresh process, with the ratios per round.
`--profile LOOP-STEPS[-ELEMENTS]` prints a cProfile of one case's calls instead (SORT=cumulative
orders it by cumulative time): the ~300 Python calls of a replay, by function.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402


BIG = 1 << 16  # elements: 256 KiB of float32, more than a tiny plan touches (engine/plan.py)


def _body(x: Tensor, steps: int) -> Tensor:
    """`x + 1` (one kernel) for one step; `steps` chained `(x + 1).contiguous()` otherwise (the
    scheduler's task count is reported with the figures)."""
    if steps == 1:
        return x + 1
    for _ in range(steps):
        x = (x + 1).contiguous()
    return x


def _step(steps: int):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return _body(x, steps)
    return step


def _tasks(step) -> int:
    return sum(program.tasks for program in step._programs.values())


def _timed(steps: int, calls: int, library: str, profile: bool = False, size: int = 16) -> dict:
    step = _step(steps)

    async def run() -> dict:
        y = Tensor.zeros(size, device="CPU:0").contiguous()
        await y.realize()
        for _ in range(50):  # first call, capture, verify (compiles), replays warm
            y = await step(y)
        walls, cpus = [], []
        prof = None
        if profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        for _ in range(calls):
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            y = await step(y)
            c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
            walls.append((w1 - w0) / 1e3)
            cpus.append((c1 - c0) / 1e3)
        if prof is not None:
            prof.disable()
            import pstats
            pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(45)
            calls_per = sum(entry.callcount for entry in prof.getstats())
            print(f"python calls per replay: {calls_per / calls:.0f}")
        expect = (50 + calls) * steps
        got = float(y.numpy()[0])
        assert got == expect, f"replays computed {got}, expected {expect}"
        return {"wall_us": statistics.median(walls), "cpu_us": statistics.median(cpus),
                "wall_p90_us": sorted(walls)[int(0.9 * len(walls))], "tasks": _tasks(step)}

    if library == "trio":
        import trio
        return trio.run(run)
    import asyncio
    return asyncio.run(run())


def _blocking(steps: int, calls: int, size: int = 16) -> dict:
    @atensor.jit
    def step(x: Tensor) -> Tensor:
        return _body(x, steps)

    y = Tensor.zeros(size, device="CPU:0").contiguous()
    y.realize().wait()
    for _ in range(50):
        y = step(y)
    walls, cpus = [], []
    for _ in range(calls):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        y = step(y)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        walls.append((w1 - w0) / 1e3)
        cpus.append((c1 - c0) / 1e3)
    assert float(y.numpy()[0]) == (50 + calls) * steps
    return {"wall_us": statistics.median(walls), "cpu_us": statistics.median(cpus),
            "wall_p90_us": sorted(walls)[int(0.9 * len(walls))], "tasks": _tasks(step)}


def _cases(calls: int) -> list[tuple[str, Any]]:
    label = {1: "x + 1", 3: "3 x (x + 1).contiguous()", 100: "100 x (x + 1).contiguous()"}
    shapes = ((1, 16), (3, 16), (100, 16), (1, BIG))  # the last is too big to be a tiny plan: a worker runs it
    cases = [(f"{lib}, {label[k]}, {n * 4} B", lambda lib=lib, k=k, n=n: _timed(k, calls, lib, size=n))
             for lib in ("trio", "asyncio") for k, n in shapes]
    cases += [(f"blocking, {label[k]}, {n * 4} B", lambda k=k, n=n: _blocking(k, calls, n)) for k, n in shapes]
    return cases


def _one_round(calls: int) -> dict[str, dict]:
    return {name: fn() for name, fn in _cases(calls)}


def _round_in(tree: Path, calls: int) -> dict[str, dict]:
    """One round in a fresh process importing atensor from `tree` (this file's code, that tree's library)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--calls", str(calls), "--worker"], env=env, check=True,
                         capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got.pop("atensor")["file"].startswith(str(tree)), f"{tree}: imported another atensor"
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None,
                        help="LOOP-STEPS[-ELEMENTS], e.g. trio-1 or trio-1-65536: a cProfile instead")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout: alternate rounds of its atensor and this tree's, each a fresh process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="jit_replay")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps({**_one_round(args.calls), "atensor": {"file": atensor.__file__}}))
        return
    if args.profile:
        library, steps, *size = args.profile.split("-")
        _timed(int(steps), args.calls, library, profile=True, size=int(size[0]) if size else 16)
        return
    trees = {"this": ROOT} if args.baseline is None else {"baseline": args.baseline.resolve(), "this": ROOT}
    found: dict[str, dict[str, list[dict]]] = {tree: {} for tree in trees}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for tree, path in order:
            got = _one_round(args.calls) if args.baseline is None else _round_in(path, args.calls)
            for name, run in got.items():
                found[tree].setdefault(name, []).append(run)
    rows, results = [], {"calls": args.calls, "rounds": args.rounds,
                         "trees": {k: str(v) for k, v in trees.items()}, "cases": {}}
    for name in found["this"]:
        entry = {}
        row: list[Any] = [name, found["this"][name][0]["tasks"]]
        for tree in trees:
            runs = found[tree][name]
            wall, cpu = [r["wall_us"] for r in runs], [r["cpu_us"] for r in runs]
            entry[tree] = {"wall_us": wall, "cpu_us": cpu, "wall_p90_us": [r["wall_p90_us"] for r in runs],
                           "wall_median_us": statistics.median(wall), "cpu_median_us": statistics.median(cpu)}
            row += [f"{statistics.median(wall):.1f} ({min(wall):.0f}-{max(wall):.0f})",
                    f"{statistics.median(cpu):.1f} ({min(cpu):.0f}-{max(cpu):.0f})"]
        if args.baseline is not None:
            for key in ("wall", "cpu"):
                pairs = [b[f"{key}_us"] / t[f"{key}_us"]
                         for b, t in zip(found["baseline"][name], found["this"][name])]
                entry[f"{key}_baseline_over_this"] = pairs
                row.append(f"{statistics.median(pairs):.2f}x")
        results["cases"][name] = entry
        rows.append(row)
    header = ["call", "tasks"]
    for tree in trees:
        header += [f"{tree} wall us", f"{tree} host cpu us"]
    if args.baseline is not None:
        header += ["wall baseline/this", "cpu baseline/this"]
    print(table(f"jit replay, per call: medians of {args.calls} calls; median (range) of {args.rounds} rounds"
                + (", alternating baseline and this tree in fresh processes" if args.baseline else ""),
                header, rows))
    print("wrote", write_results(args.out, results))


if __name__ == "__main__":
    main()
