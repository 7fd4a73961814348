"""A command queue that is an OpenCL in-order queue: the plan's commands become OpenCL commands and
events, and the queue's timeline signal advances from their completion.

Why not a worker thread, as CPU queues have: an OpenCL queue is a device queue already. `submit`
enqueues each command at once on the submitting thread (the dispatcher), without waiting: its kernels
or copies go on the in-order OpenCL queue, so commands of one queue run in the order submitted, as
every atensor queue does. What stays the same is the model of queue.py and signal.py: a command waits
for other queues' values, runs, and publishes its own value.

How a command's waits are kept, by what they wait for:
- a value of another OpenCL queue of the same context whose command is enqueued: that command's event
  goes in the wait list, so the device orders them with no host round trip;
- a value already reached: nothing (its failure, if it failed, is the command's);
- anything else (a CPU queue's value, a value not enqueued yet): a user event that the host sets once
  the signal reaches the value (`Signal.when_reached`, on whichever thread publishes it).

How a value is published: one completion thread per queue (`_Completer`) waits for its commands'
last events in submission order, with the GIL released while it waits (pyopencl's Event.wait is
clWaitForEvents), and then stamps the value with the device's own start and end times, put on the
host's clock (cl_runtime.CLDevice.clock_offset), and sets the signal; `Signal.set` wakes the tasks
awaiting it through the event-loop seam (loop.py), under trio or asyncio alike. Nobody polls. Why not
OpenCL's completion callbacks: pyopencl starts a thread for each callback it registers (136 us per
command on this machine, more than the tiny kernel itself) and that thread then waits for the GIL.
Values are published in order (an in-order queue completes in order; `_publish_ready` keeps it so for
`poll` too), so a waiter that finds a value reached finds every failure up to it.

A command's runner may enqueue a whole sequence of launches (a jit replay's lean path,
engine/cl_replay.py): the queue takes it through `submit` like any command, as ONE record and one
value, its stamps the first launch's start and the last one's end. That is what an OpenCL queue
adds to the queue interface (queue.py), not a second submit.

A submission of ONE command that waits for nothing, made on a thread that runs an event loop (an
inline realize or replay, whose awaiting task polls it before it can be cancelled), is deferred: its
record is not handed to the completion thread, whose wake-up and GIL traffic cost more than the
kernel (whole-process CPU of 8000 awaited one-kernel replays 14% lower deferred, farm-bench A/B,
5 pairs). It is handed over when the awaiting host's `poll` cannot publish it, when anyone else
waits for the signal (`Signal.on_wait`, which every wait calls once registered; the submitter
checks `Signal.has_waiters` after deferring), or when the queue gets its next command: so at most
one record per queue is deferred, and every value someone waits for is published.

The short-command path (`poll`): a host about to park on a value whose command is the oldest in
flight, waits on nothing unfinished, and took at most SHORT_NS of device time at its last run (a jit
replay's kernel: the same runner), waits for its event on its own thread, the GIL released, and
publishes the value at once: no thread hop and no loop wake-up, which cost more than such a command.

The compiled path (`run_here`, which the plan's lean replay calls, engine/cl_replay.py): ONE command
that waits for nothing, whose work was short at its last run and whose runner has a compiled launch
(`Runner.launch`, atensor/core/cl.c through hcq/cl_native.py), on an idle queue, is launched, waited
for with the GIL released (its status read in a loop for up to `cl_spin_us` first: pocl's sleeping
wait wakes 20-40 us late), stamped and published by the calling thread before `run_here` returns: no
in-flight record, no deferral, no poll, no pyopencl Event. Measured (bench/opencl.py --round-trip, Zen 5,
2 cores, pocl 3.1, load 3.6-5.3, 2 alternating pairs): a one-kernel awaited jit call 48-61 us against
52-71 on the record, deferral and poll path; thread CPU per call 30.7 against 59.0 us. Anything else,
or a core without it (ATENSOR_CORE=python), takes `submit`.

Failures: a command whose dependency failed (known when it is enqueued, when a user event is set, or
from the records of the commands it waits for, walked when it completes) publishes DependencyFailed;
an OpenCL error while enqueueing, an error of a host part (`Runner.failed`) or a negative event status
publishes KernelError. No user event is ever set to a negative status: pocl then ends the commands
after it without calling their completion callbacks, and their values would never be published.
Either way the value is published in order, so nothing waits forever.

Invariant: a command and what it holds (its runner's buffers and host arrays) stay referenced by the
queue until its value is published (`_inflight`), so no memory a device command uses is freed early.
"""
from __future__ import annotations

import queue as queue_module
import threading
import time
import weakref
from typing import Any, Optional

