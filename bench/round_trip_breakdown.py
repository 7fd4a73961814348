"""Where the microseconds of the smallest async use go: `x = x + 1; await x.realize()` on 16 elements.

    python bench/round_trip_breakdown.py [--count 1000] [--loop trio|asyncio]

Runs the round trip from trio (or asyncio) on CPU and times, besides its three parts (building the node, the
`realize()` call, the `await`), each stage of the realize pipeline by wrapping its function with a
perf_counter_ns timer: medians per call, in microseconds. Stages nest (an indented row is part of
the row above it), and the wrappers add about 0.3 us each, so the stages sum to a little more than
the parts they are in. A stage this checkout does not have is left out (so the same command runs on
an older commit, for before/after tables). Writes bench/results/round_trip_breakdown.json.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import install_stage_timers, table, write_results  # noqa: E402

import trio  # noqa: E402

from atensor import Tensor  # noqa: E402

# (module, attribute path, label); a label's leading spaces show what it is part of
STAGES = [
    ("atensor.engine.realize", "_small", "  size check (plan inline or not)"),
    ("atensor.engine.realize", "_realize_part", "  output buffer + ASSIGN root"),
    ("atensor.sched.schedule", "schedule", "  schedule (cached)"),
    ("atensor.sched.schedule", "toposort", "    toposort"),
    ("atensor.sched.cache", "graph_key", "    graph key"),
    ("atensor.sched.cache", "walk_key", "    order + graph key (one walk)"),
    ("atensor.sched.cache", "Template.instantiate", "    instantiate template"),
    ("atensor.sched.cache", "Template.fill", "    fill the template's slots (kept plan)"),
    ("atensor.sched.schedule", "Schedule.commit", "  commit (versions, realized values)"),
    ("atensor.engine.plan", "Plan.__init__", "  Plan: lowering the graph"),
    ("atensor.engine.realize", "_lowered", "  the template's kept Plan (lookup)"),
    ("atensor.engine.plan", "Plan.submit", "  Plan.submit"),
    ("atensor.engine.plan", "Plan._runners", "    runners"),
    ("atensor.hcq.device", "Device.allocate", "      allocate output memory"),
    ("atensor.hcq.queue", "Queue.submit", "    hand the list to the queue"),
    ("atensor.hcq.queue", "Queue.run_here", "    run the kernel here"),
    ("atensor.engine.realize", "_prepare", "  _prepare (all of the planning)"),
    ("atensor.engine.realize", "_hot_hit", "  hot template: key, lookup, eager replay"),
    ("atensor.engine.plan", "Plan.run_record", "    the record's one call (run_record)"),
    ("atensor.engine.eager_replay", "record_realized", "    the replay's commit (record_realized)"),
    ("atensor.tensor", "Tensor._raise_write_failure", "  await: tensor takes its storage"),
    ("atensor.tensor", "Tensor._stored_buffer", "  await: the stored buffer (in flight or failed)"),
]


def _core_name() -> str:
    """Which core runs (atensor/core/: "c" or "python"); "python" on a checkout that predates it."""
    try:
        from atensor import core
    except ImportError:
        return "python"
    return core.implementation


def _settle() -> None:
    """Waits for the background compiles a hot template started, so the rounds measure the steady state
    (the twin's eager replay) from their first call: a checkout before the compile thread's turns
    (backend/c/registry.py `give_turn`) could end a tight loop of 2000 inline round trips (0.15 s) before
    the compiler thread got the GIL, and then measured the path without the twin (72-75 against 30-42 us
    here, AMD EPYC Zen 5); a checkout without that registry waits for nothing."""
    try:
        from atensor.backend.c import registry
    except ImportError:
        return
    wait = getattr(registry, "wait_background", None)
    if wait is not None:
        wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--loop", choices=("trio", "asyncio"), default="trio", help="the event loop awaiting")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line, write no file "
                        "(for alternating rounds against another checkout)")
    args = parser.parse_args()
    times: dict[str, list[int]] = collections.defaultdict(list)
    labels = install_stage_timers(STAGES, times)

    async def run() -> list[list[int]]:
        x = Tensor.zeros(16, device="CPU").contiguous()
        await x.realize()
        for _ in range(50):  # warmed up: the schedule cache hits, threads started
            x = x + 1
            await x.realize()
        _settle()  # the hot template's kernels compiled (its twin made at the next hits), as in a long loop
        for _ in range(50):
            x = x + 1
            await x.realize()
        times.clear()
        parts: list[list[int]] = [[], [], []]
        for _ in range(args.count):
            t0 = time.perf_counter_ns()
            x = x + 1
            t1 = time.perf_counter_ns()
            handle = x.realize()
            t2 = time.perf_counter_ns()
            await handle
            t3 = time.perf_counter_ns()
            for part, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
                part.append(value)
        assert x.tolist()[0] == 100 + args.count
        return parts
    parts = trio.run(run) if args.loop == "trio" else asyncio.run(run())
    medians = {name: statistics.median(p) / 1e3 for name, p in zip(("build", "realize()", "await"), parts)}
    rows = [("build the node (x + 1)", medians["build"]), ("realize() call", medians["realize()"])]
    rows += [(label, statistics.median(times[label]) / 1e3) for label in labels if times[label]
             and "await:" not in label]
    rows += [("await", medians["await"])]
    rows += [(label, statistics.median(times[label]) / 1e3) for label in labels if times[label]
             and "await:" in label]
    total = sum(medians.values())
    rows.append(("round trip (sum of the three parts)", total))
    if args.json:
        import json
        print(json.dumps({"loop": args.loop, "core": _core_name(), **{r[0].strip(): round(r[1], 1) for r in rows}}))
        return
    print(table(f"round trip on CPU under {args.loop}, {_core_name()} core, medians of {args.count} (us)",
                ["stage", "us"], rows))
    print("wrote", write_results("round_trip_breakdown", {"count": args.count, "loop": args.loop,
                                                           "core": _core_name(), "parts_us": medians,
                                                           "round_trip_us": total,
                                                           "stages_us": {r[0]: r[1] for r in rows}}))


if __name__ == "__main__":
    main()
