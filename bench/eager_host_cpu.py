"""Host CPU of the eager path, per task, measured on the calling thread (time.thread_time).

    python bench/eager_host_cpu.py

Building the nodes of a chain of `(x + 1).contiguous()` (and of N independent `x_i + 1`), then
preparing, scheduling (cached), planning and submitting them: engine/realize.py's `_prepare`, called on
this thread instead of the dispatcher's, so that one thread's CPU time holds the whole host path.
Also: the thread CPU of building one elementwise node (x + 1, x * y, relu, a 10-op chain), and the
eager round trip `x = x + 1; await x.realize()` under trio and asyncio in process CPU and Python calls.
Thread CPU time is not inflated when other processes take the cores, so on a shared machine it A/Bs
host-side changes (the storage ledger's bookkeeping, say) far more steadily than wall time; it does
not see waiting, waking or the queue workers (bench/overhead.py measures those). Minimum of 15 repeats
of 300 tasks after 3 warm-ups; NULL and CPU devices.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.engine import realize as engine_realize  # noqa: E402
from atensor.engine.dispatch import Job  # noqa: E402
from atensor.ledger import versions  # noqa: E402

clock = time.thread_time


def _prepare(tensors: list) -> None:
    """What `realize` issues for computed `tensors` (a Storage each), prepared on this thread."""
    items = []
    for t in tensors:
        node = t.node
        storage = t._swap = engine_realize.Storage(node)
        items.append((node, storage))
    job = Job(None, [])
    job.record = None
    engine_realize._prepare(job, items, [], versions.pending_heads())


def chain(device: str, n: int) -> tuple[float, float]:
    x = Tensor.empty(16, device=device)
    start = clock()
    for _ in range(n):
        x = (x + 1).contiguous()
    built = clock()
    _prepare([x])
    done = clock()
    x.wait()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def independent(device: str, n: int) -> tuple[float, float]:
    xs = [Tensor.empty(16, device=device) for _ in range(n)]
    start = clock()
    ys = [x + 1 for x in xs]
    built = clock()
    _prepare(ys)
    done = clock()
    for y in ys:
        y.wait()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def build_per_op(case: str, n: int = 300) -> float:
    """Microseconds of thread CPU per elementwise op to build `n` ops of `case` (new nodes each time:
    every op reads the previous result), the minimum of 12 repeats."""
    x = Tensor.ones(16, device="CPU").contiguous().realize().wait()
    y = Tensor.ones(16, device="CPU").contiguous().realize().wait()
    steps = {"x + 1": (lambda z: z + 1, 1), "x * y": (lambda z: z * y, 1), "relu": (lambda z: z.relu(), 2),
             "10-op chain": (lambda z: (((z + 1) * y - 2).relu() / 3 + y) * 0.5 - z.exp().sqrt(), 11)}
    step, ops = steps[case]
    best = float("inf")
    for _ in range(12):
        z = x
        start = clock()
        for _ in range(n // ops):
            z = step(z)
        best = min(best, (clock() - start) / (n // ops * ops) * 1e6)
    return best


def round_trip(library: str, count: int = 300) -> tuple[float, float]:
    """`x = x + 1; await x.realize()` on 16 CPU elements under `library`: microseconds of process CPU per
    round trip (the median of 5 blocks of `count`, after 50 warm-ups), and Python calls per round trip
    (cProfile over 200 more)."""
    import asyncio
    import cProfile
    import pstats

    import trio

    async def body() -> tuple[float, float]:
        x = Tensor.zeros(16, device="CPU").contiguous()
        await x.realize()
        for _ in range(50):
            x = x + 1
            await x.realize()
        blocks = []
        for _ in range(5):
            start = time.process_time()
            for _ in range(count):
                x = x + 1
                await x.realize()
            blocks.append((time.process_time() - start) / count * 1e6)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(200):
            x = x + 1
            await x.realize()
        profile.disable()
        return sorted(blocks)[2], pstats.Stats(profile).total_calls / 200
    return trio.run(body) if library == "trio" else asyncio.run(body())


def main() -> None:
    results, rows = {}, []
    build = {case: build_per_op(case) for case in ("x + 1", "x * y", "relu", "10-op chain")}
    trips = {library: round_trip(library) for library in ("trio", "asyncio")}
    print(table("building elementwise nodes (us of thread CPU per op, min of 12 x 300 ops; lower is better)",
                ["case", "us/op"], list(build.items())))
    print(table("eager round trip x = x + 1; await x.realize() (16 CPU elements, process CPU)",
                ["library", "us", "Python calls"], [(k, v[0], v[1]) for k, v in trips.items()]))
    results["build_us_per_op"] = build
    results["round_trip"] = {k: {"process_cpu_us": v[0], "python_calls": v[1]} for k, v in trips.items()}
    for device in ("NULL", "CPU"):
        for name, case in (("chain", chain), ("independent", independent)):
            for _ in range(3):
                case(device, 300)
            runs = [case(device, 300) for _ in range(15)]
            build, prepare = min(r[0] for r in runs), min(r[1] for r in runs)
            results[f"{device}_{name}"] = {"build_us_per_task": build, "prepare_us_per_task": prepare}
            rows.append((f"atensor {device}", name, build, prepare))
    print(table("eager host CPU per task (us, thread time, min of 15 x 300 tasks; lower is better)",
                ["system", "workload", "build nodes", "prepare+schedule+plan+submit"], rows))
    print(f"wrote {write_results('eager_host_cpu', {'atensor': results})}")


if __name__ == "__main__":
    main()
