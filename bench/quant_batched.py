"""The batched packed matmul alone (prefill, many decode streams): SmolLM2-135M's matrix shapes at 1 to
64 rows of x, one and two threads, against torch's float32 matmul of the same shapes.

    python bench/quant_batched.py                          # writes bench/results/quant_batched.json
    python bench/quant_batched.py --baseline /work/wt/base # adds a tree's kernels, alternating rounds

Shapes and formats are the GGUF file's own (every 2-D packed tensor; the tied Q8_0 embedding as the
output projection), on the file's own bytes. Each engine runs in a fresh process, the engines
alternating round by round (this tree, the baseline tree, torch, then again), and a configuration's
figure is its best round (the least disturbed on a shared machine). Times are wall time of one call,
the fastest of a few repeats; a call runs on `threads` threads (the packed kernels' pool, torch's
intra-op threads), BLAS set to that count as a kernel's runner sets it (`blas.packed_threads`).

Columns: GFLOPS (2 * rows * cols * m / time), the weight bytes read per second (the packed bytes for
atensor, float32 for torch), and torch / atensor (above 1: atensor is faster). The "16-row decode
step" table sums each shape's time times its count per step (a decode step of 16 streams multiplies
each of these once). llama.cpp's batched numbers are not measured here (bench/quant_dot.py compares
its per-block dot products at batch 1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402

ROWS = (1, 4, 8, 16, 64)
THREADS = (1, 2)


def model_shapes() -> list[dict]:
    """Each (format, rows, cols) of the GGUF file's 2-D packed tensors, with its count per decode step."""
    from atensor.graph.quant import FORMATS
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    counts: dict[tuple[str, int, int], int] = defaultdict(int)
    for name in gguf.weights:
        stored = gguf.stored(name)
        fmt = FORMATS.get(stored.type_name.lower())
        if fmt is not None and len(stored.shape) == 2:
            counts[(fmt.name, *stored.shape)] += 1
    return [{"format": f, "rows": r, "cols": c, "count": n} for (f, r, c), n in counts.items()]


def _best(call, repeat: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _repeat(rows: int, cols: int, m: int) -> int:
    return max(3, min(50, int(3e8 / (rows * cols * m + 1))))


def worker_atensor() -> dict:
    """This tree's packed kernels (PYTHONPATH picks the tree) on the file's bytes: seconds per config."""
    import numpy as np
    from atensor.backend import blas, quant_kernels
    from atensor.graph.quant import FORMATS, PackedShape
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    data = {}
    for name in gguf.weights:
        stored = gguf.stored(name)
        fmt = FORMATS.get(stored.type_name.lower())
        if fmt is not None and len(stored.shape) == 2:
            data.setdefault((fmt.name, *stored.shape), (fmt, stored.data))
    out = {}
    for (fname, rows, cols), (fmt, packed) in data.items():
        shape = PackedShape(fmt, rows, cols)
        for m in ROWS:
            x = np.random.default_rng(m).standard_normal((m, cols)).astype(np.float32)
            for threads in THREADS:
                blas.use(threads)
                seconds = _best(lambda: quant_kernels.matmul(x, packed, shape, threads=threads),
                                _repeat(rows, cols, m))
                out[f"{fname} {rows}x{cols} {m} {threads}"] = seconds
    return out


def worker_torch() -> dict:
    """torch float32 `x @ W.T` for the same shapes: seconds per config."""
    import torch
    out = {}
    for s in model_shapes():
        w = torch.randn(s["rows"], s["cols"])
        for m in ROWS:
            x = torch.randn(m, s["cols"])
            for threads in THREADS:
                torch.set_num_threads(threads)
                with torch.inference_mode():
                    seconds = _best(lambda: torch.matmul(x, w.T), _repeat(s["rows"], s["cols"], m))
                out[f"{s['format']} {s['rows']}x{s['cols']} {m} {threads}"] = seconds
    return out


def run_worker(kind: str, tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, __file__, "--worker", kind], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=str(tree))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} worker in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("atensor", "torch"))
    parser.add_argument("--baseline", type=Path, help="another tree whose packed kernels run beside this one's")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker_atensor() if args.worker == "atensor" else worker_torch()))
        return
    engines = {"atensor": ROOT, "torch": ROOT}
    if args.baseline:
        engines = {"atensor": ROOT, "baseline": args.baseline.resolve(), "torch": ROOT}
    best: dict[str, dict[str, float]] = {e: {} for e in engines}
    for _ in range(args.rounds):
        for engine, tree in engines.items():
            got = run_worker("torch" if engine == "torch" else "atensor", tree)
            for key, seconds in got.items():
                best[engine][key] = min(seconds, best[engine].get(key, float("inf")))
            print(f"round done: {engine}", flush=True)
    shapes = model_shapes()
    from atensor.graph.quant import FORMATS
    results, lines = [], []
    for s in shapes:
        fmt = FORMATS[s["format"].lower()]
        packed_bytes = s["rows"] * s["cols"] // fmt.block * fmt.block_bytes
        for m in ROWS:
            for threads in THREADS:
                key = f"{s['format']} {s['rows']}x{s['cols']} {m} {threads}"
                flops = 2 * s["rows"] * s["cols"] * m
                entry = {**s, "m": m, "threads": threads, **{f"{e}_ms": 1000 * best[e][key] for e in engines}}
                entry.update({f"{e}_gflops": flops / best[e][key] / 1e9 for e in engines})
                entry["atensor_gbytes_s"] = packed_bytes / best["atensor"][key] / 1e9
                entry["torch_over_atensor"] = best["torch"][key] / best["atensor"][key]
                if "baseline" in engines:
                    entry["baseline_over_atensor"] = best["baseline"][key] / best["atensor"][key]
                results.append(entry)
                lines.append([key.rsplit(" ", 2)[0], m, threads] +
                             [entry[f"{e}_gflops"] for e in engines] + [entry["atensor_gbytes_s"],
                              entry["torch_over_atensor"]] +
                             ([entry["baseline_over_atensor"]] if "baseline" in engines else []))
    load = os.getloadavg()
    heads = ["shape", "rows of x", "threads"] + [f"{e} GFLOPS" for e in engines] + ["atensor GB/s packed",
                                                                                      "torch / atensor"]
    heads += ["baseline / atensor"] if "baseline" in engines else []
    print(table(f"packed matmul (float32 activations) against torch float32, best of {args.rounds} alternating "
                f"rounds; load average {load[0]:.1f}", heads, lines))
    step_rows = []
    step = {}
    for m in ROWS:
        for threads in THREADS:
            per = {e: sum(1000 * best[e][f"{s['format']} {s['rows']}x{s['cols']} {m} {threads}"] * s["count"]
                          for s in shapes) for e in engines}
            step[f"{m} {threads}"] = per
            step_rows.append([m, threads] + [per[e] for e in engines] + [per["torch"] / per["atensor"]] +
                             ([per["baseline"] / per["atensor"]] if "baseline" in engines else []))
    print(table("one decode step's matmuls (every shape times its count), ms",
                ["rows of x", "threads"] + [f"{e} ms" for e in engines] + ["torch / atensor"] +
                (["baseline / atensor"] if "baseline" in engines else []), step_rows))
    path = write_results("quant_batched", {"configs": results, "step_ms": step, "rounds": args.rounds,
                                           "baseline": str(args.baseline) if args.baseline else None,
                                           "load_average": load})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
