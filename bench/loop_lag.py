"""Event-loop lag and the await round trip, under trio, asyncio and uvloop in the same run.

    python bench/loop_lag.py                 # --tiny 10000 --round-trips 2000
    python bench/loop_lag.py --tiny 3000 --explain   # where the tiny workloads' gaps go

1. Lag: the longest gap of a 1 ms ticker (atensor.profiler.ticking, on whichever loop runs) while a
   realize runs. Workloads: a few big kernels (matmuls), TINY tiny kernels as TINY outputs, and a
   chain of TINY tiny kernels realized as one output. The graphs are built before the clock starts.
   Beside them, in the same run, the same work done the usual ways: numpy called directly in the task
   (the loop blocks) and numpy in a worker thread (anyio.to_thread: the GIL convoy). Target: the
   longest gap under asyncio as small as under trio.
2. Round trip: `await (x + 1).realize()` of a 1-element tensor, back to back (dispatch, one kernel,
   the wake-up of the awaiting task), and the seam's wake-up alone (a worker thread sets a
   hcq.loop.Wakeup that the task awaits). Target: asyncio's round trip within 1.2x of trio's.

Timings on a shared machine are noisy: compare the loops within one run, not across runs. The "core
wait" column is the loop thread's wait for a core during the work (other processes had both): part of
every gap on a loaded machine, and nothing this process can shorten.

What a gap of the tiny workloads is made of (issue 49; measured per tick with the loop thread's
schedstat and an outside sampler of its state): the loop's own first step (the `realize()` call of
3,000 outputs: 2.5-3 ms of CPU, each tensor's storage and the job), then one tick per wake-up while the
dispatcher plans (the 1 ms timer and the wait for the GIL: 5 ms at CPython's default switch interval,
0.5 ms under hcq/gilshare.py), the worker's run (it yields every 0.5 ms, hcq/queue.py), and the
awaiting task's last step (for the chain, dropping the 9,000-node lazy graph: 2-3 ms of deallocation,
now peeled on the reaper thread, engine/dispatch.py `Reaper.bury`; for the outputs, checking 3,000
pending writes: 1.5-2 ms, now one wait per signal, `Job.note_pending_writes`). A collection of what
the realize left alive landed in the window too (16-70 ms) until hcq/gcpause.py froze it from 5,000
young objects. `--explain`'s "worst cpu" is the loop thread's own CPU in its busiest tick: the part of a
gap that no other process changes (for the outputs, the `realize()` call of 3,000 tensors, 2-4 ms).

On a loaded machine the rest is the OS's: traced with `perf sched` (sched_switch/wakeup and the loop
thread's futex/epoll calls), most of a long gap is the loop thread waiting for a core, or waiting for the
GIL while the thread that holds it (the dispatcher, planning) is preempted by another process; a tick in
which neither happened was 1.7-1.8 ms (1.05 timer, 0.55 GIL hand-over, 0.1-0.2 the loop's own work).
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.hcq import loop as seam  # noqa: E402
from atensor.profiler import ticking  # noqa: E402

try:
    import uvloop
except ImportError:
    uvloop = None

TINY = 10_000


def run_on(loop: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Runs `fn(*args)` on a fresh event loop of the named kind."""
    if loop == "trio":
        return trio.run(fn, *args)
    if loop == "asyncio":
        return asyncio.run(fn(*args))
    return uvloop.run(fn(*args))


