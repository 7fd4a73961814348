"""A tiny one-queue jit replay submitted in one foreign call (engine/replay.py, backend/c/replay.py)
computes what the function computes, whatever buffers a call brings: inputs swapped between calls,
inputs whose memory was just freed and handed out again, results kept across calls, an input whose
contents come from a failed kernel (refused, and the replay works again after it). numpy is the
reference; each test also checks that the record path ran (so none passes on the Python path alone),
or, with the compiler hidden (tests/engine/test_no_compiler.py runs them so), that it never did.
Run as users run (race checks off), under trio and asyncio."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.backend.c import compiler
from atensor.hcq import loop
from tests.engine.loops import run_on, count_record_runs

pytestmark = pytest.mark.default_settings
COMPILED = compiler.path() is not None


def _expect_records(recorded: list[int], at_least: int) -> None:
    """At least `at_least` replays went through a ReplayRecord; none without a compiler."""
    if COMPILED:
        assert len(recorded) >= at_least, recorded
    else:
        assert recorded == []


@pytest.fixture
def recorded(monkeypatch) -> list[int]:
    """One entry per replay that went through a ReplayRecord."""
    return count_record_runs(monkeypatch)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_swapped_inputs_and_reused_memory_are_bound_to_the_right_slots(library, recorded, young_heap):
    @atensor.jit
    async def f(a: Tensor, b: Tensor) -> Tensor:
        return a - b * 2  # not symmetric: a swapped binding gives other values

    async def main() -> None:
        rng = np.random.default_rng(7)
        kept = []
        for k in range(12):
            a_np, b_np = rng.standard_normal((2, 32)).astype(np.float32)
            a, b = Tensor(a_np), Tensor(b_np)
            if k % 2:  # the same two buffers in the other order
                a, b, a_np, b_np = b, a, b_np, a_np
            got = await f(a, b)
            np.testing.assert_allclose(got.numpy(), a_np - b_np * 2, rtol=1e-6)
            kept.append((got, a_np - b_np * 2))
            del a, b
            gc.collect()  # their memory goes back to the device's allocator for the next call's inputs
        for got, want in kept:  # fresh result buffers: earlier results keep their values
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
        assert f.stats["replays"] == 9
        _expect_records(recorded, 7)
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_chain_on_its_own_result_and_a_fixed_state_buffer(library, recorded):
    state = Tensor(np.zeros(16, dtype=np.float32)).contiguous()

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        state.assign(state + x)  # a captured buffer written in place by every replay
        return (x * 2).contiguous()

    async def main() -> None:
        await state.realize()
        y = Tensor(np.ones(16, dtype=np.float32)).contiguous()
        want_state = np.zeros(16, dtype=np.float32)
        want_y = np.ones(16, dtype=np.float32)
        for _ in range(10):
            want_state += want_y
            want_y = want_y * 2
            y = await step(y)
        np.testing.assert_allclose(y.numpy(), want_y)
        np.testing.assert_allclose(state.numpy(), want_state)
        _expect_records(recorded, 4)
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_an_input_from_a_failed_kernel_is_refused_and_the_replay_works_after_it(library, recorded):
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x * 3 + 1

    async def main() -> None:
        for k in range(6):
            got = await f(Tensor(np.arange(4, dtype=np.int32) + k))
            assert got.tolist() == [3 * (i + k) + 1 for i in range(4)]
        _expect_records(recorded, 1)
        bad = Tensor([2, 3, 4, 5], dtype="int32") ** Tensor([-1, -2, -1, -1], dtype="int32")  # numpy refuses it
        with pytest.raises(RuntimeError, match="failed"):
            await bad.realize()
        with pytest.raises(RuntimeError, match="failed"):
            await f(bad)
        before = len(recorded)
        got = await f(Tensor(np.arange(4, dtype=np.int32)))
        assert got.tolist() == [1, 4, 7, 10]
        _expect_records(recorded, before + 1)
    run_on(library, main)


async def test_a_replay_awaited_while_another_task_holds_the_queue_takes_the_python_path(recorded):
    """A replay issued while a big realize may still run on its queue (the record is used only when
    every queue is idle: the queue's order) computes the right value, and the next one uses the record."""
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x + 1

    for k in range(6):  # run, capture, verify, then replays: the record is made by the second
        await f(Tensor(np.full(8, k, dtype=np.float32)))
    assert not COMPILED or recorded
    big = Tensor(np.ones((400, 400), dtype=np.float32))
    pending = (big @ big).sum().realize()  # on the same queue, still running when the replay comes
    before = len(recorded)
    got = await f(Tensor(np.full(8, 5, dtype=np.float32)))
    assert got.tolist() == [6.0] * 8
    await pending
    got = await f(Tensor(np.full(8, 6, dtype=np.float32)))
    assert got.tolist() == [7.0] * 8
    _expect_records(recorded, before + 1)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_chain_of_many_kernels_runs_in_one_call_and_in_order(library, recorded):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        for k in range(40):
            x = (x * 2 if k % 3 == 0 else x - 1).contiguous()  # the order of the kernels matters
        return x

    def reference(x: np.ndarray) -> np.ndarray:
        for k in range(40):
            x = x * 2 if k % 3 == 0 else x - 1
        return x

    async def main() -> None:
        for k in range(7):
            x_np = np.full(16, 1.0 + k / 8, dtype=np.float64)
            got = await step(Tensor(x_np))
            np.testing.assert_allclose(got.numpy(), reference(x_np), rtol=1e-12)
        _expect_records(recorded, 2)
        assert all(count >= 2 for count in recorded)  # its input and its result are swapped
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio", "uvloop"])
def test_an_awaited_replay_done_on_the_calling_thread_needs_no_wake_up(library, recorded, monkeypatch):
    """The replay ran inside its one call, so its await finds it done: no Wakeup is made (no thread
    hop from a queue's worker back to the loop), on any loop."""
    made: list[str] = []
    original = loop.wakeup

    def counting():
        made.append(library)
        return original()
    monkeypatch.setattr(loop, "wakeup", counting)

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return (x * 2).contiguous() + 1

    async def main() -> None:
        y = Tensor(np.zeros(16, dtype=np.float32)).contiguous()
        await y.realize()
        for _ in range(6):  # run, capture, verify (compiles), lower, make the record
            y = await step(y)
        before, woken = len(recorded), len(made)
        want = y.numpy().copy()
        for _ in range(20):
            want = want * 2 + 1
            y = await step(y)
        np.testing.assert_allclose(y.numpy(), want)
        if COMPILED:
            assert len(recorded) == before + 20 and len(made) == woken
    run_on(library, main)
