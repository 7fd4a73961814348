"""The Executor: lowers a TaskGraph to one command list per queue and submits each list once.

Planning walks the tasks in their topological order. Each task goes to its device's compute queue
(kernels) or copy queue (copies; the destination device's), takes the next value of that queue's
timeline signal, and waits on the signal values of the tasks it depends on when they run on another
queue (on the same queue, in-order execution already orders them). Work still pending from earlier
realizes is found through each buffer's pending writers and readers, snapshotted before this graph
is planned; after planning, the buffers remember this graph's tasks in turn.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from atensor.graph.node import BufferSpec
from atensor.graph.symbolic import evaluate
from atensor.config import settings
from atensor.backend import blas
from atensor.hcq.buffer import Buffer
from atensor.hcq.device import Device, DeviceError
from atensor.backend import native
from atensor.backend.numpy_backend import compile_kernel
from atensor.hcq import net
from atensor.hcq.queue import Command, DependencyFailed, Queue
from atensor.hcq.signal import Signal
from atensor.profiler import collector
from atensor.profiler.events import HostSpan
from atensor.graph.taskgraph import Copy, Kernel, NetAllReduce, Task, TaskGraph


@dataclass
class Submission:
    """What one realize put on the queues: the last value per queue and each task's place."""
    final: dict[Queue, int] = field(default_factory=dict)
    placed: list[tuple[Signal, int, Task]] = field(default_factory=list)

    def waits(self) -> list[tuple[Signal, int]]:
        return [(q.signal, v) for q, v in self.final.items()]

    def first_failure(self) -> Optional[BaseException]:
        """The root-cause error of the graph (a failed task, not one that was skipped because of it)."""
        if not any(queue.signal.has_failures() for queue in self.final):
            return None  # the common case: no value of these queues ever failed
        skipped: Optional[BaseException] = None
        for signal, value, _ in self.placed:
            err = signal.failure(value)
            if err is None:
                continue
            if not isinstance(err, DependencyFailed):
                return err
            skipped = skipped or err
        return skipped


_next_task_id = 0


def wait_for_pending(waits: dict, own: Signal, reading: bool, pending_writes: list,
                     pending_reads: list) -> None:
    """Adds to `waits` (signal -> (value, check)) the work still pending on a buffer that a task on the
    queue of `own` reads (`reading`) or writes: a read waits for pending writes (and fails with them);
    a write also waits for pending reads. Work on the task's own queue is ordered already."""
    for sig, v in pending_writes:
        if sig is not own:
            old = waits.get(sig)
            if old is None or old[0] < v:
                waits[sig] = (v, reading or (old is not None and old[1]))
    if not reading:
        for sig, v in pending_reads:
            if sig is not own:
                old = waits.get(sig)
                if old is None or old[0] < v:
                    waits[sig] = (v, old is not None and old[1])


def take_task_ids(count: int) -> int:
    """The first of `count` new task ids. Ids are unique per process, so a profile never confuses two
    realizes; only the dispatcher thread plans, so no lock."""
    global _next_task_id
    base = _next_task_id
    _next_task_id += count
    return base


def execute(graph: TaskGraph) -> Submission:
    """Plans and submits `graph`; returns what to await. Runs on the dispatcher thread."""
    sub = Submission()
    base_id = take_task_ids(len(graph.tasks))
    lists: dict[Queue, list[Command]] = {}
    placed: list[tuple[Queue, int]] = []
    before: dict[BufferSpec, tuple[list, list]] = {}
    written: set[BufferSpec] = set()
    for task in graph.tasks:
        for acc in task.accesses:
            spec = acc.buffer
            if spec not in before:
                buf = Buffer.of(spec)
                before[spec] = (buf.pending_writes(), buf.pending_reads())
            if acc.mode == "r" and spec not in written and Buffer.of(spec).failure is not None:
                failure = Buffer.of(spec).failure
                raise RuntimeError(f"{task.name} reads {spec}, whose contents come from a task that "
                                   f"failed: {failure}") from failure
        written.update(a.buffer for a in task.accesses if a.mode == "w")
    queues: dict[tuple[str, str], Queue] = {}
    compile_ns = 0
    for task in graph.tasks:
        where = (task.device, task.queue)
        queue = queues.get(where)
        if queue is None:
            queue = queues[where] = Device.get(task.device).queue(task.queue)
        own = queue.signal
        value = queue.reserve()
        waits: dict[Signal, tuple[int, bool]] = {}
        for dep in task.deps:
            dq, dv = placed[dep]
            if dq.signal is not own:
                old = waits.get(dq.signal)
                if old is None or old[0] < dv:
                    waits[dq.signal] = (dv, True)
        for acc in task.accesses:
            wait_for_pending(waits, own, acc.mode == "r", *before[acc.buffer])
        t0 = time.perf_counter_ns()
        run = _runner(task.work)
        compile_ns += time.perf_counter_ns() - t0
        var_vals = getattr(task.work, "var_vals", None)
        nbytes = 0
        for a in task.accesses:
            span = a.end - a.start
            nbytes += span if type(span) is int else evaluate(span, var_vals)
        command = Command(value, tuple([(s, v, c) for s, (v, c) in waits.items()]), run, task.name,
                          task.work.kind, base_id + task.id, nbytes, getattr(task.work, "flops", 0),
                          tuple(sorted(base_id + d for d in task.deps)))
        commands = lists.get(queue)
        if commands is None:
            commands = lists[queue] = []
        commands.append(command)
        placed.append((queue, value))
        sub.placed.append((own, value, task))
        sub.final[queue] = value
    for task in graph.tasks:
        queue, value = placed[task.id]
        for acc in task.accesses:
            Buffer.of(acc.buffer).note(queue.signal, value, acc.mode == "w")
    if compile_ns and collector.is_active():
        now = time.perf_counter_ns()
        collector.record_host(HostSpan("compile kernels", "compile", now - compile_ns, now))
    for queue, commands in lists.items():
        queue.submit(commands)
    return sub


