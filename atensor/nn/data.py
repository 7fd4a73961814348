"""Language-model batches made by tasks on the event loop, concurrent with training, with backpressure.

Why: a training step is one awaited task graph; while its kernels run, the event loop is free. The
data pipeline uses that time: one producer task reads documents, tokenizes them in a worker thread
(the `tokenizers` library releases the GIL), cuts the token stream into windows, shuffles and
batches them, and sends each batch into a bounded channel (an anyio memory stream, so the same code
runs under trio and asyncio). The training loop receives from it. When the channel is full the
producer's send waits: backpressure, so the pipeline never runs more than `prefetch` batches ahead
and takes no time the training needs. How long the consumer waits for a batch is the pipeline's
stall, counted in `PipelineStats`.

The batches are a pure function of the documents, the seed and the step, whatever the timing:

    documents (epoch e: the order `order(e)`)  -> tokens, `<|endoftext|>` after each document
    token stream, continuous across documents and epochs -> windows of context + 1 tokens, each
        starting where the previous one's last token is (every token is a target exactly once)
    windows in pools of `pool_batches` batches -> each pool permuted by numpy's generator seeded
        with (seed, pool number) -> consecutive batches of `batch` windows
    batch k: inputs window[:-1], targets window[1:], (batch, context) int32 each

So a run resumed at step k (`start_step=k`) receives the batches an uninterrupted run receives from
step k on (the producer makes and drops the first k), and every process of a data-parallel run
makes the same global batch and keeps its own rows (`rows`).

Alternatives rejected: tokenizing the whole corpus before training (half a minute of 2 cores before
the first step, and nothing left to overlap), and sampling random offsets from a tokenized array
(nanoGPT's; it needs that array first).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from atensor.profiler.collector import host_span

Encode = Callable[[list[str]], list[Sequence[int]]]  # documents -> their token ids


@dataclass(frozen=True)
class Batch:
    """Step `step`'s inputs and next-token targets, (rows, context) int32 each."""
    step: int
    inputs: np.ndarray
    targets: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.inputs.size)


@dataclass
class PipelineStats:
    """What the pipeline did, and how long the training loop waited for it (`wait_ns`)."""
    documents: int = 0
    tokens: int = 0
    batches: int = 0
    encode_ns: int = 0          # in the worker thread, tokenizing
    wait_ns: int = 0            # the consumer waiting for a batch: the stall
    waits: list[int] = field(default_factory=list)  # each receive's wait, ns


@dataclass(frozen=True)
class LMDataSpec:
    """The shape of the batches and how documents become them (see the module docstring)."""
    batch: int
    context: int
    seed: int = 0
    eot: int = 0
    pool_batches: int = 16
    chunk_documents: int = 8    # documents per tokenizer call

    def __post_init__(self) -> None:
        if self.batch < 1 or self.context < 1 or self.pool_batches < 1 or self.chunk_documents < 1:
            raise ValueError(f"batch, context, pool_batches and chunk_documents must be positive: {self}")


class Windows:
    """Cuts a token stream into windows of `context + 1` tokens, each overlapping the previous by one
    (its first token is the previous window's last target). Synchronous and deterministic."""

    def __init__(self, context: int):
        self.length = context + 1
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0

    def feed(self, ids: np.ndarray) -> list[np.ndarray]:
        """Adds `ids` to the stream; returns the windows now complete."""
        self.pending.append(ids)
        self.pending_tokens += len(ids)
        if self.pending_tokens < self.length:
            return []
        stream = np.concatenate(self.pending)
        count = (len(stream) - 1) // (self.length - 1)
        step = self.length - 1
        windows = [stream[i * step:i * step + self.length] for i in range(count)]
        rest = stream[count * step:]
        self.pending, self.pending_tokens = [rest], len(rest)
        return windows


def pool_order(seed: int, pool: int, size: int) -> np.ndarray:
    """The permutation of pool `pool`'s windows (numpy's PCG64 seeded with (seed, pool))."""
    return np.random.default_rng([seed, pool]).permutation(size)


def document_chunks(documents: Callable[[int], Iterator[str]], size: int) -> Iterator[list[str]]:
    """Epoch after epoch of `documents(epoch)`, in lists of up to `size` texts (a tokenizer call each);
    never ends. Raises ValueError for an epoch without documents."""
    epoch = 0
    while True:
        texts, empty = iter(documents(epoch)), True
        while True:
            chunk = [text for _, text in zip(range(size), texts)]
            if not chunk:
                break
            empty = False
            yield chunk
        if empty:
            raise ValueError(f"epoch {epoch} has no documents")
        epoch += 1


