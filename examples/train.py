"""Train a classifier on scikit-learn's 8x8 digits, data parallel over N devices, in a trio program.

    python examples/train.py                      # 2 devices (CPU:0, CPU:1): ~99% held-out, < 1 min
    python examples/train.py --devices 1 --model cnn --epochs 10
    python examples/train.py --profile trace.json --save model.safetensors
    python examples/train.py --epochs 1 --max-steps 20 --losses losses.json

The dataset ships inside scikit-learn (1797 images, nothing is downloaded). Data parallel, as
PyTorch's DDP does it: the weights are replicated on every device (`shard_(devices)`), each batch
is split on axis 0 (`shard(devices, axis=0)`), every device runs the forward and the backward of
its part, and the gradient of each replicated weight is the sum of the devices' gradients: an
allreduce, which atensor's autograd puts into the graph and the scheduler lowers to copies and
reduce kernels that overlap the rest of the backward. The whole step (forward, backward,
allreduces, Adam update) is one task graph and one `await`, and the event loop stays free. The step
is an `atensor.jit` function: its task graph is captured once and replayed on every later batch, so
Python builds and schedules it only in the first steps (`--no-jit` builds it every step).

The same seed gives the same losses on 1 device and on N (tests/examples/test_train.py checks it): the
initialization comes from atensor's counter-based generator, and the batch order from numpy's.

`--profile trace.json` writes a Perfetto trace (open it at ui.perfetto.dev) and `trace.html`, a
self-contained timeline; `--save model.safetensors` writes the weights in a file PyTorch opens;
`--losses losses.json` writes the loss of every step.

More than one process, unchanged (README, "More than one process or machine"):

    mpiexec -n 2 python examples/train.py --devices 1     # 2 ranks x 1 device

Each rank takes its rows of every global batch and splits them over its own devices; the gradient
is summed over the rank's devices and then across ranks, as tasks of the same step
(atensor.dist.allreduce_gradients: an allreduce on each device's `net` queue). Rank 0 prints, saves
and writes the losses; every rank computes. The same seed and global batch give the same losses for
any split of the batch over ranks and devices, within float32 rounding.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import trio

import atensor
from atensor import Tensor, dist, nn
from atensor.dist import profile as dist_profile
from atensor.nn import optim


# ---- data ------------------------------------------------------------------------------------------
@dataclass
class Digits:
    """The digits split into training and held-out images (float32 in [0, 1]) and labels (int32)."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> Digits:
    """scikit-learn's bundled digits, shuffled with `seed`, the last `test_fraction` held out."""
    from sklearn.datasets import load_digits as sklearn_digits
    data = sklearn_digits()
    x = (data.images / 16.0).astype(np.float32)          # (1797, 8, 8)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(round(len(x) * test_fraction))
    return Digits(x[:-n_test], y[:-n_test], x[-n_test:], y[-n_test:])


# ---- models ----------------------------------------------------------------------------------------
class MLP:
    """64 -> 256 -> 128 -> 10 with ReLU."""

    def __init__(self) -> None:
        self.layers = [nn.Linear(64, 256), nn.Linear(256, 128), nn.Linear(128, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], 64)
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


class ConvNet:
    """conv 3x3 (16) -> conv 3x3 stride 2 (32) -> linear 512 -> 10, ReLU between."""

    def __init__(self) -> None:
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.head = nn.Linear(32 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], 1, 8, 8)
        x = self.conv1(x).relu()
        x = self.conv2(x).relu()
        return self.head(x.reshape(x.shape[0], 32 * 4 * 4))


MODELS = {"mlp": MLP, "cnn": ConvNet}


# ---- training --------------------------------------------------------------------------------------
@dataclass
class Result:
    """What a run produced: the loss of every step, the held-out accuracy and the time taken."""
    losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0
    seconds: float = 0.0
    samples_per_second: float = 0.0


def _on(x: np.ndarray, devices: tuple[str, ...]) -> Tensor:
    """A batch on the devices: split on axis 0 when there are several, each part made on its device
    (as `Tensor(x).shard(devices, axis=0)` would compute, without the copies)."""
    if len(devices) == 1:
        return Tensor(x, device=devices[0])
    parts = np.array_split(x, len(devices))
    return Tensor.from_shards([Tensor(part, device=d) for part, d in zip(parts, devices)], axis=0)


