"""The cost of one `atensor.jit` replay: awaited wall time and the caller's host CPU, trio and asyncio.

    python bench/jit_replay.py [--calls 2000] [--rounds 3] [--profile trio-1]

A jitted `async def` of `x + 1` (one kernel) and of three chained `(x + 1).contiguous()` on 16 float32
elements (CPU:0), both tiny plans (run on the caller's thread when its queue is idle), and `x + 1` on
256 KiB (handed to the queue's worker), replayed:
`y = await step(y)`. Per call, medians over `--calls` calls after warm-up: the wall time of the
awaited call end to end, and the CPU time of the calling thread (time.thread_time: the host's own
Python, not the queue's worker nor waiting). Also a plain `def` jitted and called blocking
(`step(y)` then `.wait()` on its result: no event loop). A/B a change by running it with another
checkout first on PYTHONPATH, alternating rounds; `--profile LOOP-STEPS[-ELEMENTS]` prints a cProfile of the
calls of one case instead (SORT=cumulative orders it by cumulative time; the ~300 Python calls of a replay, by function).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402


BIG = 1 << 16  # elements: 256 KiB of float32, more than a tiny plan touches (engine/plan.py)


def _body(x: Tensor, steps: int) -> Tensor:
    """`x + 1` (one kernel) for one step; `steps` chained `(x + 1).contiguous()` otherwise (the
    scheduler makes each an add and a copy kernel: the task count is reported with the figures)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None,
                        help="LOOP-STEPS[-ELEMENTS], e.g. trio-1 or trio-1-65536: a cProfile instead")
    parser.add_argument("--out", default="jit_replay")
    args = parser.parse_args()
    if args.profile:
        library, steps, *size = args.profile.split("-")
        _timed(int(steps), args.calls, library, profile=True, size=int(size[0]) if size else 16)
        return
    label = {1: "x + 1", 3: "3 x (x + 1).contiguous()"}
    shapes = ((1, 16), (3, 16), (1, BIG))  # the last is too big to be a tiny plan: a worker runs it
    cases = [(f"{lib}, {label[k]}, {n * 4} B", lambda lib=lib, k=k, n=n: _timed(k, args.calls, lib, size=n))
             for lib in ("trio", "asyncio") for k, n in shapes]
    cases += [(f"blocking, {label[k]}, {n * 4} B", lambda k=k, n=n: _blocking(k, args.calls, n)) for k, n in shapes]
    found: dict[str, list[dict]] = {name: [] for name, _ in cases}
    for _ in range(args.rounds):
        for name, fn in cases:
            found[name].append(fn())
    rows, results = [], {"calls": args.calls, "rounds": args.rounds, "atensor": atensor.__file__, "cases": {}}
    for name, runs in found.items():
        wall = [r["wall_us"] for r in runs]
        cpu = [r["cpu_us"] for r in runs]
        results["cases"][name] = {"wall_us": wall, "cpu_us": cpu, "wall_p90_us": [r["wall_p90_us"] for r in runs]}
        rows.append((name, runs[0]["tasks"], statistics.median(wall), f"{min(wall):.1f}-{max(wall):.1f}",
                     statistics.median(cpu), f"{min(cpu):.1f}-{max(cpu):.1f}"))
    print(table(f"jit replay, per call (medians of {args.calls} calls; median and range of {args.rounds} rounds)",
                ["call", "tasks", "wall us", "range", "host cpu us", "range"], rows))
    print("wrote", write_results(args.out, results))


if __name__ == "__main__":
    main()
