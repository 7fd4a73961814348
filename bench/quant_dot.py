"""The batch-1 packed matmul, every variant of it, against llama.cpp's own block dot products, on the
same blocks, one thread and two.

    python bench/quant_dot.py          # writes bench/results/quant_dot.json

Why: bench/llm.py compares whole decode steps, where threads, the other kernels and the host all
count; this isolates the per-32 block dot product and says which variant wins on this CPU. For each
of SmolLM2-135M's matrix shapes it times, in one C program, y = W x for one row of x:
- every variant this CPU runs (but the portable ones) of the gemv_f32 family (float32 activations: the default numerics) and
  of the gemv_q8 family (x quantized to Q8 blocks, `weights="q8act"`): backend/quant/variants_c.py's
  table, each called by its index through `atq_matmul_run`;
- ggml: `ggml_vec_dot_q4_1_q8_1` / `ggml_vec_dot_q8_0_q8_0` of llama-cpp-python's libggml-cpu (the
  functions llama.cpp's matmul calls per row), after `quantize_row_q8_1` / `quantize_row_q8_0` of x
  (one thread only: it has no pool of its own here).
One thread: thread CPU time (the load of a shared machine stretches wall time, not this); two: wall
time, which the load stretches. Best of 5 rounds, engines alternating within each round; "cache": the
same matrix again and again (it sits in L2/L3); "stream": a rotation over copies of it filling 96 MB,
so each call reads from memory as a decode step does. Blocks are random (d, m in [2^-7, 2^-6)), the
same bytes for every engine. Without llama-cpp-python the ggml column is absent.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402

THREADS = (1, 2)
SHAPES = [("q4_1", 1536, 576, 60), ("q4_1", 576, 1536, 30), ("q4_1", 576, 576, 60), ("q4_1", 192, 576, 60),
          ("q8_0", 49152, 576, 1), ("bf16", 1536, 576, 0)]  # format, rows, cols, count per decode step
# (BF16: not in the shipped file; the shape of its largest matrices, for the BF16 variants)

HARNESS = r"""
#include <dlfcn.h>
#include <stdio.h>
typedef void (*ggml_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*ggml_quant_t)(const float *, void *, int64_t);
/* one thread: its CPU time (the load of a shared machine stretches wall time, not this); two: wall time */
static double now_ns(int threads) {
  struct timespec t;
  clock_gettime(threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
/* argv: format, rows, cols, stream (0/1), threads[, libggml-cpu.so]; prints "family name ns-per-block" for
   every supported variant of the gemv_f32 and gemv_q8 families, and ggml's */
int main(int argc, char **argv) {
  int fmt = atoi(argv[1]); int64_t rows = atoll(argv[2]), cols = atoll(argv[3]); int stream = atoi(argv[4]);
  int threads = atoi(argv[5]);
  void *ggml = argc > 6 && fmt <= ATQ_Q8_0 ? dlopen(argv[6], RTLD_NOW) : NULL;  /* no BF16 dot of ggml's here */
  ggml_dot_t dot = ggml ? (ggml_dot_t)dlsym(ggml, fmt == ATQ_Q4_1 ? "ggml_vec_dot_q4_1_q8_1" : "ggml_vec_dot_q8_0_q8_0") : NULL;
  ggml_quant_t quant = ggml ? (ggml_quant_t)dlsym(ggml, fmt == ATQ_Q4_1 ? "quantize_row_q8_1" : "quantize_row_q8_0") : NULL;
  void (*init)(void) = ggml ? (void (*)(void))dlsym(ggml, "ggml_cpu_init") : NULL;
  if (init) init();  /* its fp16 tables */
  int64_t rb = atq_row_bytes(fmt, cols), one = rows * rb, bb = atq_row_bytes(fmt, 32);
  int copies = stream ? (int)(96e6 / one) + 1 : 1;
  uint8_t *w = malloc(one * copies); float *x = malloc(4 * cols), *y = malloc(4 * rows);
  uint8_t *xq = malloc(cols / 32 * 36 + 64);
  srand(1);
  for (int64_t i = 0; i < one * copies; i++) w[i] = (uint8_t)rand();
  if (fmt == ATQ_BF16)  /* finite values in [1, 2) with either sign: no NaN, infinity or subnormal */
    for (int64_t i = 0; i < one * copies / 2; i++) { uint16_t h = (uint16_t)(0x3F80 | (rand() & 0x807F)); memcpy(w + 2 * i, &h, 2); }
  for (int64_t b = 0; fmt <= ATQ_Q8_0 && b < one * copies / bb; b++) {
    uint16_t h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * bb, &h, 2);
    if (fmt == ATQ_Q4_1) { h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * bb + 2, &h, 2); }
  }
  for (int64_t i = 0; i < cols; i++) x[i] = (rand() % 2001 - 1000) / 1000.0f;
  int engines[64], q8[64], n = 0;
  for (int v = 0; v < atq_variant_count() && n < 63; v++) {
    int family = atq_variants[v].family;
    /* the portable variants (10-80x slower: the reference, not a contender) would take minutes here */
    if ((family == ATQ_GEMV_F32 || (family == ATQ_GEMV_Q8 && fmt <= ATQ_Q8_0)) && atq_variant_supported(v) &&
        atq_variants[v].rank != 0) {
      engines[n] = v; q8[n++] = family == ATQ_GEMV_Q8;
    }
  }
  if (dot != NULL) { engines[n] = -1; q8[n++] = 1; }  /* ggml: threads = 1 only */
  int reps = (int)(1e7 / (rows * cols)) + 2;
  double best[64];
  for (int e = 0; e < n; e++) best[e] = 1e30;
  for (int round = 0; round < 5; round++)
    for (int e = 0; e < n; e++) {  /* engines alternate within each round */
      if (engines[e] < 0 && threads != 1) continue;
      double s = now_ns(threads);
      for (int r = 0; r < reps * copies; r++) {
        const uint8_t *wr = w + (r % copies) * one;
        if (engines[e] >= 0) atq_matmul_run(engines[e], fmt | (q8[e] ? ATQ_Q8ACT : 0), x, wr, y, 1, cols, rows, threads);
        else {
          quant(x, xq, cols);
          for (int64_t i = 0; i < rows; i++) dot((int)cols, y + i, 0, wr + i * rb, 0, xq, 0, 1);
        }
      }
      double ns = (now_ns(threads) - s) / (reps * copies) / (rows * cols / 32.0);
      if (ns < best[e]) best[e] = ns;
    }
  for (int e = 0; e < n; e++)
    if (best[e] < 1e29)
      printf("%s %s %.4f\n", engines[e] < 0 ? "gemv_q8" : atq_variant_family(engines[e]),
             engines[e] < 0 ? "ggml" : atq_variant_name(engines[e]), best[e]);
  return 0;
}
"""


def ggml_library() -> str | None:
    """libggml-cpu of llama-cpp-python, when it is installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    return str(path) if path.exists() else None


