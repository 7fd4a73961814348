"""The handle a realize returns: what the caller awaits.

A realize is already dispatched when `realize()` returns (engine/dispatch.py's dispatcher plans and
submits it); the handle waits for the dispatcher's timeline value of the job, then for every
queue value its submission published. A realize that ran to its end while it was issued (an eager
replay, engine/eager_replay.py) has a finished handle instead, with no job to wait for.

Cancellation: cancelling `await handle` stops the waiting only. The job is dispatched and its
commands run to completion, like commands on a GPU; a later await of the same tensor finds the
buffer's pending writes and waits for them, and a buffer is never read half-written.
"""
from __future__ import annotations

import copy
import time
from typing import Any, Generator, NoReturn, Optional

from atensor.engine.dispatch import Job, dispatcher, reaper
from atensor.engine.submission import Submission
from atensor.hcq.loop import checkpoint
from atensor.hcq.signal import Signal, wait_all
from atensor.profiler import collector
from atensor.profiler.events import HostSpan


class NotRealizedError(RuntimeError):
    """A sync accessor was called inside a running event loop on data that is not ready."""


class RealizeHandle:
    """One dispatched realize (Tensor.realize notes it on the tensors it realizes; the jit waits on
    it). `await handle` waits for it from trio or asyncio (through hcq/loop.py); `handle.wait()`
    blocks (outside an event loop). Awaiting returns `result`."""

    def __init__(self, job: Job, result: Any):
        self.job, self.result = job, result
        self._error: Optional[BaseException] = None

    @staticmethod
    def finished(result: Any, error: Optional[BaseException] = None) -> RealizeHandle:
        """The handle of a realize that ran to its end while it was issued, with no job or submission
        (engine/eager_replay.py): awaiting it is a checkpoint, then `error` raised when it failed.
        Without a result or an error, one shared handle: nothing about it changes."""
        if result is None and error is None:
            return _FINISHED
        job = Job(None, [])
        job.error = error
        return RealizeHandle(job, result)

    @staticmethod
    def of_submission(submission: Submission, result: Any) -> RealizeHandle:
        """The handle that awaits `submission`, submitted from the caller's thread with no job (as the
        general path's inline job would have made it: jit/direct.py, engine/eager_replay.py)."""
        job = Job(None, [])
        job.submission = submission
        return RealizeHandle(job, result)

    def _finished_await(self) -> Generator[Any, None, Any]:
        """`__await__` of the shared finished handle: the checkpoint alone (nothing to wait for or raise,
        no span: it never ran under a profile), without `_wait_async`'s frame and checks."""
        return checkpoint().__await__()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait_async().__await__()

    async def _wait_async(self) -> Any:
        start = time.perf_counter_ns()
        try:
            if self.done():  # it ran while it was planned (engine/plan.py's tiny plans): no wake-up
                await checkpoint()
                self._raise_dispatch_error()
            else:
                await dispatcher.signal.wait(self.job.value, check=False)
                self._raise_dispatch_error()
                if self._polled():  # its programs ran while this thread went on: no wake-up needed
                    await checkpoint()
                else:
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
        if not self._polled():  # else its programs ran while this thread went on: nothing to wait for
            for signal, value in self._waits():
                signal.wait_blocking(value, check=False, timeout=timeout)
        self._raise_task_error()
        return self.result

    def done(self) -> bool:
        """True when every command of this realize has run."""
        job = self.job
        if dispatcher.signal.value < job.value:
            return False
        sub = job.submission
        if sub is not None:
            for queue, value in sub.final.items():
                if queue.signal.value < value:
                    return False
        for signal, value in job.extra_final.items():
            if signal.value < value:
                return False
        return True

    def _polled(self) -> bool:
        """True when every queue of the submission has reached its final value, counting a native
        program the queue's doorbell ring has finished as reached (Queue.poll publishes it; a CL
        queue, a short command it waits for), and the job waits for nothing else: its other waits
        (an eager realize's pending writes to its outputs) are reached, or are values of the
        submission's own queues at or before their final ones, which a queue publishes in order."""
        sub = self.job.submission
        if sub is None:
            return False
        final = sub.final
        for signal, value in self.job.extra_final.items():
            if signal.value < value and not any(queue.signal is signal and value <= last
                                                for queue, last in final.items()):
                return False
        return all([queue.poll(value) for queue, value in final.items()])

    def _waits(self) -> list[tuple[Signal, int]]:
        sub = self.job.submission
        return (sub.waits() if sub is not None else []) + list(self.job.extra_final.items())

    def _raise_dispatch_error(self) -> None:
        err = self.job.error or dispatcher.signal.failure(self.job.value)
        if err is not None:
            raise_kept(err)

    def _raise_task_error(self) -> None:
        sub = self.job.submission
        if sub is not None and sub.placed:
            self._error = sub.first_failure()
            reaper.release(sub.placed)  # the task graph: freed off this thread (see Reaper)
            sub.placed = []
        err = getattr(self, "_error", None)
        if err is None and any(signal.has_failures() for signal in self.job.extra_final):
            for signal, value in self.job.extra_waits:  # (each, only when one of their signals failed)
                err = signal.failure(value)
                if err is not None:
                    break
        if err is not None:
            raise_kept(err)


