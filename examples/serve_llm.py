"""An OpenAI-compatible LLM server: SmolLM2-135M on atensor with continuous batching.

    python examples/serve_llm.py --port 8000 --slots 16
    curl -s localhost:8000/v1/completions -d '{"prompt": "The capital of France is", "max_tokens": 8}'
    curl -sN localhost:8000/v1/chat/completions \\
        -d '{"messages": [{"role": "user", "content": "Hi!"}], "stream": true}'

The API is the convention vLLM, llama.cpp's server and Ollama follow, so the `openai` client works:
POST /v1/completions (`prompt`) and /v1/chat/completions (`messages`, rendered with the model's chat
template from the GGUF metadata), with `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`,
`stream` (server-sent events, one chunk per generated token, then `data: [DONE]`) and vLLM's
`ignore_eos`; GET /health and GET /v1/models (the model is `smollm2`; another model name is a 404). Bad requests get a 4xx JSON
error in OpenAI's shape ({"error": {"message", "type", "param", "code"}}) and the server keeps serving.

Continuous batching (`Batcher`): each request gets a KV-cache slot. At every token boundary the batcher
admits waiting requests (a bucketed prefill of each into its free slot, those admitted together as the
rows of batched forwards: `LlamaEngine.prefill_many`), then runs one decode step
over the slots in use, hands each request its token, and frees the slots of requests that finished,
hit a stop string or end-of-turn token, or whose client went away (a disconnected client, streaming
or not, is noticed at the next token and its generation stops). `--slots` requests run at once; up to `--max-waiting`
more wait; beyond that a request gets 503. Greedy results are the same alone or batched (rows are
independent; tests/examples/test_serve_llm.py checks it).

Where the model runs, and why (the event-loop seam): the HTTP side is FastAPI on uvicorn (asyncio).
The batcher runs the model steps in ONE dedicated thread, through the blocking accessors
(`LlamaEngine.prefill_many` / `.decode`, outside any event loop), although atensor's realize is
awaitable under asyncio as under trio: the first call of a new shape (a batched prefill of a bucket
the warm-up did not cover) captures and compiles its program, seconds of host Python that must not
run on the event loop, and the sampling and detokenizing of every token stay off it too. Every model
step is in `Batcher._step` (the only place the thread touches the model); handlers only validate,
tokenize and await their request's token queue, which the thread fills through
`loop.call_soon_threadsafe`. The steps' kernels, those writing the KV cache at Variable positions
too, run compiled to C with the GIL released, so what the event loop shares the GIL with is the
thread's Python between steps (replay, sampling, detokenizing). Once serving, every thread but the
loop's runs at nice `--worker-nice` (10; `favour_the_loop`; examples/serve.py has the same flag for
atensor's workers, which this one sets too, and its own threads): the kernels may use both cores' BLAS
threads, and the loop still runs as soon as a request needs it. Measured with bench/llm.py's server
part on 2 cores, alternating rounds: with the nice and both BLAS threads (6 rounds), /health p99
10.9-14.3 ms (once 29.5) and 16 streams at 3.5-5.3x one stream (mean 4.4x); with decode's products
on one BLAS thread and no nice (4 rounds), 14.5-21.2 ms and 3.9-4.2x (mean 4.05x); both BLAS threads
without the nice had given a p99 of 38 ms.

An idle batcher woken by a request waits for the rest of its burst, until no request has arrived for
`--batch-wait-ms` (default 5 ms; at most 4 times that in all), so that requests sent together are
prefilled together (`Batcher._gather`); a busy one admits at the next token boundary.
"""
# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at definition

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional

MODEL_ID = "smollm2"
BATCH_WAIT = 0.005  # seconds an idle batcher waits for the rest of a burst (Batcher._gather)
WORKER_NICE = 10  # the model's threads' nice while serving (favour_the_loop)
STEP_TIMES = 64  # the recent decode steps whose durations /health summarizes (step_ms)


