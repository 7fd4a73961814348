# The event loop's own time: which trio task's code ran on the loop thread, and when.
#
# atensor records its own host work (scheduling, compiling, awaiting, gc...), but a step of a
# training loop also runs the application's Python between awaits: building the next graph,
# stepping a learning-rate schedule, reading a loss. Without a span for that time, a trace shows
# unexplained gaps on the host, and "every millisecond is accounted for" cannot hold. trio gives
# the hook for it: an Instrument sees `before_task_step` / `after_task_step` around every run of
# a task's code on the loop thread. While a profile is active inside a running trio loop, each
# task step of at least MIN_STEP_NS becomes a HostSpan "task <name>" (category "task") on the
# "event loop" track. Shorter steps are not recorded: they are the bulk of all steps (a wake-up,
# a check, another await), and their time is within the resolution anyone reads a timeline at.
#
# Alternatives rejected: sys.setprofile (every Python call, 10x slower, and it sees the queue
# workers' threads too); a sampling thread (it needs the GIL to sample, so it disturbs the very
# gaps it measures). asyncio has no public per-step hook, so there this module records nothing.
from __future__ import annotations

import time
from typing import Any

from .events import HostSpan

MIN_STEP_NS = 20_000
TRACK = "event loop"


class TaskSteps:
    """A trio Instrument that records task steps as host spans through `record`."""

    def __init__(self, record: Any) -> None:
        self._record = record
        self._start = 0

    def before_task_step(self, task: Any) -> None:
        self._start = time.perf_counter_ns()

    def after_task_step(self, task: Any) -> None:
        # the step that installed the instrument ends with no start seen: it is not recorded
        end, start, self._start = time.perf_counter_ns(), self._start, 0
        if start and end - start >= MIN_STEP_NS:
            self._record(HostSpan(f"task {task.name}", "task", start, end, TRACK))


def install(record: Any) -> TaskSteps | None:
    """Add a TaskSteps instrument to the running trio loop; None outside one (nothing to watch)."""
    try:
        import trio
        instrument = TaskSteps(record)
        trio.lowlevel.add_instrument(instrument)
    except (ImportError, RuntimeError):
        return None
    return instrument


def uninstall(instrument: TaskSteps | None) -> None:
    """Remove an instrument `install` added (a no-op for None or once its loop has ended)."""
    if instrument is None:
        return
    try:
        import trio
        trio.lowlevel.remove_instrument(instrument)
    except (RuntimeError, KeyError):
        pass
