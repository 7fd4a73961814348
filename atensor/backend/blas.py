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

The count is OpenBLAS's process-wide setting. Two queues of different devices never disagree about
it: with more than one CPU device each device's share is one thread unless `ATENSOR_BLAS_THREADS`
says otherwise.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

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
