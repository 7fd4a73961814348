"""OpenCL devices against the CPU backend, and the awaited round trip of a tiny CL kernel against raw
pyopencl on the same device.

    python bench/opencl.py [--repeat 5] [--calls 300] [--rounds 3] [--round-trip]
    python bench/opencl.py --breakdown   # where a jit replay's and an eager round trip go, by stage (us)
    python bench/opencl.py --python-calls  # Python calls per awaited jit replay: in Plan.submit, in all
    python bench/opencl.py --pocl-gap    # raw pyopencl's round trip with the host busy 0-40 us between launches,
                                       # and the jit's, with the calling thread's context switches
    python bench/opencl.py --llm 8       # SmolLM2's greedy tokens on CL against transformers' (exit 1 if not)
    python bench/opencl.py --check     # a GPU machine's checks: the CL tests, then this bench, short,
                                       # then 4 LLM tokens against transformers' (under 5 minutes warm;
                                       # writes bench/results/opencl_check.json, opencl_check_llm.json)

Compute: a matmul, a fused elementwise chain, a row reduction and a conv2d, each realized eagerly on
`CL` and on `CPU` (median of --repeat runs after a warm-up that compiles), with the ratio CL / CPU.
On pocl (OpenCL on this machine's CPU) this is a correctness device: the figures are reported, not
targeted. The flagship step and an LLM decode step are not measured here (see docs/opencl.md).

Round trip: one awaited call of a jitted `x + 1` on 16 float32 on `CL` (enqueue to completion: the
replay, the OpenCL enqueue, the completion callback, the signal, the loop's wake-up), under trio
and asyncio, and one awaited eager `(x + 1).realize()`, against raw pyopencl's
`enqueue_nd_range_kernel(...).wait()` of the same kind of kernel on the same device, measured in the
same run (target: at most 1.5x raw).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_of, table, write_results  # noqa: E402

os.environ.setdefault("POCL_DEVICES", "pthread pthread")

import atensor  # noqa: E402
from atensor import Tensor  # noqa: E402

RNG = np.random.default_rng(0)


def _cases(scale: int) -> dict:
    """name -> (function of tensors, input arrays)."""
    n = 256 * scale
    a, b = RNG.standard_normal((n, n)).astype(np.float32), RNG.standard_normal((n, n)).astype(np.float32)
    v = RNG.standard_normal(1 << (18 + scale)).astype(np.float32)
    rows = RNG.standard_normal((64, 1 << (12 + scale))).astype(np.float32)
    img, w = RNG.standard_normal((8, 16, 32, 32)).astype(np.float32), RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
    return {
        f"matmul {n}x{n}x{n}": (lambda x, y: x @ y, (a, b)),
        f"elementwise chain ({v.size} elements, 6 ops)": (lambda x: ((x * 2 + 1).exp().sqrt() - x).relu() / 3, (v,)),
        f"row sum ({rows.shape[0]} rows of {rows.shape[1]})": (lambda x: x.sum(axis=1), (rows,)),
        "conv2d 8x16x32x32 * 32x16x3x3": (lambda x, k: x.conv2d(k, padding=1), (img, w)),
    }


def compute(repeat: int, scale: int) -> list[dict]:
    results = []
    for name, (fn, arrays) in _cases(scale).items():
        row = {"case": name}
        outs = {}
        for device in ("CPU", "CL"):
            inputs = [Tensor(x, device=device) for x in arrays]
            Tensor.realize(*inputs).wait()
            outs[device] = fn(*inputs).numpy()  # warm-up: compiles, caches the schedule
            row[f"{device}_ms"] = median_of(lambda: fn(*inputs).realize().wait(), repeat) * 1e3
        row["max_abs_diff"] = float(np.abs(outs["CL"] - outs["CPU"]).max())
        row["CL/CPU"] = row["CL_ms"] / row["CPU_ms"]
        results.append(row)
    return results


def raw_round_trip(calls: int, swapped: bool = False, gap_us: float = 0.0) -> float:
    """Median us of raw pyopencl on CL:0's device: enqueue `a[i] += 1` on 16 floats and wait; or, with
    `swapped`, `b[i] = a[i] + 1` with a and b swapped each call (new arguments per call, as atensor's
    `y = step(y)` has: pocl does more work at the enqueue of a kernel whose buffers changed). With
    `gap_us`, the loop spins that long between a wait's return and the next enqueue (not timed): the
    host work an awaited call does between two launches (`--pocl-gap`)."""
    import pyopencl as cl
    from atensor.hcq.device import Device
    handle = Device.get("CL").cl
    queue = cl.CommandQueue(handle.context, handle.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prog = cl.Program(handle.context, "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }\n"
                      "__kernel void s(__global float *b, __global const float *a) "
                      "{ b[get_global_id(0)] = a[get_global_id(0)] + 1.0f; }").build()
    bufs = [cl.Buffer(handle.context, cl.mem_flags.READ_WRITE, 64) for _ in range(2)]
    kernel = prog.s if swapped else prog.k
    kernel.set_args(*bufs[:1 + swapped])
    times = []
    gap_ns = int(gap_us * 1000)
    for k in range(calls + 50):
        if gap_ns:
            until = time.perf_counter_ns() + gap_ns
            while time.perf_counter_ns() < until:
                pass
        start = time.perf_counter_ns()
        if swapped:
            kernel.set_args(bufs[k % 2], bufs[1 - k % 2])
        cl.enqueue_nd_range_kernel(queue, kernel, (16,), (16,)).wait()
        if k >= 50:
            times.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(times)


def awaited_round_trip(calls: int, library: str, jitted: bool) -> float:
    """Median us of one awaited `x + 1` on 16 floats on CL (a jit replay, or an eager realize)."""
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def run() -> float:
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        times = []
        for k in range(calls + 50):
            start = time.perf_counter_ns()
            if jitted:
                y = await step(y)
            else:
                y = y + 1
                await y.realize()
            if k >= 50:
                times.append((time.perf_counter_ns() - start) / 1e3)
        got = float(y.numpy()[0])
        assert got == calls + 50, f"the round trips computed {got}, expected {calls + 50}"
        return statistics.median(times)

    if library == "trio":
        import trio
        return trio.run(run)
    import asyncio
    return asyncio.run(run())


def round_trips(calls: int, rounds: int) -> list[dict]:
    """Alternating rounds (the machine's load drifts): per round, raw then each atensor variant."""
    variants = [("jit replay, trio", "trio", True), ("jit replay, asyncio", "asyncio", True),
                ("eager realize, trio", "trio", False), ("eager realize, asyncio", "asyncio", False)]
    samples: dict[str, list[float]] = {"raw pyopencl enqueue + wait": [],
                                       "raw pyopencl, buffers swapped per call": []}
    ratios: dict[str, list[float]] = {}
    for _ in range(rounds):
        raw = raw_round_trip(calls)
        samples["raw pyopencl enqueue + wait"].append(raw)
        swapped = raw_round_trip(calls, swapped=True)
        samples["raw pyopencl, buffers swapped per call"].append(swapped)
        ratios.setdefault("raw pyopencl, buffers swapped per call", []).append(swapped / raw)
        for name, library, jitted in variants:
            us = awaited_round_trip(calls, library, jitted)
            samples.setdefault(name, []).append(us)
            ratios.setdefault(name, []).append(us / raw)
    rows = []
    for name, values in samples.items():
        rows.append({"case": name, "median_us": statistics.median(values), "min_us": min(values),
                     "max_us": max(values),
                     "vs_raw": statistics.median(ratios[name]) if name in ratios else 1.0})
    return rows


def _driver() -> str:
    """CL:0's OpenCL platform and driver versions (pocl's release is in the platform's), recorded with
    every result beside bench/machine.py's CPU record."""
    from atensor.hcq.device import Device
    handle = Device.get("CL").cl
    return f"platform {handle.device.platform.version}; driver {handle.device.driver_version}"


def _switches() -> tuple[int, int]:
    """The calling thread's (voluntary, involuntary) context switches so far (getrusage, Linux)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw


def pocl_gap(calls: int, rounds: int, gaps: tuple[float, ...] = (0, 5, 10, 20, 40)) -> list[dict]:
    """The raw loop's round trip (median us) with the host spinning `gap` us between a wait's return and
    the next enqueue, alternating the gaps in each round, then the awaited jit call (trio): how much of a
    launch's cost is the driver's threads going to sleep between launches (pocl's pthread device: the
    next enqueue wakes its workers, which may take the calling thread's core) rather than the host's
    own work. Each row has the calling thread's context switches per call: voluntary (it slept in the
    wait) and involuntary (it was switched out: the woken workers took its core)."""
    samples: dict[str, list[tuple[float, float, float]]] = {f"raw, gap {gap:g} us": [] for gap in gaps}
    samples["jit replay, trio"] = []
    for _ in range(rounds):
        for name in samples:
            before = _switches()
            if name.startswith("raw"):
                us = raw_round_trip(calls, gap_us=float(name.split()[2]))
            else:
                us = awaited_round_trip(calls, "trio", True)
            after = _switches()
            samples[name].append((us, (after[0] - before[0]) / (calls + 50), (after[1] - before[1]) / (calls + 50)))
    return [{"case": name, "median_us": statistics.median(v[0] for v in values),
             "min_us": min(v[0] for v in values), "max_us": max(v[0] for v in values),
             "voluntary_per_call": statistics.median(v[1] for v in values),
             "involuntary_per_call": statistics.median(v[2] for v in values)} for name, values in samples.items()]


# (module, attribute path, label) of the stages `breakdown` times; a leading space: part of the row above
BREAKDOWN_STAGES = [
    ("atensor.engine.dispatch", "Dispatcher.run_inline", "plan and submit on the calling thread (general path)"),
    ("atensor.jit.jit", "Jit._replay_now", "the jit's replay on the calling thread"),
    ("atensor.jit.direct", "LastCall.inputs_of", "  the call's key (jit/direct.py LastCall)"),
    ("atensor.jit.direct", "DirectReplay.run", "  the direct replay (jit/direct.py)"),
    ("atensor.engine.plan", "Plan.submit", "  Plan.submit"),
    ("atensor.engine.cl_replay", "CLReplay.bind", "    the lean replay's binding (engine/cl_replay.py)"),
    ("atensor.engine.plan", "Plan._runners", "    runners (rebound in place, or made again)"),
    ("atensor.hcq.cl_queue", "CLQueue.run_here", "    CLQueue.run_here (a short one: launched, waited for in C)"),
    ("atensor.hcq.cl_queue", "CLQueue._run_short", "      the compiled launch, wait and publish"),
    ("atensor.hcq.cl_queue", "CLQueue.submit", "    CLQueue.submit"),
    ("atensor.hcq.cl_queue", "CLQueue._enqueue", "      a command's enqueue"),
    ("pyopencl", "enqueue_nd_range_kernel", "        clEnqueueNDRangeKernel (pocl)"),
    ("atensor.jit.direct", "finished_here", "  the direct replay's poll (CLQueue.poll: a short wait, publish)"),
    ("atensor.tensor.tensor", "Tensor._dispatch", "eager: realize() on the calling thread"),
    ("atensor.tensor.tensor", "realize_captured", "  engine/realize.py realize"),
    ("atensor.engine.realize", "_hot_hit", "    the hot hit (_hot_hit)"),
    ("atensor.sched.cache", "walk_key", "      the graph's key (walk_key)"),
    ("atensor.engine.eager_replay", "EagerReplay.run", "      the eager replay (engine/eager_replay.py)"),
    ("atensor.sched.cache", "Template.fill", "        the hit's buffers (Template.fill)"),
    ("atensor.engine.eager_replay", "record_realized", "        the commit (record_realized)"),
    ("atensor.engine.eager_replay", "finished_here", "        its poll (CLQueue.poll: a short wait, publish)"),
    ("atensor.engine.handle", "RealizeHandle._polled", "the await: CLQueue.poll"),
    ("atensor.hcq.cl_queue", "CLQueue._completed", "  completion (stamps, publish); any thread"),
]


def breakdown(calls: int) -> list[dict]:
    """Median us per stage of an awaited jit replay of `x + 1` on CL, and of an eager one (bench/common.py's
    stage timers, ~0.3 us each; stages nest), under trio and asyncio, with the whole call's median and the
    process's CPU time per call (all threads: steadier than wall time on a loaded machine)."""
    import collections
    from common import install_stage_timers
    times: dict[str, list[int]] = collections.defaultdict(list)
    labels = install_stage_timers(BREAKDOWN_STAGES, times)  # before any runner captures the enqueue
    rows = []
    for jitted, library in ((True, "trio"), (True, "asyncio"), (False, "trio"), (False, "asyncio")):
        times.clear()
        cpu = time.process_time()
        total = awaited_round_trip(calls, library, jitted)
        cpu = (time.process_time() - cpu) / (calls + 50) * 1e6  # every thread's, pocl's included; per call
        counts = {label: len(times[label]) for label in labels}  # warm-up calls included: medians only
        variant = ("jit, " if jitted else "eager, ") + library
        rows.append({"library": variant, "call_us": total, "process_cpu_us": cpu,
                     "stages": {label: statistics.median(times[label]) / 1e3 for label in labels if counts[label]}})
    return rows


def python_calls(calls: int) -> dict:
    """Python function calls (C functions called from Python included) per awaited jit replay of `x + 1`
    on CL under trio, counted with sys.setprofile: inside Plan.submit, and in the whole call. Counts,
    not times: the same on a loaded machine as on a quiet one, so an A/B of two trees needs no rounds."""
    import trio
    from atensor.engine import plan
    counts = {"Plan.submit": 0, "whole call": 0}
    depth = [0]

    def profile(frame, event, arg) -> None:
        if event == "call" or event == "c_call":
            counts["whole call"] += 1
            if depth[0]:
                counts["Plan.submit"] += 1
    original = plan.Plan.submit

    def submit(self, mapping=None):
        depth[0] += 1
        try:
            return original(self, mapping)
        finally:
            depth[0] -= 1

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def run() -> None:
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        for _ in range(20):  # run, capture, verify, replays that make the plan's records
            y = await step(y)
        sys.setprofile(profile)
        try:
            for _ in range(calls):
                y = await step(y)
        finally:
            sys.setprofile(None)
        assert float(y.numpy()[0]) == calls + 20
    plan.Plan.submit = submit
    try:
        trio.run(run)
    finally:
        plan.Plan.submit = original
    return {name: count / calls for name, count in counts.items()}


LLM_PROMPT = "The capital of France is"


def llm(tokens: int) -> dict:
    """SmolLM2-135M's greedy tokens on CL (weights float32: packed weights do not render to OpenCL)
    against transformers' greedy tokens for the same GGUF file and prompt; seconds per phase."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import default_gguf_path, load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    path = default_gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tok(LLM_PROMPT).input_ids
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=tok.eos_token_id)
    want = out[0, len(ids):].tolist()
    gguf = load_gguf(path)
    assert GGUFTokenizer(gguf.metadata).encode(LLM_PROMPT) == ids
    start = time.perf_counter()
    engine = LlamaEngine(Llama(gguf, slots=1, context=64, device="CL", weights="float32"), prefill_buckets=(16,))
    loaded = time.perf_counter()
    first = list(engine.generate(ids, tokens))  # compiles on the way (pocl: seconds per kernel, then cached)
    cold = time.perf_counter()
    got = list(engine.generate(ids, tokens))   # replays
    warm = time.perf_counter()
    return {"prompt": LLM_PROMPT, "tokens": tokens, "transformers": want, "CL": got, "first_run": first,
            "equal": got == want and first == want, "load_s": loaded - start, "first_run_s": cold - loaded,
            "warm_run_s": warm - cold}


def check() -> int:
    """The CL tests, then a short bench: one script for a GPU machine (under 5 minutes)."""
    root = Path(__file__).resolve().parent.parent
    tests = subprocess.run([sys.executable, "-m", "pytest", str(root / "tests" / "opencl"), "-q", "-x",
                            "-p", "no:cacheprovider", "-o", "addopts="], cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root), "ATENSOR_CL_ALL": "1"})
    if tests.returncode != 0:
        print(f"bench/opencl.py --check: the CL tests failed (exit {tests.returncode})")
        return tests.returncode
    bench = main(["--repeat", "3", "--calls", "200", "--rounds", "1", "--out", "opencl_check"])
    if bench != 0:
        return bench
    try:  # the LLM's greedy tokens against transformers', where the reference extra is installed
        import transformers  # noqa: F401
    except ImportError:
        print("bench/opencl.py --check: transformers is not installed; the LLM check is skipped")
        return 0
    return main(["--llm", "4", "--out", "opencl_check"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per compute case (median)")
    parser.add_argument("--calls", type=int, default=300, help="timed round trips per variant (median)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the round trips")
    parser.add_argument("--scale", type=int, default=1, help="problem size multiplier (2 on a GPU)")
    parser.add_argument("--check", action="store_true", help="run the CL tests, then a short bench")
    parser.add_argument("--round-trip", action="store_true", help="only the round trips (no compute cases)")
    parser.add_argument("--breakdown", action="store_true", help="only a jit replay's round trip, stage by stage")
    parser.add_argument("--python-calls", action="store_true",
                        help="only the Python calls per awaited jit replay (in Plan.submit, in the whole call)")
    parser.add_argument("--pocl-gap", action="store_true",
                        help="only the raw loop's round trip with the host busy 0-40 us between launches")
    parser.add_argument("--llm", type=int, default=0, metavar="TOKENS",
                        help="only SmolLM2's greedy TOKENS on CL against transformers' (exit 1 if they differ)")
    parser.add_argument("--out", default="opencl")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    from atensor.hcq.device import Device
    device = Device.get("CL").cl.description
    driver = _driver()
    print(f"CL:0 is {device}; {driver}")
    if args.llm:
        row = llm(args.llm)
        print(table(f"SmolLM2-135M greedy on CL (float32 weights) vs transformers, {args.llm} tokens",
                    ["equal", "load s", "first run s", "warm run s", "tokens"],
                    [[row["equal"], row["load_s"], row["first_run_s"], row["warm_run_s"], str(row["CL"])]]))
        if not row["equal"]:
            print(f"transformers: {row['transformers']}\nCL (first run): {row['first_run']}")
        path = write_results(args.out + "_llm", {"device": device, "driver": driver, "command": "python bench/opencl.py "
                                                 + " ".join(argv or sys.argv[1:]), "llm": row})
        print(f"\nwrote {path}")
        return 0 if row["equal"] else 1
    if args.python_calls:
        row = python_calls(args.calls)
        print(table(f"Python calls per awaited jit replay of x + 1 on CL (trio), mean of {args.calls}",
                    ["where", "calls"], [[name, count] for name, count in row.items()]))
        path = write_results(args.out + "_python_calls", {"device": device, "driver": driver, "command": "python bench/opencl.py "
                                                          + " ".join(argv or sys.argv[1:]), "calls": row})
        print(f"\nwrote {path}")
        return 0
    if args.pocl_gap:
        rows = pocl_gap(args.calls, args.rounds)
        print(table(f"raw pyopencl enqueue + wait with the host busy between launches, and the awaited jit call, "
                    f"median of {args.calls} calls; median (range) of {args.rounds} alternating rounds (us), the "
                    f"calling thread's context switches per call",
                    ["case", "round trip us", "range", "voluntary", "involuntary"],
                    [[r["case"], r["median_us"], f"{r['min_us']:.0f}-{r['max_us']:.0f}", r["voluntary_per_call"],
                      r["involuntary_per_call"]] for r in rows]))
        path = write_results(args.out + "_pocl_gap", {"device": device, "driver": driver,
                                                      "command": "python bench/opencl.py " + " ".join(argv or sys.argv[1:]),
                                                      "pocl_gap": rows})
        print(f"\nwrote {path}")
        return 0
    if args.breakdown:
        rows = breakdown(args.calls)
        labels = [label for _, _, label in BREAKDOWN_STAGES if any(label in row["stages"] for row in rows)]
        print(table(f"a round trip on CL by stage, median of {args.calls} calls (us; stages nest)",
                    ["stage"] + [row["library"] for row in rows],
                    [["whole call (awaited)"] + [row["call_us"] for row in rows]]
                    + [["process CPU per call (all threads, mean)"] + [row["process_cpu_us"] for row in rows]]
                    + [[label] + [row["stages"].get(label, float("nan")) for row in rows] for label in labels]))
        path = write_results(args.out + "_breakdown", {"device": device, "driver": driver, "command": "python bench/opencl.py "
                                                       + " ".join(argv or sys.argv[1:]), "breakdown": rows})
        print(f"\nwrote {path}")
        return 0
    comp = [] if args.round_trip else compute(args.repeat, args.scale)
    if comp:
        print(table(f"compute, eager realize, median of {args.repeat} (ms)",
                    ["case", "CPU ms", "CL ms", "CL/CPU", "max |CL-CPU|"],
                    [[r["case"], r["CPU_ms"], r["CL_ms"], f"{r['CL/CPU']:.2f}x", r["max_abs_diff"]] for r in comp]))
    trips = round_trips(args.calls, args.rounds)
    print()
    print(table(f"round trip of a tiny kernel on CL, median of {args.calls} calls; median (range) of "
                f"{args.rounds} rounds (us)", ["variant", "us", "range", "vs raw"],
                [[r["case"], r["median_us"], f"{r['min_us']:.0f}-{r['max_us']:.0f}", f"{r['vs_raw']:.2f}x"]
                 for r in trips]))
    path = write_results(args.out, {"device": device, "driver": driver, "command": "python bench/opencl.py " + " ".join(argv or sys.argv[1:]),
                                    "compute": comp, "round_trip": trips})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
