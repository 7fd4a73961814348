"""The non-matmul kernels of SmolLM2-135M's packed decode step, each timed alone: this tree against a
baseline revision, in alternating rounds.

    python bench/decode_kernels.py --baseline aff9ce5   # writes bench/results/decode_kernels.json

Why its own bench: bench/quant_step.py profiles a whole step, where each kernel's span carries the
profiler's own cost per command (a 576-float add showed as 15 us); here each native kernel of the step
is called directly through its compiled function, many times over, on buffers of its own shapes, so the
figure is the kernel's CPU time alone (process time: what the shared machine's load spoils least).
Packed matmuls (QMATMUL, DEQUANT) are left out: bench/quant_step.py --kernels times them.

Per process (one thread; ATENSOR_BLAS_THREADS=1): the batch-1 step (a 64-token prompt, a 128-position
window) and the 16-row step (16 slots decoding at once, as the server batches them) are run until
captured; then each of their kernels' median CPU time over 5 batches of calls. Per step, the kernels'
total is the sum over the step's kernels of count x time (count: how often the step runs the kernel,
from a profile of one step). The baseline runs from `git archive REV` in a temporary directory, each
round in a fresh process, alternating with this tree's.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROUNDS = 2


def kernel_times(rows: int) -> dict[str, dict[str, float]]:
    """{kernel name: {"us": CPU time per call, "per_step": calls per step}} of the `rows`-row decode step."""
    import numpy as np
    import atensor
    from atensor.backend.gemm import blas
    from atensor.backend.c import registry
    from atensor.graph.node import toposort
    from atensor.graph.ops import Ops
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    blas.use(1)
    engine = LlamaEngine(Llama(load_gguf(), slots=rows, context=512))
    before = set(registry.REGISTRY.kernels)
    step = {s: (100 + s, 70) for s in range(rows)}
    for _ in range(3):  # run, capture, verify: then replays
        engine.decode(step)
    with atensor.profile() as prof:
        engine.decode(step)
    # per step, the calls of each kernel name as the profiler names it ("mul_sub_add_matmul+4 1x3x3x128x64");
    # kernels of one name (the same nest in different layers) are taken to cost the same
    counts = Counter(span.name.replace(" ", "_").replace("+", "_") for span in prof.spans if span.kind == "kernel")
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for ast, kernel in list(registry.REGISTRY.kernels.items()):
        name = kernel.name.split("_", 1)[1]  # without the kernel's index in its program
        if ast in before or name in out or "qmatmul" in name or "dequant" in name or not counts.get(name):
            continue
        params = sorted((n for n in toposort([ast]) if n.op is Ops.PARAM), key=lambda n: n.arg[0])
        arrays = [(rng.standard_normal(max(int(np.prod(p.shape)), 1)) * 0.1).astype(p.dtype.np)
                  for p in params]
        block = kernel.pointers([a.ctypes.data for a in arrays], {v: 70 for v in kernel.variables})
        calls = max(10, int(2000 / rows))
        for _ in range(3):
            kernel.fn(block)
        times = []
        for _ in range(5):
            start = time.process_time()
            for _ in range(calls):
                kernel.fn(block)
            times.append((time.process_time() - start) / calls * 1e6)
        out[name] = {"us": statistics.median(times), "per_step": counts[name]}
    return out


def one() -> dict:
    import atensor
    assert Path(atensor.__file__).resolve().is_relative_to(Path.cwd().resolve()), atensor.__file__
    return {"1": kernel_times(1), "16": kernel_times(16)}


def run(tree: Path) -> dict:
    """One `--one` process for `tree` (its atensor, this script)."""
    env = dict(os.environ, PYTHONPATH=str(tree), ATENSOR_BLAS_THREADS="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(baseline: str) -> None:
    # here, not at the top: a `--one` process imports the atensor of the tree it runs for (PYTHONPATH)
    sys.path.insert(0, str(ROOT))
    from bench.common import table, write_results
    with tempfile.TemporaryDirectory(prefix="atensor-base-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", baseline], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        trees = {"this tree": ROOT, f"baseline {baseline}": Path(tmp)}
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(ROUNDS):
            for name, tree in trees.items():
                runs[name].append(run(tree))
                print(f"{name}: round done, load {os.getloadavg()[0]:.1f}", flush=True)
    load = os.getloadavg()
    (new_name, base_name) = trees
    summary = {}
    for rows in ("1", "16"):
        names = sorted(set(runs[new_name][0][rows]) | set(runs[base_name][0][rows]))
        med = {tree: {k: statistics.median(r[rows][k]["us"] for r in runs[tree] if k in r[rows])
                      for k in names if any(k in r[rows] for r in runs[tree])} for tree in trees}
        count = {k: next(r[rows][k]["per_step"] for tree in trees for r in runs[tree] if k in r[rows]) for k in names}
        table_rows = [[k, count[k], med[base_name].get(k, float("nan")), med[new_name].get(k, float("nan")),
                       med[base_name].get(k, float("nan")) / med[new_name].get(k, float("nan"))] for k in names]
        totals = {tree: sum(med[tree].get(k, 0) * count[k] for k in names) / 1000 for tree in trees}
        table_rows.append(["step total (ms)", "", totals[base_name], totals[new_name],
                           totals[base_name] / totals[new_name]])
        print(table(f"{rows}-row decode step: non-matmul kernels alone, CPU us per call (median of {ROUNDS} "
                    f"alternating rounds, one thread); load average {load[0]:.1f}",
                    ["kernel", "per step", base_name, new_name, "speed-up"], table_rows))
        summary[rows] = {"us": med, "per_step": count, "step_total_ms": totals}
    path = write_results("decode_kernels", {"baseline": baseline, "rounds": ROUNDS, "load_average": load,
                                            "steps": summary, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--one"]:
        print("RESULT " + json.dumps(one()))
    elif len(sys.argv) == 3 and sys.argv[1] == "--baseline":
        main(sys.argv[2])
    else:
        sys.exit("usage: python bench/decode_kernels.py --baseline REV")
