"""Loading the LLM and capturing its steps before the first request, saying what it does meanwhile.

Why warm up: the first call of each step shape (a prefill bucket, a batched prefill, a decode batch and
attention window) captures its program and compiles its kernels to C, seconds each. A server that did
this on its first requests would answer them seconds late; this one captures the shapes the first
requests meet before /health answers, and hands the rest (longer windows, buckets and prefixes) to the
batcher, which captures them while it is idle (`warm_in_background`, `Batcher.warm_later`): /health
answers in about half the time. It prints each program as it goes (`Progress`), so a user sees the
start-up move.

Also here: `favour_the_loop`, which lowers the priority of every thread but the event loop's once the
server runs (the model's kernels run on atensor's worker threads and the BLAS library's).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Sequence, TextIO


class Progress:
    """Start-up lines with a bar: `[####      ] 12/30 capturing decode batch 4 window 64 (14.2 s)`."""

    def __init__(self, total: int, out: TextIO = sys.stderr, width: int = 24, label: str = ""):
        self.total, self.done, self.out, self.width, self.label = total, 0, out, width, label
        self.start = time.perf_counter()

    def say(self, what: str) -> None:
        """Prints `what` with the time since the start."""
        print(f"serve: {what} ({time.perf_counter() - self.start:.1f} s)", file=self.out, flush=True)

    def step(self, what: str) -> None:
        """One more of `total` done: prints the bar and what it was."""
        self.done += 1
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + " " * (self.width - filled)
        self.say(f"{self.label}[{bar}] {self.done}/{self.total} {what}")


@dataclass(frozen=True)
class WarmupCall:
    """One step shape to capture: what it is, how many slots it writes and from which cell on, and the
    step itself in its blocking and awaitable forms, each given the slots to write (`rows` of them).

    Invariant: the step writes only cells [first_cell, ...) of the slots it is given, so a slot cache
    that truncates their cached prefixes to `first_cell` (`SlotCache.overwritten`) stays true."""
    name: str
    rows: int
    first_cell: int
    run: Callable[[Sequence[int]], Any]
    run_async: Callable[[Sequence[int]], Awaitable[Any]]


def _prefill(engine: Any, name: str, rows: int, ids: list[int], start: int = 0) -> WarmupCall:
    if start:
        return WarmupCall(name, 1, start, lambda slots: engine.prefill(slots[0], ids, start),
                          lambda slots: engine.prefill_async(slots[0], ids, start))
    return WarmupCall(name, rows, 0, lambda slots: engine.prefill_many({s: ids for s in slots}),
                      lambda slots: engine.prefill_many_async({s: ids for s in slots}))


def _decode(engine: Any, name: str, rows: int, position: int) -> WarmupCall:
    return WarmupCall(name, rows, position, lambda slots: engine.decode({s: (1, position) for s in slots}),
                      lambda slots: engine.decode_async({s: (1, position) for s in slots}))


def warmup_calls(engine: Any, filler: int, stage: str = "start") -> list[WarmupCall]:
    """The step shapes to capture before the server answers (`stage` "start"), or once it answers, while
    it is idle (`stage` "background", `Batcher.warm_later`).

    At the start, what the first requests meet: every prefill bucket of one prompt, the batched prefills
    of the shortest bucket (a burst of short prompts), every decode batch at the first attention window
    (histories up to its length), and the extend (prefix cache) of the shortest bucket at the first
    window. In the background, what longer conversations and prompts meet later: the decode batches at
    every longer window, the batched prefills of the longer buckets, and the extends of every bucket at
    every window. Warming them all before answering took about twice as long (bench/llm.py's servers,
    16 slots, context 256, at load 6: /health after 98 s with these 12 programs first, the other 17 done
    at 249 s, against 154 s for the thread design's 26 programs before /health)."""
    from atensor.models.generation import batch_bucket, prefill_batches
    if stage not in ("start", "background"):
        raise ValueError(f"warm-up stage {stage!r}: use 'start' or 'background'")
    at_start = stage == "start"
    slots, context, shortest = engine.model.slots, engine.context, engine.buckets[0]
    windows = engine.windows[:1] if at_start else engine.windows[1:]
    calls = []
    if at_start:
        for length in engine.buckets:
            ids = [filler] * length if length < context else [filler] * (context - 1)
            calls.append(_prefill(engine, f"prefill bucket {length}", 1, ids))
    for length in engine.buckets[:1] if at_start else engine.buckets[1:]:
        for rows in sorted({r for n in range(2, slots + 1) for r in prefill_batches(n, length)} - {1}):
            calls.append(_prefill(engine, f"batched prefill {rows} x {length}", min(rows, slots), [filler] * length))
    for window in windows:
        rows = 1
        while True:  # a batch of every slot has a program of its own (LlamaEngine: `full`), so its
            for count in ([rows - 1, rows] if rows == slots and rows > 1 else [rows]):  # bucket is warmed
                calls.append(_decode(engine, f"decode batch {rows} window {window}"  # for one slot fewer too
                                     + (" (every slot)" if count == slots else ""), count, window - 1))
            if rows >= slots:
                break
            rows = min(slots, batch_bucket(rows + 1))
    for length in engine.buckets[:1] if at_start else engine.buckets:
        for window in engine.windows:  # an extend of `length` new tokens after a prefix filling the window
            start = window - length
            fresh = window == engine.windows[0] and length == shortest
            if start > 0 and fresh == at_start and engine.extend_fits(start, start + length):
                calls.append(_prefill(engine, f"prefix-cache prefill {length} window {window}", 1,
                                      [filler] * (start + length), start))
    return calls


def warm_in_background(batcher: Any, engine: Any, filler: int, out: TextIO = sys.stderr) -> int:
    """Hands the background stage of `warmup_calls` to `batcher` (captured while it is idle), printing
    each as it is done. Returns how many calls it handed over."""
    calls = warmup_calls(engine, filler, "background")
    progress = Progress(len(calls), out, label="background warm-up ")
    if calls:
        progress.say(f"ready; {len(calls)} more step programs will be captured while the server is idle")
    batcher.warm_later(calls, progress.step)
    return len(calls)


def build_engine(slots: int, context: int, prefill_buckets: Optional[Sequence[int]] = None,
                 warmup: bool = True, out: TextIO = sys.stderr) -> tuple[Any, Any]:
    """Loads the installed GGUF model and its tokenizer, and with `warmup` captures and compiles every
    step of `warmup_calls`' start stage (3 calls each: run, capture, verify); `warm_in_background` hands
    the rest to the batcher. Returns (engine, tokenizer)."""
    from atensor.models.generation import PREFILL_BUCKETS, LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    from atensor.models.tokenizer import GGUFTokenizer
    progress = Progress(0, out)
    progress.say("loading the model")
    gguf = load_gguf()
    tokenizer = GGUFTokenizer(gguf.metadata)
    engine = LlamaEngine(Llama(gguf, slots=slots, context=context), prefill_buckets or PREFILL_BUCKETS)
    progress.say(f"loaded {gguf.config.n_layers} layers, {slots} slots of {context} tokens")
    if warmup:
        calls = warmup_calls(engine, tokenizer.eos_id)
        progress.total = len(calls)
        progress.say(f"capturing and compiling {len(calls)} step programs")
        for call in calls:
            for _ in range(3):
                call.run(range(call.rows))
            progress.step(call.name)
    progress.say("ready")
    return engine, tokenizer


def favour_the_loop(nice: int) -> int:
    """Lowers every other thread of this process to `nice` (Linux; elsewhere nothing): called on the
    event loop's thread once the server runs, so the model's threads (atensor's queue workers, the BLAS
    library's) give way to the loop as soon as it can run, while they have every core it leaves. Threads
    those start later inherit their nice. Returns how many threads it lowered. Raising a thread's nice
    needs no privilege; lowering it back would."""
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
