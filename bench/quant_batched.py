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

Columns: GFLOPS (2 * rows * cols * m / time) of atensor's default kernels (float32 activations: the
float32 model's values), of the baseline tree's and of torch, and of atensor's optional Q8 activations
(`weights="q8act"`, llama.cpp's numerics; this tree's kernels); the packed weight bytes read per second
by the default kernel; torch / atensor (above 1: atensor's default is faster). The "16-row decode
step" table sums each shape's time times its count per step (a decode step of 16 streams multiplies
each of these once). ggml: llama.cpp's batched Q4_1 product as its mul_mat runs it on x86 (x's rows
quantized to Q8_1, then `ggml_vec_dot_q4_1_q8_1` per pair of rows, from llama-cpp-python's
libggml-cpu), one thread, thread CPU time, for the Q4_1 shapes; its Q8_0 product goes through
llamafile's sgemm, which needs ggml's thread pool and is not measured. Without llama-cpp-python the
ggml column is empty.
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
    return max(5, min(50, int(3e8 / (rows * cols * m + 1))))


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
        for activations, suffix in (("float32", ""), ("q8_0", " q8act")):
            shape = PackedShape(fmt, rows, cols, activations)
            for m in ROWS:
                x = np.random.default_rng(m).standard_normal((m, cols)).astype(np.float32)
                for threads in THREADS:
                    blas.use(threads)
                    seconds = _best(lambda: quant_kernels.matmul(x, packed, shape, threads=threads),
                                    _repeat(rows, cols, m))
                    out[f"{fname} {rows}x{cols} {m} {threads}{suffix}"] = seconds
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


GGML_HARNESS = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef void (*dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*quant_t)(const float *, void *, int64_t);
static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
/* y (m, rows) = x (m, cols) . W^T, W Q4_1, as ggml's mul_mat runs it on x86 (one thread): x's rows
   quantized to Q8_1 once, then ggml_vec_dot_q4_1_q8_1 per (weight row, row of x), 16x16 blocks */
int main(int argc, char **argv) {
  int64_t rows = atoll(argv[1]), cols = atoll(argv[2]), m = atoll(argv[3]);
  void *lib = dlopen(argv[4], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  ((void (*)(void))dlsym(lib, "ggml_cpu_init"))();
  dot_t dot = (dot_t)dlsym(lib, "ggml_vec_dot_q4_1_q8_1");
  quant_t quant = (quant_t)dlsym(lib, "quantize_row_q8_1");
  int64_t rb = cols / 32 * 20, xb = cols / 32 * 36;
  uint8_t *w = malloc(rows * rb), *xq = malloc(m * xb);
  float *x = malloc(4 * m * cols), *y = malloc(4 * m * rows);
  srand(1);
  for (int64_t i = 0; i < rows * rb; i++) w[i] = (uint8_t)rand();
  for (int64_t b = 0; b < rows * cols / 32; b++) {  /* d, m in [2^-7, 2^-6): finite halves */
    uint16_t h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * 20, &h, 2);
    h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * 20 + 2, &h, 2);
  }
  for (int64_t i = 0; i < m * cols; i++) x[i] = (rand() % 2001 - 1000) / 1000.0f;
  double best = 1e30;
  for (int round = 0; round < 7; round++) {
    double start = cpu_ns();
    for (int64_t j = 0; j < m; j++) quant(x + j * cols, xq + j * xb, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      for (int64_t j0 = 0; j0 < m; j0 += 16)
        for (int64_t j = j0; j < j0 + 16 && j < m; j++)
          for (int64_t r = r0; r < r0 + 16 && r < rows; r++)
            dot((int)cols, y + j * rows + r, 0, w + r * rb, 0, xq + j * xb, 0, 1);
    double ns = cpu_ns() - start;
    if (ns < best) best = ns;
  }
  printf("%.0f\n", best);
  return 0;
}
"""


def ggml_library() -> str | None:
    """libggml-cpu of llama-cpp-python (an optional bench dependency), when it is installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    return str(path) if path.exists() else None


