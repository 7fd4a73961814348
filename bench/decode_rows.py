"""A decode step of 16 streams against a step of one, in process: SmolLM2-135M from its shipped GGUF
(packed weights), 16 slots of 256 tokens, as examples/serve_llm.py's engine holds it.

    python bench/decode_rows.py                                # writes bench/results/decode_rows.json
    python bench/decode_rows.py --baseline /work/wt/base       # another tree too, alternating rounds

Issue 37's target is "16 streams at least 4x one stream": a 16-row step must take at most 4x a
1-row step. Here, without the server (no HTTP, no batcher), each of the 16 slots holds a prefilled
serving prompt and every step decodes at the same positions (the cache cells are rewritten, so each
step does the same work): the 1-row step is slot 0 alone (the gathering program, batch 1), the
16-row step every slot (the in-place program). The two alternate step by step after warm-up (run,
capture, verify of each), and the figures are medians of wall time and of the process's CPU time.
Each tree runs in a fresh process, trees alternating round by round. The kernels' threads are the
engine's own choice (a device's share, as the server runs them) unless ATENSOR_BLAS_THREADS is set.

Columns: ms per step; "aggregate" = 16 * (1-row step) / (16-row step), the throughput of 16 streams
over one stream's (the target: at least 4).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402

PROMPTS = [f"Once upon a time, a robot named Unit {i} walked into" for i in range(16)]  # bench/llm.py's


def worker(steps: int) -> dict:
    """This tree's step times (PYTHONPATH picks the tree)."""
    import numpy as np
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    gguf = load_gguf()
    tokenizer = GGUFTokenizer(gguf.metadata)
    engine = LlamaEngine(Llama(gguf, slots=16, context=256), (16, 64))
    prompts = {slot: tokenizer.encode(text) for slot, text in enumerate(PROMPTS)}
    first = engine.prefill_many(prompts)
    rows = {slot: (int(np.argmax(first[slot])), len(ids)) for slot, ids in prompts.items()}
    one = {0: rows[0]}
    for _ in range(3):  # run, capture, verify: later calls replay
        engine.decode(one)
        engine.decode(rows)
    times: dict[str, list[float]] = {"1 wall": [], "1 cpu": [], "16 wall": [], "16 cpu": []}
    for _ in range(steps):
        for name, batch in (("1", one), ("16", rows)):
            wall, cpu = time.perf_counter(), time.process_time()
            engine.decode(batch)
            times[f"{name} wall"].append(time.perf_counter() - wall)
            times[f"{name} cpu"].append(time.process_time() - cpu)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def run_worker(tree: Path, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(steps)], env=env,
                          capture_output=True, text=True, timeout=1800, cwd=str(tree))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"worker in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--baseline", type=Path, help="another tree, run in alternating rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps of each kind per round")
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.steps)))
        return
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(run_worker(tree, args.steps))
            r = runs[name][-1]
            print(f"{name}: {r}", flush=True)
    lines = []
    for name, results in runs.items():
        for r in results:
            lines.append([name, r["1 wall"], r["16 wall"], 16 * r["1 wall"] / r["16 wall"], r["1 cpu"], r["16 cpu"],
                          16 * r["1 cpu"] / r["16 cpu"]])
    load = os.getloadavg()
    print(table(f"SmolLM2-135M packed, decode step of 1 row and of 16 rows (16 slots, context 256), median of "
                f"{args.steps} steps a round; load average {load[0]:.1f}",
                ["tree", "1 row ms", "16 rows ms", "aggregate (wall)", "1 row CPU ms", "16 rows CPU ms",
                 "aggregate (CPU)"], lines))
    path = write_results("decode_rows", {"runs": runs, "steps": args.steps, "load_average": load,
                                         "baseline": str(args.baseline) if args.baseline else None})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
