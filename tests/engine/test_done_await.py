"""An await whose realize already ran on the caller's thread (a tiny plan, a record replay) is a
cancellation point on every call and a scheduling point at least every `loop.YIELD_EVERY_NS`
(hcq/loop.py `checkpoint`): other tasks keep their turn, a cancelled task stops at its next await,
under trio, asyncio and uvloop. Run as users run (small realizes planned inline)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import trio

from atensor import Tensor
from atensor.backend.c import registry
from atensor.engine.program import HOT_HITS
from atensor.hcq import loop
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings


MIN_LOOP_NS = 200_000_000


async def _sleep(library: str, seconds: float) -> None:
    await (trio.sleep(seconds) if library == "trio" else asyncio.sleep(seconds))


@pytest.mark.parametrize("library", ["trio", "asyncio", "uvloop"])
@pytest.mark.parametrize("every_ns", [0, 500_000])
def test_a_loop_of_done_awaits_gives_other_tasks_their_turn(library, every_ns, monkeypatch):
    monkeypatch.setattr(loop, "YIELD_EVERY_NS", every_ns)
    ticks: list[int] = []  # when the other task ran
    count = 200

    async def main() -> None:
        done = False

        async def ticker() -> None:
            while not done:
                ticks.append(time.perf_counter_ns())
                await _sleep(library, 0)

        async def awaiter() -> None:
            nonlocal done
            x = Tensor(np.zeros(16, dtype=np.float32)).contiguous()
            await x.realize()
            # the graph made hot first: its kernel's compile in the background (engine/program.py's twin)
            # competes with this loop once, for tens of ms on a loaded machine; measured after it, the
            # loop's turns are what this test is about (the faster the round trip, the larger that
            # one stall is against the loop's time)
            for _ in range(HOT_HITS + 2):
                x = x + 1
                await x.realize()
            registry.wait_background()
            for _ in range(4):
                x = x + 1
                await x.realize()
            warm = HOT_HITS + 6
            await _sleep(library, 0)
            start = time.perf_counter_ns()
            made = 0
            # `count` awaits, and for at least MIN_LOOP_NS: a loop of fast round trips must still be long
            # against the scheduling gaps a loaded machine gives any process (~10 ms at load 13 here)
            while made < count or time.perf_counter_ns() - start < MIN_LOOP_NS:
                x = x + 1
                await x.realize()  # a tiny plan: done when the await starts
                made += 1
            end = time.perf_counter_ns()
            done = True
            assert x.tolist() == [float(made + warm)] * 16
            during = [start] + [t for t in ticks if start <= t <= end] + [end]
            if every_ns == 0:  # every await yields
                assert len(during) - 2 >= made - 1, (len(during), made)
            else:  # at least once per budget and call: far more often than a few times in the loop
                longest = max(b - a for a, b in zip(during, during[1:]))
                assert longest < (end - start) / 3, (longest, end - start, len(during))
        if library == "trio":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                nursery.start_soon(awaiter)
        else:
            await asyncio.gather(ticker(), awaiter())
    run_on(library, main)


def test_a_cancelled_trio_task_stops_at_a_done_await_that_does_not_yield(monkeypatch):
    monkeypatch.setattr(loop, "YIELD_EVERY_NS", 10**12)  # no await here yields: cancellation still lands

    async def main() -> None:
        x = Tensor(np.zeros(16, dtype=np.float32)).contiguous()
        await x.realize()
        with trio.CancelScope() as scope:
            scope.cancel()
            x = x + 1
            await x.realize()
            pytest.fail("the await of a cancelled task returned")
        assert scope.cancelled_caught
        await x  # cancelling stopped the waiting only: the realize ran (or runs) all the same
        assert x.tolist() == [1.0] * 16
    trio.run(main)


@pytest.mark.parametrize("library", ["asyncio", "uvloop"])
def test_a_cancelled_asyncio_task_stops_within_the_yield_budget(library):
    async def main() -> None:
        awaited = 0

        async def spin() -> None:
            nonlocal awaited
            x = Tensor(np.zeros(16, dtype=np.float32)).contiguous()
            await x.realize()
            while True:
                x = x + 1
                await x.realize()
                awaited += 1
        task = asyncio.ensure_future(spin())
        for _ in range(5000):  # until it is looping on its awaits
            await asyncio.sleep(0.001)
            if awaited > 10:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert awaited > 0
    run_on(library, main)