# ---- requests -------------------------------------------------------------------------------------------
class RequestError(Exception):
    """A request the server refuses: HTTP status, message, and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """One request's generation: its prompt ids and limits in, tokens out through `events` (an asyncio
    queue filled from the batcher's thread). `cancelled` is set by the handler when its client leaves."""
    ids: list[int]
    max_tokens: int
    params: Any                      # generation.SamplingParams
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    slot: Optional[int] = None
    tokens: list[int] = field(default_factory=list)
    uniforms: Any = None
    text: str = ""                   # decoded text handed out so far
    finish_reason: Optional[str] = None
    ignore_eos: bool = False         # vLLM's extension: generate max_tokens even past end-of-turn

    def emit(self, item: Any) -> None:
        """From the batcher's thread: hands `item` to the handler (a text delta, or a final dict)."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Batcher:
    """Continuous batching over the engine's KV-cache slots, in its own thread (see the module docstring).

    Invariant: a slot is in `active` from its request's prefill until the request finishes, is
    cancelled or fails; `free` holds exactly the other slots."""

    def __init__(self, engine: Any, tokenizer: Any, max_waiting: int, batch_wait: float = BATCH_WAIT):
        self.engine, self.tokenizer = engine, tokenizer
        self.max_waiting = max_waiting
        self.batch_wait = batch_wait  # seconds an idle batcher waits for a burst's next request
        self.waiting: deque[Generation] = deque()
        self.active: dict[int, Generation] = {}
        self.free = list(range(engine.model.slots))
        self.positions: dict[int, int] = {}
        self.last_token: dict[int, int] = {}
        self.wake = threading.Condition()
        self.stopping = False
        self.steps = 0
        self.prefills = 0  # token boundaries that admitted requests (LlamaEngine.prefill_many calls)
        self.step_times: deque[tuple[int, float]] = deque(maxlen=STEP_TIMES)  # (rows, s) of recent decodes
        self.thread = threading.Thread(target=self._run, name="llm-batcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout=30)

    def submit(self, gen: Generation) -> None:
        """Queues a request; a full waiting queue raises a 503 RequestError."""
        with self.wake:
            # room: every slot generating plus `max_waiting` queued (free slots take waiting ones next)
            if len(self.active) + len(self.waiting) >= self.engine.model.slots + self.max_waiting:
                raise RequestError(503, f"the server is at capacity ({len(self.active)} generating, "
                                        f"{len(self.waiting)} waiting); retry later", code="server_busy",
                                   kind="server_error")
            self.waiting.append(gen)
            self.wake.notify()

    def stats(self) -> dict:
        by_rows: dict[int, list[float]] = {}
        for rows, took in list(self.step_times):
            by_rows.setdefault(rows, []).append(took)
        return {"active": len(self.active), "waiting": len(self.waiting), "free_slots": len(self.free),
                "steps": self.steps, "prefills": self.prefills,
                # the median decode step of the recent ones, by the rows it decoded
                "step_ms": {rows: round(1000 * statistics.median(t), 2) for rows, t in sorted(by_rows.items())}}

    # ---- the batcher's thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self.wake:
                while not self.stopping and not self.active and not self.waiting:
                    self.wake.wait()
                if self.stopping:
                    return
                if not self.active:
                    self._gather()
                    if self.stopping:
                        return
                admitted = []
                while self.waiting and self.free:
                    gen = self.waiting.popleft()
                    if not gen.cancelled:
                        gen.slot = self.free.pop(0)
                        admitted.append(gen)
            try:
                self._step(admitted)
            except Exception as exc:  # noqa: BLE001 - each request in the step gets the error
                for gen in admitted + list(self.active.values()):
                    gen.emit({"error": f"generation failed: {exc}"})
                    self._release(gen)

    def _gather(self) -> None:
        """An idle batcher woken by a request waits for the rest of its burst before the prefill:
        until no request has arrived for `batch_wait` seconds (at most 4 of those in all), or every
        free slot has one. Requests that arrive together (clients started at once) are then prefilled
        as the rows of one batched forward instead of the first alone and the rest one step later
        (measured by bench/llm.py at 16 streams: the first request's lone prefill and decode step
        were ~140 ms of a 5.2 s run). Called holding `wake`; a busy batcher never waits (requests join
        at the next token boundary)."""
        if self.batch_wait <= 0:
            return
        deadline = time.monotonic() + 4 * self.batch_wait
        seen = len(self.waiting)
        while not self.stopping and seen < len(self.free):
            left = min(self.batch_wait, deadline - time.monotonic())
            if left <= 0:
                return  # the whole gathering time is used
            self.wake.wait(left)
            if len(self.waiting) == seen:
                return  # quiet for batch_wait (or woken for something else: stop, a cancel)
            seen = len(self.waiting)

    def _step(self, admitted: list[Generation]) -> None:
        """One token boundary: prefill the admitted requests into their slots, then one decode step for
        every active slot. The only place this thread runs the model (the await points, at merge)."""
        from atensor.models.generation import request_uniforms
        prefilled = self.engine.prefill_many({gen.slot: gen.ids for gen in admitted}) if admitted else {}
        self.prefills += bool(admitted)
        for gen in admitted:
            if gen.params.temperature > 0:
                gen.uniforms = request_uniforms(gen.params.seed, gen.max_tokens)
            self.active[gen.slot] = gen
            self.positions[gen.slot] = len(gen.ids)
            self._take(gen, prefilled[gen.slot])
        rows = {slot: (self.last_token[slot], self.positions[slot]) for slot, gen in self.active.items()}
        if not rows:
            return
        start = time.perf_counter()
        logits = self.engine.decode(rows)
        self.step_times.append((len(rows), time.perf_counter() - start))
        self.steps += 1
        for slot in rows:
            self.positions[slot] += 1
            self._take(self.active[slot], logits[slot])

    def _take(self, gen: Generation, logits: Any) -> None:
        """Samples the request's next token, hands out its text, and frees the slot when it is done."""
        from atensor.models.generation import sample
        if gen.cancelled:
            self._release(gen)
            return
        i = len(gen.tokens)
        token = sample(logits, gen.params, 0.0 if gen.uniforms is None else float(gen.uniforms[i]))
        if token in self.tokenizer.end_ids and not gen.ignore_eos:
            return self._finish(gen, "stop")
        gen.tokens.append(token)
        text = self.tokenizer.decode(gen.tokens)
        hit = min((text.find(s) for s in gen.stop if s in text), default=-1)
        if hit >= 0:
            text = text[:hit]
            gen.emit(text[len(gen.text):]) if len(text) > len(gen.text) else None
            gen.text = text
            return self._finish(gen, "stop")
        # hold back what could still become a stop string, and an incomplete UTF-8 sequence
        safe = len(text)
        for s in gen.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        if text.endswith("\ufffd"):
            safe = min(safe, len(text) - 1)
        safe = max(safe, len(gen.text))
        gen.emit(text[len(gen.text):safe])  # one chunk per token (empty while held back)
        gen.text = text[:safe]
        if len(gen.tokens) >= gen.max_tokens or self.positions[gen.slot] + 1 >= self.engine.context:
            tail = text[len(gen.text):]
            if tail:
                gen.emit(tail)
                gen.text = text
            return self._finish(gen, "length")
        self.last_token[gen.slot] = token

    def _finish(self, gen: Generation, reason: str) -> None:
        gen.finish_reason = reason
        gen.emit({"finish_reason": reason, "completion_tokens": len(gen.tokens)})
        self._release(gen)

    def _release(self, gen: Generation) -> None:
        slot = gen.slot
        if slot is not None and self.active.get(slot) is gen:
            del self.active[slot]
            self.positions.pop(slot, None)
            self.last_token.pop(slot, None)
        if slot is not None and slot not in self.free and slot not in self.active:
            with self.wake:
                self.free.append(slot)
                self.free.sort()
        gen.slot = None


