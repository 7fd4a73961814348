"""How many BLAS threads a kernel's matrix products use: all its share of the cores for a big
kernel, one for a small one.

Why per kernel: OpenBLAS runs a product on all its threads once it is above a tiny size, and its
threads spin while they wait for work. On a machine whose cores are also wanted by the event loop,
the dispatcher, the other queues or other processes, a product of a few MFLOP split over two threads
waits for a core and is many times slower than on one (measured: the flagship's training step, whose
products are 8 MFLOP, took 2.6 ms with one BLAS thread and 30 to 60 ms with two on a loaded 2-core
machine). A product of hundreds of MFLOP gains from the threads. So each kernel sets the thread count
before it runs: `settings.blas_threads` (default: the cores divided among the CPU devices in use)
when its estimated flops reach `settings.blas_parallel_flops`, else one.

Flops alone do not decide it, though: whether a second thread pays depends on whether a core is free
for it, which changes with the load. Measured on this 2-core machine with a 16-row LLM decode step: its
906 MFLOP output product took 11 ms on two threads and 20 ms on one while the machine was idle, and
two threads made the whole step 314 ms against 204 ms on one while another process kept both cores
busy. So, unless `ATENSOR_BLAS_THREADS` fixes the count, a kernel big enough for threads times its
own runs (`MeasuredThreads`): it tries both counts, runs with the faster, and now and then tries the
other again, so a change of load moves it back.

In a jit replay's native program the C runner sets a kernel's count for its run only and times the
run (programs.Program, measured on the same decode steps, SmolLM2 on 2 cores, idle): with the
threshold at 1 Mi flops, so that decode's matrix products are timed with both counts, a 16-row step
took 96-107 ms against 127-131 ms at 64 Mi, and a one-row step 28-29 ms against 32-35 ms. Before,
a kernel of more threads could not be in a program: it ran as a command of its own, whose Python
needs the GIL between kernels (two threads on every product then made the 16-row step slower, not
faster, ~120 ms). The training step's products (8 MFLOP) are measured too: on a loaded machine their
runs choose one thread after the first few.

The count is OpenBLAS's process-wide setting. Two queues of different devices never disagree about
it: with more than one CPU device each device's share is one thread unless `ATENSOR_BLAS_THREADS`
says otherwise.
"""
from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable, Hashable, Optional

from atensor.config import settings

_set_threads: Optional[Callable[[int], Any]] = None
_current = 0
_share = 1
_ready = False


def _bind() -> None:
    """Finds `openblas_set_num_threads` of every BLAS library loaded, through threadpoolctl (once).

    Every one, not the first: a process can hold two OpenBLAS builds (numpy's and scipy's, loaded
    when scikit-learn is imported), and threadpoolctl lists them in no fixed order. Setting only the
    first left numpy's at its default thread count in about half of the runs of examples/train.py
    --model cnn: its spinning second thread made every product ~10x slower in CPU time."""
    global _set_threads, _ready
    _ready = True
    try:
        from threadpoolctl import ThreadpoolController
        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS it knows: leave BLAS as it is
        return
    setters = []
    for lib in controllers:
        getter = getattr(lib, "_get_symbol", None)
        symbol = getter("openblas_set_num_threads") if getter is not None else None
        if symbol is not None:
            setters.append(symbol)
        elif hasattr(lib, "set_num_threads"):  # another BLAS: its own per-call API
            setters.append(lib.set_num_threads)
    if setters:
        def set_all(threads: int) -> None:
            for setter in setters:
                setter(threads)
        _set_threads = set_all


