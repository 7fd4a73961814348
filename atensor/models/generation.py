"""Running a Llama: bucketed prefill into a KV-cache slot, a jitted decode step over a batch of slots,
and sampling (greedy, temperature, top-k, top-p) from the counter-based RNG.

Why one engine for the CLI and the server: a decode step is the same program whether one stream or
sixteen run; the server only decides which slots are in the batch. Both steps are `atensor.jit`
programs keyed by shape only:

- prefill: the prompt is padded to a bucket length (few programs, each captured once); the slot is a
  bound Variable, so every slot shares the bucket's program. Padding writes stale cells past the
  prompt, which later decode steps overwrite before any mask lets them be read.
- decode: rows 0..B-1 are slots 0..B-1 with B a batch bucket (1, 2, 4, ...); each row's cache position
  is its own bound Variable (`pos0`, `pos1`, ...), so the step is replayed with the new positions
  bound, never recaptured per position. A row whose slot is free computes a throw-away token.
  Attention reads a window of the cache, the smallest of WINDOW_BUCKETS (64, 128, ... cells, and the
  context) that holds every row's history: one program per (batch, window) bucket, so a step over
  short histories does not read (and multiply) the masked-out rest of the context. At batch 16 and
  context 256 a 64-cell window cut the attention kernel from 1.00 ms to 0.35 ms per layer (profiler).
  A prefill starts at position 0, so its window is its bucket length.

Sampling happens on the host on the step's logits: temperature scaling, top-k, top-p (nucleus), then
inverse-CDF with a uniform drawn from atensor's Threefry generator keyed by the request's seed, one
counter per generated token: a seed reproduces a run whatever else the server runs meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from atensor.dtype import dtypes
from atensor.engine.jit import jit
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import Variable
from atensor.models.llama import Llama
from atensor.tensor import Tensor

PREFILL_BUCKETS = (16, 64, 128, 256, 512)
WINDOW_BUCKETS = (64, 128, 256, 512, 1024, 2048)


def batch_bucket(rows: int) -> int:
    """The decode batch size for `rows` rows: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def request_uniforms(seed: int, count: int, device: str = "CPU") -> np.ndarray:
    """`count` uniforms in [0, 1) from Threefry-2x32 keyed by `seed` at counters 0..count-1: the same
    generator as atensor.random, with the request's own key and counters (so concurrent requests do not
    shift each other's draws)."""
    device = Tensor.empty(0, device=device).device  # the canonical name ("CPU" is "CPU:0")
    counters = Node.make(Ops.ARANGE, dtypes.uint64, (), (0, 1, count, device))
    key = Node.const(int(seed) & (2**64 - 1), dtypes.uint64, device, (count,))
    bits = Tensor(counters.alu(Ops.THREEFRY, key)).numpy()
    return ((bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)).astype(np.float64)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. temperature 0 is greedy (argmax)."""
    temperature: float = 0.0
    top_k: int = 0      # 0: no limit
    top_p: float = 1.0
    seed: int = 0


def sample(logits: np.ndarray, params: SamplingParams, uniform: float) -> int:
    """The next token from one row's logits, with the uniform draw `uniform` in [0, 1)."""
    if params.temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / params.temperature
    order = np.argsort(-z, kind="stable")
    if params.top_k > 0:
        order = order[:params.top_k]
    probs = np.exp(z[order] - z[order[0]])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)  # smallest set reaching top_p
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    index = min(int(np.searchsorted(np.cumsum(probs), uniform, side="right")), len(order) - 1)
    return int(order[index])


