"""Pausing the cyclic garbage collector while atensor's threads work, and what it finds when it resumes.

Why: CPython's cyclic collector stops every thread, the event loop's included, for a time that grows
with the number of tracked objects it traverses. The dispatcher and the queue workers therefore pause
automatic collection while they plan or run work; a realize's own objects (tasks, commands) are
freed by reference counting (the graph is acyclic), so nothing accumulates that only the collector
could free (tests/engine/test_step_garbage.py holds a repeated eager training step to that).

What the pause leaves behind: everything allocated meanwhile that is still alive sits in the young
generation, and the first automatic collection after the pause traverses all of it. A realize of
3000 outputs leaves about 200,000 such objects (its outputs' nodes, buffers and views, about 100,000,
and the schedule cache's template of the graph, about 100,000: measured with gc.get_objects(0)); one
collection of them took 160-540 ms on these shared 2-core machines, on any thread and so on the event
loop too (bench/loop_lag.py, tests/engine/test_async.py). They are long-lived data, not garbage: so when
the collector resumes with at least FREEZE_AT young objects (a few thousand: a collection of that many
costs about a millisecond), they are moved to the permanent generation (`gc.freeze()`, constant time),
as servers do with their startup state. Frozen objects are still freed by reference counting; only a
reference cycle among them (garbage that other code made while atensor worked) waits, until
`release_frozen()` (gc.unfreeze() and one full collection: a stall the application schedules, say
between epochs or when idle). atensor never unfreezes on its own: an
automatic reset would put one full collection of the whole heap at an arbitrary moment, the stall this
module exists to avoid, and deciding when needs `gc.get_freeze_count()`, which walks the whole frozen
list (8 ms per 400,000 objects here) with the GIL held.

The pause is counted, since several threads enter and leave it independently, and it only ever
restores the collector if it was on when the first pause began (an application that turned it off
keeps it off).
"""
from __future__ import annotations

import gc
import threading

# young objects at a resume from which they are frozen instead of left to the next collection. A
# collection costs 0.2-1 us per young object that a realize left (nodes, tuples, lists of thousands of
# entries), measured after realizing chains of 300-3000 kernels: 5,000-7,000 young objects 0.9-1.0 ms,
# 10,000-14,000 2-15 ms, 25,000 9-22 ms (CPU, 2-core Zen 5, loaded). At the earlier 50,000, the
# collection after a 3000-kernel chain (14,000-25,000 young) took 16-70 ms on a queue worker, one stall
# of the event loop that long (bench/loop_lag.py); at 5,000 it stays near the loop's 5 ms budget. A
# repeated eager training step leaves far fewer: none of 300 steps of bench/train_step.py's froze.
FREEZE_AT = 5_000

_lock = threading.Lock()
_depth = 0
_was_enabled = False
stats = {"freezes": 0}


class gc_paused:
    """`with gc_paused():` automatic cyclic collection is off inside (for every thread); reentrant across
    threads. (A class, not a contextlib generator: entering and leaving cost two Python calls instead
    of five, on every plan and every command list a queue runs.)"""
    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _was_enabled
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                if _was_enabled:
                    gc.disable()
            _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                _settle_young()
                gc.enable()


def _settle_young() -> None:
    """Freezes the young generation when the pause left a large one (see the module docstring); called
    under `_lock` by the thread that ends the last pause, before the collector is on again."""
    if gc.get_count()[0] >= FREEZE_AT:
        gc.freeze()
        stats["freezes"] += 1


def release_frozen() -> int:
    """Gives every frozen object back to the collector and runs one full collection (a stall of the
    whole process for as long as it takes: call it at a quiet moment); returns what it collected. For
    applications that make reference cycles while atensor works (see the module docstring)."""
    gc.unfreeze()
    return gc.collect()
