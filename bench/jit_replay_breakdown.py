"""Where the microseconds of one awaited one-kernel jit replay go: `y = await step(y)`, `x + 1` on 16 elements.

    python bench/jit_replay_breakdown.py [--count 2000] [--loop trio|asyncio] [--json]

Times each stage of the replay by wrapping its function with a perf_counter_ns timer (medians per
call, in microseconds), as bench/round_trip_breakdown.py does for an eager realize. Stages nest (an
indented row is part of the row above it) and each wrapper adds about 0.3 us. "the rest" is the call
minus the top-level stages: the jit's driver, the key (of the general path), the handle and the await.
A tree with jit/direct.py replays directly (the two "direct" rows; Plan.run_record is then part of
the direct replay's row), an older one through the mapping and run_inline. The one foreign call of a record replay (engine/replay.py) is timed alone at the end.
A stage a checkout does not have is left out, so the same command runs on an older commit
(`PYTHONPATH=OTHER_CHECKOUT python bench/jit_replay_breakdown.py --json`) for before/after tables.
Writes bench/results/jit_replay_breakdown.json.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import install_stage_timers, table, write_results  # noqa: E402

import trio  # noqa: E402

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402

# (module, attribute path, label); a label's leading spaces show what it is part of
STAGES = [
    ("atensor.jit.direct", "LastCall.inputs_of", "  the key: the arguments against the last call's (direct)"),
    ("atensor.jit.direct", "DirectReplay.run", "  direct replay: fresh buffers, the record, result tensors"),
    ("atensor.jit.direct", "fresh_small", "    a fresh result's buffer and ledger record (fresh_small)"),
    ("atensor.jit.jit", "_Program.replay", "  mapping, fresh result buffers, result tensors"),
    ("atensor.jit.captured", "CallProgram.replay", "  mapping, fresh result buffers, result tensors"),
    ("atensor.engine.dispatch", "Dispatcher.run_inline", "  run_inline: the submission on this thread"),
    ("atensor.jit.jit", "_run_records", "    _run_records (versions, submit)"),
    ("atensor.jit.captured", "run_records", "    _run_records (versions, submit)"),
    ("atensor.engine.program", "CapturedProgram.submit", "      CapturedProgram.submit"),
    ("atensor.engine.plan", "Plan.submit", "        Plan.submit"),
    ("atensor.engine.plan", "Plan._runners", "          runners (rebind the slots)"),
    ("atensor.hcq.queue", "Queue.run_here", "          run the batch here (Python path)"),
    ("atensor.engine.plan", "Plan.run_record", "          Plan.run_record (one C call, via Queue.run_here)"),
    ("atensor.hcq.device", "Device.allocate", "            allocate the result's memory"),
    ("atensor.hcq.signal", "Signal.set", "            publish the value"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--loop", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line, write no file")
    args = parser.parse_args()
    times: dict[str, list[int]] = collections.defaultdict(list)
    labels = install_stage_timers(STAGES, times)

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def run() -> tuple[list[int], list[int]]:
        y = Tensor.zeros(16, device="CPU:0").contiguous()
        await y.realize()
        for _ in range(50):  # run, capture, verify (compiles), lowered, warm
            y = await step(y)
        times.clear()
        calls = []
        for _ in range(args.count):
            start = time.perf_counter_ns()
            y = await step(y)
            calls.append(time.perf_counter_ns() - start)
        assert y.tolist()[0] == 50 + args.count
        alone = []
        plans = [plan for program in step._programs.values() for record in program.records
                 for plan in record.plans.values()]
        record = getattr(plans[0], "record", None) if plans else None
        if record:  # the one foreign call by itself: binds the same buffers, runs the kernel again
            for _ in range(args.count):
                start = time.perf_counter_ns()
                record.call(record.address)
                alone.append(time.perf_counter_ns() - start)
        return calls, alone

    calls, alone = trio.run(run) if args.loop == "trio" else asyncio.run(run())
    call = statistics.median(calls) / 1e3
    med = {label: statistics.median(times[label]) / 1e3 for label in labels if times[label]}
    rows = [("awaited call, end to end", call)]
    rows += [(label, us) for label, us in med.items()]
    top = [label for label in med if not label.startswith("    ")]
    rows.append(("  the rest: jit generator and driver, key, handle, await", call - sum(med[t] for t in top)))
    if alone:
        rows.append(("the C call alone (bind + run the kernel), at_replay", statistics.median(alone) / 1e3))
    if args.json:
        print(json.dumps({r[0].strip(): round(r[1], 1) for r in rows}))
        return
    print(table(f"one-kernel jit replay under {args.loop}, medians of {args.count} calls (us)", ["stage", "us"], rows))
    print("wrote", write_results("jit_replay_breakdown", {"count": args.count, "loop": args.loop,
                                                           "stages_us": {r[0]: r[1] for r in rows}}))


if __name__ == "__main__":
    main()
