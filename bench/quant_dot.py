"""The batch-1 packed matmul against llama.cpp's own block dot products, one thread, the same blocks.

    python bench/quant_dot.py          # writes bench/results/quant_dot.json

Why: bench/llm.py compares whole decode steps, where threads, the other kernels and the host all
count; this isolates the per-32 block dot product. For each of SmolLM2-135M's matrix shapes it times,
in one C program, y = W x for one row of x:
- atensor float32: backend/quant/source.py's kernel with float32 activations (the default numerics);
- atensor q8act: the same kernel with x quantized to Q8 blocks (`weights="q8act"`);
- ggml: `ggml_vec_dot_q4_1_q8_1` / `ggml_vec_dot_q8_0_q8_0` of llama-cpp-python's libggml-cpu (the
  functions llama.cpp's matmul calls per row), after `quantize_row_q8_1` / `quantize_row_q8_0` of x.
All on one thread, thread CPU time (the load of a shared machine stretches wall time, not this), best
of 5 rounds, engines alternating within each round; "cache": the same matrix again and again (it sits
in L2/L3); "stream": a rotation over copies of it filling 96 MB, so each call reads from memory as a
decode step does. Blocks are random (d, m in [2^-7, 2^-6)), the same bytes for every engine.
Without llama-cpp-python the ggml column is absent.
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

SHAPES = [("q4_1", 1536, 576, 60), ("q4_1", 576, 1536, 30), ("q4_1", 576, 576, 60), ("q4_1", 192, 576, 60),
          ("q8_0", 49152, 576, 1)]  # format, rows, cols, count per decode step

HARNESS = r"""
#include <dlfcn.h>
#include <stdio.h>
typedef void (*ggml_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*ggml_quant_t)(const float *, void *, int64_t);
static double cpu_ns(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
  int fmt = atoi(argv[1]); int64_t rows = atoll(argv[2]), cols = atoll(argv[3]); int stream = atoi(argv[4]);
  void *ggml = argc > 5 ? dlopen(argv[5], RTLD_NOW) : NULL;
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
  for (int64_t b = 0; b < one * copies / bb; b++) {
    uint16_t h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * bb, &h, 2);
    if (fmt == ATQ_Q4_1) { h = 0x2000 + (rand() & 0x3ff); memcpy(w + b * bb + 2, &h, 2); }
  }
  for (int64_t i = 0; i < cols; i++) x[i] = (rand() % 2001 - 1000) / 1000.0f;
  int reps = (int)(1e7 / (rows * cols)) + 2;
  double best[3] = {1e30, 1e30, 1e30};
  for (int round = 0; round < 5; round++)
    for (int e = 0; e < 3; e++) {
      if (e == 2 && dot == NULL) continue;
      double s = cpu_ns();
      for (int r = 0; r < reps * copies; r++) {
        const uint8_t *wr = w + (r % copies) * one;
        if (e < 2) atq_matmul_run(-1, fmt | (e == 1 ? ATQ_Q8ACT : 0), x, wr, y, 1, cols, rows, 1);
        else {
          quant(x, xq, cols);
          for (int64_t i = 0; i < rows; i++) dot((int)cols, y + i, 0, wr + i * rb, 0, xq, 0, 1);
        }
      }
      double ns = (cpu_ns() - s) / (reps * copies) / (rows * cols / 32.0);
      if (ns < best[e]) best[e] = ns;
    }
  printf("%.4f %.4f %.4f\n", best[0], best[1], dot ? best[2] : -1.0);
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
    ggml = ggml_library()
    with tempfile.TemporaryDirectory(prefix="quant-dot-") as tmp:
        src, exe = Path(tmp) / "dot.c", Path(tmp) / "dot"
        src.write_text(SOURCE + HARNESS)
        subprocess.run(["cc", "-O3", "-march=native", "-fno-tree-slp-vectorize", "-fno-math-errno", "-o", str(exe),
                        str(src), "-lm", "-lpthread", "-ldl"], check=True)
        rows, results = [], []
        for fmt, r, c, count in SHAPES:
            for stream in (0, 1):
                code = {"q4_1": 1, "q8_0": 2}[fmt]
                out = subprocess.run([str(exe), str(code), str(r), str(c), str(stream)] + ([ggml] if ggml else []),
                                     capture_output=True, text=True, check=True).stdout.split()
                f32, q8, gg = (float(v) for v in out)
                entry = {"format": fmt, "rows": r, "cols": c, "count": count, "memory": "stream" if stream else "cache",
                         "ns_per_block": {"atensor float32": f32, "atensor q8act": q8, "ggml": gg if gg > 0 else None}}
                results.append(entry)
                rows.append([f"{fmt} {r}x{c}", entry["memory"], f32, q8, gg if gg > 0 else "-",
                             gg / f32 if gg > 0 else "-", gg / q8 if gg > 0 else "-"])
                print(rows[-1], flush=True)
    load = os.getloadavg()
    print(table(f"batch-1 packed matmul, one thread, CPU ns per 32-weight block (lower is better); load average "
                f"{load[0]:.1f}", ["shape", "memory", "atensor float32", "atensor q8act", "ggml (llama.cpp)",
                                   "ggml / float32", "ggml / q8act"], rows))
    path = write_results("quant_dot", {"shapes": results, "ggml": ggml, "load_average": load})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
