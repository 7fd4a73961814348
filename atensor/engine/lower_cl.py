"""Lowering a task on an OpenCL device to a `Runner` whose `enqueue` puts it on a device queue.

Why beside lower.py and not inside it: the same choice (what runs for a work) with different
materials. A kernel is rendered by backend/gpu/render.py from the same AST the C backend renders, in the
OpenCL dialect, built once per source and device (cl_runtime.program: memory, then disk), its
kernel objects made once per program and set (pyopencl takes ~55 us for one on pocl); a runner holds
its arguments in one list, `Runner.device_args` (buffers, temporaries it owns, bound Variables' values,
which `Runner.rebind` refreshes before a jit replay's submission; a replay's plan stores its buffers
there, engine/patching.py), and as it enqueues picks the set of shared kernel objects that holds them
already and sets those that set does not hold (`_Kernels`: a replay whose buffers one set holds sets
none, `y = step(y)`'s two memories in turn included). A copy is one OpenCL copy:
host to device (non-blocking: the runner holds the host array until the command is published, see
cl_queue.py), device to device (the devices of one platform share a context), or device to host,
which runs on the CPU device's copy queue as a blocking read on the OpenCL device's host queue.

A kernel the OpenCL renderer does not lower (random numbers, scatter, bitcast, half floats) runs on
the host instead, still as a command of the CL queue: a marker after its waits, then a host thread of
the device reads its buffers, runs the numpy kernel (the CPU backend's) and writes the result back,
and sets a user event that the command's last marker waits for. Slow, but every op runs on CL.
"""
from __future__ import annotations

import collections
import queue as queue_module
from dataclasses import dataclass, field
import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np

from atensor.backend.c.render import Unsupported
from atensor.backend.gpu.dialect import OPENCL
from atensor.backend.gpu.render import GPUProgram, render_gpu
from atensor.backend.numpy.render import compile_kernel
from atensor.backend.runner import Runner
from atensor.config import settings
from atensor.dtype import dtypes
from atensor.engine import cl_bounds
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.graph.taskgraph import Copy, Kernel
from atensor.hcq import cl_native, cl_runtime
from atensor.hcq.device import Device, DeviceError

_RENDERED_KEPT = 4096
# (kernel AST, name, fp64) -> program: an eager realize lowers its tasks on every submission
_rendered: collections.OrderedDict[tuple, GPUProgram] = collections.OrderedDict()


def rendered(work: Kernel, handle: cl_runtime.CLDevice) -> GPUProgram | None:
    """The kernel `work` as OpenCL C for `handle`'s device (kept for the next task of the same AST);
    None when the renderer does not lower it (it runs on the host, `host_kernel_runner`)."""
    key = (work.ast, work.name, handle.fp64)
    found = _rendered.get(key)
    if found is None:
        try:
            found = render_gpu(work.ast, work.name, OPENCL, handle.fp64)
        except Unsupported:
            return None
        if settings.racecheck:  # its own index arithmetic (a tiled matmul's), proved as the AST's views are
            cl_bounds.check_program(found, work.name)
        _rendered[key] = found
        if len(_rendered) > _RENDERED_KEPT:
            _rendered.popitem(last=False)
    return found


