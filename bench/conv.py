"""conv2d forward, and forward plus backward, against PyTorch CPU (same threads) and tinygrad, in one run.

    python bench/conv.py [--rounds 5]          # ATENSOR_BLAS_THREADS=1 on a shared machine

Layers: MNIST-sized (beautiful_mnist's second convolution, 128x32x24x24 by 32x32x5x5, the kernel
r_sum_128x1x32x32x20x20 of issue 18) and ResNet-block-sized (8x64x56x56 by 64x64x3x3, padding 1).
atensor builds the graph and realizes it on every call (the schedule cache keeps the TaskGraph), as a
training loop does; the backward is the gradients of x and w for a random upstream gradient (as a
layer inside a network gets), realized together. PyTorch runs with
`torch.set_num_threads` equal to atensor's BLAS threads for a big kernel; tinygrad on its CPU device
(which compiles its kernels with clang: where clang is missing the table says so). On a machine whose
cores other processes also use, OpenBLAS's spinning threads collapse (measured here: a batched sgemm
at 47 GFLOP/s on one thread, 0.6 on two), so run with ATENSOR_BLAS_THREADS=1 there.

`--train-steps N` (default 20; 0 skips it) also times the flagship's training step (examples/train.py:
fused Adam, the step an `atensor.jit` function, captured then replayed) on one device at batch 128
for `--model cnn` against the MLP, alternating the models each round: the issue's target is the CNN
as fast per sample as the MLP.

`--step-rounds N` (default 3; 0 skips it) also times whole jitted steps (bench/conv_steps.py): the
beautiful_mnist model and the flagship's `--model cnn`, at batch 512 and 128, forward, forward+backward
and the Adam step, against PyTorch and tinygrad; `--steps-only` runs just those and updates the `steps`
entry of bench/results/conv.json, leaving the layer figures as they were.

Rounds alternate the peers (atensor, torch, tinygrad, then again), so a drift of the machine's speed
hits all of them; the table gives the median over the rounds of the wall time and of the process's
CPU time (on a loaded machine the CPU time is the steadier figure: it leaves out the time other
processes held the core), the range of the wall times, and each ratio to PyTorch's median in the
same run.

Physical limit: atensor lowers a convolution's forward to sgemms (backend/gemm/window.py: per sample,
one copy that unfolds the inner kernel axis, then one gemm per outer kernel offset; backend/gemm/contraction.py's
im2col where that does not apply), so its floor is the layer's flops at the best sgemm throughput of
this machine's BLAS: the run measures a 1024^3 sgemm (`sgemm peak`) and the layer's own gemms without
their copies (`gemm floor`: the per-sample gemms of backend/gemm/window.py's shapes, into one output) and
prints the forward time each allows.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_of, table, time_steps, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atensor import Tensor  # noqa: E402
from atensor.backend.gemm import blas
from atensor.backend.gemm import openblas  # noqa: E402
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


def _sgemm_floor(x: tuple, w: tuple, pad: int, repeat: int, threads: int) -> tuple[float, float]:
    """Seconds the layer's forward takes at (the best 1024^3 sgemm throughput, the layer's own
    per-sample gemms as backend/gemm/window.py multiplies them, without the copies), measured now."""
    n, _, h, wd = x
    cout, cin, kh, kw = w
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    blas.use(threads)
    square = np.random.rand(1024, 1024).astype(np.float32)
    product = np.empty_like(square)
    peak = 2 * 1024 ** 3 / best_of(lambda: np.matmul(square, square, out=product), repeat)
    cols = np.random.rand(cin * kw, oh * ow).astype(np.float32)
    weight = np.random.rand(cout, cin * kw).astype(np.float32)
    out = np.empty((cout, oh * ow), np.float32)
    bound = openblas.functions()
    if bound is None:
        return _flops(x, w, pad) / peak, float("nan")
    index = ctypes.c_longlong if bound.ilp64 else ctypes.c_int
    ptr, real = ctypes.c_void_p, ctypes.c_float
    sgemm = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, index, index, index, real, ptr,
                             index, ptr, index, real, ptr, index)(bound.sgemm)
    m, k, p = cout, cin * kw, oh * ow

    def products() -> None:  # the first gemm of a sample writes its output, the others add into it
        for _ in range(n):
            for tap in range(kh):
                sgemm(101, 111, 111, m, p, k, 1.0, weight.ctypes.data, k, cols.ctypes.data, p, float(tap > 0),
                      out.ctypes.data, p)
    return _flops(x, w, pad) / peak, best_of(products, repeat)


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


def _train_step(model: str, batch: int) -> tuple[Callable, list, Callable]:
    """examples/train.py's jitted step for `model` on one device: (step, params, inputs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import train
    import atensor
    from atensor import nn
    from atensor.nn import optim
    rng = np.random.default_rng(0)
    x_np, y_np = rng.random((batch, 64), dtype=np.float32), rng.integers(0, 10, size=batch).astype(np.int32)
    Tensor.manual_seed(0)
    net = train.MODELS[model]()
    params = nn.get_parameters(net)
    opt = optim.Adam(params, lr=1e-3, fused=True)

    async def step(x: Tensor, y: Tensor) -> Tensor:
        loss = nn.cross_entropy(net(x), y, reduction="sum") / batch
        opt.zero_grad()
        loss.backward()
        await opt.step(loss)
        return loss
    return atensor.jit(step), params, lambda: (Tensor(x_np), Tensor(y_np))


