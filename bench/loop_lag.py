"""Event-loop lag: the longest gap of a 1 ms trio ticker while a realize of about a second runs.

    python bench/loop_lag.py

Workloads: a few big kernels (matmuls), 10,000 tiny kernels as 10,000 outputs, and a chain of
10,000 tiny kernels realized as one output. The graphs are built before the clock starts. Beside them, in the same run,
the same work done the usual ways: numpy called directly in the trio task (the loop blocks), and
numpy through `trio.to_thread.run_sync` in many small calls (the GIL convoy). Target (issue 2): at
most 10 ms for atensor in both workloads.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.profiler import ticking  # noqa: E402

TINY = 10_000


async def measure(work: Callable[[], Awaitable[None]]) -> tuple[float, float, int]:
    async with ticking(settle=0.02) as lag:
        start = time.perf_counter()
        await work()
        elapsed = time.perf_counter() - start
    return elapsed, lag.worst, lag.ticks


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


async def numpy_in_loop_big() -> None:
    for a in big_inputs():
        np.tanh((a @ a.T) @ a).sum()


async def numpy_to_thread_tiny() -> None:
    xs = [np.full(16, i, dtype=np.float32) for i in range(TINY)]

    def work() -> None:
        for x in xs:
            (x * 2 + 1).sum()
    await trio.to_thread.run_sync(work)


async def numpy_in_loop_tiny() -> None:
    for i in range(TINY):
        (np.full(16, i, dtype=np.float32) * 2 + 1).sum()


async def main() -> None:
    cases = [("big kernels (4 x 1024^3 matmul chains)", "atensor await realize", atensor_big),
             ("big kernels (4 x 1024^3 matmul chains)", "numpy in the trio task", lambda: numpy_in_loop_big),
             (f"{TINY} tiny kernels", "atensor await realize", atensor_tiny),
             (f"chain of {TINY} tiny kernels", "atensor await realize", atensor_tiny_chain),
             (f"{TINY} tiny kernels", "numpy via trio.to_thread", lambda: numpy_to_thread_tiny),
             (f"{TINY} tiny kernels", "numpy in the trio task", lambda: numpy_in_loop_tiny)]
    rows, results = [], []
    for workload, system, make in cases:
        await measure(make())  # warm up
        elapsed, worst, ticks = await measure(make())
        rows.append((workload, system, elapsed * 1e3, worst * 1e3, ticks))
        results.append({"workload": workload, "system": system, "elapsed_ms": elapsed * 1e3,
                        "longest_gap_ms": worst * 1e3, "ticks": ticks})
    print(table("event-loop lag: longest gap of a 1 ms ticker during the work (lower is better)",
                ["workload", "system", "work ms", "longest gap ms", "ticks"], rows))
    print("wrote", write_results("loop_lag", {"cases": results}))


if __name__ == "__main__":
    trio.run(main)
