"""Where a packed batch-1 decode step's time goes: SmolLM2-135M from its shipped Q4_1 GGUF, the packed
kernels on one thread against two.

    python bench/quant_step.py             # writes bench/results/quant_step.json
    python bench/quant_step.py --variants  # each batch-1 kernel variant: bench/results/quant_step_variants.json

Each thread count runs in a fresh process (ATENSOR_BLAS_THREADS fixes a big kernel's threads, which
the packed kernels read: backend/quant/pool_c.py), alternating 1, 2, 1, 2 so a slow spell of the
shared machine hits both. Per process:
- decode: 32 greedy tokens after warm-up, wall time and the process's CPU time per token;
- kernels: a profile of 16 decode steps; per kernel name, the median span times its count per step
  (the median: a kernel preempted by another process shows as one long span, not as the kernel's
  cost); packed matmuls apart from the rest. Under the profiler each kernel is its own command, so
  the profiled step is slower than a plain replay; the kernel spans are still the kernels' own time;
- host: the plain step's wall time less the kernels' time (the replay's submission, Python, waiting
  for a core);
- time to first token of a 64-token prompt (median of 3).
- the packed matmuls alone (`kernel_costs`, also `--kernels`): each of the step's shapes on the model's
  own bytes, CPU time on one thread and wall time on one and two threads, per token.
The limit: a batch-1 step reads every packed weight once (the tied Q8_0 embedding whole, as the output
projection), so tokens/s is at most read bandwidth / bytes per token; read bandwidth is measured with
one and two threads each summing its own 256 MiB array.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import table, write_results  # noqa: E402

DECODE_TOKENS, PROFILED_STEPS, PROMPT_TOKENS = 32, 16, 64
ROUNDS = 2


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = " ".join(f"The {i}th item in the list is a small red box." for i in range(n))
    return tokenizer.encode(text)[:n]


def one() -> dict:
    """This process's figures (ATENSOR_BLAS_THREADS set by the parent)."""
    import atensor
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    gguf = load_gguf()
    ids = prompt_ids(GGUFTokenizer(gguf.metadata), PROMPT_TOKENS)
    engine = LlamaEngine(Llama(gguf, slots=1, context=512))
    for _ in range(3):  # run, capture, verify: every later call is a replay
        list(engine.generate(ids, 4))
    ttfts = []
    for _ in range(3):
        start = time.perf_counter()
        int(np.argmax(engine.prefill(0, ids)))
        ttfts.append(time.perf_counter() - start)
    gen = engine.generate(ids, 8 + DECODE_TOKENS + PROFILED_STEPS + 1)
    for _ in range(8):
        next(gen)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(DECODE_TOKENS):
        next(gen)
    wall, cpu = (time.perf_counter() - wall) / DECODE_TOKENS, (time.process_time() - cpu) / DECODE_TOKENS
    with atensor.profile() as prof:
        for _ in range(PROFILED_STEPS):
            next(gen)
    by_name: dict[str, list[int]] = defaultdict(list)
    for span in prof.spans:
        if span.kind == "kernel":
            by_name[span.name].append(span.duration_ns)
    per_step = {name: statistics.median(times) * len(times) / PROFILED_STEPS / 1e6 for name, times in by_name.items()}
    packed = sum(ms for name, ms in per_step.items() if name.startswith("q_qmatmul"))
    kernels = sum(per_step.values())
    top = sorted(per_step.items(), key=lambda kv: -kv[1])[:8]
    return {"ttft_ms": 1000 * statistics.median(ttfts), "wall_ms": 1000 * wall, "cpu_ms": 1000 * cpu,
            "decode_tps": 1 / wall, "kernels_ms": kernels, "packed_matmul_ms": packed,
            "other_kernels_ms": kernels - packed, "host_ms": 1000 * wall - kernels,
            "kernels_per_step": sum(len(t) for t in by_name.values()) / PROFILED_STEPS, "top_kernels_ms": dict(top)}


def read_bandwidth(threads: int) -> float:
    """Bytes/s of `threads` threads each summing its own 256 MiB float32 array (numpy releases the GIL)."""
    arrays = [np.ones(64 << 20, np.float32) for _ in range(threads)]
    for a in arrays:
        a.sum()
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=a.sum) for a in arrays]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return sum(a.nbytes for a in arrays) / best