def set_share(cpu_devices: int) -> None:
    """Called when a CPU device is created: each device's share of the cores."""
    global _share
    _share = max(1, (os.cpu_count() or 1) // max(1, cpu_devices))
    use(1)


def threads_for(flops: int) -> int:
    """The BLAS threads a kernel of `flops` (estimated) runs with."""
    return (settings.blas_threads or _share) if flops >= settings.blas_parallel_flops else 1


def packed_threads() -> int:
    """The threads a packed-weight matmul kernel (QMATMUL) runs with: the device's whole share, whatever
    its size and without timing. Its C splits the weight rows itself by a rule of the work size (no
    thread under 64 rows, backend/quant/pool_c.py) into chunks that the threads claim in turn, so a
    thread whose core is taken costs the kernel nothing but its share of the chunks. Timing the first
    runs instead (`MeasuredThreads`) chose one thread or two by whatever the load was in those runs:
    SmolLM2's decode measured 26.4 tok/s in one run and 48.3 in the next on the same quiet machine."""
    return settings.blas_threads or _share


def use(threads: int) -> None:
    """Sets the BLAS thread count, unless it already is `threads` (a no-op call costs ~0.1 us)."""
    global _current
    if threads == _current:
        return
    if not _ready:
        _bind()
    if _set_threads is not None:
        _set_threads(threads)
    _current = threads


def forget() -> None:
    """The count was set behind `use`'s back (a native program sets its runs' own in C): the next
    `use` sets it whatever it was."""
    global _current
    _current = 0


def measured() -> bool:
    """Whether kernels big enough for threads choose their count by timing (`MeasuredThreads`): yes
    unless `ATENSOR_BLAS_THREADS` (settings.blas_threads) fixes the count."""
    return settings.blas_threads is None


class MeasuredThreads:
    """One kernel's choice between one BLAS thread and `many`, by the time its runs take.

        choice = MeasuredThreads(2)
        threads = choice.pick(); start = now(); run(threads); choice.record(threads, now() - start)

    The first PROBES runs alternate the counts; then it runs with the count whose recent runs took
    less (the median of each count's last SAMPLES runs), and every `interval` runs tries the other
    once: `interval` starts at MIN_INTERVAL and doubles up to MAX_INTERVAL while the tries confirm the
    choice, so a count that loses costs at most one run in MIN_INTERVAL while the load changes and
    one in MAX_INTERVAL once it is settled. Not locked: a kernel's runs are on its queue's one thread
    (two runs racing would only blur the timings, never pick a count outside {1, many})."""

    PROBES, SAMPLES, MIN_INTERVAL, MAX_INTERVAL = 4, 3, 8, 128
    __slots__ = ("many", "times", "runs", "choice", "interval", "next_try")

    def __init__(self, many: int):
        self.many = many
        self.times: dict[int, deque] = {1: deque(maxlen=self.SAMPLES), many: deque(maxlen=self.SAMPLES)}
        self.runs = 0
        self.choice = many
        self.interval = self.MIN_INTERVAL
        self.next_try = self.PROBES + self.MIN_INTERVAL

    def other(self) -> int:
        """The count not chosen now."""
        return 1 if self.choice != 1 else self.many

    def pick(self) -> int:
        """The thread count of the next run."""
        if self.runs < self.PROBES:
            return self.many if self.runs % 2 == 0 else 1
        return self.other() if self.runs >= self.next_try else self.choice

    def record(self, threads: int, ns: int) -> None:
        """Counts a run of `threads` threads that took `ns` nanoseconds, and chooses again."""
        tried = self.runs >= self.PROBES and threads != self.choice
        self.runs += 1
        self.times[threads].append(ns)
        if self.runs < self.PROBES:
            return
        best = min(self.times, key=lambda t: _median(self.times[t]))
        if tried:  # the other count's try: it lost (try it less often) or it takes over
            self.interval = self.MIN_INTERVAL if best != self.choice else min(2 * self.interval, self.MAX_INTERVAL)
            self.next_try = self.runs + self.interval
        self.choice = best


def _median(samples: deque) -> float:
    if not samples:
        return float("inf")
    ordered = sorted(samples)
    return ordered[len(ordered) // 2]


_choices: dict[Hashable, MeasuredThreads] = {}


def choice_for(key: Hashable, many: int) -> MeasuredThreads:
    """The measured choice of the kernel `key` (its AST: every runner of one kernel shares it)."""
    choice = _choices.get(key)
    if choice is None or choice.many != many:
        choice = _choices[key] = MeasuredThreads(many)
    return choice
