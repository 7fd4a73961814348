"""Devices: each owns its memory and has a compute queue and a copy queue.

`CPU` (same as `CPU:0`), `CPU:1`, ... are separate memories on the host's cores: a buffer belongs to
one of them, and using it on another without `.to()` is an error. `NULL`, `NULL:1`, ... run nothing
and hold no data: they exist to test scheduling and to measure atensor's own overhead. `CL` (same as
`CL:0`), `CL:1`, ... are OpenCL devices (hcq/cl_runtime.py): their queues are OpenCL queues
(hcq/cl_queue.py) and their memory is device memory, read back by the host only through a copy.
"""
from __future__ import annotations

import collections
import re
import threading
import time
from typing import Any, Optional

import numpy as np

from atensor import core, ledger
from atensor.config import settings
from atensor.graph.node import BufferSpec
from atensor.backend.gemm import blas
from atensor.hcq import cl_runtime
from atensor.hcq.buffer import Buffer
from atensor.hcq.cl_queue import CLQueue
from atensor.hcq.queue import Queue
from atensor.hcq.smallpool import SmallPool
from atensor.profiler import collector
from atensor.profiler.events import MemoryEvent

_DEVICE_RE = re.compile(r"^(CPU|NULL|CL)(?::(\d+))?$")
_registry: dict[str, Device] = {}
_registry_lock = threading.Lock()
_all_queues: tuple[Queue, ...] = ()  # every queue of the devices in `_registry` (`_refresh_queues`)


class DeviceError(ValueError):
    """An unknown device name, or data used on a device that does not hold it."""


_canonical_cache: dict[str, str] = {}


def canonical(name: str) -> str:
    """`"CPU"` -> `"CPU:0"`; raises DeviceError naming what exists for anything else. A tuple or list
    of names (the devices of a sharded tensor) gives a tuple of canonical names."""
    if type(name) is str and (known := _canonical_cache.get(name)) is not None:
        return known
    if isinstance(name, Device):
        return name.name
    if isinstance(name, (tuple, list)):
        return tuple(canonical(n) for n in name)  # type: ignore[return-value]
    match = _DEVICE_RE.match(str(name).upper())
    if match is None:
        raise DeviceError(f"unknown device {name!r}; atensor has CPU, CPU:k, NULL, NULL:k, and CL, CL:k "
                          f"on OpenCL (k = 0, 1, ...)")
    result = _canonical_cache[name] = f"{match.group(1)}:{int(match.group(2) or 0)}"
    return result