def core_wait() -> float:
    """Seconds the calling thread has waited for a core so far (runnable, not running: other processes
    had the cores), from Linux's schedstat; 0 elsewhere. On a loaded machine, a gap includes this wait,
    which no code in the process can shorten."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except OSError:
        return 0.0


async def measure(work: Callable[[], Awaitable[None]]) -> tuple[float, float, int, float]:
    """The work's time, the loop's longest gap and its tick count meanwhile, and the loop thread's wait
    for a core during the work (see `core_wait`)."""
    async with ticking(settle=0.02) as lag:
        start, waited = time.perf_counter(), core_wait()
        await work()
        elapsed, waited = time.perf_counter() - start, core_wait() - waited
    return elapsed, lag.worst, lag.ticks, waited


def big_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(4)]


def atensor_big() -> Callable[[], Awaitable[None]]:
    """The graph is built before the clock starts: the measured part is the awaited realize."""
    ts = [Tensor(a) for a in big_inputs()]
    outs = [((t @ t.T) @ t).tanh().sum() for t in ts]

    async def work() -> None:
        await Tensor.realize(*outs)
    return work


def atensor_tiny() -> Callable[[], Awaitable[None]]:
    xs = [Tensor(np.full(16, i, dtype=np.float32)) for i in range(TINY)]
    outs = [(x * 2 + 1).sum() for x in xs]

    async def work() -> None:
        await Tensor.realize(*outs)
    return work


def atensor_tiny_chain() -> Callable[[], Awaitable[None]]:
    x = Tensor(np.zeros(16, dtype=np.float32))
    for _ in range(TINY):
        x = (x * 0.5 + 1).contiguous()

    async def work() -> None:
        await x.realize()
    return work


def numpy_in_loop_big() -> Callable[[], Awaitable[None]]:
    async def work() -> None:
        for a in big_inputs():
            np.tanh((a @ a.T) @ a).sum()
    return work


def numpy_in_thread_tiny() -> Callable[[], Awaitable[None]]:
    xs = [np.full(16, i, dtype=np.float32) for i in range(TINY)]

    def compute() -> None:
        for x in xs:
            (x * 2 + 1).sum()

    async def work() -> None:
        await anyio.to_thread.run_sync(compute)
    return work


def numpy_in_loop_tiny() -> Callable[[], Awaitable[None]]:
    async def work() -> None:
        for i in range(TINY):
            (np.full(16, i, dtype=np.float32) * 2 + 1).sum()
    return work


def thread_clock() -> tuple[float, float]:
    """The calling thread's CPU time and its wait for a core so far, in seconds (Linux's schedstat;
    zeros elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            ran, waited = f.read().split()[:2]
        return int(ran) * 1e-9, int(waited) * 1e-9
    except OSError:
        return 0.0, 0.0


async def explain_case(make: Callable[[], Callable[[], Awaitable[None]]], warm: bool) -> dict[str, float]:
    """Like `lag_case`, with a 1 ms ticker of its own that splits each gap into the loop thread's own CPU,
    its wait for a core (other processes) and the rest: the timer's 1 ms and the waits for the GIL.
    Returns the worst gap and its parts, and the median and worst rest (ms)."""
    if warm:
        await measure(make())
    work, ticks, done = make(), [], False

    async def ticker() -> None:
        last, (ran, waited) = time.perf_counter(), thread_clock()
        while not done:
            await anyio.sleep(0.001)
            now, (ran_now, waited_now) = time.perf_counter(), thread_clock()
            gap, cpu, core = now - last, ran_now - ran, waited_now - waited
            ticks.append((gap, cpu, core, gap - cpu - core))
            last, ran, waited = now, ran_now, waited_now
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.02)
        ticks.clear()
        await work()
        done = True
    worst = max(ticks)
    rests = sorted(t[3] for t in ticks)
    return {"gap": worst[0] * 1e3, "cpu": worst[1] * 1e3, "core": worst[2] * 1e3, "rest": worst[3] * 1e3,
            "median_rest": statistics.median(rests) * 1e3, "worst_rest": rests[-1] * 1e3,
            "worst_cpu": max(t[1] for t in ticks) * 1e3}


async def lag_case(make: Callable[[], Callable[[], Awaitable[None]]],
                   warm: bool) -> tuple[float, float, int, float]:
    if warm:
        await measure(make())  # compiles, caches: not what this measures
    return await measure(make())


async def realize_round_trips(count: int) -> list[float]:
    x = Tensor(np.ones(1, dtype=np.float32)).realize()
    await x
    times = []
    for i in range(count + 50):
        y = x + 1
        start = time.perf_counter()
        await y.realize()
        if i >= 50:  # the first ones warm the caches
            times.append(time.perf_counter() - start)
    return times


async def wake_round_trips(count: int) -> list[float]:
    """A persistent worker thread sets each Wakeup the task then awaits: the seam's cost alone."""
    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def worker() -> None:
        while (w := jobs.get()) is not None:
            w.set()
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    times = []
    try:
        for i in range(count + 50):
            w = seam.wakeup()
            start = time.perf_counter()
            jobs.put(w)
            await w.wait()
            if i >= 50:
                times.append(time.perf_counter() - start)
            w.close()
    finally:
        jobs.put(None)
        thread.join()
    return times


