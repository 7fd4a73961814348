"""Random draws: an eager draw realized alone, and a training step with dropout, eager and jitted.

    python bench/random_draws.py [--steps 30]

atensor: `Tensor.rand(n)` realized one at a time (each draw reads its seed and counter from a small
buffer of its own, so the schedule cache hits from the second draw); an MLP step (784-256-10, batch
64, dropout 0.2 after the hidden layer, SGD) eager and in `atensor.jit`, whose replays draw a fresh
mask each step. Peer in the same run: PyTorch CPU with the same number of threads (torch.rand, and
the same step with nn.functional.dropout). Times are medians of 5 rounds; lower is better.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor, nn  # noqa: E402


def _median_us(fn, count: int, rounds: int = 5) -> float:
    per = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            fn()
        per.append((time.perf_counter() - start) / count * 1e6)
    return statistics.median(per)


def atensor_draw(n: int, count: int) -> float:
    for _ in range(5):
        Tensor.rand(n).numpy()
    return _median_us(lambda: Tensor.rand(n).numpy(), count)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    return x, y


def atensor_step(jitted: bool, steps: int) -> float:
    Tensor.manual_seed(0)
    l1, l2 = nn.Linear(784, 256), nn.Linear(256, 10)
    opt = nn.optim.SGD(nn.state.get_parameters(l1) + nn.state.get_parameters(l2), lr=0.01)
    xs, ys = _batch()
    x, y = Tensor(xs), Tensor(ys)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = (l2(l1(x).relu().dropout(0.2)) - y).square().mean()
        loss.backward()
        opt.step()
        return loss

    run = atensor.jit(step) if jitted else step
    Tensor.training = True
    try:
        for _ in range(5):  # first call, capture, verify (and compile) when jitted
            run(x, y).item()
        result = _median_us(lambda: run(x, y).item(), steps)
    finally:
        Tensor.training = False
    if jitted:
        assert run.stats["captures"] == 1, run.stats
    return result


def torch_rows(n_small: int, n_big: int, count: int, steps: int) -> dict:
    try:
        import torch
    except ImportError:
        return {"note": "torch not installed"}
    torch.set_num_threads(2)
    out = {"threads": torch.get_num_threads()}
    for n in (n_small, n_big):
        out[f"rand_{n}_us"] = _median_us(lambda: torch.rand(n), count)
    torch.manual_seed(0)
    l1, l2 = torch.nn.Linear(784, 256), torch.nn.Linear(256, 10)
    opt = torch.optim.SGD(list(l1.parameters()) + list(l2.parameters()), lr=0.01)
    xs, ys = _batch()
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)

    def step() -> float:
        opt.zero_grad()
        loss = (l2(torch.nn.functional.dropout(l1(x).relu(), 0.2, training=True)) - y).square().mean()
        loss.backward()
        opt.step()
        return loss.item()
    for _ in range(5):
        step()
    out["dropout_step_us"] = _median_us(step, steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    small, big, count = 256, 1 << 20, 50
    results: dict = {"atensor": {}, "steps": args.steps}
    for n in (small, big):
        results["atensor"][f"rand_{n}_us"] = atensor_draw(n, count)
    results["atensor"]["dropout_step_eager_us"] = atensor_step(False, args.steps)
    results["atensor"]["dropout_step_jit_us"] = atensor_step(True, args.steps)
    peer = torch_rows(small, big, count, args.steps)
    results["torch"] = peer
    a = results["atensor"]

    def ratio(key: str, ours: float) -> str:
        return f"{ours / peer[key]:.2f}x" if key in peer else "-"
    rows = [("atensor", f"Tensor.rand({n}) realized", a[key], ratio(key, a[key]))
            for n in (small, big) for key in (f"rand_{n}_us",)]
    rows += [("atensor", f"MLP step with dropout, {how}", a[key], ratio("dropout_step_us", a[key]))
             for how, key in (("eager", "dropout_step_eager_us"), ("atensor.jit", "dropout_step_jit_us"))]
    if "note" in peer:
        rows.append(("torch", peer["note"], "-", "-"))
    else:
        rows += [("torch", f"torch.rand({small})", peer[f"rand_{small}_us"], "1x"),
                 ("torch", f"torch.rand({big})", peer[f"rand_{big}_us"], "1x"),
                 ("torch", "MLP step with dropout", peer["dropout_step_us"], "1x")]
    print(table("random draws (us; lower is better; ratio against torch CPU, same threads)",
                ["system", "workload", "us", "vs torch"], rows))
    print(f"\nwritten to {write_results('random_draws', results)}")


if __name__ == "__main__":
    main()