def bytes_per_token() -> int:
    """Weight bytes a packed batch-1 step reads: every stored tensor once (the tied Q8_0 embedding
    whole as the output projection; its one looked-up row is not counted again)."""
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    return sum(gguf.stored(name).data.nbytes for name in gguf.weights)


def kernel_costs(rounds: int = 5, repeat: int = 20, activations: str = "float32") -> dict:
    """The packed matmuls of one batch-1 decode step (every 2-D packed tensor of the file once, the
    tied embedding as the output projection) timed alone, on the model's own bytes, with `activations`'
    numerics (float32: the default; q8_0: `weights="q8act"`): per token, the
    CPU time on one thread (process time: what the kernels cost whatever the load) and the wall time on
    one and on two threads (alternating rounds, the median of each; wall time is what the load spoils)."""
    from atensor.backend.gemm import blas
    from atensor.backend.quant import kernels as quant_kernels
    from atensor.graph.quant import PackedShape
    counts, data = _step_shapes(activations)
    blas.use(1)
    x = {cols: np.random.default_rng(0).standard_normal((1, cols)).astype(np.float32)
         for cols in {s.cols for s in counts}}

    def timed(shape: PackedShape, threads: int) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            quant_kernels.matmul(x[shape.cols], data[shape], shape, threads=threads)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        return statistics.median(walls), statistics.median(cpus)
    per: dict[str, dict[str, list[float]]] = {}
    for shape in counts:
        timed(shape, 2)
        per[f"{shape.format.name} {shape.rows}x{shape.cols}"] = {"wall1": [], "wall2": [], "cpu1": []}
    for _ in range(rounds):
        for shape, count in counts.items():
            entry = per[f"{shape.format.name} {shape.rows}x{shape.cols}"]
            for threads in (1, 2):
                wall, cpu = timed(shape, threads)
                entry[f"wall{threads}"].append(1000 * wall * count)
                if threads == 1:
                    entry["cpu1"].append(1000 * cpu * count)
    total = {key: sum(statistics.median(e[key]) for e in per.values()) for key in ("cpu1", "wall1", "wall2")}
    return {"per_token_ms": total, "by_shape_ms": {k: {f: statistics.median(v) for f, v in e.items()}
                                                     for k, e in per.items()},
            "count": {f"{s.format.name} {s.rows}x{s.cols}": c for s, c in counts.items()}}


def _step_shapes(activations: str) -> tuple[dict, dict]:
    """({PackedShape: count per decode step}, {PackedShape: the model's bytes}) of the file's 2-D packed
    tensors (the tied embedding as the output projection), with `activations`' numerics."""
    from atensor.graph.quant import FORMATS, PackedShape
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    counts: dict = defaultdict(int)
    data = {}
    for name in gguf.weights:
        stored = gguf.stored(name)
        fmt = FORMATS.get(stored.type_name.lower())
        if fmt is not None and len(stored.shape) == 2:
            shape = PackedShape(fmt, *stored.shape, activations if fmt.block == 32 else "float32")
            counts[shape] += 1
            data.setdefault(shape, stored.data)
    return counts, data


def variant_costs(activations: str, rounds: int = 7, repeat: int = 9) -> dict:
    """Each variant (but the portable one) of the batch-1 family `activations` selects (gemv_f32 or
    gemv_q8) on one decode step's packed matmuls, the model's bytes: thread CPU time per token on one
    thread, every variant in each round (alternating, so a slow spell hits all), the median round."""
    from atensor.backend.gemm import blas
    from atensor.backend.quant import kernels as quant_kernels
    counts, data = _step_shapes(activations)
    family = "gemv_q8" if activations == "q8_0" else "gemv_f32"
    names = [n for n in quant_kernels.runnable(family) if n != "portable"]
    default = quant_kernels.selected(family).name
    blas.use(1)
    x = {c: np.random.default_rng(0).standard_normal((1, c)).astype(np.float32) for c in {s.cols for s in counts}}
    ms: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in names:
            total = 0.0
            for shape, count in counts.items():
                quant_kernels.matmul(x[shape.cols], data[shape], shape, name, threads=1)  # warm
                cpu = time.thread_time()
                for _ in range(repeat):
                    quant_kernels.matmul(x[shape.cols], data[shape], shape, name, threads=1)
                total += 1000 * (time.thread_time() - cpu) / repeat * count
            ms[name].append(total)
    med = {n: statistics.median(v) for n, v in ms.items()}
    return {"family": family, "default": default, "ms_per_token": med, "rounds_ms": ms}