from atensor.hcq import cl_native
from atensor.hcq.cl_runtime import CLDevice
from atensor.hcq.loop import in_running_loop
from atensor.config import settings
from atensor.hcq.queue import Command, DependencyFailed, KernelError, Queue, lower_priority
from atensor.hcq.signal import Signal
from atensor.profiler import collector
from atensor.profiler.events import Span

_queues: weakref.WeakValueDictionary[int, CLQueue] = weakref.WeakValueDictionary()  # id(signal) -> queue

# a command whose runner's last run took at most this long on the device is waited for on the
# awaiting host's thread (`CLQueue.poll`): the loop is held no longer than a wake-up hop would cost
SHORT_NS = 250_000


class _InFlight:
    """One enqueued command until its value is published: its events and what can make it fail. A
    slotted class, its lists made only for a command that waits (one made per command: a jit replay's
    submission makes one)."""
    __slots__ = ("command", "first", "last", "deps", "user_events", "error", "stamps")

    def __init__(self, command: Command):
        self.command = command
        self.first: Any = None           # its first OpenCL event (the stamp's start)
        self.last: Any = None            # its last OpenCL event (the value's completion)
        self.deps: list[_InFlight] = _NONE        # records of other CL queues it waits for
        self.user_events: list[Any] = _NONE       # set by the host (kept until published)
        self.error: Optional[BaseException] = None
        self.stamps: Optional[tuple[int, int]] = None  # (start, end) on the device clock, once it completed


_NONE: list = []  # an _InFlight's empty lists, shared: never appended to (`_enqueue` makes its own)


