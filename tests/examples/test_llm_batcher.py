"""atensor.serve's Batcher on its own, with a stand-in engine (no model), on trio and on asyncio: it runs as
a task of the event loop; an idle batcher gathers a burst of requests into one prefill, a busy one admits
at the next token boundary, a lone request is not held longer than the gathering bound, a prompt sharing
a finished request's prefix is prefilled from where the cached cells end (least recently used slots are
overwritten first), and cancelling the task fails the requests still generating."""
from __future__ import annotations

import asyncio
import time

import anyio
import numpy as np
import pytest
import trio

from atensor.models.generation import SamplingParams
from atensor.serve.batcher import Batcher
from atensor.serve.requests import Failure, Finish, Generation, Token, channel
from atensor.serve.slots import SlotCache
from atensor.serve.startup import WarmupCall

VOCAB = 8


class FakeEngine:
    """Awaitable prefill and decode of a model whose next token is always 1 (one-hot logits), recording
    each prefill call: (time, kind, {slot: start})."""

    def __init__(self, slots: int = 4, step_seconds: float = 0.002):
        self.model = type("Model", (), {"slots": slots})()
        self.context = 1024
        self.step_seconds = step_seconds
        self.prefill_calls: list[tuple[float, str, dict]] = []
        self.loop_free = True  # the loop ran another task while a step was awaited

    def _logits(self) -> np.ndarray:
        out = np.zeros(VOCAB, np.float32)
        out[1] = 1.0
        return out

    def extend_fits(self, start: int, length: int) -> bool:
        return 0 < start < length

    async def prefill_many_async(self, prompts: dict) -> dict:
        self.prefill_calls.append((time.monotonic(), "cold", {s: 0 for s in prompts}))
        await anyio.sleep(self.step_seconds)
        return {slot: self._logits() for slot in prompts}

    async def prefill_async(self, slot: int, ids: list, start: int = 0) -> np.ndarray:
        self.prefill_calls.append((time.monotonic(), "extend", {slot: start}))
        await anyio.sleep(self.step_seconds)
        return self._logits()

    async def decode_async(self, rows: dict) -> dict:
        await anyio.sleep(self.step_seconds)
        return {slot: self._logits() for slot in rows}


class FakeTokenizer:
    end_ids = frozenset({0})

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


def _generation(max_tokens: int = 20, ids=(5, 6, 7)) -> tuple[Generation, object]:
    send, receive = channel()
    return Generation(list(ids), max_tokens, SamplingParams(), send), receive


async def _events(receive) -> list:
    out = []
    while not out or isinstance(out[-1], Token):
        out.append(await receive.receive())
    return out


def _run(library: str, main) -> object:
    return trio.run(main) if library == "trio" else asyncio.run(main())


LIBRARIES = ["trio", "asyncio"]


async def _serve(batcher: Batcher, arrivals: list[float], max_tokens: int = 20, prompts=None) -> list:
    """Submits one request per `arrivals` offset to a running batcher; returns each one's events."""
    results: list = [None] * len(arrivals)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(batcher.run)
        start = time.monotonic()

        async def client(i: int) -> None:
            await anyio.sleep(max(0.0, start + arrivals[i] - time.monotonic()))
            gen, receive = _generation(max_tokens, prompts[i] if prompts else (5, 6, 7))
            batcher.submit(gen)
            results[i] = await _events(receive)
        async with anyio.create_task_group() as clients:
            for i in range(len(arrivals)):
                clients.start_soon(client, i)
        tasks.cancel_scope.cancel()
    return results


@pytest.mark.parametrize("library", LIBRARIES)
def test_an_idle_batcher_prefills_a_burst_together(library):
    engine = FakeEngine()
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.25)
    results = _run(library, lambda: _serve(batcher, [0.0, 0.02, 0.04]))
    assert [call[2] for call in engine.prefill_calls] == [{0: 0, 1: 0, 2: 0}]
    for events in results:
        assert [e.token for e in events[:-1]] == [1] * 20
        assert isinstance(events[-1], Finish) and events[-1].reason == "length"


@pytest.mark.parametrize("library", LIBRARIES)
def test_without_a_wait_the_first_request_starts_alone_and_the_rest_join_at_a_token_boundary(library):
    engine = FakeEngine()
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.0)
    results = _run(library, lambda: _serve(batcher, [0.0, 0.15, 0.15], max_tokens=200))
    calls = [sorted(call[2]) for call in engine.prefill_calls]
    assert calls[0] == [0] and sorted(s for slots in calls[1:] for s in slots) == [1, 2], calls
    assert all(len(events) == 201 for events in results)


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_lone_request_waits_at_most_the_gathering_bound(library):
    engine = FakeEngine()
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.05)
    start = time.monotonic()
    _run(library, lambda: _serve(batcher, [0.0]))
    (at, _, slots), = engine.prefill_calls
    assert slots == {0: 0} and at - start < 0.05 * 4 + 1.0  # the bound plus a margin on a loaded machine


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_busy_batcher_admits_at_the_next_token_boundary_not_after_the_quiet_time(library):
    engine = FakeEngine(step_seconds=0.01)
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=2.0)

    async def main() -> float:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)
            first, _ = _generation(200)
            batcher.submit(first)
            while batcher.steps < 3:
                await anyio.sleep(0.005)
            second, receive = _generation(5)
            joined = time.monotonic()
            batcher.submit(second)
            await _events(receive)
            first.cancelled = True
            tasks.cancel_scope.cancel()
        return engine.prefill_calls[-1][0] - joined
    assert _run(library, main) < 1.0  # not the 2 s quiet period


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_prompt_sharing_a_finished_requests_prefix_is_prefilled_from_its_cached_cells(library):
    engine = FakeEngine()
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.0, min_reuse=4)
    system = list(range(10, 30))

    async def main() -> None:
        await _serve(batcher, [0.0], max_tokens=3, prompts=[system + [1, 2]])
        await _serve(batcher, [0.0], max_tokens=3, prompts=[system + [3, 4, 5]])
    _run(library, main)
    (_, kind0, first), (_, kind1, second) = engine.prefill_calls
    assert kind0 == "cold" and kind1 == "extend"
    assert second == {next(iter(first)): len(system)}  # the same slot, from where the prompts differ
    assert batcher.slots.hits == 1 and batcher.slots.hit_tokens == len(system)


