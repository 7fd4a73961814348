"""Sentence embeddings over HTTP: a trio server whose model runs on atensor, with dynamic batching.

    python examples/serve.py --port 8000 --batch-window-ms 5      # --devices 2: two replicas
    curl -s localhost:8000/embed -d '{"sentences": ["a cat", "a dog"]}'
    curl -s localhost:8000/health

Why this shape: the usual async model server pushes PyTorch into a thread pool, and the GIL-heavy
inference then competes with the event loop. Here a request handler only validates and tokenizes;
the model's graph is built off the loop thread, and `await model(batch).realize()` parks the batch's
task while atensor's queues compute, so `/health` and new requests are served meanwhile.

- Dynamic batching: requests that arrive within `--batch-window-ms` of the first one waiting (up to
  `--max-batch` sentences) are computed in one realize; each request gets its rows. The batch's
  sentences are packed several to a row (SentenceTokenizer.pack: each attends only to itself), so a
  batch computes ~75% real tokens where padding every sentence to the longest computed ~55%.
- Each replica's forward pass is an `atensor.jit` function: a batch shape met before is replayed from
  its captured task graph instead of being built and scheduled again (`--no-jit` builds every batch,
  off the loop thread). Replies are JSON-encoded in a worker thread: the loop only does HTTP.
- `--devices N`: one model replica per `CPU:k`; one batch worker per replica takes the next batch, so
  batches spread over the devices. On 2 cores one device served most (measured): its matmuls use
  both cores, and one batch in flight leaves the GIL to the loop between the Python steps.
- Kernels and captured graphs for the shapes that batches of the `--warmup-tokens` lengths pack into
  are made at start, and the long-lived objects are frozen out of the garbage collector, so neither
  stalls the loop later. `--stall-report-ms` prints where the loop was during each longer stall.
- The loop's thread comes first: atensor's worker threads run at OS niceness `--worker-nice` (5), the
  matmuls leave it a core, and a burst of requests is worked off in slices of `--loop-slice-ms` between
  which the loop polls its sockets again (http_server.LoopPacer), so /health never waits for a burst.
- Cancellation: a client that disconnects cancels its handler. A request still queued is dropped
  before it is batched; one whose batch is computing lets the batch finish (the other requests need
  it, and atensor never leaves a half-written buffer) and its rows are discarded.
- Graceful shutdown on SIGINT/SIGTERM: the listener closes (new connections are refused), requests in
  flight finish, requests on kept-alive connections get 503.
- `--mode sync` and `--mode torch` are the baselines of bench/serve_load.py: the same server computing
  each request synchronously in the handler, and sentence-transformers on PyTorch through
  `trio.to_thread.run_sync` per request.

HTTP is h11 on trio sockets (http_server.py: keep-alive, disconnects, graceful shutdown); `EmbedClient`
is a small h11 client.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Sequence

import numpy as np
import trio

import atensor
from atensor.backend import native
from atensor.hcq.queue import lower_priority

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_tools.py lies beside this file
# the tests and the bench reach EmbedClient as serve.EmbedClient
from http_server import HttpServer, Request, Response, error_response, json_response  # noqa: E402
from serve_tools import EmbedClient, StallWatch, TorchEngine  # noqa: E402,F401

JSON = dict[str, Any]


@dataclass
class ServerConfig:
    """What `serve` needs; the command line maps onto it one to one."""
    host: str = "127.0.0.1"
    port: int = 8000
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
    loop_slice_ms: float = 1.0      # the event loop polls its sockets at least this often under a burst


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
    done: trio.Event = field(default_factory=trio.Event)
    result: Optional[np.ndarray] = None
    body: Optional[bytes] = None  # the JSON reply, encoded off the loop thread
    error: Optional[BaseException] = None
    abandoned: bool = False


class BatchingEngine:
    """Dynamic batching over atensor model replicas: one batch worker task per replica.

    A worker takes the collect lock, waits for the first queued request, then takes every request that
    arrives until `window_s` after that first one's arrival (or until `max_batch` sentences), releases
    the lock for the next worker and computes its batch with one realize.
    """

    def __init__(self, models: Sequence[Any], window_s: float, max_batch: int, pad_multiple: int = 8,
                 pipeline: int = 1, jit: bool = True):
        self.models, self.window_s, self.max_batch = list(models), window_s, max_batch
        # per replica, the forward pass as an atensor.jit function: a batch shape seen three times (the
        # warm-up does that) is replayed from its captured task graph, not rebuilt and scheduled
        # (compiled to C in the background: the server starts without waiting for the compiler, and
        # a shape's replays switch to the C kernels once they are built)
        self.forwards = {id(m): atensor.jit(_forward_in_thread(m), max_programs=128, compile="background")
                         if jit else None for m in self.models}
        self.pipeline = pipeline  # batches in flight per replica: the next one builds while one computes
        self.pad_multiple = pad_multiple
        self.tokenizer = self.models[0].tokenizer
        self.max_tokens = self.models[0].max_seq_length
        self.name, self.dim = self.models[0].name, self.models[0].dim
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self._collect = trio.Lock()
        self._carry: Optional[_Pending] = None
        self.forward_passes = self.sentences_computed = self.abandoned = self.busy = 0
        self.forward_s = 0.0  # summed over batches: from the inputs' tensors to the realized result
        self.by_device: dict[str, int] = {}  # forward passes per replica's device

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode(sentences)

    async def run(self, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """The batch workers; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            for model in self.models:
                for _ in range(self.pipeline):
                    nursery.start_soon(self._worker, model)
            task_status.started()

    async def embed(self, ids: list[list[int]]) -> np.ndarray:
        """Queues one request's token ids and waits for its rows. Cancelled while queued: the request is
        dropped; cancelled while its batch computes: the batch finishes and these rows are discarded."""
        result = (await self._queued(ids)).result
        assert result is not None
        return result

    async def embed_reply(self, ids: list[list[int]]) -> bytes:
        """`embed`, as the encoded JSON body of POST /embed's reply."""
        body = (await self._queued(ids)).body
        assert body is not None
        return body

    async def _queued(self, ids: list[list[int]]) -> _Pending:
        pending = _Pending(ids, trio.current_time())
        self._send.send_nowait(pending)
        try:
            await pending.done.wait()
        except trio.Cancelled:
            pending.abandoned = True
            self.abandoned += 1
            raise
        if pending.error is not None:
            raise pending.error
        return pending

    async def warmup(self, token_lengths: Sequence[int]) -> None:
        """Computes one batch of each shape that batches of 1 to max_batch sentences of each of these
        lengths pack into, on each replica, so kernels are compiled (to C too, when replays are
        jitted) and schedules cached before serving:
        compiling holds the GIL for tens of ms, which /health would feel. (A kernel names its device's
        constants, so each replica compiles its own.)"""
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
            await trio.to_thread.run_sync(native.wait_background)
            for model, tokens in itertools.product(self.models, shapes.values()):
                await self._forward(model, tokens)

    async def _forward(self, model: Any, tokens: Any) -> Any:
        """The batch's realized (rows, dim) output: a replayed graph, or one built off the loop thread."""
        forward = self.forwards[id(model)]
        if forward is not None:
            return await forward(*model.inputs(tokens))
        out = await trio.to_thread.run_sync(model, tokens)  # building a graph is Python work: off the loop
        await out.realize()
        return out

    def _tokens(self, rows: list[list[int]]) -> Any:
        """The batch's token arrays: sentences packed several to a row (only a row's end is padding,
        so a batch of short sentences with one long one does not compute mostly padding), with the row
        count rounded to a bucket so that a server meets a few dozen shapes, each compiled once."""
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
                except trio.WouldBlock:
                    with trio.move_on_at(deadline):
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
                with trio.CancelScope(shield=True):  # the batch's other requests need it
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
            with trio.CancelScope(shield=True):
                # JSON encoding (float formatting) is ~1 ms per reply: in a thread, so the loop only sends
                bodies = await trio.to_thread.run_sync(_encode_replies, batch, self.name)
                for p, body in zip(batch, bodies):  # the server paces the replies (http_server.LoopPacer)
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
    return [reply_body(p.result, model) for p in batch]  # type: ignore[arg-type]


