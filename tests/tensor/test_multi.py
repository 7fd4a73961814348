"""Sharded tensors: every op on a tensor split over 2, 3 and 4 devices gives the unsharded result.

The reference is the same expression on one device (itself checked against numpy in test_ops.py),
and numpy where it is simpler. Shapes are odd (5 x 7) so splits are uneven, and some shards end up
empty after indexing.
"""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.graph.node import GraphError
from atensor.graph.ops import Ops

RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 7)).astype(np.float32)
Y = RNG.standard_normal((5, 7)).astype(np.float32)
W = RNG.standard_normal((7, 3)).astype(np.float32)


def devices(n: int) -> tuple[str, ...]:
    return tuple(f"CPU:{i}" for i in range(n))


def check(got: Tensor, ref: Tensor | np.ndarray, atol: float = 1e-5) -> None:
    want = ref.numpy() if isinstance(ref, Tensor) else np.asarray(ref)
    out = got.numpy()
    assert out.shape == want.shape, (out.shape, want.shape)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=atol, equal_nan=True)


OPS = [
    ("elementwise", lambda x, y, w: (x * 2 + y).relu() - x.exp() / (y.abs() + 1)),
    ("where", lambda x, y, w: (x > y).where(x, y * 3)),
    ("cast_compare", lambda x, y, w: ((x < 0).int() + (y >= 0.5).float()).float()),
    ("sum_all", lambda x, y, w: x.sum()),
    ("sum_axis0", lambda x, y, w: x.sum(axis=0)),
    ("sum_axis1_keepdim", lambda x, y, w: x.sum(axis=1, keepdim=True)),
    ("max", lambda x, y, w: x.max(axis=0) + x.max()),
    ("min", lambda x, y, w: x.min(axis=1)),
    ("mean", lambda x, y, w: x.mean(axis=0) * x.mean()),
    ("prod", lambda x, y, w: (x * 0.5 + 1).prod(axis=0)),
    ("argmax", lambda x, y, w: x.argmax(axis=0) * 10 + x.argmax(axis=1).sum()),
    ("softmax", lambda x, y, w: (x - x.max(1, True)).exp() / (x - x.max(1, True)).exp().sum(1, True)),
    ("matmul", lambda x, y, w: x @ w),
    ("matmul_transposed", lambda x, y, w: w.T @ x.T),
    ("gram", lambda x, y, w: x.T @ y),
    ("reshape", lambda x, y, w: x.reshape(35) * 2),
    ("reshape_split", lambda x, y, w: y.reshape(5, 7, 1).reshape(35, 1)),
    ("permute", lambda x, y, w: x.T + 1),
    ("expand", lambda x, y, w: x.reshape(5, 1, 7).expand(5, 3, 7) * y.reshape(5, 1, 7)),
    ("broadcast_row", lambda x, y, w: x + y[2]),
    ("pad", lambda x, y, w: x.pad(((1, 2), (3, 0)))),
    ("pad_value", lambda x, y, w: x.pad(((0, 2), (1, 1)), value=2.0)),
    ("shrink", lambda x, y, w: x.shrink(((1, 4), (2, 6)))),
    ("flip", lambda x, y, w: x.flip(0) * y.flip(1)),
    ("getitem_slices", lambda x, y, w: x[1:4, ::2]),
    ("getitem_int", lambda x, y, w: x[3] + y[:, 2].sum()),
    ("getitem_negative_step", lambda x, y, w: x[::-2, 2:]),
    ("getitem_none_ellipsis", lambda x, y, w: x[None, ..., 1]),
    ("getitem_scalar", lambda x, y, w: x[4, 6] + y[0, 0]),
    ("flatten_unsqueeze", lambda x, y, w: x.unsqueeze(0).flatten() + 1),
    ("contiguous", lambda x, y, w: (x.T.contiguous() * 2).T),
]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("name, fn", OPS, ids=[o[0] for o in OPS])
def test_sharded_op_matches_unsharded(name, fn, axis, n):
    """Shapes and values of an op on sharded inputs are those of the op on one device."""
    ref = fn(Tensor(X), Tensor(Y), Tensor(W))
    devs = devices(n)
    got = fn(Tensor(X).shard(devs, axis), Tensor(Y).shard(devs, axis), Tensor(W).to(devs))
    assert got.shape == ref.shape
    assert got.device == devs
    check(got, ref, atol=1e-4)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_mixed_layouts_reshard_to_one(n):
    """Operands split on different axes (or replicated) are moved to one layout first."""
    devs = devices(n)
    a, b, c = Tensor(X).shard(devs, 0), Tensor(Y).shard(devs, 1), Tensor(Y).to(devs)
    check(a + b * c, X + Y * Y)
    check(b - a, Y - X)


