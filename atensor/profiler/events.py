# The profiler's vocabulary: three immutable records and nothing else.
#
# Why records and not callbacks: the queue workers stamp every command with (start_ns, end_ns) on
# their own timeline signal anyway, so the cheapest thing the core can do while a profile is
# active is to build one small frozen object per command and append it to a list. Everything
# clever (mapping queue clocks onto the host clock, clamping jitter, resolving dependency ids to
# spans, statistics, exports) happens later, off the hot path, in timeline.py and the exporters.
#
# Why frozen dataclasses with slots: they are created from worker threads, shared by every active
# profile without copying, and read by exporters long after; immutability makes that sharing
# safe, and slots keep each record small (a large run records hundreds of thousands of spans).
#
# Times are integer nanoseconds. A Span's times are on its queue's own clock; HostSpan and
# MemoryEvent times are on the host clock (time.perf_counter_ns). The collector keeps the offset
# of each queue's clock against the host clock and adds it when a profile is exported.
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# What a queue can be doing. "wait" is a queue blocked on another queue's signal; it is shown on
# the timeline but is not counted as busy time.
SPAN_KINDS: tuple[str, ...] = ("kernel", "copy", "allreduce", "wait")

# What the host (the event loop's thread, the dispatcher, the compiler thread) can be doing:
# scheduling and planning, compiling kernels, submitting, awaiting results, a job waiting in the
# dispatcher's queue, a cyclic garbage collection, loading or saving weights, a jitted call, a
# trio or asyncio task's own code running on the loop thread (tasks.py), and a data pipeline's work
# (tokenizing, batching, the training loop waiting for a batch: atensor/nn/data.py). The summary's "host"
# table and its coverage line (summary.py) are made of these.
HOST_CATEGORIES: tuple[str, ...] = (
    "schedule", "compile", "submit", "await", "wait", "gc", "load", "call", "task", "data",
)


class Span(NamedTuple):
    """One command that ran on a device queue, stamped by the queue itself.

    `task_id` names the task in the task graph; `deps` are the task ids it waited for, which
    become flow arrows and the edges of the critical path. A NamedTuple, not a dataclass: the
    queues make one per command while profiling, and a tuple costs a tenth of a frozen dataclass.

    Example: ``Span("CPU:0", "compute", 7, "matmul", "kernel", 1_000, 5_000, flops=2 * 64**3, deps=(3,))``
    """

    device: str
    queue: str
    task_id: int
    name: str
    kind: str
    start_ns: int
    end_ns: int
    bytes: int = 0
    flops: int = 0
    deps: tuple[int, ...] = ()

    @property
    def duration_ns(self) -> int:
        """How long the command ran, in ns (never negative)."""
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True, slots=True)
class HostSpan:
    """Host-side work (scheduling, compiling, submitting, awaiting...) on a host track.

    `detail` is free text shown with the span (the kernels a compile built, the file weights
    came from); `track` groups spans by who did the work ("host", "compile (background)", "gc").

    Example: ``HostSpan("compile 3 kernels", "compile", 100, 900, detail="add 4, matmul_sum 4x4x4")``
    """

    name: str
    category: str
    start_ns: int
    end_ns: int
    track: str = "host"
    detail: str = ""

    @property
    def duration_ns(self) -> int:
        """How long the host work took, in ns (never negative)."""
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """The bytes a device had allocated at one moment on the host clock.

    Example: ``MemoryEvent("CPU:0", 1_500, 4 << 20)``
    """

    device: str
    ts_ns: int
    bytes_in_use: int
