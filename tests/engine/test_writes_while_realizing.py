"""Writes into a tensor whose realize is in flight (issue 33.1), and awaiting a tensor with writes
issued after its realize (issue 40.2): the storage of a realized tensor is fixed when `realize()` is
called, and `await t` / `t.wait()` realize everything pending on `t`. Each under every mode of
settings_modes.py, against numpy."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import trio

from atensor import Tensor, nn
from atensor.engine.dispatch import dispatcher

from tests.engine.settings_modes import MODES, settings_mode

pytestmark = pytest.mark.default_settings


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    with settings_mode(request.param, monkeypatch):
        yield request.param


def test_a_write_into_a_view_of_a_just_realized_tensor_lands_in_its_buffer(mode):
    c = Tensor.zeros(4).contiguous().realize()
    c[0:1].assign(Tensor.ones(1)).realize()
    assert c.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_kv_cache_written_from_lazy_layers_while_its_realize_is_queued(mode):
    x = Tensor(np.ones((1, 8), np.float32))
    layers = [nn.Linear(8, 8, bias=False) for _ in range(6)]
    vals = [layer(x) for layer in layers]
    cache = Tensor.zeros(2, 4, 8).contiguous().realize()
    cache.shrink((None, (0, 1), None)).assign(Tensor.stack(vals[-2], vals[-1])).realize()
    expected = np.zeros((2, 4, 8), np.float32)
    for i, layer in enumerate(layers[-2:]):
        expected[i, 0] = np.ones((1, 8), np.float32) @ layer.weight.numpy().T
    np.testing.assert_allclose(cache.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_the_realize_is_still_queued_when_the_write_is_issued():
    """The case the defect needed: the first realize not yet planned when the assign is built (the
    dispatcher is held busy by a job that waits on an event)."""
    import threading
    from atensor.engine.dispatch import Job
    release = threading.Event()
    blocker = Job(lambda: release.wait(30), [])
    dispatcher.submit(blocker)
    c = Tensor.arange(6).float().contiguous().realize()
    c[2:4] = Tensor([10.0, 20.0])
    c.shrink(((5, 6),)).assign(c.shrink(((0, 1),)) - 1)
    release.set()
    assert c.tolist() == [0.0, 1.0, 10.0, 20.0, 4.0, -1.0]


def test_several_writes_and_reads_before_the_first_realize_completes(mode):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = (Tensor(a) * 2).realize()
    before = t.sum()                      # built from t's storage before the writes
    t[1] = 0.0
    t[:, 3] = t[:, 0] + 1
    row = t[2].realize(before)            # a view of storage stays live (rule 3); `before` is
                                          # realized with it, before the writes it reads overwrite
    t[2] = -1.0
    ref = a * 2
    ref_before = ref.sum()
    ref[1] = 0.0
    ref[:, 3] = ref[:, 0] + 1
    ref[2] = -1.0
    t.wait()
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(row.numpy(), ref[2])
    assert before.item() == ref_before


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_await_realizes_a_write_issued_after_an_unawaited_realize(mode, loop):
    async def main():
        t = (Tensor([1.0, 2.0, 3.0]) * 2).realize()   # issued, not awaited
        t[0:2] = 5.0
        await t
        first = t.tolist()
        u = Tensor([1.0, 2.0]).realize()
        u.assign(u * 3)
        u.realize()
        u[1] = 7.0                                     # after the second realize
        await u
        return first, u.tolist()
    result = trio.run(main) if loop == "trio" else asyncio.run(main())
    assert result == ([5.0, 5.0, 6.0], [3.0, 7.0])


def test_wait_realizes_a_write_issued_after_an_unawaited_realize(mode):
    t = (Tensor([1.0, 2.0, 3.0]) * 2).realize()
    t[0:2] = 5.0
    t.wait()
    assert t._is_ready_single()                        # nothing left pending on it: wait did it all
    assert t.tolist() == [5.0, 5.0, 6.0]


def test_a_failed_realize_raises_again_when_realized_again(mode):
    """The storage fixed by a realize that fails stays this tensor's: a second realize raises again
    instead of reading an empty buffer, and no other realize takes the failed assign along."""
    from atensor.sched.schedule import StaleReadError
    t = Tensor([1.0, 2.0])
    late = t * 3
    t.assign(t + 1).realize().wait()
    late.realize()
    for _ in range(2):
        with pytest.raises(StaleReadError):
            late.wait()
    assert (Tensor([1.0]) + 1).tolist() == [2.0]       # an unrelated realize is not affected


def test_writes_into_a_realize_in_flight_inside_a_jitted_function_replay(mode):
    import atensor

    def body(x: Tensor) -> Tensor:
        c = (x * 0).contiguous().realize()        # a result buffer, fresh on every replay
        c[0:1].assign(x[1:2] + 1)
        c.shrink(((2, 3),)).assign(x[0:1] * 5).realize()
        return c

    step = atensor.TinyJit(body)
    for i in range(5):
        x = np.array([i, i + 1, 7, 8], np.float32)
        assert step(Tensor(x)).tolist() == [x[1] + 1, 0.0, x[0] * 5, 0.0]
    assert step.stats["replays"] == 2