def test_shard_layout_and_device():
    """`device` is the tuple of devices; bounds split as evenly as numpy's array_split."""
    t = Tensor(X).shard(("CPU:0", "cpu:1", "CPU:2"), axis=1)
    assert t.device == ("CPU:0", "CPU:1", "CPU:2")
    assert t.shard_axis == 1 and t.shard_bounds == ((0, 3), (3, 5), (5, 7))
    assert [s.shape for s in t.shards] == [(5, 3), (5, 2), (5, 2)]
    assert [s.device for s in t.shards] == ["CPU:0", "CPU:1", "CPU:2"]
    r = Tensor(X).to(["CPU:0", "CPU:1"])
    assert r.device == ("CPU:0", "CPU:1") and r.shard_axis is None
    check(r, X)


@pytest.mark.parametrize("splits", [(5, 0, 0), (0, 2, 3), (1, 1, 3), (0, 0, 5)])
def test_uneven_and_empty_splits(splits):
    """Any split works, empty shards included; reductions over the split axis stay exact."""
    t = Tensor(X).shard(devices(3), axis=0, splits=splits)
    assert [s.shape[0] for s in t.shards] == list(splits)
    check((t * 3).sum(axis=0), (X * 3).sum(axis=0))
    check(t.max(axis=0), X.max(axis=0))
    check(t[2] + t[4], X[2] + X[4])


def test_bad_splits_raise_clear_errors():
    with pytest.raises(GraphError, match="splits"):
        Tensor(X).shard(devices(2), axis=0, splits=(2, 2))
    with pytest.raises(GraphError, match="distinct devices"):
        Tensor(X).shard(("CPU:0", "CPU:0"), axis=0)
    with pytest.raises(IndexError):
        Tensor(X).shard(devices(2), axis=2)
    with pytest.raises(GraphError, match="different devices"):
        Tensor(X).shard(devices(2), 0) + Tensor(X)
    with pytest.raises(GraphError, match="sharded over different devices"):
        Tensor(X).shard(devices(2), 0) + Tensor(X).shard(devices(3), 0)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_reduction_over_sharded_axis_is_an_allreduce(n):
    """The partial sums of each device meet in ALLREDUCE nodes; the result is replicated."""
    t = Tensor(X).shard(devices(n), axis=0).sum(axis=0)
    assert t.node.op is Ops.MULTI and t.shard_axis is None
    assert all(s.base().op is Ops.ALLREDUCE for s in t.node.src)
    kept = Tensor(X).shard(devices(n), axis=0).sum(axis=1)
    assert kept.shard_axis == 0 and all(s.base().op is not Ops.ALLREDUCE for s in kept.node.src)
    for shard in t.shards:
        check(shard, X.sum(axis=0))


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("src_axis, dst_axis", [(0, 1), (1, 0), (0, None), (None, 1), (1, 1)])
def test_reshard_between_axes(n, src_axis, dst_axis):
    devs = devices(n)
    t = Tensor(X).shard(devs, src_axis).shard(devs, dst_axis)
    assert t.shard_axis == dst_axis
    check(t, X)
    for shard, (b, e) in zip(t.shards, t.shard_bounds or [(0, X.shape[0])] * n):
        part = X if dst_axis is None else np.take(X, range(b, e), axis=dst_axis)
        check(shard, part)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_gather_to_one_device(n):
    t = (Tensor(X).shard(devices(n), axis=1) * 2).to("CPU:1")
    assert t.device == "CPU:1"
    check(t, X * 2)
    check(Tensor(X).to(devices(n)).to(f"CPU:{n - 1}"), X)


