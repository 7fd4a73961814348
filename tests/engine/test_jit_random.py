"""Random numbers inside atensor.jit: a replay draws fresh numbers from the generator's counter, the
numbers an eager run of the same calls (the un-jitted function, with the same seed) draws, without a
capture per call. The reference is the eager run; numpy checks the distributions' basic shape."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import atensor
from atensor import Tensor, nn


def _draws(x: Tensor) -> tuple[Tensor, ...]:
    return (x + Tensor.rand(*x.shape), Tensor.randint(3, 5, low=-4, high=100), Tensor.randn(2, 7) * 2,
            Tensor.uniform(6, low=-1.0, high=1.0, dtype="float64"))


def _run(fn, calls: int, between=None) -> list[list[np.ndarray]]:
    Tensor.manual_seed(1234)
    x = Tensor(np.arange(4, dtype=np.float32))
    out = []
    for i in range(calls):
        out.append([t.numpy() for t in fn(x)])
        if between is not None:
            between(i)
    return out


def _same(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> None:
    assert len(a) == len(b)
    for call_a, call_b in zip(a, b):
        for u, v in zip(call_a, call_b):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)


def test_replays_draw_what_an_eager_run_of_the_same_calls_draws():
    f = atensor.jit(_draws)
    jitted = _run(f, 9)
    assert f.stats == {"calls": 9, "replays": 6, "captures": 1}
    _same(jitted, _run(_draws, 9))
    replayed = [call[0] for call in jitted[3:]]
    assert all(not np.array_equal(a, b) for a, b in zip(replayed, replayed[1:]))  # fresh on every call
    uniform = np.concatenate([call[0] - np.arange(4) for call in jitted])
    assert uniform.min() >= 0 and uniform.max() < 1
    ints = np.concatenate([call[1].ravel() for call in jitted])
    assert ints.min() >= -4 and ints.max() < 100 and ints.dtype == np.int32


def test_draws_outside_the_function_and_reseeding_between_calls_keep_the_eager_sequence():
    def between(i: int) -> None:
        Tensor.rand(5).numpy()  # an eager draw between two calls takes its counters in between
        if i == 5:
            Tensor.manual_seed(99)  # back to counter 0 of another seed, mid-sequence

    f = atensor.jit(_draws)
    jitted = _run(f, 9, between)
    assert f.stats["captures"] == 1 and f.stats["replays"] == 6
    _same(jitted, _run(_draws, 9, between))


def test_a_draw_that_is_never_realized_still_takes_its_counters():
    def body(x: Tensor) -> Tensor:
        Tensor.rand(1000)  # dropped unrealized: eager code still advances the counter by 1000
        return x * Tensor.rand(*x.shape)

    f = atensor.jit(body)
    jitted = _run(lambda x: (f(x),), 7)
    assert f.stats["replays"] == 4
    _same(jitted, _run(lambda x: (body(x),), 7))


def test_dropout_in_a_jitted_training_step_matches_the_eager_step():
    def make() -> tuple[nn.Linear, object]:
        Tensor.manual_seed(5)
        layer = nn.Linear(16, 8)
        opt = nn.optim.SGD(nn.state.get_parameters(layer), lr=0.1)
        return layer, opt

    def losses(jitted: bool) -> tuple[list[float], list[np.ndarray]]:
        layer, opt = make()

        def step(x: Tensor) -> Tensor:
            opt.zero_grad()
            loss = layer(x).dropout(0.5).square().mean()
            loss.backward()
            opt.step()
            return loss

        run = atensor.jit(step) if jitted else step
        x = Tensor(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
        Tensor.training = True
        try:
            got = [run(x).item() for _ in range(8)]
        finally:
            Tensor.training = False
        if jitted:
            assert run.stats["captures"] == 1 and run.stats["replays"] == 5
        return got, [p.numpy() for p in nn.state.get_parameters(layer)]

    (jit_losses, jit_params), (eager_losses, eager_params) = losses(True), losses(False)
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-5)
    for a, b in zip(jit_params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert len(set(round(v, 6) for v in jit_losses[3:])) == 5  # another mask on every replay


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_an_async_jitted_function_draws_afresh_on_every_replay(library):
    async def body(x: Tensor) -> Tensor:
        return x + Tensor.randn(*x.shape)

    async def run(fn) -> list[np.ndarray]:
        Tensor.manual_seed(3)
        x = Tensor(np.zeros((3, 3), dtype=np.float32))
        out = []
        for _ in range(7):
            t = await fn(x)
            await t.realize()  # the eager function's result is lazy; the jit's is realized
            out.append(t.numpy())
        return out

    f = atensor.jit(body)
    if library == "trio":
        import trio
        jitted, eager = trio.run(run, f), trio.run(run, body)
    else:
        jitted, eager = asyncio.run(run(f)), asyncio.run(run(body))
    assert f.stats["replays"] == 4 and f.stats["captures"] == 1
    _same([jitted], [eager])
    assert not np.array_equal(jitted[-1], jitted[-2])


def test_a_draw_replicated_on_two_devices_replays_the_same_values_on_both():
    devices = ("CPU:0", "CPU:1")

    def body(x: Tensor) -> Tensor:
        return x + Tensor.rand(4, device=devices)

    f = atensor.jit(body)
    Tensor.manual_seed(8)
    x = Tensor(np.zeros(4, dtype=np.float32)).to(devices)
    x.numpy()  # realized: the same input structure on every call
    jitted = [f(x).numpy() for _ in range(6)]
    Tensor.manual_seed(8)
    eager = [body(x).numpy() for _ in range(6)]
    assert f.stats["replays"] == 3
    _same([jitted], [eager])
    Tensor.manual_seed(8)
    one = [Tensor.rand(4).numpy() for _ in range(6)]  # the same values as a draw on one device
    _same([jitted], [one])


def test_a_graph_that_changes_between_calls_is_still_refused_with_a_clear_error():
    scale = [1.0]

    def body(x: Tensor) -> Tensor:
        scale[0] += 1  # a Python number baked into the graph: another graph on every call
        return x * scale[0]

    f = atensor.jit(body)
    x = Tensor(np.ones(3, dtype=np.float32))
    f(x)
    f(x)
    with pytest.raises(atensor.JitError, match="different programs.*realize 1 of 1, task 1 .*computes something else.*Python number"):
        f(x)
