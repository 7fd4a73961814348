"""Lowering one task's work to the `Runner` a queue runs, and copying a work with its buffers swapped.

Why a module of its own: the plan (plan.py) decides where and when each task runs; what runs is
decided here, once per work: a compiled C kernel when backend/c/registry.py has one (one foreign call,
the GIL released for the whole kernel; bound Variables' values sit in its argument block, rewritten
by `Runner.rebind` before each submission), else the numpy kernel; a memcpy in C for a copy when a
native library is loaded, else numpy's copyto; nothing on NULL devices; on an OpenCL device, an
OpenCL kernel or copy (lower_cl.py). The memory of every buffer a
runner touches is allocated here, on first use.

A native runner's argument block holds buffer addresses, and `Runner.args` says whose address sits
in each slot: a replay points a kept runner at other buffers by rewriting those slots
(patching.py), so no runner needs a closure of its own to be rebound.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np

from atensor.backend.gemm import blas

from atensor.backend.c import programs, registry
from atensor.backend.numpy.render import compile_kernel
from atensor.backend.runner import Runner
from atensor.config import settings
from atensor.ledger import record_of
from atensor.engine import lower_cl
from atensor.graph.node import BufferSpec
from atensor.graph.ops import Ops
from atensor.graph.taskgraph import Copy, Kernel, NetAllReduce
from atensor.hcq import net
from atensor.hcq.device import Device, DeviceError
from atensor.profiler import collector
from atensor.sched.cache import Slot, map_buffers


def runner_for(work: object) -> Optional[Runner]:
    """The runner a queue runs for `work` (a Kernel, a Copy or a NetAllReduce); None on NULL devices."""
    if isinstance(work, Kernel):
        return _kernel_runner(work)
    if isinstance(work, Copy):
        return _copy_runner(work)
    if isinstance(work, NetAllReduce):  # a collective across processes, on the device's net queue
        return net.runner(work)
    raise TypeError(f"atensor cannot lower a task of type {type(work).__name__}: only Kernel, Copy and "
                    f"NetAllReduce works run on queues")


def _plain_call(call: Callable, block: Any, threads: int) -> Callable[[], None]:
    """A C kernel's call with `threads` BLAS threads: one foreign call, the GIL released throughout."""
    use_threads = blas.use

    def run_native() -> None:
        use_threads(threads)
        call(block)
        if threads != 1:
            use_threads(1)  # the one-thread invariant (below)
    return run_native


def _measured_call(call: Callable, block: Any, choice: blas.MeasuredThreads) -> Callable[[], None]:
    """A big C kernel's call with the BLAS threads its own timed runs found faster (backend/gemm/blas.py)."""
    use_threads, clock = blas.use, time.perf_counter_ns

    def run_native() -> None:
        count = choice.pick()
        use_threads(count)
        start = clock()
        call(block)
        choice.record(count, clock() - start)
        if count != 1:
            use_threads(1)  # the one-thread invariant (below)
    return run_native