class LlamaEngine:
    """Prefill and decode steps of a Llama over its cache slots (see the module docstring).

        engine = LlamaEngine(Llama.from_gguf(slots=1))
        logits = engine.prefill(0, ids)                 # (vocab,) for the prompt's last token
        logits = engine.decode({0: (token, len(ids))})  # {slot: (token, position)} -> {slot: (vocab,)}
    """

    def __init__(self, model: Llama, prefill_buckets: Sequence[int] = PREFILL_BUCKETS,
                 window_buckets: Sequence[int] = WINDOW_BUCKETS):
        self.model = model
        self.context = model.context
        self.buckets = sorted({min(b, model.context) for b in prefill_buckets} | {model.context})
        self.windows = sorted({min(w, model.context) for w in window_buckets} | {model.context})
        self.slot_var = Variable("slot", 0, model.slots - 1)
        self.pos_vars = [Variable(f"pos{i}", 0, model.context - 1) for i in range(model.slots)]
        self._prefill_step = jit(self._prefill_fn)
        self._decode_step = jit(self._decode_fn)

    # the jitted bodies: tensors and bound variables in, logits out
    def _prefill_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, last: Tensor, slot: Variable) -> Tensor:
        return self.model.forward(tokens, positions, mask, [0], first_slot=slot, last=last)

    def _decode_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, starts: tuple) -> Tensor:
        return self.model.forward(tokens, positions, mask, list(starts), first_slot=0).reshape(
            tokens.shape[0], -1)

    def bucket(self, length: int) -> int:
        """The prefill length a prompt of `length` tokens is padded to."""
        for b in self.buckets:
            if b >= length:
                return b
        raise ValueError(f"a prompt of {length} tokens does not fit the context of {self.context}")

    def window(self, cells: int) -> int:
        """The attention window of a decode step whose rows' histories reach `cells` cells."""
        for w in self.windows:
            if w >= cells:
                return w
        raise ValueError(f"{cells} cells of history do not fit the context of {self.context}")

    def prefill(self, slot: int, ids: Sequence[int]) -> np.ndarray:
        """Writes the prompt's keys and values into `slot` at positions [0, len(ids)) and returns the
        last token's logits (vocab,). Blocking (run it off the event loop)."""
        n = len(ids)
        if n == 0:
            raise ValueError("an empty prompt has no next token; send at least one token")
        length = self.bucket(n)
        m = self.model
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :n] = ids
        out = self._prefill_step(Tensor(tokens), Tensor(m.position_ids(length, [0])),
                                 Tensor(m.mask_array(length, [0], length)),
                                 Tensor(np.array([n - 1], np.int32)), self.slot_var.bind(slot))
        return out.numpy()[0]

    def decode(self, rows: dict[int, tuple[int, int]]) -> dict[int, np.ndarray]:
        """One decode step: {slot: (token, position)} -> {slot: logits (vocab,)}. The batch is slots
        0..B-1, B the bucket of the highest slot; other rows compute a throw-away token. Blocking."""
        count = batch_bucket(max(rows) + 1)
        if count > self.model.slots:
            count = self.model.slots
        tokens = np.zeros((count, 1), np.int32)
        starts = [0] * count
        for slot, (token, pos) in rows.items():
            if pos >= self.context:
                raise ValueError(f"slot {slot}: position {pos} is past the context of {self.context}")
            tokens[slot, 0], starts[slot] = token, pos
        m = self.model
        out = self._decode_step(Tensor(tokens), Tensor(m.position_ids(1, starts)),
                                Tensor(m.mask_array(1, starts, self.window(max(starts) + 1))),
                                tuple(v.bind(s) for v, s in zip(self.pos_vars, starts)))
        logits = out.numpy()
        return {slot: logits[slot] for slot in rows}

    def generate(self, ids: Sequence[int], max_tokens: int, params: SamplingParams = SamplingParams(),
                 stop_ids: frozenset = frozenset(), slot: int = 0) -> Iterator[int]:
        """The generated token ids, one at a time (a stop id ends the run and is not yielded)."""
        if len(ids) + max_tokens > self.context:
            max_tokens = self.context - len(ids)
        uniforms = request_uniforms(params.seed, max(1, max_tokens)) if params.temperature > 0 else None
        logits = self.prefill(slot, ids)
        pos = len(ids)
        for i in range(max_tokens):
            token = sample(logits, params, 0.0 if uniforms is None else float(uniforms[i]))
            if token in stop_ids:
                return
            yield token
            if i + 1 == max_tokens:
                return
            logits = self.decode({slot: (token, pos)})[slot]
            pos += 1
