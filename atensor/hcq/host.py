"""The host side of a realize: dispatch off the event loop, await timeline values from trio.

Why a dispatcher thread: turning a large graph into a TaskGraph and command lists is Python work
that can take longer than an event loop may stall. `realize()` therefore only records what to
realize and hands it to one dispatcher thread, which schedules, plans and submits; the trio task
then parks on timeline values. One FIFO thread also gives concurrent realizes a total order: the
order in which they were issued, which is what makes assigns from several trio tasks serialize in
program order.

The dispatcher is itself a timeline: job k publishes value k of the `host/dispatch` signal once its
command lists are on the queues (or marks k failed with the scheduling error), so the host waits on
it with the same mechanism as on any queue.

Cancellation: cancelling `await handle` stops the waiting only. The job is dispatched and its
commands run to completion, like commands on a GPU; a later await of the same tensor finds the
buffer's pending writes and waits for them, and a buffer is never read half-written.
"""
from __future__ import annotations

import collections
import contextvars
import threading
import time
from typing import Any, Callable, Generator, Optional

from atensor.config import settings
from atensor.hcq.buffer import Buffer
from atensor.hcq.executor import Submission
from atensor.hcq.gcpause import gc_paused
from atensor.hcq.queue import lower_priority
from atensor.hcq.signal import Signal, SignalFailed, wait_all
from atensor.profiler import collector
from atensor.profiler.events import HostSpan


# While atensor.jit captures a call, the list its realizes record their schedules into (replay.py).
# A context variable, so only the capturing trio task (and the tasks it starts) records.
recording: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("atensor_recording", default=None)


class Job:
    """One realize: a function that schedules and submits (run on the dispatcher thread) and the
    buffers whose pending writes the caller wants to wait for. `record`, when set, receives the
    schedule the job ran (see replay.py)."""
    __slots__ = ("plan", "wait_for", "value", "submission", "extra_waits", "done_buffers", "record")

    def __init__(self, plan: Optional[Callable[[], Optional[Submission]]], wait_for: list[Buffer],
                 done_buffers: list[Buffer]):
        self.plan, self.wait_for, self.done_buffers = plan, wait_for, done_buffers
        self.value = 0
        self.submission: Optional[Submission] = None
        self.extra_waits: list[tuple[Signal, int]] = []
        self.record: Optional[list] = None


class Dispatcher:
    """A FIFO thread that schedules and submits realizes in the order they were issued."""

    def __init__(self) -> None:
        self.signal = Signal("host/dispatch")
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._issued = 0
        self._busy = False  # a job is being planned (here or inline); guarded by _cond
        self._thread: Optional[threading.Thread] = None

    def submit(self, job: Job) -> Job:
        with self._cond:
            self._issued += 1
            job.value = self._issued
            self._jobs.append(job)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="atensor-dispatch", daemon=True)
                self._thread.start()
        return job

    def statistics(self) -> dict:
        with self._cond:
            return {"queued_jobs": len(self._jobs), "issued": self._issued, "dispatched": self.signal.value}

    def run_inline(self, job: Job) -> bool:
        """Plans `job` on the calling thread when nothing is queued or being planned (so program order
        holds) and returns True; False when the job must go through `submit`. For cheap plans (a jit
        replay): the caller then waits for the queues only, without a wake-up for the dispatch.
        Errors of the plan are raised here."""
        with self._cond:
            if self._jobs or self._busy:
                return False
            self._busy = True
        try:
            with gc_paused():
                job.submission = job.plan()
        finally:
            for buf in job.done_buffers:
                buf.hold(-1)
            job.plan = None
            with self._cond:
                self._busy = False
                if self._jobs:  # one came while this was planned; else the idle dispatcher need not wake
                    self._cond.notify()
        return True

    def _work(self) -> None:
        lower_priority(settings.worker_nice)
        while True:
            with self._cond:
                while not self._jobs or self._busy:
                    self._cond.wait()
                job = self._jobs.popleft()
                self._busy = True
            error: Optional[BaseException] = None
            start = time.perf_counter_ns()
            try:
                with gc_paused():  # see gcpause.py: collections here would stall the event loop
                    job.submission = job.plan()
                    for buf in job.wait_for:
                        job.extra_waits.extend(buf.pending_writes())
            except Exception as exc:  # reported to whoever awaits the job
                error = exc
            finally:
                for buf in job.done_buffers:
                    buf.hold(-1)
            end = time.perf_counter_ns()
            if collector.is_active():
                collector.record_host(HostSpan(f"schedule+submit job {job.value}", "schedule", start, end))
            self.signal.set(job.value, (start, end), error)
            job.plan = None  # the graph's nodes; only the handle's submission is still needed
            del job  # a finished job must not keep its buffers alive while the dispatcher waits
            with self._cond:
                self._busy = False


