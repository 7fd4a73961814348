"""`Runner`: what a queue runs for one command, as a typed record.

Why a record and not a closure: the plan (engine/plan.py) and the queue (hcq/queue.py) need to know
more about a command than "call it": whether it is one foreign call that a native program can hold
(`native`), where the buffer addresses sit in its argument block (`args`, so a replay rewrites them
in place), how many BLAS threads it uses, what must stay alive while it may run, whether it gives
the GIL back for its whole run (`gil_free`), what a doorbell posts to start it without the GIL
(`ring_args`), how to refresh the Variable values its block holds (`rebind`), where a device
command's arguments sit (`device_args`, rewritten in place as a native block is), and how to start it
on the submitting thread (`here`), which timed choice sets its BLAS threads (`choice`), and how to
put it on a device's own queue (`enqueue`, OpenCL; `launch`, the same through the compiled core). These were
attributes set on closures in many places and read back with getattr; here each is a named field
with a default, set where the runner is made (engine/lower.py, backend/c/programs.py).

Invariant: while a command holding a runner may still run, the memory its `native` block points
into is kept alive by `keep_alive` (or by whoever rewrote the block, engine/patching.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(eq=False, slots=True)
class Runner:
    """One command's work. `fn()` runs it; the other fields describe it (see the module docstring).

    >>> calls = []
    >>> run = Runner(lambda: calls.append(1))
    >>> run.fn(); calls, run.native is None, run.threads, run.gil_free
    ([1], True, 1, False)
    """
    fn: Callable[[], None]
    # (C function address, ctypes argument block) of a runner that is one foreign call
    native: Optional[tuple[int, Any]] = None
    # per slot k of the native block: (buffer spec, byte offset) whose address + offset sits there
    args: tuple[tuple[Any, int], ...] = ()
    threads: int = 1              # BLAS threads it sets before running
    keep_alive: Any = ()          # what must outlive every command that holds this runner
    gil_free: bool = False        # one foreign call for its whole run: the queue need not yield after it
    ring_args: Optional[tuple] = None  # what a doorbell posts to run it in C (a native program's)
    # copies the current values of its work's bound Variables into its `native` block (a jit replay
    # rebinds them in place); the plan calls it before each submission, while no command runs the block
    rebind: Optional[Callable[[], None]] = None
    # `here(submit, alone)` starts the work on the calling thread and waits for it a bounded time:
    # True when it is done there (not submitted; only when `alone`, the command is this runner's
    # work only), False once it has called `submit` (which hands the command to its queue) because
    # it is still in flight, is long, or is not alone: `fn` (or the `native` entry) then takes it
    # over and finishes it (a net command, dist/native_net.py; the plan calls it for a replay of that
    # one task through Queue.start_here, or for the first task of a replayed program, engine/plan.py)
    here: Optional[Callable[[Callable[[], None], bool], bool]] = None
    # the blas.MeasuredThreads of a kernel whose BLAS thread count is chosen by timing its runs: a
    # native program that holds it sets the count per run and reports the run's time (programs.Program)
    choice: Any = None
    # a command of a device queue (OpenCL, hcq/cl_queue.py): `enqueue(queue, wait_events)` puts its work
    # on the device queue after `wait_events` without waiting, and returns (its first event, its last
    # event): the first's start and the last's end are its stamps, the last's completion its value
    enqueue: Optional[Callable[[Any, list], tuple[Any, Any]]] = None
    # for a device command with a part run by the host (engine/lower_cl.py's host kernels): given the
    # last event `enqueue` returned, the error that part raised, once the event completed (else None)
    failed: Optional[Callable[[Any], Optional[BaseException]]] = None
    # what names a device command's work across the runners made for it (a jit replay remakes a runner
    # for new buffers): its queue keeps the device time of the work's last run under it, to tell short
    # commands, which an awaiting host waits for on its own thread (hcq/cl_queue.py)
    device_key: Any = None
    # a device command's argument list (OpenCL: its buffers' memories first, `args` naming whose
    # sits at each place, then what else it passes): its `enqueue` reads it at each enqueue, so a
    # replay points it at new buffers by storing into it (engine/patching.py), as into a native block
    device_args: Optional[list] = None
    # a device command's launch through the compiled core (OpenCL, engine/lower_cl.py): `launch(queue
    # handle)` enqueues its work like `enqueue` with no wait list and returns its (first, last) events'
    # handles, which the caller owns (hcq/cl_queue.py `run_here` waits for them in C and releases them)
    launch: Optional[Callable[[int], tuple[int, int]]] = None


__all__ = ["Runner"]
