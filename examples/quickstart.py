"""Quickstart: two devices busy at once from one awaited realize, while the event loop keeps ticking.

    python examples/quickstart.py
"""
from __future__ import annotations

import time

import trio

from atensor import Tensor


async def ticker(stop: trio.Event, gaps: list[float]) -> None:
    """Sleeps 1 ms in a loop and records the longest gap: a blocked loop would show here."""
    last = time.perf_counter()
    while not stop.is_set():
        await trio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def main() -> None:
    Tensor.manual_seed(0)
    a = Tensor.rand(2048, 2048)                       # lazy, default device "CPU"
    b = (a @ a.T).relu().sum(axis=1)                  # lazy
    c = (a.to("CPU:1") * 2 + 1).max(axis=0)           # copy on a copy queue, compute on device CPU:1
    stop, gaps = trio.Event(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker, stop, gaps)
        start = time.perf_counter()
        await Tensor.realize(b, c)                    # one task graph, both devices busy at once
        elapsed = time.perf_counter() - start
        stop.set()
    print(f"realized b {b.shape} on {b.device} and c {c.shape} on {c.device} in {elapsed * 1000:.1f} ms")
    print("b[:4] =", b.numpy()[:4])                   # realized: sync access is fine
    print("c[:4] =", c.numpy()[:4])
    print(f"event loop: {len(gaps)} ticks of 1 ms while realizing, longest gap {max(gaps) * 1000:.1f} ms")


if __name__ == "__main__":
    trio.run(main)
    # and in a plain script, with no async code at all:
    print("plain script:", (Tensor([1, 2, 3]) + 1).tolist())