class Device:
    """A device: its queues and its memory. Get one with `Device.get(name)`."""

    def __init__(self, name: str):
        self.name = name
        self.kind = name.split(":")[0]
        # an OpenCL device (raises CLUnavailable saying what to install or set when there is none)
        self.cl: Optional[cl_runtime.CLDevice] = None
        if self.kind == "CL":
            handle = self.cl = cl_runtime.open_device(int(name.split(":")[1]))
            self.compute: Queue = CLQueue(name, "compute", handle, handle.compute)
            self.copy: Queue = CLQueue(name, "copy", handle, handle.copy)
        else:
            self.compute = Queue(name, "compute")
            self.copy = Queue(name, "copy")
        self._more_queues: dict[str, Queue] = {}  # made on first use: "net" (atensor/dist/)
        self.bytes_in_use = 0
        self.peak_bytes = 0
        # per size, the dead buffers' memory (the newest last); sizes in the order they were last used
        # (taken from or given back), the least recent first: what a full pool gives up first
        self._pool: collections.OrderedDict[int, list[HostMemory]] = collections.OrderedDict()
        self._pool_used: dict[int, float] = {}  # per size in the pool: when it was last taken or given back
        self._pooled_bytes = 0
        self._mem_lock = threading.Lock()
        # the dead small buffers' memory, typed and with its address, counted here (smallpool.py)
        self._small = SmallPool(owner=self)

    def __repr__(self) -> str:
        return f"Device({self.name})"

    @staticmethod
    def get(name: str) -> Device:
        """The device called `name`, created on first use."""
        key = canonical(name)
        dev = _registry.get(key)
        if dev is None:
            index = int(key.split(":")[1])
            if index >= settings.max_devices:
                raise DeviceError(f"device {name!r}: index {index} is beyond the {settings.max_devices} devices "
                                  f"of a kind atensor makes ({key.split(':')[0]}:0 ... "
                                  f"{key.split(':')[0]}:{settings.max_devices - 1}); use one of those, or raise "
                                  f"ATENSOR_MAX_DEVICES")
            with _registry_lock:
                dev = _registry.get(key)
                if dev is None:
                    try:
                        dev = Device(key)
                    except cl_runtime.CLUnavailable as exc:
                        raise DeviceError(str(exc)) from None
                    _registry[key] = dev
                    _refresh_queues()
                    _limit_blas_threads()
        return dev

    @property
    def queues(self) -> tuple[Queue, ...]:
        return (self.compute, self.copy, *self._more_queues.values())

    def queue(self, kind: str) -> Queue:
        """The device's queue of `kind`: "compute", "copy", or "net" (commands that talk to other
        processes, atensor/dist/), made on first use."""
        if kind == "compute":
            return self.compute
        if kind == "copy":
            return self.copy
        found = self._more_queues.get(kind)
        if found is None:
            if kind != "net" or self.cl is not None:
                if kind == "net":
                    raise DeviceError(f"{self.name} has no net queue: a collective across processes runs on "
                                      f"CPU devices; copy the tensor to a CPU device first")
                raise DeviceError(f"a device has no {kind!r} queue; its queues are compute, copy and net")
            with _registry_lock:
                found = self._more_queues.setdefault(kind, Queue(self.name, kind))
                _refresh_queues()
        return found

    # ---- memory ---------------------------------------------------------------------------------
    def allocate(self, spec: BufferSpec, data: Optional[np.ndarray] = None) -> Buffer:
        """Attaches memory to `spec`'s Buffer (the given flat array, or fresh memory); NULL devices
        hold none. Memory is released with the spec."""
        if spec.device != self.name:
            raise DeviceError(f"{spec} lives on {spec.device}, not on {self.name}; move it with .to('{self.name}')")
        buf = Buffer.of(spec)
        if buf.memory is not None:
            return buf
        if self.kind == "NULL":
            buf.memory = NullMemory(spec.size)
            return buf
        if self.cl is not None:  # device memory; `data` (host values) is written into it
            memory = self.cl.pool.take(self.cl, spec.nbytes, spec.dtype)  # a dead buffer's, when one fits
            if data is not None:
                memory.write(data)
            buf.memory = memory
            buf.release = (self._release_cl, memory)
            self._account(spec.nbytes)
            return buf
        if data is not None:
            buf.memory = data
            buf.release = (self._account, -spec.nbytes)  # run when the Buffer goes, with its spec
        elif 0 < (nbytes := spec.nbytes) < SmallPool.MAX_NBYTES:  # recycled: see hcq/smallpool.py
            small = self._small
            entry = small.take(nbytes, spec.dtype.np)  # (counted in bytes_in_use by the pool)
            buf.memory, buf._address = entry[1], entry[2]
            buf.release = (small.give, entry)
            return buf
        else:  # counted in bytes_in_use by `_take`, under the lock it takes anyway
            held = self._take(spec.nbytes)
            buf.memory, buf._address = held.raw.view(spec.dtype.np), held.address
            buf.release = (self._release, held)
            return buf
        self._account(spec.nbytes)
        return buf

    # A caching allocator: large fresh arrays cost a page fault per 4 KiB on first touch (an output of
    # 256 MiB pays ~65,000 of them), so memory of a dead buffer is kept per size and handed to the next
    # buffer of that size. A buffer dies only when no node, task or queued command refers to its spec
    # (commands keep their specs alive), so memory is never reused under work still running on it.
    # At most POOL_MAX_BYTES are kept. When a dead buffer does not fit, memory of the sizes nobody has
    # taken or given back for POOL_STALE_S makes room, the least recently used first (as jemalloc
    # purges pages not reused within a decay time): a pool full of an earlier phase's sizes no longer
    # turns away the sizes in use now (turned away, each new buffer of those is fresh memory: in
    # bench/mpi.py's 64 MiB allreduces after its smaller sizes, ~660 fresh 64 MiB arrays). Memory in use
    # within that time is never given up, so a loop whose buffers outgrow the pool keeps a stable part
    # of them pooled, and does not evict at every step what the next step takes again.
    POOL_MIN_BYTES = 1 << 16
    POOL_MAX_BYTES = 1 << 30
    POOL_STALE_S = 2.0

    # `_take` and `_release` count the memory in bytes_in_use under the lock they take for the pool
    # (`_account`'s work, without a second acquisition: a jitted 1 MiB allreduce makes and frees one
    # such buffer per call, on a cache the collective left cold)
    def _take(self, nbytes: int) -> HostMemory:
        held = None
        with self._mem_lock:
            self.bytes_in_use = in_use = self.bytes_in_use + nbytes
            if in_use > self.peak_bytes:
                self.peak_bytes = in_use
            free = self._pool.get(nbytes) if nbytes >= self.POOL_MIN_BYTES else None
            if free:
                self._pooled_bytes -= nbytes
                held = free.pop()
                if free:
                    self._pool.move_to_end(nbytes)
                    self._pool_used[nbytes] = time.monotonic()
                else:  # invariant: every size in the pool holds memory
                    del self._pool[nbytes], self._pool_used[nbytes]
        if collector._active:
            collector.record_memory(MemoryEvent(self.name, time.perf_counter_ns(), in_use))
        return held if held is not None else HostMemory(np.empty(nbytes, dtype=np.uint8))

    def _release(self, held: HostMemory) -> None:
        nbytes = held.raw.nbytes
        evicted = []  # freed once the lock is released
        with self._mem_lock:
            self.bytes_in_use = in_use = self.bytes_in_use - nbytes
            if self.POOL_MIN_BYTES <= nbytes <= self.POOL_MAX_BYTES:
                pool, used, now = self._pool, self._pool_used, time.monotonic()
                # invariant: pooled <= the maximum
                while self._pooled_bytes + nbytes > self.POOL_MAX_BYTES and pool:
                    size = next(iter(pool))  # the least recently used size
                    if now - used[size] < self.POOL_STALE_S:
                        break  # every size kept is in use: this memory goes back to the system
                    kept = pool[size]
                    evicted.append(kept.pop(0))  # its oldest memory
                    self._pooled_bytes -= size
                    if not kept:
                        del pool[size], used[size]
                if self._pooled_bytes + nbytes <= self.POOL_MAX_BYTES:
                    pool.setdefault(nbytes, []).append(held)
                    pool.move_to_end(nbytes)
                    used[nbytes] = now
                    self._pooled_bytes += nbytes
        if collector._active:
            collector.record_memory(MemoryEvent(self.name, time.perf_counter_ns(), in_use))

    def _release_cl(self, memory: cl_runtime.CLMemory) -> None:
        """A dead buffer's device memory goes back to its device's pool (cl_runtime.CLPool)."""
        self._account(-memory.nbytes)
        self.cl.pool.give(memory)

    def empty_cache(self) -> None:
        """Returns the memory kept for reuse to the system."""
        with self._mem_lock:
            self._pool.clear()
            self._pool_used.clear()
            self._pooled_bytes = 0
        self._small.clear()
        if self.cl is not None:
            self.cl.pool.clear()

    def _account(self, delta: int) -> None:
        with self._mem_lock:
            self.bytes_in_use += delta
            self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
            in_use = self.bytes_in_use
        if collector.is_active():
            collector.record_memory(MemoryEvent(self.name, time.perf_counter_ns(), in_use))

    def synchronize(self) -> None:
        """Blocks until every command submitted to this device's queues has run (not for the loop thread)."""
        for q in self.queues:
            q.signal.wait_blocking(q._reserved, check=False)


