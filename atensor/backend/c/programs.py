"""Native programs: a queue's run of C kernels as one foreign call, and the C timelines between queues.

Why apart from the registry (backend/c/registry.py): a program is how compiled kernels are run, not how
they are made. The program runner (`atensor_run_program`), the C copy and the doorbell's ring
(hcq/doorbell.py) are functions of the prelude (backend/c/prelude.py), so of every kernel library: the
registry hands the first library it loads to `RUNTIME.bind`, and from then on `Program.bind` gives one
foreign call per submission. Queues hand work to each other through the C timelines (`TIMELINES`)
without the GIL or a Python wake-up, as GPU queues do through semaphores in memory.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from atensor.backend.gemm import blas, openblas
from atensor.backend.runner import Runner

RUN, WAIT, PUBLISH = 0, 1, 2
TIMELINE_SLOTS = 4096


@dataclass
class Timelines:
    """The C side of the queues' timelines, for waits between native programs (16 bytes per queue:
    value, futex word, sleepers); a queue gets a slot the first time a program of it waits or publishes.

    Lock: `lock`, held to hand out a slot (a read of a given slot takes none). Lifetime: the process;
    slots are never given back (a queue's slot stays its own), so at most TIMELINE_SLOTS queues wait."""
    values: ctypes.Array = field(default_factory=lambda: (ctypes.c_uint64 * (2 * TIMELINE_SLOTS))())
    slots: dict[object, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def slot(self, owner: object) -> Optional[int]:
        """The C timeline slot of `owner` (a queue), None when all are taken (no more programs with waits)."""
        slot = self.slots.get(owner)
        if slot is None:
            with self.lock:
                slot = self.slots.get(owner)
                if slot is None:
                    if len(self.slots) >= TIMELINE_SLOTS:
                        return None
                    slot = self.slots[owner] = len(self.slots)
        return slot


TIMELINES = Timelines()


class DoorbellFunctions(NamedTuple):
    """The doorbell functions of the loaded library (hcq/doorbell.py), Linux only."""
    size: int
    post: ctypes._CFuncPtr
    next: ctypes._CFuncPtr
    done: ctypes._CFuncPtr


@dataclass
class Runtime:
    """The prelude's functions from the first kernel library loaded: the program runner, the C copy and
    the doorbell. None of them before a library is loaded (programs then run their runners one by one).

    Lock: none of its own; `bind` is called by the registry under its lock, once. Lifetime: the process
    (the library stays loaded, backend/c/library.py)."""
    runner: Optional[ctypes._CFuncPtr] = None
    copy: Optional[ctypes._CFuncPtr] = None
    doorbell: Optional[DoorbellFunctions] = None

    def bind(self, lib: ctypes.CDLL) -> None:
        """Takes the prelude's functions from `lib` (a kernel library), unless bound already."""
        if self.runner is not None:
            return
        copy = lib.atensor_copy
        copy.argtypes, copy.restype = [ctypes.c_void_p], None
        self.copy = copy
        runner = lib.atensor_run_program
        runner.argtypes = [ctypes.c_longlong] + [ctypes.c_void_p] * 5
        runner.restype = None
        self.doorbell = _doorbell(lib)
        self.runner = runner


RUNTIME = Runtime()


def _doorbell(lib: ctypes.CDLL) -> Optional[DoorbellFunctions]:
    if not sys.platform.startswith("linux"):  # elsewhere an idle worker would spin in sched_yield
        return None
    size = lib.atensor_ring_size
    size.argtypes, size.restype = [], ctypes.c_longlong
    # `post` is called keeping the GIL (a PYFUNCTYPE, as a PyDLL function is): it never blocks (a
    # store, a counter and at most one futex wake), so releasing the GIL buys nothing and lets the
    # worker it wakes take the GIL first when its program is shorter than the wake syscall. Measured
    # with bench/jit_replay.py on a loaded machine: no difference in alternating rounds beyond the
    # noise (the post's time under load is the futex wake itself, with either binding)
    post_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, *[ctypes.c_void_p] * 5)
    post = post_type(ctypes.cast(lib.atensor_ring_post, ctypes.c_void_p).value)
    take = lib.atensor_ring_next
    take.argtypes, take.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    # an atomic load: called keeping the GIL too
    done_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong)
    done = done_type(ctypes.cast(lib.atensor_ring_done, ctypes.c_void_p).value)
    return DoorbellFunctions(size(), post, take, done)


def timeline_slot(owner: object) -> Optional[int]:
    """The C timeline slot of `owner` (a queue), None when all are taken (no more programs with waits)."""
    return TIMELINES.slot(owner)


def program_threads() -> bool:
    """Whether a native program can run a kernel on more BLAS threads (the BLAS's thread setter was
    found): else a program holds one-thread kernels only."""
    found = openblas.BINDING.found  # bound when the first kernel library was compiled
    return found is not None and bool(found.set_threads)


