"""SmolLM2-135M from its shipped Q4_1 GGUF: atensor's packed weights against its float32 model and
transformers + torch float32, each in a fresh process (so each has its own peak resident memory).

    python bench/quant.py               # writes bench/results/quant.json
    BENCH_THREADS=1 python bench/quant.py

Per engine: decode tokens/s at batch 1 (64 greedy tokens after warm-up), time to first token of a
64-token prompt (median of 3), peak resident memory (VmHWM) and what it holds at the end (file-backed
pages: the memory-mapped weights; anonymous: everything else). The limit: a batch-1 decode reads
every weight once per token, so tokens/s is at most (memory read bandwidth / weight bytes read per
token); the table gives that limit per engine and each run's fraction of it.

llama.cpp (llama-cpp-python on the same file and threads) runs only when it is installed (an
optional bench dependency: it builds from source in ~15 minutes). Otherwise the anchor is the figure
issue 37 measured on this machine, quoted, NOT re-measured in this run: 117.7 decode tokens/s on 2
threads, first token in 159 ms for a 44-token prompt.

atensor's packed kernels run on a kernel's BLAS threads (BENCH_THREADS for the big ones, chosen by timing
unless ATENSOR_BLAS_THREADS is set; backend/quant/pool_c.py), as the float32 model's BLAS calls and
torch do. Timing on a shared 2-core machine is noisy: read ratios of one run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import memcpy_bandwidth, table, write_results  # noqa: E402

PROMPT_TOKENS, DECODE_TOKENS = 64, 64
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
ENGINES = ("atensor quantized", "atensor q8act", "atensor float32", "transformers float32", "llama.cpp")
LLAMA_CPP_ISSUE = {"decode_tps": 117.7, "ttft_ms": 159.0, "prompt_tokens": 44, "threads": 2,
                   "note": "issue 37's measurement on this machine (llama-cpp-python 0.3), not re-measured here"}


def memory() -> dict:
    """This process's peak and current resident memory, MB (/proc/self/status)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key = line.split(":")[0]
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(line.split()[1]) / 1024
    return {"peak_mb": fields["VmHWM"], "rss_mb": fields["VmRSS"], "file_mb": fields["RssFile"],
            "anon_mb": fields["RssAnon"]}


def read_bandwidth() -> float:
    """Bytes/s of summing a 256 MiB float32 array (a read-only stream, as a decode's weights are)."""
    a = np.ones(64 << 20, np.float32)
    a.sum()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        a.sum()
        times.append(time.perf_counter() - start)
    return a.nbytes / min(times)


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = " ".join(f"The {i}th item in the list is a small red box." for i in range(n))
    return tokenizer.encode(text)[:n]


def run_atensor(weights: str, ids: list[int]) -> dict:
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    gguf = load_gguf()
    start = time.perf_counter()
    model = Llama(gguf, slots=1, context=512, weights=weights)
    load_s = time.perf_counter() - start
    engine = LlamaEngine(model)
    for _ in range(3):  # run, capture, verify: every later call is a replay
        list(engine.generate(ids, 4))
    ttfts = []
    for _ in range(3):
        start = time.perf_counter()
        int(np.argmax(engine.prefill(0, ids)))
        ttfts.append(time.perf_counter() - start)
    gen = engine.generate(ids, DECODE_TOKENS + 1)
    first = next(gen)
    start = time.perf_counter()
    tokens = [first] + list(gen)
    decode = (len(tokens) - 1) / (time.perf_counter() - start)
    from atensor.tune import made
    choices = [f"{c.family} [{c.shape_class}]: {c.alternative} ({c.reason}"
               + (", " + ", ".join(f"{n} {t * 1e6:.0f} us" for n, t in sorted(c.times_s.items(), key=lambda kv: kv[1]))
                  if c.times_s else "") + ")" for c in made()]
    return {"ttft_ms": 1000 * statistics.median(ttfts), "decode_tps": decode, "load_s": load_s, "tokens": tokens,
            "kernel_choices": choices}


def run_transformers(ids: list[int]) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from atensor.models.gguf import default_gguf_path
    torch.set_num_threads(THREADS)
    path = default_gguf_path()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - start

    def generate(new_tokens: int) -> tuple[float, float, list[int]]:
        return hf_generate(model, ids, new_tokens)
    generate(4)
    ttfts = [generate(1)[0] for _ in range(3)]
    _, rate, tokens = generate(DECODE_TOKENS + 1)
    return {"ttft_ms": 1000 * statistics.median(ttfts), "decode_tps": rate, "load_s": load_s, "tokens": tokens}


