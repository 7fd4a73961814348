"""Per-task overhead: many tiny kernels, independent and as a dependent chain, against peers.

    python bench/overhead.py [--tasks 10000]

atensor: one realize of N independent tiny kernels (x_i + 1) and one of a chain of N dependent ones
((x + 1).contiguous() repeated), on NULL (nothing runs: pure scheduling, planning and queue cost) and
on CPU; the time from `realize()` to completion divided by N. Graph building is reported apart. Also
a chain of 50 kernels in an `atensor.jit` function, replayed (no graph building, no scheduling), the
async round trip of `x = x + 1; await x.realize()` on 16 elements, in three parts, and that of one
awaited jitted `x + 1` (bench/jit_replay.py takes a replay's cost apart further).
Peers in the same run: tinygrad's eager realize per kernel and TinyJit replay per kernel for the same
chain, and Dask's threaded scheduler per task for a chain of delayed adds. A peer that is not
installed is skipped with a note.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402


def atensor_independent(device: str, n: int) -> tuple[float, float]:
    xs = [Tensor.empty(16, device=device) for _ in range(n)]
    start = time.perf_counter()
    ys = [x + 1 for x in xs]
    built = time.perf_counter()
    Tensor.realize(*ys).wait()
    done = time.perf_counter()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def atensor_chain(device: str, n: int) -> tuple[float, float]:
    x = Tensor.empty(16, device=device)
    start = time.perf_counter()
    for _ in range(n):
        x = (x + 1).contiguous()
    built = time.perf_counter()
    x.realize().wait()
    done = time.perf_counter()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def atensor_jit_chain(device: str, n: int, steps: int = 50) -> float:
    """us per kernel of a jitted function of `steps` chained kernels, replayed: tinygrad's TinyJit case."""
    import atensor

    @atensor.jit
    def step(t: Tensor) -> Tensor:
        for _ in range(steps):
            t = (t + 1).contiguous()
        return t

    y = Tensor.zeros(16, device=device).contiguous()
    for _ in range(4):  # first call, capture, verify
        y = step(y)
    reps = max(1, min(n, 2000) // steps)
    start = time.perf_counter()
    for _ in range(reps):
        y = step(y)
    y.realize().wait()
    return (time.perf_counter() - start) / (reps * steps) * 1e6


def atensor_round_trip(device: str, count: int = 300) -> dict:
    """`x = x + 1; await x.realize()` on 16 elements, from trio: the smallest async use. Medians of
    the three parts: building the node, the `realize()` call (which plans and submits a graph this
    small on the caller's thread when the dispatcher is idle), and the `await` (the queue's thread
    runs the kernel and wakes the loop)."""
    import statistics

    import trio

    async def run() -> dict:
        x = Tensor.zeros(16, device=device).contiguous()
        await x.realize()
        parts: list[list[float]] = [[], [], []]
        for k in range(count + 20):
            t0 = time.perf_counter()
            x = x + 1
            t1 = time.perf_counter()
            handle = x.realize()
            t2 = time.perf_counter()
            await handle
            t3 = time.perf_counter()
            if k >= 20:  # warmed up: the schedule cache hits
                for part, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
                    part.append(value * 1e6)
        build, call, wait = (statistics.median(p) for p in parts)
        return {"build_us": build, "realize_call_us": call, "await_us": wait,
                "round_trip_us": build + call + wait}
    return trio.run(run)


def atensor_jit_round_trip(device: str, count: int = 300) -> float:
    """`y = await step(y)` for a jitted `x + 1` on 16 elements, from trio: the median us of one awaited
    replay, end to end (a tiny plan: it runs on the caller's thread when its queue is idle)."""
    import statistics

    import trio

    import atensor

    @atensor.jit
    async def step(t: Tensor) -> Tensor:
        return t + 1

    async def run() -> float:
        y = Tensor.zeros(16, device=device).contiguous()
        await y.realize()
        times = []
        for k in range(count + 20):
            start = time.perf_counter()
            y = await step(y)
            if k >= 20:  # captured, verified, compiled and warm
                times.append((time.perf_counter() - start) * 1e6)
        if device != "NULL":  # a NULL device holds no data
            assert float(y.numpy()[0]) == count + 20
        return statistics.median(times)
    return trio.run(run)


def tinygrad_chain(n: int) -> dict:
    try:
        from tinygrad import Tensor as TgTensor, TinyJit
    except ImportError:
        return {"note": "tinygrad not installed"}
    try:
        x = TgTensor.ones(16).contiguous().realize()
        x = (x + 1).realize()
        count = min(n, 300)
        start = time.perf_counter()
        for _ in range(count):
            x = (x + 1).realize()
        eager = (time.perf_counter() - start) / count * 1e6

        steps = 50

        @TinyJit
        def step(t):
            for _ in range(steps):
                t = (t + 1).contiguous()
            return t.realize()

        y = TgTensor.ones(16).contiguous().realize()
        for _ in range(3):
            y = step(y)
        reps = max(1, min(n, 2000) // steps)
        start = time.perf_counter()
        for _ in range(reps):
            y = step(y)
        y.numpy()
        jit = (time.perf_counter() - start) / (reps * steps) * 1e6
        return {"eager_us_per_kernel": eager, "jit_us_per_kernel": jit}
    except Exception as exc:  # a peer that cannot run here is reported, not fatal
        return {"note": f"tinygrad failed: {type(exc).__name__}: {exc}"}


def dask_chain(n: int) -> dict:
    try:
        import dask
    except ImportError:
        return {"note": "dask not installed"}
    count = min(n, 5000)

    def add1(a):
        return a + 1

    node = dask.delayed(np.zeros(16, dtype=np.float32))
    for _ in range(count):
        node = dask.delayed(add1)(node)
    start = time.perf_counter()
    node.compute(scheduler="threads")
    chain = (time.perf_counter() - start) / count * 1e6
    parts = [dask.delayed(add1)(np.zeros(16, dtype=np.float32)) for _ in range(count)]
    start = time.perf_counter()
    dask.compute(*parts, scheduler="threads")
    independent = (time.perf_counter() - start) / count * 1e6
    return {"chain_us_per_task": chain, "independent_us_per_task": independent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args()
    n = args.tasks
    results: dict = {"tasks": n, "atensor": {}}
    rows = []
    for device in ("NULL", "CPU"):
        for kind, fn in (("independent", atensor_independent), ("chain", atensor_chain)):
            fn(device, min(n, 500))  # warm up: kernels compiled, threads started
            build, realize = fn(device, n)  # a new graph structure: the whole scheduler runs
            build_hit, realize_hit = fn(device, n)  # the same structure again: the schedule cache hits
            results["atensor"][f"{device}_{kind}"] = {"build_us_per_task": build, "realize_us_per_task": realize,
                                                       "cached_realize_us_per_task": realize_hit}
            rows.append((f"atensor {device}", f"{kind}, first schedule", realize, build))
            rows.append((f"atensor {device}", f"{kind}, schedule cached", realize_hit, build_hit))
        trip = atensor_round_trip(device)
        results["atensor"][f"{device}_round_trip"] = trip
        rows.append((f"atensor {device}", "x = x + 1; await x.realize() (one round trip; trio)",
                     trip["round_trip_us"], trip["build_us"]))
        jit = atensor_jit_chain(device, n)
        results["atensor"][f"{device}_jit_chain"] = {"replay_us_per_kernel": jit}
        rows.append((f"atensor {device}", "chain, atensor.jit replay", jit, "-"))
        label = "y = await step(y), a jitted x + 1 (one replay; trio)"
        try:
            jit_trip = atensor_jit_round_trip(device)
        except Exception as exc:  # an older checkout run as a baseline may fail here: reported, not fatal
            results["atensor"][f"{device}_jit_round_trip"] = {"note": f"{type(exc).__name__}: {exc}"}
            rows.append((f"atensor {device}", f"{label}: failed, {type(exc).__name__}", "-", "-"))
        else:
            results["atensor"][f"{device}_jit_round_trip"] = {"replay_us": jit_trip}
            rows.append((f"atensor {device}", label, jit_trip, "-"))
    tg, dk = tinygrad_chain(n), dask_chain(n)
    results["tinygrad"], results["dask"] = tg, dk
    peers = (("tinygrad CPU", tg, (("chain, eager realize", "eager_us_per_kernel"),
                                   ("chain, TinyJit replay", "jit_us_per_kernel"))),
             ("dask threads", dk, (("chain", "chain_us_per_task"), ("independent", "independent_us_per_task"))))
    for system, found, entries in peers:
        if "note" in found:  # not installed, or failed here
            rows.append((system, found["note"], "-", "-"))
        else:
            rows.extend((system, label, found[key], "-") for label, key in entries)
    print(table(f"per-task overhead, {n} tasks (us per task; lower is better)",
                ["system", "workload", "us/task", "graph build us/task"], rows))
    ref = results["atensor"]["NULL_chain"]["cached_realize_us_per_task"]
    if "chain_us_per_task" in dk:
        print(f"\ndask chain / atensor NULL chain (cached): {dk['chain_us_per_task'] / ref:.2f}x")
    if "jit_us_per_kernel" in tg:
        print(f"tinygrad TinyJit / atensor.jit replay (CPU chain): "
              f"{tg['jit_us_per_kernel'] / results['atensor']['CPU_jit_chain']['replay_us_per_kernel']:.2f}x")
        print(f"tinygrad TinyJit / atensor NULL chain: {tg['jit_us_per_kernel'] / ref:.2f}x; "
              f"tinygrad eager / atensor CPU chain: "
              f"{tg['eager_us_per_kernel'] / results['atensor']['CPU_chain']['cached_realize_us_per_task']:.2f}x")
    for device in ("NULL", "CPU"):
        trip = results["atensor"][f"{device}_round_trip"]
        print(f"round trip on {device} (medians, us): build {trip['build_us']:.1f}, realize() call "
              f"{trip['realize_call_us']:.1f}, await {trip['await_us']:.1f}")
    print("wrote", write_results("overhead", results))


if __name__ == "__main__":
    main()
