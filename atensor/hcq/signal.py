"""Timeline signals: the only synchronization between queues, and between queues and the host.

Why timeline signals: a GPU's hardware command queue does not call back into the host per command;
it writes an increasing value into a memory word when each command completes, and other queues (or
the host) wait until the word reaches a value. atensor's CPU queues work the same way, so one model
serves real and virtual devices: a command waits for `other >= v`, runs, then publishes its own
value `v + 1`. No host round trip between tasks, no per-task callback, and any number of waiters
on any value cost nothing until they are woken.

Each value also carries a stamp (start_ns, end_ns) on the host's perf_counter clock: the profiler's
spans are made of these stamps. A command that fails publishes its value anyway (so nothing waits
forever) and marks that value failed with the exception; waiters that depend on the data see it.

Invariant: a signal's value never decreases (`set` asserts it).
A failed value's exception is kept for the life of the signal (a buffer that failed work wrote may be
read at any later time), so its traceback's frames are cleared when it is kept: the text of where it
failed stays, the locals of the failing command (its arrays, its closure's tensors) go.
Waiting from an event loop: `await signal.wait(v)` parks the task; the thread that publishes `v`
wakes it through the event-loop seam (hcq/loop.py: trio or asyncio). Cancelling the wait only stops
waiting; the work goes on.

A queue that publishes some values only when asked (hcq/cl_queue.py: a lean replay's command is
published by the task that awaits it, and handed to the completion thread only when someone else
waits) sets `on_wait`: every wait calls it, under the signal's lock, after registering itself, so
the queue either sees the waiter (it checks `has_waiters` after deferring a value) or the waiter's
call sees the deferred value. Nobody polls either way.
"""
from __future__ import annotations

import collections
import inspect
import threading
from typing import Callable, Optional

from atensor.hcq import loop


class SignalFailed(RuntimeError):
    """The command that publishes a value failed; `cause` is its exception."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause


class _Waiter:
    """A task on the event loop waiting for `value`; reaching it sets the task's wake-up."""
    __slots__ = ("value", "wakeup")

    def __init__(self, value: int, wakeup: loop.Wakeup):
        self.value, self.wakeup = value, wakeup

    def wake(self) -> None:
        self.wakeup.set()


class _Callback:
    """A function to call once the signal reaches `value` (`Signal.when_reached`)."""
    __slots__ = ("value", "wake")

    def __init__(self, value: int, fn):
        self.value, self.wake = value, fn


class _GroupMember:
    """One signal's part of a `wait_all`: reaching `value` counts down the group."""
    __slots__ = ("value", "group")

    def __init__(self, value: int, group: _Group):
        self.value, self.group = value, group

    def wake(self) -> None:
        self.group.arrive()


class _Group:
    """The signals a `wait_all` still waits for; the last to arrive sets the wake-up."""
    __slots__ = ("wakeup", "remaining", "lock")

    def __init__(self, wakeup: loop.Wakeup, remaining: int):
        self.wakeup, self.remaining, self.lock = wakeup, remaining, threading.Lock()

    def arrive(self) -> None:
        with self.lock:
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self.wakeup.set()


async def wait_all(targets: list[tuple[Signal, int]]) -> None:
    """Parks the calling task until every signal reaches its value, woken once, by whichever is
    reached last (waiting on them one after another wakes the task once per signal still running:
    42% of a 2-device training step's waits, measured). Failures are not checked here."""
    newest: dict[Signal, int] = {}  # a realize of many outputs lists one value per output and queue
    for sig, value in targets:
        if sig.value < value and newest.get(sig, 0) < value:
            newest[sig] = value
    pending = list(newest.items())
    if len(pending) < 2:
        for sig, value in pending:
            await sig.wait(value, check=False)
        return
    wakeup = loop.wakeup()
    group = _Group(wakeup, len(pending))
    members = []
    try:
        for sig, value in pending:
            member = _GroupMember(value, group)
            with sig._cond:
                reached = sig.value >= value
                if not reached:
                    sig._waiters.append(member)
                    members.append((sig, member))
                    if sig.on_wait is not None:
                        sig.on_wait()
            if reached:
                group.arrive()
        while not all(sig.value >= value for sig, value in pending):
            await wakeup.wait()  # may wake spuriously: the condition is checked again
    finally:
        for sig, member in members:
            with sig._cond:
                sig._waiters = [w for w in sig._waiters if w is not member]
        wakeup.close()


