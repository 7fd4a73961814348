"""Quickstart: two devices busy at once from one awaited realize, while the event loop keeps ticking.

    python examples/quickstart.py
"""
from __future__ import annotations

import time

import trio

from atensor import Tensor
from atensor.profiler import ticking


async def main() -> None:
    Tensor.manual_seed(0)
    a = Tensor.rand(2048, 2048)                       # lazy, default device "CPU"
    b = (a @ a.T).relu().sum(axis=1)                  # lazy
    c = (a.to("CPU:1") * 2 + 1).max(axis=0)           # copy on a copy queue, compute on device CPU:1
    async with ticking() as lag:                      # a 1 ms ticker beside the realize
        start = time.perf_counter()
        await Tensor.realize(b, c)                    # one task graph, both devices busy at once
        elapsed = time.perf_counter() - start
    print(f"realized b {b.shape} on {b.device} and c {c.shape} on {c.device} in {elapsed * 1000:.1f} ms")
    print("b[:4] =", b.numpy()[:4])                   # realized: sync access is fine
    print("c[:4] =", c.numpy()[:4])
    print(f"event loop: {lag.ticks} ticks of 1 ms while realizing, longest gap {lag.worst * 1000:.1f} ms")


if __name__ == "__main__":
    trio.run(main)
    # and in a plain script, with no async code at all:
    print("plain script:", (Tensor([1, 2, 3]) + 1).tolist())
