# Where events go while a profile is active, and the Profile object users hold.
#
# The core calls `is_active()` before building any event, so with no profile active the whole
# cost of profiling is one function call reading one global. When profiles are active, each
# `record_*` appends the event to every active profile: that is what makes nested and
# overlapping profiles work (the outer one sees everything, the inner one its own window).
#
# Threads: queue workers record spans concurrently with the trio thread. The set of active
# profiles is an immutable tuple that is replaced (under a lock) on enter and exit, never
# mutated, so a recorder reads it once without locking and iterates a consistent snapshot;
# `list.append` on the profiles' lists is atomic under the GIL. An event recorded by a worker a
# moment after the profile exited may be missed: await the work inside the `with` block.
#
# Garbage collections are recorded from CPython's own hook (gc.callbacks), installed while a
# profile is active: a collection stops every thread, so it is host time whoever triggered it,
# including the collections atensor defers while its threads work (hcq/gcpause.py) and that run
# at the first allocation after the pause ends.
#
# Alternatives rejected: a contextvar would follow trio tasks but not the queue worker threads
# that stamp the spans; a per-thread buffer merged at exit would be faster still but needs
# flushing logic in the workers, for a saving that does not matter next to a kernel launch.
from __future__ import annotations

import gc
import threading
import time
from os import PathLike
from pathlib import Path
from typing import Any

from .chrome import read_chrome_file, to_chrome, write_chrome_file
from .events import HostSpan, MemoryEvent, Span
from .html import write_html_file
from . import tasks
from .summary import ProfileStats, compute_stats, format_summary
from .timeline import Timeline, build_timeline

_lock = threading.Lock()
_active: tuple[Profile, ...] = ()                  # replaced, never mutated (see above)
_clock_offsets: dict[tuple[str, str], int] = {}    # (device, queue) -> offset to the host clock
_kernel_ops: dict[str, str] = {}                   # kernel name -> its op list (`describe_kernel`)
_KERNEL_OPS_KEPT = 1 << 14


def is_active() -> bool:
    """True while at least one profile is collecting; the core checks this before recording."""
    return bool(_active)


def record_span(span: Span) -> None:
    """Add one device-queue span to every active profile (callable from any thread)."""
    for prof in _active:
        prof.spans.append(span)


def record_host(span: HostSpan) -> None:
    """Add one host span (schedule, compile, submit, await) to every active profile."""
    for prof in _active:
        prof.host_spans.append(span)


class host_span:   # noqa: N801 - used like a function: `with host_span(...):`
    """Record the block as one HostSpan when a profile is active (nothing else when none is).

    A class rather than a generator-based context manager: the core wraps hot paths in it (every
    jitted call), and with no profile active entering and leaving costs two attribute reads.

    Example::

        with host_span("load weights model.safetensors", "load"):
            arrays = load_file(path)
    """

    __slots__ = ("name", "category", "track", "detail", "start")

    def __init__(self, name: str, category: str, track: str = "host", detail: str = "") -> None:
        self.name, self.category, self.track, self.detail = name, category, track, detail
        self.start = 0

    def __enter__(self) -> None:
        if _active:
            self.start = time.perf_counter_ns()

    def __exit__(self, *exc_info: object) -> None:
        if self.start and _active:
            record_host(HostSpan(self.name, self.category, self.start, time.perf_counter_ns(), self.track,
                                 self.detail))


_gc_started: list[int] = []   # start of the collection in progress (collections never nest)


def _on_gc(phase: str, info: dict[str, int]) -> None:
    """gc.callbacks hook: one "gc" host span per cyclic collection while a profile is active."""
    if phase == "start":
        _gc_started[:] = [time.perf_counter_ns()]
    elif _gc_started:
        start = _gc_started.pop()
        detail = f"{info.get('collected', 0)} objects collected, {info.get('uncollectable', 0)} uncollectable"
        record_host(HostSpan(f"gc collection (generation {info.get('generation', '?')})", "gc", start,
                             time.perf_counter_ns(), "gc", detail))


def describe_kernel(name: str, ops: str) -> None:
    """Notes what the kernel `name` computes, op by op (sched/kernel_names.py), for profiles to show on
    hover (called as kernels are lowered, profiling or not: a jit's kernels are lowered once, maybe
    before the profile starts). Kernels of one name compute the same main ops at the same shape."""
    if ops and _kernel_ops.get(name) != ops:
        if len(_kernel_ops) >= _KERNEL_OPS_KEPT:
            _kernel_ops.clear()
        _kernel_ops[name] = ops


def record_memory(event: MemoryEvent) -> None:
    """Add one memory sample (bytes in use on a device) to every active profile."""
    for prof in _active:
        prof.memory.append(event)


def set_clock_offset(device: str, queue: str, offset_ns: int) -> None:
    """Record that `queue_time + offset_ns == host_time` for this queue's timestamps.

    Profiles copy the offsets known when they start and follow later changes while active, so
    a profile is exported with the offsets that were true while it recorded.
    """
    global _clock_offsets
    with _lock:
        _clock_offsets = {**_clock_offsets, (device, queue): int(offset_ns)}
        for prof in _active:
            prof.clock_offsets[(device, queue)] = int(offset_ns)


def profile() -> Profile:
    """Start a profile to use as `with atensor.profile() as prof:` (or `async with`).

    Example::

        with atensor.profile() as prof:
            await step()
        prof.export("trace.json")
    """
    return Profile()