def test_assign_into_sharded_storage():
    """assign writes each shard's own buffer (replicated weights stay identical on every device)."""
    devs = devices(3)
    t = Tensor(X).shard(devs, axis=0)
    t.realize().wait()  # each shard now has its buffer
    before = [s.node.base().arg[0] for s in t.shards]
    t.assign(t * 2 + Tensor(Y).shard(devs, axis=1))
    t.realize().wait()
    assert [s.node.base().arg[0] for s in t.shards] == before
    check(t, X * 2 + Y)
    t[1:3] = 0.0
    want = X * 2 + Y
    want[1:3] = 0
    check(t, want)
    w = Tensor(W).to(devs)
    w.assign(w - 0.5)
    for shard in w.shards:
        check(shard, W - 0.5)


def test_clone_and_data_on_devices():
    devs = devices(2)
    c = Tensor(X).shard(devs, 1).clone()
    assert c.shard_bounds == ((0, 4), (4, 7))
    check(c, X)
    d = Tensor(X, device=devs)
    assert d.device == devs and d.shard_axis is None
    check(d, X)


def test_data_parallel_step():
    """A batch split over devices with replicated weights: the loss and the weights' gradient (an
    allreduce of per-device gradients) equal single-device training; an SGD step keeps replicas equal."""
    x = RNG.standard_normal((8, 7)).astype(np.float32)
    ref_w = Tensor(W, requires_grad=True)
    ref_loss = (Tensor(x) @ ref_w).relu().sum()
    ref_loss.backward()
    devs = devices(4)
    w = Tensor(W).to(devs)
    w.requires_grad = True
    loss = (Tensor(x).shard(devs, 0) @ w).relu().sum()
    loss.backward()
    check(loss, ref_loss, atol=1e-4)
    assert w.grad.device == devs
    check(w.grad, ref_w.grad, atol=1e-4)
    w.assign(w - 0.1 * w.grad)
    w.realize().wait()
    for shard in w.shards:
        check(shard, W - 0.1 * ref_w.grad.numpy(), atol=1e-4)


def test_null_devices_schedule_sharded_work():
    """NULL devices run nothing but schedule everything: shapes and devices are right."""
    devs = ("NULL:0", "NULL:1", "NULL:2")
    t = Tensor.ones(64, 32, device="NULL").shard(devs, axis=0)
    out = (t @ t.T).relu().sum(axis=0) + t.sum(axis=1)
    out.realize().wait()
    assert out.shape == (64,) and out.device == devs
    g = out.to("NULL:1")
    g.realize().wait()
    assert g.device == "NULL:1"


async def test_sharded_realize_is_awaitable():
    """`await t.realize()` on a sharded tensor; numpy() afterwards reads each shard without blocking."""
    t = (Tensor(X).shard(devices(3), axis=0) * 2).sum(axis=0)
    await t.realize()
    np.testing.assert_allclose(t.numpy(), (X * 2).sum(axis=0), rtol=1e-5)


async def test_reading_an_unrealized_sharded_tensor_in_the_loop_names_the_await():
    from atensor import NotRealizedError
    t = Tensor(X).shard(devices(2), axis=1) + 1
    with pytest.raises(NotRealizedError, match="await"):
        t.numpy()


def test_random_and_arange_on_devices_are_replicated():
    devs = devices(3)
    Tensor.manual_seed(5)
    r = Tensor.rand(4, 3, device=devs)
    Tensor.manual_seed(5)
    ref = Tensor.rand(4, 3)
    assert r.device == devs and r.shard_axis is None
    for shard in r.shards:
        check(shard, ref)
    check(Tensor.arange(6, device=devs).shard(devs, 0) * 2, np.arange(6) * 2)


async def test_from_shards_makes_one_sharded_tensor_without_copies():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    parts = [Tensor(a[:3], device="CPU:0"), Tensor(a[3:], device="CPU:1")]
    t = Tensor.from_shards(parts, axis=0)
    assert t.shape == (4, 3) and t.device == ("CPU:0", "CPU:1") and t.shard_bounds == ((0, 3), (3, 4))
    out = (t * 2).sum(axis=0)
    await out.realize()
    np.testing.assert_allclose(out.numpy(), (a * 2).sum(0))
    np.testing.assert_allclose(t.numpy(), a)
    replicated = Tensor.from_shards([Tensor(a, device="CPU:0"), Tensor(a, device="CPU:1")])
    assert replicated.shard_axis is None
    np.testing.assert_allclose(replicated.numpy(), a)