class HostMemory:
    """A block of host memory of the caching allocator (`Device._take`), with its address read once when
    it is made: a buffer handed this memory again needs no `__array_interface__` (a dict built per read,
    ~2 us on a cache left cold by a 1 MiB collective: a jitted allreduce's fresh result, every call)."""
    __slots__ = ("raw", "address")

    def __init__(self, raw: np.ndarray):
        self.raw, self.address = raw, raw.__array_interface__["data"][0]


class NullMemory:
    """What a NULL device 'allocates': a size and nothing else."""
    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


def fresh_small(device: Device, spec: BufferSpec, version: int, key: tuple[int, Any]) -> Buffer:
    """The Buffer of `spec`, a spec made just now that nothing else has seen (a jit replay's fresh result,
    jit/direct.py), on the CPU `device` with 0 < `spec.nbytes` < SmallPool.MAX_NBYTES: what
    `Device.allocate` gives it (recycled memory, counted in the device's bytes), with the spec's ledger
    record made at `version` in the same step (`ledger.attach_new`: no second lookup, no version advance
    afterwards). `key` is the pool's key of the size, `(spec.nbytes, spec.dtype.np)`, made once by the
    caller. In C with the compiled core (atensor/core/fresh.c; this function is its specification)."""
    buf = Buffer(spec)
    small = device._small
    entry = small.take(key[0], key[1])
    buf.memory, buf._address = entry[1], entry[2]
    buf.release = (small.give, entry)
    ledger.attach_new(spec, buf, version)
    return buf