def main() -> None:
    global TINY
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", type=int, default=TINY, help="tiny kernels per tiny workload")
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--explain", action="store_true",
                        help="only the tiny workloads, each gap split into the loop thread's CPU, its wait for a "
                             "core and the rest (timer and GIL); writes no file")
    args = parser.parse_args()
    TINY = args.tiny
    loops = ["trio", "asyncio"] + (["uvloop"] if uvloop is not None else [])
    if args.explain:
        rows = []
        for name, make in ((f"{TINY} tiny kernels", atensor_tiny), (f"chain of {TINY} tiny kernels",
                                                                      atensor_tiny_chain)):
            for k, loop in enumerate(loops):
                r = run_on(loop, explain_case, make, k == 0)
                rows.append((name, loop, r["gap"], r["cpu"], r["core"], r["rest"], r["median_rest"],
                             r["worst_rest"], r["worst_cpu"]))
        print(table("longest gap (ms) and its parts: the loop's CPU, its wait for a core, the rest (the 1 ms "
                    "timer and waits for the GIL); the rest over all ticks; the loop's own CPU in its "
                    "busiest tick (the part no other process changes)",
                    ["workload", "loop", "gap", "cpu", "core wait", "rest", "median rest", "worst rest",
                     "worst cpu"], rows))
        return
    cases = [("big kernels (4 x 1024^3 matmul chains)", "atensor await realize", atensor_big, loops),
             ("big kernels (4 x 1024^3 matmul chains)", "numpy in the task", numpy_in_loop_big, loops[:2]),
             (f"{TINY} tiny kernels", "atensor await realize", atensor_tiny, loops),
             (f"chain of {TINY} tiny kernels", "atensor await realize", atensor_tiny_chain, loops),
             (f"{TINY} tiny kernels", "numpy in a worker thread", numpy_in_thread_tiny, loops[:2]),
             (f"{TINY} tiny kernels", "numpy in the task", numpy_in_loop_tiny, loops[:2])]
    rows, results = [], []
    for workload, system, make, on in cases:
        for k, loop in enumerate(on):
            elapsed, worst, ticks, waited = run_on(loop, lag_case, make, k == 0)
            rows.append((workload, system, loop, elapsed * 1e3, worst * 1e3, ticks, waited * 1e3))
            results.append({"workload": workload, "system": system, "loop": loop, "elapsed_ms": elapsed * 1e3,
                            "longest_gap_ms": worst * 1e3, "ticks": ticks, "loop_core_wait_ms": waited * 1e3})
    print(table("event-loop lag: longest gap of a 1 ms ticker during the work (lower is better); the loop "
                "thread's wait for a core (other processes): near 0 on a quiet machine",
                ["workload", "system", "loop", "work ms", "longest gap ms", "ticks", "core wait ms"], rows))

    trips: dict[str, dict[str, float]] = {}
    for loop in loops:
        for kind, fn in (("await realize", realize_round_trips), ("seam wake-up", wake_round_trips)):
            times = run_on(loop, fn, args.round_trips)
            trips[f"{kind} / {loop}"] = {"loop": loop, "kind": kind, "min_us": min(times) * 1e6,
                                         "median_us": statistics.median(times) * 1e6,
                                         "p99_us": sorted(times)[int(0.99 * (len(times) - 1))] * 1e6}
    rows = []
    for key, t in trips.items():
        base = trips[f"{t['kind']} / trio"]["median_us"]
        rows.append((t["kind"], t["loop"], t["min_us"], t["median_us"], t["p99_us"],
                     f"{t['median_us'] / base:.2f}x"))
    print()
    print(table(f"round trips ({args.round_trips} each, back to back; vs trio = median / trio's median)",
                ["what", "loop", "min us", "median us", "p99 us", "vs trio"], rows))
    ratio = trips["await realize / asyncio"]["median_us"] / trips["await realize / trio"]["median_us"]
    gap = {loop: max(r["longest_gap_ms"] for r in results
                     if r["loop"] == loop and r["system"].startswith("atensor"))
           for loop in loops}
    print(f"\nasyncio's await-realize round trip / trio's: {ratio:.2f}x (target <= 1.2)")
    print("atensor's longest loop gap per loop: " + ", ".join(f"{k} {v:.1f} ms" for k, v in gap.items()))
    print("wrote", write_results("loop_lag", {"cases": results, "round_trips": list(trips.values()),
                                              "targets": {"asyncio_vs_trio_round_trip": ratio,
                                                          "atensor_longest_gap_ms": gap},
                                              "config": vars(args)}))


if __name__ == "__main__":
    main()
