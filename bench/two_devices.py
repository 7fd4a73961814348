"""Two devices at once: two independent compute-bound workloads on CPU:0 and CPU:1, realized
together against one after the other.

    python bench/two_devices.py

The workloads are transcendental elementwise chains (memory-bound adds cannot speed up on these
machines, and BLAS already uses both cores). Target (issue 2): together at most 0.6x the serial time.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402

N = 1 << 22
ROUNDS = 36


def workload(device: str) -> Tensor:
    x = Tensor(np.linspace(0, 1, N, dtype=np.float32), device=device)
    for _ in range(ROUNDS):
        x = (x.sin() * 1.1 + 0.1).exp().sqrt().tanh().contiguous()
    return x.sum()


def timed(*tensors: Tensor) -> float:
    start = time.perf_counter()
    Tensor.realize(*tensors).wait()
    return time.perf_counter() - start


def numpy_chain(x: np.ndarray) -> float:
    for _ in range(ROUNDS):
        x = np.tanh(np.sqrt(np.exp(np.sin(x) * np.float32(1.1) + np.float32(0.1))))
    return float(x.sum())


def main() -> None:
    timed(workload("CPU:0"), workload("CPU:1"))  # warm up
    serial, together = [], []
    for _ in range(3):
        a, b = workload("CPU:0"), workload("CPU:1")
        serial.append(timed(a) + timed(b))
        a, b = workload("CPU:0"), workload("CPU:1")
        together.append(timed(a, b))
    data = np.linspace(0, 1, N, dtype=np.float32)
    start = time.perf_counter()
    numpy_chain(data)
    numpy_chain(data)
    numpy_serial = time.perf_counter() - start
    s, t = min(serial), min(together)
    print(table("two independent compute-bound workloads on CPU:0 and CPU:1 (best of 3)",
                ["variant", "seconds", "ratio to serial"],
                [("atensor one after the other", s, 1.0), ("atensor realized together", t, t / s),
                 ("numpy, both in one thread", numpy_serial, numpy_serial / s)]))
    print("wrote", write_results("two_devices", {"serial_s": serial, "together_s": together, "ratio": t / s,
                                                 "numpy_serial_s": numpy_serial}))


if __name__ == "__main__":
    main()
