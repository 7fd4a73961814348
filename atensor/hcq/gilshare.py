"""Sharing the GIL with the event loop's thread: a short switch interval while atensor's threads plan.

Why: the dispatcher thread (engine/dispatch.py) plans a big realize in pure Python for hundreds of
milliseconds (3,000 outputs: 0.1-0.3 s on the 2-core machines). The event loop's thread, woken by its
timer or by I/O meanwhile, needs the GIL to run even one callback, and CPython hands the GIL over to a
waiting thread only after the switch interval (`sys.getswitchinterval()`, 5 ms by default): every
wake-up of the loop waited up to 5 ms, and longer when the holder was preempted by the OS before it saw
the request. Measured with bench/loop_lag.py's tiny workloads and an outside sampler of the loop
thread's state (/proc/<pid>/task/<tid>/syscall): the loop's longest gaps (20-50 ms) were spent asleep
in a futex, waiting for the GIL, while the dispatcher planned; with the interval at 0.5 ms while it
plans, the futex time in those gaps fell to under a millisecond.

The design: `with gil_shared():` makes the interval at most the `loop_switch_us` setting (process-wide,
as the interval is: `config.process_settings()`, whatever `Context` the caller is in) while any thread
is inside (counted: several threads enter and leave independently), and gives back the interval it
found when the last one leaves. A waiting thread then gets the GIL within that time; a thread that
nobody waits for is never interrupted (CPython only forces a switch when a thread asks), so the cost
is paid only under contention: one hand-over (a few microseconds) per interval.

Alternatives rejected:
- yielding (`time.sleep(0)`) every 0.5 ms inside the planning, as the queue workers do between
  commands (hcq/queue.py): the planning is one call through sched/ and engine/ code, with no loop of
  its own to put the yield in; and a `sleep(0)` costs ~55 us whether or not anyone waits.
- a lower interval for the whole process, always: the loop's own long stretches (building a graph)
  and every other thread of the application would switch that often too, for nothing while atensor
  is idle.
- lowering the worker threads' OS priority (`worker_nice`): a preempted thread that holds the GIL
  keeps the loop waiting longer (priority inversion). Measured with this module in place, 4 alternating
  runs at load 7.5: ATENSOR_WORKER_NICE=10 against 0, median worst gap of the chain 39 against 24 ms
  (asyncio), 28 against 25 (trio); of the 3,000 outputs 22 against 25 and 18 against 18.

The interval is process-wide. Only a value smaller than the one in force is set, and the one found is
restored only if nobody changed it meanwhile: an application that sets its own interval keeps it.
`loop_switch_us = 0` leaves the interpreter's interval alone.

The pump: a short interval helps only while the thread holding the GIL runs. On a loaded machine the
planning thread is preempted by other processes while it holds the GIL (it always does while it runs
Python), and the loop's thread then waits for the GIL for the whole preemption: traced with `perf sched`
(sched_switch/wakeup and the loop thread's futex calls) during bench/loop_lag.py --tiny 3000 at load
2-4, 8-9 ms of a 12-16 ms gap were that wait. So while any thread is inside, a pump thread takes the GIL
every `loop_pump_us` (a process setting): the planner hands it over and blocks until the pump has had
it, so it gives up its core at those points, without the GIL, and rarely runs out its scheduler slice
while holding it; the loop's thread, woken meanwhile, finds the GIL free. Measured (longest gap of a 1 ms ticker, median of 14
alternating rounds in one process, load 3.9-4.6, Zen 5, 2 cores): 3,000 outputs 22.1 -> 15.9 ms (trio),
16.4 -> 16.7 (asyncio); a chain of 3,000 kernels 11.1 -> 5.5 (trio), 10.9 -> 7.7 (asyncio). Its cost: a
hand-over (tens of microseconds) per turn of planning, on an idle machine too: on a quiet one (load ~0.9,
same machine) the loop's longest gap was no better (3,000 outputs 9-10.5 against 11.6-12.1 ms trio,
12.8-14.7 against 10.3-12.8 asyncio; the chain 5.1-6.4 against 4.7-9.7 trio, 3 alternating runs of
bench/loop_lag.py --tiny 3000 --explain each), and the loop's typical tick waited longer for the GIL
(tests/engine/test_loop_gil.py's 75th percentile 1.3-2.5 ms against 0.3-0.6; 2 of 6 runs over its
2.5 ms bound). So the pump is off by default (`loop_pump_us = 0`); 300 us is the period measured above,
for an application that runs on a loaded machine.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional

from atensor.config import process_settings


_lock = threading.Lock()
_depth = 0
_pumping = threading.Event()  # set while a thread is inside and the interval was lowered
_pump_thread: Optional[threading.Thread] = None
_pumps = 0  # the pump's turns with the GIL so far (statistics)
_pump_every = 0.0  # the pump's period (s), `loop_pump_us` read by the first thread in
_found = 0.0                 # the interval in force when the first thread entered
_set: Optional[float] = None  # the interval set then (None: none was), as the interpreter reports it


class gil_shared:
    """`with gil_shared():` the interpreter's switch interval is at most the process-wide setting
    `loop_switch_us` inside, for every thread (the event loop's included): a thread waiting for the
    GIL gets it within that time. Reentrant across threads; restores the interval it found when the
    last thread leaves.

        with gil_shared():
            plan_a_big_graph()   # the loop's thread still runs every ~0.5 ms
    """
    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _found, _set
        with _lock:
            if _depth == 0:
                _set = None
                limit = process_settings().loop_switch_us * 1e-6
                found = sys.getswitchinterval()
                if 0 < limit < found:
                    _found = found
                    sys.setswitchinterval(limit)
                    _set = sys.getswitchinterval()  # (rounded by the interpreter to whole microseconds)
                every = process_settings().loop_pump_us * 1e-6
                if 0 < limit and every > 0:
                    _start_pump(every)
            _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth, _set
        with _lock:
            _depth -= 1
            if _depth == 0:
                _pumping.clear()
            if _depth == 0 and _set is not None:
                if sys.getswitchinterval() == _set:  # else the application set its own meanwhile: kept
                    sys.setswitchinterval(_found)
                _set = None


def _start_pump(every: float) -> None:
    """Sets the pump going, a turn every `every` s (see the module docstring); called under `_lock` by the
    first thread in."""
    global _pump_thread, _pump_every
    _pump_every = every
    _pumping.set()
    if _pump_thread is None:
        _pump_thread = threading.Thread(target=_pump, name="atensor-gil-pump", daemon=True)
        _pump_thread.start()


def _pump() -> None:
    """The pump thread: while `_pumping` is set, wakes every `loop_pump_us`; each wake takes the GIL (the
    thread holding it hands it over), and the sleep gives it back."""
    global _pumps
    while True:
        _pumping.wait()
        while _pumping.is_set():
            time.sleep(_pump_every)
            _pumps += 1


def statistics() -> dict:
    """How many threads are inside `gil_shared`, the interval in force, and the pump's turns with the GIL
    so far, for debugging."""
    with _lock:
        return {"threads_inside": _depth, "switch_interval_s": sys.getswitchinterval(),
                "lowered": _set is not None, "pumping": _pumping.is_set(), "pump_turns": _pumps}


__all__ = ["gil_shared", "statistics"]
