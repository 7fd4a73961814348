"""Profiler overhead: a pipeline of 1,000 kernels realized with and without an active profile.

    python bench/profiler_overhead.py

Target (issue 5): at most 5% slower with the profiler on. Each variant runs several times,
alternating, and the medians are compared.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402


def pipeline(kernels: int) -> list[Tensor]:
    """`kernels` dependent kernels spread over two devices, with copies between them."""
    x = Tensor(np.ones((64, 64), dtype=np.float32))
    y = Tensor(np.ones((64, 64), dtype=np.float32), device="CPU:1")
    outs = []
    for i in range(kernels // 2):
        x = (x * 0.5 + 1).contiguous()
        y = (y * 0.5 + 1).contiguous()
        if i % 100 == 99:
            outs.append((x.to("CPU:1") + y).sum())
    return [x, y, *outs]


def run(profiled: bool, kernels: int) -> tuple[float, int]:
    outs = pipeline(kernels)
    start = time.perf_counter()
    if profiled:
        with atensor.profile() as prof:
            Tensor.realize(*outs).wait()
        spans = len(prof.spans)
    else:
        Tensor.realize(*outs).wait()
        spans = 0
    return time.perf_counter() - start, spans


def main() -> None:
    kernels = 1000
    run(False, kernels)
    run(True, kernels)
    plain, traced, spans = [], [], 0
    for _ in range(7):
        plain.append(run(False, kernels)[0])
        elapsed, spans = run(True, kernels)
        traced.append(elapsed)
    p, t = statistics.median(plain), statistics.median(traced)
    overhead = t / p - 1
    print(table(f"profiler overhead, pipeline of {kernels} kernels on CPU:0 and CPU:1 (median of 7)",
                ["variant", "ms", "spans recorded"],
                [("no profile", p * 1e3, 0), ("profile active", t * 1e3, spans),
                 ("overhead", f"{overhead * 100:.1f}%", "")]))
    print("wrote", write_results("profiler_overhead", {"kernels": kernels, "plain_s": plain, "profiled_s": traced,
                                                       "median_overhead": overhead, "spans": spans}))


if __name__ == "__main__":
    main()
