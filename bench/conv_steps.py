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

Where the rest goes (measured 2026-12-03, one thread, CPU time, a machine at load 8-11; bench/results/conv.json
holds the step table): the issue's target is at most 1.2x torch, and it is not met. The Adam step of beautiful_mnist
is 2.38x torch at batch 512 and 1.84x at 128; the flagship's cnn step is 1.75x and 1.25x. A profile of the b128
mnist step (atensor.profile over two replays) puts 52% of kernel time in the second convolution
(r_sum_128x1x32x32x5x5x20x20: its forward and its two gradients) and 29% in the third, with the bias/batchnorm
reductions at 2.5% and every elementwise kernel under 0.1% each. Layer by layer, against torch's conv2d
(conv.py's harness, batch 128, forward / forward+backward with the input's gradient):
conv2 32->32 k5 on 24x24 1.45x / 1.50x, conv3 32->64 k3 on 10x10 1.21x / 1.24x, conv4 64->64 k3 on 8x8
1.33x / 2.20x, conv1 1->32 k5 1.92x / 0.57x, the cnn's 1->16 k3 on 8x8 5.4x / 3.5x. Those sum to 1.34x of
torch for the mnist model's convolutions; the rest of the step (batchnorm, pooling, the loss, Adam) is its
other ~100 ms at b128. So the gap is in the convolution lowering (window_gemm.py / contraction.py's copies
around the gemms), and for the small-channel layers in per-kernel overhead. A direct convolution for
small channel counts, and a backward that reuses the forward's unfolded windows, are the next steps to
measure.
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