dispatcher = Dispatcher()


class RealizeHandle:
    """Returned by `realize()`: the work is already dispatched. `await handle` waits for it (from
    trio); `handle.wait()` blocks (outside an event loop). Awaiting returns `result`."""

    def __init__(self, job: Job, result: Any):
        self.job, self.result = job, result
        self._error: Optional[BaseException] = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait_async().__await__()

    async def _wait_async(self) -> Any:
        start = time.perf_counter_ns()
        try:
            await dispatcher.signal.wait(self.job.value, check=False)
            self._raise_dispatch_error()
            await wait_all(self._waits())
            self._raise_task_error()
        finally:
            if collector.is_active():
                collector.record_host(HostSpan("await realize", "await", start, time.perf_counter_ns()))
        return self.result

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the realize is done (for plain scripts; never call it on the loop thread)."""
        dispatcher.signal.wait_blocking(self.job.value, check=False, timeout=timeout)
        self._raise_dispatch_error()
        for signal, value in self._waits():
            signal.wait_blocking(value, check=False, timeout=timeout)
        self._raise_task_error()
        return self.result

    def done(self) -> bool:
        """True when every command of this realize has run."""
        if not dispatcher.signal.reached(self.job.value):
            return False
        return all(s.reached(v) for s, v in self._waits())

    def _waits(self) -> list[tuple[Signal, int]]:
        sub = self.job.submission
        return (sub.waits() if sub is not None else []) + self.job.extra_waits

    def _raise_dispatch_error(self) -> None:
        err = dispatcher.signal.failure(self.job.value)
        if err is not None:
            raise err

    def _raise_task_error(self) -> None:
        sub = self.job.submission
        if sub is not None and sub.placed:
            self._error = sub.first_failure()
            reaper.release(sub.placed)  # the task graph: freed off this thread (see Reaper)
            sub.placed = []
        err = getattr(self, "_error", None)
        if err is None:
            for signal, value in self.job.extra_waits:
                err = signal.failure(value)
                if err is not None:
                    break
        if err is not None:
            raise err


class Reaper:
    """Frees finished task graphs on a thread of its own, a slice at a time.

    Why: a realize of 10,000 tasks leaves ~100,000 objects (tasks, accesses, temporary buffers and
    their memory) to free once it is done. Freed where the last reference drops, the awaiting trio
    task, that is a 100 ms stall of the event loop (measured, bench/loop_lag.py); freed here in slices,
    the interpreter can switch threads between slices."""

    SLICE = 256

    def __init__(self) -> None:
        self._items: collections.deque[list] = collections.deque()
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def release(self, items: list) -> None:
        """Takes ownership of `items` (a list nobody else refers to) and frees it soon."""
        if len(items) < self.SLICE:
            return  # small: freeing it where it is costs less than the hand-over
        with self._cond:
            self._items.append(items)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="atensor-reaper", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                items = self._items.popleft()
            while items:
                del items[-self.SLICE:]
                time.sleep(0)
            del items


reaper = Reaper()


def in_trio_loop() -> bool:
    """True when called from inside a running trio event loop (on its thread)."""
    try:
        import trio
        trio.lowlevel.current_trio_token()
        return True
    except RuntimeError:
        return False


__all__ = ["Dispatcher", "Job", "RealizeHandle", "dispatcher", "in_trio_loop", "recording", "SignalFailed"]
