"""An eager realize whose graph hits a hot template with a HEAVY twin (a plan too heavy for a record:
matmuls past layout.py's flops bound, as the flagship's eager training step) runs as an `EagerReplay`
from the caller's thread (engine/eager_replay.py): no job for the dispatcher thread, its kept runners
submitted by `Plan.submit`, the handle on that submission. A realize that takes pending assigns along
(an optimizer's updates) qualifies too. Each test checks that the replay ran (so none passes on the
general path alone) and compares it with the general path (the replay declined): the same values, bit
for bit, and the same ledger state; numpy is the reference. Without a C compiler no twin is made and the
replay never runs. Under trio and asyncio."""
from __future__ import annotations

import asyncio
from typing import Optional

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor, ledger
from atensor.backend.c import compiler, registry
from atensor.engine import dispatch, eager_replay, program as program_module

pytestmark = pytest.mark.default_settings
COMPILED = compiler.path() is not None


@pytest.fixture
def heavy_replays(monkeypatch) -> list[int]:
    """One entry (the roots' count) per heavy EagerReplay run; a template is hot after 2 hits."""
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    runs: list[int] = []
    run = eager_replay.EagerReplay.run

    def counting(self, key, template, roots, result):
        handle = run(self, key, template, roots, result)
        if handle is not False and self.record is None and self.lean is None:
            runs.append(len(roots))
        return handle
    monkeypatch.setattr(eager_replay.EagerReplay, "run", counting)
    return runs


@pytest.fixture
def dispatched(monkeypatch) -> list[int]:
    """One entry per job handed to the dispatcher thread."""
    jobs: list[int] = []
    submit = dispatch.Dispatcher.submit

    def counting(self, job):
        jobs.append(1)
        return submit(self, job)
    monkeypatch.setattr(dispatch.Dispatcher, "submit", counting)
    return jobs


def _general_path_only(monkeypatch) -> None:
    monkeypatch.setattr(eager_replay.EagerReplay, "of", staticmethod(lambda program: None))
    monkeypatch.setattr(eager_replay.EagerReplay, "valid", lambda self: False)


def _run(library: str, main):
    """`main()` under `library`, with one BLAS thread (two may split a product's sum differently from
    one run to the next, and the tests compare bit for bit)."""
    async def one_thread():
        with atensor.Context(blas_threads=1):
            return await main()
    return trio.run(one_thread) if library == "trio" else asyncio.run(one_thread())


