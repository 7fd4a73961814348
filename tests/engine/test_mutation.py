"""Mutation semantics, one test per rule of docs/semantics.md: contiguous vs clone, assign, writes through
views, reads of old versions, invalid indices, zero-size tensors and counter-based random numbers.

Every expectation is what eager numpy (or PyTorch) gives for the same program, or the error that
atensor documents where a lazy program cannot match eager execution.
"""
from __future__ import annotations

import numpy as np
import pytest
import trio

from atensor import Tensor
from atensor.graph.node import GraphError
from atensor.graph.ops import Ops
from atensor.sched.schedule import AssignCycleError, StaleReadError


def _has_storage(t: Tensor) -> bool:
    return t.node.base().op is Ops.BUFFER


# ---- contiguous vs clone -----------------------------------------------------------------------------
async def test_contiguous_does_not_persist_an_intermediate():
    t = Tensor([1.0, 2.0, 3.0])
    x = (t + 1).contiguous()
    y = x * 2
    await y.realize()
    assert not _has_storage(x)
    assert y.tolist() == [4.0, 6.0, 8.0]
    await x.realize()
    assert x.tolist() == [2.0, 3.0, 4.0]


async def test_clone_persists_its_own_buffer():
    t = Tensor([1.0, 2.0, 3.0])
    x = (t + 1).clone()
    y = x * 2
    await y.realize()
    assert _has_storage(x)
    assert x.tolist() == [2.0, 3.0, 4.0]
    t[0] = 100.0
    await t.realize()
    assert x.tolist() == [2.0, 3.0, 4.0]


# ---- assign ------------------------------------------------------------------------------------------
async def test_assign_into_a_buffer_updates_it_in_place():
    t = Tensor([1, 2, 3])
    spec = t.node.base().arg[0]
    alias = t[1:]
    t.assign(t * 10)
    await t.realize()
    assert t.node.base().arg[0] is spec
    assert t.tolist() == [10, 20, 30]
    assert alias.tolist() == [20, 30]


async def test_assigning_to_a_pure_value_gives_it_new_storage():
    t = Tensor([1, 2, 3])
    x = t + 1
    x.assign(Tensor([7, 8, 9]))
    await Tensor.realize(x, t)
    assert _has_storage(x) and x.node.base().arg[0] is not t.node.base().arg[0]
    assert x.tolist() == [7, 8, 9]
    assert t.tolist() == [1, 2, 3]


async def test_a_copy_assigned_into_another_tensor_never_shares_storage():
    a = Tensor([1.0, 2.0])
    b = Tensor([0.0, 0.0])
    derived = a * 2  # derived from the source before any write
    b.assign(a)
    await b.realize()
    a[0] = 9.0
    await a.realize()
    assert b.tolist() == [1.0, 2.0]
    b[1] = -1.0
    await b.realize()
    assert a.tolist() == [9.0, 2.0]
    # `derived` read version 0 of a, which the write above overwrote: an error, never the new value
    with pytest.raises(StaleReadError):
        await derived.realize()


async def test_writing_into_a_realized_value_does_not_change_values_derived_from_the_same_expression():
    a = Tensor([1.0, 2.0])
    y = a * 2
    w = y + 1  # built from the expression a * 2, not from y's future storage
    await y.realize()
    y[0] = 100.0
    await y.realize()
    await w.realize()
    assert w.tolist() == [3.0, 5.0]
    assert (await (a * 2).realize()).tolist() == [2.0, 4.0]
    b = Tensor([0.0, 0.0])
    b.assign(a * 3)
    await b.realize()
    b[0] = 7.0
    await b.realize()
    assert (await (a * 3).realize()).tolist() == [3.0, 6.0]


