"""The parts of examples/serve.py that are not atensor's server: baseline (b)'s engine (PyTorch in
Starlette's thread pool) and the event-loop stall reporter behind `--stall-report-ms`."""
from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Any, Optional, Sequence

import anyio
import numpy as np
from starlette.concurrency import run_in_threadpool


class TorchEngine:
    """Baseline (b): sentence-transformers on PyTorch CPU, each request in Starlette's `run_in_threadpool`
    (what FastAPI users write today)."""

    def __init__(self, max_tokens: int):
        from sentence_transformers import SentenceTransformer

        from atensor.models.bert import SentenceTokenizer, model_dir
        self.model = SentenceTransformer(str(model_dir()), device="cpu")
        self.tokenizer = SentenceTokenizer.from_pretrained()
        self.name, self.dim, self.max_tokens = "sentence-transformers/all-MiniLM-L6-v2", 384, max_tokens
        self.forward_passes = 0
        self.sentences_computed = 0

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode(sentences)

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def embed_sentences(self, sentences: list[str]) -> np.ndarray:
        out = await run_in_threadpool(lambda: self.model.encode(sentences, batch_size=len(sentences)))
        self.forward_passes += 1
        self.sentences_computed += len(sentences)
        return np.asarray(out, dtype=np.float32)

    def stats(self) -> dict[str, Any]:
        return {"forward_passes": self.forward_passes, "sentences_computed": self.sentences_computed,
                "devices": ["torch-cpu"]}


class StallWatch:
    """Diagnostics (`--stall-report-ms`): where the event loop thread was when it missed its 1 ms tick
    for longer than `threshold_s`. A watcher thread samples the loop thread's stack (and the top frame
    of every other thread) once a tick is late, and prints one report per stall to stderr when the loop
    is back: a long Python step on the loop shows in its stack; a loop waiting for the GIL shows the
    thread that held it."""

    def __init__(self, threshold_s: float):
        self.threshold_s = threshold_s
        self.tick = time.perf_counter()
        self.stalls = 0

    async def run(self) -> None:
        loop_thread = threading.get_ident()
        self.loop_tid = threading.get_native_id()
        threading.Thread(target=self._watch, args=(loop_thread,), name="stall-watch", daemon=True).start()
        while True:
            self.tick = time.perf_counter()
            await anyio.sleep(0.001)

    def _schedstat(self) -> tuple[int, int]:
        """The loop thread's (CPU ns, ns waited on a run queue) from Linux's schedstat; zeros elsewhere."""
        try:
            with open(f"/proc/self/task/{self.loop_tid}/schedstat") as f:
                cpu, wait, _ = f.read().split()
            return int(cpu), int(wait)
        except (OSError, ValueError):
            return 0, 0

    def _watch(self, loop_thread: int) -> None:
        sample: Optional[str] = None
        tick_stat = self._schedstat()
        last_tick = self.tick
        while True:
            time.sleep(0.002)
            late = time.perf_counter() - self.tick
            if late > self.threshold_s and sample is None:
                frames = sys._current_frames()
                names = {t.ident: t.name for t in threading.enumerate()}
                loop = "".join(traceback.format_list(traceback.extract_stack(frames[loop_thread])[-6:]))
                others = [f"  [{names.get(i, i)}] " + " <- ".join(
                    f"{e.name} ({e.filename.rsplit('/', 1)[-1]}:{e.lineno})"
                    for e in reversed(traceback.extract_stack(f)[-4:]))
                    for i, f in frames.items() if i not in (loop_thread, threading.get_ident())]
                sample = f"loop thread at {late * 1e3:.1f} ms:\n{loop}other threads:\n" + "\n".join(others)
            elif late <= self.threshold_s and sample is not None:
                self.stalls += 1
                cpu, wait = (b - a for a, b in zip(tick_stat, self._schedstat()))
                print(f"serve: event loop stall #{self.stalls} (from the tick before it to now, the loop thread "
                      f"ran {cpu / 1e6:.1f} ms and waited {wait / 1e6:.1f} ms for a CPU; the rest it waited "
                      f"for the GIL or slept); {sample}", file=sys.stderr, flush=True)
                sample = None
            if self.tick != last_tick and sample is None:
                last_tick, tick_stat = self.tick, self._schedstat()
