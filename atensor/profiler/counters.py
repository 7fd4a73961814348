# GlobalCounters: tinygrad's running totals of what ran (kernels, flops, bytes, time), fed by the stamps.
#
# Every command a queue runs is stamped with (start_ns, end_ns) on the queue's timeline, and carries the
# bytes and flops the scheduler estimated for it (the same numbers a profile's Span holds). The queue
# hands those stamps here as it publishes the command (`count`), so the totals are of work that ran,
# not of work planned: a jit replay counts each time it runs; a program the jit batched into one native
# call counts as the kernels it holds.
#
# Why always on and not only under `atensor.profile()`: tinygrad's programs read the counters in every
# loop (`GlobalCounters.reset()` each step, `global_ops` for a GFLOPS line) without profiling, and a
# profile changes how the jit lowers its replays (per-command spans instead of one native program).
# Counting costs one lock and four additions per command, next to a command's microseconds at least.
#
# `DEBUG`: a command whose realize was issued with `debug >= 2` (`Context(DEBUG=2)`, ATENSOR_DEBUG) is
# printed as it finishes (`echo`), in tinygrad's `*** DEVICE  n name ... tm ...` form.
#
# This module imports nothing from atensor (the profiler's rule), so the queues (hcq/) can call it.
from __future__ import annotations

import threading
from typing import ClassVar

_lock = threading.Lock()


class GlobalCounters:
    """Totals since the last `reset()`, as tinygrad's: `kernel_count` (kernels run), `global_ops`
    (their estimated flops), `global_mem` (bytes their commands moved, kernels and copies),
    `time_sum_s` (seconds the commands ran, from the queues' stamps). `mem_used` is the bytes held on
    devices now and is not reset (tinygrad's note); atensor's devices report it (`Device.bytes_in_use`),
    so it is left at 0 here.

    Example::

        GlobalCounters.reset()
        (a @ b).realize().wait()
        print(GlobalCounters.kernel_count, GlobalCounters.global_ops)
    """

    global_ops: ClassVar[int] = 0
    global_mem: ClassVar[int] = 0
    time_sum_s: ClassVar[float] = 0.0
    kernel_count: ClassVar[int] = 0
    mem_used: ClassVar[int] = 0

    @staticmethod
    def reset() -> None:
        """Sets the totals (all but `mem_used`) back to 0."""
        with _lock:
            GlobalCounters.global_ops = GlobalCounters.global_mem = GlobalCounters.kernel_count = 0
            GlobalCounters.time_sum_s = 0.0


def count(kind: str, kernels: int, nbytes: int, flops: int, start_ns: int, end_ns: int) -> None:
    """Adds one finished command: `kernels` kernels (0 for a copy or an allreduce), its bytes, flops
    and stamps. Called by the queue that ran it, from its worker thread or the submitting one."""
    with _lock:
        if kind == "kernel":
            GlobalCounters.kernel_count += kernels
            GlobalCounters.global_ops += flops
        GlobalCounters.global_mem += nbytes
        GlobalCounters.time_sum_s += max(0, end_ns - start_ns) * 1e-9


def echo(device: str, kind: str, name: str, nbytes: int, flops: int, start_ns: int, end_ns: int) -> None:
    """Prints one finished command, tinygrad's DEBUG=2 line: device, running kernel number, name, bytes,
    time, and the command's throughput."""
    seconds = max(1, end_ns - start_ns) * 1e-9
    what = name if kind == "kernel" else f"{kind} {name}"
    print(f"*** {device:8s} {GlobalCounters.kernel_count:4d} {what[:48]:48s} mem {nbytes / 1e9:7.3f} GB "
          f"tm {seconds * 1e6:9.2f}us/{GlobalCounters.time_sum_s * 1e3:9.2f}ms "
          f"({flops / seconds / 1e9:8.2f} GFLOPS {nbytes / seconds / 1e9:7.2f} GB/s)", flush=True)
