"""The OpenAI-compatible ASGI app (FastAPI) over a Batcher: /v1/completions, /v1/chat/completions,
/v1/models, /health and /metrics.

Why the handlers only validate, submit and read events: everything about generating lives in the
batcher, a task of the same event loop (started by the app's lifespan in an anyio task group, so the app
runs under uvicorn on asyncio as under hypercorn on trio). A handler reads its request's event stream
and writes JSON or server-sent events; a client that goes away marks its choices cancelled, and the
batcher frees their slots at the next token.
"""
# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at definition

import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

import anyio

from atensor.models.generation import SamplingParams
from atensor.serve import protocol
from atensor.serve.batcher import Batcher
from atensor.serve.grammar import Grammars
from atensor.serve.metrics import ServerMetrics
from atensor.serve.requests import Failure, Finish, Generation, RequestError, Token, TokenLogprobs, channel
from atensor.serve.tools import ToolCallStream


@dataclass
class ServerConfig:
    """What the app serves: the model's name and the request defaults."""
    model_id: str = "smollm2"
    default_max_tokens: int = 64
    on_start: Any = None  # called on the loop's thread once the batcher runs (favour_the_loop)


@dataclass
class _ChoiceResult:
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish: Optional[Finish] = None


def generations(req: protocol.Completion, send: Any, grammars: Optional[Grammars] = None) -> list[Generation]:
    """The request's n choices, each with its own seed (distinct samples at temperature > 0) and, under
    a grammar, its own parser state."""
    return [Generation(list(req.ids), req.max_tokens, SamplingParams(
        temperature=req.params.temperature, top_k=req.params.top_k, top_p=req.params.top_p, seed=seed,
        frequency_penalty=req.params.frequency_penalty, presence_penalty=req.params.presence_penalty),
        send, list(req.stop), req.ignore_eos, req.logprobs, index=i,
        constraint=grammars.constraint(req.grammar) if req.grammar is not None else None)
        for i, seed in enumerate(req.seeds())]


def make_app(batcher: Batcher, tokenizer: Any, config: ServerConfig = ServerConfig(),
             metrics: Optional[ServerMetrics] = None, grammars: Optional[Grammars] = None) -> Any:
    """The FastAPI app over `batcher` (its `run` task starts with the app and is cancelled at shutdown).
    `grammars` (over the tokenizer's vocabulary) serves `response_format` and `tools`; without it those
    are a 400."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    metrics = metrics if metrics is not None else batcher.metrics
    token_text = protocol.TokenText(tokenizer)
    model_id = config.model_id

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)
            if config.on_start is not None:
                config.on_start()
            yield
            tasks.cancel_scope.cancel()

    app = FastAPI(title=f"atensor {model_id} server", lifespan=lifespan)

    if metrics is not None:
        app.add_middleware(_StatusCounter, metrics=metrics)

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return error(RequestError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(RequestError(400, str(exc)))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        return error(RequestError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error"))

    @app.get("/health")
    async def health() -> dict:
        status = "ok" if batcher.running else "stopped"
        return {"status": status, "model": model_id, **batcher.stats()}

    @app.get("/metrics")
    async def scrape() -> Response:
        if metrics is None:
            raise RequestError(404, "this server was started without metrics", code="not_found")
        text, kind = metrics.render()
        return Response(text, media_type=kind)

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "atensor"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        if name != model_id:
            raise RequestError(404, f"the model '{name}' does not exist; this server serves '{model_id}'",
                               param="model", code="model_not_found")
        return model_card()

    async def complete(request: Request, chat: bool) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
        req = protocol.parse(body, chat, tokenizer, batcher.engine.context, model_id,
                             max_n=batcher.slots.slots, default_max_tokens=config.default_max_tokens,
                             grammars=grammars)
        send, receive = channel()
        gens = generations(req, send, grammars)
        batcher.submit(*gens)
        head = _Head(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), model_id, chat)
        if req.stream:
            return StreamingResponse(_sse(req, gens, receive, head, token_text), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = [_ChoiceResult() for _ in gens]
        gone, failure = False, None
        try:
            async with anyio.create_task_group() as tasks:
                async def watch() -> None:  # the body is read: the next ASGI message is the disconnect
                    nonlocal gone
                    while (await request.receive())["type"] != "http.disconnect":
                        pass
                    gone = True
                    tasks.cancel_scope.cancel()
                tasks.start_soon(watch)
                failure = await _collect(receive, results)
                tasks.cancel_scope.cancel()
        finally:
            for gen in gens:
                gen.cancelled = True  # a finished one is gone already; a live one is freed next token
        if gone:
            return Response(status_code=499)
        if failure is not None:
            raise RequestError(500, failure.message, kind="server_error")
        choices = []
        for i, result in enumerate(results):
            text = "".join(result.text)
            choice: dict = {"index": i, "finish_reason": result.finish.reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                if req.calls_tools:
                    calls = ToolCallStream()
                    calls.feed(text)
                    if calls.kind == "calls":
                        choice["message"] = {"role": "assistant", "content": None, "tool_calls": [
                            _call(c) for c in calls.calls]}
                        choice["finish_reason"] = _calls_finish(result.finish.reason)
                if req.logprobs is not None:
                    choice["logprobs"] = {"content": [token_text.chat_entry(t, lp) for t, lp in
                                                      zip(result.tokens, result.logprobs)], "refusal": None}
            else:
                choice["text"] = text
                if req.logprobs is not None:
                    choice["logprobs"] = token_text.completion_logprobs(result.tokens, result.logprobs)
            choices.append(choice)
        completion_tokens = sum(r.finish.completion_tokens for r in results)
        return {"id": head.rid, "object": "chat.completion" if chat else "text_completion",
                "created": head.created, "model": model_id, "choices": choices,
                "usage": protocol.usage(len(req.ids), completion_tokens)}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    return app


async def _collect(receive: Any, results: list[_ChoiceResult]) -> Optional[Failure]:
    """Reads events until every choice has finished, or one failed (returned)."""
    left = len(results)
    while left:
        event = await receive.receive()
        if isinstance(event, Failure):
            return event
        result = results[event.index]
        if isinstance(event, Token):
            result.text.append(event.text)
            result.tokens.append(event.token)
            if event.logprobs is not None:
                result.logprobs.append(event.logprobs)
        else:
            result.text.append(event.text)
            result.finish = event
            left -= 1
    return None


def _call(call: dict) -> dict:
    """A tool call in OpenAI's message shape."""
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}