class CLQueue(Queue):
    """One of a CL device's queues (compute or copy), its commands enqueued on an OpenCL queue."""

    def __init__(self, device: str, kind: str, handle: CLDevice, cl_queue: Any):
        super().__init__(device, kind)
        self.handle, self.cl = handle, cl_queue
        self._inflight: dict[int, _InFlight] = {}   # value -> record, until published
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()  # one thread publishes at a time, in order
        self._completer: Optional[_Completer] = None  # started with the first submission
        # lean commands not handed to the completer yet (at most one left behind by each submission;
        # see the module docstring), under `_defer_lock`, which is never held while taking another lock
        self._deferred: list[_InFlight] = []
        self._defer_lock = threading.Lock()
        self.signal.on_wait = self._hand_over
        self.host_published = 0  # commands an awaiting host published (`poll`): found done, or short
        self.host_waited = 0     # of those, the short ones it waited for
        self._handle = cl_queue.int_ptr  # the cl_command_queue, for the compiled launch (`_run_short`)
        core = cl_native.native()
        self._finish = core.cl_finish if core is not None else None
        # a runner's `device_key` -> its work's device time at its last run (`poll`'s short commands)
        self._last_ns: dict[Any, int] = {}
        _queues[id(self.signal)] = self
        # its spans carry the device's own stamps: the profile puts them on the host clock
        collector.set_clock_offset(device, kind, handle.clock_offset)

    def __repr__(self) -> str:
        return f"CLQueue({self.device}/{self.kind})"

    def submit(self, commands: list[Command]) -> None:
        """Enqueues every command on the OpenCL queue, in order, without waiting for any. One command
        that waits for nothing, submitted on a thread that runs an event loop, is deferred (see the
        module docstring)."""
        if self._completer is None:
            self._completer = _Completer(self)
        deferred = self._deferred
        if deferred and (len(deferred) > 1 or deferred[0].stamps is None):
            self._hand_over()  # the completer takes them in submission order, before these
        records = [self._enqueue(command) for command in commands]
        self.cl.flush()  # a GPU driver may hold enqueued commands until a flush
        if len(records) != 1 or commands[0].waits or not in_running_loop():
            self._completer.watch(records)
            return
        with self._defer_lock:  # what is left there was published by the awaiting host: dropped
            self._deferred = records
        if self.signal.has_waiters():  # it waited before the record was deferred: hand it over now
            self._hand_over()

    def _hand_over(self) -> None:
        """Hands the deferred records still in flight to the completion thread (`Signal.on_wait`, and
        whenever the awaiting host will not publish them itself)."""
        if not self._deferred:
            return
        with self._defer_lock:
            records, self._deferred = self._deferred, []
        put = self._completer.records.put
        for record in records:
            if record.stamps is None:  # else the awaiting host published it already
                put(record)

    def run_here(self, commands: list[Command]) -> None:
        """Runs `commands` from the calling thread, in this queue's place: ONE command whose runner has a
        compiled launch (`Runner.launch`) and is short (`_known_short`) is launched, waited for with the
        GIL released and published here, in C but its publication (`_run_short`); anything else is
        enqueued (`submit`). Called by the dispatching thread only, while this queue is idle (as
        `Queue.run_here`), so no command of it is in flight or deferred before these."""
        if len(commands) == 1:
            command = commands[0]
            run = command.run
            if run is not None and run.launch is not None and not command.waits and self._known_short(run) \
                    and not self._inflight:
                self._run_short(command, run)
                return
        self.submit(commands)

    def _known_short(self, run: Any) -> bool:
        """Whether `run`'s work took at most SHORT_NS on the device at its last run (never run: no)."""
        return run.device_key is not None and self._last_ns.get(run.device_key, SHORT_NS + 1) <= SHORT_NS

    def _run_short(self, command: Command, run: Any) -> None:
        """`command` launched through the compiled core (atensor/core/cl.c), waited for on this thread
        and published with its stamps, or with KernelError when the launch is refused or fails: what
        `_enqueue`, `_poll` and `_publish_oldest` do for it on pyopencl's path, without an in-flight
        record (nothing is in flight on this queue: `run_here`)."""
        error: Optional[BaseException] = None
        try:
            first, last = run.launch(self._handle)
        except Exception as exc:
            error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) could not be enqueued "
                                f"on {self.device}/{self.kind}: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            stamps = (0, 0)
        else:
            status, start, end = self._finish(first, last)
            stamps = (start, end)
            if status != 0:
                error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) failed on "
                                    f"{self.device}/{self.kind}: OpenCL event status {status}")
        self._last_ns[run.device_key] = stamps[1] - stamps[0] if error is None else SHORT_NS + 1
        with self._publish_lock:
            command.keep = None
            self.commands_run += 1
            self.host_published += 1  # published by the awaiting host, which waited for it
            self.host_waited += 1
            self.ran_here += 1        # ... and launched it through the compiled core
            offset = self.handle.clock_offset
            if error is not None and stamps == (0, 0):  # no stamps from the device: the host's clock
                now = time.perf_counter_ns() - offset
                stamps = (now, now)
            self.signal.set(command.value, (stamps[0] + offset, stamps[1] + offset), error)
            if collector.is_active():
                self._span(command, stamps)

    def poll(self, value: int) -> bool:
        """True when `value` is reached, published here when it can be (`_poll`). When not, the caller
        is about to park on it: the deferred records are handed to the completion thread first."""
        if self._poll(value):
            return True
        if self._deferred:
            self._hand_over()
        return False

    def _poll(self, value: int) -> bool:
        """True when `value` is reached. When the command that publishes it is the oldest in flight and
        nothing made it fail, publishes it first (its stamps come with it): if its last event has
        completed (its status, read once: no loop), or if it is short (`_short`: the caller's thread
        waits for it, the GIL released). Then the awaiting host need not park until the completion
        thread publishes it and wakes the loop."""
        if self.signal.value >= value:
            return True
        with self._lock:  # only the oldest command in flight: every value before it is published
            record = next(iter(self._inflight.values()), None)
        if record is None or record.command.value != value or record.last is None \
                or record.error is not None or (record.deps and _failure_before(record) is not None):
            return False
        run = record.command.run
        if run is not None and run.failed is not None:  # a host part's error is read once: by the
            return False                                 # completion thread alone
        try:
            if record.last.command_execution_status != 0:  # CL_COMPLETE
                if not self._short(record):
                    return False
                record.last.wait()
                if record.last.command_execution_status != 0:
                    return False
                self.host_waited += 1
        except Exception:  # an event that failed, or one the driver no longer answers for: the
            return False   # completion thread publishes it, with its error
        self.host_published += 1
        self._publish_oldest(record)
        return self.signal.value >= value

    def _publish_oldest(self, record: _InFlight) -> None:
        """`_completed` then `_publish_ready` for a record `_poll` found complete, the oldest in flight,
        with nothing that made it fail (checked there): its stamps, then its value, at once. Unless the
        completion thread marked it first; then it publishes it."""
        stamps = _device_stamps(record)
        command = record.command
        run, value = command.run, command.value
        if run is not None and run.device_key is not None:
            self._last_ns[run.device_key] = stamps[1] - stamps[0]
        with self._publish_lock:
            with self._lock:
                if record.stamps is not None or next(iter(self._inflight), None) != value:
                    return
                record.deps = record.user_events = _NONE
                record.stamps = stamps
                del self._inflight[value]
            command.keep = None
            self.commands_run += 1
            offset = self.handle.clock_offset
            self.signal.set(value, (stamps[0] + offset, stamps[1] + offset), None)
            if collector.is_active():
                self._span(command, stamps)
        if self._inflight:  # later commands the completion thread marked, held back behind this one
            self._publish_ready()

    def _short(self, record: _InFlight) -> bool:
        """Whether the host may wait for `record`'s command on its own thread: its runner ran before and
        took at most SHORT_NS on the device (so no first-launch compile), and nothing it waits for is unfinished (no user event unset, no other queue's command running)."""
        run = record.command.run
        if run is None or run.device_key is None \
                or self._last_ns.get(run.device_key, SHORT_NS + 1) > SHORT_NS:
            return False
        if not record.user_events and not record.deps:
            return True
        pending = [user for user in record.user_events] + [dep.last for dep in record.deps if dep.stamps is None]
        return all(event.command_execution_status == 0 for event in pending)

    def statistics(self) -> dict:
        with self._lock:
            pending = len(self._inflight)
        return {"pending_commands": pending, "deferred": len(self._deferred), "signal": self.signal.value,
                "reserved": self._reserved,
                "commands_run": self.commands_run, "host_published": self.host_published,
                "host_waited": self.host_waited, "ran_here": self.ran_here}

    # ---- enqueueing -----------------------------------------------------------------------------
    def _enqueue(self, command: Command) -> _InFlight:
        import pyopencl as cl
        record = _InFlight(command)
        events = []
        for signal, value, check in command.waits:
            if signal.value >= value:
                if check and record.error is None and signal.failure(value) is not None:
                    record.error = _dependency_failed(command, signal.failure(value))
                continue
            other = _queues.get(id(signal))
            dep = other._record(value) if other is not None and other.handle.context == self.handle.context \
                else None
            if dep is not None and dep.last is not None:
                events.append(dep.last)
                if check:
                    if record.deps is _NONE:
                        record.deps = []
                    record.deps.append(dep)
                continue
            # a CPU queue's value, or one not enqueued yet: the host sets a user event when it is reached
            user = cl.UserEvent(self.handle.context)
            if record.user_events is _NONE:
                record.user_events = []
            record.user_events.append(user)
            events.append(user)
            signal.when_reached(value, _UserWait(record, user, signal, value, check).reached)
        with self._lock:
            self._inflight[command.value] = record
        try:
            run = command.run
            if run is None or run.enqueue is None:
                raise TypeError(f"{command.kind} {command.name} has no device command for an OpenCL queue")
            if record.error is None:
                record.first, record.last = run.enqueue(self.cl, events)
            else:  # its input failed already: nothing runs, its value is still published in order
                record.first = record.last = cl.enqueue_marker(self.cl, wait_for=events or None)
        except Exception as exc:
            error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) could not be enqueued "
                                f"on {self.device}/{self.kind}: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            record.error = error
            record.first = record.last = cl.enqueue_marker(self.cl, wait_for=events or None)
        return record

    def _record(self, value: int) -> Optional[_InFlight]:
        """The record of the command that publishes `value`, while it is in flight."""
        with self._lock:
            return self._inflight.get(value)

    # ---- completion (on the completion thread, or on a host in `poll`) ----------------------------------
    def _completed(self, record: _InFlight, status: int) -> None:
        """Marks `record`'s command complete (its error, its stamps) and publishes what is ready. Both
        the completion thread and a polling host may call it for one record: the first marks it."""
        with self._lock:
            if record.stamps is not None or record.command.value not in self._inflight:
                return
        command = record.command
        error = record.error
        if error is None and record.deps:
            failed = _failure_before(record)
            if failed is not None:
                error = _dependency_failed(command, failed)
        run = command.run
        if error is None and run is not None and run.failed is not None:
            raised = run.failed(record.last)
            if raised is not None:
                error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) failed on "
                                    f"{self.device}/{self.kind}: {type(raised).__name__}: {raised}")
                error.__cause__ = raised
        if error is None and status < 0:
            error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) failed on "
                                f"{self.device}/{self.kind}: OpenCL event status {status}")
        stamps = _device_stamps(record)
        if run is not None and run.device_key is not None:
            self._last_ns[run.device_key] = stamps[1] - stamps[0] if error is None else SHORT_NS + 1
        with self._lock:
            if record.stamps is not None:
                return
            record.error = error
            record.deps = record.user_events = _NONE  # a chain of records is only as long as what is in flight
            record.stamps = stamps  # last: it marks the record complete
        self._publish_ready()

    def _publish_ready(self) -> None:
        """Publishes the completed commands at the front of the queue, in order (the completion thread
        and a polling host may both complete commands): a value is published only once every value
        before it is, so a waiter that finds a value reached finds the failures of the values before it."""
        with self._publish_lock:
            ready = []
            with self._lock:
                for value, record in self._inflight.items():  # in submission order: increasing values
                    if record.stamps is None:
                        break
                    ready.append((value, record))
                for value, _ in ready:
                    del self._inflight[value]
            offset = self.handle.clock_offset  # the stamps on the host's clock (CLDevice.host_ns)
            for value, record in ready:
                command, (start, end) = record.command, record.stamps
                command.keep = None  # done with: a deferred record may outlive its publication a while
                self.commands_run += 1
                self.signal.set(value, (start + offset, end + offset), record.error)
                if collector.is_active():
                    self._span(command, record.stamps)

    def _span(self, command: Command, stamps: tuple[int, int]) -> None:
        """Records `command`'s span for the profile, on the device's clock (the collector puts it on the
        host's)."""
        collector.record_span(Span(self.device, self.kind, command.task_id, command.name, command.kind,
                                   stamps[0], stamps[1], command.nbytes, command.flops, command.deps))