# ---- writes through views ----------------------------------------------------------------------------
@pytest.mark.parametrize("write, expected", [
    (lambda t: t.__setitem__(slice(1, 3), Tensor([10.0, 20.0])), [0, 10, 20, 3, 4, 5]),
    (lambda t: t.shrink(((2, 4),)).assign(Tensor([7.0, 8.0])), [0, 1, 7, 8, 4, 5]),
    (lambda t: t.detach().__setitem__(slice(None), 5.0), [5, 5, 5, 5, 5, 5]),
    (lambda t: t.detach().assign(t.detach() + 1), [1, 2, 3, 4, 5, 6]),
    (lambda t: t.reshape(2, 3)[1].assign(Tensor([-1.0, -2.0, -3.0])), [0, 1, 2, -1, -2, -3]),
    (lambda t: t.__setitem__(slice(None, None, -2), 9.0), [0, 9, 2, 9, 4, 9]),
    (lambda t: t.__setitem__(slice(1, None), t[:-1]), [0, 0, 1, 2, 3, 4]),
])
async def test_writes_through_views_change_the_base_tensor(write, expected):
    t = Tensor(np.arange(6, dtype=np.float32))
    write(t)
    await t.realize()
    assert t.tolist() == expected


async def test_setitem_on_a_computed_value_gives_it_storage_and_leaves_its_inputs_alone():
    t = Tensor([1.0, 2.0, 3.0])
    x = t * 2
    x[0] = 0.0
    await Tensor.realize(x, t)
    assert x.tolist() == [0.0, 4.0, 6.0]
    assert t.tolist() == [1.0, 2.0, 3.0]
    z = Tensor.zeros(4)
    z[1:3] = 1.0
    assert (await z.realize()).tolist() == [0.0, 1.0, 1.0, 0.0]


# ---- reads of old versions ---------------------------------------------------------------------------
async def test_a_lazy_read_realized_with_the_write_sees_the_old_value():
    t = Tensor([1.0, 2.0, 3.0])
    before = t + 1
    t[0] = 100.0
    await Tensor.realize(t, before)  # one graph: the read is ordered before the write
    assert before.tolist() == [2.0, 3.0, 4.0]
    assert t.tolist() == [100.0, 2.0, 3.0]


async def test_a_lazy_read_realized_before_the_write_sees_the_old_value():
    t = Tensor([1.0, 2.0, 3.0])
    before = t + 1
    t[0] = 100.0
    handle = before.realize()
    await t.realize()
    await handle
    assert before.tolist() == [2.0, 3.0, 4.0]


async def test_setitem_under_a_pending_lazy_reader_raises_instead_of_differing_from_eager():
    t = Tensor([1.0, 2.0, 3.0])
    before = t + 1
    t[0] = 100.0
    await t.realize()  # version 0, which `before` reads, is gone
    with pytest.raises(StaleReadError, match="overwritten"):
        await before.realize()
    # the error is a RuntimeError, as tinygrad's, and the device stays usable
    assert issubclass(StaleReadError, RuntimeError)
    assert (await (t + 1).realize()).tolist() == [101.0, 3.0, 4.0]


async def test_one_kernel_needing_a_buffer_before_and_after_an_assign_is_a_cycle_error():
    a = await Tensor.ones(4).contiguous().realize()
    times_a = a * 3
    a.assign(Tensor.full((4,), 2.0).contiguous())
    new = a + (times_a - 1)
    with pytest.raises(AssignCycleError, match="cycle"):
        await new.realize()


async def test_contiguous_on_the_old_read_makes_the_diamond_possible():
    a = await Tensor.ones(4).contiguous().realize()
    times_a = a * 3
    a.assign(Tensor.full((4,), 2.0))
    new = a + (times_a - 1).contiguous()
    assert (await new.realize()).tolist() == [4.0, 4.0, 4.0, 4.0]


async def test_pending_assigns_are_realized_along_before_what_they_read_is_overwritten():
    x = Tensor([0.0, 0.0])
    y = Tensor([1.0, 2.0])
    x.assign(y * 2)  # pending: part of the program state, as in eager code
    c = y.clone()    # a pending clone is a pending assign too
    y.assign(Tensor([5.0, 5.0]))
    await y.realize()
    assert y.tolist() == [5.0, 5.0]
    assert (await x.realize()).tolist() == [2.0, 4.0]
    assert (await c.realize()).tolist() == [1.0, 2.0]


async def test_chained_pending_assigns_flush_transitively():
    a, b, c = Tensor([1.0]), Tensor([2.0]), Tensor([3.0])
    c.assign(b + 1)   # reads b v0
    b.assign(a + 1)   # reads a v0, overwrites b v0
    a.assign(Tensor([10.0]))
    await a.realize()  # must take b's assign along, which must take c's along
    await Tensor.realize(a, b, c)
    assert (a.item(), b.item(), c.item()) == (10.0, 2.0, 3.0)


