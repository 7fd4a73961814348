"""The event loop's thread gets the GIL within about the `loop_switch_us` setting while the dispatcher thread
plans in pure Python (hcq/gilshare.py), not after CPython's default 5 ms switch interval."""
from __future__ import annotations

import statistics
import sys
import time

import anyio
import pytest

from atensor.config import process_settings
from atensor.engine.dispatch import Job, dispatcher
from tests.engine.loops import run_on


def _busy(seconds: float) -> None:
    """Pure Python that never gives the GIL back by itself (what planning a big graph is like)."""
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(200):
            total += i


def _thread_clock() -> tuple[int, int]:
    """The calling thread's CPU time and its wait for a core (run queue), both in ns (Linux)."""
    with open("/proc/thread-self/schedstat") as f:
        ran, waited = f.read().split()[:2]
    return int(ran), int(waited)


async def _tick_until_planned(job: Job) -> list[float]:
    """Ticks every 1 ms until the dispatcher has planned `job`; per tick, the time the loop's thread slept
    beyond its timer: the gap less the timer's 1 ms, the thread's own CPU time and its wait for a core
    (other processes on a busy machine), which leaves its wait for the GIL."""
    waits: list[float] = []
    last, (ran, queued) = time.perf_counter(), _thread_clock()
    while dispatcher.signal.value < job.value:
        await anyio.sleep(0.001)
        now, (ran_now, queued_now) = time.perf_counter(), _thread_clock()
        waits.append(now - last - 0.001 - (ran_now - ran) * 1e-9 - (queued_now - queued) * 1e-9)
        last, ran, queued = now, ran_now, queued_now
    return waits


async def _gil_waits_while_planning(seconds: float) -> list[float]:
    """Issues a dispatcher job that runs Python for `seconds`; the loop's GIL waits meanwhile
    (`_tick_until_planned`)."""
    job = Job(lambda: _busy(seconds), [])
    dispatcher.submit(job)
    waits = await _tick_until_planned(job)
    await dispatcher.signal.wait(job.value)
    return waits


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_the_loop_waits_for_the_gil_about_the_short_interval_while_the_dispatcher_plans(library, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("the thread's run-queue wait is read from Linux's /proc/thread-self/schedstat")
    monkeypatch.setattr(process_settings(), "loop_switch_us", 500)  # the default setting
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default
    try:
        waits = run_on(library, lambda: _gil_waits_while_planning(0.3))
        assert sys.getswitchinterval() == pytest.approx(0.005)  # given back after the job
    finally:
        sys.setswitchinterval(old)
    # with the default interval every tick waits ~5 ms for the GIL (median 4.9-5.2 ms measured); with
    # 0.5 ms, 0.3-0.6 ms. The bound is between the two, generous for a loaded machine.
    assert len(waits) >= 10
    assert statistics.median(waits) < 0.0025, sorted(waits)


def test_the_dispatcher_plans_under_the_short_interval_and_gives_the_one_found_back(monkeypatch):
    monkeypatch.setattr(process_settings(), "loop_switch_us", 500)
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    seen: list[float] = []
    try:
        job = dispatcher.submit(Job(lambda: seen.append(sys.getswitchinterval()), []))
        dispatcher.signal.wait_blocking(job.value)
        after = sys.getswitchinterval()
    finally:
        sys.setswitchinterval(old)
    assert seen == [pytest.approx(500e-6)]
    assert after == pytest.approx(0.005)


@pytest.mark.default_settings  # as users run: race proofs off (tests/conftest.py)
@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_the_loop_keeps_its_turns_while_three_thousand_outputs_are_planned(library, monkeypatch):
    """The real planner (schedule, its C key walk, commit, lowering) of one realize of 3,000 tiny outputs,
    on the dispatcher thread: the loop's ticks between the realize and its dispatch wait for the GIL
    about the short interval, as for the pure-Python job above."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the thread's run-queue wait is read from Linux's /proc/thread-self/schedstat")
    import numpy as np

    from atensor import Tensor
    monkeypatch.setattr(process_settings(), "loop_switch_us", 500)

    async def main() -> list[float]:
        outs = [(Tensor(np.full(16, i, dtype=np.float32)) * 2 + 1).sum() for i in range(3000)]
        Tensor.realize(*outs)
        job = outs[0]._pending.job
        waits = await _tick_until_planned(job)
        await outs[-1]
        assert outs[-1].item() == 16 * (2 * 2999 + 1)
        return waits
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        waits = run_on(library, main)
    finally:
        sys.setswitchinterval(old)
    assert len(waits) >= 10  # (planning 3,000 outputs takes 0.1-0.5 s here)
    # the three quarters of the ticks that waited least: 0.6 ms or less each with the short interval,
    # 5.1 ms or more with the default (measured, 6 runs each). Not the median: the C key walk gives
    # the GIL back by itself every millisecond (atensor/core/walk.c), so in a run that walks long the
    # median tick waits little even at the default interval.
    waits.sort()
    assert waits[int(0.75 * (len(waits) - 1))] < 0.0025, waits


def test_the_awaiting_task_checks_one_wait_per_signal_however_many_outputs_a_realize_has():
    """A realize of many outputs leaves a pending write per output buffer on the same queue's signal; the
    dispatcher folds them to the largest value per signal, so the awaiting task (on the event loop's
    thread) checks one wait per signal, while each write is still kept for its failure."""
    import numpy as np

    from atensor import Tensor
    outs = [(Tensor(np.full(4, i, dtype=np.float32)) + 1).sum() for i in range(300)]
    handle = Tensor.realize(*outs)._pending
    handle.wait()
    job = handle.job
    largest: dict = {}
    for signal, value in job.extra_waits:  # (those the queue had not run yet when the dispatcher looked)
        largest[signal] = max(largest.get(signal, 0), value)
    assert job.extra_final == largest
    assert len(job.extra_final) <= 1  # one CPU queue computes them all
    assert handle.done() and handle._waits() == [(q.signal, v) for q, v in job.submission.final.items()] + \
        list(largest.items())
    assert [t.item() for t in outs[:3]] == [4.0, 8.0, 12.0]


def test_a_big_realized_chain_frees_its_lazy_graph_on_the_reaper_thread_not_where_the_tensor_is_read():
    """Reading a tensor whose big realize committed drops its lazy graph; the reaper frees those nodes a
    node at a time on its own thread (engine/dispatch.py `Reaper.bury`), and keeps what others hold."""
    import threading
    import time
    import weakref

    import numpy as np

    from atensor import Tensor
    x0 = Tensor(np.zeros(4, dtype=np.float32))
    x, middle = x0, None
    for i in range(200):  # 600 nodes: past the reaper's slice of 256
        x = (x * 0.5 + 1).contiguous()
        if i == 100:
            middle = x.node
    freed_on: list[str] = []
    ref = weakref.ref(middle, lambda _: freed_on.append(threading.current_thread().name))
    del middle
    x.realize().wait()
    assert x.numpy().tolist() == [2.0 * (1 - 0.5 ** 200)] * 4  # (reads x.node: the graph is dead now)
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert freed_on == ["atensor-reaper"]
    assert x0.numpy().tolist() == [0.0] * 4  # the input, which the graph shared, is alive and intact