# ---- validation -----------------------------------------------------------------------------------------
def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(400, f"'{name}' must be a number, got {json.dumps(value)}", param=name)
    if not lo <= value <= hi:
        raise RequestError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{name}' must be an integer, got {json.dumps(value)}", param=name)
    if not lo <= value <= hi:
        raise RequestError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
    return value


class Server:
    """The model, its tokenizer and the batcher, with the request parsing both endpoints share."""

    def __init__(self, engine: Any, tokenizer: Any, max_waiting: int, default_max_tokens: int = 64,
                 batch_wait: float = BATCH_WAIT, worker_nice: int = WORKER_NICE):
        self.engine, self.tokenizer = engine, tokenizer
        self.batcher = Batcher(engine, tokenizer, max_waiting, batch_wait)
        self.default_max_tokens = default_max_tokens
        self.worker_nice = worker_nice  # the nice favour_the_loop gives the other threads when serving

    def parse(self, body: Any, chat: bool, loop: asyncio.AbstractEventLoop) -> tuple[Generation, bool]:
        """A validated Generation and the `stream` flag, or a RequestError saying what is wrong."""
        from atensor.models.generation import SamplingParams
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        model = body.get("model", MODEL_ID)
        if model != MODEL_ID:
            raise RequestError(404, f"the model '{model}' does not exist; this server serves '{MODEL_ID}'",
                               param="model", code="model_not_found")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages):
                raise RequestError(400, "'messages' must be a non-empty list of {role, content} objects "
                                        "with string values", param="messages")
            prompt = self.tokenizer.render_chat(messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt:
                raise RequestError(400, "'prompt' is required and must be a non-empty string", param="prompt")
        ids = self.tokenizer.encode(prompt)
        context = self.engine.context
        if len(ids) >= context:
            raise RequestError(400, f"the prompt has {len(ids)} tokens; this server's context is {context} "
                                    f"tokens (prompt plus completion)", param="prompt" if not chat else "messages",
                               code="context_length_exceeded")
        max_tokens = _integer(body, "max_tokens", self.default_max_tokens, 1, context - 1)
        if "max_completion_tokens" in body:
            max_tokens = _integer(body, "max_completion_tokens", max_tokens, 1, context - 1)
        max_tokens = min(max_tokens, context - len(ids))
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        top_k = _integer(body, "top_k", 0, 0, self.tokenizer.vocab_size)
        seed = body.get("seed")
        if seed is None:
            seed = int.from_bytes(uuid.uuid4().bytes[:8], "little")
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise RequestError(400, f"'seed' must be an integer, got {json.dumps(seed)}", param="seed")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise RequestError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, f"'stream' must be true or false, got {json.dumps(stream)}", param="stream")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise RequestError(400, f"'ignore_eos' must be true or false, got {json.dumps(ignore_eos)}",
                               param="ignore_eos")
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        return Generation(ids, max_tokens, params, stop, loop, ignore_eos=ignore_eos), stream


