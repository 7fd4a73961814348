"""How long the event loop was held: a 1 ms ticker beside the code under watch.

    async with ticking() as lag:
        await work()
    print(lag.worst, lag.ticks)

A task that sleeps 1 ms in a loop records the time between its wake-ups. A loop that is never held
shows gaps near 1 ms; a loop blocked by a synchronous call, a stop-the-world garbage collection or
a thread that keeps the GIL shows one gap as long as the block. This is the measure atensor's
concurrency model is judged by (docs/design.md: the loop's longest gap stays bounded), used by the tests,
bench/loop_lag.py and examples/quickstart.py. It runs under trio or asyncio (detected with sniffio),
and needs nothing of atensor.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import sniffio
import trio


@dataclass
class LoopLag:
    """The gaps (seconds) between the ticker's wake-ups."""
    gaps: list[float] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """The longest gap: how long the loop was held at most (0 before the first tick)."""
        return max(self.gaps, default=0.0)

    @property
    def ticks(self) -> int:
        return len(self.gaps)


@contextlib.asynccontextmanager
async def ticking(interval: float = 0.001, settle: float = 0.01) -> AsyncIterator[LoopLag]:
    """Ticks every `interval` seconds while the block runs (after `settle` seconds of ticking, so the
    ticker is running when the block starts); yields the LoopLag the gaps go into."""
    lag = LoopLag()
    if sniffio.current_async_library() == "trio":
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_tick, lag, stop.is_set, trio.sleep, interval)
            await trio.sleep(settle)
            try:
                yield lag
            finally:
                stop.set()
        return
    done = asyncio.Event()
    task = asyncio.ensure_future(_tick(lag, done.is_set, asyncio.sleep, interval))
    await asyncio.sleep(settle)
    try:
        yield lag
    finally:
        done.set()
        await task


async def _tick(lag: LoopLag, stopped, sleep, interval: float) -> None:
    last = time.perf_counter()
    while not stopped():
        await sleep(interval)
        now = time.perf_counter()
        lag.gaps.append(now - last)
        last = now