def test_the_slot_cache_reuses_the_longest_prefix_else_the_least_recently_used_slot():
    cache2 = SlotCache(3, min_reuse=2)
    assert [cache2.acquire([9] * 5).slot for _ in range(3)] == [0, 1, 2] and not cache2.free
    cache2.release(1, [1, 2, 3, 4])
    cache2.release(0, [1, 2, 7])
    cache2.release(2, [5, 6])
    hit = cache2.acquire([1, 2, 3, 9])
    assert (hit.slot, hit.reused) == (1, 3)
    miss = cache2.acquire([8, 8, 8])  # no usable prefix: the least recently used free slot (0, freed first)
    assert (miss.slot, miss.reused) == (0, 0)
    capped = cache2.acquire([5, 6])  # the whole prompt cached: the last token is prefilled again
    assert (capped.slot, capped.reused) == (2, 0)  # 1 token < min_reuse
    assert cache2.in_use == 3


@pytest.mark.parametrize("library", LIBRARIES)
def test_cancelling_the_batcher_fails_the_requests_still_generating_and_frees_their_slots(library):
    engine = FakeEngine(step_seconds=0.01)
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.0)

    async def main() -> object:
        gen, receive = _generation(10_000)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)
            batcher.submit(gen)
            while batcher.steps < 2:
                await anyio.sleep(0.005)
            tasks.cancel_scope.cancel()
        return (await _events(receive))[-1]
    last = _run(library, main)
    assert isinstance(last, Failure) and "shutting down" in last.message
    assert len(batcher.slots.free) == 4 and not batcher.active and not batcher.running


@pytest.mark.parametrize("library", LIBRARIES)
def test_an_idle_batcher_warms_in_the_background_on_scratch_slots_and_a_request_goes_first(library):
    """Background warm-up runs (3 a call) only while nothing generates or waits, on the free slots that
    hold the fewest cached tokens, and cuts a cached prefix where a run wrote into its slot."""
    engine = FakeEngine(step_seconds=0.005)
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.0, min_reuse=4)
    lease = batcher.slots.acquire([7] * 40)
    batcher.slots.release(lease.slot, [7] * 40)  # slot 0 holds a 40-token prefix; 1, 2, 3 are empty
    runs: list[tuple[str, list[int], bool]] = []

    def call(name: str, rows: int, first_cell: int) -> WarmupCall:
        async def run_async(slots) -> None:
            runs.append((name, list(slots), bool(batcher.active or batcher.waiting)))
            await anyio.sleep(0.01)
        return WarmupCall(name, rows, first_cell, lambda slots: None, run_async)
    warmed: list[str] = []

    async def main() -> list:
        batcher.warm_later([call("two rows", 2, 10), call("every slot", 4, 30)], warmed.append)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)
            await anyio.sleep(0.015)  # the first run is in flight
            gen, receive = _generation(5)
            batcher.submit(gen)
            events = await _events(receive)
            while batcher.warmups:
                await anyio.sleep(0.005)
            tasks.cancel_scope.cancel()
        return events
    events = _run(library, main)
    assert isinstance(events[-1], Finish) and len(events) == 6  # the request was served meanwhile
    assert [name for name, _, _ in runs] == ["two rows"] * 3 + ["every slot"] * 3
    assert not any(busy for _, _, busy in runs)  # never while a request generated or waited
    assert all(sorted(slots) == [1, 2] for name, slots, _ in runs[:1])  # empty slots first, not slot 0
    assert warmed == ["two rows", "every slot"] and batcher.stats()["warming"] == 0
    assert batcher.slots.free[0] == [7] * 30  # cut where "every slot" wrote; its first 30 cells kept
    assert all(len(held) <= 10 for slot, held in batcher.slots.free.items() if slot != 0)


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_cancelled_stream_frees_its_slot_and_cells_within_one_step(library):
    """A client that goes away (the handler marks its choice cancelled) has its slot back in the free
    list, holding only the cells written for its tokens, by the end of the next decode step, while the
    other streams go on."""
    engine = FakeEngine(step_seconds=0.005)
    batcher = Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=0.0)

    async def main() -> tuple[int, int, int, list]:
        gens = [_generation(10_000, ids=(5, 6, 7 + i)) for i in range(3)]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)
            for gen, _ in gens:
                batcher.submit(gen)
            while batcher.steps < 3:
                await anyio.sleep(0.001)
            leaving = gens[1][0]
            slot, at = leaving.slot, batcher.steps
            leaving.cancelled = True
            while batcher.slots.in_use == 3:
                await anyio.sleep(0)
            steps, in_use = batcher.steps - at, batcher.slots.in_use
            held = batcher.slots.free[slot]
            gens[0][0].cancelled = gens[2][0].cancelled = True
            tasks.cancel_scope.cancel()
        return steps, in_use, slot, held
    steps, in_use, slot, held = _run(library, main)
    assert steps <= 1 and in_use == 2
    assert held[:3] == [5, 6, 8] and set(held[3:]) <= {1}  # its prompt and the tokens it was fed
