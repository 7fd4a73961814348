# atensor.profiler: which queue ran what, when, and what it waited for.
#
# The core (hcq/) stamps every command on its queue's timeline signal; while a profile is active
# it turns each stamp into a Span (events.py) and hands it to the collector (collector.py).
# Everything else here reads those events after the fact: timeline.py maps them onto one clock,
# chrome.py writes Perfetto/Chrome JSON, html.py a self-contained timeline page, summary.py the
# tables, cli.py `python -m atensor.profiler trace.json`. loop.py's `ticking()` measures how long the
# event loop itself was held (the longest gap of a 1 ms ticker).
#
# This package imports nothing from the rest of atensor (docs/design.md: profiler knows nothing of
# tensors), so it can be tested, and used on saved traces, on its own.
#
#     with atensor.profile() as prof:        # or `async with`
#         await step()
#     prof.export("trace.json")              # Perfetto / chrome://tracing
#     prof.export("timeline.html")           # opens offline in any browser
#     print(prof.summary())
from __future__ import annotations

from .collector import (
    Profile,
    host_span,
    is_active,
    profile,
    record_host,
    record_memory,
    record_span,
    set_clock_offset,
)
from .loop import LoopLag, ticking
from .events import HOST_CATEGORIES, SPAN_KINDS, HostSpan, MemoryEvent, Span
from .summary import CriticalPath, CriticalStep, HostStats, KernelStats, ProfileStats, QueueStats

__all__ = [
    "HOST_CATEGORIES",
    "SPAN_KINDS",
    "CriticalPath",
    "CriticalStep",
    "HostSpan",
    "HostStats",
    "KernelStats",
    "LoopLag",
    "MemoryEvent",
    "Profile",
    "ProfileStats",
    "QueueStats",
    "Span",
    "host_span",
    "is_active",
    "profile",
    "record_host",
    "record_memory",
    "record_span",
    "set_clock_offset",
    "ticking",
]
