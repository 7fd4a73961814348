"""The dispatcher: realizes planned off the event loop, in issue order (the awaitable handle is handle.py).

It belongs to engine/, not hcq/: a `Job` carries engine work (a plan that returns a `Submission`, the
jit's `Recording`), and the runtime below (queues, signals, buffers) never runs engine code it cannot
name.

Why a dispatcher thread: turning a large graph into a TaskGraph and command lists is Python work
that can take longer than an event loop may stall. `realize()` therefore only records what to
realize and hands it to one dispatcher thread, which schedules, plans and submits; the awaiting task
then parks on timeline values. One FIFO thread also gives concurrent realizes a total order: the
order in which they were issued, which is what makes assigns from several tasks serialize in
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
import sys
import threading
import time
from typing import Callable, Optional

from atensor.config import settings
from atensor.hcq.buffer import Buffer, InFlight
from atensor.hcq.gcpause import gc_paused
from atensor.hcq.gilshare import gil_shared
from atensor.hcq.queue import lower_priority
from atensor.hcq.signal import Signal, SignalFailed
from atensor.profiler import collector
from atensor.profiler.events import HostSpan
from atensor.engine.submission import Submission


class Recording(list):
    """The schedules the realizes of one jit capture ran (jit/jit.py), in order. `since_uid` is the
    first buffer id made during the capture: a value realized into an older buffer (by an earlier call,
    say, whose result is still held) is computed again instead of read from there, so the recorded
    graphs read only the call's inputs and state, and two calls record the same graphs whatever
    earlier results are still alive. `draws` are the random draws the call made (tensor/random.py), in
    order: (their counter buffers, how many counters each took), redrawn on every replay."""

    def __init__(self, since_uid: int):
        super().__init__()
        self.since_uid = since_uid
        self.draws: list[tuple[tuple, int]] = []


# While atensor.jit captures a call, the Recording its realizes append their schedules to. A context
# variable, so only the capturing task (and the tasks it starts) records.
recording: contextvars.ContextVar[Optional[Recording]] = contextvars.ContextVar("atensor_recording",
                                                                                 default=None)


class Job:
    """One realize: a function that schedules and submits (run on the dispatcher thread, or inline)
    and returns its `Submission`, and the buffers whose pending writes the caller wants to wait for.
    `record`, when set, receives the schedule the job ran (see jit/jit.py). `context` is the caller's
    (contextvars): the plan runs in it, so the settings and modes of the task that issued the realize
    are the ones it sees."""
    __slots__ = ("plan", "wait_for", "value", "submission", "extra_waits", "extra_final", "in_flight", "record",
                 "context", "error", "issued_ns")

    def __init__(self, plan: Optional[Callable[[], Optional[Submission]]], wait_for: list[Buffer]):
        self.plan, self.wait_for = plan, wait_for
        self.in_flight = InFlight()  # the buffers it will write, held until it is planned
        self.value = 0
        self.submission: Optional[Submission] = None  # what the plan returned (None: nothing to run)
        self.extra_waits: list[tuple[Signal, int]] = []  # the wait_for buffers' pending writes, each
        self.extra_final: dict[Signal, int] = {}  # the largest of them per signal (`note_pending_writes`)
        self.record: Optional[Recording] = None
        self.issued_ns = 0  # when it was queued for the dispatcher (its wait there is a profiler span)
        self.context = contextvars.copy_context()
        self.error: Optional[BaseException] = None  # the plan's error, when it was planned inline

    def note_pending_writes(self) -> None:
        """Collects the pending writes of the `wait_for` buffers once the job is planned, on the planning
        thread: `extra_waits` keeps each (signal, value), whose failures the handle reports; `extra_final`
        the largest value per signal, all that waiting needs (a signal's value never decreases). Why
        both: a realize of 3,000 outputs has 3,000 pending writes on one queue's signal; the awaiting
        task checked each of them on the event loop's thread (1.5-2 ms of its CPU in one tick, measured
        with bench/loop_lag.py --tiny 3000), where it now checks one. A function of its own, so that no loop
        variable outlives it: the idle dispatcher kept the last of those Buffers (and its memory) alive in
        its frame until it took the next job (tests/hcq/test_idle_worker_frees.py)."""
        waits, final = self.extra_waits, self.extra_final
        for buf in self.wait_for:
            for signal, value in buf.pending_writes():
                waits.append((signal, value))
                if final.get(signal, -1) < value:
                    final[signal] = value


class Dispatcher:
    """A FIFO thread that schedules and submits realizes in the order they were issued."""

    def __init__(self) -> None:
        self.signal = Signal("host/dispatch")
        self._jobs: collections.deque[Job] = collections.deque()
        # `run_inline` takes the lock itself (a C-level `with`): the Condition's own __enter__ and
        # __exit__ are Python calls, four per inline plan
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._issued = 0
        self._busy = False  # a job is being planned (here or inline); guarded by _cond
        self._thread: Optional[threading.Thread] = None

    def submit(self, job: Job) -> Job:
        with self._cond:
            self._issued += 1
            job.value = self._issued
            job.issued_ns = time.perf_counter_ns()
            self._jobs.append(job)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="atensor-dispatch", daemon=True)
                self._thread.start()
        return job

    def statistics(self) -> dict:
        with self._cond:
            return {"queued_jobs": len(self._jobs), "issued": self._issued, "dispatched": self.signal.value}

    def run_inline(self, job: Job, keep_error: bool = False) -> bool:
        """Plans `job` on the calling thread when nothing is queued or being planned (so program order
        holds) and returns True; False when the job must go through `submit`. For cheap plans (a jit
        replay, a small eager realize): the caller then waits for the queues only, without a wake-up
        for the dispatch. Errors of the plan are raised here, or with `keep_error` kept in `job.error`
        for whoever awaits the job (as the dispatcher thread does)."""
        with self._lock:
            if self._jobs or self._busy:
                return False
            self._busy = True
        self.run_claimed(job, keep_error)
        return True

    def run_claimed(self, job: Job, keep_error: bool = False) -> None:
        """`run_inline`'s planning of `job`, for a caller that holds the role already (`claim`), which
        this gives back (engine/realize.py: an eager realize that first tried its hot template's replay)."""
        try:
            with gc_paused():
                job.submission = job.plan()
                job.note_pending_writes()
        except Exception as exc:
            if not keep_error:
                raise
            job.error = exc
        finally:
            job.in_flight.release()
            job.plan = None
            with self._lock:
                self._busy = False
                if self._jobs:  # one came while this was planned; else the idle dispatcher need not wake
                    self._cond.notify()

    def claim(self) -> bool:
        """Takes the dispatching role for the calling thread, as `run_inline` does for a job, when
        nothing is queued or being planned: for a caller that submits without a Job (a jit replay run
        on its own thread, jit/direct.py). True when taken; the caller then calls `unclaim()` once it
        has submitted, also when it raises."""
        with self._lock:
            if self._jobs or self._busy:
                return False
            self._busy = True
            return True

    def unclaim(self) -> None:
        """Gives back the role `claim` took, waking the dispatcher for a job that came meanwhile."""
        with self._lock:
            self._busy = False
            if self._jobs:
                self._cond.notify()

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
                # see gcpause.py (collections here would stall the event loop) and gilshare.py (the
                # loop's thread gets the GIL within 0.5 ms, not 5, while this thread plans)
                with gc_paused(), gil_shared():
                    job.submission = job.context.run(job.plan)
                    job.note_pending_writes()
            except Exception as exc:  # reported to whoever awaits the job
                error = exc
            finally:
                job.in_flight.release()
            end = time.perf_counter_ns()
            if collector.is_active():
                collector.record_host(HostSpan(f"job {job.value} waits in the dispatcher queue", "wait",
                                               job.issued_ns, start, "dispatcher queue"))
                collector.record_host(HostSpan(f"schedule+submit job {job.value}", "schedule", start, end))
            # free for `run_inline` before the job's value wakes its awaiting task: that task's next
            # small realize or replay is then planned on its own thread; published first, it found the
            # dispatcher still busy and queued behind it, and so did every next one, each paying a
            # wake-up (seen under uvloop, tests/engine/test_replay_record.py). The submission is done:
            # a job planned inline from here on still comes after this one on every queue.
            with self._cond:
                self._busy = False
            self.signal.set(job.value, (start, end), error)
            job.plan = None  # the graph's nodes; only the handle's submission is still needed
            del job  # a finished job must not keep its buffers alive while the dispatcher waits


dispatcher = Dispatcher()


class Reaper:
    """Frees finished task graphs and dead lazy graphs on a thread of its own, a slice at a time.

    Why: a realize of 10,000 tasks leaves ~100,000 objects (tasks, accesses, temporary buffers and
    their memory) to free once it is done. Freed where the last reference drops, the awaiting
    task, that is a 100 ms stall of the event loop (measured, bench/loop_lag.py); freed here in slices,
    the interpreter can switch threads between slices.

    The same for the lazy graph a big realize computed (`bury`): once the tensor holds its result, the
    graph's nodes are dead, and a chain of 3,000 kernels is 9,000 nodes, each freed with its intern
    table entry: 2-3 ms of the event loop's CPU in one tick, where the awaiting task read the tensor's
    node (bench/loop_lag.py --tiny 3000). Dropping the last reference to a chain frees it in one
    cascade, so the graph is peeled here instead, one node at a time from its roots: a node that only
    the peeling holds gives its sources to the peeling and is freed alone; a node someone else holds
    (a live tensor's, a shared input) is let go.

    Invariant: the reaper only drops references; what it frees is what nobody else refers to, so where
    an object is freed never changes what is computed."""

    SLICE = 256

    def __init__(self) -> None:
        self._items: collections.deque[list] = collections.deque()
        self._graphs: collections.deque[list] = collections.deque()
        # `run_inline` takes the lock itself (a C-level `with`): the Condition's own __enter__ and
        # __exit__ are Python calls, four per inline plan
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._idle = False  # the thread waits (or is about to) for work; written under _cond by it
        self._thread: Optional[threading.Thread] = None

    def release(self, items: list) -> None:
        """Takes ownership of `items` (a list nobody else refers to) and frees it soon."""
        if len(items) < self.SLICE:
            return  # small: freeing it where it is costs less than the hand-over
        self._items.append(items)
        self._wake()

    def bury(self, roots: list) -> None:
        """Takes `roots`, a list of the roots of a dead lazy graph (graph/node.py's Nodes: a tensor's
        node from before its realize committed) that nobody else refers to, and frees what only it
        kept alive, a node at a time (see the class docstring). The caller's own references to them
        then free nothing where it drops them. One deque append, and a wake-up when the thread is idle."""
        self._graphs.append(roots)
        if self._idle or self._thread is None:
            self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="atensor-reaper", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle = True  # (before looking: a `bury` that saw it False appended before the look)
                while not self._items and not self._graphs:
                    self._cond.wait()
                self._idle = False
            while self._items:
                items = self._items.popleft()
                while items:
                    del items[-self.SLICE:]
                    time.sleep(0)
                del items
            while self._graphs:
                self._peel(self._graphs.popleft())  # (the deque's reference gone: the list is the stack's)

    def _peel(self, stack: list) -> None:
        """Frees the graph under the nodes in `stack` that only it keeps alive, roots first, a node at a
        time: a node whose only references are this frame's (`sys.getrefcount` counts its own argument
        too) hands its sources to the stack, which keeps them alive, and is freed alone when dropped."""
        refcount, freed = sys.getrefcount, 0
        while stack:
            node = stack.pop()
            if refcount(node) <= 2:  # this frame's `node` and the call's argument: dead once dropped
                stack.extend(node.src)
            del node
            freed += 1
            if freed % self.SLICE == 0:
                time.sleep(0)  # (the interpreter may hand the GIL over here: the event loop's turn)


reaper = Reaper()


__all__ = ["Dispatcher", "Job", "Reaper", "dispatcher", "reaper", "SignalFailed"]