def hf_generate(model, ids: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    """(time to first token, decode tokens/s, tokens) of a greedy run with the KV cache."""
    import torch
    with torch.no_grad():
        start = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        token = int(out.logits[0, -1].argmax())
        ttft = time.perf_counter() - start
        past, tokens = out.past_key_values, [token]
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, token = out.past_key_values, int(out.logits[0, -1].argmax())
            tokens.append(token)
        rate = (new_tokens - 1) / (time.perf_counter() - start)
    return ttft, rate, tokens


def _last_logits(llm) -> np.ndarray:
    """The last evaluated token's logits, a row of llama-cpp-python's `scores` array (its `eval_logits`
    property copies every evaluated row into Python lists: measured 3.2 tok/s through it against 68
    through this, so it timed the copy, not llama.cpp)."""
    return llm.scores[llm.n_tokens - 1]


def run_llama_cpp(ids: list[int]) -> dict | None:
    try:
        from llama_cpp import Llama as LlamaCpp
    except ImportError:
        return None
    from atensor.models.gguf import default_gguf_path
    start = time.perf_counter()
    llm = LlamaCpp(model_path=str(default_gguf_path()), n_threads=THREADS, n_ctx=512, verbose=False)
    load_s = time.perf_counter() - start
    ttfts = []
    for _ in range(4):  # a first full-prompt eval (its threads, buffers, weight repacking), then 3 timed
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        tokens = [int(np.argmax(_last_logits(llm)))]
        ttfts.append(time.perf_counter() - start)
    ttft = statistics.median(ttfts[1:])  # as atensor's: the median of 3 after warm-up
    start = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        llm.eval([tokens[-1]])
        tokens.append(int(np.argmax(_last_logits(llm))))
    return {"ttft_ms": 1000 * ttft, "decode_tps": DECODE_TOKENS / (time.perf_counter() - start), "load_s": load_s,
            "tokens": tokens}


def one(engine: str) -> None:
    """Runs one engine in this process and prints its JSON result (the parent reads it)."""
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    ids = prompt_ids(GGUFTokenizer(load_gguf().metadata), PROMPT_TOKENS)
    if engine == "atensor quantized":
        result = run_atensor("packed", ids)
    elif engine == "atensor q8act":  # llama.cpp's numerics: activations quantized to Q8_0 per 32
        result = run_atensor("q8act", ids)
    elif engine == "atensor float32":
        result = run_atensor("float32", ids)
    elif engine == "transformers float32":
        result = run_transformers(ids)
    else:
        result = run_llama_cpp(ids)
    if result is not None:
        result.update(memory())
    print("RESULT " + json.dumps(result))


def run_engine(engine: str) -> dict | None:
    """One engine of ENGINES measured in a fresh process (its own peak resident memory): its result,
    or None for llama.cpp when llama-cpp-python is not installed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS))
    if THREADS == 1:  # atensor's kernels on one thread too (else: the cores, or the faster count by timing)
        env["ATENSOR_BLAS_THREADS"] = "1"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", engine], env=env,
                          capture_output=True, text=True, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{engine} failed:\n{proc.stderr[-3000:]}")
    found = json.loads(line[len("RESULT "):])
    print(f"{engine}: {found and {k: v for k, v in found.items() if k != 'tokens'}}", flush=True)
    return found


def weight_bytes_per_token() -> dict[str, int]:
    """Bytes of weights a batch-1 decode step reads: the file's tensors as stored (quantized: the
    embedding is read whole as the tied output, one row as the lookup), or dequantized to float32."""
    from atensor.models.gguf import load_gguf
    gguf = load_gguf()
    stored = sum(gguf.stored(name).data.nbytes for name in gguf.weights)
    dense = sum(4 * int(np.prod(gguf.stored(name).shape)) for name in gguf.weights)
    return {"atensor quantized": stored, "atensor q8act": stored, "llama.cpp": stored, "atensor float32": dense,
            "transformers float32": dense}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        one(sys.argv[2])
        return
    results: dict[str, dict] = {}
    for engine in ENGINES:
        found = run_engine(engine)
        if found is not None:
            results[engine] = found
    per_token = weight_bytes_per_token()
    read_bps, copy_bps = read_bandwidth(), memcpy_bandwidth()
    reference = results["transformers float32"]["tokens"]
    rows = []
    for name, r in results.items():
        limit = read_bps / per_token[name]
        rows.append([name, r["decode_tps"], r["ttft_ms"], r["load_s"], r["peak_mb"], r["file_mb"], r["anon_mb"],
                     per_token[name] / 1e6, limit, r["decode_tps"] / limit,
                     r["decode_tps"] / results["transformers float32"]["decode_tps"], r["tokens"] == reference])
    if "llama.cpp" not in results:
        limit = read_bps / per_token["llama.cpp"]
        rows.append(["llama.cpp (issue 37, not this run)", LLAMA_CPP_ISSUE["decode_tps"],
                     f"{LLAMA_CPP_ISSUE['ttft_ms']:.0f} (44 tok)", "", "", "", "", per_token["llama.cpp"] / 1e6, limit,
                     LLAMA_CPP_ISSUE["decode_tps"] / limit, "", ""])
    print(table(f"SmolLM2-135M Q4_1 GGUF, batch 1, {PROMPT_TOKENS}-token prompt, {DECODE_TOKENS} greedy tokens, "
                f"{THREADS} threads; read bandwidth {read_bps / 1e9:.1f} GB/s (memcpy {copy_bps / 1e9:.1f} GB/s)",
                ["engine", "decode tok/s", "TTFT ms", "load s", "peak MB", "file MB", "anon MB",
                 "MB read/token", "limit tok/s", "of limit", "vs transformers", "same tokens"], rows))
    quantized = results["atensor quantized"]
    print(f"atensor quantized / llama.cpp decode: "
          f"{quantized['decode_tps'] / results.get('llama.cpp', LLAMA_CPP_ISSUE)['decode_tps']:.2f}x "
          f"({'this run' if 'llama.cpp' in results else 'against the issue figure, not re-measured'})")
    path = write_results("quant", {"threads": THREADS, "read_bps": read_bps, "memcpy_bps": copy_bps,
                                   "weight_bytes_per_token": per_token, "engines": results,
                                   "llama_cpp_issue_figures": LLAMA_CPP_ISSUE,
                                   "note": "one run on a shared 2-core machine; other sessions were running"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