# a generator's or coroutine's frame is left alone: clearing it would finalize one still suspended
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _release_frames(error: Optional[BaseException]) -> None:
    """Clears the locals of the finished frames in the tracebacks of `error` and of its causes and
    contexts (the text of the traceback stays). A frame still running (the catcher's) is left."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            if not tb.tb_frame.f_code.co_flags & _SUSPENDABLE:
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # still running
                    pass
            tb = tb.tb_next
        error = error.__cause__ or error.__context__


class Signal:
    """A monotonically increasing integer with stamps per value and failure marks.

    >>> s = Signal("CPU:0/compute")
    >>> s.set(1, (10, 20)); s.value, s.stamp(1)
    (1, (10, 20))
    """
    STAMPS_KEPT = 1 << 16

    def __init__(self, name: str):
        self.name = name
        self.value = 0
        # `set` and `reach` take the lock itself (a C-level `with`; the Condition's __enter__ and
        # __exit__ are Python calls, on every published value)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stamps: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._failures: dict[int, BaseException] = {}
        self._waiters: list[_Waiter | _GroupMember | _Callback] = []  # tasks on an event loop, callbacks
        # called, under the lock, by every wait on a value not reached yet, once the waiter is
        # registered (see the module docstring); short, and it must not take this signal's lock
        self.on_wait: Optional[Callable[[], None]] = None

    def __repr__(self) -> str:
        return f"Signal({self.name}={self.value})"

    def set(self, value: int, stamp: Optional[tuple[int, int]] = None, error: Optional[BaseException] = None,
            late: bool = False) -> None:
        """Publishes `value` (called by the owning queue's worker); wakes every waiter it satisfies.
        `late`: a value `reach` may have published already, and values after it may be published
        since (a queue's worker stamping a ring program the host saw finished): only its stamp is kept
        when the signal is past it; otherwise a value below the signal's is a bug (asserted)."""
        if error is not None:  # outside the lock: clearing locals may free buffers, run finalizers
            _release_frames(error)
        with self._lock:
            if value < self.value:
                assert late, f"{self.name}: value may not decrease ({self.value} -> {value})"
                if stamp is not None:
                    self._stamps[value] = stamp
                if error is not None:  # a device queue's completions may be reported out of order
                    self._failures[value] = error
                return
            self.value = value
            if stamp is not None:
                self._stamps[value] = stamp
                if len(self._stamps) > self.STAMPS_KEPT:
                    self._stamps.popitem(last=False)
            if error is not None:
                self._failures[value] = error
            if not self._waiters and not self._cond._waiters:  # type: ignore[attr-defined]
                return  # the common publish nobody waits on: no `_ready_locked` call (a replay's, each call)
            ready = self._ready_locked(value)
        for waiter in ready:
            waiter.wake()

    def reach(self, value: int) -> None:
        """Publishes `value` unless the signal is there already, without a stamp: for a command known
        to be done by other means than its worker (a program the doorbell ring ran, Queue.poll); the
        worker publishes it again, with its stamp, as `set` allows for an equal value."""
        if self.value >= value:
            return
        with self._lock:
            if self.value >= value:
                return
            self.value = value
            ready = self._ready_locked(value)
        for waiter in ready:
            waiter.wake()

    def _ready_locked(self, value: int) -> list:
        """Wakes the threads blocked on the condition and takes the loop waiters that `value` satisfies
        (to wake once the lock is released); the caller holds the condition's lock."""
        # only a thread in `wait_blocking` sits in the condition's own deque (read under its lock):
        # notify_all is Python code, skipped on the common publish that nobody blocks on
        if self._cond._waiters:  # type: ignore[attr-defined]
            self._cond.notify_all()
        waiters = self._waiters
        if not waiters:
            return []
        ready = [w for w in waiters if w.value <= value]
        if ready:
            self._waiters = [w for w in waiters if w.value > value]
        return ready

    def when_reached(self, value: int, fn) -> None:
        """Calls `fn()` once the signal reaches `value`: at once on this thread when it has, else on the
        thread that publishes it, outside the signal's lock (so `fn` must be short and must not block:
        an OpenCL queue sets a user event there, hcq/cl_queue.py).

        >>> s, seen = Signal("CPU:0/copy"), []
        >>> s.when_reached(2, lambda: seen.append("reached")); s.set(1); seen
        []
        >>> s.set(2); seen
        ['reached']
        """
        with self._cond:
            if self.value < value:
                self._waiters.append(_Callback(value, fn))
                if self.on_wait is not None:
                    self.on_wait()
                return
        fn()

    def stamp(self, value: int) -> Optional[tuple[int, int]]:
        """(start_ns, end_ns) of the command that published `value`, if still kept."""
        return self._stamps.get(value)

    def failure(self, value: int) -> Optional[BaseException]:
        """The exception of the command that published `value`, or None if it succeeded."""
        return self._failures.get(value)

    def has_failures(self) -> bool:
        """True when any value of this signal was marked failed (they are all kept)."""
        return bool(self._failures)

    def reached(self, value: int) -> bool:
        return self.value >= value

    def wait_blocking(self, value: int, check: bool = True, timeout: Optional[float] = None) -> None:
        """Blocks this (non-loop) thread until the signal reaches `value`; raises SignalFailed if
        `check` and that value failed."""
        if self.value < value:
            with self._cond:
                if self.on_wait is not None and self.value < value:  # registered by wait_for's wait,
                    self.on_wait()  # before it releases the lock: `has_waiters` sees it from then on
                if not self._cond.wait_for(lambda: self.value >= value, timeout):
                    raise TimeoutError(f"{self.name} did not reach {value} within {timeout}s")
        if check:
            self._raise_if_failed(value)

    async def wait(self, value: int, check: bool = True) -> None:
        """Parks the calling task (trio or asyncio, through hcq/loop.py) until the signal reaches
        `value`. Cancellation only stops the wait: the command that publishes `value` runs to
        completion regardless."""
        if self.value < value:
            wakeup = loop.wakeup()
            try:
                while True:
                    waiter = _Waiter(value, wakeup)
                    with self._cond:
                        if self.value >= value:
                            break
                        self._waiters.append(waiter)
                        if self.on_wait is not None:
                            self.on_wait()
                    try:
                        await wakeup.wait()  # may wake spuriously: the value is checked again
                    finally:
                        with self._cond:
                            self._waiters = [w for w in self._waiters if w is not waiter]
            finally:
                wakeup.close()
        if check:
            self._raise_if_failed(value)

    def has_waiters(self) -> bool:
        """True when a task, a thread or a callback waits for some value of this signal (read under the
        lock: a wait registers itself and calls `on_wait` under it)."""
        with self._lock:
            return bool(self._waiters or self._cond._waiters)  # type: ignore[attr-defined]

    def _raise_if_failed(self, value: int) -> None:
        error = self._failures.get(value)
        if error is not None:
            raise SignalFailed(f"{self.name} value {value} failed: {error}", error)

    def statistics(self) -> dict:
        """Debugging introspection: current value, waiting tasks, failed values."""
        with self._cond:
            return {"value": self.value, "waiters": len(self._waiters),
                    "failed_values": sorted(self._failures)}
