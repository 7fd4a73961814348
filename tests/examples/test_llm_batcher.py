"""examples/serve_llm.py's Batcher on its own, with a stand-in engine (no model): an idle batcher gathers a
burst of requests into one prefill, a busy one admits at the next token boundary, and a lone request is
not held longer than the gathering bound."""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("serve_llm_under_test", ROOT / "examples" / "serve_llm.py")
serve_llm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_llm)

VOCAB = 8


class FakeEngine:
    """Prefill and decode of a model whose next token is always 1 (logits are one-hot), recording the
    slots of every prefill call and the time it started."""

    def __init__(self, slots: int = 4, step_seconds: float = 0.002):
        self.model = type("Model", (), {"slots": slots})()
        self.context = 1024
        self.step_seconds = step_seconds
        self.prefill_calls: list[tuple[float, list[int]]] = []

    def _logits(self) -> np.ndarray:
        out = np.zeros(VOCAB, np.float32)
        out[1] = 1.0
        return out

    def prefill_many(self, prompts: dict) -> dict:
        self.prefill_calls.append((time.monotonic(), sorted(prompts)))
        return {slot: self._logits() for slot in prompts}

    def decode(self, rows: dict) -> dict:
        time.sleep(self.step_seconds)
        return {slot: self._logits() for slot in rows}


class FakeTokenizer:
    end_ids = frozenset({0})

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


class Events(list):
    def put_nowait(self, item: object) -> None:
        self.append(item)


class DirectLoop:
    def call_soon_threadsafe(self, fn, *args) -> None:
        fn(*args)


def _generation(max_tokens: int = 20):
    from atensor.models.generation import SamplingParams
    return serve_llm.Generation(ids=[5, 6, 7], max_tokens=max_tokens, params=SamplingParams(), stop=[],
                                loop=DirectLoop(), events=Events())


def _finished(gens, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(g.finish_reason for g in gens):
        assert time.monotonic() < deadline, "the batcher did not finish the requests"
        time.sleep(0.01)


def _run(batch_wait: float, arrivals: list[float], slots: int = 4,
         max_tokens: int = 20) -> tuple[FakeEngine, list, float]:
    """Submits one request per `arrivals` offset (seconds) to an idle batcher; returns the engine, the
    generations and the time of the first submission."""
    engine = FakeEngine(slots)
    batcher = serve_llm.Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=batch_wait)
    batcher.start()
    gens = [_generation(max_tokens) for _ in arrivals]
    start = time.monotonic()
    try:
        for gen, at in zip(gens, arrivals):
            time.sleep(max(0.0, start + at - time.monotonic()))
            batcher.submit(gen)
        _finished(gens)
    finally:
        batcher.stop()
    return engine, gens, start


def test_an_idle_batcher_prefills_a_burst_together():
    engine, gens, _ = _run(batch_wait=0.25, arrivals=[0.0, 0.02, 0.04])
    assert [slots for _, slots in engine.prefill_calls] == [[0, 1, 2]]
    assert all(g.tokens == [1] * 20 and g.finish_reason == "length" for g in gens)


def test_without_a_wait_the_first_request_starts_alone_and_the_rest_join_at_a_token_boundary():
    engine, gens, _ = _run(batch_wait=0.0, arrivals=[0.0, 0.15, 0.15], max_tokens=200)  # ~0.4 s each
    calls = [slots for _, slots in engine.prefill_calls]
    assert calls[0] == [0] and sorted(s for slots in calls[1:] for s in slots) == [1, 2], calls
    assert all(g.tokens == [1] * 200 for g in gens)


def test_a_lone_request_waits_at_most_the_gathering_bound():
    engine, _, start = _run(batch_wait=0.05, arrivals=[0.0])
    (at, slots), = engine.prefill_calls
    assert slots == [0]
    assert at - start < 0.05 * 4 + 1.0  # the bound plus a generous margin on a loaded machine


def test_a_burst_that_fills_every_free_slot_is_admitted_without_waiting_out_the_quiet_time():
    engine, _, start = _run(batch_wait=5.0, arrivals=[0.0, 0.0], slots=2)
    (at, slots), = engine.prefill_calls
    assert slots == [0, 1] and at - start < 2.5  # far less than one 5 s quiet period


def test_a_busy_batcher_does_not_wait_for_more():
    """A request arriving while others generate joins at the next token boundary: gathering is only
    for an idle batcher (the decode steps keep their pace)."""
    engine = FakeEngine(4, step_seconds=0.01)
    batcher = serve_llm.Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=2.0)
    batcher.start()
    first, second = _generation(200), _generation(5)
    try:
        batcher.submit(first)
        deadline = time.monotonic() + 30
        while batcher.steps < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        joined = time.monotonic()
        batcher.submit(second)
        _finished([second])
        assert engine.prefill_calls[-1][0] - joined < 1.0  # not the 2 s quiet period
        first.cancelled = True
        _finished_or_released(batcher, first)
    finally:
        batcher.stop()


def _finished_or_released(batcher, gen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while gen.slot is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stop_ends_a_gathering_batcher_promptly():
    engine = FakeEngine(4)
    batcher = serve_llm.Batcher(engine, FakeTokenizer(), max_waiting=8, batch_wait=10.0)
    batcher.start()
    batcher.submit(_generation())
    time.sleep(0.05)
    started = time.monotonic()
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(timeout=30)
    assert not batcher.thread.is_alive() and time.monotonic() - started < 5.0
