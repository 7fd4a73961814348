"""OpenCL devices: finding them, their context and queues, their memory and their compiled programs.

Why OpenCL: it is the one device API this project can test everywhere (pocl runs it on the CPU, `pip
install 'atensor[opencl]'`) and that vendors' drivers run on NVIDIA, AMD and Intel GPUs. Nothing here
is imported unless a `CL` device is used, and pyopencl is imported only then.

Devices are numbered across every platform the ICD loader lists, in its order: `CL:0` is the first
device of the first platform. The devices of one platform share one context, so a buffer of `CL:0`
can be the source of a copy enqueued on `CL:1` (the driver moves it) and an event of one device's
queue can be in the wait list of another's. pocl gives one device per entry of POCL_DEVICES
(`POCL_DEVICES="pthread pthread"`: two).

Each device has three in-order queues with profiling on: `compute` and `copy` carry the plan's
commands (hcq/cl_queue.py), `host` carries the host's own blocking reads and writes (a tensor's
values, a copy into a CPU device's memory run by that device's copy queue). The host queue never
waits on an event the host has to set, so a blocking read there cannot wait behind a command that
waits for the reading thread.

A device whose compiler cannot build for it is refused when opened (CLUnavailable, saying why): pocl
names the host CPU by its LLVM, and an LLVM older than the CPU (pocl 3.0's LLVM 14 on an AMD Zen 5)
names it "generic", which pocl's clang then rejects for every kernel ("unknown target CPU 'generic'").
Only such a device (its version string ends "-generic") builds a trial kernel at open, ~1 s once.

Device memory is recycled (`CLPool`): a dead buffer's CLMemory goes back to its device's pool and
the next buffer of that byte size takes it, so a jit replay's `y = step(y)` passes the same two
memories in turn, which the kernel objects' sets of engine/lower_cl.py keep as their arguments (pocl
enqueues a kernel whose arguments stand faster than one whose buffers changed). A buffer dies only
once no command in flight keeps it (cl_queue.py's invariant), so memory is never handed out while a
command still uses it.

Compiled programs are kept on disk (cache_dir()/cl/<key>.bin), the key a hash of the source, the
device's name and driver, and pyopencl's version: pocl takes 0.5-1 s to build a program from source
and ~10 ms to load a binary (measured here).
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from atensor.config import settings
from atensor.dtype import DType
from atensor.hcq.queue import lower_priority

INSTALL_HINT = ("install an OpenCL driver and pyopencl: `pip install 'atensor[opencl]'` gives pyopencl with "
                "pocl's CPU driver; on a GPU, pyopencl with the vendor's OpenCL driver")


class CLUnavailable(ValueError):
    """No OpenCL device of that number: pyopencl or a platform is missing, or the index is too high."""


class CLPool:
    """The CLMemory of a device's dead buffers, per byte size, for the next buffer of that size (see the
    module docstring). At most MAX_BYTES are kept, each at most MAX_ONE: a buffer that does not fit is
    freed. Invariant: a CLMemory is in the pool only while no Buffer holds it."""
    MAX_BYTES = 256 << 20
    MAX_ONE = 64 << 20

    def __init__(self) -> None:
        self.free: dict[int, list[CLMemory]] = {}
        self.bytes = 0
        self.lock = threading.Lock()

    def take(self, device: CLDevice, nbytes: int, dtype: DType) -> CLMemory:
        """A CLMemory of `nbytes` holding `dtype`s: a dead buffer's, else a new one."""
        if self.free.get(nbytes):
            with self.lock:
                found = self.free.get(nbytes)
                if found:
                    memory = found.pop()
                    self.bytes -= max(nbytes, 1)
                    memory.dtype = dtype
                    return memory
        return CLMemory(device, nbytes, dtype)

    def give(self, memory: CLMemory) -> None:
        """Keeps a dead buffer's `memory` for the next buffer of its size (or frees it, the pool full)."""
        size = max(memory.nbytes, 1)
        if size > self.MAX_ONE:
            return
        with self.lock:
            if self.bytes + size <= self.MAX_BYTES:
                self.free.setdefault(memory.nbytes, []).append(memory)
                self.bytes += size

    def clear(self) -> None:
        """Frees every kept buffer."""
        with self.lock:
            self.free, self.bytes = {}, 0