class _Finished(RealizeHandle):
    """`RealizeHandle.finished`'s shared handle (no result, no error): awaiting it is one checkpoint."""
    __await__ = RealizeHandle._finished_await

    def done(self) -> bool:
        """Always: it ran to its end before it was made."""
        return True


_FINISHED = _Finished(Job(None, []), None)


def finished_here(submission: Submission) -> bool:
    """True when every command of `submission` has run and none failed, its values published here:
    each queue's `poll` publishes a command found done, and a CL queue waits for a short one on this
    thread (hcq/cl_queue.py), so such a submission needs no handle on it: its await is one checkpoint.
    False leaves the rest to `RealizeHandle.of_submission`'s handle, which raises what failed."""
    for queue, value in submission.final.items():
        if not queue.poll(value):
            return False
        if queue.signal.has_failures() and submission.first_failure() is not None:
            return False  # (`first_failure` reads the queues' failures; one that never failed has none)
    reaper.release(submission.placed)  # as the handle does once awaited
    submission.placed = []
    return True


def planned_so_far() -> Optional[RealizeHandle]:
    """A handle that is done once every realize issued so far is planned and committed (not run), or
    None when the dispatcher had nothing queued: from then on the ledger's pending heads are the
    assigns no issued realize takes along, whichever thread planned them and when (jit/jit.py collects
    them so; an input realized just before a jitted call is its buffer after it)."""
    job = Job(lambda: None, [])
    if dispatcher.run_inline(job):
        return None
    dispatcher.submit(job)
    return RealizeHandle(job, None)


def raise_kept(err: BaseException) -> NoReturn:
    """Raises a failure that a signal or a job keeps for whoever waits on it, as a copy with the same
    type, arguments, cause and traceback. Why a copy: raising an object extends its traceback with
    every frame it passes through, so the kept object itself would hold the frames (and their locals:
    tensors, buffers, a jit call's arguments) of each caller that awaited it, for as long as the
    signal keeps its failures. Measured: a jit call's argument outlived the call until a full
    collection, because a leftover failed assign was re-dispatched, and raised, in each capture."""
    try:
        try:
            fresh = copy.copy(err)
        except Exception:  # noqa: BLE001 - an exception type copy cannot rebuild: raised as it is
            fresh = err
        if type(fresh) is not type(err):
            fresh = err
        if fresh is not err:
            fresh.__cause__, fresh.__suppress_context__ = err.__cause__, err.__suppress_context__
            fresh.__traceback__ = err.__traceback__
        raise fresh
    finally:  # this frame is in the raised traceback: its locals would make a cycle through it
        del fresh, err


__all__ = ["NotRealizedError", "RealizeHandle", "finished_here", "planned_so_far"]