def _forward_loop(library: str, rows: int, hits: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`hits` awaited realizes of one heavy graph, each with new inputs: (results, numpy's)."""
    rng = np.random.default_rng(7)
    w_np = rng.random((96, 96), dtype=np.float32)
    w = Tensor(w_np)
    xs = [rng.random((rows, 96), dtype=np.float32) for _ in range(hits)]

    async def main():
        kept = []
        for k, x_np in enumerate(xs):
            y = ((Tensor(x_np) @ w).relu() * 2).sum(axis=1)
            await y.realize()
            kept.append(y)
            if k == 2:
                registry.wait_background()
        return [y.numpy() for y in kept]  # each hit kept buffers of its own
    got = _run(library, main)
    return got, [(np.maximum(x @ w_np, 0) * 2).sum(axis=1) for x in xs]


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_heavy_graph_runs_from_the_callers_thread_and_equals_the_general_path(
        library, heavy_replays, dispatched, monkeypatch):
    rows = 70 if library == "trio" else 71  # (a template outlives a test: each its own)
    _forward_loop(library, rows, 4)  # hot, compiled: both runs below use the same kernels (C, not numpy)
    heavy_replays.clear()
    dispatched.clear()
    got, expected = _forward_loop(library, rows, 12)
    for y, ref in zip(got, expected):
        np.testing.assert_allclose(y, ref, rtol=1e-4)
    if COMPILED:
        assert len(heavy_replays) >= 10, heavy_replays
        assert len(dispatched) <= 12 - len(heavy_replays)  # a replayed hit is no dispatcher job
    else:
        assert heavy_replays == []
    heavy_replays.clear()
    _general_path_only(monkeypatch)
    general, _ = _forward_loop(library, rows, 12)
    assert heavy_replays == []
    for a, b in zip(got, general):
        assert np.array_equal(a, b)


def _step(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """One SGD step (learning rate 0.01) of a two-layer relu network on a mean-square loss, its gradients
    written by hand: assigns both weights' updates (left pending) and returns the loss (lazy)."""
    h = (x @ w1).relu()
    out = h @ w2
    loss = (out * out).sum() * (1 / 128)
    g_out = out * (2 / 128)
    g_w2 = h.T @ g_out
    g_w1 = x.T @ ((g_out @ w2.T) * (h > 0).cast(h.dtype))
    w1.assign(w1 - g_w1 * 0.01)
    w2.assign(w2 - g_w2 * 0.01)
    return loss


def _training(library: str, hidden: int, steps: int) -> tuple[list[float], list[np.ndarray], tuple]:
    """`steps` steps of a two-layer network with plain SGD written as assigns (the loss realized with
    the updates it reads before, as `opt.step(loss)` does): the losses, the final weights, and what the
    ledger says of the first weight."""
    rng = np.random.default_rng(11)
    w1_np = (rng.random((64, hidden), dtype=np.float32) - 0.5) * 0.2
    w2_np = (rng.random((hidden, 8), dtype=np.float32) - 0.5) * 0.2
    xs = [rng.random((128, 64), dtype=np.float32) for _ in range(steps)]

    async def main():
        w1, w2 = Tensor(w1_np).contiguous(), Tensor(w2_np).contiguous()
        await w1.realize(w2)
        losses = []
        for k, x_np in enumerate(xs):
            x = Tensor(x_np)
            loss = _step(x, w1, w2)
            await loss.realize(w1, w2)  # the loss and both pending updates, one realize
            losses.append(loss.item())
            if k == 2:
                registry.wait_background()
        spec, version = w1.node.base().arg
        state = (version, ledger.version(spec), ledger.head(spec), ledger.claimed(spec), ledger.pending_heads())
        return losses, [w1.numpy(), w2.numpy()], state
    return _run(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_training_step_with_its_pending_updates_replays_and_equals_the_general_path_bit_for_bit(
        library, heavy_replays, monkeypatch):
    hidden = 96 if library == "trio" else 97
    _training(library, hidden, 4)  # hot, compiled: both runs below use the same kernels (C, not numpy)
    heavy_replays.clear()
    losses, weights, state = _training(library, hidden, 12)
    if COMPILED:
        assert len(heavy_replays) >= 10, heavy_replays
        assert all(roots == 3 for roots in heavy_replays), heavy_replays  # the loss and both updates
    else:
        assert heavy_replays == []
    assert losses[-1] < losses[0]
    heavy_replays.clear()
    _general_path_only(monkeypatch)
    general_losses, general_weights, general_state = _training(library, hidden, 12)
    assert heavy_replays == []
    assert losses == general_losses
    for a, b in zip(weights, general_weights):
        assert np.array_equal(a, b)
    assert state == general_state


def _sharded_training(library: str, hidden: int, steps: int) -> tuple[list[float], list[np.ndarray]]:
    """`_training`'s network data-parallel on two CPU devices: the batch split, the weights replicated,
    each weight's gradient an allreduce; the losses and the final weights."""
    devices = ("CPU:0", "CPU:1")
    rng = np.random.default_rng(13)
    w1_np = (rng.random((64, hidden), dtype=np.float32) - 0.5) * 0.2
    w2_np = (rng.random((hidden, 8), dtype=np.float32) - 0.5) * 0.2
    xs = [rng.random((128, 64), dtype=np.float32) for _ in range(steps)]

    async def main():
        w1, w2 = Tensor(w1_np).shard(devices), Tensor(w2_np).shard(devices)
        await w1.realize(w2)
        losses = []
        for k, x_np in enumerate(xs):
            x = Tensor(x_np).shard(devices, axis=0)
            loss = _step(x, w1, w2)
            await loss.realize(w1, w2)
            losses.append(loss.item())
            if k == 2:
                registry.wait_background()
        return losses, [w1.numpy(), w2.numpy()]
    return _run(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_data_parallel_step_replays_with_its_allreduces_and_equals_the_general_path_bit_for_bit(
        library, heavy_replays, monkeypatch):
    hidden = 98 if library == "trio" else 99
    _sharded_training(library, hidden, 4)  # hot, compiled: both runs below use the same kernels
    heavy_replays.clear()
    losses, weights = _sharded_training(library, hidden, 12)
    if COMPILED:
        assert len(heavy_replays) >= 10, heavy_replays
        assert all(roots == 6 for roots in heavy_replays), heavy_replays  # a shard of each per device
    else:
        assert heavy_replays == []
    assert losses[-1] < losses[0]
    heavy_replays.clear()
    _general_path_only(monkeypatch)
    general_losses, general_weights = _sharded_training(library, hidden, 12)
    assert heavy_replays == []
    assert losses == general_losses
    for a, b in zip(weights, general_weights):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_training_step_reuses_its_temporaries_across_hits_and_equals_the_general_path(
        library, heavy_replays, monkeypatch):
    """A heavy twin's hits fill its temporaries' slots with the last hit's buffers (no allocation, no
    address store for them: engine/eager_replay.py "Temporaries"), and the steps equal the general
    path's, which takes fresh ones per hit, bit for bit."""
    hidden = 98 if library == "trio" else 99
    kept: list[tuple[int, ...]] = []
    run = eager_replay.EagerReplay.run

    def noting(self, key, template, roots, result):
        handle = run(self, key, template, roots, result)
        if handle is not False and self.record is None and self.lean is None:
            kept.append(tuple(id(spec) for spec in self.temps or ()))
        return handle
    monkeypatch.setattr(eager_replay.EagerReplay, "run", noting)
    _training(library, hidden, 4)
    kept.clear()
    losses, weights, state = _training(library, hidden, 12)
    if COMPILED:
        assert len(kept) >= 10, kept
        assert kept[0], "the step's twin has temporaries"  # (its activations and gradients)
        assert all(ids == kept[0] for ids in kept), "each hit kept the first hit's temporaries"
    else:
        assert kept == []
    _general_path_only(monkeypatch)
    general_losses, general_weights, general_state = _training(library, hidden, 12)
    assert losses == general_losses
    for a, b in zip(weights, general_weights):
        assert np.array_equal(a, b)
    assert state == general_state


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_heavy_hit_that_raises_drops_its_temporaries_and_the_next_hit_takes_fresh_ones(
        library, heavy_replays, monkeypatch):
    """A hit whose submission raises marks what it writes failed, its temporaries among them: they are
    not kept, and the next hit runs on fresh ones and computes the right values."""
    hidden = 100 if library == "trio" else 101
    if not COMPILED:
        return
    seen: list[Optional[tuple[int, ...]]] = []
    run = eager_replay.EagerReplay.run
    failing = {"left": 0}

    def noting(self, key, template, roots, result):
        if failing["left"] and self.record is None and self.lean is None:
            failing["left"] -= 1
            submit = self.plan.submit

            def raising(mapping=None):
                raise MemoryError("injected: the hit's allocation failed")
            self.plan.submit = raising
            try:
                handle = run(self, key, template, roots, result)
            finally:
                self.plan.submit = submit
        else:
            handle = run(self, key, template, roots, result)
        if handle is not False and self.record is None and self.lean is None:
            seen.append(tuple(id(spec) for spec in self.temps) if self.temps is not None else None)
        return handle
    monkeypatch.setattr(eager_replay.EagerReplay, "run", noting)
    rng = np.random.default_rng(5)
    w1_np = (rng.random((64, hidden), dtype=np.float32) - 0.5) * 0.2
    w2_np = (rng.random((hidden, 8), dtype=np.float32) - 0.5) * 0.2
    xs = [rng.random((128, 64), dtype=np.float32) for _ in range(10)]

    async def main():
        w1, w2 = Tensor(w1_np).contiguous(), Tensor(w2_np).contiguous()
        await w1.realize(w2)
        losses = []
        for k, x_np in enumerate(xs):
            failing["left"] = 1 if k == 8 else 0
            x = Tensor(x_np)
            loss = _step(x, w1, w2)
            if k == 8:  # the hit raises: what it writes is failed, so the step starts again from w
                with pytest.raises(MemoryError):
                    await loss.realize(w1, w2)
                w1, w2 = Tensor(w1_np).contiguous(), Tensor(w2_np).contiguous()
                await w1.realize(w2)
                continue
            await loss.realize(w1, w2)
            losses.append(loss.item())
            if k == 2:
                registry.wait_background()
        return losses
    losses = _run(library, main)
    out_np = np.maximum(xs[9] @ w1_np, 0) @ w2_np  # the last step's, from the fresh weights
    np.testing.assert_allclose(losses[-1], (out_np * out_np).sum() / 128, rtol=1e-4)
    assert len(seen) >= 3 and seen[-3], seen
    assert seen[-2] is None, "the failed hit's temporaries are not kept"
    assert seen[-1] is not None and seen[-1] != seen[-3], "the next hit took fresh ones"