def test_from_shards_refuses_parts_that_do_not_fit():
    with pytest.raises(GraphError, match="distinct devices"):
        Tensor.from_shards([Tensor([1.0]), Tensor([2.0])], axis=0)
    with pytest.raises(GraphError, match="agree on every axis but 0"):
        Tensor.from_shards([Tensor([[1.0, 2.0]], device="CPU:0"), Tensor([[1.0]], device="CPU:1")], axis=0)
    with pytest.raises(GraphError, match="replicas must have one shape"):
        Tensor.from_shards([Tensor([1.0, 2.0], device="CPU:0"), Tensor([1.0], device="CPU:1")])


@pytest.mark.parametrize("n", [2, 3])
def test_an_embedding_lookup_with_a_sharded_index_reads_the_whole_replicated_table_and_its_gradient_sums(n):
    # GATHER indexes the whole flat source: each device reads its rows of the index from its whole copy
    # of the table (the elementwise rule split the table like the index: wrong values). The gradient, a
    # scatter-add of every device's rows, is summed over the devices (one allreduce), replicated.
    table = RNG.standard_normal((11, 4)).astype(np.float32)
    idx = RNG.integers(0, 11, size=(5, 3)).astype(np.int32)
    upstream = RNG.standard_normal((5, 3, 4)).astype(np.float32)
    expected_grad = np.zeros_like(table)
    np.add.at(expected_grad, idx, upstream)
    w = Tensor(table).to(devices(n))
    w.requires_grad = True
    out = w[Tensor(idx).shard(devices(n), axis=0)]
    (out * Tensor(upstream).shard(devices(n), axis=0)).sum().backward()
    check(out, table[idx])
    assert w.grad.device == devices(n)
    check(w.grad, expected_grad)


def test_indexing_a_sharded_table_or_scattering_a_sharded_set_says_to_replicate_first():
    idx = Tensor(np.array([0, 3, 3, 4], np.int32)).shard(devices(2), axis=0)
    with pytest.raises(GraphError, match="replicate it first"):
        Tensor(X).shard(devices(2), axis=0)[idx]
    base = Tensor(np.zeros(9, np.float32)).to(devices(2))
    vals = Tensor(np.ones(4, np.float32)).shard(devices(2), axis=0)
    with pytest.raises(GraphError, match="replicate them first"):
        base.scatter(0, idx, vals)


@pytest.mark.parametrize("n", [2, 3])
def test_a_python_scalar_beside_a_sharded_tensor_is_made_on_each_device_in_its_shards_shape(n):
    # one constant per device, laid out like the tensor: the op runs per shard with nothing resharded
    x = Tensor(X).shard(devices(n), axis=0)
    for got, want in ((x * 2, X * 2), (1 - x, 1 - X), (x.relu(), np.maximum(X, 0)), (x / 4, X / 4)):
        check(got, want)
    scaled = (x * 3).node
    assert scaled.op is Ops.MULTI and scaled.arg == x.node.arg
    for shard, part in zip(scaled.src, x.node.src):
        constant = shard.src[1]
        assert constant.shape == part.shape and constant.device == part.device
        assert constant.base().op is Ops.CONST
    replicated = Tensor(X).to(devices(n))
    check(replicated - 0.5, X - 0.5)
    assert (replicated - 0.5).node.arg == (None, None)


def test_multi_shape_inference_is_kept_per_signature_and_an_invalid_one_raises_every_time():
    from atensor.graph import multi
    parts = [Tensor(X[:2], device="CPU:0").node, Tensor(X[2:], device="CPU:1").node]
    made = multi.make(parts, 0)
    assert multi.infer(Ops.MULTI, made.src, made.arg) == ((5, 7), devices(2)) == multi._checked(
        Ops.MULTI, made.src, made.arg)
    for _ in range(2):  # not kept: the same wrong bounds raise again
        with pytest.raises(GraphError, match="does not fit bounds"):
            multi.infer(Ops.MULTI, tuple(parts), (0, ((0, 3), (3, 5))))