def fresh_pooled(device: Device, spec: BufferSpec, version: int) -> Buffer:
    """`fresh_small` for a buffer of the caching allocator's sizes (SmallPool.MAX_NBYTES and up) on the CPU
    `device`: its Buffer with a dead buffer's memory (or fresh memory), counted in the device's bytes, and
    its ledger record at `version`, in one step (jit/direct.py, for a one-net-command replay's result: the
    general path looks the spec up three times, and advances its version apart, on a cache the previous
    collective left cold)."""
    buf = Buffer(spec)
    held = device._take(spec.nbytes)
    buf.memory, buf._address = held.raw.view(spec.dtype.np), held.address
    buf.release = (device._release, held)
    ledger.attach_new(spec, buf, version)
    return buf


python_fresh_small = fresh_small  # the specification, whichever runs (tests/core/ compares the two)
if core.ccore is not None:
    core.ccore.configure_fresh(Buffer, SmallPool, threading.Lock, collector, python_fresh_small)
    fresh_small = core.ccore.fresh_small  # noqa: F811


def all_idle() -> bool:
    """True when every queue of every device has run every command planned for it: then no buffer
    has work pending. Exact when called by the planning thread (only it reserves signal values)."""
    for q in _all_queues:  # a plain loop: every replay asks (engine/plan.py)
        if q.signal.value < q._reserved:
            return False
    return True


def _refresh_queues() -> None:
    """Lists every queue of every device in `_all_queues` (one assignment: `all_idle` reads either the
    old tuple or the new one); called under `_registry_lock` when a device or a queue is made."""
    global _all_queues
    _all_queues = tuple(q for d in list(_registry.values()) for q in d.queues)


def devices() -> list[Device]:
    """Every device created so far."""
    return list(_registry.values())


def _limit_blas_threads() -> None:
    """Each CPU device's share of the cores for BLAS (backend/gemm/blas.py), so two devices running products at
    once do not oversubscribe the cores."""
    blas.set_share(sum(1 for name in _registry if name.startswith("CPU")))