@dataclass
class CLDevice:
    """One OpenCL device: its context, its three in-order queues and its host clock offset."""
    index: int
    device: Any                    # pyopencl.Device
    context: Any                   # pyopencl.Context shared by its platform's devices
    compute: Any                   # pyopencl.CommandQueue of the plan's kernels
    copy: Any                      # pyopencl.CommandQueue of the plan's copies
    host: Any                      # pyopencl.CommandQueue of the host's blocking reads and writes
    fp64: bool                     # doubles supported (reductions accumulate floats in double then)
    # host perf_counter_ns = device profiling ns + clock_offset (measured at open, see _clock_offset)
    clock_offset: int = 0
    description: str = ""
    programs: dict[str, Any] = field(default_factory=dict)  # source -> built pyopencl.Program
    lock: threading.Lock = field(default_factory=threading.Lock)
    pool: CLPool = field(default_factory=CLPool)  # dead buffers' memory, for the next of each size

    def host_ns(self, device_ns: int) -> int:
        """A device profiling timestamp on the host's perf_counter clock."""
        return device_ns + self.clock_offset


_opened: dict[int, CLDevice] = {}
_contexts: dict[int, Any] = {}  # platform (its handle) -> context
_lock = threading.Lock()


def _cl() -> Any:
    try:
        import pyopencl
    except ImportError as exc:
        raise CLUnavailable(f"device CL needs pyopencl, which is not installed ({exc}); {INSTALL_HINT}") from None
    return pyopencl


_first_listing = True


def _platforms(cl: Any) -> list:
    """`cl.get_platforms()`; the first time, with `settings.worker_nice` > 0, from a thread of that
    niceness (hcq/queue.py `lower_priority`), so that the threads a driver starts when it is first
    listed inherit it, as atensor's own workers have it: pocl's CPU device starts its worker threads
    there, and a launch from the event loop's thread wakes them. Measured (bench/opencl.py
    --round-trip, Zen 5, 2 cores, load ~6.5, 3 alternating pairs): with them at niceness 10, the
    awaited one-kernel jit call 32.7/34.8/35.6 us against 50.8/49.3/69.5, the calling thread switched
    out ~0.2-0.5 times a call instead of ~2 (the woken workers took its core: getrusage's involuntary
    switches); on a machine busy with other processes a big kernel gets less of the cores (matmul 256:
    44-47 ms against 16-23). A driver already listed by the process before keeps its threads as they are."""
    global _first_listing
    nice, first = settings.worker_nice, _first_listing
    _first_listing = False
    if not first or nice <= 0:
        return cl.get_platforms()
    got: list = []

    def listing() -> None:
        lower_priority(nice)
        try:
            got.append(cl.get_platforms())
        except BaseException as exc:  # raised on the caller's thread below
            got.append(exc)
    thread = threading.Thread(target=listing, name="atensor-cl-listing")
    thread.start()
    thread.join()
    if isinstance(got[0], BaseException):
        raise got[0]
    return got[0]


def listed_devices() -> list[tuple[Any, Any]]:
    """(platform, device) of every OpenCL device, numbered as CL:0, CL:1, ...; [] without any."""
    cl = _cl()
    found = []
    try:
        platforms = _platforms(cl)
    except cl.Error:  # the ICD loader finds no platform (pyopencl raises PLATFORM_NOT_FOUND_KHR)
        return []
    for platform in platforms:
        try:
            found.extend((platform, d) for d in platform.get_devices())
        except cl.Error:
            continue  # a platform without devices
    return found


