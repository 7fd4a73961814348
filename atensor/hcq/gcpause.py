"""Pausing the cyclic garbage collector while atensor's threads work.

Why: CPython's cyclic collector stops every thread, the event loop's included, for a time that grows
with the number of live container objects. A large realize keeps a few hundred thousand of them alive
(nodes, tasks, commands), and a full collection triggered by any allocation in any thread then stalls
the event loop for 100-250 ms (measured with bench/loop_lag.py: gaps of that size vanish with the
collector off). So the dispatcher and the queue workers pause automatic collection while they plan or
run work. A realize's objects are freed by reference counting (the graph is acyclic), so nothing
accumulates; the collector resumes when the last of atensor's threads goes idle.

The pause is counted, since several threads enter and leave it independently, and it only ever
restores the collector if it was on when the first pause began (an application that turned it off
keeps it off).
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Automatic cyclic collection is off inside (for every thread); reentrant across threads."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            if _was_enabled:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