def batches_of(spec: LMDataSpec, documents: Callable[[int], Iterator[str]], encode: Encode,
               rows: slice = slice(None)) -> Iterator[Batch]:
    """The batches of the module docstring, synchronously (the reference the async pipeline must
    equal, and what a blocking caller uses): `documents(epoch)` yields epoch `epoch`'s texts."""
    batcher = _Batcher(spec, rows)
    for chunk in document_chunks(documents, spec.chunk_documents):
        yield from batcher.add(encode(chunk))


class _Batcher:
    """Token ids of documents in, batches out (the deterministic part of the pipeline)."""

    def __init__(self, spec: LMDataSpec, rows: slice):
        self.spec, self.rows = spec, rows
        self.windows = Windows(spec.context)
        self.pool: list[np.ndarray] = []
        self.pools = 0
        self.step = 0
        self.documents = self.tokens = 0

    def add(self, encoded: list[Sequence[int]]) -> list[Batch]:
        spec = self.spec
        out: list[Batch] = []
        for ids in encoded:
            self.documents += 1
            self.tokens += len(ids) + 1
            tokens = np.empty(len(ids) + 1, np.int32)
            tokens[:-1], tokens[-1] = ids, spec.eot
            self.pool.extend(self.windows.feed(tokens))
            size = spec.pool_batches * spec.batch
            while len(self.pool) >= size:
                pool, self.pool = np.stack(self.pool[:size]), self.pool[size:]
                pool = pool[pool_order(spec.seed, self.pools, size)]
                self.pools += 1
                for b in range(spec.pool_batches):
                    rows = pool[b * spec.batch:(b + 1) * spec.batch][self.rows]
                    out.append(Batch(self.step, np.ascontiguousarray(rows[:, :-1]),
                                     np.ascontiguousarray(rows[:, 1:])))
                    self.step += 1
        return out


class BatchPipeline:
    """The producer task and the bounded channel of the module docstring.

        pipeline = BatchPipeline(spec, documents, encode, prefetch=4)
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.run)
            for step in range(steps):
                batch = await pipeline.next()
                ...
            tg.cancel_scope.cancel()          # or pipeline.close()

    `start_step` skips the batches before it (they are made, not sent); `rows` keeps this process's
    rows of each global batch. Cancelling `run` (or the task group) stops the producer wherever it
    waits: in the send (the channel full), or for the worker thread, which finishes its call first.
    """

    def __init__(self, spec: LMDataSpec, documents: Callable[[int], Iterator[str]], encode: Encode,
                 prefetch: int = 4, start_step: int = 0, rows: slice = slice(None)):
        import anyio
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        self.spec, self.documents, self.encode = spec, documents, encode
        self.start_step, self.rows = start_step, rows
        self.stats = PipelineStats()
        self._send, self._receive = anyio.create_memory_object_stream(prefetch)

    async def run(self) -> None:
        """The producer: tokenizes in a worker thread, batches on the loop, sends with backpressure.
        Ends when the consumer closes its side (`close`)."""
        import anyio
        batcher = _Batcher(self.spec, self.rows)
        async with self._send:
            for chunk in document_chunks(self.documents, self.spec.chunk_documents):
                start = time.perf_counter_ns()
                encoded = await anyio.to_thread.run_sync(self._encode_chunk, chunk)
                self.stats.encode_ns += time.perf_counter_ns() - start
                with host_span(f"batch {len(chunk)} documents", "data", track="data"):
                    batches = batcher.add(encoded)
                self.stats.documents, self.stats.tokens = batcher.documents, batcher.tokens
                for batch in batches:
                    if batch.step < self.start_step:
                        continue
                    try:
                        await self._send.send(batch)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return
                    self.stats.batches += 1

    def _encode_chunk(self, chunk: list[str]) -> list[Sequence[int]]:
        with host_span(f"tokenize {len(chunk)} documents", "data", track="data (worker thread)",
                       detail=f"{sum(len(t) for t in chunk)} characters"):
            return self.encode(chunk)

    async def next(self) -> Batch:
        """The next batch; the time waited for it counts as the pipeline's stall."""
        start = time.perf_counter_ns()
        with host_span("wait for batch", "data", track="data"):
            batch = await self._receive.receive()
        waited = time.perf_counter_ns() - start
        self.stats.wait_ns += waited
        self.stats.waits.append(waited)
        return batch

    def close(self) -> None:
        """Closes the consumer's side: the producer's next send ends `run`."""
        self._receive.close()
