"""One request's generation as the batcher sees it, and the events it hands to the request's handler.

Why a record per choice with a shared channel: a request asking for `n` choices is `n` generations, each
in its own KV-cache slot with its own seed, and its handler reads one stream of events tagged with the
choice's index, so streaming interleaves the choices as they are generated and a non-streaming
request gathers them, with no per-choice task.

The channel is an anyio memory stream: the batcher runs on the handler's event loop (trio or asyncio),
so it sends without blocking and the handler awaits the next event, with no thread in between.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import anyio
import numpy as np

from atensor.models.generation import SamplingParams


class RequestError(Exception):
    """A request the server refuses: HTTP status, message, and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error", headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}  # of the HTTP answer (429's Retry-After)

    def body(self) -> dict:
        """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability under the model and the `top` most likely alternatives."""
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Token:
    """A generated token: the text it adds (empty while a possible stop string is held back)."""
    index: int
    token: int
    text: str
    logprobs: Optional[TokenLogprobs] = None


@dataclass(frozen=True)
class Finish:
    """A choice is done: why ("stop", "length"), and how many tokens it generated."""
    index: int
    reason: str
    completion_tokens: int
    text: str = ""  # held-back text released at the end


@dataclass(frozen=True)
class Failure:
    """The model step failed for this choice."""
    index: int
    message: str


Event = Union[Token, Finish, Failure]


def channel() -> tuple[Any, Any]:
    """An unbounded (send, receive) pair of anyio memory streams for a request's events."""
    return anyio.create_memory_object_stream(math.inf)


@dataclass
class Generation:
    """One choice of one request: prompt ids and limits in, events out through `send`.

    Invariant: `slot` is set from the choice's admission until it finishes, is cancelled or fails;
    `cells` are the tokens whose keys and values its slot holds at positions [0, len(cells))."""
    ids: list[int]
    max_tokens: int
    params: SamplingParams
    send: Any                        # the anyio send stream of the request's events
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False         # vLLM's extension: generate max_tokens even past end-of-turn
    logprobs: Optional[int] = None   # alternatives per token to report (0: only the chosen one's)
    constraint: Any = None           # a grammar.Constraint: the tokens it may generate next (None: any)
    next_mask: Optional[np.ndarray] = None  # its next token's mask, filled while the model ran
    index: int = 0                   # the choice's index among the request's n
    cancelled: bool = False          # set by the handler when its client leaves
    slot: Optional[int] = None
    reused: int = 0                  # prompt tokens found in the slot's cells (prefix cache)
    position: int = 0                # the cell the next decode step writes
    tokens: list[int] = field(default_factory=list)
    cells: list[int] = field(default_factory=list)
    uniforms: Optional[np.ndarray] = None
    draft_pause: int = 0             # steps left before it proposes speculative drafts again
    text: str = ""                   # decoded text handed out so far
    finish_reason: Optional[str] = None
    submitted: float = 0.0           # time.perf_counter() at submission, for the latency histograms
    last_token_at: float = 0.0

    def emit(self, event: Event) -> None:
        """Hands `event` to the handler (dropped when the handler has gone)."""
        try:
            self.send.send_nowait(event)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.cancelled = True
