"""Allreduce bus bandwidth on 2 and 4 CPU devices, against this machine's memcpy bandwidth, and the
sum of a 2-device sharded tensor against the same sum on one device.

    python bench/allreduce.py            # all sizes, 4 KiB .. 256 MiB (about two minutes)
    python bench/allreduce.py --quick    # up to 16 MiB

busbw follows NCCL's tests: algbw = size / time, busbw = algbw * 2 (n - 1) / n, where size is the
bytes each device holds; busbw is what each device's link must move, so it compares across device
counts and against a link's (here: memcpy's) bandwidth. Buffers are reused between iterations, as
in NCCL's tests: each iteration assigns a fresh allreduce into the same output tensor, alternating
between two sets of inputs (so no result is a cached one).

Targets (issue 4): busbw at least 0.8 of memcpy for sizes of 64 MiB and up; the sharded sum at most
0.6 of the single-device time for large tensors. The last column of the sum table is a control
measured in the same run: numpy summing the two halves in two threads against one thread, i.e. how
much two-core parallelism the machine gives right now (on a shared machine, often little).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import memcpy_bandwidth, table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.sched.allreduce import MODEL  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20



def allreduce_seconds(n: int, nbytes: int, algorithm: str, repeat: int) -> float:
    """Best seconds of one sum-allreduce of `nbytes` per device over CPU:0..CPU:n-1 (the least disturbed
    run on a shared machine)."""
    devices = tuple(f"CPU:{i}" for i in range(n))
    size = max(1, nbytes // 4)
    sets = [[Tensor(np.full(size, k + i + 1, np.float32), device=d) for i, d in enumerate(devices)]
            for k in range(2)]
    out = Tensor(np.zeros(size, np.float32), device=devices)
    Tensor.realize(out, *sets[0], *sets[1]).wait()
    times = []
    for r in range(repeat + 1):
        out.assign(Tensor.allreduce(sets[r % 2], "sum", algorithm))
        start = time.perf_counter()
        out.realize().wait()
        if r:  # the first run compiles the reduce kernels
            times.append(time.perf_counter() - start)
    expected = sum(r % 2 + i + 1 for i in range(n))
    got = out.shards[-1].numpy()
    assert got[0] == expected and got[-1] == expected, (got[:4], expected)
    return min(times)


def sum_seconds(devices: tuple[str, ...], size: int, repeat: int) -> float:
    """Best seconds of `x.sum()` for x of `size` float32 split over `devices` (one: not sharded)."""
    data = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    times = []
    for r in range(repeat + 1):
        x = Tensor(data, device=devices[0])
        if len(devices) > 1:
            x = x.shard(devices, axis=0)
        x.realize().wait()
        total = x.sum()
        start = time.perf_counter()
        total.realize().wait()
        if r:
            times.append(time.perf_counter() - start)
        assert abs(total.item() - float(data.sum(dtype=np.float64))) < 1e-3 * size ** 0.5 + 1
    return min(times)


def numpy_halves_ratio(size: int, repeat: int = 3) -> float:
    """The machine's own parallelism, as a control: two threads each summing half of the data, over one
    thread summing all of it (1.0: no parallelism; 0.5: two free cores)."""
    import threading
    data = np.random.default_rng(1).standard_normal(size).astype(np.float32)
    halves = [data[: size // 2].copy(), data[size // 2:].copy()]
    single, together = float("inf"), float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        data.sum()
        single = min(single, time.perf_counter() - start)
        threads = [threading.Thread(target=h.sum) for h in halves]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together = min(together, time.perf_counter() - start)
    return together / single


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 16 MiB only")
    args = parser.parse_args()
    largest = 16 * MIB if args.quick else 256 * MIB
    sizes = [s for s in (4 * KIB * 4 ** k for k in range(10)) if s <= largest]
    memcpy = memcpy_bandwidth(min(largest, 256 * MIB))
    rows, records = [], []
    for n in (2, 4):
        for nbytes in sizes:
            repeat = 5 if nbytes <= 16 * MIB else 3
            plan = MODEL.choose(n, nbytes)
            algorithms = ["auto"] + (["naive", "ring"] if nbytes >= 64 * MIB else [])
            for algorithm in algorithms:
                seconds = allreduce_seconds(n, nbytes, algorithm, repeat)
                algbw = nbytes / seconds
                busbw = algbw * 2 * (n - 1) / n
                chosen = f"auto={plan.algorithm}" if algorithm == "auto" else algorithm
                rows.append((n, _size(nbytes), chosen, seconds * 1e3, algbw / 1e9, busbw / 1e9,
                             busbw / memcpy))
                records.append({"devices": n, "bytes": nbytes, "algorithm": algorithm,
                                "chosen": plan.algorithm, "chunks": plan.chunks, "seconds": seconds,
                                "algbw": algbw, "busbw": busbw, "busbw_over_memcpy": busbw / memcpy})
    print(table(f"allreduce (sum, float32) on CPU devices, best of 3-5; memcpy {memcpy / 1e9:.2f} GB/s",
                ["devices", "size", "algorithm", "ms", "algbw GB/s", "busbw GB/s", "busbw/memcpy"], rows))
    sum_rows, sum_records = [], []
    for size in ([1 << 20, 1 << 22] if args.quick else [1 << 20, 1 << 22, 1 << 24, 1 << 26]):
        single = sum_seconds(("CPU:0",), size, 3)
        sharded = sum_seconds(("CPU:0", "CPU:1"), size, 3)
        control = numpy_halves_ratio(size)
        sum_rows.append((_size(size * 4), single * 1e3, sharded * 1e3, sharded / single, control))
        sum_records.append({"elements": size, "single_s": single, "sharded_s": sharded,
                            "ratio": sharded / single, "numpy_two_threads_ratio": control})
    print()
    print(table("x.sum() of float32: one device vs sharded over CPU:0 and CPU:1 (best of 3)",
                ["size", "single ms", "2-device ms", "ratio", "numpy 2 threads ratio"], sum_rows))
    results = {"memcpy_bps": memcpy, "allreduce": records, "sharded_sum": sum_records}
    print("wrote", write_results("allreduce", results))


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


if __name__ == "__main__":
    main()