def worker_ggml(shapes: list[dict]) -> dict:
    """ggml's Q4_1 batched matmul as its mul_mat runs on x86 (per-pair block dot products: llamafile's
    sgemm, which llama.cpp uses for Q8_0 and Q4_0, has no Q4_1), one thread, thread CPU time: seconds
    per config. Empty without llama-cpp-python."""
    import tempfile
    lib = ggml_library()
    if lib is None:
        return {}
    out = {}
    with tempfile.TemporaryDirectory(prefix="quant-batched-") as tmp:
        src, exe = Path(tmp) / "ggml.c", Path(tmp) / "ggml"
        src.write_text(GGML_HARNESS)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
        for s in shapes:
            if s["format"] != "q4_1":
                continue
            for m in ROWS:
                ns = subprocess.run([str(exe), str(s["rows"]), str(s["cols"]), str(m), lib], capture_output=True,
                                    text=True, check=True).stdout
                out[f"{s['format']} {s['rows']}x{s['cols']} {m} 1"] = float(ns) / 1e9
    return out


def run_worker(kind: str, tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, __file__, "--worker", kind], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=str(tree))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} worker in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def collect(engines: dict[str, Path], rounds: int, shapes: list[dict]) -> dict[str, dict[str, float]]:
    """The best seconds per config of each engine over `rounds` rounds, the engines alternating."""
    best: dict[str, dict[str, float]] = {e: {} for e in list(engines) + ["ggml"]}
    for _ in range(rounds):
        for engine, tree in engines.items():
            got = run_worker("torch" if engine == "torch" else "atensor", tree)
            for key, seconds in got.items():
                best[engine][key] = min(seconds, best[engine].get(key, float("inf")))
        for key, seconds in worker_ggml(shapes).items():
            best["ggml"][key] = min(seconds, best["ggml"].get(key, float("inf")))
        print("round done", flush=True)
    return best


def report(best: dict[str, dict[str, float]], engines: list[str], shapes: list[dict], rounds: int) -> dict:
    """Prints the tables; returns what bench/results/quant_batched.json holds."""
    from atensor.graph.quant import FORMATS
    results, lines = [], []
    for s in shapes:
        fmt = FORMATS[s["format"].lower()]
        packed_bytes = s["rows"] * s["cols"] // fmt.block * fmt.block_bytes
        for m in ROWS:
            for threads in THREADS:
                key = f"{s['format']} {s['rows']}x{s['cols']} {m} {threads}"
                flops = 2 * s["rows"] * s["cols"] * m
                entry = {**s, "m": m, "threads": threads}
                for e in engines:
                    entry.update({f"{e}_ms": 1000 * best[e][key], f"{e}_gflops": flops / best[e][key] / 1e9})
                entry["q8act_gflops"] = flops / best["atensor"][key + " q8act"] / 1e9
                entry["ggml_gflops"] = flops / best["ggml"][key] / 1e9 if key in best["ggml"] else None
                entry["atensor_gbytes_s"] = packed_bytes / best["atensor"][key] / 1e9
                entry["torch_over_atensor"] = best["torch"][key] / best["atensor"][key]
                entry["ggml_over_atensor"] = best["ggml"][key] / best["atensor"][key] if key in best["ggml"] else None
                if "baseline" in engines:
                    entry["baseline_over_atensor"] = best["baseline"][key] / best["atensor"][key]
                results.append(entry)
                lines.append([key.rsplit(" ", 2)[0], m, threads] + [entry[f"{e}_gflops"] for e in engines] +
                             [entry["q8act_gflops"], entry["ggml_gflops"] or "-", entry["atensor_gbytes_s"],
                              entry["torch_over_atensor"], entry["ggml_over_atensor"] or "-"] +
                             ([entry["baseline_over_atensor"]] if "baseline" in engines else []))
    load = os.getloadavg()
    heads = (["shape", "rows of x", "threads"] + [f"{e} GFLOPS" for e in engines] +
             ["atensor q8act GFLOPS", "ggml GFLOPS", "atensor GB/s packed", "torch / atensor", "ggml / atensor"] +
             (["baseline / atensor"] if "baseline" in engines else []))
    print(table(f"packed matmul (float32 activations) against torch float32 and ggml (Q4_1, one thread), best "
                f"of {rounds} alternating rounds; load average {load[0]:.1f}", heads, lines))
    step_rows, step = [], {}
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
    return {"configs": results, "step_ms": step, "rounds": rounds, "load_average": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("atensor", "torch"))
    parser.add_argument("--baseline", type=Path, help="another tree whose packed kernels run beside this one's")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker_atensor() if args.worker == "atensor" else worker_torch()))
        return
    engines = {"atensor": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {}) | {"torch": ROOT}
    shapes = model_shapes()
    best = collect(engines, args.rounds, shapes)
    data = report(best, list(engines), shapes, args.rounds)
    path = write_results("quant_batched", {**data, "baseline": str(args.baseline) if args.baseline else None,
                                           "ggml": ggml_library()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
