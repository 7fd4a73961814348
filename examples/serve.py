"""Sentence embeddings over HTTP: an ASGI app (Starlette) whose model runs on atensor, with dynamic batching.

    python examples/serve.py --port 8000 --batch-window-ms 5      # uvicorn (asyncio, uvloop if installed)
    python examples/serve.py --port 8000 --server hypercorn-trio   # the same app on trio, through hypercorn
    curl -s localhost:8000/embed -d '{"sentences": ["a cat", "a dog"]}'
    curl -s localhost:8000/health
    curl -s localhost:8000/v1/embeddings -d '{"input": ["a cat"]}'   # OpenAI's shape (the openai client works)

Why this shape: the usual async model server pushes PyTorch into a thread pool, and the GIL-heavy
inference then competes with the event loop. Here a request handler only validates and tokenizes;
the model's graph is built off the loop thread, and `await model(batch).realize()` parks the batch's
task while atensor's queues compute, so `/health` and new requests are served meanwhile. The app is
plain Starlette on anyio, so it runs under uvicorn (asyncio) and hypercorn's trio worker alike:
atensor's awaits work on both loops.

- Dynamic batching: requests that arrive within `--batch-window-ms` of the first one waiting (up to
  `--max-batch` sentences) are computed in one realize; each request gets its rows. The batch's
  sentences are packed several to a row (SentenceTokenizer.pack: each attends only to itself).
- Each replica's forward pass is an `atensor.jit` function: a batch shape met before is replayed from
  its captured task graph instead of being built and scheduled again (`--no-jit` builds every batch,
  off the loop thread). Replies are JSON-encoded in a worker thread: the loop only does HTTP.
- `--devices N`: one model replica per `CPU:k`; one batch worker per replica takes the next batch.
- Kernels and captured graphs for the shapes that batches of the `--warmup-tokens` lengths pack into
  are made at start (in the app's lifespan, before the server says it is serving), and long-lived
  objects are frozen out of the garbage collector, so neither stalls the loop later.
- The loop's thread comes first: atensor's worker threads run at OS niceness `--worker-nice` (5) and
  the matmuls leave it a core.
- Cancellation: a client that disconnects cancels its handler. A request still queued is dropped
  before it is batched; one whose batch is computing lets the batch finish (the other requests need
  it, and atensor never leaves a half-written buffer) and its rows are discarded.
- Errors: every bad request gets a 4xx JSON body {"error": "..."} saying what was wrong; 404 and 405
  too. Graceful shutdown on SIGINT/SIGTERM is the server's (uvicorn, hypercorn): the listener closes,
  requests in flight finish, then the batch workers stop.
- `--mode sync` and `--mode torch` are the baselines of bench/serve_load.py, in the same app: a
  synchronous handler (atensor computing each request in Starlette's thread pool, as a FastAPI `def`
  endpoint does), and sentence-transformers on PyTorch through Starlette's `run_in_threadpool`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import json
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

import anyio
import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import atensor
from atensor.backend.c import registry
from atensor.hcq.queue import lower_priority

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_tools.py lies beside this file
from serve_tools import StallWatch, TorchEngine  # noqa: E402

JSON = dict[str, Any]
SERVERS = ("uvicorn", "hypercorn-trio")


@dataclass
class ServerConfig:
    """What `make_app` and `main` need; the command line maps onto it one to one."""
    host: str = "127.0.0.1"
    port: int = 8000
    server: str = "uvicorn"         # uvicorn | hypercorn-trio
    devices: int = 1
    batch_window_ms: float = 5.0
    max_batch: int = 64             # sentences per forward pass
    max_request_sentences: int = 64
    max_body_bytes: int = 1 << 20
    mode: str = "atensor"           # atensor | sync | torch (the two baselines)
    pad_multiple: int = 8           # sequence lengths rounded up: fewer distinct kernels to compile
    pipeline: int = 1               # batches in flight per replica
    blas_threads: Optional[int] = None  # per big matmul (None: all cores but one); see make_engine
    worker_nice: int = 5            # > 0: atensor's worker threads yield a core to the event loop's thread
    warmup_tokens: tuple[int, ...] = ()  # compile the kernels for these lengths before serving
    jit: bool = True                # replay each batch shape's captured graph (atensor.jit)
    stall_report_ms: float = 0.0    # > 0: report event loop stalls longer than this (StallWatch)


class BadRequest(Exception):
    """Bad input: answered with `status` and a JSON body {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# ---- engines: sentences in, embeddings out -----------------------------------------------------------

@dataclass
class _Pending:
    ids: list[list[int]]
    arrived: float
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Optional[np.ndarray] = None
    body: Optional[bytes] = None  # the JSON reply, encoded off the loop thread
    error: Optional[BaseException] = None
    abandoned: bool = False
    encode: Optional[Callable[[np.ndarray], bytes]] = None  # the reply's encoder (default: /embed's)


class BatchingEngine:
    """Dynamic batching over atensor model replicas: one batch worker task per replica.

    A worker takes the collect lock, waits for the first queued request, then takes every request that
    arrives until `window_s` after that first one's arrival (or until `max_batch` sentences), releases
    the lock for the next worker and computes its batch with one realize. Made inside the running loop
    (the app's lifespan): its queue and lock belong to that loop.
    """

    def __init__(self, models: Sequence[Any], window_s: float, max_batch: int, pad_multiple: int = 8,
                 pipeline: int = 1, jit: bool = True):
        self.models, self.window_s, self.max_batch = list(models), window_s, max_batch
        # per replica, the forward pass as an atensor.jit function: a batch shape seen three times (the
        # warm-up does that) is replayed from its captured task graph, not rebuilt and scheduled
        # (compiled to C in the background; a shape's replays switch to the C kernels once built)
        self.forwards = {id(m): atensor.jit(_forward_in_thread(m), max_programs=128, compile="background")
                         if jit else None for m in self.models}
        self.pipeline = pipeline  # batches in flight per replica: the next one builds while one computes
        self.pad_multiple = pad_multiple
        self.tokenizer = self.models[0].tokenizer
        self.max_tokens = self.models[0].max_seq_length
        self.name, self.dim = self.models[0].name, self.models[0].dim
        self._send, self._receive = anyio.create_memory_object_stream[_Pending](math.inf)
        self._collect = anyio.Lock()
        self._carry: Optional[_Pending] = None
        self.forward_passes = self.sentences_computed = self.abandoned = self.busy = 0
        self.forward_s = 0.0  # summed over batches: from the inputs' tensors to the realized result
        self.by_device: dict[str, int] = {}  # forward passes per replica's device

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode(sentences)

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """The batch workers; runs until cancelled."""
        async with anyio.create_task_group() as tg:
            for model in self.models:
                for _ in range(self.pipeline):
                    tg.start_soon(self._worker, model)
            task_status.started()

    async def embed_reply(self, ids: list[list[int]],
                          encode: Optional[Callable[[np.ndarray], bytes]] = None) -> bytes:
        """Queues one request's token ids and returns the encoded JSON reply with its rows (`encode`:
        the rows to the body, off the loop; default /embed's). Cancelled while queued: the request is
        dropped; cancelled while its batch computes: the batch finishes and these rows are discarded."""
        pending = _Pending(ids, anyio.current_time(), encode=encode)
        self._send.send_nowait(pending)
        try:
            await pending.done.wait()
        except anyio.get_cancelled_exc_class():
            pending.abandoned = True
            self.abandoned += 1
            raise
        if pending.error is not None:
            raise pending.error
        assert pending.body is not None
        return pending.body

    async def warmup(self, token_lengths: Sequence[int]) -> None:
        """Computes one batch of each shape that batches of 1 to max_batch sentences of each of these
        lengths pack into, on each replica, so kernels are compiled (to C too, when replays are
        jitted) and schedules cached before serving: compiling holds the GIL for tens of ms, which
        /health would feel. (A kernel names its device's constants, so each replica compiles its own.)"""
        shapes: dict[tuple[int, ...], Any] = {}
        for length, count in itertools.product(token_lengths, range(1, self.max_batch + 1)):
            row = [101] + [1000] * max(0, length - 2) + [102]
            tokens = self._tokens([row] * count)
            shapes.setdefault(tokens.shape + tokens.pooling.shape if tokens.packed else tokens.shape, tokens)
        for model, tokens in itertools.product(self.models, shapes.values()):
            for _ in range(3 if self.forwards[id(model)] is not None else 1):  # run, capture, verify
                await self._forward(model, tokens)
        if any(f is not None for f in self.forwards.values()):
            # the captured kernels compile in the background (jit compile="background"): wait for them
            # off the loop, then replay each shape once more so its plan is lowered with the C kernels
            await anyio.to_thread.run_sync(registry.wait_background)
            for model, tokens in itertools.product(self.models, shapes.values()):
                await self._forward(model, tokens)

    async def _forward(self, model: Any, tokens: Any) -> Any:
        """The batch's realized (rows, dim) output: a replayed graph, or one built off the loop thread."""
        forward = self.forwards[id(model)]
        if forward is not None:
            return await forward(*model.inputs(tokens))
        out = await anyio.to_thread.run_sync(model, tokens)  # building a graph is Python work: off the loop
        return await out.realize()

    def _tokens(self, rows: list[list[int]]) -> Any:
        """The batch's token arrays: sentences packed several to a row, with the row count rounded to
        a bucket so that a server meets a few dozen shapes, each compiled once."""
        return self.tokenizer.pack(rows, _row_bucket)

    async def _first(self) -> _Pending:
        while True:
            item, self._carry = self._carry, None
            if item is None:
                item = await self._receive.receive()
            if not item.abandoned:
                return item

    async def _next_batch(self) -> list[_Pending]:
        async with self._collect:
            first = await self._first()
            batch, count = [first], len(first.ids)
            deadline = first.arrived + self.window_s
            while count < self.max_batch:
                item: Optional[_Pending] = None
                try:
                    item = self._receive.receive_nowait()  # already queued: taken even past the deadline
                except anyio.WouldBlock:
                    with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                        item = await self._receive.receive()
                if item is None:
                    break
                if item.abandoned:
                    continue
                if count + len(item.ids) > self.max_batch:
                    self._carry = item  # it starts the next batch: a request is never split
                    break
                batch.append(item)
                count += len(item.ids)
        return [p for p in batch if not p.abandoned]

    async def _worker(self, model: Any) -> None:
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            rows = [r for p in batch for r in p.ids]
            self.busy += 1
            try:
                tokens = self._tokens(rows)
                started = time.perf_counter()
                with anyio.CancelScope(shield=True):  # the batch's other requests need it
                    out = await self._forward(model, tokens)
                result = tokens.select(out.numpy())
                self.forward_s += time.perf_counter() - started
            except Exception as exc:  # a server bug, not bad input: each request of the batch gets it
                for p in batch:
                    p.error = exc
                    p.done.set()
                continue
            finally:
                self.busy -= 1
            self.forward_passes += 1
            self.by_device[model.device] = self.by_device.get(model.device, 0) + 1
            self.sentences_computed += len(rows)
            start = 0
            for p in batch:
                p.result = result[start:start + len(p.ids)]
                start += len(p.ids)
            with anyio.CancelScope(shield=True):
                # JSON encoding (float formatting) is ~1 ms per reply: in a thread, so the loop only sends
                bodies = await anyio.to_thread.run_sync(_encode_replies, batch, self.name)
                for p, body in zip(batch, bodies):
                    p.body = body
                    p.done.set()

    def stats(self) -> JSON:
        return {"forward_passes": self.forward_passes, "sentences_computed": self.sentences_computed,
                "abandoned_requests": self.abandoned, "batches_computing": self.busy,
                "forward_s": round(self.forward_s, 3),
                "jit": {m.device: dict(f.stats) for m in self.models
                        if (f := self.forwards[id(m)]) is not None},
                "devices": [m.device for m in self.models], "forward_passes_by_device": self.by_device}


def _encode_replies(batch: list[_Pending], model: str) -> list[bytes]:
    """The batch's reply bodies, in a worker thread that yields a core to the event loop's thread as
    atensor's workers do (settings.worker_nice): encoding is batch work, /health is not."""
    lower_priority(atensor.settings.worker_nice)
    return [p.encode(p.result) if p.encode is not None else reply_body(p.result, model)  # type: ignore[arg-type]
            for p in batch]


def _forward_in_thread(model: Any) -> Callable[..., Awaitable[Any]]:
    async def forward(*inputs: Any) -> Any:
        # the graph is built off the loop thread; atensor.jit realizes it (and records it) on the loop
        return await anyio.to_thread.run_sync(model.forward, *inputs)
    forward.__name__ = f"forward_{model.device.replace(':', '_')}"
    return forward


def _row_bucket(rows: int) -> int:
    """1, 2, 4, 8, then multiples of 8."""
    return 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8


class SyncEngine(BatchingEngine):
    """Baseline (a): a synchronous handler. Each request is computed on its own, blocking, in
    Starlette's thread pool (what a FastAPI `def` endpoint does); no batching."""

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    def embed_blocking(self, ids: list[list[int]]) -> np.ndarray:
        model = self.models[0]
        filler = [ids[0][:1] + ids[0][-1:]] * (_row_bucket(len(ids)) - len(ids))  # the same shapes as batches
        out = model(model.tokenizer.pad(ids + filler, self.pad_multiple)).realize()
        self.forward_passes += 1
        self.sentences_computed += len(ids)
        return out.numpy()[:len(ids)]  # blocks this pool thread until done (no loop runs here)

    async def embed_reply(self, ids: list[list[int]],
                          encode: Optional[Callable[[np.ndarray], bytes]] = None) -> bytes:
        encode = encode or (lambda vectors: reply_body(vectors, self.name))
        return await run_in_threadpool(lambda: encode(self.embed_blocking(ids)))


# ---- request validation -------------------------------------------------------------------------------

def parse_embed_request(body: bytes, config: ServerConfig) -> list[str]:
    """The sentences of a POST /embed body, or BadRequest saying what is wrong with it."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest(400, "the body is not UTF-8 text")
    except json.JSONDecodeError as exc:
        raise BadRequest(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno}")
    except RecursionError:
        raise BadRequest(400, "the body is not valid JSON for this server: nested too deeply")
    if not isinstance(data, dict):
        raise BadRequest(422, f'the body must be a JSON object like {{"sentences": [...]}}, got '
                              f"{type(data).__name__}")
    if "sentences" not in data:
        raise BadRequest(422, 'missing field "sentences" (a list of strings)')
    sentences = data["sentences"]
    if not isinstance(sentences, list):
        raise BadRequest(422, f'"sentences" must be a list of strings, got {type(sentences).__name__}')
    if not sentences:
        raise BadRequest(422, '"sentences" is empty: give at least one sentence')
    if len(sentences) > config.max_request_sentences:
        raise BadRequest(413, f"too many sentences: {len(sentences)}, at most {config.max_request_sentences} "
                              f"per request")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise BadRequest(422, f'"sentences"[{i}] must be a string, got {type(s).__name__}')
    return sentences


def check_lengths(ids: list[list[int]], max_tokens: int) -> None:
    for i, row in enumerate(ids):
        if len(row) > max_tokens:
            raise BadRequest(422, f'"sentences"[{i}] is too long: {len(row)} tokens, the model takes at most '
                                  f"{max_tokens} (including [CLS] and [SEP])")


def reply_body(vectors: np.ndarray, model: str) -> bytes:
    """POST /embed's JSON reply. 8 decimals: about float32's precision, and 40% fewer bytes to encode and
    to send. Encoded a row at a time: json's C encoder holds the GIL for a whole call (~0.25 ms a row),
    and the event loop's thread should not wait for a whole 64-row reply."""
    rows = np.asarray(vectors, dtype=np.float64).round(8).tolist()
    encoded = ", ".join([json.dumps(row) for row in rows])
    return (f'{{"embeddings": [{encoded}], "model": {json.dumps(model)}, "dim": {int(vectors.shape[1])}}}'
            ).encode()


# ---- the ASGI app -------------------------------------------------------------------------------------

class EmbedService:
    """POST /embed and GET /health, and the counters /health reports."""

    def __init__(self, config: ServerConfig, engine: Any = None):
        self.config, self.engine = config, engine
        self.shutting_down = False
        self.in_flight = 0
        self.requests = 0
        self.started = time.monotonic()

    async def health(self, request: Request) -> Response:
        self.requests += 1
        return JSONResponse({"status": "shutting down" if self.shutting_down else "ok",
                             "model": self.engine.name, "mode": self.config.mode, "server": self.config.server,
                             "in_flight": self.in_flight, "requests": self.requests,
                             "uptime_s": round(time.monotonic() - self.started, 3), **self.engine.stats()})

    async def embed(self, request: Request) -> Response:
        """The reply. A client that disconnects meanwhile cancels the wait for its rows."""
        self.requests += 1
        try:
            body = await self._read_body(request)
            sentences = parse_embed_request(body, self.config)
            ids = self.engine.tokenize(sentences)
            check_lengths(ids, self.engine.max_tokens)
        except BadRequest as bad:
            return error_response(bad.status, bad.message)
        if self.shutting_down:
            return error_response(503, "the server is shutting down")
        self.in_flight += 1
        try:
            if isinstance(self.engine, TorchEngine):
                reply = await _until_disconnect(request, self._torch_reply, sentences)
            else:
                reply = await _until_disconnect(request, self.engine.embed_reply, ids)
        finally:
            self.in_flight -= 1
        if reply is None:  # the client is gone: nobody reads this
            return Response(status_code=499)
        return Response(reply, media_type="application/json")

    async def openai_embeddings(self, request: Request) -> Response:
        """POST /v1/embeddings in OpenAI's shape (atensor.serve.embeddings), computed as /embed is."""
        from atensor.serve.embeddings import embeddings_body, parse_embeddings
        from atensor.serve.requests import RequestError
        self.requests += 1
        try:
            body = await self._read_body(request)
            req = parse_embeddings(body, self.engine.name, self.engine.dim, self.config.max_request_sentences)
            ids = self.engine.tokenize(req.inputs)
            too_long = [i for i, row in enumerate(ids) if len(row) > self.engine.max_tokens]
            if too_long:
                raise RequestError(400, f"'input'[{too_long[0]}] is too long: {len(ids[too_long[0]])} tokens, "
                                        f"the model takes at most {self.engine.max_tokens}", param="input")
            if self.shutting_down:
                raise RequestError(503, "the server is shutting down", kind="server_error")
        except BadRequest as bad:
            return JSONResponse(RequestError(bad.status, bad.message).body(), status_code=bad.status)
        except RequestError as bad:
            return JSONResponse(bad.body(), status_code=bad.status)
        tokens = sum(len(row) for row in ids)

        def encode(vectors: np.ndarray) -> bytes:
            return embeddings_body(vectors, self.engine.name, tokens, req.base64)
        self.in_flight += 1
        try:
            if isinstance(self.engine, TorchEngine):
                reply = await _until_disconnect(request, self._torch_vectors, req.inputs, encode)
            else:
                reply = await _until_disconnect(request, self.engine.embed_reply, ids, encode)
        finally:
            self.in_flight -= 1
        if reply is None:
            return Response(status_code=499)
        return Response(reply, media_type="application/json")

    async def _torch_vectors(self, sentences: list[str], encode: Callable[[np.ndarray], bytes]) -> bytes:
        return encode(await self.engine.embed_sentences(sentences))

    async def _torch_reply(self, sentences: list[str]) -> bytes:
        return reply_body(await self.engine.embed_sentences(sentences), self.engine.name)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(413, f"the body is larger than {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(413, f"the body is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


async def _until_disconnect(request: Request, fn: Callable[..., Awaitable[bytes]],
                           *args: Any) -> Optional[bytes]:
    """`await fn(*args)`, cancelled if the client disconnects first (then None)."""
    result: Optional[bytes] = None
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()
        tg.start_soon(watch)
        result = await fn(*args)
        tg.cancel_scope.cancel()
    return result


def error_response(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


ALLOWED = {"/embed": 'POST {"sentences": [...]}', "/v1/embeddings": 'POST {"input": [...]} (OpenAI)',
           "/health": "GET"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (and any HTTPException), as this server's JSON errors."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    path, method = request.url.path, request.method
    if status == 404:
        message = f"no route {path}; the server has POST /embed, POST /v1/embeddings and GET /health"
    elif status == 405:
        message = f"{method} {path} is not allowed; use {ALLOWED.get(path, 'another method')}"
    else:
        message = getattr(exc, "detail", None) or "internal error"
    return error_response(status, str(message))


def make_app(config: ServerConfig, engine_factory: Optional[Callable[[], Any]] = None) -> Starlette:
    """The ASGI app. Its lifespan makes the engine (inside the running loop), warms it up, starts the
    batch workers, and prints `serving ... on http://host:port` once requests can be answered."""
    service = EmbedService(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.engine = (engine_factory or (lambda: make_engine(config)))()
        if config.warmup_tokens and hasattr(service.engine, "warmup"):
            await service.engine.warmup(config.warmup_tokens)
        _tune_gc()
        async with anyio.create_task_group() as tg:
            await tg.start(service.engine.run)
            if config.stall_report_ms:
                tg.start_soon(StallWatch(config.stall_report_ms / 1000).run)
            print(f"serving {service.engine.name} ({config.mode}, {config.devices} device(s), "
                  f"{config.server}) on http://{config.host}:{config.port}", file=sys.stderr, flush=True)
            try:
                yield
            finally:
                service.shutting_down = True
                tg.cancel_scope.cancel()

    app = Starlette(routes=[Route("/embed", service.embed, methods=["POST"]),
                            Route("/v1/embeddings", service.openai_embeddings, methods=["POST"]),
                            Route("/health", service.health, methods=["GET"])],
                    exception_handlers={HTTPException: _http_error, Exception: _http_error},
                    lifespan=lifespan)
    app.state.service = service
    return app


# ---- serving ------------------------------------------------------------------------------------------

def make_engine(config: ServerConfig) -> Any:
    """The engine for `config.mode`: atensor replicas with batching, or one of the two baselines."""
    from atensor.models.bert import SentenceEncoder
    if config.mode == "torch":
        return TorchEngine(256)
    if config.mode == "atensor":
        # the model's matmuls leave one core to the event loop: with every core in a matmul, the loop
        # thread waits for the scheduler to give it a core, and /health with it (measured on 2 cores)
        atensor.settings.blas_threads = config.blas_threads or max(1, (os.cpu_count() or 1) - 1)
        # and its worker threads run at a lower OS priority than the loop's thread, so a loop thread that
        # wakes up for a request gets a core first
        atensor.settings.worker_nice = config.worker_nice
    devices = [f"CPU:{k}" for k in range(config.devices)] if config.mode == "atensor" else ["CPU:0"]
    models = SentenceEncoder.replicas(devices)
    cls = BatchingEngine if config.mode == "atensor" else SyncEngine
    return cls(models, config.batch_window_ms / 1000, config.max_batch, config.pad_multiple, config.pipeline,
               config.jit)


def _tune_gc() -> None:
    """The model, the compiled kernels and their graphs are long-lived: freeze them out of the cyclic
    collector, and collect the young generations less often. Measured: full collections over them
    paused every thread (the event loop too) for up to 65 ms under load; each batch's graph is freed
    by reference counting anyway."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one), bound before the server starts so its port is known."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(config: ServerConfig) -> None:
    """Serves `make_app(config)` with uvicorn (asyncio; uvloop when installed) or hypercorn's trio
    worker until SIGINT/SIGTERM, then shuts down gracefully."""
    sock = _listen(config.host, config.port)
    config.port = sock.getsockname()[1]
    app = make_app(config)
    if config.server == "uvicorn":
        import uvicorn
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                               timeout_graceful_shutdown=60))
        server.run(sockets=[sock])
        return
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve
    hc = Config()
    hc.bind = [f"fd://{sock.fileno()}"]
    hc.loglevel = "WARNING"
    hc.graceful_timeout = 60

    async def on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                print(f"serve: {signal.Signals(signum).name}: finishing requests in flight",
                      file=sys.stderr, flush=True)
                return
    trio.run(functools.partial(serve, app, hc, shutdown_trigger=on_signal))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (printed when serving)")
    parser.add_argument("--server", choices=SERVERS, default="uvicorn",
                        help="uvicorn (asyncio, uvloop when installed) or hypercorn-trio (the same app "
                             "on trio)")
    parser.add_argument("--devices", type=int, default=1, help="model replicas, one per CPU:k")
    parser.add_argument("--batch-window-ms", type=float, default=5.0,
                        help="how long a batch waits for more requests after its first one")
    parser.add_argument("--max-batch", type=int, default=64, help="sentences per forward pass at most")
    parser.add_argument("--max-request-sentences", type=int, default=64)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--pipeline", type=int, default=1,
                        help="batches in flight per replica (the next builds while one computes)")
    parser.add_argument("--pad-multiple", type=int, default=8,
                        help="--mode sync: pad sequence lengths to a multiple")
    parser.add_argument("--warmup-tokens", type=int, nargs="*", default=[10, 14, 18],
                        help="compile the kernels of every batch size for these sentence lengths at startup")
    parser.add_argument("--blas-threads", type=int, default=0,
                        help="BLAS threads of a big matmul (0: all cores but one, left to the event loop)")
    parser.add_argument("--worker-nice", type=int, default=5,
                        help="OS niceness of atensor's worker threads (Linux): the event loop's thread gets a "
                             "core before them on a busy machine (0: the same priority)")
    parser.add_argument("--no-jit", action="store_true",
                        help="build and schedule every batch's graph (no atensor.jit capture and replay)")
    parser.add_argument("--stall-report-ms", type=float, default=0.0,
                        help="diagnostics: print where the event loop was during each stall longer than this")
    parser.add_argument("--mode", choices=("atensor", "sync", "torch"), default="atensor",
                        help="atensor (batched, awaited), sync (baseline: a synchronous handler in the "
                             "thread pool), torch (baseline: sentence-transformers in run_in_threadpool)")
    args = parser.parse_args(argv)
    config = ServerConfig(host=args.host, port=args.port, server=args.server, devices=args.devices,
                          batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                          max_request_sentences=args.max_request_sentences, max_body_bytes=args.max_body_bytes,
                          mode=args.mode, blas_threads=args.blas_threads or None, pipeline=args.pipeline,
                          warmup_tokens=tuple(args.warmup_tokens), pad_multiple=args.pad_multiple,
                          jit=not args.no_jit, stall_report_ms=args.stall_report_ms,
                          worker_nice=args.worker_nice)
    sys.setswitchinterval(5e-5)  # the loop thread gets the GIL back sooner from Python-heavy threads
    run_server(config)


if __name__ == "__main__":
    main()
