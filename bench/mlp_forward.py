"""A float32 MLP forward at batch 256: atensor (jitted, its kernels compiled to C) against numpy doing the
same products, and where the difference lies.

    python bench/mlp_forward.py                      # the flagship's 64-256-128-10 and a 784-1024-1024-10
    python bench/mlp_forward.py --sizes 64,256,128,10 --rounds 7 --calls 200

Per round, alternating (so a change of the machine's load falls on both): numpy's forward
(`x @ W.T + b`, ReLU between) and atensor's jitted forward called blocking and read back (`.numpy()`),
each the median of `--calls` calls; BLAS on one thread for both (ATENSOR_BLAS_THREADS=1 and
threadpoolctl), so the comparison is of the work, not of how two thread pools share two busy cores.
Then the breakdown of atensor's call: its compiled kernel's own time (profiler spans: the C function,
which is three sgemm calls of the same OpenBLAS numpy calls plus fused bias-and-ReLU loops), and the
rest of the call (replay, hand-off to the queue's worker and back, the read-back). The physical limit
is numpy's own sgemm time (`--calls` of the three products alone), which both share.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("ATENSOR_BLAS_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from bench.common import LOAD_AT_START, table, write_results  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402

BATCH = 256


def _median_call(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(sizes: list[int], rounds: int, calls: int) -> dict:
    """The round medians of both forwards, the kernel's own time, and the sgemm floor, in seconds."""
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((o, i)).astype(np.float32) * 0.1, rng.standard_normal(o).astype(np.float32))
               for i, o in zip(sizes, sizes[1:])]
    x = rng.standard_normal((BATCH, sizes[0])).astype(np.float32)

    def numpy_forward() -> np.ndarray:
        h = x
        for k, (w, b) in enumerate(weights):
            h = h @ w.T + b
            if k < len(weights) - 1:
                h = np.maximum(h, 0)
        return h

    def products() -> None:  # the sgemm calls alone, on inputs of the right shapes
        h = x
        for w, _ in weights:
            h = h @ w.T
    params = [(Tensor(w), Tensor(b)) for w, b in weights]

    @atensor.jit
    def forward(h: Tensor) -> Tensor:
        for k, (w, b) in enumerate(params):
            h = h @ w.T + b
            if k < len(params) - 1:
                h = h.relu()
        return h.contiguous()
    xt = Tensor(x)
    for _ in range(5):  # capture, verify, compile
        got = forward(xt).numpy()
    np.testing.assert_allclose(got, numpy_forward(), rtol=1e-4, atol=1e-4)
    result: dict = {"numpy_s": [], "atensor_s": [], "sgemm_s": [], "kernel_s": [], "ratio": []}
    for _ in range(rounds):
        n = _median_call(numpy_forward, calls)
        a = _median_call(lambda: forward(xt).numpy(), calls)
        result["numpy_s"].append(n)
        result["atensor_s"].append(a)
        result["ratio"].append(a / n)
        result["sgemm_s"].append(_median_call(products, calls))
        with atensor.profile() as prof:
            for _ in range(calls):
                forward(xt).numpy()
        kernels = [s.duration_ns for s in prof.spans if s.kind == "kernel"]
        per_call = len(kernels) // calls or 1
        sums = [sum(kernels[i:i + per_call]) for i in range(0, len(kernels), per_call)]
        result["kernel_s"].append(statistics.median(sums) / 1e9)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", action="append", help="layer widths, comma-separated (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    models = [[int(s) for s in text.split(",")] for text in (args.sizes or ["64,256,128,10", "784,1024,1024,10"])]
    rows, out = [], {}
    with threadpool_limits(1):
        for sizes in models:
            r = measure(sizes, args.rounds, args.calls)
            name = "-".join(map(str, sizes))
            out[name] = r
            med = {k: statistics.median(v) for k, v in r.items()}
            rows.append([name, med["numpy_s"] * 1e6, med["atensor_s"] * 1e6, f"{med['ratio']:.2f}x",
                         f"{min(r['ratio']):.2f}-{max(r['ratio']):.2f}", med["sgemm_s"] * 1e6, med["kernel_s"] * 1e6,
                         (med["atensor_s"] - med["kernel_s"]) * 1e6])
    load = os.getloadavg()
    print(table(f"MLP forward, batch {BATCH}, float32, BLAS on 1 thread; medians of {args.rounds} alternating "
                f"rounds of {args.calls} calls; load {LOAD_AT_START[0]:.1f} at start, {load[0]:.1f} now",
                ["MLP", "numpy us", "atensor us", "atensor/numpy", "range", "sgemm alone us", "atensor kernel us",
                 "atensor outside kernel us"], rows))
    path = write_results("mlp_forward", {"batch": BATCH, "rounds": args.rounds, "calls": args.calls, "models": out,
                                         "command": " ".join(["python", *sys.argv])})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