def main() -> None:
    from atensor.backend.quant.source import SOURCE
    from atensor.backend.quant import kernels as quant_kernels
    ggml = ggml_library()
    load_start = os.getloadavg()
    defaults = {f: quant_kernels.selected(f).name for f in ("gemv_f32", "gemv_q8")}
    with tempfile.TemporaryDirectory(prefix="quant-dot-") as tmp:
        src, exe = Path(tmp) / "dot.c", Path(tmp) / "dot"
        src.write_text(SOURCE + HARNESS)
        subprocess.run(["cc", "-O3", "-march=native", "-fno-tree-slp-vectorize", "-fno-math-errno", "-o", str(exe),
                        str(src), "-lm", "-lpthread", "-ldl"], check=True)
        results, tables = [], []
        for threads in THREADS:
            for fmt, r, c, count in SHAPES:
                for stream in (0, 1):
                    code = {"q4_1": 1, "q8_0": 2, "bf16": 4}[fmt]
                    out = subprocess.run([str(exe), str(code), str(r), str(c), str(stream), str(threads)]
                                         + ([ggml] if ggml else []), capture_output=True, text=True, check=True)
                    ns = {}
                    for line in out.stdout.splitlines():
                        family, name, value = line.split()
                        ns[f"{family} {name}"] = float(value)
                    entry = {"format": fmt, "rows": r, "cols": c, "count": count, "threads": threads,
                             "memory": "stream" if stream else "cache", "ns_per_block": ns,
                             "load_average": os.getloadavg()[0]}
                    results.append(entry)
                    print(entry, flush=True)
            tables.append(_family_tables(results, threads, defaults))
    load = os.getloadavg()
    for text in tables:
        print(text)
    path = write_results("quant_dot", {"shapes": results, "ggml": ggml, "defaults": defaults,
                                       "load_average_start": load_start, "load_average": load})
    print(f"wrote {path}")


def _family_tables(results: list[dict], threads: int, defaults: dict[str, str]) -> str:
    """One table per family at `threads` threads: ns per block of each variant, the fastest, and the
    default's time over the fastest's (and ggml's over the fastest, for the Q8 family at one thread)."""
    out = []
    for family in ("gemv_f32", "gemv_q8"):
        mine = [e for e in results if e["threads"] == threads]
        names = sorted({k.split(" ", 1)[1] for e in mine for k in e["ns_per_block"] if k.startswith(family)},
                       key=lambda n: (n == "ggml", n))
        rows = []
        for e in mine:
            ns = {k.split(" ", 1)[1]: v for k, v in e["ns_per_block"].items() if k.startswith(family)}
            ours = {n: v for n, v in ns.items() if n != "ggml"}
            if not ours:  # BF16 has no Q8-activation kernels
                continue
            win = min(ours, key=ours.get)
            rows.append([f"{e['format']} {e['rows']}x{e['cols']}", e["memory"], *[ns.get(n, "-") for n in names], win,
                         ns[defaults[family]] / ours[win]] + ([ns["ggml"] / ours[win]] if "ggml" in ns else []))
        header = ["shape", "memory", *names, "fastest", "default/fastest"] + (["ggml/fastest"] if "ggml" in names else [])
        out.append(table(f"{family}, {threads} thread(s), ns per 32-weight block ({'thread CPU' if threads == 1 else 'wall'} "
                         f"time, best of 5; lower is better); default {defaults[family]}", header, rows))
    return "\n".join(out)


if __name__ == "__main__":
    main()