def programs_available() -> bool:
    """Whether a library with the program runner is loaded (a native runner implies one is)."""
    return RUNTIME.runner is not None


def program_runner_address() -> int:
    """The address of the loaded `atensor_run_program` (backend/c/prelude.py); 0 before any library is loaded."""
    runner = RUNTIME.runner
    return 0 if runner is None else ctypes.cast(runner, ctypes.c_void_p).value


class Program:
    """A queue's run of native work as one foreign call: a list of ops, each running a native runner
    (a `Runner` with a `native` of (function address, argument block)), waiting until a C
    timeline reaches a value, or publishing one. The values are `bases[queue] + offset`, with the bases
    given per submission (`bind`), so one Program serves every replay of a plan. A CUDA graph's launch
    of many kernels at once is the same idea."""

    def __init__(self, ops: list[tuple[int, int, int, int]], runs: list):
        """`ops`: (kind, timeline slot, queue, offset) each; `runs[i]` is the runner of a RUN op. A RUN
        op's second field is the BLAS threads of its kernel (`Runner.threads`, or its measured choice:
        `retune`), which the C runner sets for that run only; a measured run's third field is 1, and
        the C runner writes the run's nanoseconds into its fourth."""
        count = len(ops)
        self.count = count
        self.ops = (ctypes.c_int64 * (4 * count))(*[x for op in ops for x in op])
        # (op index, blas.MeasuredThreads) of the runs whose thread count is chosen by their timings
        self.measured = [(i, r.choice) for i, r in enumerate(runs)
                         if r is not None and ops[i][0] == RUN and r.choice is not None]
        for i, r in enumerate(runs):
            if r is not None and ops[i][0] == RUN and r.threads != 1:
                self.ops[4 * i + 1] = r.threads
        for i, _ in self.measured:
            self.ops[4 * i + 2] = 1  # the C runner times it
        self.retune()
        self.fns = (ctypes.c_void_p * count)(*[r.native[0] if r is not None else None for r in runs])
        self.blocks = (ctypes.c_void_p * count)(*[ctypes.addressof(r.native[1]) if r is not None else None
                                                  for r in runs])
        self.runs = [r for r in runs if r is not None]  # their blocks and buffers stay alive with this

    def retune(self) -> None:
        """Before a submission: each measured run's last time (written by the C runner) goes to its
        choice, and the choice's next count into the op. A submission racing a run of the same program
        only blurs a timing or changes a later op's count between 1 and `many` (as MeasuredThreads
        allows)."""
        ops = self.ops
        blas.forget()  # the program sets the count in C (one, or a run op's own)
        for i, choice in self.measured:
            ns = ops[4 * i + 3]
            if ns:
                choice.record(ops[4 * i + 1], ns)
                ops[4 * i + 3] = 0
            ops[4 * i + 1] = choice.pick()

    def bind(self, bases: Optional[ctypes.Array] = None) -> Runner:
        """What a queue runs: the program with this submission's `bases` (c_uint64 per queue)."""
        call, count, ops, fns, blocks = RUNTIME.runner, self.count, self.ops, self.fns, self.blocks
        if call is None:  # no library loaded yet: only a program of RUN ops can run, one runner at a time
            fns_each = [run.fn for run in self.runs]

            def run_each() -> None:
                for fn in fns_each:
                    fn()
            return Runner(run_each, keep_alive=self)
        timelines = TIMELINES.values
        one_thread = blas.use

        def run_program() -> None:
            one_thread(1)  # its kernels do not set the count; the C runner sets a run op's own (above)
            call(count, ops, fns, blocks, bases, timelines)
        # one foreign call: the queue need not yield the GIL after it; a doorbell posts `ring_args`
        return Runner(run_program, keep_alive=(self, bases), gil_free=True,
                      ring_args=(count, ops, fns, blocks, bases, timelines))


def batch(runs: list[Runner]) -> Runner:
    """One callable that runs the native runners `runs` in order, in one foreign call: the queue's
    Python overhead and GIL hand-off once for all of them."""
    return Program([(RUN, 0, 0, 0)] * len(runs), runs).bind()


def native_copy(dst: int, src: int, nbytes: int) -> Optional[Runner]:
    """A runner that copies `nbytes` from address `src` to `dst` in C (so a program can hold it), or
    None before any library is loaded. Its block holds (dst, src, nbytes): slots 0 and 1 are addresses."""
    fn = RUNTIME.copy
    if fn is None:
        return None
    block = (ctypes.c_void_p * 3)(dst, src, nbytes)

    def run_copy() -> None:
        fn(block)
    return Runner(run_copy, native=(ctypes.cast(fn, ctypes.c_void_p).value, block))