def _calls_finish(reason: str) -> str:
    """The finish reason of an answer that is tool calls: "tool_calls", unless it was cut ("length")."""
    return "tool_calls" if reason == "stop" else reason


@dataclass(frozen=True)
class _Head:
    rid: str
    created: int
    model: str
    chat: bool


async def _sse(req: protocol.Completion, gens: list[Generation], receive: Any, head: _Head,
               token_text: protocol.TokenText) -> AsyncIterator[str]:
    """Server-sent events: one chunk per generated token (per choice), a chunk with each choice's finish
    reason, with `include_usage` a last chunk with no choices and the usage, then [DONE]. Closed early
    (the client went away), it marks the choices cancelled."""
    kind = "chat.completion.chunk" if head.chat else "text_completion"

    def chunk(choices: list, usage: Optional[dict] = None) -> str:
        body: dict = {"id": head.rid, "object": kind, "created": head.created, "model": head.model,
                      "choices": choices}
        if req.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    calls = [ToolCallStream() for _ in gens] if req.calls_tools else None

    def choice(index: int, text: Optional[str], finish: Optional[str], event: Optional[Token] = None,
               first: bool = False, tool_calls: Optional[list] = None) -> dict:
        logprobs = None
        if event is not None and event.logprobs is not None:
            logprobs = ({"content": [token_text.chat_entry(event.token, event.logprobs)], "refusal": None}
                        if head.chat else token_text.completion_logprobs([event.token], [event.logprobs]))
        if head.chat:
            delta: dict = {} if text is None else {"content": text}
            if tool_calls:
                delta["tool_calls"] = [d.chunk() for d in tool_calls]
            if first:
                delta["role"] = "assistant"
            return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
    try:
        if head.chat:
            yield chunk([choice(i, "", None, first=True) for i in range(len(gens))])
        left, completion_tokens = len(gens), 0
        while left:
            event = await receive.receive()
            if isinstance(event, (Token, Finish)) and calls is not None:  # read as text or tool calls
                stream = calls[event.index]
                content, deltas = stream.feed(event.text)
                if content or deltas or isinstance(event, Token) and stream.kind != "calls":
                    yield chunk([choice(event.index, content if content or not deltas else None, None,
                                        event if isinstance(event, Token) else None, tool_calls=deltas)])
                if isinstance(event, Finish):
                    left -= 1
                    completion_tokens += event.completion_tokens
                    reason = _calls_finish(event.reason) if stream.kind == "calls" else event.reason
                    yield chunk([choice(event.index, None, reason)])
            elif isinstance(event, Token):
                yield chunk([choice(event.index, event.text, None, event)])
            elif isinstance(event, Finish):
                left -= 1
                completion_tokens += event.completion_tokens
                yield chunk([choice(event.index, event.text or None, event.reason)])
            else:
                yield f"data: {json.dumps(RequestError(500, event.message, kind='server_error').body())}\n\n"
                break
        else:
            if req.include_usage:
                yield chunk([], protocol.usage(len(req.ids), completion_tokens))
        yield "data: [DONE]\n\n"
    finally:
        for gen in gens:
            gen.cancelled = True


class _StatusCounter:
    """ASGI middleware counting finished HTTP requests by path and status code (ServerMetrics.request)."""

    def __init__(self, app: Any, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope.get("path", "")
            endpoint = path if path in ("/v1/completions", "/v1/chat/completions", "/health", "/metrics",
                                        "/v1/models") else "other"
            self.metrics.request(endpoint, status[0])
