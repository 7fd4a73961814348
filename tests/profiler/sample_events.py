# Event lists for the profiler's tests, built by hand or by a tiny simulated run.
#
# The simulated run is a data-parallel training step on two devices, each with a compute and a
# copy queue: forward and backward kernels, a chunked ring allreduce of the gradients (copies on
# the copy queues, reduce kernels on the compute queues), then the optimizer update. Tasks start
# when their queue is free and their deps are done (plus a signal latency), like the real
# executor; a queue that had to wait on another queue records a "wait" span. Host spans overlap
# the way concurrent trio tasks make them overlap. Deterministic for a given seed.
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from atensor.profiler import HostSpan, MemoryEvent, Span

SIGNAL_LATENCY_NS = 2_000


@dataclass
class SimulatedRun:
    """What `simulate_step` produced, plus the facts tests check the exports against."""

    spans: list[Span] = field(default_factory=list)
    host_spans: list[HostSpan] = field(default_factory=list)
    memory: list[MemoryEvent] = field(default_factory=list)
    clock_offsets: dict[tuple[str, str], int] = field(default_factory=dict)


def simulate_step(
    seed: int = 0, devices: int = 2, layers: int = 3, chunks: int = 2, queue_clock_skew: bool = False
) -> SimulatedRun:
    """A two-device training step as the core would record it (see the module comment).

    With `queue_clock_skew`, every queue's clock is offset from the host clock and the matching
    `clock_offsets` are returned, as the core would report them with set_clock_offset.
    """
    rng = random.Random(seed)
    run = SimulatedRun()
    names = [f"CPU:{d}" for d in range(devices)]
    free: dict[tuple[str, str], int] = {}
    done: dict[int, tuple[int, tuple[str, str]]] = {}
    offsets = {}
    for device in names:
        for queue in ("compute", "copy"):
            offsets[(device, queue)] = rng.randrange(-5_000_000, 5_000_000) if queue_clock_skew else 0
            free[(device, queue)] = 50_000
    run.clock_offsets = {k: v for k, v in offsets.items() if queue_clock_skew}
    ids = itertools.count(1)

    def task(device: str, queue: str, name: str, kind: str, duration: int, deps: tuple[int, ...] = (),
             nbytes: int = 0, flops: int = 0) -> int:
        key = (device, queue)
        ready = max([free[key]] + [done[d][0] + SIGNAL_LATENCY_NS for d in deps if done[d][1] != key])
        ready = max(ready, max([done[d][0] for d in deps], default=0))
        task_id = next(ids)
        offset = offsets[key]
        if ready > free[key] + SIGNAL_LATENCY_NS and deps:
            waited_on = max(deps, key=lambda d: done[d][0])
            run.spans.append(Span(device, queue, next(ids), "wait", "wait",
                                  free[key] - offset, ready - offset, deps=(waited_on,)))
        start = ready
        end = start + duration
        run.spans.append(Span(device, queue, task_id, name, kind, start - offset, end - offset,
                              nbytes, flops, deps))
        free[key] = end
        done[task_id] = (end, key)
        return task_id

    n = 256
    last: dict[str, int] = {}
    for device in names:
        upload = task(device, "copy", "copy host->" + device, "copy", rng.randrange(20_000, 40_000),
                      nbytes=4 * n * n)
        last[device] = upload
    for _ in range(layers):
        for device in names:
            mm = task(device, "compute", f"matmul_{n}x{n}", "kernel", rng.randrange(60_000, 90_000),
                      (last[device],), nbytes=12 * n * n, flops=2 * n**3)
            last[device] = task(device, "compute", "relu", "kernel", rng.randrange(5_000, 9_000), (mm,),
                                nbytes=8 * n * n, flops=n * n)
    grads: dict[str, list[int]] = {d: [] for d in names}
    for _ in range(layers):
        for device in names:
            g = task(device, "compute", f"matmul_{n}x{n}_grad", "kernel", rng.randrange(70_000, 100_000),
                     (last[device],), nbytes=12 * n * n, flops=2 * n**3)
            last[device] = g
            grads[device].append(g)
    # Ring allreduce of the last gradient, in chunks: send to the right neighbour, reduce there.
    for chunk in range(chunks):
        for _ in range(devices - 1):
            for i, device in enumerate(names):
                right = names[(i + 1) % devices]
                sent = task(device, "copy", f"ring send c{chunk}", "copy", rng.randrange(15_000, 25_000),
                            (last[device],), nbytes=4 * n * n // chunks)
                last[right] = task(right, "compute", f"ring reduce c{chunk}", "allreduce",
                                   rng.randrange(6_000, 10_000), (sent, last[right]),
                                   nbytes=8 * n * n // chunks, flops=n * n // chunks)
    for device in names:
        last[device] = task(device, "compute", "sgd_update", "kernel", rng.randrange(20_000, 30_000),
                            (last[device],), nbytes=12 * n * n, flops=2 * n * n)

    end = max(free.values())
    run.host_spans += [
        HostSpan("schedule step", "schedule", 0, 30_000),
        HostSpan("compile matmul", "compile", 5_000, 25_000),
        HostSpan("submit 2 devices", "submit", 30_000, 48_000),
        HostSpan("await loss", "await", 48_000, end + 5_000),
        HostSpan("schedule logging", "schedule", 60_000, 90_000),   # another trio task
        HostSpan("await metrics", "await", 90_000, end + 3_000),
    ]
    for device in names:
        in_use = 0
        for ts in range(0, end, max(1, end // 12)):
            in_use += rng.randrange(0, 3) * (n * n * 4)
            run.memory.append(MemoryEvent(device, ts, in_use))
    return run


def hand_built() -> list[Span]:
    """Five spans on three queues with answers worked out by hand in test_summary.py."""
    return [
        Span("CPU:0", "compute", 1, "matmul", "kernel", 0, 100, bytes=300, flops=1000),
        Span("CPU:0", "copy", 2, "copy", "copy", 100, 140, bytes=4096, deps=(1,)),
        Span("CPU:0", "compute", 3, "matmul", "kernel", 150, 250, bytes=300, flops=1000, deps=(2,)),
        Span("CPU:1", "compute", 4, "add", "kernel", 0, 50),
        Span("CPU:1", "compute", 5, "add", "kernel", 260, 300, deps=(3, 4)),
    ]


def long_run(min_spans: int = 10_000, seed: int = 0) -> SimulatedRun:
    """Simulated steps one after another until there are at least `min_spans` device spans (task
    ids kept unique, each step's host spans and memory shifted with it): a trace whose zoomed-out
    view has far more spans than pixels."""
    run = SimulatedRun()
    offset, next_id, step = 0, 0, 0
    while len(run.spans) < min_spans:
        one = simulate_step(seed=seed + step)
        ids = {s.task_id: s.task_id + next_id for s in one.spans}
        for s in one.spans:
            run.spans.append(s._replace(task_id=ids[s.task_id], start_ns=s.start_ns + offset,
                                        end_ns=s.end_ns + offset,
                                        deps=tuple(ids.get(d, d + next_id) for d in s.deps)))
        run.host_spans += [HostSpan(h.name, h.category, h.start_ns + offset, h.end_ns + offset, h.track)
                           for h in one.host_spans]
        run.memory += [MemoryEvent(m.device, m.ts_ns + offset, m.bytes_in_use) for m in one.memory]
        end = max(s.end_ns for s in one.spans)
        offset += end + 10_000
        next_id += max(ids) + 1
        step += 1
    return run
