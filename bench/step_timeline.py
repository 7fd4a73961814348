"""Where a replayed training step's time goes: the flagship's jitted step (examples/train.py's MLP,
Adam, 256 rows per device, 1 BLAS thread) on 1 and 2 devices.

    python bench/step_timeline.py [--steps 400]

Per step, from the queues' timeline stamps (each compute queue runs the step as one native program):
- host before: from the call (the batch made from numpy included) to the first program's start;
- programs: from the first program's start to the last one's end (2 devices: the allreduce inside);
- host after: from the last program's end to the awaiting task having the result;
- host CPU: the event loop thread's CPU time for the whole step (`time.thread_time`);
- step: wall time, `loss.item()` included.
Medians over the steps after a warm-up. Beside them, in the same run: PyTorch CPU's step on the same
model and batch with 1 thread (bench/train_step.py's), as a reference for the step as a whole.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import table, write_results  # noqa: E402

WARMUP = 30


def run_atensor(devices: int, steps: int) -> dict:
    import trio
    import train_step
    from atensor import Tensor
    from atensor.hcq.device import Device
    step, params, names, x_np, y_np = train_step.flagship_step(devices, 256 * devices)
    signals = [Device.get(n).compute.signal for n in names]
    parts: dict[str, list[float]] = {k: [] for k in ("before", "programs", "after", "host_cpu", "step")}

    async def loop() -> None:
        await Tensor.realize(*params)
        with Tensor.train():
            for i in range(WARMUP + steps):
                start, cpu = time.perf_counter_ns(), time.thread_time_ns()
                loss = await step(Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0]))
                done = time.perf_counter_ns()
                loss.item()
                end, cpu_end = time.perf_counter_ns(), time.thread_time_ns()
                stamps = [s.stamp(s.value) for s in signals]
                if i < WARMUP or None in stamps:
                    continue
                first, last = min(st[0] for st in stamps), max(st[1] for st in stamps)
                parts["before"].append(first - start)
                parts["programs"].append(last - first)
                parts["after"].append(done - last)
                parts["host_cpu"].append(cpu_end - cpu)
                parts["step"].append(end - start)
    trio.run(loop)
    return {k: statistics.median(v) / 1e6 for k, v in parts.items()}


def run_torch(steps: int) -> dict:
    import train_step
    times = train_step.run_torch(256, WARMUP + steps, 1)[WARMUP:]
    return {"step": statistics.median(times) * 1e3}


def measure(config: dict) -> dict:
    env = {**os.environ, "ATENSOR_BLAS_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)], capture_output=True,
                          text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config = json.loads(args.worker)
        result = run_torch(config["steps"]) if config["kind"] == "torch" else \
            run_atensor(config["devices"], config["steps"])
        print(json.dumps(result))
        return
    runs = {"atensor, 1 device": measure({"kind": "atensor", "devices": 1, "steps": args.steps}),
            "atensor, 2 devices": measure({"kind": "atensor", "devices": 2, "steps": args.steps}),
            "torch CPU, 1 thread": measure({"kind": "torch", "steps": args.steps})}
    torch_ms = runs["torch CPU, 1 thread"].get("step")
    rows = []
    for name, r in runs.items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", f"skipped: {r['error']}"])
            continue
        cells = [r.get(k, "-") for k in ("before", "programs", "after", "host_cpu", "step")]
        rows.append([name, *cells, f"{r['step'] / torch_ms:.2f}x" if torch_ms else "-"])
    print(table(f"a replayed training step, medians of {args.steps} steps (ms; 256 rows per device, 1 BLAS thread)",
                ["configuration", "host before", "programs", "host after", "host CPU", "step", "step vs torch"],
                rows))
    print(f"\nresults: {write_results('step_timeline', {'steps': args.steps, 'runs': runs})}")


if __name__ == "__main__":
    main()