class Progress:
    """A one-line progress bar on stderr: epoch, steps, loss, throughput."""

    def __init__(self, total_steps: int, enabled: bool = True):
        self.total, self.enabled, self.start = total_steps, enabled and total_steps > 0, time.perf_counter()

    def update(self, step: int, epoch: int, epochs: int, loss: float, samples: int) -> None:
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        width = 24
        filled = int(width * step / self.total)
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\repoch {epoch + 1}/{epochs} [{bar}] {step}/{self.total} loss {loss:.4f} "
                         f"{samples / elapsed:,.0f} samples/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


@dataclass
class QuietCollector:
    """The cyclic garbage collector's settings before `quiet_collector()`, to put back."""
    threshold: tuple[int, int, int]

    def restore(self) -> None:
        gc.set_threshold(*self.threshold)
        gc.unfreeze()


def quiet_collector(young: int = 10_000) -> QuietCollector:
    """Collections the training loop does not need, avoided. Measured on 300 eager 2-device steps (Zen 5):
    ~1 collection a step, 690-810 us of the main thread's CPU a step, none finding garbage; 4 us with:
    - what exists now (the modules, the data, the model) lives for the whole run: frozen, out of the
      full collections that otherwise traverse all of it every ~100 eager steps (24 ms each);
    - an eager step's graph keeps ~2,400 tracked objects alive until the next step replaces it, more
      than the default 700 new objects that start a young collection: the young threshold goes above
      it. The step makes no reference cycles (tests/engine/test_step_garbage.py), so nothing waits
      longer to be freed. `restore()` puts both back."""
    before = QuietCollector(gc.get_threshold())
    gc.freeze()
    gc.set_threshold(max(young, before.threshold[0]), *before.threshold[1:])
    return before


async def evaluate(model, x: np.ndarray, y: np.ndarray, devices: tuple[str, ...], batch: int = 512) -> float:
    """Accuracy on (x, y) in evaluation mode: each process takes its rows, each batch of them split
    over its devices; the counts are summed over the processes."""
    world = dist.world()
    mine = world.shard_rows(len(x))
    x, y = x[mine.start:mine.stop], y[mine.start:mine.stop]
    correct = 0
    with Tensor.test():
        for i in range(0, len(x), batch):
            pred = model(_on(x[i:i + batch], devices)).argmax(axis=1)
            await pred.realize()
            correct += int((pred.numpy() == y[i:i + batch]).sum())
    return world.host_sum(correct) / world.host_sum(len(x))


