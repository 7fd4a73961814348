"""Loading the LLM and capturing its steps before the first request, saying what it does meanwhile.

Why warm up: the first call of each step shape (a prefill bucket, a batched prefill, a decode batch and
attention window) captures its program and compiles its kernels to C, seconds each. A server that did
this on its first requests would answer them seconds late; this one does it before /health answers,
and prints each program as it goes (`Progress`), so a user sees a start-up of about a minute move.

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
from typing import Any, Callable, Optional, Sequence, TextIO


class Progress:
    """Start-up lines with a bar: `[####      ] 12/30 capturing decode batch 4 window 64 (14.2 s)`."""

    def __init__(self, total: int, out: TextIO = sys.stderr, width: int = 24):
        self.total, self.done, self.out, self.width = total, 0, out, width
        self.start = time.perf_counter()

    def say(self, what: str) -> None:
        """Prints `what` with the time since the start."""
        print(f"serve: {what} ({time.perf_counter() - self.start:.1f} s)", file=self.out, flush=True)

    def step(self, what: str) -> None:
        """One more of `total` done: prints the bar and what it was."""
        self.done += 1
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + " " * (self.width - filled)
        self.say(f"[{bar}] {self.done}/{self.total} {what}")


@dataclass(frozen=True)
class WarmupCall:
    """One step shape to capture: what it is, and the blocking call that runs it once."""
    name: str
    run: Callable[[], Any]


def warmup_calls(engine: Any, filler: int) -> list[WarmupCall]:
    """The step shapes a server meets first: every prefill bucket of one prompt, the batched prefills of
    the shortest bucket (a burst of short prompts), every decode (batch size, attention window), and the
    extend (prefix cache) programs of the shortest bucket. A batched prefill of a longer bucket, or an
    extend of a longer one, is captured on first use (warming every one took minutes)."""
    from atensor.models.generation import batch_bucket, prefill_batches
    slots, context = engine.model.slots, engine.context
    calls = []
    for length in engine.buckets:
        ids = [filler] * length if length < context else [filler] * (context - 1)
        calls.append(WarmupCall(f"prefill bucket {length}", lambda ids=ids: engine.prefill(0, ids)))
    shortest = engine.buckets[0]
    for rows in sorted({r for n in range(2, slots + 1) for r in prefill_batches(n, shortest)} - {1}):
        prompts = {s: [filler] * shortest for s in range(min(rows, slots))}
        calls.append(WarmupCall(f"batched prefill {rows} x {shortest}",
                                lambda prompts=prompts: engine.prefill_many(prompts)))
    rows = 1
    while True:  # a batch of every slot has a program of its own (LlamaEngine: `full`), so its bucket
        for window in engine.windows:  # is warmed for one slot fewer (padded) too
            for count in ([rows - 1, rows] if rows == slots and rows > 1 else [rows]):
                batch = {s: (filler, window - 1) for s in range(count)}
                calls.append(WarmupCall(f"decode batch {rows} window {window}"
                                        + (" (every slot)" if count == slots else ""),
                                        lambda b=batch: engine.decode(b)))
        if rows >= slots:
            break
        rows = min(slots, batch_bucket(rows + 1))
    for window in engine.windows:  # an extend of the shortest bucket after a prefix that fills the window
        start = window - shortest
        if start > 0 and engine.extend_fits(start, start + 1):
            ids = [filler] * (start + 1)
            calls.append(WarmupCall(f"prefix-cache prefill {shortest} window {window}",
                                    lambda ids=ids, start=start: engine.prefill(0, ids, start)))
    return calls


def build_engine(slots: int, context: int, prefill_buckets: Optional[Sequence[int]] = None,
                 warmup: bool = True, out: TextIO = sys.stderr) -> tuple[Any, Any]:
    """Loads the installed GGUF model and its tokenizer, and with `warmup` captures and compiles every
    step of `warmup_calls` (3 calls each: run, capture, verify). Returns (engine, tokenizer)."""
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
                call.run()
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
