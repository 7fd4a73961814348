# Collecting: `with` and `async with`, nesting, threads, and nothing recorded when inactive.
from __future__ import annotations

import threading

import pytest
import trio

from atensor.profiler import (
    HostSpan,
    MemoryEvent,
    Profile,
    Span,
    is_active,
    profile,
    record_host,
    record_memory,
    record_span,
    set_clock_offset,
)


def span(task_id: int, start: int = 0, queue: str = "compute") -> Span:
    return Span("CPU:0", queue, task_id, f"k{task_id}", "kernel", start, start + 10)


def test_nothing_is_recorded_while_no_profile_is_active():
    prof = profile()
    assert not is_active()
    record_span(span(1))
    record_host(HostSpan("s", "schedule", 0, 1))
    record_memory(MemoryEvent("CPU:0", 0, 1))
    assert (prof.spans, prof.host_spans, prof.memory) == ([], [], [])


def test_with_block_collects_every_kind_of_event_then_stops():
    with profile() as prof:
        assert is_active() and prof.active
        record_span(span(1))
        record_host(HostSpan("s", "schedule", 0, 1))
        record_memory(MemoryEvent("CPU:0", 0, 64))
    assert not is_active() and not prof.active
    record_span(span(2))
    assert [s.task_id for s in prof.spans] == [1]
    assert len(prof.host_spans) == 1 and len(prof.memory) == 1
    assert prof.start_ns is not None and prof.end_ns is not None and prof.start_ns <= prof.end_ns


def test_the_profile_stops_when_the_block_raises():
    with pytest.raises(KeyError):
        with profile():
            raise KeyError("boom")
    assert not is_active()


async def test_async_with_collects_across_awaits_and_trio_tasks():
    async def worker(task_id: int) -> None:
        await trio.sleep(0.01)
        record_span(span(task_id))

    async with profile() as prof:
        async with trio.open_nursery() as nursery:
            for task_id in range(5):
                nursery.start_soon(worker, task_id)
    assert sorted(s.task_id for s in prof.spans) == [0, 1, 2, 3, 4]
    assert not is_active()


def test_nested_profiles_each_see_their_own_window():
    with profile() as outer:
        record_span(span(1))
        with profile() as inner:
            record_span(span(2))
        record_span(span(3))
    assert [s.task_id for s in outer.spans] == [1, 2, 3]
    assert [s.task_id for s in inner.spans] == [2]


def test_overlapping_profiles_that_do_not_nest_work_too():
    first, second = profile(), profile()
    first.__enter__()
    record_span(span(1))
    second.__enter__()
    record_span(span(2))
    first.__exit__(None, None, None)
    record_span(span(3))
    second.__exit__(None, None, None)
    assert [s.task_id for s in first.spans] == [1, 2]
    assert [s.task_id for s in second.spans] == [2, 3]
    assert not is_active()


def test_a_profile_collects_only_once():
    prof = profile()
    with prof:
        pass
    with pytest.raises(RuntimeError, match="once"):
        with prof:
            pass


def test_queue_worker_threads_record_concurrently_without_losing_spans():
    per_thread = 2_000
    with profile() as prof:
        def worker(queue: str) -> None:
            for i in range(per_thread):
                record_span(span(i, queue=queue))

        threads = [threading.Thread(target=worker, args=(f"q{k}",)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(prof.spans) == 4 * per_thread


def test_clock_offsets_known_at_start_and_set_while_active_are_kept():
    set_clock_offset("CPU:0", "copy", 500)
    with profile() as prof:
        set_clock_offset("CPU:0", "compute", -200)
        record_span(span(1, start=1_000))
        record_span(span(2, start=1_000, queue="copy"))
    set_clock_offset("CPU:0", "copy", 9_999)   # measured again later: does not change this profile
    assert prof.clock_offsets == {("CPU:0", "copy"): 500, ("CPU:0", "compute"): -200}
    starts = {p.span.task_id: p.start for p in prof.timeline().spans}
    assert starts[2] - starts[1] == 700


def test_repr_says_what_was_collected():
    with profile() as prof:
        assert "active" in repr(prof)
        record_span(span(1))
    assert repr(prof) == "<Profile done: 1 spans, 0 host spans, 0 memory samples>"
    assert "new" in repr(Profile())


async def test_the_loop_ticker_sees_a_blocked_loop_and_not_a_free_one():
    import time

    import trio

    from atensor.profiler import ticking
    async with ticking() as free:
        await trio.sleep(0.05)
    async with ticking() as blocked:
        time.sleep(0.08)  # holds the loop: one gap as long as the block
    assert free.ticks > 10 and free.worst < 0.06
    assert blocked.worst >= 0.08