@dataclass
class _Kernels:
    """A built program's kernel objects, made once per set and shared by the runners of its source: a
    runner picks the set that holds its arguments already (`pick`), sets the arguments that differ from
    the ones that set holds and enqueues, all under `lock` (OpenCL takes the arguments at enqueue time).

    Why up to SETS sets: pocl's enqueue of a kernel object whose buffer arguments changed since its last
    enqueue costs more than one whose arguments stand (raw pyopencl, `b = a + 1` on 16 floats enqueued
    and waited for, AMD EPYC Zen 5, load ~7.5: 23-28 us with the two buffers swapped by clSetKernelArg per
    call against 17 us alternating two kernel objects that each keep their arguments, as a kernel
    enqueued with the same ones). A jit replay's `y = step(y)` passes two memories in turn (the device's
    pool hands the dead one back, cl_runtime.CLPool), so with two sets neither is set again.

    Invariant: `held[s][j][i]` says what argument i of `sets[s][j]` was last set to, None before it is
    set: a weak reference to the CLMemory of a buffer argument, the value of a scalar one. An argument
    is set again unless it is that same live CLMemory (or an equal value). Weak, so the kernel objects
    keep no memory alive; to the CLMemory and not to its cl_mem handle, whose address a driver may hand
    to a new buffer once the old one is freed, while a driver may have resolved the old buffer's device
    address when the argument was set."""
    SETS = 2
    built: Any                 # the pyopencl.Program the kernel objects are made from
    names: list[str]           # its kernels' names, in launch order
    count: int                 # the arguments of each kernel
    sets: list[list] = field(default_factory=list)   # per set: its kernel objects, in launch order
    held: list[list[list]] = field(default_factory=list)  # per set, per kernel: what each argument holds
    turn: int = 0              # the set a miss takes next once there are SETS
    lock: threading.Lock = field(default_factory=threading.Lock)
    _launches: Optional[_Launches] = None  # `launches`, made at the first compiled runner

    def pick(self, args: list, memories: int) -> int:
        """The set whose kernel objects hold `args` already (the first `memories` CLMemory, the rest
        values), else one never used, else a new set while there are fewer than SETS, else the next in
        turn. Under `lock`."""
        for s, held in enumerate(self.held):
            if _holds(held, args, memories):
                return s
        for s, held in enumerate(self.held):
            if all(was is None for kernel_held in held for was in kernel_held):
                return s
        if len(self.sets) < self.SETS:
            import pyopencl as cl
            self.sets.append([cl.Kernel(self.built, name) for name in self.names])
            self.held.append([[None] * self.count for _ in self.names])
            return len(self.sets) - 1
        self.turn = (self.turn + 1) % len(self.sets)
        return self.turn

    def launches(self, prog: GPUProgram) -> _Launches:
        """Per set (made or not yet), its launches as the compiled core enqueues them: (kernel handle,
        global size, local size) per kernel, in launch order (hcq/cl_native.py; a set made later is
        added as it is made)."""
        if self._launches is None:
            self._launches = _Launches(self, [(k.global_size, k.local_size) for k in prog.kernels])
        return self._launches


class _Launches:
    """`_Kernels.launches`: the tuple of set `s`'s launches at `[s]`, made once the set exists."""

    def __init__(self, kernels: _Kernels, sizes: list[tuple[int, int]]):
        self.kernels, self.sizes = kernels, sizes
        self.made: list[tuple] = []

    def __getitem__(self, s: int) -> tuple:
        made = self.made
        while len(made) <= s:  # under the program's lock (the caller holds it)
            kernels = self.kernels.sets[len(made)]
            made.append(tuple((kernel.int_ptr, g, l) for kernel, (g, l) in zip(kernels, self.sizes)))
        return made[s]


def _hold(kernels: _Kernels, args: list, memories: int) -> int:
    """Picks the set of `kernels` for `args` (`_Kernels.pick`) and sets each argument its kernel objects
    do not hold already; returns the set. Under `kernels.lock`."""
    global args_set
    s = kernels.pick(args, memories)
    ref = weakref.ref
    for kernel, held in zip(kernels.sets[s], kernels.held[s]):
        for i, arg in enumerate(args):
            was = held[i]
            if i < memories:
                if was is not None and was() is arg:
                    continue
                held[i] = None  # not held if set_arg raises
                kernel.set_arg(i, arg.mem)
                held[i] = ref(arg)
            else:
                if was is not None and was == arg:
                    continue
                held[i] = None
                kernel.set_arg(i, arg)
                held[i] = arg
            args_set += 1
    return s


def _holds(held: list[list], args: list, memories: int) -> bool:
    """Whether every kernel of a set holds `args` (`held`: per kernel, what each argument holds)."""
    for kernel_held in held:
        for i, arg in enumerate(args):
            was = kernel_held[i]
            if was is None or (was() is not arg if i < memories else was != arg):
                return False
    return True


_kernel_objects: dict[tuple[int, str], _Kernels] = {}

# counted for tests: kernel arguments set (`clSetKernelArg`); a replay with unchanged buffers sets none
args_set = 0


def _kernels(handle: cl_runtime.CLDevice, prog: GPUProgram) -> _Kernels:
    key = (handle.index, prog.source)
    found = _kernel_objects.get(key)
    if found is None:
        built = cl_runtime.program(handle, prog.source)
        count = prog.buffers + len(prog.temp_bytes) + len(prog.variables)
        made = _Kernels(built, [k.name for k in prog.kernels], count)
        with made.lock:
            made.pick([None] * count, count)  # the first set, made here rather than at the first enqueue
        found = _kernel_objects.setdefault(key, made)
    return found


