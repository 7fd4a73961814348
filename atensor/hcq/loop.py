"""The one seam between atensor and the event loop: which loop runs, waking a task, running blocking work.

Why one module: atensor's queues run on threads, and the application's tasks run on an event loop,
trio or asyncio (`asyncio.run`, uvloop, anyio on either backend). Everything that differs between
the two lives here; the rest of atensor asks this module, never trio or asyncio directly.

It does three things:
- `Wakeup`: a task on the loop parks in `await w.wait()`; any thread (a queue's worker, the
  dispatcher) calls `w.set()`. Waking costs one loop iteration: trio polls an eventfd
  (`trio.lowlevel.wait_readable`); asyncio keeps one eventfd per loop whose reader stays registered
  (`loop.add_reader`), so a wake-up is a write plus a future resolved in the reader callback. Where
  there is no eventfd (macOS, Windows) trio reschedules through its token and asyncio through
  `call_soon_threadsafe`.
- cancelling a wait: `wait()` is an ordinary cancellation point on both loops (trio cancel scopes,
  asyncio `cancel`, `wait_for`, `timeout`); cancelling only stops the waiting.
- `run_sync(fn)`: blocking work in a worker thread while the loop stays free.

Invariant: a `Wakeup` may wake spuriously (a pooled eventfd can carry a write meant for its previous
user); callers re-check what they wait for, as with a condition variable. A `set()` before the
`wait()` is never lost: the next `wait()` returns at once.
"""
from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional, TypeVar

import sniffio

T = TypeVar("T")
SUPPORTED = ("trio", "asyncio")
_EVENTFD = hasattr(os, "eventfd")  # Linux

_eventfds: list[int] = []  # idle eventfds of finished trio waits, reused (list append and pop are atomic)


class UnsupportedLoopError(RuntimeError):
    """atensor was awaited from an async library it does not support."""


def _new_eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def current_library() -> str:
    """The async library running the calling task: "trio" or "asyncio" (uvloop and anyio report the
    loop underneath). Raises UnsupportedLoopError for any other, and outside a loop."""
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise UnsupportedLoopError("atensor can only be awaited from a running trio or asyncio event loop "
                                   "(asyncio.run, uvloop, anyio.run on either backend); no async library "
                                   "was detected in this context") from None
    if name not in SUPPORTED:
        raise UnsupportedLoopError(f"atensor supports the trio and asyncio event loops (also uvloop, and "
                                   f"anyio on either backend), not {name!r}; run the application under one "
                                   f"of those")
    return name


def running_library() -> Optional[str]:
    """The name of the event loop running on this thread ("trio", "asyncio", or what sniffio detects),
    or None in a plain script or a worker thread. Used to refuse blocking calls on a loop thread.
    Raises and catches nothing: it runs on every sync accessor and every call of a plain jitted
    function, and the three caught exceptions of asking trio, asyncio and sniffio in turn cost 7-17 us
    a call in a plain script (measured on a loaded machine), against 0.3 us for these lookups."""
    name = sniffio.thread_local.name  # trio sets it on the thread it runs on (guest mode too)
    if name is not None:
        return name
    if asyncio.events._get_running_loop() is not None:
        return "asyncio"
    return sniffio.current_async_library_cvar.get()  # a library that marks its tasks instead


def in_running_loop() -> bool:
    """True when called on a thread that runs an event loop (where blocking would stall it)."""
    return running_library() is not None


class Wakeup:
    """A wake-up from any thread for one task on the running loop (see the module docstring)."""

    def set(self) -> None:  # pragma: no cover - every loop's class overrides it
        """Wakes the task parked in `wait()` (or makes the next `wait()` return at once); any thread."""
        raise NotImplementedError

    async def wait(self) -> None:  # pragma: no cover
        """Parks the calling task until `set()`; a cancellation point. May return spuriously."""
        raise NotImplementedError

    def close(self) -> None:
        """Gives back what the wake-up holds (call once the waiting is over)."""