def main_variants() -> None:
    """--variants: the batch-1 variants' A/B on a decode step's matmuls (both numerics); prints and writes
    bench/results/quant_step_variants.json."""
    load_start = os.getloadavg()
    out = {}
    for act in ("float32", "q8_0"):
        got = variant_costs(act)
        out[act] = got
        med, default = got["ms_per_token"], got["default"]
        best = min(med, key=med.get)
        print(table(f"{got['family']}: one decode step's packed matmuls, thread CPU ms per token, 1 thread (median of "
                    f"7 alternating rounds); default {default}; load average {os.getloadavg()[0]:.1f}",
                    ["variant", "ms per token", "over the fastest", "default over it"],
                    [[n, v, v / med[best], med[default] / v] for n, v in sorted(med.items(), key=lambda t: t[1])]))
    path = write_results("quant_step_variants", {**out, "load_average_start": load_start,
                                                 "load_average": os.getloadavg()})
    print(f"wrote {path}")


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1] == "--one":
        print("RESULT " + json.dumps(one()))
        return
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(ROUNDS):
        for threads in (1, 2):
            env = dict(os.environ, PYTHONPATH=str(ROOT), ATENSOR_BLAS_THREADS=str(threads))
            proc = subprocess.run([sys.executable, __file__, "--one"], env=env, capture_output=True, text=True,
                                  timeout=1800)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise RuntimeError(f"{threads} threads failed:\n{proc.stderr[-3000:]}")
            runs[threads].append(json.loads(line[len("RESULT "):]))
            print(f"{threads} thread(s): {runs[threads][-1]}", flush=True)
    per_token = bytes_per_token()
    bandwidth = {t: read_bandwidth(t) for t in (1, 2)}
    kernels = {act: kernel_costs(activations=act) for act in ("float32", "q8_0")}
    for act, costs in kernels.items():
        k = costs["per_token_ms"]
        print(table(f"the packed matmuls of one decode step timed alone (the model's bytes, 1 row, {act} "
                    f"activations), ms per token",
                    ["kernel", "count", "CPU 1 thread", "wall 1 thread", "wall 2 threads", "2 vs 1"],
                    [[name, costs["count"][name], e["cpu1"], e["wall1"], e["wall2"], e["wall1"] / e["wall2"]]
                     for name, e in costs["by_shape_ms"].items()] +
                    [["all", "", k["cpu1"], k["wall1"], k["wall2"], k["wall1"] / k["wall2"]]]))
    load = os.getloadavg()
    rows = []
    for threads, results in runs.items():
        for r in results:
            limit = bandwidth[threads] / per_token
            rows.append([threads, r["decode_tps"], r["wall_ms"], r["cpu_ms"], r["kernels_ms"], r["packed_matmul_ms"],
                         r["other_kernels_ms"], r["host_ms"], r["kernels_ms"] / r["wall_ms"],
                         per_token / r["packed_matmul_ms"] / 1e6, limit, r["decode_tps"] / limit, r["ttft_ms"]])
    print(table(f"SmolLM2-135M Q4_1, packed, batch-1 decode step by thread count ({ROUNDS} alternating rounds); "
                f"{per_token / 1e6:.1f} MB read per token; read bandwidth {bandwidth[1] / 1e9:.1f} GB/s (1 thread), "
                f"{bandwidth[2] / 1e9:.1f} GB/s (2); load average {load[0]:.1f}",
                ["threads", "tok/s", "wall ms", "CPU ms", "kernels ms", "packed mm ms", "other k ms", "host ms",
                 "kernels/wall", "packed GB/s", "limit tok/s", "of limit", "TTFT 64 ms"], rows))
    path = write_results("quant_step", {"bytes_per_token": per_token, "read_bps": bandwidth, "runs": runs,
                                        "kernels_alone": kernels, "load_average": load,
                                        "note": "shared 2-core machine; kernels: median span x count per step "
                                                "under the profiler; host: plain step wall less kernels"})
    print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--variants"]:  # each batch-1 kernel variant on a decode step's matmuls
        main_variants()
    elif sys.argv[1:] == ["--kernels"]:  # the kernels alone, printed (no model runs)
        print(json.dumps({act: kernel_costs(activations=act) for act in ("float32", "q8_0")}, indent=1))
    else:
        main()