def open_device(index: int) -> CLDevice:
    """The OpenCL device `CL:index`, opened once (its context and queues); raises CLUnavailable saying
    what to install or set when there is no such device."""
    found = _opened.get(index)
    if found is not None:
        return found
    with _lock:
        found = _opened.get(index)
        if found is not None:
            return found
        listed = listed_devices()
        name = f"CL:{index}"
        if not listed:
            raise CLUnavailable(f"device {name}: no OpenCL platform was found (the ICD loader lists none); "
                                f"{INSTALL_HINT}, or point OCL_ICD_VENDORS at a driver's .icd files")
        if index >= len(listed):
            names = ", ".join(f"CL:{k} {d.name!r} ({p.name})" for k, (p, d) in enumerate(listed))
            raise CLUnavailable(f"device {name} does not exist: OpenCL lists {len(listed)} device(s): {names}; "
                                f"use one of those (with pocl, POCL_DEVICES=\"pthread pthread\" gives two)")
        found = _opened[index] = _open(index, *listed[index])
    return found


def _open(index: int, platform: Any, device: Any) -> CLDevice:
    cl = _cl()
    context = _contexts.get(platform.int_ptr)
    if context is None:
        context = _contexts[platform.int_ptr] = cl.Context(platform.get_devices())
    props = cl.command_queue_properties.PROFILING_ENABLE
    queues = [cl.CommandQueue(context, device, properties=props) for _ in range(3)]
    _check_compiler(cl, context, device, index)
    fp64 = bool(device.double_fp_config)  # 0 on a device without doubles
    handle = CLDevice(index, device, context, *queues, fp64=fp64,
                      description=f"{device.name} ({platform.name}, {device.version})")
    handle.clock_offset = _clock_offset(handle)
    return handle


def _check_compiler(cl: Any, context: Any, device: Any, index: int) -> None:
    """Raises CLUnavailable when `device` is pocl's on a CPU its LLVM does not know (see the module
    docstring) and a trial kernel does not build: every kernel would fail to build the same way."""
    if not device.version.rstrip().endswith("-generic"):
        return
    try:
        cl.Program(context, "__kernel void probe(__global float *a) { a[0] = 1.0f; }").build(devices=[device])
    except cl.Error as exc:
        log = str(exc).strip().splitlines()
        reason = next((line for line in log if "error:" in line), log[-1] if log else "")
        raise CLUnavailable(f"device CL:{index} ({device.name}, {device.version}) cannot build kernels: "
                            f"{reason.strip()}; its OpenCL driver's compiler does not know this CPU (pocl "
                            f"names it 'generic'): install a pocl built with a newer LLVM (Debian's or Ubuntu's "
                            f"`apt install pocl-opencl-icd`, which pyopencl's ICD loader lists before the wheel's "
                            f"pocl, as .ci/run does)") from None


def _clock_offset(handle: CLDevice, rounds: int = 5) -> int:
    """host perf_counter_ns - device profiling ns, from markers stamped by the device between two host
    readings: the tightest of `rounds` brackets, its midpoint against the marker's end stamp."""
    cl = _cl()
    best: Optional[tuple[int, int]] = None
    for _ in range(rounds):
        before = time.perf_counter_ns()
        marker = cl.enqueue_marker(handle.host)
        marker.wait()
        after = time.perf_counter_ns()
        try:
            device_ns = marker.get_profiling_info(cl.profiling_info.END)
        except cl.Error:
            return 0  # no stamps on markers: spans fall back to the host's clock (offset 0)
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - device_ns)
    return best[1] if best is not None else 0


