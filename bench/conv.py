"""conv2d forward, and forward plus backward, against PyTorch CPU (same threads) and tinygrad, in one run.

    python bench/conv.py [--repeat 3]          # ATENSOR_BLAS_THREADS=1 on a shared machine

Layers: MNIST-sized (beautiful_mnist's second convolution, 128x32x24x24 by 32x32x5x5, the kernel
r_sum_128x1x32x32x20x20 of issue 18) and ResNet-block-sized (8x64x56x56 by 64x64x3x3, padding 1).
atensor builds the graph and realizes it on every call (the schedule cache keeps the TaskGraph), as a
training loop does; the backward is the gradients of x and w for a random upstream gradient (as a
layer inside a network gets), realized together. PyTorch runs with
`torch.set_num_threads` equal to atensor's BLAS threads for a big kernel; tinygrad on its CPU device
(which compiles its kernels with clang: where clang is missing the table says so). On a machine whose
cores other processes also use, OpenBLAS's spinning threads collapse (measured here: a batched sgemm
at 47 GFLOP/s on one thread, 0.6 on two), so run with ATENSOR_BLAS_THREADS=1 there.

Physical limit: atensor lowers a convolution to im2col plus one batched sgemm (tensor_pool.py), so its
ceiling is the BLAS sgemm throughput numpy reaches on this machine; the run measures it (np.matmul of
the layer's im2col shapes) and prints each layer's floor at that rate. Ratios are per layer: time / the
PyTorch time of the same run. Numbers on a shared machine are noisy: best of `--repeat` runs.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_of, table, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atensor import Tensor  # noqa: E402
from atensor.backend import blas  # noqa: E402
from atensor.config import settings  # noqa: E402

os.environ.setdefault("DEV", "CPU")  # tinygrad's device

LAYERS = {  # name: (input shape, weight shape, padding)
    "mnist 128x32x24x24 k5": ((128, 32, 24, 24), (32, 32, 5, 5), 0),
    "resnet 8x64x56x56 k3": ((8, 64, 56, 56), (64, 64, 3, 3), 1),
}


def _flops(x: tuple, w: tuple, pad: int) -> int:
    n, _, h, wd = x
    cout, cin, kh, kw = w
    ho, wo = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    return 2 * n * cout * cin * kh * kw * ho * wo


def _sgemm_floor(x: tuple, w: tuple, pad: int, repeat: int, threads: int) -> float:
    """Seconds numpy's BLAS takes for the layer's forward product (im2col shapes), measured now."""
    n, _, h, wd = x
    cout, cin, kh, kw = w
    p = (h + 2 * pad - kh + 1) * (wd + 2 * pad - kw + 1)
    cols = np.random.rand(n, cin * kh * kw, p).astype(np.float32)
    weight = np.random.rand(cout, cin * kh * kw).astype(np.float32)
    blas.use(threads)
    return best_of(lambda: np.matmul(weight, cols), repeat)


def _atensor(x: np.ndarray, w: np.ndarray, g: np.ndarray, pad: int) -> tuple[Callable, Callable]:
    tx, tw, tg = Tensor(x), Tensor(w), Tensor(g)

    def forward() -> None:
        tx.conv2d(tw, padding=pad).realize().wait()

    def backward() -> None:
        gx, gw = tx.conv2d(tw, padding=pad).gradient(tx, tw, gradient=tg)
        gx.realize(gw).wait()
    return forward, backward


def _torch(x: np.ndarray, w: np.ndarray, g: np.ndarray, pad: int) -> tuple[Callable, Callable]:
    import torch
    tx, tw, tg = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True), torch.tensor(g)

    def forward() -> None:
        with torch.no_grad():
            torch.nn.functional.conv2d(tx, tw, padding=pad)

    def backward() -> None:
        torch.autograd.grad(torch.nn.functional.conv2d(tx, tw, padding=pad), (tx, tw), grad_outputs=tg)
    return forward, backward


def _tinygrad(x: np.ndarray, w: np.ndarray, g: np.ndarray, pad: int) -> tuple[Callable, Callable]:
    from tinygrad import Tensor as TinyTensor
    tx, tw, tg = TinyTensor(x).realize(), TinyTensor(w).realize(), TinyTensor(g).realize()

    def forward() -> None:
        tx.conv2d(tw, padding=pad).realize()

    def backward() -> None:
        gx, gw = tx.conv2d(tw, padding=pad).gradient(tx, tw, gradient=tg)
        TinyTensor.realize(gx, gw)
    return forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    Tensor([0.0]).numpy()  # the CPU device exists: its BLAS share is known
    threads = settings.blas_threads or blas.threads_for(1 << 62)
    import torch
    torch.set_num_threads(threads)
    peers = {"atensor": _atensor, "torch": _torch, "tinygrad": _tinygrad}
    rows, results = [], {}
    for name, (xs, ws, pad) in LAYERS.items():
        rng = np.random.default_rng(0)
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / math.sqrt(math.prod(ws[1:]))).astype(np.float32)
        n, _, h, wd = xs
        g = rng.standard_normal((n, ws[0], h + 2 * pad - ws[2] + 1, wd + 2 * pad - ws[3] + 1)).astype(np.float32)
        floor = _sgemm_floor(xs, ws, pad, args.repeat, threads)
        times: dict[str, dict[str, float]] = {}
        for peer, make in peers.items():
            try:
                forward, backward = make(x, w, g, pad)
                forward(), backward()  # warm up: compile, caches, allocations
                times[peer] = {"forward": best_of(forward, args.repeat),
                               "forward+backward": best_of(backward, args.repeat)}
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                print(f"{peer} failed on {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        flops = _flops(xs, ws, pad)
        for mode in ("forward", "forward+backward"):
            ref = times.get("torch", {}).get(mode)
            for peer in peers:
                t = times.get(peer, {}).get(mode)
                if t is None:
                    continue
                work = flops * (3 if mode != "forward" else 1)
                rows.append([name, mode, peer, t * 1e3, work / t / 1e9, f"{t / ref:.2f}x" if ref else "-"])
        results[name] = {"flops_forward": flops, "numpy_sgemm_floor_ms": floor * 1e3, "ms": {
            p: {m: v * 1e3 for m, v in t.items()} for p, t in times.items()}}
        rows.append([name, "forward", "sgemm floor", floor * 1e3, flops / floor / 1e9, "(numpy BLAS limit)"])
    print(table(f"conv2d, best of {args.repeat} (BLAS and torch threads: {threads}; cores: {os.cpu_count()})",
                ["layer", "mode", "peer", "ms", "GFLOP/s", "vs torch"], rows))
    path = write_results("conv", {"threads": threads, "repeat": args.repeat, "layers": results,
                                  "note": "forward+backward GFLOP/s counts 3x the forward's flops"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
