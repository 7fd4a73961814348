"""The parts of examples/serve.py that are not atensor's server: baseline (b)'s engine (PyTorch in a
thread), the HTTP client the tests and bench/serve_load.py use, and the event-loop stall reporter
behind `--stall-report-ms`."""
from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import Any, Optional, Sequence

import numpy as np
import trio


class TorchEngine:
    """Baseline (b): sentence-transformers on PyTorch CPU, each request in `trio.to_thread.run_sync`."""

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

    async def run(self, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def embed_sentences(self, sentences: list[str]) -> np.ndarray:
        out = await trio.to_thread.run_sync(lambda: self.model.encode(sentences, batch_size=len(sentences)))
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
            await trio.sleep(0.001)

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


class EmbedClient:
    """One kept-alive HTTP/1.1 connection (h11 over a trio stream).

        async with EmbedClient("127.0.0.1", port) as client:
            status, body = await client.request("POST", "/embed", {"sentences": ["hi"]})
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._stream: Optional[trio.SocketStream] = None
        self._conn: Any = None

    async def __aenter__(self) -> EmbedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def request(self, method: str, path: str, payload: Any = None, raw: Optional[bytes] = None
                      ) -> tuple[int, Any]:
        """Sends one request (a JSON `payload`, or `raw` bytes) and returns (status, parsed JSON body)."""
        import h11
        if self._stream is None or self._conn.our_state is not h11.IDLE:
            await self.aclose()
            self._stream = await trio.open_tcp_stream(self.host, self.port)
            self._conn = h11.Connection(h11.CLIENT)
        conn = self._conn
        body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        headers = [("host", f"{self.host}:{self.port}"), ("content-length", str(len(body)))]
        if payload is not None:
            headers.append(("content-type", "application/json"))
        data = conn.send(h11.Request(method=method, target=path, headers=headers))
        data += conn.send(h11.Data(data=body)) if body else b""
        data += conn.send(h11.EndOfMessage())
        try:
            await self._stream.send_all(data)
            status, chunks = 0, []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await self._stream.receive_some(1 << 16))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
        except BaseException:
            await self.aclose()
            raise
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.aclose()
        text = b"".join(chunks)
        return status, json.loads(text) if text else None
