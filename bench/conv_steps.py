"""Whole convnet training steps against PyTorch CPU (same threads) and tinygrad (issue 39, part 4).

    ATENSOR_BLAS_THREADS=1 python bench/conv.py --steps-only [--rounds 3]

Two models, each at batch 512 and 128, each in three modes, all jitted in atensor (captured, then
replayed) and run in training mode (batchnorm uses batch statistics):

- `mnist`: examples/beautiful_mnist.py's Model (tinygrad's, four convolutions, two batchnorms), 28x28 inputs;
- `cnn`: examples/train.py's `--model cnn` ConvNet (two 3x3 convolutions, the second of stride 2), 8x8 inputs.

Modes: `forward` (the logits), `forward+backward` (the loss and every parameter's gradient) and `step`
(the same plus Adam's update, one task graph). PyTorch runs the same layers with the same shapes and
`torch.set_num_threads` equal to atensor's BLAS threads; tinygrad runs beautiful_mnist's model on its CPU
device when it can (it needs clang: without it the table says why it is missing).
Peers alternate within each round, so drift in the machine's speed affects all of them. The table shows
the median wall time and the process's CPU time per call. On a machine whose cores other processes use,
the CPU time is the steadier of the two.

Where the rest goes (measured 2026-12-03, one thread, process CPU time, a 2-core machine at load 13-17;
bench/results/conv.json holds the step table). The issue's target is at most 1.2x torch. After the convolutions'
forward and weight gradient moved into native kernels (backend/gemm/conv_c.py) and the col2im under max-pool's
backward became a kernel of its own (sched/schedule.py), the Adam step is, against torch: beautiful_mnist 1.66x at
batch 512 and 1.35x at 128 (2.11x and 1.78x before, the same load), the flagship's cnn 1.37x at 512 and 0.89x
at 128 (1.79x and 1.12x). Per kernel of the b128 mnist step (CPU ms, atensor against torch's
aten.convolution_backward / conv2d for the same direction, measured apart):
- conv2 32->32 k5 on 24x24: input gradient 77-83 (numpy's per-sample col2im, RowsThenAddPads) against 64;
  weight gradient 47-49 (taps) against 53; forward 47-54 (taps) against 36.
- conv3 32->64 k3 on 10x10: input gradient 10 (col2im) + 27 for max-pool's backward after it (a C kernel that
  materializes each reshaped, padded view of the four pooling terms in turn) against 7; weight gradient 12
  against 7; forward 10 against 6.
- conv4 64->64 k3 on 8x8: input gradient 18-21 (col2im) against 6; weight gradient 7 against 8; forward 7 against 6.
- conv1 1->32 k5: forward 6-8 against 18, weight gradient 6 against 24 (torch's small-channel path is slow here).
At batch 512 the same kernels grow faster than the batch: conv2's input gradient 340-600 ms and max-pool's
backward 400 ms (their whole arrays leave the cache). So what is left is the input gradient (col2im: the column
gradient is 25x the input for a 5x5 kernel, added back window by window) and max-pool's backward; the next
steps are a col2im by taps (one gemm per kernel row into a scratch 5x the input, then kw adds instead of 25)
and rendering chains of views of a computed value without materializing each.
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODES = ("forward", "forward+backward", "step")


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there while the file runs
    spec.loader.exec_module(module)
    return module


def _data(model: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (batch, 1, 28, 28) if model == "mnist" else (batch, 64)
    return rng.random(shape, dtype=np.float32) * 255, rng.integers(0, 10, batch).astype(np.int32)


def atensor_modes(model: str, batch: int) -> dict[str, Callable[[], Any]]:
    """The three jitted calls of atensor, each returning something to wait on."""
    import atensor
    from atensor import Context, Tensor, nn
    Tensor.manual_seed(0)
    net = _load("bm", ROOT / "examples" / "beautiful_mnist.py").Model() if model == "mnist" \
        else _load("train_example", ROOT / "examples" / "train.py").ConvNet()
    params = nn.state.get_parameters(net)
    opt = nn.optim.Adam(params)
    x_np, y_np = _data(model, batch)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()

    @atensor.jit
    @Context(TRAINING=1)
    def forward(x: Tensor) -> Tensor:
        return net(x)

    # the gradients land in buffers kept across calls, as PyTorch's `.grad`s do (returning them as
    # results instead makes every replay allocate fresh result buffers: measured 2x this mode's time)
    kept = [Tensor.zeros(*p.shape).contiguous().realize() for p in opt.params]

    @atensor.jit
    @Context(TRAINING=1)
    def backward(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = net(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*[k.assign(p.grad) for k, p in zip(kept, opt.params)])

    @atensor.jit
    @Context(TRAINING=1)
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = net(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    def wait(result: Any) -> None:
        for t in result if isinstance(result, list) else [result]:
            t.wait()
    return {"forward": lambda: wait(forward(x)), "forward+backward": lambda: wait(backward(x, y)),
            "step": lambda: wait(step(x, y))}


def torch_modes(model: str, batch: int) -> dict[str, Callable[[], Any]]:
    """The same layers in PyTorch (eager, training mode), the same three calls."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    if model == "mnist":
        net = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32),
                            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                            nn.BatchNorm2d(64), nn.MaxPool2d(2), nn.Flatten(1), nn.Linear(576, 10))
    else:
        net = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(1),
                            nn.Linear(512, 10))
    net.train()
    opt = torch.optim.Adam(net.parameters())
    x_np, y_np = _data(model, batch)
    x, y = torch.tensor(x_np), torch.tensor(y_np).long()
    loss_fn = torch.nn.functional.cross_entropy

    def forward() -> None:
        with torch.no_grad():
            net(x)

    def backward() -> None:
        opt.zero_grad()
        loss_fn(net(x), y).backward()

    def step() -> None:
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    return {"forward": forward, "forward+backward": backward, "step": step}