# ---- invalid indices ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [
    lambda t: t,
    lambda t: t.pad(((1, 1), (0, 0))),          # padded: no storage under the padding
    lambda t: t.T.reshape(12),                  # a reshape of a permuted view: no single view
    lambda t: t + 1,                            # a pure value
])
@pytest.mark.parametrize("index", [99, -99, (0, 7), (1, 2, 3), (slice(None), -9)])
def test_invalid_indices_raise_index_error_before_any_mutation_restriction(target, index):
    t = Tensor(np.zeros((3, 4), dtype=np.float32))
    view = target(t)
    with pytest.raises(IndexError):
        view[index] = 1.0


def test_writing_through_padding_is_a_clear_error():
    t = Tensor(np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(GraphError, match="padd"):
        t.pad(((1, 1), (0, 0)))[0] = 1.0


# ---- zero-size ---------------------------------------------------------------------------------------
async def test_zero_size_writes_and_realizes_are_no_ops():
    t = Tensor([1.0, 2.0, 3.0])
    t[1:1] = 5.0
    empty = Tensor.zeros(0, 3) * 2
    await Tensor.realize(t, empty)
    assert t.tolist() == [1.0, 2.0, 3.0]
    assert empty.numpy().shape == (0, 3)
    assert (await Tensor.zeros(0, 4).sum(0).realize()).tolist() == [0.0] * 4
    assert (await Tensor.zeros(2, 0).max(1).realize()).tolist() == [-np.inf, -np.inf]


# ---- random numbers ----------------------------------------------------------------------------------
async def _draws(order: str) -> list[np.ndarray]:
    Tensor.manual_seed(1234)
    a, b, c = Tensor.rand(5), Tensor.randn(2, 3), Tensor.randint(4, low=0, high=100)
    if order == "together":
        await Tensor.realize(a, b, c)
    elif order == "reversed":
        await c.realize()
        await b.realize()
        await a.realize()
    else:  # concurrently from one nursery, in whatever order trio runs them
        async with trio.open_nursery() as nursery:
            for t in (b, c, a):
                nursery.start_soon(_await, t)
    return [a.numpy(), b.numpy(), c.numpy()]


async def _await(t: Tensor) -> None:
    await t.realize()


async def test_same_seed_gives_same_values_whatever_the_realize_order_or_grouping():
    together = await _draws("together")
    for order in ("reversed", "concurrent"):
        for x, y in zip(together, await _draws(order)):
            np.testing.assert_array_equal(x, y)


async def test_same_seed_gives_same_values_on_another_device():
    Tensor.manual_seed(7)
    here = await Tensor.rand(3, 4).realize()
    Tensor.manual_seed(7)
    there = await Tensor.rand(3, 4, device="CPU:1").realize()
    np.testing.assert_array_equal(here.numpy(), there.numpy())
    Tensor.manual_seed(8)
    assert not np.array_equal(here.numpy(), (await Tensor.rand(3, 4).realize()).numpy())


async def test_a_doomed_pending_assign_is_not_flushed_into_an_unrelated_realize():
    a = Tensor([1.0, 2.0])
    stale = a * 2
    a[0] = 5.0
    await a.realize()             # `stale` now reads an overwritten version
    x = Tensor([0.0, 0.0])
    x.assign(stale + a)           # pending, and reads a's current version too: doomed
    a[1] = 7.0
    await a.realize()             # overwrites what x's assign reads; still succeeds
    assert a.tolist() == [5.0, 7.0]
    with pytest.raises(StaleReadError):
        await x.realize()


async def test_rand_on_a_sharded_shape_gives_the_unsharded_values():
    Tensor.manual_seed(3)
    whole = await Tensor.rand(4, 6).realize()
    Tensor.manual_seed(3)
    sharded = await Tensor.rand(4, 6, device=("CPU:0", "CPU:1")).realize()
    Tensor.manual_seed(3)
    split = await Tensor.rand(4, 6).shard(("CPU:0", "CPU:1"), axis=0).realize()
    np.testing.assert_array_equal(whole.numpy(), sharded.numpy())
    np.testing.assert_array_equal(whole.numpy(), split.numpy())
