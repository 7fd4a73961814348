"""Continuous batching as a task on the server's event loop (trio or asyncio, through anyio).

Each request's choice gets a KV-cache slot. At every token boundary the batcher admits waiting requests
(a prefill of each into its slot: those with no cached prefix as the rows of batched forwards,
`LlamaEngine.prefill_many_async`, those with one from where the cache ends, `prefill_async(slot, ids,
start)`), then runs one decode step over the slots in use (as many rows as streams, wherever the slot
cache put them), hands each request its token, and frees the
slots of requests that finished, hit a stop string or end-of-turn token, or whose client went away
(noticed at the next token). Greedy results are the same alone or batched: rows are independent.

Why on the event loop, and no thread of its own: atensor's realize is awaitable. The batcher awaits the
jitted prefill and decode steps (`Jit.call_async`); their kernels run on atensor's queues (compiled C,
the GIL released) while the loop serves other requests. What runs on the loop between steps is the
host Python of a step (its inputs, the replay's submission), sampling and detokenizing. Greedy
sampling is an argmax per row (~30 us); a row that samples with temperature (a sort of the vocabulary,
~3 ms a row) or reports log-probabilities is computed in a worker thread (`anyio.to_thread`; numpy's
sort releases the GIL), so sixteen of them do not hold the loop for 50 ms. A row under a grammar
(structured output, tool calls) is masked there too, all such rows of a step at once (`masked`); their
masks, which depend only on the tokens generated so far, are filled in a worker thread while the decode
step runs (`_prefetch_masks`), so only applying them is on the step's path.

Speculative decoding (`speculative` > 0): a step whose rows are all greedy and unconstrained, one of
which finds a prompt-lookup draft, is a verify step instead, every row's last token and draft in one
forward, each row then handed 1 to `speculative` + 1 tokens (serve/speculative.py).

An idle batcher captures, one run at a time, the step programs the server warms in the background
(`warm_later`: those of longer windows, buckets and prefixes, which the first requests do not need), so
/health answers after half the warm-up; a request that arrives meanwhile waits for one run at most.

An idle batcher woken by a request waits for the rest of its burst, until no request has arrived for
`batch_wait` seconds (at most 4 times that in all), so that requests sent together are prefilled
together (`_gather`); a busy one admits at the next token boundary.

Cancellation: `run` is cancelled when the server shuts down; a step in flight then finishes on
atensor's queues, and the requests still generating get a Failure.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import anyio
import numpy as np

from atensor.models.generation import log_softmax, penalize, request_uniforms, sample
from atensor.serve import grammar
from atensor.serve.requests import Failure, Finish, Generation, RequestError, Token, TokenLogprobs
from atensor.serve.slots import MIN_REUSE, SlotCache
from atensor.serve.speculative import BACK_OFF, lookup

BATCH_WAIT = 0.005  # seconds an idle batcher waits for the rest of a burst
STEP_TIMES = 64     # the recent decode steps whose durations `stats` summarizes


@dataclass(frozen=True)
class Choice:
    """The token a row's logits gave, with its log-probabilities when the request asked for them."""
    token: int
    logprobs: Optional[TokenLogprobs] = None


def choose(gen: Generation, logits: np.ndarray, allowed: Optional[np.ndarray] = None) -> Choice:
    """Samples `gen`'s next token from its row's logits (penalties, then its sampling parameters), or
    from `allowed`, the same logits with what its grammar forbids at -inf; the log-probabilities are
    the model's own (the unmasked logits)."""
    scores = penalize(logits if allowed is None else allowed, gen.tokens, gen.params)
    i = len(gen.tokens)
    token = sample(scores, gen.params, 0.0 if gen.uniforms is None else float(gen.uniforms[i]))
    if gen.logprobs is None:
        return Choice(token)
    logp = log_softmax(logits)
    top = np.argsort(-logp, kind="stable")[:gen.logprobs] if gen.logprobs else []
    return Choice(token, TokenLogprobs(float(logp[token]), tuple((int(t), float(logp[t])) for t in top)))


def _heavy(gen: Generation) -> bool:
    return gen.params.temperature > 0 or gen.logprobs is not None or gen.constraint is not None


