"""Command queues: one worker thread per queue, running its commands strictly in order.

Why a thread per queue: a device's hardware queue runs on its own, concurrently with the host and
with other queues; a thread is the CPU's closest equivalent. numpy releases the GIL inside its
loops and BLAS, so queues of different devices really use different cores at once.

Why commands carry their own waits: one submission per queue per realize. The plan (engine/plan.py)
lowers a whole TaskGraph into one list per queue, each command being `wait(sig, v)...; run; signal(own, v)`;
the worker never asks the host what to do next. Dependencies between queues are waits on the other
queues' timeline signals.

One interface for every device's queue (a CPU queue here, an OpenCL queue in cl_queue.py): values are
reserved (`reserve`), and a command list is handed over (`submit`), run on the submitting thread
(`run_here`), or its one command started there (`start_here`). What a device can do with a list is
a property of that interface, not a second entry: an OpenCL queue takes a command whose runner
enqueues a whole sequence of launches as one command (cl_queue.py). engine/plan.py is the only module
that calls it (tests/test_one_submitter.py).

The GIL is shared with the trio loop. A worker that runs Python between short GIL-releasing calls
can starve the loop thread for over a second (the convoy effect; docs/design.md), so the worker gives the GIL
back with `time.sleep(0)`. A `sleep(0)` costs about 55 us on these machines (the kernel's timer
slack), more than a tiny command itself, so the worker yields after a command once it has held the
GIL-running stretch for YIELD_EVERY_NS since its last yield: the loop thread never waits longer than
that for the GIL, and tiny commands do not pay 55 us each.

Once a native library is loaded (Linux), an idle worker waits in C on its queue's doorbell
(doorbell.py) instead of the condition, and starts a native program without taking the GIL.

Invariants: commands on one queue run in the order submitted; the queue's signal values are
published in increasing order, one per command; a command whose data dependency failed does not run
and publishes its value as failed.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Callable, Optional

import numpy as np

from atensor.backend.runner import Runner
from atensor.config import settings
from atensor.hcq import doorbell
from atensor.hcq.doorbell import Doorbell
from atensor.hcq.gcpause import gc_paused
from atensor.hcq.signal import Signal, SignalFailed
from atensor.profiler import collector, counters
from atensor.profiler.events import Span


class KernelError(RuntimeError):
    """A command failed on a queue; names the task, its kind and where it ran."""


class DependencyFailed(RuntimeError):
    """A command did not run because a task it reads from failed."""


class _RingClaim:
    """Whether a ring program's run is counted yet (Queue.poll and the worker race to count it), and
    what GlobalCounters adds for its command, by whichever counts it. The counts are copied, not the
    command: the command holds its claim, and a claim holding its command back was a reference cycle
    per ring program (with the command's runner, its closure and argument block), which only the cyclic
    collector freed: most of the collections of an eager training step."""
    __slots__ = ("counted", "kind", "kernels", "nbytes", "flops")

    def __init__(self, command: "Command") -> None:
        self.counted = False
        self.kind, self.kernels, self.nbytes, self.flops = command.kind, command.kernels, command.nbytes, command.flops


class Command:
    """One entry of a queue's list: wait for `waits`, run `run`, publish `value` with a stamp."""
    __slots__ = ("value", "waits", "run", "name", "kind", "task_id", "nbytes", "flops", "deps", "started",
                 "claim", "kernels", "echo", "keep")

    def __init__(self, value: int, waits: tuple, run: Optional[Runner], name: str, kind: str,
                 task_id: int, nbytes: int = 0, flops: int = 0, deps: tuple[int, ...] = (),
                 kernels: int = 1, echo: bool = False, keep: object = None):
        self.value, self.waits, self.run, self.name, self.kind = value, waits, run, name, kind
        self.task_id, self.nbytes, self.flops, self.deps = task_id, nbytes, flops, deps
        self.kernels = kernels  # the tasks it runs (a batch of native kernels is one command): GlobalCounters
        self.echo = echo  # print it as it finishes (the `debug` setting of the realize that made it)
        self.started = 0  # set by `Queue.start_here` when it submits a command it starts: its stamp's start
        self.claim: Optional[_RingClaim] = None  # set by `Queue.submit` when the doorbell ring holds its program
        # what its run uses that nothing else holds (a replay's bound buffers): the queue references
        # the command until its value is published, so this memory outlives the run
        self.keep = keep


YIELD_EVERY_NS = 500_000


def lower_priority(nice: int) -> None:
    """Gives the calling worker thread a lower OS scheduling priority (`nice` more; Linux, where a
    thread has a priority of its own), so that on a busy machine the event loop's thread gets a core
    first: the loop waits for no kernel. Not possible here: a no-op."""
    if nice <= 0 or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return
    try:
        # relative to the process's main thread (a thread inherits its creator's niceness on Linux)
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + nice))
    except OSError:
        pass


