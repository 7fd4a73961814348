# The event loop's own time: which task's code ran on the loop thread, and when (trio and asyncio).
#
# atensor records its own host work (scheduling, compiling, awaiting, gc...), but a step of a
# training loop, or a server's request handling, also runs the application's Python between awaits:
# building the next graph, reading a loss, parsing a request, writing a response. Without a span for
# that time, a trace shows unexplained gaps on the host, and "every millisecond is accounted for"
# cannot hold. While a profile is active inside a running loop, each step of at least MIN_STEP_NS
# becomes a HostSpan (category "task") on the "event loop" track:
#
# - trio: an Instrument sees `before_task_step` / `after_task_step` around every run of a task's
#   code; the span is "task <name>".
# - asyncio: there is no public per-step hook, but every step of a task, and every other callback
#   the loop runs (a transport's read-ready callback, where a server parses requests; a future's done
#   callback), is run by `asyncio.events.Handle._run`. While some profile watches an asyncio loop,
#   that method is replaced (on the class: the loop calls `handle._run()`) by a timed one that records
#   the callbacks of the watched loops' threads: "task <name>" for a task's step or wake-up,
#   "callback <qualified name>" for the rest. The original is put back when the last watch ends.
#   uvloop runs its own (compiled) handles: there nothing is recorded.
#
# Shorter steps are not recorded: they are the bulk of all steps (a wake-up, a check, another await),
# and their time is within the resolution anyone reads a timeline at.
#
# Alternatives rejected: sys.setprofile (every Python call, 10x slower, and it sees the queue
# workers' threads too); a sampling thread (it needs the GIL to sample, so it disturbs the very
# gaps it measures); an asyncio task factory (it sees a task created, not each of its steps, nor
# the transports' callbacks).
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .events import HostSpan

MIN_STEP_NS = 20_000
TRACK = "event loop"

Record = Callable[[HostSpan], Any]


class TaskSteps:
    """A trio Instrument that records task steps as host spans through `record`."""

    def __init__(self, record: Record) -> None:
        self._record = record
        self._start = 0

    def before_task_step(self, task: Any) -> None:
        self._start = time.perf_counter_ns()

    def after_task_step(self, task: Any) -> None:
        # the step that installed the instrument ends with no start seen: it is not recorded
        end, start, self._start = time.perf_counter_ns(), self._start, 0
        if start and end - start >= MIN_STEP_NS:
            self._record(HostSpan(f"task {task.name}", "task", start, end, TRACK))


# ---- asyncio: a timed Handle._run while a profile watches a loop --------------------------------------
_lock = threading.Lock()
_watches: dict[int, tuple[Record, ...]] = {}  # loop thread ident -> recorders; replaced, never mutated
_original_run: Optional[Callable[[asyncio.Handle], None]] = None  # Handle._run while it is replaced


@dataclass(frozen=True)
class AsyncioWatch:
    """One profile's watch of the asyncio loop running on thread `thread` (see `install`)."""
    thread: int
    record: Record


def callback_name(callback: Any) -> str:
    """How a span names the callback a handle ran: "task <name>" for a task's step or wake-up (a method
    of the task), else "callback <qualified name>"."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return f"task {owner.get_name()}"
    name = getattr(callback, "__qualname__", None) or getattr(getattr(callback, "func", None), "__qualname__",
                                                              None)
    return f"callback {name or type(callback).__name__}"


def _timed_run(handle: asyncio.Handle) -> None:
    run = _original_run if _original_run is not None else _unpatched
    records = _watches.get(threading.get_ident())
    if records is None:  # a loop on a thread no profile watches
        return run(handle)
    callback = handle._callback  # _run drops it if the handle is cancelled meanwhile: read it first
    start = time.perf_counter_ns()
    try:
        return run(handle)
    finally:
        end = time.perf_counter_ns()
        if end - start >= MIN_STEP_NS:
            span = HostSpan(callback_name(callback), "task", start, end, TRACK)
            for record in records:
                record(span)


_unpatched = asyncio.events.Handle._run


def _install_asyncio(record: Record) -> Optional[AsyncioWatch]:
    global _original_run
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    if not isinstance(loop, asyncio.BaseEventLoop):  # uvloop: its handles are not asyncio's
        return None
    watch = AsyncioWatch(threading.get_ident(), record)
    with _lock:
        _watches[watch.thread] = _watches.get(watch.thread, ()) + (record,)
        if _original_run is None:
            _original_run = asyncio.events.Handle._run
            asyncio.events.Handle._run = _timed_run
    return watch


def _uninstall_asyncio(watch: AsyncioWatch) -> None:
    global _original_run
    with _lock:
        left = list(_watches.get(watch.thread, ()))
        if watch.record in left:
            left.remove(watch.record)
        if left:
            _watches[watch.thread] = tuple(left)
        else:
            _watches.pop(watch.thread, None)
        if not _watches and _original_run is not None:
            asyncio.events.Handle._run = _original_run
            _original_run = None


# ---- either loop ------------------------------------------------------------------------------------
def install(record: Record) -> TaskSteps | AsyncioWatch | None:
    """Records the running loop's task steps through `record`: a TaskSteps instrument on a trio loop,
    an AsyncioWatch on an asyncio one; None outside a loop (or on uvloop): nothing to watch."""
    try:
        import trio
        instrument = TaskSteps(record)
        trio.lowlevel.add_instrument(instrument)
        return instrument
    except (ImportError, RuntimeError):
        pass
    return _install_asyncio(record)


def uninstall(watch: TaskSteps | AsyncioWatch | None) -> None:
    """Stops what `install` started (a no-op for None, or once its loop has ended)."""
    if watch is None:
        return
    if isinstance(watch, AsyncioWatch):
        _uninstall_asyncio(watch)
        return
    try:
        import trio
        trio.lowlevel.remove_instrument(watch)
    except (RuntimeError, KeyError):
        pass