class CLMemory:
    """A device buffer of `nbytes` (at least 1 byte: OpenCL has no empty buffers) holding `dtype`s.
    Weakly referable: kernel objects remember by weak reference which one each argument holds
    (engine/lower_cl.py)."""
    __slots__ = ("mem", "nbytes", "dtype", "device", "__weakref__")

    def __init__(self, device: CLDevice, nbytes: int, dtype: DType):
        cl = _cl()
        self.device, self.nbytes, self.dtype = device, nbytes, dtype
        self.mem = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))

    def write(self, array: np.ndarray) -> None:
        """Copies the host `array` (its bytes, `nbytes` of them) into the buffer; blocking."""
        if self.nbytes:
            _cl().enqueue_copy(self.device.host, self.mem, np.ascontiguousarray(array).reshape(-1),
                               is_blocking=True)

    def read(self) -> np.ndarray:
        """The buffer's values as a new flat host array; blocking (call once its writers are done)."""
        out = np.empty(self.nbytes // self.dtype.itemsize, dtype=self.dtype.np)
        if self.nbytes:
            _cl().enqueue_copy(self.device.host, out, self.mem, is_blocking=True)
        return out

    def read_into(self, host: np.ndarray, offset: int) -> None:
        """Copies `host.nbytes` bytes from byte `offset` of the buffer into `host`; blocking."""
        if host.nbytes:
            _cl().enqueue_copy(self.device.host, host, self.mem, src_offset=offset, is_blocking=True)


def cache_dir() -> Path:
    """Where built programs are kept ($ATENSOR_CACHE/cl, else $XDG_CACHE_HOME/atensor/cl, else
    ~/.cache/atensor/cl)."""
    root = os.environ.get("ATENSOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "atensor")
    return Path(root) / "cl"


def _key(handle: CLDevice, source: str) -> str:
    cl = _cl()
    device = handle.device
    text = "\0".join([source, device.name, device.vendor, device.version, device.driver_version,
                      cl.VERSION_TEXT])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


programs_built = 0    # counted for tests: programs compiled from source in this process
programs_loaded = 0   # programs loaded from the disk cache


def program(handle: CLDevice, source: str) -> Any:
    """`source` built for `handle`'s device: from memory, else from its binary on disk, else compiled
    (and its binary written to disk). A build error names the device and carries the compiler's log."""
    global programs_built, programs_loaded
    found = handle.programs.get(source)
    if found is not None:
        return found
    cl = _cl()
    with handle.lock:
        found = handle.programs.get(source)
        if found is not None:
            return found
        path = cache_dir() / f"{_key(handle, source)}.bin"
        built = None
        if path.exists():
            try:
                built = cl.Program(handle.context, [handle.device], [path.read_bytes()]).build()
                programs_loaded += 1
            except (cl.Error, OSError):
                built = None  # a stale or torn binary: compiled again below
        if built is None:
            try:
                built = cl.Program(handle.context, source).build(devices=[handle.device])
            except cl.Error as exc:
                raise RuntimeError(f"OpenCL could not build a program for CL:{handle.index} "
                                   f"({handle.description}): {exc}\n--- source ---\n{source}") from None
            programs_built += 1
            _store(path, built.get_info(cl.program_info.BINARIES)[0])
        handle.programs[source] = built
    return built


def build_together(handle: CLDevice, prelude: str, bodies: list[str]) -> None:
    """Builds the kernels of `bodies` (each a program's code without the `prelude` they share) as one
    program, and serves each program (prelude + body) from it: pocl spends ~1 s per program it builds
    and barely more for eight kernels in one (measured), so a plan builds its new kernels in one go.
    Bodies built before are left out; none left, nothing is built."""
    new = list(dict.fromkeys(b for b in bodies if prelude + b not in handle.programs))
    if not new:
        return
    if len(new) == 1:
        program(handle, prelude + new[0])
        return
    built = program(handle, prelude + "".join(new))
    with handle.lock:
        for body in new:
            handle.programs.setdefault(prelude + body, built)


def _store(path: Path, binary: bytes) -> None:
    """Writes a program's binary atomically (a reader never sees a torn file); a cache that cannot be
    written only costs the next process a compile."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        temp.write_bytes(binary)
        os.replace(temp, path)
    except OSError:
        pass


__all__ = ["CLDevice", "CLMemory", "CLPool", "CLUnavailable", "INSTALL_HINT", "cache_dir", "listed_devices",
           "build_together", "open_device", "program"]