def wakeup() -> Wakeup:
    """A Wakeup for the calling task's loop; UnsupportedLoopError outside trio and asyncio."""
    if current_library() == "trio":
        return _TrioFdWakeup() if _EVENTFD else _TrioTokenWakeup()
    return _AsyncioWakeup(asyncio.get_running_loop())


class _TrioFdWakeup(Wakeup):
    """trio: the task waits for a pooled eventfd to become readable; `set` writes it."""
    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = _eventfds.pop() if _eventfds else _new_eventfd()

    def set(self) -> None:
        fd = self.fd  # once closed (-1) nobody waits; a pooled fd stays open, so a late write is safe
        if fd >= 0:
            os.eventfd_write(fd, 1)

    async def wait(self) -> None:
        import trio
        await trio.lowlevel.wait_readable(self.fd)
        _drain(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            _eventfds.append(self.fd)
            self.fd = -1


class _TrioTokenWakeup(Wakeup):
    """trio without eventfd: `set` reschedules the parked task through the run's token."""
    __slots__ = ("token", "task", "flag")

    def __init__(self) -> None:
        import trio
        self.token = trio.lowlevel.current_trio_token()
        self.task: Any = None
        self.flag = False

    def set(self) -> None:
        import trio
        try:
            self.token.run_sync_soon(self._on_loop)
        except trio.RunFinishedError:
            pass

    def _on_loop(self) -> None:
        """On the trio thread, where a cancellation also runs: so the two cannot race."""
        import trio
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)
        else:
            self.flag = True

    async def wait(self) -> None:
        import trio
        if self.flag:
            self.flag = False
            return
        self.task = trio.lowlevel.current_task()

        def abort(_: object) -> Any:
            self.task = None  # a wake-up already on its way finds nobody to reschedule
            return trio.lowlevel.Abort.SUCCEEDED
        await trio.lowlevel.wait_task_rescheduled(abort)


class _LoopReader:
    """One asyncio loop's eventfd, its reader registered for as long as the loop lives; `set` from a
    thread queues the wake-up and writes the fd, the reader callback (on the loop) fires the queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop_ref = weakref.ref(loop)
        self.ready: collections.deque[_AsyncioWakeup] = collections.deque()
        self.fd = -1
        if _EVENTFD:
            fd = _new_eventfd()
            try:
                loop.add_reader(fd, self._on_readable)
                self.fd = fd
            except (NotImplementedError, RuntimeError):  # a loop without add_reader (Proactor)
                os.close(fd)

    def _on_readable(self) -> None:
        _drain(self.fd)
        ready = self.ready
        while ready:
            ready.popleft()._fire()

    def __del__(self) -> None:
        # closed only once nothing references it: a Wakeup that may still write holds its reader
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_readers: dict[int, _LoopReader] = {}  # id(loop) -> its reader, for loops not closed yet
_readers_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A child must not share its parent's eventfds, nor think its parent's loops are its own."""
    _eventfds.clear()
    _readers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _reader_for(loop: asyncio.AbstractEventLoop) -> _LoopReader:
    reader = _readers.get(id(loop))
    if reader is not None and reader.loop_ref() is loop:
        return reader
    with _readers_lock:
        for key, old in list(_readers.items()):  # a closed loop's reader goes (its fd with it)
            old_loop = old.loop_ref()
            if old_loop is None or old_loop.is_closed():
                del _readers[key]
        reader = _LoopReader(loop)
        _readers[id(loop)] = reader
    return reader