class _Completer:
    """A CL queue's completion thread: waits for each enqueued command's last event, in submission
    order, the GIL released while it waits, then completes it (`CLQueue._completed`). It blocks on
    the driver's events, and on its queue of records when nothing is in flight: it never polls.
    A `queue.SimpleQueue`, not a deque under a Condition: its put and blocking get are C calls, where
    a Condition's enter, notify and exit are Python code on the submitting thread (~3 us a command)."""

    def __init__(self, queue: CLQueue):
        self.queue = queue
        self.records: queue_module.SimpleQueue[_InFlight] = queue_module.SimpleQueue()
        threading.Thread(target=self._work, name=f"atensor-{queue.device}-{queue.kind}-completion",
                         daemon=True).start()

    def watch(self, records: list[_InFlight]) -> None:
        put = self.records.put
        for record in records:
            put(record)

    def _work(self) -> None:
        lower_priority(settings.worker_nice)  # as CPU queues' workers: the loop's thread gets a core first
        get, complete = self.records.get, self._complete
        while True:  # no record outlives its call: a blocked get() would keep the last command's memory
            complete(get())

    def _complete(self, record: _InFlight) -> None:
        if record.stamps is not None:  # a polling host completed it already
            return
        try:
            record.last.wait()
            status = record.last.command_execution_status
        except Exception:  # a failed event (clWaitForEvents reports it): its status says how
            try:
                status = record.last.command_execution_status
            except Exception:
                status = -1
            status = status if status < 0 else -1
        self.queue._completed(record, status)