def _forward_in_thread(model: Any) -> Callable[..., Awaitable[Any]]:
    async def forward(*inputs: Any) -> Any:
        # the graph is built off the loop thread; atensor.jit realizes it (and records it) on the loop
        return await trio.to_thread.run_sync(model.forward, *inputs)
    forward.__name__ = f"forward_{model.device.replace(':', '_')}"
    return forward


def _row_bucket(rows: int) -> int:
    """1, 2, 4, 8, then multiples of 8."""
    return 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8


class SyncEngine(BatchingEngine):
    """Baseline (a): each request computed synchronously in its handler; the event loop waits."""

    async def run(self, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def embed(self, ids: list[list[int]]) -> np.ndarray:
        model = self.models[0]
        filler = [ids[0][:1] + ids[0][-1:]] * (_row_bucket(len(ids)) - len(ids))  # the same shapes as batches
        out = model(model.tokenizer.pad(ids + filler, self.pad_multiple))
        out.realize().wait()  # blocks the loop thread: what a naive async server does
        self.forward_passes += 1
        self.sentences_computed += len(ids)
        return out.numpy()[:len(ids)]

    async def embed_reply(self, ids: list[list[int]]) -> bytes:
        return reply_body(await self.embed(ids), self.name)


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


# ---- the HTTP app -------------------------------------------------------------------------------------

class EmbedApp:
    """POST /embed and GET /health: the handler that http_server.HttpServer calls per request."""

    def __init__(self, engine: Any, config: ServerConfig):
        self.engine, self.config = engine, config
        self.shutting_down = False
        self.in_flight = 0
        self.requests = 0
        self.started = time.monotonic()

    async def __call__(self, request: Request) -> Response:
        self.requests += 1
        path, method = request.path, request.method
        try:
            if path == "/health":
                if method != "GET":
                    raise BadRequest(405, f"{method} /health is not allowed; use GET")
                return json_response(200, self.health())
            if path == "/embed":
                if method != "POST":
                    raise BadRequest(405, f'{method} /embed is not allowed; POST {{"sentences": [...]}}')
                if self.shutting_down:
                    return error_response(503, "the server is shutting down")
                return Response(200, await self._embed(request))
            raise BadRequest(404, f"no route {path}; the server has POST /embed and GET /health")
        except BadRequest as bad:
            return error_response(bad.status, bad.message)

    def health(self) -> JSON:
        return {"status": "shutting down" if self.shutting_down else "ok", "model": self.engine.name,
                "mode": self.config.mode, "in_flight": self.in_flight, "requests": self.requests,
                "uptime_s": round(time.monotonic() - self.started, 3), **self.engine.stats()}

    async def _embed(self, request: Request) -> bytes:
        """The reply body. A client that disconnects meanwhile cancels the wait for its rows. Parsing and
        tokenizing, and sending the reply, each take their turn on the loop (request.pace)."""
        await request.pace()
        sentences = parse_embed_request(request.body, self.config)
        ids = self.engine.tokenize(sentences)
        check_lengths(ids, self.engine.max_tokens)
        self.in_flight += 1
        try:
            if isinstance(self.engine, TorchEngine):
                vectors = await request.until_disconnect(self.engine.embed_sentences, sentences)
                body = reply_body(vectors, self.engine.name)
            else:
                body = await request.until_disconnect(self.engine.embed_reply, ids)
        finally:
            self.in_flight -= 1
        await request.pace()
        return body


def reply_body(vectors: np.ndarray, model: str) -> bytes:
    """POST /embed's JSON reply. 8 decimals: about float32's precision, and 40% fewer bytes to encode and
    to send. Encoded a row at a time: json's C encoder holds the GIL for a whole call (~0.25 ms a row),
    and the event loop's thread should not wait for a whole 64-row reply."""
    rows = np.asarray(vectors, dtype=np.float64).round(8).tolist()
    encoded = ", ".join([json.dumps(row) for row in rows])
    return (f'{{"embeddings": [{encoded}], "model": {json.dumps(model)}, "dim": {int(vectors.shape[1])}}}'
            ).encode()


# ---- serving ------------------------------------------------------------------------------------------

def make_engine(config: ServerConfig) -> Any:
    """The engine for `config.mode`: atensor replicas with batching, or one of the two baselines."""
    from atensor.models.bert import SentenceEncoder
    if config.mode == "torch":
        return TorchEngine(256)
    if config.mode == "atensor":
        # the model's matmuls leave one core to the event loop: with every core in a matmul, the loop
        # thread waits for the scheduler to give it a core, and /health with it (measured on 2 cores,
        # bench/serve_load.py: two BLAS threads served 1.1x more sentences/s at 32 clients but kept
        # /health waiting up to 50-60 ms, one thread 17-18 ms)
        import atensor
        atensor.settings.blas_threads = config.blas_threads or max(1, (os.cpu_count() or 1) - 1)
        # and its worker threads run at a lower OS priority than the loop's thread, so a loop thread that
        # wakes up for a request gets a core first (bench/serve_load.py at 32 clients, 4 alternating
        # rounds: /health worst 10-13 ms at niceness 5 against 10-52 ms at 0)
        atensor.settings.worker_nice = config.worker_nice
    devices = [f"CPU:{k}" for k in range(config.devices)] if config.mode == "atensor" else ["CPU:0"]
    models = SentenceEncoder.replicas(devices)
    cls = BatchingEngine if config.mode == "atensor" else SyncEngine
    return cls(models, config.batch_window_ms / 1000, config.max_batch, config.pad_multiple, config.pipeline,
               config.jit)


async def serve(config: ServerConfig, engine: Any = None, *, shutdown: Optional[trio.Event] = None,
                handle_signals: bool = True, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
    """Serves until SIGINT/SIGTERM (when `handle_signals`) or until `shutdown` is set, then drains: the
    listener closes, requests in flight finish, and `serve` returns. `task_status.started((app, port))`
    reports the app and the bound port (port 0 in `config` picks a free one)."""
    engine = engine if engine is not None else make_engine(config)
    app = EmbedApp(engine, config)
    http = HttpServer(app, max_body_bytes=config.max_body_bytes,
                      slice_s=config.loop_slice_ms / 1000 if config.loop_slice_ms > 0 else math.inf)
    stop = shutdown if shutdown is not None else trio.Event()

    async with trio.open_nursery() as nursery:
        async def serve_http(task_status: trio.TaskStatus[int]) -> None:
            await http.serve(config.host, config.port, stop, task_status=task_status)
            nursery.cancel_scope.cancel()  # drained: stop the batch workers and the signal watcher

        async def mark_shutting_down() -> None:
            await stop.wait()
            app.shutting_down = True

        if config.warmup_tokens and hasattr(engine, "warmup"):
            await engine.warmup(config.warmup_tokens)
        _tune_gc()
        await nursery.start(engine.run)
        if config.stall_report_ms:
            nursery.start_soon(StallWatch(config.stall_report_ms / 1000).run)
        if handle_signals:
            nursery.start_soon(_on_signals, stop)
        nursery.start_soon(mark_shutting_down)
        port = await nursery.start(serve_http)
        task_status.started((app, port))


def _tune_gc() -> None:
    """The model, the compiled kernels and their graphs are long-lived: freeze them out of the cyclic
    collector, and collect the young generations less often. Measured: full collections over them
    paused every thread (the event loop too) for up to 65 ms under load; each batch's graph is freed
    by reference counting anyway."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


async def _on_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"serve: {signal.Signals(signum).name}: finishing requests in flight, refusing new ones",
                  file=sys.stderr, flush=True)
            stop.set()
            return


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--devices", type=int, default=1, help="model replicas, one per CPU:k")
    parser.add_argument("--batch-window-ms", type=float, default=5.0,
                        help="how long a batch waits for more requests after its first one")
    parser.add_argument("--max-batch", type=int, default=64, help="sentences per forward pass at most")
    parser.add_argument("--max-request-sentences", type=int, default=64)
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
    parser.add_argument("--loop-slice-ms", type=float, default=1.0,
                        help="under a burst of requests, the event loop polls its sockets again after this "
                             "much work (http_server.LoopPacer; 0: never in between)")
    parser.add_argument("--mode", choices=("atensor", "sync", "torch"), default="atensor",
                        help="atensor (batched, awaited), sync (baseline: computed in the handler), torch "
                             "(baseline: sentence-transformers in trio.to_thread.run_sync)")
    args = parser.parse_args(argv)
    config = ServerConfig(host=args.host, port=args.port, devices=args.devices,
                          batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                          max_request_sentences=args.max_request_sentences, mode=args.mode,
                          blas_threads=args.blas_threads or None, pipeline=args.pipeline,
                          warmup_tokens=tuple(args.warmup_tokens), pad_multiple=args.pad_multiple,
                          jit=not args.no_jit, stall_report_ms=args.stall_report_ms,
                          worker_nice=args.worker_nice, loop_slice_ms=args.loop_slice_ms)
    sys.setswitchinterval(5e-5)  # the loop thread gets the GIL back sooner from Python-heavy threads

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            app, port = await nursery.start(serve, config)
            print(f"serving {app.engine.name} ({config.mode}, {config.devices} device(s)) on "
                  f"http://{config.host}:{port}", file=sys.stderr, flush=True)
    trio.run(run)


if __name__ == "__main__":
    main()
