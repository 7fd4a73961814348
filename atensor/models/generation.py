"""Running a Llama: bucketed prefill into a KV-cache slot, a jitted decode step over a batch of slots,
and sampling (greedy, temperature, top-k, top-p) from the counter-based RNG.

Why one engine for the CLI and the server: a decode step is the same program whether one stream or
sixteen run; the server only decides which slots are in the batch. Both steps are `atensor.jit`
programs keyed by shape only:

- prefill: the prompt is padded to a bucket length (few programs, each captured once); the slot is a
  bound Variable, so every slot shares the bucket's program. Padding writes stale cells past the
  prompt, which later decode steps overwrite before any mask lets them be read. Prompts that arrive
  together (`prefill_many`) are prefilled as the rows of one forward per bucket, each row with its own
  slot Variable, in batches of 1, 4 or 16 rows (`prefill_batches`) up to PREFILL_BATCH_TOKENS
  padded tokens: one pass over the weights and one launch of each kernel for all of them, instead of
  one forward per prompt (bench/llm.py, the server's 16 prompts of 13-14 tokens on a machine at load
  5: 2.94 s batched against 3.28 s one at a time, medians of 3 alternating rounds).
- decode: the rows are the streams' slots, in slot order, padded to a batch bucket B (1, 2, 4, ...) by
  repeating the first row (the same token into the same cells: the same writes); each row's slot and
  cache position are its own bound Variables (`slot0`, `pos0`, ...), so the step is replayed with the
  new slots and positions bound, never recaptured. One stream is a batch of 1 whichever slot it has
  (a server's prefix cache hands out the least recently used slot: with rows tied to slots 0..B-1, one
  stream in slot 15 ran a batch of 16, 4x the time of a batch of 1, bench/llm.py's server part).
  Each row reads its slot's window through a concatenation, which the attention kernel reads through:
  at 16 rows that cost 34% more CPU time per step than reading the cache's rows in place (measured,
  window 64), so a step over every slot (rows 0..S-1, S the model's slots: a full server) runs the
  `full` program, which reads slots 0..S-1 in place.
  Attention reads a window of the cache, the smallest of WINDOW_BUCKETS (64, 128, ... cells, and the
  context) that holds every row's history: one program per (batch, window) bucket, so a step over
  short histories does not read (and multiply) the masked-out rest of the context. At batch 16 and
  context 256 a 64-cell window cut the attention kernel from 1.00 ms to 0.35 ms per layer (profiler).
  Past SYMBOLIC_ABOVE cells the window is a symbolic length instead (`cells`, a bound Variable: the
  whole context's mask cut to it, graph/view.py): exactly the history, one program for every length.
  That is the `full` program's; a step over some of the slots keeps the window buckets (its rows'
  windows are concatenated, which is not built for a symbolic length).
  A prefill starts at position 0, so its window is its bucket length.

- extend: a prompt whose first `start` tokens are already in the slot's cells (a prefix cache hit) is
  prefilled from `start` on: one row of the rest, padded to a bucket, written at the bound Variables
  `slot` and `start` and attending over a window of the slot (the decode step's path with L tokens).
  One program per (bucket, window), captured on first use.

Every step has a blocking form (`prefill`, `prefill_many`, `decode`: scripts, the CLI) and an awaitable
one (`prefill_async`, `prefill_many_async`, `decode_async`) for an async app on trio or asyncio: the
same host-side inputs, the same jitted programs (`Jit.call_async`), the realize awaited instead of
blocked on, so the event loop serves other requests while the kernels run on atensor's queues.

Sampling happens on the host on the step's logits: temperature scaling, top-k, top-p (nucleus), then
inverse-CDF with a uniform drawn from atensor's Threefry generator keyed by the request's seed, one
counter per generated token: a seed reproduces a run whatever else the server runs meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from atensor.dtype import dtypes
from atensor.jit.jit import jit
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import Variable
from atensor.models.llama import Llama
from atensor.tensor.tensor import Tensor

PREFILL_BUCKETS = (16, 64, 128, 256, 512)
WINDOW_BUCKETS = (64, 128, 256, 512, 1024, 2048)
# Decode steps over histories longer than this attend over a symbolic length, shorter ones over a window
# bucket. bench/attention_len.py (SmolLM2-135M, batch 1, context 1024, CPU ms per step, alternating
# rounds on the shared 2-core machine, two runs): symbolic/window 1.02-1.08 at windows 64-128,
# 0.97-1.07 at 256, 0.96-1.03 at 512 (a tie), 0.82-0.87 at 1024 (a gemv over exactly the history
# instead of a bucket up to twice as long); so the symbolic length from the 1024-cell window on.
SYMBOLIC_ABOVE = 512
PREFILL_BATCH_TOKENS = 256  # rows times bucket length of one batched prefill (a single row may be longer)
PREFILL_BATCH_GROWTH = 4    # a batched prefill's rows: 1, 4, 16, ...


def batch_bucket(rows: int) -> int:
    """The decode batch size for `rows` rows: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def prefill_batches(count: int, length: int, max_tokens: int = PREFILL_BATCH_TOKENS) -> list[int]:
    """How `count` prompts of one bucket `length` are split into batched prefills: row counts that are
    powers of PREFILL_BATCH_GROWTH (1, 4, 16: few programs to capture) of at most `max_tokens` padded
    tokens (one row at least), each the largest that holds no more than a quarter of padding rows
    (15 prompts: one batch of 16; 7: 4 + 4; 2: 1 + 1)."""
    sizes_allowed = [1]
    while sizes_allowed[-1] * PREFILL_BATCH_GROWTH * length <= max_tokens:
        sizes_allowed.append(sizes_allowed[-1] * PREFILL_BATCH_GROWTH)
    sizes = []
    while count > 0:
        rows = max(r for r in sizes_allowed if r <= count or 4 * (r - count) <= r)
        sizes.append(rows)
        count -= min(rows, count)
    return sizes


