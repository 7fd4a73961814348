"""LLM inference: SmolLM2-135M from its shipped GGUF on atensor (packed weights, and float32) against
transformers + torch, and serving.

    python bench/llm.py                 # writes bench/results/llm.json
    python bench/llm.py --single-only   # the single-stream table alone: llm_single.json
    python bench/llm.py --single-only --engines "atensor quantized" "atensor q8act" llama.cpp   # ~2 min
    python bench/llm.py --build-llama-cpp --single-only   # llama-cpp-python built for this CPU first
    python bench/llm.py --server-only   # serving against the thread design, prefix TTFT: llm_server.json

- Single stream (bench/quant.py's engines, each in a fresh process): time to first token for a
  64-token prompt, decode tokens/s over 64 greedy tokens, peak resident memory; atensor with the
  file's packed weights (the default) and dequantized to float32, transformers + torch float32 with the
  same threads, llama.cpp (llama-cpp-python) only when it is installed (`--build-llama-cpp` builds it for
  this CPU: bench/llama_peer.py); otherwise issue 37's figures for it, labelled QUOTED (not measured in
  the run). Each engine's decode and first-token time against llama.cpp's of the same run; the packed
  kernels' choices each atensor engine made (atensor/tune/) are printed under the table.
- The physical limit: batch-1 decode reads every weight once per token, so tokens/s is at most
  (read bandwidth / weight bytes read per token): the packed bytes for atensor's packed model and
  llama.cpp, float32 bytes for the float32 engines; the table gives each run's fraction of it.
- Batched prefill: the server's 16 prompts prefilled one at a time (16 forwards) against as the rows
  of one forward (`LlamaEngine.prefill_many`), in alternating rounds (median and range).
- Serving: aggregate tokens/s with 1, 4 and 16 concurrent streams through examples/serve_llm.py
  (continuous batching, 16 slots), against transformers serving the same requests one at a time in a
  thread pool; /health is polled every 20 ms meanwhile (p99 and worst latency). Three alternating
  rounds of 1, 4 and 16 streams, the median round reported (with the range): one round each swung the
  16-to-1 ratio between 3.7x and 4.2x from run to run here.
- `--server-only`: the serving table alone, examples/serve_llm.py (the model loop a task on the event
  loop) against the thread design of `--baseline REV` (its examples/serve_llm.py from git, run on this
  tree's atensor), the two servers started side by side and measured in alternating rounds; then time
  to first token of a ~400-token prompt whose prefix a finished request left in a slot (prefix cache)
  against a cold one, alternating. Each server is measured once its background warm-up is done
  (/health's `warming` 0); the start-up table gives the seconds to /health and to that. Writes
  bench/results/llm_server.json (llm_server_partial.json for other stream counts), with the load average.
  `--no-warmup` starts the servers without their warm-up (minutes on a loaded machine); unmeasured
  rounds of the same loads capture the programs first.
Timing on a shared 2-core machine is noisy: read the ratios measured in the same run.
"""
from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import LOAD_AT_START, table, write_results  # noqa: E402

PROMPT_TOKENS, DECODE_TOKENS, STREAM_TOKENS = 64, 64, 32
SERVER_ROUNDS = 3  # alternating rounds of 1, 4 and 16 streams; the tables give the median round
THREADS = int(os.environ.get("BENCH_THREADS", "2"))



def bench_batched_prefill(gguf, tokenizer, rounds: int = 3) -> dict:
    """Seconds to prefill the 16 serving prompts one at a time and batched, in alternating rounds."""
    from atensor.models.generation import LlamaEngine
    from atensor.models.llama import Llama
    engine = LlamaEngine(Llama(gguf, slots=16, context=256), (16, 64))
    prompts = {slot: tokenizer.encode(text) for slot, text in enumerate(PROMPTS)}

    def alone() -> None:
        for slot, ids in prompts.items():
            engine.prefill(slot, ids)

    def batched() -> None:
        engine.prefill_many(prompts)
    for _ in range(3):  # run, capture, verify each program
        alone()
        batched()
    times: dict[str, list[float]] = {"one at a time": [], "batched": []}
    for _ in range(rounds):
        for name, fn in (("one at a time", alone), ("batched", batched)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in times.items()}


def load_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from atensor.models.gguf import default_gguf_path
    torch.set_num_threads(THREADS)
    path = default_gguf_path()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


