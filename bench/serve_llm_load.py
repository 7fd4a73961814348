"""Load test of the LLM server (examples/serve_llm.py): throughput and time to first token by stream
count, with half the requests JSON-schema constrained, the grammar mask's cost per token, speculative
decoding on and off, and llama.cpp's server (llama-cpp-python[server]) on the same prompts if installed.

    python bench/serve_llm_load.py                                # starts its servers; ~10-20 minutes
    python bench/serve_llm_load.py --streams 1 4 --tokens 16 --no-llama-cpp

(bench/serve_load.py is the embedding server's load test, examples/serve.py.) Each server runs in its
own process on a loopback port. N clients each send one streamed /v1/completions request at once
(greedy, `--tokens` tokens, ignore_eos for the free-text ones), the aggregate tokens/s is all generated
tokens over the wall time of the N, TTFT is each stream's time to its first token (p50, p99). The
constrained half asks for a JSON schema (a person: name, age, city, hobbies) and stops where the grammar
ends or at `--tokens` (the same length as the free text, so both halves keep their rows equally
long). At 1 stream "50%" is the one request, constrained. The mask's cost is what the server's /health reports: seconds spent filling and applying masks
over the tokens they chose, between the runs. Speculative decoding: one stream, a code-editing prompt
that repeats its function and a story prompt, greedy, on a server with --speculative 4 against the plain
one. llama.cpp's server (one request at a time: llama-cpp-python serializes them; with
--interrupt_requests False, else each new request cuts the stream before it short) runs the same GGUF file.
Targets (issue 51): constrained at most 10% below plain at 16 streams; speculative >= 1.5x on the
repetitive prompt; atensor at 16 streams at or above llama.cpp's server. Results:
bench/results/serve_llm_load.json with the machine (CPU model, flags, cores, load).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import machine_facts, table, write_results  # noqa: E402

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
SUBJECTS = ["a dragon", "the sea", "a robot", "winter", "a city", "the moon", "a garden", "a train"]
CODE_EDIT = ("Rename the variable `total` to `result` in this function.\n\ndef add_all(values):\n    total = 0\n"
             "    for value in values:\n        total = total + value\n    return total\n\nAnswer:\n\n"
             "def add_all(values):\n")
STORY = "Once upon a time, in a small village by the sea, there lived"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], health: str) -> tuple[subprocess.Popen, str, float]:
    """Starts a server command (its port appended by the caller as `{port}`), waits for `health`."""
    port = _port()
    proc = subprocess.Popen([c.replace("{port}", str(port)) for c in cmd], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, begun = f"http://127.0.0.1:{port}", time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {proc.returncode}")
        try:
            if httpx.get(url + health, timeout=1).status_code == 200:
                return proc, url, time.perf_counter() - begun
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float, int]:
    """(seconds to the first token, tokens generated) of one streamed completion: the usage chunk's
    count, or (llama.cpp's server sends none) the chunks that carried text."""
    start, first, tokens, chunks = time.perf_counter(), None, 0, 0
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True,
                                                                    "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (first if first is not None else time.perf_counter() - start), tokens or chunks


def body(i: int, tokens: int, constrained: bool) -> dict:
    if constrained:
        return {"prompt": f"Person {i} as JSON:\n", "max_tokens": tokens, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
    return {"prompt": f"Story {i} about {SUBJECTS[i % len(SUBJECTS)]}:", "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}


# llama-cpp-python's server has no ignore_eos, and banning the end tokens by logit_bias cost it most of its
# speed (a Python logits processor a token: 3.4 tok/s at one stream, load ~4-8), so its streams may end
# early at an end token: tokens/s counts what it generated
LLAMA_CPP_EXTRA = {"model": "smollm2"}


async def load(url: str, streams: int, tokens: int, constrained_share: float = 0.0,
               extra: Optional[dict] = None) -> dict:
    """One round of `streams` concurrent requests: aggregate tokens/s, TTFT p50/p99."""
    every = int(1 / constrained_share) if constrained_share else 0
    bodies = [{**body(i, tokens, bool(every) and i % every == 0), **(extra or {})} for i in range(streams)]
    async with httpx.AsyncClient(timeout=1200, limits=httpx.Limits(max_connections=streams + 2)) as client:
        start = time.perf_counter()
        runs = await asyncio.gather(*[_one(client, url, b) for b in bodies])
        wall = time.perf_counter() - start
    ttft = sorted(t for t, _ in runs)
    made = sum(n for _, n in runs)
    return {"streams": streams, "constrained_share": constrained_share, "tokens": made, "wall_s": wall,
            "tps": made / wall, "ttft_p50_ms": 1000 * statistics.median(ttft),
            "ttft_p99_ms": 1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]}


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=60).json()


def median_run(runs: list[dict]) -> dict:
    """The run of median tokens/s among alternating rounds, with every round's tokens/s beside it."""
    ordered = sorted(runs, key=lambda r: r["tps"])
    return {**ordered[len(ordered) // 2], "rounds_tps": [r["tps"] for r in runs]}


async def single(url: str, prompt: str, tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=1200) as client:
        start = time.perf_counter()
        ttft, made = await _one(client, url, {"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                                              "ignore_eos": True})
        return {"tokens": made, "tps": made / (time.perf_counter() - start), "ttft_ms": 1000 * ttft}


def llama_cpp_rows(streams: list[int], tokens: int, rounds: int) -> list[dict]:
    """llama.cpp's server (llama-cpp-python) on the same free-text prompts, up to 16 streams."""
    from atensor.models.gguf import default_gguf_path
    proc, url, _ = start([sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()),
                          "--port", "{port}", "--n_ctx", "2048", "--n_threads", str(os.cpu_count()),
                          "--model_alias", "smollm2", "--interrupt_requests", "False"], "/v1/models")
    try:
        asyncio.run(load(url, 1, 4, 0.0, LLAMA_CPP_EXTRA))  # its first request loads the weights
        rows = []
        for n in [n for n in streams if n <= 16]:
            run = median_run([asyncio.run(load(url, n, tokens, 0.0, LLAMA_CPP_EXTRA)) for _ in range(rounds)])
            rows.append(run)
            print(f"llama.cpp {n} streams: {run['tps']:.1f} tok/s ({run['tokens']} tokens), TTFT p50 "
                  f"{run['ttft_p50_ms']:.0f} ms p99 {run['ttft_p99_ms']:.0f} ms", flush=True)
        return rows
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--url", help="an atensor server already running (16 slots) instead of starting one")
    parser.add_argument("--spec-url", help="one running with --speculative 4 (4 slots) instead of starting one")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per figure (median)")
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--no-speculative", action="store_true")
    parser.add_argument("--llama-cpp-only", action="store_true",
                        help="measure llama.cpp's server alone, into the results file's llama_cpp entry")
    args = parser.parse_args()
    machine = machine_facts()
    print(f"machine: {machine}", flush=True)
    server = [sys.executable, str(ROOT / "examples" / "serve_llm.py"), "--port", "{port}", "--context", "512",
              "--prefill-buckets", "16", "64", "--no-background-warmup", "--max-waiting", "128"]
    procs = []
    results: dict[str, Any] = {"machine_facts": machine, "tokens": args.tokens}
    if args.llama_cpp_only:
        old = json.loads((ROOT / "bench" / "results" / "serve_llm_load.json").read_text())
        old["llama_cpp"], old["llama_cpp_machine"] = llama_cpp_rows(args.streams, args.tokens, args.rounds), machine
        print(write_results("serve_llm_load", {k: v for k, v in old.items() if k not in ("benchmark", "time")}))
        return
    try:
        url = args.url
        if url is None:
            proc, url, took = start(server + ["--slots", "16"], "/health")
            procs.append(proc)
            results["atensor_ready_s"] = took
        asyncio.run(load(url, 2, 4))  # the first requests' programs
        rows = []
        for n in args.streams:
            runs: dict[float, list[dict]] = {0.0: [], 0.5: []}
            for _ in range(args.rounds if n <= 16 else 1):  # plain and constrained alternating
                for share in (0.0, 0.5):
                    before = health(url)
                    run = asyncio.run(load(url, n, args.tokens, share))
                    after = health(url)
                    masked = after["masked_tokens"] - before["masked_tokens"]
                    spent = (after["mask_us_per_token"] * after["masked_tokens"]
                             - before["mask_us_per_token"] * before["masked_tokens"])
                    run["mask_us_per_token"] = spent / masked if masked else None
                    run["load"] = os.getloadavg()[0]
                    runs[share].append(run)
            for share, got in runs.items():
                run = median_run(got)
                rows.append(run)
                print(f"atensor {n} streams, {share:.0%} constrained: {run['tps']:.1f} tok/s (rounds "
                      f"{[round(r, 1) for r in run['rounds_tps']]}), TTFT p50 {run['ttft_p50_ms']:.0f} ms p99 "
                      f"{run['ttft_p99_ms']:.0f} ms (load {run['load']:.1f})", flush=True)
        results["atensor"] = rows
        if not args.no_speculative:
            spec_url = args.spec_url
            if spec_url is None:
                proc, spec_url, _ = start(server + ["--slots", "4", "--speculative", "4"], "/health")
                procs.append(proc)
            spec = {}
            for name, prompt in (("code_edit", CODE_EDIT), ("story", STORY)):
                for where in (url, spec_url):
                    asyncio.run(single(where, prompt, 8))  # capture the shapes first
                runs = {"off": [], "on": []}
                for _ in range(args.rounds):  # off and on alternating
                    for label, where in (("off", url), ("on", spec_url)):
                        runs[label].append(asyncio.run(single(where, prompt, 64)))
                for label in runs:
                    spec[f"{name}_{label}"] = median_run(runs[label])
                spec[f"{name}_speedup"] = spec[f"{name}_on"]["tps"] / spec[f"{name}_off"]["tps"]
                print(f"speculative {name}: off {spec[name + '_off']['tps']:.1f} tok/s, on "
                      f"{spec[name + '_on']['tps']:.1f} tok/s ({spec[name + '_speedup']:.2f}x; rounds off "
                      f"{[round(r, 1) for r in spec[name + '_off']['rounds_tps']]}, on "
                      f"{[round(r, 1) for r in spec[name + '_on']['rounds_tps']]})", flush=True)
            spec["server"] = health(spec_url)
            results["speculative"] = spec
        if not args.no_llama_cpp:
            try:
                import llama_cpp  # noqa: F401
                import llama_cpp.server  # noqa: F401
            except ImportError as exc:
                results["llama_cpp"] = f"not installed ({exc})"
            else:
                results["llama_cpp"] = llama_cpp_rows(args.streams, args.tokens, args.rounds)
    finally:
        for proc in procs:
            stop(proc)
    results["load_at_end"] = os.getloadavg()
    plain = {r["streams"]: r for r in results["atensor"] if r["constrained_share"] == 0}
    peer = {r["streams"]: r for r in results["llama_cpp"]} if isinstance(results.get("llama_cpp"), list) else {}
    print(table(f"atensor serve_llm, {args.tokens} tokens a stream ({machine['cpu']}, {machine['cores']} cores, "
                f"load {machine['load']})", ["streams", "constrained", "tok/s", "vs plain", "TTFT p50 ms",
                                             "TTFT p99 ms", "mask us/token", "llama.cpp tok/s"],
                [[r["streams"], f"{r['constrained_share']:.0%}", r["tps"], f"{r['tps'] / plain[r['streams']]['tps']:.2f}x",
                  r["ttft_p50_ms"], r["ttft_p99_ms"], r["mask_us_per_token"] or "-",
                  peer[r["streams"]]["tps"] if r["streams"] in peer and not r["constrained_share"] else "-"]
                 for r in results["atensor"]]))
    print(write_results("serve_llm_load", results))


if __name__ == "__main__":
    main()