def request_uniforms(seed: int, count: int, device: str = "CPU") -> np.ndarray:
    """`count` uniforms in [0, 1) from Threefry-2x32 keyed by `seed` at counters 0..count-1: the same
    generator as atensor.tensor.random, with the request's own key and counters (so concurrent requests do not
    shift each other's draws)."""
    device = Tensor.empty(0, device=device).device  # the canonical name ("CPU" is "CPU:0")
    counters = Node.make(Ops.ARANGE, dtypes.uint64, (), (0, 1, count, device))
    key = Node.const(int(seed) & (2**64 - 1), dtypes.uint64, device, (count,))
    bits = Tensor(counters.alu(Ops.THREEFRY, key)).numpy()
    return ((bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)).astype(np.float64)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. temperature 0 is greedy (argmax). The penalties are OpenAI's: a
    token's logit is lowered by `frequency_penalty` times its count among the tokens generated so far,
    plus `presence_penalty` once it has appeared (`penalize`)."""
    temperature: float = 0.0
    top_k: int = 0      # 0: no limit
    top_p: float = 1.0
    seed: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def penalized(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def penalize(logits: np.ndarray, generated: Sequence[int], params: SamplingParams) -> np.ndarray:
    """OpenAI's penalties on one row's logits: logit[j] - c[j] * frequency_penalty - (c[j] > 0) *
    presence_penalty, c[j] the count of token j among `generated` (the completion so far, not the
    prompt). Returns `logits` itself when there is nothing to do, else a new array."""
    if not params.penalized or not generated:
        return logits
    tokens, counts = np.unique(np.asarray(generated, np.int64), return_counts=True)
    out = logits.astype(np.float32, copy=True)
    out[tokens] -= counts * np.float32(params.frequency_penalty) + np.float32(params.presence_penalty)
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p of one row's logits (vocab,), in float64: the model's own distribution (no temperature)."""
    z = logits.astype(np.float64)
    z -= z.max()
    return z - np.log(np.exp(z).sum())


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
                 window_buckets: Sequence[int] = WINDOW_BUCKETS, symbolic_above: Optional[int] = SYMBOLIC_ABOVE):
        self.model = model
        # a decode step whose rows' histories reach more than `symbolic_above` cells attends over exactly
        # those cells, a symbolic length bound per step (graph/view.py): one program per batch bucket for
        # all of them instead of one per (batch, window); None keeps the window buckets throughout
        self.symbolic_above = symbolic_above
        self.cells_var = Variable("cells", 1, model.context)
        self.context = model.context
        self.buckets = sorted({min(b, model.context) for b in prefill_buckets} | {model.context})
        self.windows = sorted({min(w, model.context) for w in window_buckets} | {model.context})
        self.slot_vars = [Variable(f"slot{i}", 0, model.slots - 1) for i in range(batch_bucket(model.slots))]
        self.pos_vars = [Variable(f"pos{i}", 0, model.context - 1) for i in range(model.slots)]
        # an extend's start, per bucket: its L written cells [start, start + L) stay in the context
        self.start_vars = {b: Variable(f"start{b}", 0, model.context - b) for b in self.buckets}
        self._prefill_step = jit(self._prefill_fn)
        self._decode_step = jit(self._decode_fn)
        self._decode_full_step = jit(self._decode_full_fn)
        self._extend_step = jit(self._extend_fn)
        self._verify_step = jit(self._verify_fn)
        self.verify_vars: dict[int, list[Variable]] = {}

    # the jitted bodies: tensors and bound variables in, logits out
    def _prefill_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, last: Tensor, slots: tuple) -> Tensor:
        return self.model.forward(tokens, positions, mask, [0] * len(slots), last=last, slots=list(slots))

    def _decode_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, starts: tuple, slots: tuple) -> Tensor:
        return self.model.forward(tokens, positions, mask, list(starts), slots=list(slots)).reshape(
            tokens.shape[0], -1)

    def _decode_full_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, starts: tuple, cells=None) -> Tensor:
        if cells is not None:  # the whole context's mask, cut to the bound length
            mask = mask.shrink((None, None, None, (0, cells)))
        return self.model.forward(tokens, positions, mask, list(starts), first_slot=0).reshape(
            tokens.shape[0], -1)

    def _verify_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, starts: tuple, slots: tuple) -> Tensor:
        return self.model.forward(tokens, positions, mask, list(starts), slots=list(slots))

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

    def _extend_fn(self, tokens: Tensor, positions: Tensor, mask: Tensor, last: Tensor, slot: Variable,
                   start: Variable) -> Tensor:
        return self.model.forward(tokens, positions, mask, [start], first_slot=slot, last=last)

    def extend_fits(self, start: int, length: int) -> bool:
        """Whether a prompt of `length` tokens whose first `start` are cached can be prefilled from
        `start` (its bucket of the rest, padding too, must fit the context)."""
        return 0 < start < length and start + self.bucket(length - start) <= self.context

    # ---- the host-side inputs of each step, shared by the blocking and the awaitable forms ----------
    def _check_prompts(self, prompts: Mapping[int, Sequence[int]]) -> list[tuple[int, list]]:
        """[(bucket length, [(slot, ids)])] in bucket order, each bucket's rows in `prefill_batches`
        groups, after checking the slots and prompts."""
        by_bucket: dict[int, list[tuple[int, Sequence[int]]]] = {}
        for slot, ids in prompts.items():
            if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.model.slots:
                raise ValueError(f"slot {slot!r} is not one of the model's slots 0..{self.model.slots - 1}")
            if len(ids) == 0:
                raise ValueError(f"slot {slot}: an empty prompt has no next token; send at least one token")
            by_bucket.setdefault(self.bucket(len(ids)), []).append((int(slot), ids))
        groups = []
        for length, rows in sorted(by_bucket.items()):
            done = 0
            for size in prefill_batches(len(rows), length):
                groups.append((length, size, rows[done:done + size]))
                done += size
        return groups

    def _prefill_args(self, rows: list[tuple[int, Sequence[int]]], count: int, length: int) -> tuple:
        """The prefill step's arguments for `rows` [(slot, ids)] padded to `count` rows of `length`
        tokens; a padding row repeats the first row (the same tokens into the same slot: the same writes)."""
        padded = rows + [rows[0]] * (count - len(rows))
        tokens = np.zeros((count, length), np.int32)
        for i, (_, ids) in enumerate(padded):
            tokens[i, :len(ids)] = ids
        last = np.array([len(ids) - 1 for _, ids in padded], np.int32)
        m, starts = self.model, [0] * count
        dev = m.device  # the inputs live where the model does (a CL model's too)
        return (Tensor(tokens, device=dev), Tensor(m.position_ids(length, starts), device=dev),
                Tensor(m.mask_array(length, starts, length), device=dev), Tensor(last, device=dev),
                tuple(v.bind(slot) for v, (slot, _) in zip(self.slot_vars, padded)))

    def _extend_args(self, slot: int, ids: Sequence[int], start: int) -> tuple:
        """The extend step's arguments: ids[start:] padded to its bucket, written from `start` on."""
        if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.model.slots:
            raise ValueError(f"slot {slot!r} is not one of the model's slots 0..{self.model.slots - 1}")
        if not self.extend_fits(start, len(ids)):
            raise ValueError(f"slot {slot}: cannot prefill {len(ids)} tokens from position {start} (the "
                             f"cached prefix must leave at least one token, and the rest's bucket must "
                             f"fit the context of {self.context})")
        rest = list(ids[start:])
        length = self.bucket(len(rest))
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :len(rest)] = rest
        m = self.model
        dev = m.device
        return (Tensor(tokens, device=dev), Tensor(m.position_ids(length, [start]), device=dev),
                Tensor(m.mask_array(length, [start], self.window(start + length)), device=dev),
                Tensor(np.array([len(rest) - 1], np.int32), device=dev), self.slot_vars[0].bind(int(slot)),
                self.start_vars[length].bind(int(start)))

    def _decode_args(self, rows: dict[int, tuple[int, int]]) -> tuple[Any, tuple, list[int]]:
        """The decode step's program (the full one when the rows are every slot), its arguments for
        `rows` {slot: (token, position)}, and the slot of each row."""
        if not rows:
            raise ValueError("decode: no rows; pass {slot: (token, position)} for at least one slot")
        for slot, (_, pos) in rows.items():
            if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.model.slots:
                raise ValueError(f"slot {slot!r} is not one of the model's slots 0..{self.model.slots - 1}")
            if not 0 <= pos < self.context:
                raise ValueError(f"slot {slot}: position {pos} is outside the context of {self.context}")
        order = sorted(rows)
        count = min(batch_bucket(len(order)), self.model.slots)
        padded = order + [order[0]] * (count - len(order))
        tokens = np.array([[rows[slot][0]] for slot in padded], np.int32)
        starts = [rows[slot][1] for slot in padded]
        m = self.model
        dev = m.device
        args = (Tensor(tokens, device=dev), Tensor(m.position_ids(1, starts), device=dev))
        bound = tuple(v.bind(p) for v, p in zip(self.pos_vars, starts))
        if len(order) == m.slots:  # every slot, in slot order: rows 0..S-1 read in place
            if self.symbolic_above is not None and max(starts) + 1 > self.symbolic_above:
                return self._decode_full_step, args + (Tensor(m.mask_array(1, starts), device=dev), bound,
                                                       self.cells_var.bind(max(starts) + 1)), order
            window = Tensor(m.mask_array(1, starts, self.window(max(starts) + 1)), device=dev)
            return self._decode_full_step, args + (window, bound), order
        window = Tensor(m.mask_array(1, starts, self.window(max(starts) + 1)), device=dev)
        return self._decode_step, args + (window, bound, tuple(v.bind(int(slot)) for v, slot in zip(self.slot_vars, padded))), order

    # ---- blocking forms (scripts, the CLI) -----------------------------------------------------------
    def prefill(self, slot: int, ids: Sequence[int], start: int = 0) -> np.ndarray:
        """Writes the prompt's keys and values into `slot` at positions [start, len(ids)) and returns the
        last token's logits (vocab,); with `start` > 0 the slot's cells [0, start) must already hold
        ids[:start] (a cached prefix). Blocking (outside an event loop; see `prefill_async`)."""
        if start:
            return self._extend_step(*self._extend_args(slot, ids, start)).numpy()[0]
        return self.prefill_many({slot: ids})[slot]

    def prefill_many(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """`prefill` of several prompts {slot: ids} (distinct slots), those of one bucket as the rows of
        batched forwards (`prefill_batches`): {slot: last token's logits (vocab,)}. Blocking."""
        out: dict[int, np.ndarray] = {}
        for length, count, rows in self._check_prompts(prompts):
            logits = self._prefill_step(*self._prefill_args(rows, count, length)).numpy()
            out.update({slot: logits[i] for i, (slot, _) in enumerate(rows)})
        return out

    def decode(self, rows: dict[int, tuple[int, int]]) -> dict[int, np.ndarray]:
        """One decode step: {slot: (token, position)} -> {slot: logits (vocab,)}. The batch is the
        bucket of the number of rows, whatever their slots. Blocking."""
        step, args, order = self._decode_args(rows)
        logits = step(*args).numpy()
        return {slot: logits[i] for i, slot in enumerate(order)}

    # ---- awaitable forms (an async app on trio or asyncio) -------------------------------------------
    async def prefill_async(self, slot: int, ids: Sequence[int], start: int = 0) -> np.ndarray:
        """`prefill`, awaited on the running event loop (which stays free while the kernels run)."""
        if start:
            return (await self._extend_step.call_async(*self._extend_args(slot, ids, start))).numpy()[0]
        return (await self.prefill_many_async({slot: ids}))[slot]

    async def prefill_many_async(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """`prefill_many`, awaited. Cancelled, the step still runs to its end on atensor's queues (the
        slots' cells are then written, and stale to the caller)."""
        out: dict[int, np.ndarray] = {}
        for length, count, rows in self._check_prompts(prompts):
            logits = (await self._prefill_step.call_async(*self._prefill_args(rows, count, length))).numpy()
            out.update({slot: logits[i] for i, (slot, _) in enumerate(rows)})
        return out

    async def decode_async(self, rows: dict[int, tuple[int, int]]) -> dict[int, np.ndarray]:
        """`decode`, awaited: `await engine.decode_async({slot: (token, position)})`."""
        step, args, order = self._decode_args(rows)
        logits = (await step.call_async(*args)).numpy()
        return {slot: logits[i] for i, slot in enumerate(order)}

    def _verify_args(self, rows: Mapping[int, tuple[Sequence[int], int]]) -> tuple[tuple, list[int]]:
        """The verify step's arguments for `rows` {slot: (tokens, position)} (every row the same number
        of tokens L, written at [position, position + L) of its slot), and the slot of each row."""
        lengths = {len(tokens) for tokens, _ in rows.values()}
        if not rows or len(lengths) != 1:
            raise ValueError(f"verify: give every row the same number of tokens, got lengths {sorted(lengths)}")
        length = lengths.pop()
        for slot, (_, pos) in rows.items():
            if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.model.slots:
                raise ValueError(f"slot {slot!r} is not one of the model's slots 0..{self.model.slots - 1}")
            if not 0 <= pos or pos + length > self.context:
                raise ValueError(f"slot {slot}: {length} tokens from position {pos} do not fit the context "
                                 f"of {self.context}")
        order = sorted(rows)
        count = min(batch_bucket(len(order)), self.model.slots)
        padded = order + [order[0]] * (count - len(order))
        tokens = np.array([list(rows[slot][0]) for slot in padded], np.int32)
        starts = [rows[slot][1] for slot in padded]
        m, dev = self.model, self.model.device
        mask = m.mask_array(length, starts, self.window(max(starts) + length))
        return (Tensor(tokens, device=dev), Tensor(m.position_ids(length, starts), device=dev),
                Tensor(mask, device=dev), tuple(v.bind(p) for v, p in zip(self._verify_vars(length), starts)),
                tuple(v.bind(int(slot)) for v, slot in zip(self.slot_vars, padded))), order

    def _verify_vars(self, length: int) -> list[Variable]:
        """The rows' position Variables of a verify step of `length` tokens: [0, context - length], so
        the L written cells stay in the context (one set per length, made on first use)."""
        if length not in self.verify_vars:
            self.verify_vars[length] = [Variable(f"vpos{length}_{i}", 0, self.context - length)
                                        for i in range(self.model.slots)]
        return self.verify_vars[length]

    def verify(self, rows: Mapping[int, tuple[Sequence[int], int]]) -> dict[int, np.ndarray]:
        """Speculative decoding's check: {slot: (tokens, position)} with L tokens a row (the last
        generated token, then the draft) written at [position, position + L), in one batched forward;
        returns {slot: logits (L, vocab)}, row j the prediction after token j. Blocking."""
        args, order = self._verify_args(rows)
        logits = self._verify_step(*args).numpy()
        return {slot: logits[i] for i, slot in enumerate(order)}

    async def verify_async(self, rows: Mapping[int, tuple[Sequence[int], int]]) -> dict[int, np.ndarray]:
        """`verify`, awaited."""
        args, order = self._verify_args(rows)
        logits = (await self._verify_step.call_async(*args)).numpy()
        return {slot: logits[i] for i, slot in enumerate(order)}

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