def _train_rounds(steps: int, rounds: int, batch: int = 128) -> dict[str, dict[str, list[float]]]:
    """Per model and round: the median wall seconds of a step, and the process's CPU seconds per step
    (the steadier figure on a loaded machine), the models alternating."""
    runs = {model: _train_step(model, batch) for model in ("mlp", "cnn")}
    out: dict[str, dict[str, list[float]]] = {model: {"wall": [], "cpu": []} for model in runs}
    for r in range(rounds):
        for model, (run, params, inputs) in runs.items():
            if r == 0:  # capture, compile and warm up, not timed
                time_steps(run, params, inputs, 6, 0)
            cpu = time.process_time()
            walls = time_steps(run, params, inputs, steps, 0)
            out[model]["cpu"].append((time.process_time() - cpu) / steps)
            out[model]["wall"].append(statistics.median(walls))
    return out


def _rounds(make: dict[str, Callable], rounds: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """(wall, cpu) seconds of every peer's forward and backward, the peers alternating each round."""
    runs: dict[str, tuple[Callable, Callable]] = {}
    for peer, factory in make.items():
        try:
            forward, backward = factory()
            forward(), backward()  # warm up: compile, caches, allocations
            runs[peer] = (forward, backward)
        except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
            print(f"{peer} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    times: dict[str, dict[str, list[tuple[float, float]]]] = {
        p: {"forward": [], "forward+backward": []} for p in runs}
    for _ in range(rounds):
        for peer, fns in runs.items():
            for mode, fn in zip(("forward", "forward+backward"), fns):
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                times[peer][mode].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=20, help="steps per round of the cnn-vs-mlp "
                        "training step timing (0: skip it)")
    parser.add_argument("--step-rounds", type=int, default=3, help="rounds of the whole-step comparison "
                        "(bench/conv_steps.py; 0: skip it)")
    parser.add_argument("--steps-only", action="store_true", help="only the whole-step comparison")
    args = parser.parse_args()
    Tensor([0.0]).numpy()  # the CPU device exists: its BLAS share is known
    threads = settings.blas_threads or blas.threads_for(1 << 62)
    import torch
    torch.set_num_threads(threads)
    if args.steps_only:
        _steps_only(args.step_rounds, threads)
        return
    peers = {"atensor": _atensor, "torch": _torch, "tinygrad": _tinygrad}
    rows, results = [], {}
    for name, (xs, ws, pad) in LAYERS.items():
        rng = np.random.default_rng(0)
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / math.sqrt(math.prod(ws[1:]))).astype(np.float32)
        n, _, h, wd = xs
        g = rng.standard_normal((n, ws[0], h + 2 * pad - ws[2] + 1, wd + 2 * pad - ws[3] + 1)).astype(np.float32)
        peak_floor, floor = _sgemm_floor(xs, ws, pad, args.rounds, threads)
        times = _rounds({p: (lambda make=make: make(x, w, g, pad)) for p, make in peers.items()}, args.rounds)
        flops = _flops(xs, ws, pad)
        summary: dict[str, dict[str, dict[str, float]]] = {}
        for mode in ("forward", "forward+backward"):
            ref = times.get("torch", {}).get(mode)
            ref_wall = statistics.median(t[0] for t in ref) if ref else None
            ref_cpu = statistics.median(t[1] for t in ref) if ref else None
            for peer in peers:
                got = times.get(peer, {}).get(mode)
                if not got:
                    continue
                walls = [t[0] for t in got]
                wall, cpu = statistics.median(walls), statistics.median(t[1] for t in got)
                work = flops * (3 if mode != "forward" else 1)
                summary.setdefault(peer, {})[mode] = {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3,
                                                      "wall_min_ms": min(walls) * 1e3,
                                                      "wall_max_ms": max(walls) * 1e3}
                rows.append([name, mode, peer, wall * 1e3, f"{min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f}",
                             cpu * 1e3, work / wall / 1e9,
                             f"{wall / ref_wall:.2f}x" if ref_wall else "-", f"{cpu / ref_cpu:.2f}x" if ref_cpu else "-"])
        results[name] = {"flops_forward": flops, "sgemm_peak_floor_ms": peak_floor * 1e3,
                         "gemm_floor_ms": floor * 1e3, "peers": summary}
        rows.append([name, "forward", "sgemm peak", peak_floor * 1e3, "-", "-", flops / peak_floor / 1e9,
                     "(1024^3 sgemm rate)", ""])
        rows.append([name, "forward", "gemm floor", floor * 1e3, "-", "-", flops / floor / 1e9,
                     "(its gemms, no copies)", ""])
    train_summary = {}
    if args.train_steps > 0:
        per_round = _train_rounds(args.train_steps, args.rounds)
        ratios = {kind: [c / m for c, m in zip(per_round["cnn"][kind], per_round["mlp"][kind])]
                  for kind in ("wall", "cpu")}
        for model, values in per_round.items():
            wall, cpu = values["wall"], values["cpu"]
            train_summary[model] = {"step_ms": statistics.median(wall) * 1e3, "min_ms": min(wall) * 1e3,
                                    "max_ms": max(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3}
            rows.append(["train step b128", "jit, 1 device", model, statistics.median(wall) * 1e3,
                         f"{min(wall) * 1e3:.2f}-{max(wall) * 1e3:.2f}", statistics.median(cpu) * 1e3, "-",
                         f"cnn/mlp {statistics.median(ratios['wall']):.2f}x" if model == "cnn" else "",
                         f"cnn/mlp {statistics.median(ratios['cpu']):.2f}x" if model == "cnn" else ""])
        train_summary["cnn_over_mlp"] = statistics.median(ratios["wall"])
        train_summary["cnn_over_mlp_range"] = [min(ratios["wall"]), max(ratios["wall"])]
        train_summary["cnn_over_mlp_cpu"] = statistics.median(ratios["cpu"])
    steps = _steps(args.step_rounds, threads) if args.step_rounds > 0 else {}
    print(table(f"conv2d, median of {args.rounds} alternating rounds (BLAS and torch threads: {threads}; "
                f"cores: {os.cpu_count()})",
                ["layer", "mode", "peer", "wall ms", "wall range", "cpu ms", "GFLOP/s", "vs torch (wall)",
                 "vs torch (cpu)"], rows))
    path = write_results("conv", {"threads": threads, "rounds": args.rounds, "layers": results,
                                  "train_step": train_summary, "steps": steps,
                                  "command": "ATENSOR_BLAS_THREADS=1 python bench/conv.py --rounds "
                                             f"{args.rounds} --train-steps {args.train_steps} "
                                             f"--step-rounds {args.step_rounds}",
                                  "note": "medians over alternating rounds; forward+backward GFLOP/s counts 3x "
                                          "the forward's flops; cpu_ms is the process's CPU time"})
    print(f"wrote {path}")


def _steps(rounds: int, threads: int) -> dict:
    """Runs and prints the whole-step comparison (bench/conv_steps.py); returns its results."""
    import conv_steps
    rows, results = conv_steps.run(rounds)
    print(table(f"jitted convnet steps, median of {rounds} alternating rounds (threads: {threads})",
                ["model", "mode", "peer", "wall ms", "cpu ms", "vs torch (wall)", "vs torch (cpu)"], rows))
    return {"rounds": rounds, "threads": threads, "results": results,
            "command": f"ATENSOR_BLAS_THREADS={threads} python bench/conv.py --steps-only --step-rounds {rounds}"}


def _steps_only(rounds: int, threads: int) -> None:
    """`--steps-only`: the step comparison, written into conv.json's `steps` (the rest kept)."""
    import json
    steps = _steps(rounds, threads)
    path = Path(__file__).resolve().parent / "results" / "conv.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.pop("benchmark", None), old.pop("machine", None), old.pop("time", None)
    print(f"wrote {write_results('conv', {**old, 'steps': steps})}")


if __name__ == "__main__":
    main()
