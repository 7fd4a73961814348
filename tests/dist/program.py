"""A small data-parallel program the tests run under mpiexec and in one process, then compare.

    mpiexec -n 2 python tests/dist/program.py --devices 1 --out run.npz
    python tests/dist/program.py --devices 2 --out run.npz

A two-layer MLP, SGD (not fused: one gradient per parameter, so several allreduces share buckets),
a fixed global batch of 32 rows per step, jitted (steps from the fourth on are replays, their net
tasks included). Rank 0 writes the loss of every step, the gradients of every step and the final
weights to `--out` (npz). `--die-rank R --die-step S` kills rank R (SIGKILL) at step S; `--raise-rank`
raises there instead, `--hang-rank` sleeps there; `--wrong-shape-rank R` builds a wider hidden layer
on rank R (a start-up mismatch); `--net-stats FILE` writes, per net queue, how many commands it ran,
whether the net commands are C calls and which queues the replays ran as native programs.
With several devices per process it also allreduces a 256 KiB buffer through the hierarchical ring
(stored as "ring").
"""
from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any, Optional

import numpy as np
import trio

import atensor
from atensor import Tensor, dist, nn
from atensor.hcq.device import Device
from atensor.nn import optim

GLOBAL_BATCH = 32


class Net:
    def __init__(self, hidden: int) -> None:
        self.layers = [nn.Linear(8, hidden), nn.Linear(hidden, 4)]

    def __call__(self, x: Tensor) -> Tensor:
        return self.layers[1](self.layers[0](x).relu())


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32),
             rng.integers(0, 4, GLOBAL_BATCH).astype(np.int32)) for _ in range(steps)]


def on_devices(x: np.ndarray, names: tuple[str, ...]) -> Tensor:
    if len(names) == 1:
        return Tensor(x, device=names[0])
    parts = np.array_split(x, len(names))
    return Tensor.from_shards([Tensor(p, device=d) for p, d in zip(parts, names)], axis=0)


def first_replica(t: Tensor) -> np.ndarray:
    return (t.shards[0] if isinstance(t.device, tuple) else t).numpy()


def native_program_queues(jitted: Any) -> list[str]:
    """The queues ("CPU:0/net") that the jit's replays ran as one native program each (engine/plan.py)."""
    names = set()
    for captured in jitted._programs.values():
        for record in captured.records:
            plan = record.plans.get(True)
            if plan is not None:
                names.update(f"{plan.layout.queues[qi].device}/{plan.layout.queues[qi].kind}" for qi in plan.programs)
    return sorted(names)


async def run(args: argparse.Namespace) -> Optional[dict]:
    names = tuple(f"CPU:{k}" for k in range(args.devices))
    world = dist.init(names)
    Tensor.manual_seed(0)
    hidden = 16 + (8 if world.rank == args.wrong_shape_rank else 0)
    net = Net(hidden)
    params = nn.get_parameters(net)
    world.check_same(parameters=[(tuple(p.shape), p.dtype.name) for p in params])
    if len(names) > 1:
        for p in params:
            p.shard_(names)
    await Tensor.realize(*params)
    opt = optim.SGD(params, lr=0.1)

    async def step(x: Tensor, y: Tensor) -> tuple:
        loss = nn.cross_entropy(net(x), y, reduction="sum") / GLOBAL_BATCH
        opt.zero_grad()
        loss.backward()
        dist.allreduce_gradients(opt.targets)
        loss = dist.allreduce(loss.detach())
        grads = [p.grad for p in opt.targets]
        await opt.step(loss, *grads)
        return (loss, *grads)

    jitted = atensor.jit(step)
    losses, grads = [], []
    for i, (x, y) in enumerate(batches(args.steps)):
        if i == args.die_step and world.rank == args.die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == args.die_step and world.rank == args.hang_rank:
            time.sleep(3600)  # stops issuing collectives: the others' wait is bounded by ATENSOR_NET_TIMEOUT
        if i == args.die_step and world.rank == args.raise_rank:
            raise RuntimeError(f"rank {world.rank} fails on purpose at step {i}")
        rows = world.shard_rows(GLOBAL_BATCH)
        mine = slice(rows.start, rows.stop)
        out = await jitted(on_devices(x[mine], names), on_devices(y[mine], names))
        losses.append(first_replica(out[0]).item())
        grads.append([first_replica(g) for g in out[1:]])
    weights = [first_replica(p) for p in params]
    ring = None
    if len(names) > 1:  # a hierarchical ring across processes: a net task per device between its phases
        parts = [Tensor(np.arange(1 << 16, dtype=np.float32) * (1 + k + len(names) * world.rank), device=d)
                 for k, d in enumerate(names)]
        reduced = dist.allreduce(Tensor.allreduce(parts, algorithm="ring"))
        await reduced.realize()
        ring = np.stack([s.numpy() for s in reduced.shards])
    if args.net_stats:
        counts = {f"{d.name}/{q.kind}": q.commands_run for d in [Device.get(n) for n in names]
                  for q in d.queues if q.kind == "net"}
        with open(f"{args.net_stats}.{world.rank}", "w") as f:
            f.write(repr({"counts": counts, "jit": jitted.stats, "native": world.native is not None,
                          "programs": native_program_queues(jitted)}))
    if world.is_root and args.out:
        arrays = {"losses": np.array(losses)}
        for i, step_grads in enumerate(grads):
            for k, g in enumerate(step_grads):
                arrays[f"grad_{i}_{k}"] = g
        for k, w in enumerate(weights):
            arrays[f"weight_{k}"] = w
        if ring is not None:  # partial k of rank r is arange * (1 + k + K r): the sum over all of them
            arrays["ring"] = ring
        np.savez(args.out, **arrays)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out")
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--die-step", type=int, default=-1)
    parser.add_argument("--wrong-shape-rank", type=int, default=-1)
    parser.add_argument("--net-stats")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