def _runner(work: object) -> Optional[Callable[[], None]]:
    """The callable a queue runs for `work` (a Kernel, a Copy or a NetAllReduce); None on NULL devices."""
    if isinstance(work, Kernel):
        device = Device.get(work.device)
        specs = work.buffers
        # a buffer seen before has its memory already (the common case in replays)
        buffers = [b if (b := spec.runtime) is not None and b.memory is not None else device.allocate(spec)
                   for spec in specs]
        if device.kind == "NULL":
            return None
        threads = blas.threads_for(work.flops)
        use_threads = blas.use
        mode = settings.native
        compiled = None if work.var_vals or mode == "0" else native.lookup(work.ast)
        if compiled is None and mode == "all" and not work.var_vals:
            native.prepare([(work.ast, work.name)])
            compiled = native.lookup(work.ast)
        if compiled is not None:
            call, block = compiled.fn, compiled.pointers([b.address() for b in buffers])

            def run_native() -> None:  # one foreign call: the GIL is released for the whole kernel
                use_threads(threads)
                call(block)

            def rebind(other: Kernel) -> None:
                """The same kernel on `other`'s buffers: the block is rewritten in place (only once
                the commands that use it are done). Every slot is written: patching.py may have
                pointed some elsewhere since `keep_alive` was set."""
                for k, spec in enumerate(other.buffers):
                    b = spec.runtime
                    block[k] = (b if b is not None and b.memory is not None else device.allocate(spec)).address()
                run_native.keep_alive = other.buffers
            run_native.keep_alive = specs  # the addresses in `block` stay valid while this lives
            run_native.native = (compiled.address, block)
            run_native.threads = threads
            run_native.rebind = rebind
            return run_native
        fn = compile_kernel(work.ast, work.name)
        arrays = [b.memory for b in buffers]
        extra = {"var_vals": work.var_vals} if work.var_vals else {}  # values of symbolic offsets

        def run_kernel() -> None:  # queue workers run with numpy's float warnings off (queue.py)
            use_threads(threads)
            fn(*arrays, **extra)
        run_kernel.keep_alive = specs  # the memory stays owned until this command is gone (device.py)
        return run_kernel
    if isinstance(work, Copy):
        src_dev, dst_dev = Device.get(work.src.device), Device.get(work.dst.device)
        src, dst = src_dev.allocate(work.src), dst_dev.allocate(work.dst)
        if src_dev.kind == "NULL" or dst_dev.kind == "NULL":
            if src_dev.kind != dst_dev.kind:
                raise DeviceError(f"cannot copy between {src_dev.name} and {dst_dev.name}: NULL devices hold no data")
            return None
        if settings.native != "0":  # a memcpy in C, which a replay's native program can hold
            run = native.native_copy(dst.address() + work.dst_offset, src.address() + work.src_offset,
                                     work.nbytes)
            if run is not None:
                block = run.native[1]

                def rebind(other: Copy) -> None:
                    """The same copy between `other`'s buffers (see run_native's rebind)."""
                    block[0] = dst_dev.allocate(other.dst).address() + other.dst_offset
                    block[1] = src_dev.allocate(other.src).address() + other.src_offset
                    run.keep_alive = (other.src, other.dst)
                run.keep_alive = (work.src, work.dst)
                run.rebind = rebind
                return run
        src_bytes = src.memory.view(np.uint8)[work.src_offset:work.src_offset + work.nbytes]
        dst_bytes = dst.memory.view(np.uint8)[work.dst_offset:work.dst_offset + work.nbytes]

        def run_copy() -> None:
            np.copyto(dst_bytes, src_bytes)
        run_copy.keep_alive = (work.src, work.dst)
        return run_copy
    if isinstance(work, NetAllReduce):  # a collective across processes, on the device's net queue
        return net.runner(work)
    raise TypeError(f"the executor cannot run {type(work).__name__}")
