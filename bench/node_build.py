"""What building one graph node costs: `y = x + 1` (nothing realized), `x * y`, relu, sum, a
reshape, a transpose and a matmul, and the flagship's whole eager step graph (forward, backward,
Adam), against PyTorch's eager op on the same shapes (its Python side plus a tiny kernel: the
closest peer, since atensor computes nothing here).

    python bench/node_build.py [--blocks 15] [--per-block 200]

Each op is timed on `--per-block` distinct operands built before the timer starts (atensor interns
nodes: the same op on the same operand is a table lookup, not a build), in main-thread CPU time
(time.thread_time: other processes on a shared machine do not count), the best of `--blocks`
blocks; the operands and results of a block die before the next, so every block builds afresh.
Issue 35's target: at most 5 us per elementwise op. Writes bench/results/node_build.json.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import table, write_results  # noqa: E402

SHAPE = (16, 16)


def _ops(lib: str) -> dict[str, Callable[[Any, Any], Any]]:
    """op name -> fn(x, w) on operands of SHAPE (w: a second operand of the same shape)."""
    relu = (lambda x, w: x.relu()) if lib == "atensor" else (lambda x, w: x.relu())
    return {
        "x + 1": lambda x, w: x + 1,
        "x * w": lambda x, w: x * w,
        "x.relu()": relu,
        "x.sum()": lambda x, w: x.sum(),
        "x.sum(axis=1)": lambda x, w: x.sum(axis=1),
        "x.reshape(256)": lambda x, w: x.reshape(256),
        "x.T": lambda x, w: x.T,
        "x @ w": lambda x, w: x @ w,
    }


def time_ops(lib: str, blocks: int, per_block: int) -> dict[str, float]:
    """Microseconds of main-thread CPU per op (best block) for each op of `_ops`."""
    if lib == "atensor":
        import numpy as np
        from atensor import Tensor
        base = Tensor(np.ones(SHAPE, np.float32))
        w = Tensor(np.ones(SHAPE, np.float32))
        make = lambda k: base + float(k)  # noqa: E731 - a distinct lazy operand per k
    else:
        import torch
        torch.set_num_threads(1)
        base, w = torch.ones(SHAPE), torch.ones(SHAPE)
        make = lambda k: base + float(k)  # noqa: E731
    out: dict[str, float] = {}
    for name, fn in _ops(lib).items():
        best = float("inf")
        for _ in range(blocks):
            operands = [make(k) for k in range(per_block)]
            gc.collect()
            start = time.thread_time_ns()
            results = [fn(x, w) for x in operands]
            best = min(best, (time.thread_time_ns() - start) / per_block / 1e3)
            del results, operands
        out[name] = best
    return out


def flagship_graph(blocks: int) -> dict[str, float]:
    """Milliseconds of main-thread CPU (best block of 5 steps) to build the flagship's eager step graph
    (examples/train.py's MLP, batch 256, fused Adam) without realizing it, per phase; one realized step
    between blocks keeps the parameters' versions moving as a training loop's do."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import train
    import trio
    from atensor import Tensor, nn
    from atensor.nn import optim
    from train_step import _data
    x_np, y_np = _data(256)
    Tensor.manual_seed(0)
    net = train.MLP()
    params = nn.get_parameters(net)
    opt = optim.Adam(params, lr=1e-3, fused=True)
    best = {"forward": float("inf"), "backward": float("inf"), "optimizer": float("inf")}

    async def loop() -> None:
        await Tensor.realize(*params)
        with Tensor.train():
            for _ in range(blocks):
                spent = dict.fromkeys(best, 0)
                for _ in range(5):
                    x, y = Tensor(x_np), Tensor(y_np)
                    t0 = time.thread_time_ns()
                    loss = nn.cross_entropy(net(x), y, reduction="sum") / 256
                    t1 = time.thread_time_ns()
                    opt.zero_grad()
                    loss.backward()
                    t2 = time.thread_time_ns()
                    tensors = [loss, *opt.schedule_step()]
                    t3 = time.thread_time_ns()
                    spent["forward"] += t1 - t0
                    spent["backward"] += t2 - t1
                    spent["optimizer"] += t3 - t2
                    await tensors[0].realize(*tensors[1:])
                for key in best:
                    best[key] = min(best[key], spent[key] / 5 / 1e6)
    trio.run(loop)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--per-block", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print only (for A/B rounds against another tree)")
    args = parser.parse_args()
    ours = time_ops("atensor", args.blocks, args.per_block)
    try:
        torch_us = time_ops("torch", args.blocks, args.per_block)
    except ImportError:
        torch_us = {}
    rows = [(name, ours[name], torch_us.get(name, float("nan")),
             ours[name] / torch_us[name] if name in torch_us else float("nan")) for name in ours]
    print(table(f"node build, us of main-thread CPU per op (best of {args.blocks} blocks of {args.per_block}), "
                f"shape {SHAPE}", ["op", "atensor", "torch eager", "ratio"], rows))
    step = flagship_graph(max(3, args.blocks // 3))
    print(table("the flagship's eager step graph, ms of main-thread CPU per step (best block of 5)",
                ["phase", "atensor"], list(step.items()) + [("total", sum(step.values()))]))
    if not args.no_write:
        write_results("node_build", {"ops_us": ours, "torch_us": torch_us, "flagship_graph_ms": step,
                                     "shape": list(SHAPE), "blocks": args.blocks, "per_block": args.per_block,
                                     "load": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
