"""Timeline signals awaited from trio: woken by a value set on another thread, cancellable, reusable.

No test sleeps to let something happen: `wait_all_tasks_blocked` returns once every task is parked and
every wake-up already delivered (a value set on a joined thread) has run, so what a test asserts after
it does not depend on how fast this machine is.

Both wake-up mechanisms of hcq/loop.py are tested: the eventfd a waiting task polls (Linux) and the
task rescheduled through the trio token (elsewhere). tests/hcq/test_loop.py does the same under asyncio."""
import threading
import time

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from atensor.hcq import loop as loop_module
from atensor.hcq.signal import Signal, SignalFailed, wait_all

MECHANISMS = ["eventfd", "reschedule"] if loop_module._EVENTFD else ["reschedule"]


@pytest.fixture(params=MECHANISMS)
def mechanism(request, monkeypatch):
    monkeypatch.setattr(loop_module, "_EVENTFD", request.param == "eventfd")
    return request.param


def _set_later(sig: Signal, value: int, delay: float, error: BaseException | None = None) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        sig.set(value, (0, 1), error)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_a_value_set_on_another_thread_wakes_every_waiter_it_reaches(mechanism):
    sig = Signal("test/q")
    woken: list[int] = []

    async def waiter(value: int) -> None:
        await sig.wait(value)
        woken.append(value)

    async with trio.open_nursery() as nursery:
        for value in (1, 2, 3):
            nursery.start_soon(waiter, value)
        await wait_all_tasks_blocked()
        assert sig.statistics()["waiters"] == 3
        _set_later(sig, 2, 0.0).join()
        await wait_all_tasks_blocked()
        assert sorted(woken) == [1, 2]  # 3 is not reached yet
        assert sig.statistics()["waiters"] == 1
        _set_later(sig, 3, 0.0).join()
    assert sorted(woken) == [1, 2, 3]
    assert sig.statistics()["waiters"] == 0


async def test_a_cancelled_wait_leaves_no_waiter_and_the_next_wait_is_not_woken_early(mechanism):
    sig = Signal("test/q")
    with trio.move_on_after(0.05) as scope:
        await sig.wait(1)
    assert scope.cancelled_caught
    assert sig.statistics()["waiters"] == 0
    sig.set(1, (0, 1))  # nobody waits for it any more
    returned = trio.Event()

    async def wait_for_2() -> None:
        await sig.wait(2)  # reuses the idle eventfd: a stale wake-up must not end it before 2 is set
        assert sig.value >= 2
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_2)
        await wait_all_tasks_blocked()
        assert not returned.is_set() and sig.statistics()["waiters"] == 1
        _set_later(sig, 2, 0.0).join()
    assert returned.is_set()


async def test_a_set_racing_a_cancellation_is_harmless(mechanism):
    sig = Signal("test/q")
    for value in range(1, 40):
        thread = _set_later(sig, value, 0.001 * (value % 3))
        with trio.move_on_after(0.001 * (value % 4)):
            await sig.wait(value)
        thread.join()
    await sig.wait(39)  # already reached: returns at once
    assert sig.statistics()["waiters"] == 0


async def test_a_failed_value_raises_from_a_checked_wait(mechanism):
    sig = Signal("test/q")
    thread = _set_later(sig, 1, 0.0, ValueError("kernel broke"))
    with pytest.raises(SignalFailed, match="kernel broke"):
        await sig.wait(1)
    await sig.wait(1, check=False)
    thread.join()


async def test_wait_all_returns_once_every_signal_is_reached_and_cleans_up(mechanism):
    a, b, c = Signal("test/a"), Signal("test/b"), Signal("test/c")
    c.set(5, (0, 1))  # already reached: not waited for
    done = trio.Event()

    async def waiter() -> None:
        await wait_all([(a, 1), (b, 2), (c, 5)])
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await wait_all_tasks_blocked()
        _set_later(b, 2, 0.0).join()
        await wait_all_tasks_blocked()
        assert not done.is_set()  # a is still running
        _set_later(a, 1, 0.0).join()
        with trio.fail_after(10):
            await done.wait()
    assert all(s.statistics()["waiters"] == 0 for s in (a, b, c))


async def test_a_cancelled_wait_all_leaves_no_waiter_and_late_values_do_not_wake_the_next_one(mechanism):
    a, b = Signal("test/a"), Signal("test/b")
    with trio.move_on_after(0.05) as scope:
        await wait_all([(a, 1), (b, 1)])
    assert scope.cancelled_caught
    assert a.statistics()["waiters"] == 0 and b.statistics()["waiters"] == 0
    a.set(1, (0, 1))
    b.set(1, (0, 1))
    returned = trio.Event()

    async def wait_for_both() -> None:
        await wait_all([(a, 2), (b, 1)])  # b is reached; a must really be set first
        assert a.value >= 2
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_both)
        await wait_all_tasks_blocked()
        assert not returned.is_set()
        _set_later(a, 2, 0.0).join()
    assert returned.is_set()


async def test_wait_all_waits_once_per_signal_for_its_newest_value(mechanism):
    """A realize of many outputs lists a value per output: waiting for each of them would make every
    publish of the queue scan them all (quadratic in the outputs)."""
    a, b = Signal("test/a"), Signal("test/b")
    targets = [(a, v) for v in range(1, 1001)] + [(b, v) for v in range(1, 1001)]
    seen: list[int] = []

    async def watch() -> None:
        await wait_all_tasks_blocked()
        seen.append(a.statistics()["waiters"] + b.statistics()["waiters"])
        _set_later(a, 1000, 0.0).join()
        _set_later(b, 1000, 0.0).join()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        with trio.fail_after(10):
            await wait_all(targets)
    assert a.value == b.value == 1000
    assert seen == [2]  # one waiter per signal


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_a_kept_failure_says_where_it_failed_but_keeps_none_of_the_failed_commands_locals():
    """A signal keeps a failed value's exception for as long as it lives; the locals of the frames its
    traceback passes through (a kernel's arrays) are released, the text of the traceback is not."""
    import gc
    import traceback
    import weakref

    from atensor.backend.runner import Runner
    from atensor.hcq.queue import Command, KernelError, Queue

    class Big:
        pass
    made: list = []

    def failing_kernel() -> None:
        big = Big()  # a local of the failing frame: an array the kernel made, say
        made.append(weakref.ref(big))
        raise ValueError("the kernel's own error")

    queue = Queue("CPU:7", "failures")
    value = queue.reserve() + 1
    queue.submit([Command(value, (), Runner(failing_kernel), "failing", "kernel", 0)])
    queue.signal.wait_blocking(value, check=False)
    kept = queue.signal.failure(value)
    assert isinstance(kept, KernelError) and isinstance(kept.__cause__, ValueError)
    gc.collect()
    assert made[0]() is None, "the failure kept the failing frame's locals alive"
    text = "".join(traceback.format_exception(kept.__cause__))
    assert "in failing_kernel" in text and "the kernel's own error" in text
    with pytest.raises(SignalFailed, match="the kernel's own error"):
        queue.signal.wait_blocking(value)
