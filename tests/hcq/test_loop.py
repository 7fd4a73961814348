"""The event-loop seam (hcq/loop.py) under asyncio: signals woken from another thread through the
loop's persistent eventfd reader or call_soon_threadsafe, cancelled waits, blocking work off the
loop, and the errors for loops atensor does not support. tests/hcq/test_signal.py covers trio."""
import asyncio
import os
import threading
import time

import pytest
import sniffio
import trio

from atensor.hcq import loop as loop_module
from atensor.hcq.signal import Signal, wait_all

MECHANISMS = ["eventfd", "call_soon_threadsafe"] if loop_module._EVENTFD else ["call_soon_threadsafe"]


@pytest.fixture(params=MECHANISMS)
def mechanism(request, monkeypatch):
    monkeypatch.setattr(loop_module, "_EVENTFD", request.param == "eventfd")
    return request.param


def _set_later(sig: Signal, value: int, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        sig.set(value, (0, 1))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_value_set_on_another_thread_wakes_asyncio_waiters(mechanism):
    async def main() -> None:
        sig = Signal("test/q")
        woken: list[int] = []

        async def waiter(value: int) -> None:
            await sig.wait(value)
            woken.append(value)

        tasks = [asyncio.create_task(waiter(v)) for v in (1, 2, 3)]
        await asyncio.sleep(0.01)
        _set_later(sig, 2, 0.0).join()
        await asyncio.sleep(0.2)
        assert sorted(woken) == [1, 2]
        _set_later(sig, 3, 0.0).join()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert sorted(woken) == [1, 2, 3] and sig.statistics()["waiters"] == 0
    asyncio.run(main())


def test_asyncio_cancellation_leaves_no_waiter_and_a_set_racing_it_is_harmless(mechanism):
    async def main() -> None:
        sig = Signal("test/q")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sig.wait(1), 0.05)
        assert sig.statistics()["waiters"] == 0
        for value in range(1, 40):
            thread = _set_later(sig, value, 0.001 * (value % 3))
            try:
                await asyncio.wait_for(sig.wait(value), 0.001 * (value % 4))
            except asyncio.TimeoutError:
                pass
            thread.join()
        a, b = Signal("test/a"), Signal("test/b")
        task = asyncio.create_task(wait_all([(a, 1), (b, 1)]))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert a.statistics()["waiters"] == 0 and b.statistics()["waiters"] == 0
        late = _set_later(a, 1, 0.1)
        b.set(1, (0, 1))
        start = time.perf_counter()
        await asyncio.wait_for(wait_all([(a, 1), (b, 1)]), 10)
        assert a.value == 1 and time.perf_counter() - start >= 0.05
        late.join()
    asyncio.run(main())


def test_asyncio_loops_that_closed_give_their_eventfd_back(mechanism):
    async def once() -> None:
        sig = Signal("test/q")
        _set_later(sig, 1, 0.01)
        await sig.wait(1)

    asyncio.run(once())
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    for _ in range(20):
        asyncio.run(once())
    after = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    assert after - before <= 2  # one reader per live loop, not one per loop ever run
    assert len(loop_module._readers) <= 2


def test_run_sync_runs_blocking_work_off_the_loop_on_both_loops():
    async def main() -> tuple[bool, int]:
        caller = threading.get_ident()
        other = await loop_module.run_sync(lambda: threading.get_ident() != caller)
        return other, 42
    assert asyncio.run(main()) == (True, 42)
    assert trio.run(main) == (True, 42)


def test_the_running_library_is_named_and_an_unsupported_one_is_refused():
    assert loop_module.running_library() is None and not loop_module.in_running_loop()

    async def name() -> str:
        return loop_module.current_library()
    assert asyncio.run(name()) == "asyncio" and trio.run(name) == "trio"

    async def waits() -> None:
        await Signal("test/q").wait(1)
    coro = waits()
    token = sniffio.current_async_library_cvar.set("curio")
    try:
        with pytest.raises(loop_module.UnsupportedLoopError, match="trio and asyncio.*not 'curio'"):
            coro.send(None)
    finally:
        sniffio.current_async_library_cvar.reset(token)
    with pytest.raises(loop_module.UnsupportedLoopError, match="no async library"):
        waits().send(None)