# ---- serving ----------------------------------------------------------------------------------------------
PROMPTS = [f"Once upon a time, a robot named Unit {i} walked into" for i in range(16)]


async def _load(url: str, streams: int) -> dict:
    import httpx
    stop = asyncio.Event()
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=600) as client:
        async def health():
            while not stop.is_set():
                t = time.perf_counter()
                await client.get(url + "/health")
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)

        async def one(i: int) -> int:
            tokens = 0
            async with client.stream("POST", url + "/v1/completions",
                                     json={"prompt": PROMPTS[i], "max_tokens": STREAM_TOKENS, "temperature": 0,
                                           "stream": True, "ignore_eos": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"finish_reason": null' in line:
                        tokens += 1
            return tokens
        pinger = asyncio.create_task(health())
        start = time.perf_counter()
        counts = await asyncio.gather(*[one(i) for i in range(streams)])
        wall = time.perf_counter() - start
        stop.set()
        await pinger
        server = (await client.get(url + "/health")).json()
    latencies.sort()
    return {"streams": streams, "tokens": sum(counts), "wall_s": wall, "tps": sum(counts) / wall,
            "health_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "health_worst_ms": 1000 * latencies[-1], "health_samples": len(latencies),
            "server": server}


STARTS: dict[str, dict] = {}  # script name -> seconds to /health and to the end of its background warm-up


def _start_server(script: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """Starts `script` (examples/serve_llm.py, or the thread design's copy) on a free port, waits for
    /health and then for its background warm-up (/health's `warming` 0; the thread design has none), so
    that measured rounds meet the programs captured; records both times in STARTS."""
    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{script} exited")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    ready = time.perf_counter() - start
    while httpx.get(url + "/health", timeout=60).json().get("warming", 0):
        time.sleep(0.5)
    STARTS[" ".join([script.name, *flags])] = {"ready_s": ready, "warmed_s": time.perf_counter() - start}
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


THROUGHPUT_FLAGS = ("--slots", "16", "--context", "256", "--prefill-buckets", "16", "64")


def bench_server(stream_counts: list[int], baseline: Optional[Path] = None,
                 warmup: bool = True, round_count: int = SERVER_ROUNDS) -> dict[str, list[dict]]:
    """Aggregate tokens/s and /health latency at each stream count through examples/serve_llm.py and,
    with `baseline` (another server script, the thread design's), through it too: the two servers run
    side by side (one idle while the other is measured), in alternating rounds. Without `warmup` the
    servers start with --no-warmup and capture the programs of the measured loads in two unmeasured
    rounds of them (minutes less on a loaded machine)."""
    scripts = {"event loop": ROOT / "examples" / "serve_llm.py"}
    if baseline is not None:
        scripts["thread (baseline)"] = baseline
    servers = {}
    try:
        for name, script in scripts.items():
            servers[name] = _start_server(script, *THROUGHPUT_FLAGS, *([] if warmup else ["--no-warmup"]))
            for n in ([2] if warmup else stream_counts * 2):  # first requests after warm-up, or the capture
                asyncio.run(_load(servers[name][1], n))
        rounds: dict[str, dict[int, list[dict]]] = {name: {n: [] for n in stream_counts} for name in scripts}
        for i in range(round_count):  # alternating: a slow spell of the machine hits every count and server
            order = list(servers.items())[::-1 if i % 2 else 1]  # ABBA: a load that drifts favours neither
            for n in stream_counts:
                for name, (_, url) in order:
                    run = asyncio.run(_load(url, n))
                    if run["tokens"] != n * STREAM_TOKENS:
                        raise RuntimeError(f"{name}: {run['tokens']} tokens for {n} streams of {STREAM_TOKENS}")
                    rounds[name][n].append(run)
        return {name: [_median_round(n, runs) for n, runs in by_n.items()] for name, by_n in rounds.items()}
    finally:
        for proc, _ in servers.values():
            _stop(proc)


PREFIX_WORDS = 400  # tokens of the shared prefix (one word and its space: about one token each)


async def _ttft(url: str, prompt: str) -> float:
    """Seconds from sending a streamed completion to its first generated token."""
    import httpx
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        async with client.stream("POST", url + "/v1/completions", json={
                "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return time.perf_counter() - start
    raise RuntimeError("no token came back")


def bench_prefix_ttft(rounds: int = 5, warmup: bool = True) -> dict:
    """Time to first token of a prompt whose first ~400 tokens a finished request left in a slot (a
    prefix-cache hit: only the question is prefilled) against a cold one (a fresh prefix each time:
    the whole prompt prefilled), alternating, on a 4-slot server with a 512-token context."""
    import httpx
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    tokenizer = GGUFTokenizer(load_gguf().metadata)
    words = ["apple", "river", "stone", "cloud", "paper", "light", "green", "music", "table", "house"]

    def prefix(seed: int) -> str:
        rng = np.random.default_rng(seed)
        return " ".join(rng.choice(words, PREFIX_WORDS)) + "\n"
    proc, url = _start_server(ROOT / "examples" / "serve_llm.py", "--slots", "4", "--context", "512",
                              "--prefill-buckets", "16", "64", *([] if warmup else ["--no-warmup"]))
    try:
        shared = prefix(0)
        for i in range(1 if warmup else 3):  # without warm-up: each path's program run, captured, compiled
            asyncio.run(_ttft(url, shared + f"Question {-i}:"))  # leaves the shared prefix in a slot
            asyncio.run(_ttft(url, prefix(999 - i) + "Question 0:"))  # the cold path's programs
        cold, warm = [], []
        for i in range(rounds):
            cold.append(asyncio.run(_ttft(url, prefix(1000 + i) + f"Question {i}:")))
            warm.append(asyncio.run(_ttft(url, shared + f"Question {i + 1}:")))
        hits = httpx.get(url + "/health").json()["prefix_hits"]
    finally:
        _stop(proc)
    tokens = len(tokenizer.encode(shared + "Question 1:"))
    return {"prompt_tokens": tokens, "shared_tokens": len(tokenizer.encode(shared)), "rounds": rounds,
            "cold_ms": [1000 * t for t in cold], "cached_ms": [1000 * t for t in warm],
            "cold_median_ms": 1000 * statistics.median(cold), "cached_median_ms": 1000 * statistics.median(warm),
            "ratio": statistics.median(warm) / statistics.median(cold), "prefix_hits": hits}


def baseline_script(rev: str) -> Path:
    """examples/serve_llm.py as it was at `rev` (the thread design), written to a temporary file."""
    import tempfile
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:examples/serve_llm.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.gettempdir()) / f"serve_llm_{rev[:10]}.py"
    path.write_text(text)
    return path


def serving_tables(served: dict[str, list[dict]], pool: Optional[list[dict]] = None,
                   rounds: int = SERVER_ROUNDS) -> None:
    """Prints the serving table: each server's tokens/s and /health latency by stream count."""
    first = next(iter(served.values()))
    rows = []
    for i, s in enumerate(first):
        for name, runs in served.items():
            r = runs[i]
            row = [r["streams"], name, r["tps"], f"{min(r['tps_rounds']):.1f}-{max(r['tps_rounds']):.1f}",
                   r["tps"] / s["tps"], r["tps"] / runs[0]["tps"], r["health_p99_ms"], r["health_worst_ms"]]
            if pool is not None:
                row.append(r["tps"] / pool[i]["tps"])
            rows.append(row)
    head = ["streams", "server", "tok/s", "range", "vs event loop", "vs 1 stream", "/health p99 ms", "worst ms"]
    print(table(f"serving {STREAM_TOKENS} greedy tokens per request: aggregate tokens/s, median of "
                f"{rounds} alternating rounds (worst: of all rounds)",
                head + (["vs transformers pool"] if pool is not None else []), rows))


def server_main(baseline_rev: str, warmup: bool = True, counts: tuple = (1, 4, 16), rounds: int = SERVER_ROUNDS,
                prefix_ttft: bool = True) -> None:
    """`python bench/llm.py --server-only [--baseline REV]`: the serving tables alone (against the thread
    design at REV), the prefix-cache TTFT, written to bench/results/llm_server.json."""
    load = os.getloadavg()
    served = bench_server(list(counts), baseline_script(baseline_rev) if baseline_rev else None, warmup, rounds)
    serving_tables(served, rounds=rounds)
    prefix = bench_prefix_ttft(warmup=warmup) if prefix_ttft else None
    load = [round(max(a, b), 2) for a, b in zip(load, os.getloadavg())]
    print(table("start-up: seconds until /health answers, and until the background warm-up is done",
                ["server script", "ready s", "warmed s"],
                [[name, t["ready_s"], t["warmed_s"]] for name, t in STARTS.items()]))
    print(f"load average (the higher of start and end): {load[0]} {load[1]} {load[2]}")
    if prefix is not None:
        print(table(f"time to first token, {prefix['prompt_tokens']}-token prompt, {prefix['shared_tokens']} of them "
                    f"a prefix a finished request left in a slot, median of {prefix['rounds']} alternating rounds",
                    ["prompt", "TTFT ms", "vs cold"],
                    [["cold", prefix["cold_median_ms"], 1.0], ["cached prefix", prefix["cached_median_ms"],
                                                                prefix["ratio"]]]))
    full = prefix is not None and tuple(counts) == (1, 4, 16)  # else a partial run: its own file
    path = write_results("llm_server" if full else "llm_server_partial", {"counts": list(counts), "baseline_rev": baseline_rev, "server": served, "prefix_ttft": prefix,
                                        "warmup": warmup, "load_average": load, "start_s": STARTS,
                                        "note": "one run on a shared 2-core machine; other sessions were running"})
    print(f"wrote {path}")


def _median_round(streams: int, runs: list[dict]) -> dict:
    """The round of median tokens/s among `runs` of one stream count, with every round's tokens/s and
    the worst /health latency of all of them."""
    ordered = sorted(runs, key=lambda r: r["tps"])
    median = dict(ordered[len(ordered) // 2])
    median["tps_rounds"] = [r["tps"] for r in runs]
    median["health_worst_ms"] = max(r["health_worst_ms"] for r in runs)
    median["health_p99_ms_rounds"] = [r["health_p99_ms"] for r in runs]
    return median


def bench_transformers_pool(model, tokenizer, streams: int) -> dict:
    lock = threading.Lock()

    def serve(i: int) -> int:
        with lock:  # one request at a time, as a thread pool in front of one model serves them
            from bench.quant import hf_generate
            return len(hf_generate(model, tokenizer.encode(PROMPTS[i]), STREAM_TOKENS)[2])
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        total = sum(pool.map(serve, range(streams)))
    wall = time.perf_counter() - start
    return {"streams": streams, "tokens": total, "wall_s": wall, "tps": total / wall}


def single_stream(engines: tuple[str, ...] = ()) -> dict:
    """Each engine of bench/quant.py (or those named in `engines`) in a fresh process (decode tokens/s, time
    to first token of a 64-token prompt, peak resident memory), printed against the limit of its bytes
    read per token and against llama.cpp of the same run; llama.cpp measured when llama-cpp-python is
    installed (bench/llama_peer.py builds it), else its issue-37 figures, labelled quoted."""
    from bench.llama_peer import build_info
    from bench.quant import ENGINES, LLAMA_CPP_ISSUE, read_bandwidth, run_engine, weight_bytes_per_token
    single = {name: found for name in (engines or ENGINES) if (found := run_engine(name)) is not None}
    per_token, read_bps = weight_bytes_per_token(), read_bandwidth()
    peer = single.get("transformers float32")
    cpp = single.get("llama.cpp")
    rows = []
    for name, r in single.items():
        limit = read_bps / per_token[name]
        rows.append([name, r["ttft_ms"], r["ttft_ms"] / PROMPT_TOKENS, r["decode_tps"], r["peak_mb"],
                     per_token[name] / 1e6, limit, r["decode_tps"] / limit,
                     f"{r['decode_tps'] / cpp['decode_tps']:.2f}x" if cpp else "",
                     f"{r['ttft_ms'] / cpp['ttft_ms']:.2f}x" if cpp else "",
                     f"{r['decode_tps'] / peer['decode_tps']:.2f}x" if peer else "",
                     r["tokens"] == peer["tokens"] if peer else ""])
    if cpp is None:
        limit = read_bps / per_token["llama.cpp"]
        rows.append(["llama.cpp QUOTED (issue 37, not this run)", f"{LLAMA_CPP_ISSUE['ttft_ms']:.0f} (44 tok)",
                     LLAMA_CPP_ISSUE["ttft_ms"] / 44, LLAMA_CPP_ISSUE["decode_tps"], "", per_token["llama.cpp"] / 1e6,
                     limit, LLAMA_CPP_ISSUE["decode_tps"] / limit, "", "",
                     LLAMA_CPP_ISSUE["decode_tps"] / peer["decode_tps"] if peer else "", ""])
    load = os.getloadavg()
    print(table(f"single stream, {PROMPT_TOKENS}-token prompt, {DECODE_TOKENS} greedy tokens, {THREADS} threads; "
                f"limit: read bandwidth {read_bps / 1e9:.1f} GB/s / bytes of weights read per token; "
                f"load average {load[0]:.1f} (at start {LOAD_AT_START[0]:.1f})",
                ["engine", "TTFT ms", "ms/prompt token", "decode tok/s", "peak MB", "MB read/token", "limit tok/s",
                 "of limit", "decode vs llama.cpp", "TTFT vs llama.cpp", "vs transformers", "same tokens"], rows))
    for name, r in single.items():
        for choice in r.get("kernel_choices", []):
            print(f"  {name}: {choice}")
    return {"engines": {k: {f: v for f, v in r.items() if f != "tokens"} for k, r in single.items()},
            "same_tokens_as_transformers": {k: r["tokens"] == peer["tokens"] for k, r in single.items()} if peer else None,
            "vs_llama_cpp": {k: {"decode": r["decode_tps"] / cpp["decode_tps"], "ttft": r["ttft_ms"] / cpp["ttft_ms"]}
                             for k, r in single.items()} if cpp else None,
            "llama_cpp_build": build_info() if cpp else None,
            "read_bps": read_bps, "weight_bytes_per_token": per_token, "load_average": load,
            "llama_cpp_quoted": None if cpp else LLAMA_CPP_ISSUE}


def main(single_only: bool, engines: tuple[str, ...] = ()) -> None:
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    single = single_stream(engines)
    if single_only:
        path = write_results("llm_single", {"threads": THREADS, "single_stream": single,
                                            "command": " ".join(["python", *sys.argv]),
                                            "note": "one run on a shared 2-core machine; other sessions were running"})
        print(f"wrote {path}")
        return
    gguf = load_gguf()
    tokenizer = GGUFTokenizer(gguf.metadata)
    prefill = bench_batched_prefill(gguf, tokenizer)
    print(table(f"prefill of the {len(PROMPTS)} serving prompts ({min(len(tokenizer.encode(p)) for p in PROMPTS)}-"
                f"{max(len(tokenizer.encode(p)) for p in PROMPTS)} tokens, bucket 16), alternating rounds",
                ["prefill", "median s", "min s", "max s", "vs one at a time"],
                [[name, r["median_s"], r["min_s"], r["max_s"],
                  prefill["one at a time"]["median_s"] / r["median_s"]] for name, r in prefill.items()]))
    hf = load_transformers()
    counts = [1, 4, 16]
    served = bench_server(counts)
    pool = [bench_transformers_pool(hf, tokenizer, n) for n in counts]
    serving_tables(served, pool)
    path = write_results("llm", {"threads": THREADS, "single_stream": single, "prefill_16": prefill,
                                 "server": served["event loop"], "transformers_pool": pool,
                                 "note": "one run on a shared 2-core machine; other sessions were running"})
    print(f"wrote {path}")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="SmolLM2 inference and serving benchmarks")
    parser.add_argument("--server-only", action="store_true", help="only the serving and prefix-TTFT part")
    parser.add_argument("--single-only", action="store_true", help="only the single-stream table (llm_single.json)")
    parser.add_argument("--baseline", default="88d9cad", help="the git revision whose examples/serve_llm.py "
                        "(the thread design) the server part is compared with ('' : none)")
    parser.add_argument("--no-warmup", action="store_true", help="--server-only: start the servers without "
                        "warm-up and capture in unmeasured rounds (for a loaded machine)")
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 4, 16], help="--server-only: stream counts")
    parser.add_argument("--rounds", type=int, default=SERVER_ROUNDS, help="--server-only: alternating rounds")
    parser.add_argument("--no-prefix-ttft", action="store_true", help="--server-only: skip the prefix-cache TTFT")
    parser.add_argument("--engines", nargs="*", default=[], help="--single-only: these engines of bench/quant.py "
                        "only (e.g. 'atensor quantized' 'atensor q8act' llama.cpp)")
    parser.add_argument("--build-llama-cpp", action="store_true", help="build llama-cpp-python for this CPU first "
                        "if it is not installed (bench/llama_peer.py; ~15-20 min)")
    args = parser.parse_args()
    if args.build_llama_cpp:
        from bench.llama_peer import ensure
        ensure(build=True)
    if args.server_only:
        server_main(args.baseline, warmup=not args.no_warmup, counts=tuple(args.streams), rounds=args.rounds,
                    prefix_ttft=not args.no_prefix_ttft)
    else:
        main(args.single_only, tuple(args.engines))
