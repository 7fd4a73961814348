"""A profiled data-parallel training step under mpiexec: does a gradient bucket's allreduce across
processes run while the backward of earlier layers still computes?

    mpiexec -n 2 python tests/dist/overlap.py --out spans.json [--trace trace.json] [--figure]

An MLP of four 256-wide layers (each weight's gradient 256 KiB) on 128 rows per rank, SGD with one
gradient per parameter, the gradients allreduced across processes with a bucket cap of one weight's
gradient (`--bucket-bytes`, the setting ATENSOR_BUCKET_BYTES): the last layer's gradient is a bucket
of its own, ready before the backward reaches the first layer. Two warm-up steps, then one step inside `atensor.profile()`.

Each rank finds, in its own spans, the net commands (queue "net") and the compute queue's kernels,
and writes (rank 0, `--out`, JSON) per rank: every net span and every kernel span as (task id, name,
start, end, deps), and the overlaps: pairs of a net span and a kernel span that overlap in time, the
kernel among the producers of another net command but not of this one: the backward of a later
bucket, not one this bucket waited for (nor the optimizer's update after it). `--trace` writes the merged trace of both ranks (dist/profile.py) for
`python -m atensor.profiler` or the HTML timeline; `--figure` prints the step as text (`figure`).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import trio

import atensor
from atensor import Tensor, dist, nn
from atensor.dist import profile as dist_profile
from atensor.nn import optim

WIDTH, LAYERS, ROWS = 256, 4, 128


class Net:
    def __init__(self) -> None:
        self.layers = [nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


def overlaps(spans: list[Any]) -> dict:
    """This rank's net spans, compute kernels and the (net, kernel) pairs that overlap in time where the
    kernel is a producer (transitively, over the profiled tasks) of another net command, not of this one."""
    by_id = {s.task_id: s for s in spans}

    def producers(span: Any) -> set[int]:
        seen, todo = set(), list(span.deps)
        while todo:
            tid = todo.pop()
            if tid not in seen:
                seen.add(tid)
                if tid in by_id:
                    todo.extend(by_id[tid].deps)
        return seen
    nets = [s for s in spans if s.queue == "net"]
    kernels = [s for s in spans if s.queue == "compute" and s.kind == "kernel"]
    feeds = {n.task_id: producers(n) for n in nets}
    # a later bucket's backward: a kernel some other net command waited for, this one did not
    pairs = [(n.task_id, k.task_id) for n in nets for k in kernels
             if max(n.start_ns, k.start_ns) < min(n.end_ns, k.end_ns) and k.task_id not in feeds[n.task_id]
             and any(k.task_id in feeds[other] for other in feeds if other != n.task_id)]
    row = (lambda s: {"task": s.task_id, "name": s.name, "start_ns": s.start_ns, "end_ns": s.end_ns,
                      "deps": list(s.deps)})
    return {"nets": [row(s) for s in nets], "kernels": [row(s) for s in kernels], "overlaps": pairs}


def figure(merged: Any, width: int = 100) -> str:
    """The profiled step's backward and allreduces as text, one row per rank and queue, `width` columns
    from the backward's first kernel (the first one not every bucket waits for) to the last net
    command's end: on a net row, bucket k's command is the digit k (in the order the buckets started on
    that rank); on a compute row, a backward kernel is the digit of the first bucket that waits for it,
    "f" a kernel every bucket waits for (the forward, the loss), "-" one no bucket waits for (the
    optimizer's update)."""
    rows, spans = [], []
    for s in merged.spans:
        shift = merged.clock_offsets.get((s.device, s.queue), 0)
        spans.append(s._replace(start_ns=s.start_ns + shift, end_ns=s.end_ns + shift))
    by_id = {s.task_id: s for s in spans}
    nets = sorted((s for s in spans if s.queue == "net"), key=lambda s: (s.device, s.start_ns))
    bucket_of: dict[int, int] = {}
    waited: dict[int, int] = {}  # per task: how many buckets wait for it
    numbers: dict[str, int] = {}
    for n in nets:  # a kernel's digit: the first bucket (by start) that waits for it
        number = numbers[n.device] = numbers.get(n.device, -1) + 1
        todo, seen = list(n.deps), set()
        while todo:
            tid = todo.pop()
            if tid in by_id and tid not in seen:
                seen.add(tid)
                bucket_of.setdefault(tid, number)
                waited[tid] = waited.get(tid, 0) + 1
                todo.extend(by_id[tid].deps)
        bucket_of[n.task_id] = number
    every = {tid for tid, count in waited.items() if count == numbers[by_id[tid].device] + 1}
    backward = [s for s in spans if s.queue == "compute" and s.task_id in bucket_of and s.task_id not in every]
    start, end = min(s.start_ns for s in backward + nets), max(s.end_ns for s in nets)
    scale = (end - start) / width
    for device in sorted({s.device for s in nets}):
        for queue in ("compute", "net"):
            line = ["."] * width
            for s in spans:
                if s.device != device or s.queue != queue or s.end_ns < start or s.start_ns > end:
                    continue
                mark = "f" if s.task_id in every else \
                    str(bucket_of[s.task_id] % 10) if s.task_id in bucket_of else "-"
                first = int((max(s.start_ns, start) - start) / scale)
                for col in range(first, min(width, max(first + 1, int((s.end_ns - start) / scale)))):
                    line[col] = mark
            rows.append(f"{device + '/' + queue:20s} {''.join(line)}")
    return f"{(end - start) / 1e6:.1f} ms, {scale / 1e3:.0f} us a column\n" + "\n".join(rows)


async def run(args: argparse.Namespace) -> None:
    world = dist.init(("CPU:0",))
    Tensor.manual_seed(0)
    net = Net()
    params = nn.get_parameters(net)
    await Tensor.realize(*params)
    opt = optim.SGD(params, lr=0.01)
    rng = np.random.default_rng(world.rank)
    x = Tensor(rng.standard_normal((ROWS, WIDTH)).astype(np.float32))
    y = Tensor(rng.integers(0, WIDTH, ROWS).astype(np.int32))

    async def step() -> Tensor:
        loss = nn.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        dist.allreduce_gradients(opt.targets)
        await opt.step(loss)
        return loss
    with atensor.Context(allreduce_bucket_bytes=args.bucket_bytes):
        for _ in range(2):
            await step()
        world.barrier()
        with atensor.profile() as prof:
            await step()
    found = overlaps(prof.spans)
    every = world.gather(found)
    merged = dist_profile.merged(world, prof)
    if world.is_root:
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"ranks": every}, f)
        if args.trace:
            merged.export(args.trace)
        if args.figure:
            print(figure(merged))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--trace")
    parser.add_argument("--figure", action="store_true", help="print the step as text (rank 0)")
    parser.add_argument("--bucket-bytes", type=int, default=WIDTH * WIDTH * 4,
                        help="the bucket cap (default: one weight's gradient)")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