class _UserWait:
    """A command's wait on a value the host sees reached: sets the command's user event then."""
    __slots__ = ("record", "user", "signal", "value", "check")

    def __init__(self, record: _InFlight, user: Any, signal: Signal, value: int, check: bool):
        self.record, self.user, self.signal, self.value, self.check = record, user, signal, value, check

    def reached(self) -> None:
        import pyopencl as cl
        if self.check and self.record.error is None:
            failed = self.signal.failure(self.value)
            if failed is not None:  # before the event is set: the command's completion sees it
                self.record.error = _dependency_failed(self.record.command, failed)
        self.user.set_status(cl.command_execution_status.COMPLETE)


def _failure_before(record: _InFlight) -> Optional[BaseException]:
    """The error of a command `record` waits for through events, directly or through the commands
    those wait for. Completions of different queues are reported in any order, so a dependency may not
    have published its own DependencyFailed yet; the root error, though, is set before its events can
    complete (at enqueue, or when its user event is set), so the walk finds it."""
    for dep in record.deps:
        found = dep.error if dep.error is not None else _failure_before(dep)
        if found is not None:
            return found
    return None


def _dependency_failed(command: Command, cause: BaseException) -> DependencyFailed:
    error = DependencyFailed(f"{command.name} (task {command.task_id}) did not run: an input failed: {cause}")
    error.__cause__ = cause
    return error


def _device_stamps(record: _InFlight) -> tuple[int, int]:
    """(start, end) of a command on its device's clock: its first event's start, its last's end.
    Read with get_profiling_info: pyopencl's `event.profile.start` goes through a Python __getattr__
    (~1.4 us a stamp here, against ~0.1)."""
    import pyopencl as cl
    info = cl.profiling_info
    try:
        return record.first.get_profiling_info(info.START), record.last.get_profiling_info(info.END)
    except cl.Error:  # a marker or a failed command may carry no stamps: both at its end, if any
        try:
            end = record.last.get_profiling_info(info.END)
        except cl.Error:
            end = 0
        return end, end


__all__ = ["CLQueue"]