def kernel_runner(work: Kernel, device: Device, buffers: list) -> Runner:
    """The runner of a kernel on the CL device `device`; `buffers` hold its memory (CLMemory each).

    Its arguments are one list, `Runner.device_args` (the CLMemory of the work's buffers, in
    `work.buffers`' order, then of its temporaries, then its Variables' values): a jit replay's plan
    points the buffers at the replay's own in place (engine/patching.py) and the enqueue sets only
    the arguments the kernel objects do not hold already (`_Kernels`)."""
    import pyopencl as cl
    handle = device.cl
    prog = rendered(work, handle)
    if prog is None:
        return host_kernel_runner(work, device, buffers)
    kernels = _kernels(handle, prog)
    temps = [cl_runtime.CLMemory(handle, size, dtypes.uint8) for size in prog.temp_bytes]
    var_vals = work.var_vals
    args: list = [buffers[k].memory for k in range(prog.buffers)] + temps
    memories = len(args)  # arguments before this are CLMemory, after it Variables' values

    def set_values() -> None:  # the bound Variables' values, as the kernels' last arguments
        args[memories:] = [np.int64(var_vals[v]) for v in prog.variables]
    set_values()
    sizes = [((k.global_size,), (k.local_size,)) for k in prog.kernels]
    enqueue_nd = cl.enqueue_nd_range_kernel
    lock = kernels.lock

    def enqueue(queue: Any, wait_for: list) -> tuple[Any, Any]:
        first = last = None
        with lock:  # the kernel objects are shared by every runner of the program: args, then enqueue
            s = _hold(kernels, args, memories)
            for kernel, (global_size, local_size) in zip(kernels.sets[s], sizes):
                last = enqueue_nd(queue, kernel, global_size, local_size, wait_for=wait_for or None)
                wait_for = []
                if first is None:
                    first = last
        return first, last
    launch = None
    core = cl_native.native()
    if core is not None:
        cl_enqueue = core.cl_enqueue
        launches = kernels.launches(prog)

        def launch(queue: int) -> tuple[int, int]:
            with lock:  # as `enqueue`: the arguments, then the launches, under the program's lock
                return cl_enqueue(queue, launches[_hold(kernels, args, memories)])
    keep = (work.buffers, temps)
    # rebound in place only when its arguments name every buffer of its work (a replay's plan then
    # allocates each new one as it binds it); else made again per replay, from the work
    every = prog.buffers == len(work.buffers)
    return Runner(_blocking(enqueue, handle), args=tuple([(spec, 0) for spec in work.buffers]) if every else (),
                  keep_alive=keep, enqueue=enqueue, rebind=set_values if prog.variables else None,
                  device_key=prog.source, device_args=args if every else None, launch=launch)


class _HostThread:
    """One CL device's thread for host kernels: runs each job, in order, off the dispatching thread."""

    def __init__(self, name: str):
        self.jobs: queue_module.SimpleQueue = queue_module.SimpleQueue()
        threading.Thread(target=self._work, name=f"atensor-{name}-host-kernels", daemon=True).start()

    def _work(self) -> None:
        while True:
            self.jobs.get()()


_host_threads: dict[str, _HostThread] = {}
_host_lock = threading.Lock()


def _stored_param(ast: Node) -> int:
    """The buffer index a kernel's STORE writes."""
    target = ast.src[0]
    while target.op is not Ops.PARAM:
        target = target.src[0]
    return target.arg[0]


def prepare(works: list) -> None:
    """Builds the OpenCL programs of the CL kernels among `works` (a plan's) not built yet, one program
    per device (cl_runtime.build_together), before their runners are made one by one."""
    by_device: dict[str, list[str]] = {}
    for work in works:
        if isinstance(work, Kernel) and work.device.startswith("CL"):
            handle = Device.get(work.device).cl
            prog = rendered(work, handle) if handle is not None else None
            if prog is not None and prog.source not in handle.programs:
                by_device.setdefault(work.device, []).append(prog.body)
    for device, bodies in by_device.items():
        cl_runtime.build_together(Device.get(device).cl, OPENCL.prelude, bodies)


