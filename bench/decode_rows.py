"""A decode step of 16 streams against a step of one, in process: SmolLM2-135M from its shipped GGUF
(packed weights), 16 slots of 256 tokens, as examples/serve_llm.py's engine holds it.

    python bench/decode_rows.py                                # writes bench/results/decode_rows.json
    python bench/decode_rows.py --baseline /work/wt/base       # another tree's packed kernels too

Issue 37's target is "16 streams at least 4x one stream": a 16-row step must take at most 4x a
1-row step. Here, without the server (no HTTP, no batcher), each of the 16 slots holds a prefilled
serving prompt and every step decodes at the same positions (the cache cells are rewritten, so each
step does the same work): the 1-row step is slot 0 alone (the gathering program, batch 1), the
16-row step every slot (the in-place program). After warm-up (run, capture, verify of each) the
kinds alternate step by step; the figures are medians of wall time and of the process's CPU time
(every thread's, a spinning pool worker's wait too).

--baseline: that tree's packed kernels (its backend/quant/source.py) are compiled into a second library
(bench/quant_batched.py's `baseline_library`), and every loaded kernel library's `at_packed_qmatmul`
pointer (backend/c/prelude.py) is pointed at one or the other between steps: the same engine, programs and
process run both, step by step, so the load of a shared machine falls on both alike (separate
processes minutes apart measured the load). The kernels' threads are the engine's own choice (a
device's share, as the server runs them) unless ATENSOR_BLAS_THREADS is set.

Columns: ms per step; "aggregate" = 16 * (1-row step) / (16-row step), the throughput of 16 streams
over one stream's (the target: at least 4); then a profile of 6 steps of each kind: the kernels' ms per
step, packed matmuls and the rest (attention, norms, rope, cache writes, elementwise), median spans.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402

PROMPTS = [f"Once upon a time, a robot named Unit {i} walked into" for i in range(16)]  # bench/llm.py's


def use_kernels(lib) -> None:
    """Points every loaded kernel library's packed-matmul pointer at `lib`'s kernels (backend/quant/kernels.point's
    job for this tree's helper)."""
    from atensor.backend.c import library
    address = lambda fn: ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)  # noqa: E731
    for kernels in library.LOADED.libraries:
        kernels.atensor_set_quant(address(lib.atq_matmul), address(lib.atq_dequant))


def profiled(engine, batch: dict, steps: int = 6) -> dict:
    """Kernel ms per step by kind (packed matmuls, the rest), from a profile of `steps` steps: per kernel
    name the median span times its count per step (a span stretched by another process's time slice
    does not move a median; under the profiler each kernel is its own command, as bench/quant_step.py)."""
    import atensor
    with atensor.profile() as prof:
        for _ in range(steps):
            engine.decode(batch)
    spans: dict[str, list[int]] = {}
    for span in prof.spans:
        if span.kind == "kernel":
            spans.setdefault(span.name, []).append(span.duration_ns)
    per = {name: statistics.median(t) * len(t) / steps / 1e6 for name, t in spans.items()}
    packed = sum(ms for name, ms in per.items() if name.startswith("q_qmatmul"))
    return {"packed ms": packed, "other kernels ms": sum(per.values()) - packed}


def worker(steps: int, baseline: Optional[Path]) -> dict:
    """{kernels: {figure: ms}} for this tree's packed kernels and, with `baseline`, that tree's."""
    import numpy as np
    from atensor.backend.quant import kernels as quant_kernels
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    from bench.quant_batched import baseline_library
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
    kernels = {"this tree": quant_kernels.library()}
    if baseline is not None:
        kernels["baseline"] = baseline_library(baseline)
    count = kernels["this tree"].atq_gemm_count
    count.restype = ctypes.c_uint64
    for name, lib in kernels.items():  # each library runs the 16-row step's matmuls: this tree's blocked kernel or not
        use_kernels(lib)
        before = count()
        engine.decode(rows)
        if (count() > before) != (name == "this tree"):
            raise RuntimeError(f"the {name} kernels did not run the 16-row step")
    times = {k: {"1 wall": [], "1 cpu": [], "16 wall": [], "16 cpu": []} for k in kernels}
    for _ in range(steps):
        for name, lib in kernels.items():
            use_kernels(lib)
            for kind, batch in (("1", one), ("16", rows)):
                wall, cpu = time.perf_counter(), time.process_time()
                engine.decode(batch)
                times[name][f"{kind} wall"].append(time.perf_counter() - wall)
                times[name][f"{kind} cpu"].append(time.process_time() - cpu)
    out = {}
    for name, lib in kernels.items():
        use_kernels(lib)
        out[name] = {k: 1000 * statistics.median(v) for k, v in times[name].items()}
        for kind, batch in (("1", one), ("16", rows)):
            out[name].update({f"{kind} {k}": v for k, v in profiled(engine, batch).items()})
    use_kernels(kernels["this tree"])
    return out


def run_worker(steps: int, baseline: Optional[Path]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, __file__, "--worker", "--steps", str(steps)]
    command += ["--baseline", str(baseline)] if baseline else []
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, cwd=str(ROOT))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="another tree whose packed kernels run beside this one's")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes, one after another")
    parser.add_argument("--steps", type=int, default=20, help="steps of each kind per round and kernels")
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline else None
    if args.worker:
        print("RESULT " + json.dumps(worker(args.steps, baseline)))
        return
    runs: list[dict] = []
    for _ in range(args.rounds):
        runs.append(run_worker(args.steps, baseline))
        print(runs[-1], flush=True)
    lines = []
    for i, run in enumerate(runs):
        for name, r in run.items():
            lines.append([i + 1, name, r["1 wall"], r["16 wall"], 16 * r["1 wall"] / r["16 wall"], r["1 cpu"],
                          r["16 cpu"], 16 * r["1 cpu"] / r["16 cpu"], r["1 packed ms"], r["1 other kernels ms"],
                          r["16 packed ms"], r["16 other kernels ms"]])
    load = os.getloadavg()
    print(table(f"SmolLM2-135M packed, decode step of 1 row and of 16 rows (16 slots, context 256), median of "
                f"{args.steps} steps a round; load average {load[0]:.1f}",
                ["round", "packed kernels", "1 row ms", "16 rows ms", "aggregate (wall)", "1 row CPU ms",
                 "16 rows CPU ms", "aggregate (CPU)", "1 row: packed", "other kernels", "16 rows: packed",
                 "other kernels"], lines))
    path = write_results("decode_rows", {"runs": runs, "steps": args.steps, "load_average": load,
                                         "baseline": str(baseline) if baseline else None})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