class Queue:
    """An in-order command queue with its own worker thread and timeline signal."""

    def __init__(self, device: str, kind: str):
        self.device, self.kind = device, kind
        self.signal = Signal(f"{device}/{kind}")
        self._reserved = 0  # last value handed out by `reserve`; only the plan calls it (engine/plan.py)
        self._pending: collections.deque[list[Command]] = collections.deque()
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._doorbell: Optional[Doorbell] = None  # set by the worker once a native library is loaded
        self.commands_run = 0
        self.ran_here = 0  # commands `start_here` finished on the submitting thread
        # (value, list number, claim) of the newest list posted whose program the doorbell ring holds
        # (`poll`); the claim is that list's `_RingClaim`: who finishes its bookkeeping, exactly once
        self._ring_last: tuple[int, int, Optional[_RingClaim]] = (0, 0, None)

    def __repr__(self) -> str:
        return f"Queue({self.device}/{self.kind})"

    def reserve(self, count: int = 1) -> int:
        """Reserves the next `count` signal values for commands being planned; returns the value just
        before them (the first reserved one is the result + 1). Only the dispatching thread plans."""
        base = self._reserved
        self._reserved = base + count
        return base

    def idle(self) -> bool:
        """True when every value reserved so far is published: no command is queued or running. Read by
        the dispatching thread (the only one that reserves and submits), for which it stays true until
        it submits again."""
        return self.signal.value >= self._reserved

    def run_here(self, commands: list[Command]) -> None:
        """Runs `commands` on the calling thread, in this queue's place, exactly as its worker would
        (waits, run, publish with stamps, failures). Only the dispatching thread calls it, right after
        `idle()` said nothing is before them, so the queue's order still holds (engine/plan.py runs a
        tiny eager plan this way: no hand-off to the worker and back)."""
        if len(commands) == 1:  # one foreign call (a replay's one-call program): no numpy error state
            run = commands[0].run
            if run is not None and run.gil_free:
                self._execute(commands[0])
                return
        with np.errstate(all="ignore"):  # as the worker runs (see _work)
            for command in commands:
                self._execute(command)

    def start_here(self, command: Command, here: Callable[[Callable[[], None], bool], bool],
                   commands: list[Command]) -> None:
        """Runs `command` (the only one of `commands`, this queue's list) by starting it on the calling
        thread through `here` (its runner's `Runner.here`). When `here` finishes it there, without
        submitting, it is published here as the worker would (stamps, failure); otherwise `here` calls
        the `submit` it is given, which hands `commands` to the worker, and the worker finishes and
        publishes it (taking the collective over from this thread). As for `run_here`, only the
        dispatching thread calls it, right after `idle()` was true."""
        start = time.perf_counter_ns()
        submitted = False

        def submit() -> None:
            nonlocal submitted
            command.started = start  # its span starts here, where it was started
            submitted = True
            self.submit(commands)
        try:
            if not here(submit, True):
                if not submitted:
                    raise RuntimeError(f"{command.name}: Runner.here returned False without submitting")
                return
            self.ran_here += 1
            error: Optional[BaseException] = None
        except Exception as exc:  # the command's own error, surfaced by the awaiting host
            if submitted:  # the worker publishes it: an error after the hand-off is a bug of `here`
                raise
            error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) failed on "
                                f"{self.device}/{self.kind}: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        self._finish(command, start, time.perf_counter_ns(), error)

    def submit(self, commands: list[Command]) -> None:
        """Hands a whole command list to the worker (one submission per realize)."""
        if not commands:
            return
        with self._cond:
            self._pending.append(commands)
            if self._doorbell is not None:  # the worker waits in C: ring it (see doorbell.py)
                first = commands[0]
                number = self._doorbell.post(first.run.ring_args if len(commands) == 1 and not first.waits
                                             and first.run is not None else None)
                if number:
                    first.claim = _RingClaim(first)
                    self._ring_last = (first.value, number, first.claim)
            else:
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"atensor-{self.device}-{self.kind}",
                                                daemon=True)
                self._thread.start()

    def poll(self, value: int) -> bool:
        """True when `value` is reached. When it is the value of the newest program posted to the
        doorbell ring and that program has run, publishes it first (Signal.reach): the awaiting host
        need not park until the worker takes the GIL back to publish it (doorbell.py)."""
        signal = self.signal
        if signal.value >= value:
            return True
        last_value, number, claim = self._ring_last
        if last_value == value and claim is not None and self._doorbell is not None \
                and self._doorbell.finished(number):
            if self._count_ring_program(claim):  # counted once it is published: the statistics agree
                stamps = self._doorbell.stamps  # the newest program's (this one), written as it ran
                counters.count(claim.kind, claim.kernels, claim.nbytes, claim.flops, stamps[0], stamps[1])
            signal.reach(value)
            return True
        return False

    def _count_ring_program(self, claim: Optional[_RingClaim]) -> bool:
        """Counts a program the ring ran (`commands_run`, the doorbell's `ran`) once, by whichever of
        the polling host and the worker comes first (its command's claim, set when it was posted);
        True for that one, which also adds it to GlobalCounters."""
        with self._cond:
            if claim is not None:
                if claim.counted:
                    return False
                claim.counted = True
            self.commands_run += 1
            if self._doorbell is not None:
                self._doorbell.ran += 1
            return True

    def statistics(self) -> dict:
        """Commands submitted but not yet run, the signal's value, and the last reserved value."""
        with self._cond:
            pending = sum(len(c) for c in self._pending)
        return {"pending_commands": pending, "signal": self.signal.value, "reserved": self._reserved,
                "commands_run": self.commands_run}

    def _work(self) -> None:
        lower_priority(settings.worker_nice)
        # kernels follow IEEE like PyTorch does: inf and nan, no warnings (numpy's error state is per thread)
        np.seterr(all="ignore")
        # the clock this queue stamps with: the host's perf_counter, read on this thread, so its offset to
        # the host clock is 0 by construction (a device with its own clock would measure it here)
        collector.set_clock_offset(self.device, self.kind, 0)
        last_yield = time.perf_counter_ns()
        while True:
            bell = self._doorbell
            if bell is None and doorbell.available():
                with self._cond:
                    if not self._pending:  # from now on every list posted is counted by the ring
                        self._doorbell = bell = doorbell.Doorbell()
            if bell is not None:
                stamps = bell.next()  # waits, and runs a native program, without the GIL
                with self._cond:
                    commands = self._pending.popleft()
                if stamps is not None:
                    # the host may have published its value already (`poll`), and run later tiny
                    # commands here since: the value is stamped, never lowered, counted once
                    first = commands[0]
                    counted = self._count_ring_program(first.claim)
                    self._finish(first, first.started or stamps[0], stamps[1], None, late=True, count=counted)
                    del commands, first  # a finished command must not keep its buffers while the worker waits
                    last_yield = time.perf_counter_ns()
                    continue
            else:
                with self._cond:
                    while not self._pending:
                        self._cond.wait()
                    commands = self._pending.popleft()
            with gc_paused():  # see gcpause.py
                for command in commands:
                    self._execute(command)
                    now = time.perf_counter_ns()
                    run = command.run
                    if run is not None and run.gil_free:
                        last_yield = now  # it gave the GIL back for its whole run (a native program)
                    elif now - last_yield > YIELD_EVERY_NS:
                        time.sleep(0)  # give the GIL back to the event loop
                        last_yield = time.perf_counter_ns()
                del commands, command, run  # drop the finished commands now: they keep memory alive
            last_yield = time.perf_counter_ns()  # waiting for work released the GIL

    def _execute(self, command: Command) -> None:
        error: Optional[BaseException] = None
        for signal, value, check in command.waits:
            try:
                signal.wait_blocking(value, check)
            except SignalFailed as failed:
                error = DependencyFailed(f"{command.name} (task {command.task_id}) did not run: an input "
                                         f"failed: {failed.cause}")
                error.__cause__ = failed.cause
                break
        start = command.started or time.perf_counter_ns()
        if error is None and command.run is not None:
            try:
                command.run.fn()
            except Exception as exc:  # the kernel's own error, surfaced by the awaiting host
                error = KernelError(f"{command.kind} {command.name} (task {command.task_id}) failed on "
                                    f"{self.device}/{self.kind}: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
        self._finish(command, start, time.perf_counter_ns(), error)

    def _finish(self, command: Command, start: int, end: int, error: Optional[BaseException],
                late: bool = False, count: bool = True) -> None:
        """Publishes a command's value with its stamps (and its error); records its span. `late`: the
        value may be reached already (a ring program `poll` saw finished), see `Signal.set`; it was
        counted already (`_count_ring_program`)."""
        if not late:
            self.commands_run += 1
        if error is None:  # counted before it is published: a waiter that wakes sees it counted
            if count:  # (a ring program the polling host published first was counted there: `poll`)
                counters.count(command.kind, command.kernels, command.nbytes, command.flops, start, end)
            if command.echo:
                counters.echo(self.device, command.kind, command.name, command.nbytes, command.flops, start, end)
        self.signal.set(command.value, (start, end), error, late)
        if collector._active:  # (collector.is_active() without its call: every command comes here)
            collector.record_span(Span(self.device, self.kind, command.task_id, command.name,
                                                 command.kind, start, end, command.nbytes, command.flops,
                                                 command.deps))
