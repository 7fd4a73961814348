"""atensor.jit with bound Variable arguments: one captured program for every value, replayed with the
new value bound (a KV cache written at `start_pos`), checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, jit
from atensor.graph.symbolic import Variable


def _window_sum_step():
    cache = Tensor(np.zeros((16, 4), np.float32))
    w = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4))

    @jit
    def step(x, mask, pos):
        cache.shrink(((pos, pos + 1), None)).assign(x @ w)  # a write at a variable row
        return (cache * mask.reshape(16, 1)).sum(0)
    return cache, step


def test_a_jitted_step_with_a_bound_variable_is_captured_once_and_replayed_at_each_new_value():
    s = Variable("start_pos", 0, 15)
    cache, step = _window_sum_step()
    ref = np.zeros((16, 4), np.float32)
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    for p in [0, 1, 2, 3, 4, 9, 5, 15]:
        x = np.full((1, 4), p + 1, np.float32)
        mask = (np.arange(16) <= p).astype(np.float32)
        out = step(Tensor(x), Tensor(mask), s.bind(p)).numpy()
        ref[p] = x @ w
        np.testing.assert_allclose(out, (ref * mask[:, None]).sum(0))
    np.testing.assert_allclose(cache.numpy(), ref)
    assert step.stats == {"calls": 8, "replays": 5, "captures": 1}


def test_variables_nested_in_a_tuple_each_take_their_own_value():
    a, b = Variable("a", 0, 7), Variable("b", 0, 7)
    src = np.arange(32, dtype=np.float32).reshape(8, 4)
    table = Tensor(src)

    @jit
    def pick(scale, rows):
        first, second = rows
        return table.shrink(((first, first + 1), None)) * scale + table.shrink(((second, second + 1), None))
    for i, j in [(0, 1), (2, 3), (4, 5), (7, 0), (3, 3), (6, 2)]:
        out = pick(Tensor(np.full((1, 4), 2.0, np.float32)), (a.bind(i), b.bind(j))).numpy()
        np.testing.assert_allclose(out, src[i:i + 1] * 2 + src[j:j + 1])
    assert pick.stats["captures"] == 1 and pick.stats["replays"] == 3


def test_another_variable_or_plain_int_is_another_key():
    s, t = Variable("s", 0, 15), Variable("t", 0, 15)
    _, step = _window_sum_step()
    mask = Tensor(np.ones(16, np.float32))
    x = Tensor(np.ones((1, 4), np.float32))
    for _ in range(3):
        step(x, mask, s.bind(1))
    step(x, mask, t.bind(2))
    assert step.stats["captures"] == 1  # t's first call runs normally: a key of its own
    with pytest.raises(Exception):
        step(x, mask, Variable("s", 0, 15).bind(16))  # outside the bounds


@pytest.mark.parametrize("read_by_result", [False, True])
async def test_a_write_no_result_reads_is_performed_by_every_replay(read_by_result):
    """A jitted step's assign into state at a bound Variable slot lands on every replay, whether or not
    the step's result reads it (replays used to drop a write no result read: a batched prefill's KV
    cache rows stayed zero for every slot bound after the capture)."""
    slot = Variable("slot", 0, 3)
    cache = Tensor(np.zeros((4, 8), np.float32))
    await cache.realize()

    @jit
    async def step(x, s):
        cache.shrink(((s, s + 1), None)).assign(x * 2)
        return cache.sum(1) if read_by_result else x + 1
    ref = np.zeros((4, 8), np.float32)
    for i, s in enumerate([0, 0, 0, 1, 2, 3, 1, 0]):
        x = np.full((1, 8), i + 1, np.float32)
        out = await step(Tensor(x), slot.bind(s))
        ref[s] = x * 2
        np.testing.assert_allclose(out.numpy(), ref.sum(1) if read_by_result else x + 1)
        await cache.realize()
        np.testing.assert_allclose(cache.numpy(), ref, err_msg=f"call {i}, slot {s}")
    assert step.stats["replays"] == 5 and step.stats["captures"] == 1


async def test_a_step_that_returns_nothing_performs_its_assigns_on_every_replay():
    """A step whose only effect is an assign (it returns None) updates the state on every call."""
    cache = Tensor(np.zeros((2, 3), np.float32))
    await cache.realize()

    @jit
    async def bump(x):
        cache.assign(cache + x)
        return None
    for k in range(5):
        await bump(Tensor(np.full((2, 3), float(k), np.float32)))
    await cache.realize()
    np.testing.assert_allclose(cache.numpy(), np.full((2, 3), 0 + 1 + 2 + 3 + 4, np.float32))
    assert bump.stats["replays"] == 2