def _kernel_runner(work: Kernel) -> Optional[Runner]:
    device = Device.get(work.device)
    collector.describe_kernel(work.name, work.ops)  # the profiler's hover text for its spans
    specs = work.buffers
    # a buffer seen before has its memory already (the common case in replays)
    buffers = []
    for spec in specs:
        record = record_of(spec.uid)  # ledger.runtime(spec), inlined: once per buffer of every task
        b = record.runtime if record is not None else None
        buffers.append(b if b is not None and b.memory is not None else device.allocate(spec))
    if device.kind == "NULL":
        return None
    if device.cl is not None:  # an OpenCL device: its kernels rendered to OpenCL C (lower_cl.py)
        return lower_cl.kernel_runner(work, device, buffers)
    packed = len(work.ast.src) > 1 and work.ast.src[1].op is Ops.QMATMUL  # splits itself (blas.packed_threads)
    threads = blas.packed_threads() if packed else blas.threads_for(work.flops)
    use_threads = blas.use
    mode = settings.native
    compiled = None if mode == "0" else registry.lookup(work.ast)
    if compiled is None and mode == "all":
        registry.prepare([(work.ast, work.name)])
        compiled = registry.lookup(work.ast)
    if compiled is not None:
        var_vals = work.var_vals
        call, block = compiled.fn, compiled.pointers([b.address() for b in buffers], var_vals)
        rebind = None
        if compiled.variables:  # the jit rebinds `var_vals` in place; the plan copies them into the block
            bind_values = compiled.bind_values

            def rebind() -> None:
                bind_values(block, var_vals)

        choice = blas.choice_for(work.ast, threads) if threads != 1 and blas.measured() and not packed else None
        run_native = _measured_call(call, block, choice) if choice is not None else _plain_call(call, block, threads)
        # the addresses in `block` stay valid while `keep_alive` lives
        return Runner(run_native, native=(compiled.address, block), args=tuple([(s, 0) for s in specs]),
                      threads=threads, keep_alive=specs, rebind=rebind, choice=choice)
    fn = compile_kernel(work.ast, work.name)
    arrays = [b.memory for b in buffers]
    extra = {"var_vals": work.var_vals} if work.var_vals else {}  # values of symbolic offsets

    def run_kernel() -> None:  # queue workers run with numpy's float warnings off (queue.py)
        use_threads(threads)
        fn(*arrays, **extra)
    # the memory stays owned until this command is gone (device.py)
    return Runner(run_kernel, threads=threads, keep_alive=specs)


# Why a C kernel that asked for more BLAS threads sets one again when done: a batch or native program of
# one-thread C kernels (programs.batch, programs.Program) calls them in C without setting the count, and
# after the output projection the next decode step's matrix-vector products ran on two spinning BLAS
# threads (a batch-4 step took 5.5 s instead of 0.5 s on a loaded 2-core machine). A numpy kernel
# leaves the count as it is (the next numpy kernel sets its own); a batch sets one before it runs.


def _copy_runner(work: Copy) -> Optional[Runner]:
    src_dev, dst_dev = Device.get(work.src.device), Device.get(work.dst.device)
    src, dst = src_dev.allocate(work.src), dst_dev.allocate(work.dst)
    if src_dev.kind == "NULL" or dst_dev.kind == "NULL":
        if src_dev.kind != dst_dev.kind:
            raise DeviceError(f"cannot copy between {src_dev.name} and {dst_dev.name}: NULL devices hold no "
                              f"data")
        return None
    if src_dev.cl is not None or dst_dev.cl is not None:  # an OpenCL copy (lower_cl.py)
        return lower_cl.copy_runner(work, src_dev, dst_dev, src, dst)
    if settings.native != "0":  # a memcpy in C, which a replay's native program can hold
        run = programs.native_copy(dst.address() + work.dst_offset, src.address() + work.src_offset,
                                 work.nbytes)
        if run is not None:
            run.args = ((work.dst, work.dst_offset), (work.src, work.src_offset))
            run.keep_alive = (work.src, work.dst)
            return run
    src_bytes = src.memory.view(np.uint8)[work.src_offset:work.src_offset + work.nbytes]
    dst_bytes = dst.memory.view(np.uint8)[work.dst_offset:work.dst_offset + work.nbytes]

    def run_copy() -> None:
        np.copyto(dst_bytes, src_bytes)
    return Runner(run_copy, keep_alive=(work.src, work.dst))


def swap_buffers(work: Any, get: Callable[[BufferSpec, BufferSpec], BufferSpec]) -> Any:
    """A copy of a Kernel or Copy with each of its buffers passed through `get(spec, spec)` (a
    mapping's `get`): sched/cache.py's one mechanism for copying a work with other buffers."""
    return map_buffers(work, BufferSpec, lambda spec: get(spec, spec))


def fill_slots(work: Any, get: Callable[[Slot], BufferSpec]) -> Any:
    """A copy of a schedule-cache template's work (buffers as `Slot`s) with each slot's buffer
    `get(slot)`: what a Plan lowered from a template runs (sched/cache.py's `map_buffers` again)."""
    return map_buffers(work, Slot, get)


__all__ = ["fill_slots", "runner_for", "swap_buffers"]