# ---- the ASGI app ---------------------------------------------------------------------------------------
def favour_the_loop(nice: int) -> int:
    """Lowers every other thread of this process to `nice` (Linux; elsewhere nothing): called on the
    event loop's thread once the batcher and atensor's workers run, so the model's threads (the
    batcher, atensor's queue workers, the BLAS library's own) give way to the loop as soon as it can
    run, while they have every core it leaves. Threads those start later inherit their nice. Returns
    how many threads it lowered. Raising a thread's nice needs no privilege; lowering it back would."""
    tasks = Path("/proc/self/task")
    if nice <= 0 or not sys.platform.startswith("linux") or not tasks.is_dir():
        return 0
    loop_thread, lowered = threading.get_native_id(), 0
    for tid in (int(t.name) for t in tasks.iterdir()):
        if tid != loop_thread:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
                lowered += 1
            except OSError:  # the thread has ended
                pass
    return lowered


def make_app(server: Server) -> Any:
    """The FastAPI app over `server` (starts its batcher with the app, stops it on shutdown)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import atensor
        atensor.settings.worker_nice = server.worker_nice  # atensor's workers started from now on
        server.batcher.start()
        favour_the_loop(server.worker_nice)
        yield
        await asyncio.get_running_loop().run_in_executor(None, server.batcher.stop)

    app = FastAPI(title="atensor SmolLM2 server", lifespan=lifespan)

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error(RequestError(exc.status_code, message, code=code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(RequestError(400, str(exc)))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        return error(RequestError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error"))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": MODEL_ID, **server.batcher.stats()}

    def model_card() -> dict:
        return {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "atensor"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        if name != MODEL_ID:
            raise RequestError(404, f"the model '{name}' does not exist; this server serves '{MODEL_ID}'",
                               param="model", code="model_not_found")
        return model_card()

    async def read_json(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}") from None

    async def complete(request: Request, chat: bool) -> Any:
        body = await read_json(request)
        gen, stream = server.parse(body, chat, asyncio.get_running_loop())
        server.batcher.submit(gen)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if stream:
            return StreamingResponse(_sse(gen, rid, created, chat, kind), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        parts: list[str] = []
        # the body is read: the next ASGI message is http.disconnect, when the client goes away (uvicorn
        # does not cancel a handler whose client left, so the handler watches for it itself)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                item = await _next_event(gen, gone)
                if item is None:  # the client went away: its generation stops at the next token
                    return Response(status_code=499)
                if isinstance(item, str):
                    parts.append(item)
                elif "error" in item:
                    raise RequestError(500, item["error"], kind="server_error")
                else:
                    break
        finally:
            gen.cancelled = True  # a handler cancelled (client gone) frees the slot; a finished one is gone
            gone.cancel()
        text = "".join(parts)
        choice: dict = {"index": 0, "finish_reason": item["finish_reason"], "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = {"prompt_tokens": len(gen.ids), "completion_tokens": item["completion_tokens"],
                 "total_tokens": len(gen.ids) + item["completion_tokens"]}
        return {"id": rid, "object": kind, "created": created, "model": MODEL_ID, "choices": [choice],
                "usage": usage}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    return app


async def _disconnected(request: Any) -> None:
    """Returns once the client of `request` (whose body was read) has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next_event(gen: Generation, gone: "asyncio.Future[None]") -> Any:
    """The generation's next event, or None once the client is gone (`gone` done)."""
    if not gen.events.empty():
        return gen.events.get_nowait()
    getter = asyncio.ensure_future(gen.events.get())
    try:
        await asyncio.wait((getter, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return None


async def _sse(gen: Generation, rid: str, created: int, chat: bool, kind: str) -> AsyncIterator[str]:
    """Server-sent events: one chunk per generated token, a last chunk with the finish reason, [DONE].
    Closed early (the client went away), it marks the generation cancelled: the batcher frees its slot
    at the next token boundary."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: Optional[str], finish: Optional[str], first: bool = False) -> str:
        if chat:
            delta: dict = {} if text is None else {"content": text}
            if first:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        body = {"id": rid, "object": kind, "created": created, "model": MODEL_ID, "choices": [choice]}
        return f"data: {json.dumps(body)}\n\n"
    try:
        if chat:
            yield chunk("", None, first=True)
        while True:
            item = await gen.events.get()
            if isinstance(item, str):
                yield chunk(item, None)
            elif "error" in item:
                yield f"data: {json.dumps(RequestError(500, item['error'], kind='server_error').body())}\n\n"
                break
            else:
                yield chunk(None, item["finish_reason"])
                break
        yield "data: [DONE]\n\n"
    finally:
        gen.cancelled = True


# ---- start-up -------------------------------------------------------------------------------------------
def build_server(slots: int, context: int, max_waiting: int, warmup: bool = True,
                 prefill_buckets: Optional[list[int]] = None, batch_wait: float = BATCH_WAIT,
                 worker_nice: int = WORKER_NICE) -> Server:
    """Loads the model and tokenizer and, with `warmup`, captures and compiles, before the first request
    (3 calls each: run, capture, verify), every prefill bucket of one prompt, the batched prefills of
    the shortest bucket (the rows `prefill_batches` makes of a burst of short prompts: 4 and 16 for 16
    slots), and every decode (batch size, attention window). A batched prefill of a longer bucket is
    captured on its first use (one request burst pays it once): warming every one took minutes."""
    from atensor.models.generation import PREFILL_BUCKETS, LlamaEngine, batch_bucket, prefill_batches
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    gguf = load_gguf()
    tokenizer = GGUFTokenizer(gguf.metadata)
    engine = LlamaEngine(Llama(gguf, slots=slots, context=context), prefill_buckets or PREFILL_BUCKETS)
    if warmup:
        for _ in range(3):
            for length in engine.buckets:
                engine.prefill(0, [tokenizer.eos_id] * length if length < context else [1] * (context - 1))
            shortest = engine.buckets[0]
            for rows in sorted({r for n in range(2, slots + 1) for r in prefill_batches(n, shortest)} - {1}):
                engine.prefill_many({s: [tokenizer.eos_id] * shortest for s in range(min(rows, slots))})
            rows = 1
            while True:
                for window in engine.windows:  # each attention window's program (a history of `window`)
                    engine.decode({s: (1, window - 1) for s in range(rows)})
                if rows >= slots:
                    break
                rows = min(slots, batch_bucket(rows + 1))
    return Server(engine, tokenizer, max_waiting, batch_wait=batch_wait, worker_nice=worker_nice)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=int, default=16, help="requests generating at once (KV-cache slots)")
    parser.add_argument("--max-waiting", type=int, default=64, help="requests queued beyond the slots; then 503")
    parser.add_argument("--context", type=int, default=512, help="tokens per slot (prompt plus completion)")
    parser.add_argument("--prefill-buckets", type=int, nargs="*", default=None,
                        help="prompt lengths prefill is padded to (default 16 64 128 256 512)")
    parser.add_argument("--batch-wait-ms", type=float, default=1000 * BATCH_WAIT,
                        help="how long an idle server waits for more of a burst of requests before it "
                             "prefills them together (default %(default)s; 0: never)")
    parser.add_argument("--no-warmup", action="store_true", help="capture the steps on first use instead")
    parser.add_argument("--worker-nice", type=int, default=WORKER_NICE,
                        help="the nice of every thread but the event loop's, once serving (default "
                             "%(default)s; 0: leave them as they are)")
    args = parser.parse_args(argv)
    import uvicorn
    server = build_server(args.slots, args.context, args.max_waiting, warmup=not args.no_warmup,
                          prefill_buckets=args.prefill_buckets, batch_wait=args.batch_wait_ms / 1000,
                          worker_nice=args.worker_nice)
    print(f"serve_llm: {MODEL_ID} on http://{args.host}:{args.port} ({args.slots} slots, context "
          f"{args.context})", flush=True)
    uvicorn.run(make_app(server), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