async def train(devices: int = 2, epochs: int = 12, batch_size: int = 128, lr: float = 0.01,
                model: str = "mlp", seed: int = 0, max_steps: Optional[int] = None,
                profile: Optional[str] = None, save: Optional[str] = None, progress: bool = True,
                data: Optional[Digits] = None, jit: bool = True, device: str = "CPU") -> Result:
    """Trains `model` on the digits on `devices` CPU devices (of each process, when an MPI launcher
    started several); returns the losses and the accuracy. `jit=False` builds and schedules every
    step's graph instead of replaying the captured one. `device`: the kind of the devices, CPU or CL
    (OpenCL: CL:0, CL:1, ...)."""
    names = tuple(f"{device}:{k}" for k in range(devices))
    world = dist.init(names)
    data = data or load_digits(seed)
    if batch_size % (devices * world.size):
        raise ValueError(f"--batch ({batch_size}) must be a multiple of --devices ({devices}) times the "
                         f"processes ({world.size})")
    Tensor.manual_seed(seed)
    made_on, atensor.settings.default_device = atensor.settings.default_device, names[0]
    try:  # the weights are made on the first device (CL:0 for --device CL), then replicated on the rest
        net = MODELS[model]()
    finally:
        atensor.settings.default_device = made_on
    params = nn.get_parameters(net)
    # once, one collective: every process builds the same model with the same settings
    world.check_same(parameters=[(tuple(p.shape), p.dtype.name) for p in params],
                     settings=(model, batch_size, epochs, lr, seed, max_steps, jit))
    if devices > 1:
        for p in params:  # replicate every weight (and buffer) on every device
            p.shard_(names)
    await Tensor.realize(*params)
    steps_per_epoch = len(data.x_train) // batch_size
    total = steps_per_epoch * epochs if max_steps is None else min(max_steps, steps_per_epoch * epochs)
    opt = optim.Adam(params, lr=lr, fused=True)  # one flat buffer: one gradient, one allreduce
    schedule = optim.OneCycleLR(opt, max_lr=lr, total_steps=max(total, 2), pct_start=0.15)
    order_rng = np.random.default_rng(seed + 1)
    result = Result()
    bar = Progress(total, progress and world.is_root)
    profiler = atensor.profile() if profile else None
    start = time.perf_counter()
    step = 0
    if profiler is not None:
        profiler.__enter__()
    async def train_step(x: Tensor, y: Tensor) -> Tensor:
        if len(names) > 1:  # the batch arrives on the first device; each device takes its rows. In a
            # replay that is a memcpy per device inside the step's programs, cheaper than making the
            # shards' tensors in Python every step (as _on does for evaluation)
            x, y = x.shard(names, axis=0), y.shard(names, axis=0)
        # the mean over the global batch, with a constant divisor: its gradient is then a constant that
        # every device makes for itself (a data-dependent divisor, as the default "mean" with
        # ignore_index has, would be computed on one device and sent)
        loss = nn.cross_entropy(net(x), y, reduction="sum") / batch_size
        opt.zero_grad()
        loss.backward()
        # across processes (when there are several): the sums over each process's devices are summed
        # over the processes too, by net tasks of this same graph; the reported loss likewise
        dist.allreduce_gradients(opt)
        loss = dist.allreduce(loss.detach())
        await opt.step(loss)  # forward, backward, allreduces and update: one task graph
        return loss

    # from the fourth step on, the step's captured task graphs are replayed: no graph building
    run_step = atensor.jit(train_step) if jit else train_step
    collector = quiet_collector()
    try:
        with Tensor.train():
            for epoch in range(epochs):
                order = order_rng.permutation(len(data.x_train))
                for i in range(steps_per_epoch):
                    if step >= total:
                        break
                    idx = order[i * batch_size:(i + 1) * batch_size]
                    rows = world.shard_rows(batch_size)  # this process's part of the global batch
                    idx = idx[rows.start:rows.stop]
                    loss = await run_step(Tensor(data.x_train[idx], device=names[0]),
                                          Tensor(data.y_train[idx], device=names[0]))
                    schedule.step()
                    step += 1
                    result.losses.append(loss.item())
                    bar.update(step, epoch, epochs, result.losses[-1], step * batch_size)
    finally:
        collector.restore()
        if profiler is not None:
            profiler.__exit__(None, None, None)
        bar.close()
    result.seconds = time.perf_counter() - start
    result.samples_per_second = step * batch_size / max(result.seconds, 1e-9)
    result.accuracy = await evaluate(net, data.x_test, data.y_test, names)
    if profiler is not None and profile:
        merged = dist_profile.merged(world, profiler)  # every rank's events, on rank 0's clock
        if merged is not None:
            trace = Path(profile)
            merged.export(trace)
            merged.export(trace.with_suffix(".html"))
    if save:
        state = nn.get_state_dict(net)
        await Tensor.realize(*state.values())
        if world.is_root:  # every rank holds the same weights
            nn.safe_save(state, save)
    return result


def main(argv: Optional[list[str]] = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2, help="number of CPU:k devices (data parallel)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=128, help="global batch size (split over the devices)")
    parser.add_argument("--lr", type=float, default=0.01, help="peak learning rate (Adam, one-cycle)")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", metavar="TRACE.json", help="write a Perfetto trace and an HTML timeline")
    parser.add_argument("--save", metavar="MODEL.safetensors", help="write the trained weights")
    parser.add_argument("--no-jit", action="store_true", help="build every step's graph (no capture/replay)")
    parser.add_argument("--losses", metavar="LOSSES.json", help="write the loss of every step (a JSON list)")
    parser.add_argument("--max-steps", type=int, help="stop after this many steps")
    parser.add_argument("--device", choices=("CPU", "CL"), default="CPU",
                        help="the kind of the devices: CPU, or CL for OpenCL (pip install 'atensor[opencl]')")
    args = parser.parse_args(argv)
    result = trio.run(lambda: train(args.devices, args.epochs, args.batch, args.lr, args.model, args.seed,
                                    max_steps=args.max_steps, profile=args.profile, save=args.save,
                                    jit=not args.no_jit, device=args.device))
    world = dist.world()
    if not world.is_root:
        return result
    if args.losses:
        Path(args.losses).write_text(json.dumps(result.losses))
    processes = f" x {world.size} processes" if world.size > 1 else ""
    print(f"{len(result.losses)} steps in {result.seconds:.1f} s "
          f"({result.samples_per_second:,.0f} samples/s) "
          f"on {args.devices} device(s){processes}; final loss {result.losses[-1]:.4f}; "
          f"held-out accuracy {100 * result.accuracy:.2f}%")
    if args.profile:
        print(f"profile: {args.profile} (Perfetto) and {Path(args.profile).with_suffix('.html')} (timeline)")
    if args.save:
        print(f"weights: {args.save}")
    return result


if __name__ == "__main__":
    main()
