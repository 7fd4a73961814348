"""The batched packed matmul alone (prefill, many decode streams): SmolLM2-135M's matrix shapes at 1 to
64 rows of x, one and two threads, against torch's float32 matmul of the same shapes, llama.cpp's
batched Q4_1 product, and (with --baseline) another tree's packed kernels.

    python bench/quant_batched.py                          # writes bench/results/quant_batched.json
    python bench/quant_batched.py --baseline /work/wt/base # another tree's kernels beside this one's

Shapes and formats are the GGUF file's own (every 2-D packed tensor; the tied Q8_0 embedding as the
output projection), on the file's own bytes. Timing on a shared 2-core machine: the baseline tree's
kernels are compiled into a second library of the same process, bound to the same BLAS, and its calls
interleave with this tree's in alternating blocks (separate processes timed minutes apart measured the
load, not the kernels); a config's figure is the median call, on one thread the calling thread's CPU
time, on two wall time; a call runs on `threads` threads (the packed kernels' pool, torch's intra-op
threads), BLAS set to that count as a kernel's runner sets it (`blas.packed_threads`). Each round runs
fresh processes (atensor and baseline, then torch, then ggml); a config keeps its least disturbed round.

Columns: GFLOPS (2 * rows * cols * m / time) of atensor's default kernels (float32 activations: the
float32 model's values), of the baseline tree's, of atensor's optional Q8 activations (`weights=
"q8act"`, llama.cpp's numerics), of torch and of ggml, and from 2 rows of x on of each variant of the
rows_f32 and rows_q8 families but the portable ones (backend/quant/variants_c.py, by table index); the packed weight bytes read per second by the
default kernel; each engine's time over atensor's (above 1: atensor's default is faster). The step
table sums each shape's time times its count per step (a decode step of m streams multiplies each of
these once). ggml: llama.cpp's batched Q4_1 product as its mul_mat runs it on x86 (x's rows quantized
to Q8_1, then `ggml_vec_dot_q4_1_q8_1` per pair of rows, from llama-cpp-python's libggml-cpu), one
thread, thread CPU time, for the Q4_1 shapes; its Q8_0 product goes through llamafile's sgemm, which
needs ggml's thread pool and is not measured. Without llama-cpp-python the ggml column is empty.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402
from bench.quant_dot import ggml_library  # noqa: E402

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


def _clock(threads: int):
    """One thread: the thread's CPU time (what the kernel costs whatever else the machine runs); more:
    wall time (the threads' CPU times would count a waiting worker's spin)."""
    return time.thread_time if threads == 1 else time.perf_counter


def _interleaved(calls: dict, threads: int, calls_per_block: int, blocks: int = 4) -> dict[str, float]:
    """Median seconds of a call of each of `calls` {engine: fn}, in blocks that alternate the engines
    (a warm-up call opens each block: the pool's workers of one library sleep while another's run)."""
    clock = _clock(threads)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            call()
            for _ in range(calls_per_block):
                start = clock()
                call()
                times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _calls_per_block(rows: int, cols: int, m: int) -> int:
    return max(3, min(25, int(1e8 / (rows * cols * m + 1))))


def baseline_library(tree: Path):
    """The packed kernels of another tree (its backend/quant/source.py SOURCE), compiled as backend/quant/kernels.py compiles
    this tree's and bound to the same BLAS (sgemm, thread count), so that both run in one process."""
    import ctypes
    import tempfile
    from atensor.backend.c import compiler
    from atensor.backend.gemm import openblas
    from atensor.backend.c import flags as c_flags
    source = subprocess.run([sys.executable, "-c", "from atensor.backend.quant.source import SOURCE; print(SOURCE)"],
                            env=dict(os.environ, PYTHONPATH=str(tree)), cwd=str(tree), capture_output=True,
                            text=True, check=True).stdout
    tmp = Path(tempfile.mkdtemp(prefix="quant-batched-base-"))
    (tmp / "quant.c").write_text(source)
    subprocess.run([compiler.path(), *c_flags.FLAGS, "-o", str(tmp / "quant.so"), str(tmp / "quant.c"), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(tmp / "quant.so"))
    lib.atq_matmul_run.restype = None
    blas = openblas.functions()
    if blas is not None:
        lib.atq_set_sgemm(ctypes.c_void_p(blas.sgemm), ctypes.c_int(int(blas.ilp64)))
        if blas.set_threads and blas.get_threads:
            lib.atq_set_blas_threads(ctypes.c_void_p(blas.get_threads), ctypes.c_void_p(blas.set_threads))
    return lib


def worker_atensor(baseline: Optional[Path]) -> dict:
    """This tree's packed kernels (PYTHONPATH picks the tree) on the file's bytes, and `baseline`'s
    float32-activation kernels interleaved with them in this process: median seconds per config."""
    import ctypes
    import numpy as np
    from atensor.backend.gemm import blas
    from atensor.backend.quant import kernels as quant_kernels
    from atensor.graph.quant import FORMATS, PackedShape
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    data = {}
    for name in gguf.weights:
        stored = gguf.stored(name)
        fmt = FORMATS.get(stored.type_name.lower())
        if fmt is not None and len(stored.shape) == 2:
            data.setdefault((fmt.name, *stored.shape), (fmt, stored.data))
    libraries = {"atensor": quant_kernels.library()}
    if baseline is not None:
        libraries["baseline"] = baseline_library(baseline)

    def call(lib, x, packed, shape: PackedShape, threads: int, variant: int = -1):
        y = np.empty((len(x), shape.rows), np.float32)  # the closure holds it: the kernel writes there
        args = [ctypes.c_int(variant), ctypes.c_int(shape.kernel_code)] + [
            ctypes.c_void_p(a.ctypes.data) for a in (x, packed, y)] + [
            ctypes.c_int64(len(x)), ctypes.c_int64(shape.cols), ctypes.c_int64(shape.rows), ctypes.c_int(threads)]
        return lambda: (lib.atq_matmul_run(*args), y)
    out = {}
    for (fname, rows, cols), (fmt, packed) in data.items():
        default, q8 = PackedShape(fmt, rows, cols), PackedShape(fmt, rows, cols, "q8_0")
        for m in ROWS:
            x = np.random.default_rng(m).standard_normal((m, cols)).astype(np.float32)
            for threads in THREADS:
                blas.use(threads)  # as a packed kernel's runner sets it (blas.packed_threads)
                calls = {name: call(lib, x, packed, default, threads) for name, lib in libraries.items()}
                calls["q8act"] = call(libraries["atensor"], x, packed, q8, threads)
                for family, shape in (("rows_f32", default), ("rows_q8", q8)) if m > 1 else ():
                    for v in quant_kernels.variants(family):  # each contender by its index (not portable)
                        if v.supported and v.rank != 0:
                            calls[f"{family} {v.name}"] = call(libraries["atensor"], x, packed, shape, threads, v.index)
                for name, seconds in _interleaved(calls, threads, _calls_per_block(rows, cols, m)).items():
                    out[f"{name}: {fname} {rows}x{cols} {m} {threads}"] = seconds
    return out


def worker_torch() -> dict:
    """torch float32 `x @ W.T` for the same shapes: median seconds per config."""
    import torch
    out = {}
    for s in model_shapes():
        w = torch.randn(s["rows"], s["cols"])
        for m in ROWS:
            x = torch.randn(m, s["cols"])
            for threads in THREADS:
                torch.set_num_threads(threads)
                with torch.inference_mode():
                    seconds = _interleaved({"torch": lambda: torch.matmul(x, w.T)}, threads,
                                           _calls_per_block(s["rows"], s["cols"], m))["torch"]
                out[f"torch: {s['format']} {s['rows']}x{s['cols']} {m} {threads}"] = seconds
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


def run_worker(args: list[str]) -> dict:
    """A worker process of this tree (`args` after --worker)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=str(ROOT))
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def collect(baseline: Optional[Path], rounds: int, shapes: list[dict]) -> dict[str, dict[str, float]]:
    """{engine: {config: seconds}}, each config's least disturbed round (its lowest median)."""
    best: dict[str, dict[str, float]] = defaultdict(dict)
    for _ in range(rounds):
        got = run_worker(["atensor"] + ([str(baseline)] if baseline else []))
        got.update(run_worker(["torch"]))
        got.update({f"ggml: {key}": seconds for key, seconds in worker_ggml(shapes).items()})
        for name, seconds in got.items():
            engine, key = name.split(": ", 1)
            best[engine][key] = min(seconds, best[engine].get(key, float("inf")))
        print("round done", flush=True)
    return best


def report(best: dict[str, dict[str, float]], shapes: list[dict], rounds: int) -> dict:
    """Prints the tables; returns what bench/results/quant_batched.json holds."""
    from atensor.graph.quant import FORMATS
    engines = [e for e in ("atensor", "baseline", "q8act", "torch", "ggml") if e in best] + sorted(
        e for e in best if e.startswith("rows_"))  # the batched families' variants, by name
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
                    if key in best[e]:
                        entry.update({f"{e}_ms": 1000 * best[e][key], f"{e}_gflops": flops / best[e][key] / 1e9,
                                      f"{e}_over_atensor": best[e][key] / best["atensor"][key]})
                entry["atensor_gbytes_s"] = packed_bytes / best["atensor"][key] / 1e9
                results.append(entry)
                lines.append([key.rsplit(" ", 2)[0], m, threads] +
                             [entry.get(f"{e}_gflops", "-") for e in engines] + [entry["atensor_gbytes_s"]] +
                             [entry.get(f"{e}_over_atensor", "-") for e in engines if e != "atensor"])
    load = os.getloadavg()
    print(table(f"packed matmul alone: GFLOPS (median call of the least disturbed of {rounds} rounds; one "
                f"thread: thread CPU time, two: wall); load average {load[0]:.1f}",
                ["shape", "rows of x", "threads"] + [f"{e} GFLOPS" for e in engines] + ["atensor GB/s packed"] +
                [f"{e} / atensor" for e in engines if e != "atensor"], lines))
    step_rows, step = [], {}
    for m in ROWS:
        for threads in THREADS:
            keys = [(f"{s['format']} {s['rows']}x{s['cols']} {m} {threads}", s["count"]) for s in shapes]
            per = {e: sum(1000 * best[e][k] * n for k, n in keys) for e in engines
                   if all(k in best[e] for k, _ in keys)}
            step[f"{m} {threads}"] = per
            step_rows.append([m, threads] + [per.get(e, "-") for e in engines] +
                             [per[e] / per["atensor"] if e in per else "-" for e in engines if e != "atensor"])
    print(table("one decode step's packed matmuls (every shape times its count), ms",
                ["rows of x", "threads"] + [f"{e} ms" for e in engines] +
                [f"{e} / atensor" for e in engines if e != "atensor"], step_rows))
    return {"configs": results, "step_ms": step, "rounds": rounds, "load_average": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="another tree whose packed kernels run beside this one's")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        got = worker_torch() if kind == "torch" else worker_atensor(Path(rest[0]) if rest else None)
        print("RESULT " + json.dumps(got))
        return
    shapes = model_shapes()
    baseline = args.baseline.resolve() if args.baseline else None
    data = report(collect(baseline, args.rounds, shapes), shapes, args.rounds)
    path = write_results("quant_batched", {**data, "baseline": str(baseline) if baseline else None,
                                           "ggml": ggml_library()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