def masked(rows: list[tuple[Generation, np.ndarray]]) -> list[tuple[Generation, np.ndarray]]:
    """`rows` with each constrained row's logits masked by its grammar: the masks of all of them filled
    at once into one (rows, words) array, applied to their logits stacked (grammar.fill, grammar.apply).
    A row's logits stay unmasked for its reported log-probabilities (`choose` is given both)."""
    picked = [i for i, (gen, _) in enumerate(rows) if gen.constraint is not None]
    if not picked:
        return rows
    masks = np.empty((len(picked), rows[picked[0]][0].constraint.grammars.words), np.int32)
    late = [k for k, i in enumerate(picked) if rows[i][0].next_mask is None]
    for k, i in enumerate(picked):
        if rows[i][0].next_mask is not None:  # filled while the model ran (`Batcher._prefetch_masks`)
            masks[k] = rows[i][0].next_mask
            rows[i][0].next_mask = None
    if late:
        masks[late] = grammar.fill([rows[picked[k]][0].constraint for k in late])
    scores = grammar.apply(np.stack([rows[i][1] for i in picked]), masks)
    out = list(rows)
    for k, i in enumerate(picked):
        out[i] = (rows[i][0], scores[k])
    return out


class Batcher:
    """Continuous batching over the engine's KV-cache slots (see the module docstring).

        batcher = Batcher(engine, tokenizer, max_waiting=64)
        async with anyio.create_task_group() as tg:
            tg.start_soon(batcher.run)
            batcher.submit(generation)   # then read its events

    Invariant: a choice is in `active` from its prefill until it finishes, is cancelled or fails; the
    slot cache's free slots are exactly the slots not in `active`."""

    def __init__(self, engine: Any, tokenizer: Any, max_waiting: int, batch_wait: float = BATCH_WAIT,
                 prefix_cache: bool = True, min_reuse: int = MIN_REUSE, metrics: Any = None,
                 thread_nice: int = 0, speculative: int = 0):
        self.engine, self.tokenizer = engine, tokenizer
        self.max_waiting = max_waiting
        self.batch_wait = batch_wait
        self.slots = SlotCache(engine.model.slots, min_reuse, enabled=prefix_cache)
        self.metrics = metrics  # a ServerMetrics, or None
        self.thread_nice = thread_nice  # the nice of the worker threads sampling runs in (0: as started)
        self.speculative = speculative  # draft tokens a greedy row is checked for per step (0: none)
        self.drafted, self.accepted = 0, 0  # draft tokens proposed, and kept
        self.waiting: deque[Generation] = deque()
        self.active: dict[int, Generation] = {}
        self.steps = 0
        self.mask_seconds, self.masked_tokens = 0.0, 0  # grammar masks: their time, the tokens they chose
        self.mask_overlapped = 0.0  # seconds of mask filling done while the model ran (not in mask_seconds)
        self.prefills = 0  # token boundaries that admitted requests
        self.step_times: deque[tuple[int, float]] = deque(maxlen=STEP_TIMES)  # (rows, s) of recent decodes
        self.running = False
        self._wake: Optional[anyio.Event] = None
        self.warmups: deque[tuple[Any, int]] = deque()  # (WarmupCall, runs left) to do while idle
        self.on_warmed: Optional[Callable[[str], None]] = None

    # ---- the handlers' side ----------------------------------------------------------------------------
    def submit(self, *gens: Generation) -> None:
        """Queues a request's choices; a full queue raises a 429 RequestError with Retry-After (nothing
        is queued)."""
        if len(self.active) + len(self.waiting) + len(gens) > self.slots.slots + self.max_waiting:
            raise RequestError(429, f"the server is at capacity ({len(self.active)} generating, "
                                    f"{len(self.waiting)} waiting); retry after {self.retry_after()} s",
                               code="server_busy", kind="rate_limit_exceeded",
                               headers={"Retry-After": str(self.retry_after())})
        now = time.perf_counter()
        for gen in gens:
            gen.submitted = now
            self.waiting.append(gen)
        self._poke()

    def retry_after(self) -> int:
        """Whole seconds until a queued request is likely to have a slot: the waiting requests' turns
        at the recent decode step time, one second at least."""
        recent = [took for _, took in list(self.step_times)[-8:]]
        step = statistics.median(recent) if recent else 0.05
        turns = (len(self.waiting) + 1) / max(1, self.slots.slots)
        return max(1, int(turns * 32 * step + 0.999))

    def warm_later(self, calls: Sequence[Any], on_warmed: Optional[Callable[[str], None]] = None) -> None:
        """Captures `calls` (startup.WarmupCall, stage "background") while no request is generating or
        waiting: one run at a time (3 each: run, capture, verify), so a request that arrives waits for
        one run at most. Each run writes scratch slots (`SlotCache.scratch`: empty ones first), whose
        cached prefixes lose the cells it wrote. `on_warmed(name)` is called as each call is done."""
        self.warmups.extend((call, 3) for call in calls)
        self.on_warmed = on_warmed
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def stats(self) -> dict:
        """What /health reports: requests generating and waiting, free slots, steps, the median decode
        step time of the recent ones by rows, and prefix-cache hits."""
        by_rows: dict[int, list[float]] = {}
        for rows, took in list(self.step_times):
            by_rows.setdefault(rows, []).append(took)
        return {"active": len(self.active), "waiting": len(self.waiting), "free_slots": len(self.slots.free),
                "warming": len(self.warmups),
                "steps": self.steps, "prefills": self.prefills, "prefix_hits": self.slots.hits,
                "masked_tokens": self.masked_tokens, "drafted": self.drafted, "accepted": self.accepted,
                "mask_us_per_token": round(1e6 * self.mask_seconds / max(1, self.masked_tokens), 1),
                "mask_overlapped_us_per_token": round(1e6 * self.mask_overlapped / max(1, self.masked_tokens), 1),
                "step_ms": {rows: round(1000 * statistics.median(t), 2) for rows, t in sorted(by_rows.items())}}

    # ---- the loop's task -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Generates until cancelled: waits for requests, admits them, steps the model."""
        self.running = True
        try:
            while True:
                while not self.active and not self.waiting:
                    if self.warmups:
                        await self._warm_once()
                        continue
                    self._wake = anyio.Event()
                    await self._wake.wait()
                if not self.active:
                    await self._gather()
                admitted = self._admit()
                try:
                    await self._step(admitted)
                except Exception as exc:  # noqa: BLE001 - each request in the step gets the error
                    for gen in admitted + list(self.active.values()):
                        gen.emit(Failure(gen.index, f"generation failed: {type(exc).__name__}: {exc}"))
                        self._release(gen, keep_cells=False)
        finally:
            self.running = False
            for gen in list(self.active.values()) + list(self.waiting):
                gen.emit(Failure(gen.index, "the server is shutting down"))
                self._release(gen, keep_cells=False)
            self.waiting.clear()

    async def _gather(self) -> None:
        """An idle batcher woken by a request waits for the rest of its burst: until no request has
        arrived for `batch_wait` seconds (at most 4 of those in all), or every free slot has one."""
        if self.batch_wait <= 0:
            return
        deadline = time.monotonic() + 4 * self.batch_wait
        seen = len(self.waiting)
        while seen < len(self.slots.free):
            left = min(self.batch_wait, deadline - time.monotonic())
            if left <= 0:
                return
            self._wake = anyio.Event()
            with anyio.move_on_after(left):
                await self._wake.wait()
            if len(self.waiting) == seen:
                return  # quiet for batch_wait
            seen = len(self.waiting)

    async def _warm_once(self) -> None:
        """One run of the first background warm-up call, on scratch slots (the batcher is idle: every
        slot is free), whose cached prefixes are then cut where the run wrote. A call that fails is
        dropped with a warning: the program is captured on first use instead."""
        call, left = self.warmups[0]  # left in the queue while it runs: `warming` counts it
        slots = self.slots.scratch(call.rows)
        try:
            await call.run_async(slots)
        except Exception as exc:  # noqa: BLE001 - a warm-up is an optimization; serving goes on
            warnings.warn(f"background warm-up of {call.name} failed ({type(exc).__name__}: {exc}); "
                          f"it will be captured on first use", RuntimeWarning, stacklevel=1)
            self.warmups.popleft()
            return
        finally:
            for slot in slots:
                self.slots.overwritten(slot, call.first_cell)
        self.warmups.popleft()
        if left > 1:
            self.warmups.appendleft((call, left - 1))
        elif self.on_warmed is not None:
            self.on_warmed(call.name)

    def _admit(self) -> list[Generation]:
        admitted = []
        while self.waiting and self.slots.free:
            gen = self.waiting.popleft()
            if gen.cancelled:
                continue
            lease = self.slots.acquire(gen.ids, self.engine.extend_fits)
            gen.slot, gen.reused = lease.slot, lease.reused
            admitted.append(gen)
        return admitted

    async def _step(self, admitted: list[Generation]) -> None:
        """One token boundary: prefill the admitted requests into their slots, then one decode step
        for every active slot."""
        if admitted:
            self.prefills += 1
            cold = {gen.slot: gen.ids for gen in admitted if not gen.reused}
            logits = await self.engine.prefill_many_async(cold) if cold else {}
            for gen in admitted:
                if gen.reused:
                    logits[gen.slot] = await self.engine.prefill_async(gen.slot, gen.ids, gen.reused)
            sampled = [gen for gen in admitted if gen.params.temperature > 0]
            if sampled:  # Threefry draws, realized off the loop (a blocking read; tiny)
                draws = await self._in_thread(
                    lambda: [request_uniforms(gen.params.seed, gen.max_tokens) for gen in sampled])
                for gen, uniforms in zip(sampled, draws):
                    gen.uniforms = uniforms
            for gen in admitted:
                gen.cells = list(gen.ids)
                gen.position = len(gen.ids)
                self.active[gen.slot] = gen
                if self.metrics is not None:
                    self.metrics.admitted(gen)
            await self._take([(gen, logits[gen.slot]) for gen in admitted])
        rows = {slot: (gen.tokens[-1], gen.position) for slot, gen in self.active.items()}
        if not rows:
            return
        drafts = self._drafts()
        if drafts is not None:
            return await self._speculate(drafts)
        start = time.perf_counter()
        constrained = [gen for gen in self.active.values() if gen.constraint is not None]
        if constrained:  # their masks depend only on the tokens so far: filled while the step runs
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._prefetch_masks, constrained)
                logits = await self.engine.decode_async(rows)
        else:
            logits = await self.engine.decode_async(rows)
        self.step_times.append((len(rows), time.perf_counter() - start))
        self.steps += 1
        fed = []
        for slot, (token, _) in rows.items():
            gen = self.active.get(slot)
            if gen is None:  # released meanwhile (cannot happen between awaits today; kept safe)
                continue
            gen.cells.append(token)
            gen.position += 1
            fed.append((gen, logits[slot]))
        await self._take(fed)

    def _drafts(self) -> Optional[dict[int, tuple[int, ...]]]:
        """Each active row's prompt-lookup draft (speculative.lookup), padded to `speculative` tokens,
        when this step speculates: every row is greedy, unconstrained and without log-probabilities,
        has room for the draft in its context, and at least one row found a draft. Else None."""
        k = self.speculative
        if not k or any(_heavy(gen) or gen.position + k + 1 > self.engine.context for gen in self.active.values()):
            return None
        drafts, found = {}, False
        for slot, gen in self.active.items():
            if gen.draft_pause:
                gen.draft_pause -= 1
                draft: tuple[int, ...] = ()
            else:
                draft = lookup(gen.ids + gen.tokens, k).tokens
            found = found or bool(draft)
            drafts[slot] = draft + (gen.tokens[-1],) * (k - len(draft))  # padding: cells rewritten later
            self.drafted += len(draft)
        return drafts if found else None

    async def _prefetch_masks(self, gens: list[Generation]) -> None:
        """Fills the next-token masks of `gens` in a worker thread (`Generation.next_mask`), while the
        decode step that gives their logits runs: `masked` then only applies them."""
        def fill() -> None:
            begun = time.perf_counter()
            for gen, row in zip(gens, grammar.fill([gen.constraint for gen in gens])):
                gen.next_mask = row
            self.mask_overlapped += time.perf_counter() - begun
        await self._in_thread(fill)

    async def _speculate(self, drafts: dict[int, tuple[int, ...]]) -> None:
        """One verify step: each row's last token and draft in one batched forward; a row keeps the
        draft's tokens while each is the greedy pick of the logits before it, and the pick after the
        last kept one (`_accept` each, so stop strings, end-of-turn and limits apply token by token)."""
        rows = {slot: ((gen.tokens[-1],) + drafts[slot], gen.position) for slot, gen in self.active.items()}
        start = time.perf_counter()
        logits = await self.engine.verify_async(rows)
        self.step_times.append((len(rows), time.perf_counter() - start))
        self.steps += 1
        for slot, (fed, _) in rows.items():
            gen = self.active.get(slot)
            if gen is None:
                continue
            if gen.cancelled:
                self._release(gen)
                continue
            for j, token in enumerate(fed):
                gen.cells.append(token)
                gen.position += 1
                picked = choose(gen, logits[slot][j])
                self._accept(gen, picked)
                if gen.slot is None or j + 1 == len(fed) or picked.token != fed[j + 1]:
                    if j == 0 and picked.token != fed[1] and fed[1:] != (fed[0],) * (len(fed) - 1):
                        gen.draft_pause = BACK_OFF  # its draft (not padding) was wrong from the start
                    break
                self.accepted += 1

    async def _take(self, rows: list[tuple[Generation, np.ndarray]]) -> None:
        """Samples each row's next token (off the loop when any row's sampling is heavy), then hands out
        the text and frees the slots of the requests that are done."""
        live = [(gen, logits) for gen, logits in rows if not gen.cancelled]
        for gen, _ in rows:
            if gen.cancelled:
                self._release(gen)
        if any(_heavy(gen) for gen, _ in live):
            def pick() -> list[Choice]:
                start = time.perf_counter()
                allowed = masked(live)
                constrained = sum(gen.constraint is not None for gen, _ in live)
                if constrained:
                    self.mask_seconds += time.perf_counter() - start
                    self.masked_tokens += constrained
                return [choose(g, lg, a if a is not lg else None) for (g, lg), (_, a) in zip(live, allowed)]
            choices = await self._in_thread(pick)
        else:
            choices = [choose(g, lg) for g, lg in live]
        for (gen, _), choice in zip(live, choices):
            if gen.cancelled:  # its client left while the thread sampled
                self._release(gen)
            else:
                self._accept(gen, choice)

    async def _in_thread(self, fn: Any) -> Any:
        """`fn()` in one of anyio's worker threads, at `thread_nice` (the model's threads' priority:
        the event loop's thread goes first)."""
        def run() -> Any:
            if self.thread_nice > 0 and hasattr(os, "setpriority"):
                tid = threading.get_native_id()
                try:
                    if os.getpriority(os.PRIO_PROCESS, tid) < self.thread_nice:
                        os.setpriority(os.PRIO_PROCESS, tid, self.thread_nice)
                except OSError:
                    pass
            return fn()
        return await anyio.to_thread.run_sync(run)

    def _accept(self, gen: Generation, choice: Choice) -> None:
        """Hands out the chosen token's text (holding back what could become a stop string or an
        incomplete UTF-8 sequence), and finishes the request when it is done."""
        now = time.perf_counter()
        if self.metrics is not None:
            self.metrics.token(gen, now)
        gen.last_token_at = now
        token = choice.token
        if token in self.tokenizer.end_ids and not gen.ignore_eos:
            return self._finish(gen, "stop")
        if gen.constraint is not None:
            gen.constraint.advance(token)
        gen.tokens.append(token)
        text = self.tokenizer.decode(gen.tokens)
        hit = min((text.find(s) for s in gen.stop if s in text), default=-1)
        if hit >= 0:
            text = text[:hit]
            gen.emit(Token(gen.index, token, text[len(gen.text):], choice.logprobs))
            gen.text = text
            return self._finish(gen, "stop")
        safe = len(text)
        for s in gen.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        if text.endswith("\ufffd"):
            safe = min(safe, len(text) - 1)
        safe = max(safe, len(gen.text))
        if gen.constraint is not None and gen.constraint.done:  # the grammar allows nothing more
            gen.emit(Token(gen.index, token, text[len(gen.text):], choice.logprobs))
            gen.text = text
            return self._finish(gen, "stop")
        gen.emit(Token(gen.index, token, text[len(gen.text):safe], choice.logprobs))  # one event per token
        gen.text = text[:safe]
        if len(gen.tokens) >= gen.max_tokens or gen.position + 1 >= self.engine.context:
            tail = text[len(gen.text):]
            gen.text = text
            return self._finish(gen, "length", tail)

    def _finish(self, gen: Generation, reason: str, tail: str = "") -> None:
        gen.finish_reason = reason
        gen.emit(Finish(gen.index, reason, len(gen.tokens), tail))
        if self.metrics is not None:
            self.metrics.finished(gen)
        self._release(gen)

    def _release(self, gen: Generation, keep_cells: bool = True) -> None:
        slot = gen.slot
        if slot is not None and self.active.get(slot) is gen:
            del self.active[slot]
            self.slots.release(slot, gen.cells if keep_cells else [])
        elif slot is not None and slot not in self.slots.free:  # admitted, failed before it was active
            self.slots.release(slot, [])
        gen.slot = None
