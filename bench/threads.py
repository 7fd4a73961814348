"""How numpy work scales over two Python threads on this machine: the ceiling of atensor's multi-device
speed, since each CPU device's queue is a thread that runs numpy calls.

    python bench/threads.py

Each workload runs N times in one thread, then N times in each of two threads at once; scaling = the
two-thread time / the one-thread time (1.0: perfectly parallel, 2.0: no better than one after the
other). Workloads: a 1024^2 float32 matmul (BLAS, one BLAS thread: the GIL is released for ~10 ms),
`np.add` on 256^2 and 64^2 float32 arrays (the GIL is released for ~20 us and ~1 us), and a small mix
like a training step's kernels. Peer in the same run: the same work in two processes (no shared GIL).
"""
from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402


def _workloads() -> dict[str, tuple[Callable[[], None], int]]:
    rng = np.random.default_rng(0)
    big = rng.random((1024, 1024), dtype=np.float32)
    mid = rng.random((256, 256), dtype=np.float32)
    small = rng.random((64, 64), dtype=np.float32)
    w = rng.random((256, 64), dtype=np.float32)
    out_mid, out_small = np.empty_like(mid), np.empty_like(small)

    def mix() -> None:  # a few kernels' worth of a training step at batch 256
        g = np.maximum(mid, 0.5)
        g.T @ w
        np.add.reduce(g, axis=0)
        e = np.exp(small - small.max(axis=1, keepdims=True))
        (e * 2 + 1).sum()

    return {"matmul 1024^2 (BLAS)": (lambda: big @ big, 12),
            "np.add 256^2": (lambda: np.add(mid, mid, out=out_mid), 8000),
            "np.add 64^2": (lambda: np.add(small, small, out=out_small), 20000),
            "step-like mix": (mix, 1500)}


def _loop(name: str, count: int) -> None:
    fn = _workloads()[name][0]
    for _ in range(count):
        fn()


def _worker(name: str, count: int, go: object, times: object) -> None:
    """Warms up, waits for the start signal, runs `count` calls and reports their time (so neither
    starting a thread or process nor building the arrays is timed)."""
    fn = _workloads()[name][0]
    for _ in range(max(1, count // 10)):
        fn()
    go.wait()  # type: ignore[attr-defined]
    start = time.perf_counter()
    for _ in range(count):
        fn()
    times.put(time.perf_counter() - start)  # type: ignore[attr-defined]


def _timed(name: str, count: int, parallel: int, kind: str) -> float:
    """The slowest worker's time when `parallel` workers (threads or processes) run at once."""
    if kind == "thread":
        import queue
        go, times, make = threading.Event(), queue.Queue(), threading.Thread
    else:
        go, times, make = multiprocessing.Event(), multiprocessing.Queue(), multiprocessing.Process
    workers = [make(target=_worker, args=(name, count, go, times)) for _ in range(parallel)]
    for w in workers:
        w.start()
    time.sleep(0.3)  # every worker warmed up and waiting
    go.set()
    elapsed = max(times.get() for _ in workers)
    for w in workers:
        w.join()
    return elapsed


def main() -> None:
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)  # one BLAS thread per worker, as atensor gives each of two devices
    rows, results = [], {}
    for name, (_, count) in _workloads().items():
        one = min(_timed(name, count, 1, "thread") for _ in range(3))
        two_threads = min(_timed(name, count, 2, "thread") for _ in range(3))
        two_procs = min(_timed(name, count, 2, "process") for _ in range(3))
        per_call = one / count * 1e6
        results[name] = {"one_thread_s": one, "two_threads_s": two_threads, "two_processes_s": two_procs,
                         "us_per_call": per_call}
        rows.append([name, per_call, two_threads / one, two_procs / one])
    print(table("two workers doing the same numpy work at once: time / one worker's (1.0 = parallel)",
                ["workload", "us per call", "2 threads", "2 processes"], rows))
    print("wrote", write_results("threads", results))


if __name__ == "__main__":
    main()
