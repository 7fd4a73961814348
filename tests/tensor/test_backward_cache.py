"""The backward's structure kept per forward template (graph/gradient_cache.py): a repeated training step
gets its gradients by remaking the recorded nodes on its own forward, and they are the very nodes a fresh
`compute_gradient` builds (nodes are interned), with PyTorch's values, when the parameters' values change
between steps, when the batch's shape changes (another template), on two devices, and for a seed that
is not cached."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.graph import gradient_cache

from tests.torch_reference import needs_torch, torch

RNG = np.random.default_rng(7)
SHAPES = [(5, 8), (8,), (8, 3), (3,)]


def _loss(x: Tensor, y: Tensor, params: list[Tensor]) -> Tensor:
    w1, b1, w2, b2 = params
    h = (x @ w1 + b1).relu()
    logits = h @ w2 + b2
    return -(logits.log_softmax(-1) * y).sum() / x.shape[0]


def _torch_grads(x: np.ndarray, y: np.ndarray, values: list[np.ndarray]) -> list[np.ndarray]:
    params = [torch.tensor(v, requires_grad=True) for v in values]
    w1, b1, w2, b2 = params
    logits = torch.relu(torch.tensor(x) @ w1 + b1) @ w2 + b2
    (-(torch.log_softmax(logits, -1) * torch.tensor(y)).sum() / x.shape[0]).backward()
    return [p.grad.numpy() for p in params]


def _fresh(loss: Tensor, params: list[Tensor], monkeypatch) -> list[Tensor]:
    with monkeypatch.context() as m:
        m.setattr(gradient_cache.CACHE, "enabled", False)
        return loss.gradient(*params)


def _batch(rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = RNG.standard_normal((rows, 5)).astype(np.float32)
    return x, np.eye(3, dtype=np.float32)[RNG.integers(0, 3, size=rows)]


@needs_torch
def test_a_repeated_step_remakes_the_fresh_gradients_as_its_values_change(monkeypatch):
    gradient_cache.CACHE.clear()
    values = [RNG.standard_normal(s).astype(np.float32) * 0.5 for s in SHAPES]
    params = [Tensor(v.copy(), requires_grad=True) for v in values]
    x_np, y_np = _batch(6)
    x, y = Tensor(x_np), Tensor(y_np)
    for step in range(4):
        loss = _loss(x, y, params)
        cached = loss.gradient(*params)
        fresh = _fresh(loss, params, monkeypatch)
        assert all(c.node is f.node for c, f in zip(cached, fresh)), f"step {step}: another graph"
        cached[0].realize(*cached[1:])
        got = cached
        for g, want in zip(got, _torch_grads(x_np, y_np, values)):
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-4, atol=1e-5)
        values = [v - 0.1 * g.numpy() for v, g in zip(values, got)]
        for p, g in zip(params, got):  # the parameters' next versions: a new forward, the same structure
            p.assign(p - 0.1 * g).realize()
        for p in params:
            p.numpy()  # realized before the next forward reads them (else a pending assign is in its graph)
    # the first step reads inputs not realized yet (another graph); from the third on every step is a hit
    assert gradient_cache.CACHE.hits >= 2 and gradient_cache.CACHE.misses <= 2


@needs_torch
def test_another_batch_shape_is_another_template_with_its_own_gradients(monkeypatch):
    gradient_cache.CACHE.clear()
    values = [RNG.standard_normal(s).astype(np.float32) * 0.5 for s in SHAPES]
    params = [Tensor(v, requires_grad=True) for v in values]
    for rows in (4, 9, 4, 9):
        x_np, y_np = _batch(rows)  # new tensors each time: the same template for the same shape
        loss = _loss(Tensor(x_np), Tensor(y_np), params)
        cached = loss.gradient(*params)
        assert all(c.node is f.node for c, f in zip(cached, _fresh(loss, params, monkeypatch)))
        cached[0].realize(*cached[1:])
        for g, want in zip(cached, _torch_grads(x_np, y_np, values)):
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-4, atol=1e-5)
    assert gradient_cache.CACHE.misses == 2 and gradient_cache.CACHE.hits == 2


def test_backward_on_two_devices_remakes_the_fresh_gradients(monkeypatch):
    """Data parallel: replicated parameters (their gradient an allreduce of the replicas'), the batch
    split over two devices; the record holds the MULTI and ALLREDUCE nodes the backward made."""
    gradient_cache.CACHE.clear()
    devices = ("CPU:0", "CPU:1")
    values = [RNG.standard_normal(s).astype(np.float32) * 0.5 for s in SHAPES]
    params = [Tensor(v, requires_grad=True).shard_(devices) for v in values]
    x_np, y_np = _batch(8)
    results = []
    for _ in range(3):  # the first realize also makes the parameters' replicas: from the second on, hits
        loss = _loss(Tensor(x_np).shard(devices, axis=0), Tensor(y_np).shard(devices, axis=0), params)
        cached = loss.gradient(*params)
        assert all(c.node is f.node for c, f in zip(cached, _fresh(loss, params, monkeypatch)))
        cached[0].realize(*cached[1:])
        results.append([g.numpy() for g in cached])
    assert gradient_cache.CACHE.hits == 1
    single = [Tensor(v, requires_grad=True) for v in values]
    want = _loss(Tensor(x_np), Tensor(y_np), single).gradient(*single)
    for got in results:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)


def test_a_seed_that_is_not_a_constant_is_differentiated_afresh():
    gradient_cache.CACHE.clear()
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    for k in range(2):
        seed = Tensor(np.full((2, 3), k + 1.5, dtype=np.float32))
        (grad,) = (x * x).gradient(x, gradient=seed)
        np.testing.assert_allclose(grad.numpy(), 2 * x.numpy() * (k + 1.5))
    assert gradient_cache.CACHE.hits == 0 and gradient_cache.CACHE.misses == 0


def test_backward_accumulates_the_same_grads_with_the_cache_as_without(monkeypatch):
    """`backward()` twice on the same structure: the second is a hit, and `.grad` adds up as before."""
    gradient_cache.CACHE.clear()
    values = [RNG.standard_normal(s).astype(np.float32) * 0.5 for s in SHAPES]
    x_np, y_np = _batch(5)

    def grads(enabled: bool) -> list[np.ndarray]:
        with monkeypatch.context() as m:
            m.setattr(gradient_cache.CACHE, "enabled", enabled)
            params = [Tensor(v, requires_grad=True) for v in values]
            for _ in range(2):
                _loss(Tensor(x_np), Tensor(y_np), params).backward()
            return [p.grad.numpy() for p in params]
    for c, f in zip(grads(True), grads(False)):
        np.testing.assert_array_equal(c, f)
    assert gradient_cache.CACHE.hits >= 1


@pytest.fixture(autouse=True)
def _no_stale_records():
    yield
    gradient_cache.CACHE.clear()