def host_kernel_runner(work: Kernel, device: Device, buffers: list) -> Runner:
    """A kernel the OpenCL renderer does not lower, run by the CPU backend on host copies of its buffers
    between a marker and a user event of its CL queue (see the module docstring)."""
    import pyopencl as cl
    handle = device.cl
    fn = compile_kernel(work.ast, work.name)
    memories = [b.memory for b in buffers]
    written = _stored_param(work.ast)
    extra = {"var_vals": work.var_vals} if work.var_vals else {}
    with _host_lock:
        worker = _host_threads.get(device.name)
        if worker is None:
            worker = _host_threads[device.name] = _HostThread(device.name)

    errors: dict[int, BaseException] = {}  # last event (its handle) -> what its run raised

    def enqueue(queue: Any, wait_for: list) -> tuple[Any, Any]:
        start = cl.enqueue_marker(queue, wait_for=wait_for or None)
        done = cl.UserEvent(handle.context)
        last = cl.enqueue_marker(queue, wait_for=[done])

        def job() -> None:
            try:
                start.wait()
                with np.errstate(all="ignore"):
                    arrays = [m.read() for m in memories]
                    fn(*arrays, **extra)
                memories[written].write(arrays[written])
            except Exception as exc:  # kept for the queue (`Runner.failed`): a negative status on the user
                errors[last.int_ptr] = exc  # event would end the marker without its callback (pocl)
            done.set_status(cl.command_execution_status.COMPLETE)
        worker.jobs.put(job)
        return start, last

    def failed(last: Any) -> Optional[BaseException]:
        return errors.pop(last.int_ptr, None)
    return Runner(_blocking(enqueue, handle), keep_alive=(work.buffers,), enqueue=enqueue, failed=failed)


def copy_runner(work: Copy, src_dev: Device, dst_dev: Device, src: Any, dst: Any) -> Runner:
    """A copy with an OpenCL device at one end or both (`src`, `dst`: their Buffers)."""
    import pyopencl as cl
    n, src_off, dst_off = work.nbytes, work.src_offset, work.dst_offset
    keep = (work.src, work.dst)
    if dst_dev.cl is None:  # device to host: a blocking read, on the CPU device's copy queue
        if src_dev.kind != "CL" or dst_dev.kind != "CPU":
            raise DeviceError(f"cannot copy between {src_dev.name} and {dst_dev.name}")
        host = dst.memory.view(np.uint8)[dst_off:dst_off + n]
        memory = src.memory

        def read() -> None:
            memory.read_into(host, src_off)
        return Runner(read, keep_alive=keep)
    handle = dst_dev.cl
    if n == 0:
        def enqueue(queue: Any, wait_for: list) -> tuple[Any, Any]:
            marker = cl.enqueue_marker(queue, wait_for=wait_for or None)
            return marker, marker
    elif src_dev.cl is None:  # host to device, non-blocking: the host bytes are kept with the runner
        if src_dev.kind != "CPU":
            raise DeviceError(f"cannot copy between {src_dev.name} and {dst_dev.name}: NULL devices hold no data")
        host = src.memory.view(np.uint8)[src_off:src_off + n]
        mem = dst.memory.mem

        def enqueue(queue: Any, wait_for: list) -> tuple[Any, Any]:
            event = cl.enqueue_copy(queue, mem, host, dst_offset=dst_off, is_blocking=False,
                                    wait_for=wait_for or None)
            return event, event
        keep = (work.src, work.dst, host)
    else:  # device to device (one context per platform: any queue of it may copy between its buffers)
        if src_dev.cl.context != handle.context:
            raise DeviceError(f"cannot copy from {src_dev.name} to {dst_dev.name}: they are on different OpenCL "
                              f"platforms; copy through a CPU device (.to('CPU').to('{dst_dev.name}'))")
        src_mem, dst_mem = src.memory.mem, dst.memory.mem

        def enqueue(queue: Any, wait_for: list) -> tuple[Any, Any]:
            event = cl.enqueue_copy(queue, dst_mem, src_mem, byte_count=n, src_offset=src_off,
                                    dst_offset=dst_off, wait_for=wait_for or None)
            return event, event
    return Runner(_blocking(enqueue, handle), keep_alive=keep, enqueue=enqueue,
                  device_key=("copy", src_dev.name, dst_dev.name, n))


def _blocking(enqueue: Callable[[Any, list], tuple[Any, Any]], handle: cl_runtime.CLDevice) -> Callable[[], None]:
    """`Runner.fn` of a device command run from the host (outside a CL queue): enqueued on the device's
    host queue and waited for."""
    def run() -> None:
        enqueue(handle.host, [])[1].wait()
    return run


__all__ = ["copy_runner", "host_kernel_runner", "kernel_runner", "prepare", "rendered"]
