"""Per-task modes: `Tensor.training`, `Tensor.no_grad` and `atensor.Context` are context-local, so two
concurrent trio tasks, one training and one evaluating, each see their own, and a realize is planned
(on the dispatcher thread) with the settings of the task that issued it."""
from __future__ import annotations

import numpy as np
import trio

import atensor
from atensor import Tensor
from atensor.nn import Dropout
from atensor.sched import cache


async def test_two_concurrent_tasks_keep_their_own_training_and_no_grad_modes():
    x = np.arange(1, 4097, dtype=np.float32)
    seen: dict[str, tuple] = {}
    a_inside, b_inside, a_checked = trio.Event(), trio.Event(), trio.Event()

    async def training() -> None:
        Tensor.training = True  # tinygrad's style of assignment: this task only
        a_inside.set()
        await b_inside.wait()  # the evaluating task is inside its no_grad block now
        out = await Dropout(0.5)(Tensor(x)).realize()
        seen["train"] = (Tensor.training, bool(Tensor.no_grad), out.numpy())
        a_checked.set()

    async def evaluating() -> None:
        await a_inside.wait()  # the training task has set its mode
        with Tensor.no_grad:
            b_inside.set()
            await a_checked.wait()
            out = await Dropout(0.5)(Tensor(x)).realize()
            seen["eval"] = (Tensor.training, bool(Tensor.no_grad), out.numpy())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(training)
        nursery.start_soon(evaluating)
    assert not Tensor.training and not Tensor.no_grad  # the parent's modes are untouched
    train_mode, train_no_grad, dropped = seen["train"]
    eval_mode, eval_no_grad, kept = seen["eval"]
    assert (train_mode, train_no_grad) == (True, False)
    assert (eval_mode, eval_no_grad) == (False, True)
    np.testing.assert_array_equal(kept, x)  # evaluation: dropout is the identity
    zero = dropped == 0
    assert 0.3 < zero.mean() < 0.7  # training: about half dropped, the rest scaled by 1 / (1 - p)
    np.testing.assert_allclose(dropped[~zero], x[~zero] * 2, rtol=1e-6)


async def _hits_of_a_realize() -> tuple[int, np.ndarray]:
    """The schedule-cache hits of realizing `a * 3 + 1` for a new buffer `a` (the same structure each
    time, never the same nodes, so the value is computed, not found realized), and its values."""
    a = await Tensor(np.ones(64, dtype=np.float32)).contiguous().realize()
    before = cache.stats["hits"]
    out = await (a * 3 + 1).realize()
    return cache.stats["hits"] - before, out.numpy()


async def test_a_context_block_applies_to_its_task_and_to_the_realizes_it_issues():
    """The schedule cache is off in one task only: its realize (planned on the dispatcher thread)
    misses, while the other task, meanwhile inside its own block, still has the cache on."""
    for _ in range(2):
        await _hits_of_a_realize()  # the graph's structure is cached now
    observed: dict[str, object] = {}
    off_inside, on_checked = trio.Event(), trio.Event()

    async def without_cache() -> None:
        with atensor.Context(schedule_cache=False):
            off_inside.set()
            await on_checked.wait()
            observed["off"] = (atensor.settings.schedule_cache, *await _hits_of_a_realize())

    async def with_cache() -> None:
        await off_inside.wait()
        observed["on"] = atensor.settings.schedule_cache
        on_checked.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(without_cache)
        nursery.start_soon(with_cache)
    assert observed["on"] is True
    setting, hits, values = observed["off"]
    assert setting is False and hits == 0
    np.testing.assert_array_equal(values, np.full(64, 4, dtype=np.float32))
    hits, values = await _hits_of_a_realize()
    assert hits == 1  # outside the block the cache is used again
    np.testing.assert_array_equal(values, np.full(64, 4, dtype=np.float32))