class _AsyncioWakeup(Wakeup):
    """asyncio: the task awaits a future that the loop's reader (or call_soon_threadsafe) resolves."""
    __slots__ = ("loop", "reader", "future", "flag")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.reader = loop, _reader_for(loop)
        self.future: Optional[asyncio.Future] = None
        self.flag = False

    def set(self) -> None:
        reader = self.reader
        if reader.fd >= 0:
            reader.ready.append(self)
            os.eventfd_write(reader.fd, 1)  # open while this wake-up holds the reader
            return
        try:
            self.loop.call_soon_threadsafe(self._fire)
        except RuntimeError:  # the loop closed
            pass

    def _fire(self) -> None:
        """On the loop thread (so it cannot race `wait` or a cancellation)."""
        fut = self.future
        if fut is not None and not fut.done():
            fut.set_result(None)
        elif fut is None:
            self.flag = True

    async def wait(self) -> None:
        if self.flag:
            self.flag = False
            return
        fut = self.loop.create_future()
        self.future = fut
        try:
            await fut
        finally:
            self.future = None


# An await whose work is already done yields to the loop only when this long has passed since such an
# await last yielded (`checkpoint`). Why: a yield is a whole scheduler round (trio's checkpoint 7-15 us,
# asyncio's sleep(0) 4-5 us, uvloop's 2-3 us, measured in a tight loop on the 2-core machine), a tenth
# of an awaited one-kernel jit call; a task awaiting tiny realizes in a loop still gives the others
# their turn at least this often, far below the loop's longest gaps with real work
# (bench/loop_lag.py: 5-6 ms with big kernels). Cancellation is checked on every await all the same.
YIELD_EVERY_NS = 500_000
_last_yield_ns = 0  # when a done await last yielded (any loop's thread: several loops only yield more)


_trio_lowlevel: Any = None  # trio.lowlevel, bound by the first trio checkpoint (trio imported only when used)


async def checkpoint() -> None:
    """For an await whose work is already done: a cancellation point on every call (trio's
    `checkpoint_if_cancelled`; on asyncio a cancellation is delivered at the next yield), and a
    scheduling point (trio's `checkpoint`, asyncio's `sleep(0)`) when `YIELD_EVERY_NS` has passed since
    the last one here, so a task awaiting tiny realizes in a loop still gives the others their turn.
    The loop is found as `running_library` finds it, its two common answers read here and trio's module
    bound once (every awaited direct jit replay comes here: 0.31 against 0.44 us a call under trio with a
    `running_library` call and an import statement per call, AMD EPYC Zen 5); only anything but trio or
    asyncio goes through `current_library`, which says what is unsupported."""
    global _last_yield_ns, _trio_lowlevel
    name = sniffio.thread_local.name
    if name is None:
        name = "asyncio" if asyncio.events._get_running_loop() is not None else running_library()
    now = time.perf_counter_ns()
    if name == "trio":
        lowlevel = _trio_lowlevel
        if lowlevel is None:
            import trio
            lowlevel = _trio_lowlevel = trio.lowlevel
        if now - _last_yield_ns < YIELD_EVERY_NS:
            await lowlevel.checkpoint_if_cancelled()
            return
        _last_yield_ns = now
        await lowlevel.checkpoint()
    elif name == "asyncio" or current_library() == "asyncio":
        if now - _last_yield_ns < YIELD_EVERY_NS:
            return
        _last_yield_ns = now
        await asyncio.sleep(0)
    else:  # pragma: no cover - current_library raised for any other library
        raise UnsupportedLoopError(name)


async def run_sync(fn: Callable[[], T]) -> T:
    """Runs the blocking `fn` in a worker thread and returns its result; the loop stays free. The
    thread always runs to completion: cancelling the await only stops the waiting on asyncio, and on
    trio is deferred until `fn` returns (trio.to_thread's rule)."""
    if current_library() == "trio":
        import trio
        return await trio.to_thread.run_sync(fn)
    return await asyncio.get_running_loop().run_in_executor(None, fn)


__all__ = ["SUPPORTED", "UnsupportedLoopError", "Wakeup", "checkpoint", "current_library", "in_running_loop",
           "run_sync", "running_library", "wakeup"]