class Profile:
    """The events recorded while a `with profile()` block was open, and ways to look at them.

    `spans`, `host_spans` and `memory` are plain lists of events (events.py). `export(path)`
    writes a Chrome trace (.json, .json.gz) or an HTML timeline (.html); `summary()` returns
    tables as text; `stats()` returns the same numbers as a ProfileStats.
    """

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.host_spans: list[HostSpan] = []
        self.memory: list[MemoryEvent] = []
        self.clock_offsets: dict[tuple[str, str], int] = {}
        self.kernel_ops: dict[str, str] = {}  # a loaded trace's; a recorded profile's come from describe_kernel
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self._entered = False
        self._timeline: tuple[tuple, Timeline] | None = None
        self._task_steps: tasks.TaskSteps | tasks.AsyncioWatch | None = None

    @classmethod
    def from_events(
        cls,
        spans: list[Span] | tuple[Span, ...] = (),
        host_spans: list[HostSpan] | tuple[HostSpan, ...] = (),
        memory: list[MemoryEvent] | tuple[MemoryEvent, ...] = (),
        clock_offsets: dict[tuple[str, str], int] | None = None,
    ) -> Profile:
        """A finished profile holding the given events (for tests and for loaded traces)."""
        prof = cls()
        prof.spans.extend(spans)
        prof.host_spans.extend(host_spans)
        prof.memory.extend(memory)
        prof.clock_offsets.update(clock_offsets or {})
        prof._entered = True
        return prof

    @classmethod
    def load(cls, path: str | PathLike[str]) -> Profile:
        """Read a trace written by `export(".json")`; raises ValueError if it is not one."""
        saved = read_chrome_file(Path(path))
        prof = cls.from_events(saved.spans, saved.host_spans, saved.memory)
        prof.kernel_ops.update(saved.kernel_ops)
        prof.start_ns, prof.end_ns = saved.window
        return prof

    # -- collecting ---------------------------------------------------------------------------

    def __enter__(self) -> Profile:
        global _active
        if self._entered:
            raise RuntimeError("a Profile collects once; call atensor.profile() for a new one")
        self._entered = True
        with _lock:
            self.clock_offsets.update(_clock_offsets)
            self.start_ns = time.perf_counter_ns()
            _active = _active + (self,)
            if _on_gc not in gc.callbacks:
                gc.callbacks.append(_on_gc)
        # inside a trio or asyncio loop, the loop thread's task steps are host spans too (tasks.py)
        self._task_steps = tasks.install(self.host_spans.append)
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _active
        with _lock:
            self.end_ns = time.perf_counter_ns()
            _active = tuple(p for p in _active if p is not self)
            if not _active and _on_gc in gc.callbacks:
                gc.callbacks.remove(_on_gc)
        tasks.uninstall(self._task_steps)
        self._task_steps = None

    async def __aenter__(self) -> Profile:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)

    @property
    def active(self) -> bool:
        """True between entering and exiting the `with` block."""
        return any(p is self for p in _active)

    # -- looking at it ------------------------------------------------------------------------

    def timeline(self) -> Timeline:
        """The events on one clock with non-overlapping tracks (what every export is made of).

        Cached until an event is added (the lists only grow), so `summary()` then `export()`
        of a large profile normalizes it once.
        """
        key = (len(self.spans), len(self.host_spans), len(self.memory),
               tuple(sorted(self.clock_offsets.items())), self.start_ns, self.end_ns)
        if self._timeline is None or self._timeline[0] != key:
            spans = self.spans[: key[0]]
            known = _kernel_ops
            ops = {s.name: known[s.name] for s in spans if s.name in known}
            timeline = build_timeline(
                spans, self.host_spans[: key[1]], self.memory[: key[2]],
                dict(self.clock_offsets), (self.start_ns, self.end_ns), {**ops, **self.kernel_ops},
            )
            self._timeline = (key, timeline)
        return self._timeline[1]

    def to_chrome(self) -> dict[str, Any]:
        """The profile as a Chrome trace-event JSON object (what Perfetto opens)."""
        return to_chrome(self.timeline())

    def stats(self) -> ProfileStats:
        """The summary's numbers as a ProfileStats (wall time, overlap, per kernel, per queue...)."""
        return compute_stats(self.timeline())

    def summary(self) -> str:
        """Tables for the terminal: per kernel, per queue, host phases, overlap, critical path."""
        return format_summary(compute_stats(self.timeline()))

    def export(self, path: str | PathLike[str]) -> Path:
        """Write the profile to `path`, chosen by suffix: .json / .json.gz (Chrome trace) or .html.

        Returns the path written. Any other suffix raises ValueError naming the ones that work.
        """
        target = Path(path)
        name = target.name.lower()
        if name.endswith(".json") or name.endswith(".json.gz"):
            write_chrome_file(self.timeline(), target)
        elif name.endswith(".html") or name.endswith(".htm"):
            write_html_file(self.timeline(), target)
        else:
            raise ValueError(
                f"cannot export a profile to {str(path)!r}: unknown suffix; use .json or .json.gz "
                "(Chrome trace, opens in Perfetto or chrome://tracing) or .html (timeline page)"
            )
        return target

    def __repr__(self) -> str:
        state = "active" if self.active else ("done" if self._entered else "new")
        return (
            f"<Profile {state}: {len(self.spans)} spans, {len(self.host_spans)} host spans, "
            f"{len(self.memory)} memory samples>"
        )