def tinygrad_modes(model: str, batch: int) -> dict[str, Callable[[], Any]]:
    """beautiful_mnist's model in tinygrad on its CPU device, TinyJit-ed (the mnist model only)."""
    if model != "mnist":
        raise RuntimeError("only the beautiful_mnist model is run in tinygrad")
    from tinygrad import Context, Tensor, TinyJit, nn
    bm = _load("bm_tiny", ROOT / "examples" / "beautiful_mnist.py")
    net = bm.Model.__new__(bm.Model)
    net.layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32),
                  Tensor.max_pool2d, nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu,
                  nn.BatchNorm(64), Tensor.max_pool2d, lambda t: t.flatten(1), nn.Linear(576, 10)]
    opt = nn.optim.Adam(nn.state.get_parameters(net))
    x_np, y_np = _data(model, batch)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()

    @TinyJit
    def forward(x: Tensor) -> Tensor:
        with Context(TRAINING=1):
            return x.sequential(net.layers).realize()

    @TinyJit
    def backward(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = x.sequential(net.layers).sparse_categorical_crossentropy(y).backward()
            return loss.realize(*[p.grad for p in opt.params])

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = x.sequential(net.layers).sparse_categorical_crossentropy(y).backward()
            return loss.realize(*opt.schedule_step())
    return {"forward": lambda: forward(x).numpy(), "forward+backward": lambda: backward(x, y).numpy(),
            "step": lambda: step(x, y).numpy()}


PEERS = {"atensor": atensor_modes, "torch": torch_modes, "tinygrad": tinygrad_modes}
SKIP = {("cnn", "tinygrad")}  # the flagship's model is atensor's own: compared with PyTorch only


def run(rounds: int, batches: tuple[int, ...] = (512, 128), calls: int = 2) -> tuple[list[list], dict]:
    """Table rows and the JSON results: per model, batch, mode and peer, the median over `rounds`
    alternating rounds of the per-call wall and CPU seconds (each round times `calls` calls)."""
    rows: list[list] = []
    results: dict[str, Any] = {}
    for model in ("mnist", "cnn"):
        for batch in batches:
            runs: dict[str, dict[str, Callable]] = {}
            for peer, make in PEERS.items():
                if (model, peer) in SKIP:
                    continue
                try:
                    modes = make(model, batch)
                    for fn in modes.values():  # capture, compile and warm up, not timed
                        for _ in range(4):
                            fn()
                    runs[peer] = modes
                except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                    results.setdefault(f"{model} b{batch}", {})[peer] = f"failed: {type(exc).__name__}: {exc}"
                    print(f"{model} b{batch}: {peer} failed: {type(exc).__name__}: {str(exc)[:200]}",
                          file=sys.stderr)
            times = {p: {m: [] for m in MODES} for p in runs}
            for _ in range(rounds):
                for peer, modes in runs.items():
                    for mode, fn in modes.items():
                        wall, cpu = time.perf_counter(), time.process_time()
                        for _ in range(calls):
                            fn()
                        times[peer][mode].append(((time.perf_counter() - wall) / calls,
                                                  (time.process_time() - cpu) / calls))
            entry = results.setdefault(f"{model} b{batch}", {})
            for peer, failed in entry.items():  # a peer that could not run says why in the table too
                if isinstance(failed, str):
                    why = "no clang on PATH (its CPU device compiles with it)" if "'clang'" in failed else failed[:60]
                    rows.append([f"{model} b{batch}", "all", peer, "-", "-", "missing", why])
            for mode in MODES:
                ref = times.get("torch", {}).get(mode)
                ref_wall = statistics.median(t[0] for t in ref) if ref else None
                ref_cpu = statistics.median(t[1] for t in ref) if ref else None
                for peer in runs:
                    got = times[peer][mode]
                    wall, cpu = statistics.median(t[0] for t in got), statistics.median(t[1] for t in got)
                    entry.setdefault(peer, {})[mode] = {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3,
                                                        "wall_range_ms": [min(t[0] for t in got) * 1e3,
                                                                          max(t[0] for t in got) * 1e3]}
                    rows.append([f"{model} b{batch}", mode, peer, wall * 1e3, cpu * 1e3,
                                 f"{wall / ref_wall:.2f}x" if ref_wall else "-",
                                 f"{cpu / ref_cpu:.2f}x" if ref_cpu else "-"])
    return rows, results
