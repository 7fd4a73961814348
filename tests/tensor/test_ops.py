"""Every op of the first API slice against numpy, plus property tests over random shapes and chains."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, strategies as st

from atensor import Tensor, dtypes

RNG = np.random.default_rng(0)


def _close(t: Tensor, ref: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got = t.numpy()
    assert got.shape == np.asarray(ref).shape, (got.shape, np.asarray(ref).shape)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)


A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
POS = (np.abs(A) + 0.5).astype(np.float32)

UNARY = [
    ("neg", lambda t: -t, lambda a: -a, A),
    ("abs", lambda t: t.abs(), np.abs, A),
    ("exp", lambda t: t.exp(), np.exp, A),
    ("log", lambda t: t.log(), np.log, POS),
    ("exp2", lambda t: t.exp2(), np.exp2, A),
    ("log2", lambda t: t.log2(), np.log2, POS),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, POS),
    ("rsqrt", lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), POS),
    ("sin", lambda t: t.sin(), np.sin, A),
    ("cos", lambda t: t.cos(), np.cos, A),
    ("tanh", lambda t: t.tanh(), np.tanh, A),
    ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), A),
    ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0), A),
    ("clip", lambda t: t.clip(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), A),
    ("reciprocal", lambda t: t.reciprocal(), lambda a: 1 / a, POS),
]


@pytest.mark.parametrize("name,op,ref,data", UNARY, ids=[u[0] for u in UNARY])
def test_unary_matches_numpy(name, op, ref, data):
    _close(op(Tensor(data)), ref(data))


BINARY = [
    ("add", lambda x, y: x + y, np.add),
    ("sub", lambda x, y: x - y, np.subtract),
    ("mul", lambda x, y: x * y, np.multiply),
    ("div", lambda x, y: x / y, np.divide),
    ("maximum", lambda x, y: x.maximum(y), np.maximum),
    ("minimum", lambda x, y: x.minimum(y), np.minimum),
    ("lt", lambda x, y: x < y, np.less),
    ("gt", lambda x, y: x > y, np.greater),
    ("le", lambda x, y: x <= y, np.less_equal),
    ("ge", lambda x, y: x >= y, np.greater_equal),
    ("eq", lambda x, y: x == y, np.equal),
    ("ne", lambda x, y: x != y, np.not_equal),
]


@pytest.mark.parametrize("name,op,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_matches_numpy_with_broadcasting(name, op, ref):
    b_row = B[:1]
    _close(op(Tensor(A), Tensor(B)), ref(A, B))
    _close(op(Tensor(A), Tensor(b_row)), ref(A, b_row))
    _close(op(Tensor(A), 0.5), ref(A, np.float32(0.5)))


def test_integer_division_and_modulo_follow_python_floor_semantics():
    a = np.array([7, -7, 7, -7, 0], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int32)
    _close(Tensor(a) // Tensor(b), a // b)
    _close(Tensor(a) % Tensor(b), a % b)
    _close(Tensor(a.astype(np.float32)) // 2.0, a.astype(np.float32) // 2)


def test_pow_and_logical_ops():
    _close(Tensor(POS) ** 2.5, POS ** np.float32(2.5), rtol=1e-4)
    _close(2 ** Tensor(A), np.float32(2) ** A, rtol=1e-5)
    x, y = np.array([True, False, True]), np.array([True, True, False])
    assert (Tensor(x) & Tensor(y)).tolist() == (x & y).tolist()
    assert (Tensor(x) | Tensor(y)).tolist() == (x | y).tolist()
    assert (Tensor(x) ^ Tensor(y)).tolist() == (x ^ y).tolist()
    assert (~Tensor(x)).tolist() == (~x).tolist()
    assert Tensor(x).logical_not().tolist() == (~x).tolist()
    i = np.array([5, 3, 12], dtype=np.int32)
    assert (Tensor(i) & 6).tolist() == (i & 6).tolist()


def test_where_selects_and_broadcasts():
    cond = A > 0
    _close(Tensor(cond).where(Tensor(A), 0.0), np.where(cond, A, 0))
    _close(Tensor(cond).where(1.0, Tensor(B[:1])), np.where(cond, 1.0, B[:1]).astype(np.float32))


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_match_numpy(axis, keepdim):
    t = Tensor(A)
    _close(t.sum(axis, keepdim), A.sum(axis=axis, keepdims=keepdim), rtol=1e-5)
    _close(t.max(axis, keepdim), A.max(axis=axis, keepdims=keepdim))
    _close(t.min(axis, keepdim), A.min(axis=axis, keepdims=keepdim))
    _close(t.mean(axis, keepdim), A.mean(axis=axis, keepdims=keepdim), rtol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_argmin_give_first_index(axis):
    data = np.array([[1, 5, 5, 0], [7, 7, 2, 7], [0, 0, 0, 0]], dtype=np.float32)
    assert Tensor(data).argmax(axis).tolist() == np.argmax(data, axis=axis).tolist()
    assert Tensor(data).argmin(axis).tolist() == np.argmin(data, axis=axis).tolist()


def test_int_reductions_and_sum_dtype():
    i = np.arange(12, dtype=np.int8).reshape(3, 4)
    s = Tensor(i).sum()
    assert s.dtype == dtypes.int32 and s.item() == 66
    assert Tensor(i).max(1).tolist() == i.max(1).tolist()
    assert Tensor(i).min(0).tolist() == i.min(0).tolist()
    assert Tensor([True, False, True]).sum().item() == 2


def test_movement_ops_match_numpy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(x)
    _close(t.reshape(6, 4), x.reshape(6, 4))
    _close(t.reshape(-1, 2), x.reshape(-1, 2))
    _close(t.permute(2, 0, 1), x.transpose(2, 0, 1))
    _close(t.transpose(0, 2), x.swapaxes(0, 2))
    _close(t[0].T, x[0].T)
    _close(t[:, :1].expand(2, 5, 4), np.broadcast_to(x[:, :1], (2, 5, 4)))
    _close(t.flatten(), x.flatten())
    _close(t.flatten(1), x.reshape(2, 12))
    _close(t.unsqueeze(1), x[:, None])
    _close(t[:, :1].squeeze(1), x[:, 0])
    _close(t.pad(((1, 0), None, (2, 1))), np.pad(x, ((1, 0), (0, 0), (2, 1))))
    _close(t.pad(((0, 0), (1, 1), (0, 0)), value=-3.0), np.pad(x, ((0, 0), (1, 1), (0, 0)), constant_values=-3))
    _close(t.shrink(((0, 1), (1, 3), None)), x[0:1, 1:3])
    _close(t.flip(1), x[:, ::-1])
    _close(t.flip((0, 2)), x[::-1, :, ::-1])
    # views of views: a reshape of a permuted view still gives numpy's values
    _close(t.permute(2, 1, 0).reshape(4, 6), x.transpose(2, 1, 0).reshape(4, 6))
    _close(t.pad(((0, 0), (1, 1), (0, 0))).reshape(2, 20), np.pad(x, ((0, 0), (1, 1), (0, 0))).reshape(2, 20))


@pytest.mark.parametrize("index", [
    0, -1, (1, 2), (slice(None), 1), (Ellipsis, 2), (None, 0), (slice(None, None, -1),),
    (slice(1, None, 2), slice(None, None, -2)), (0, Ellipsis, None), (slice(5, 1, -1), 3),
    (slice(10, 20),), (slice(None), slice(None), slice(3, 0, -2)),
])
def test_getitem_matches_numpy(index):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    _close(Tensor(x)[index], x[index])


def test_getitem_out_of_range_raises_index_error():
    with pytest.raises(IndexError):
        Tensor([1, 2, 3])[3]
    with pytest.raises(IndexError):
        Tensor([1, 2, 3])[0, 0]


def test_matmul_and_dot_shapes():
    a = RNG.standard_normal((5, 7)).astype(np.float32)
    b = RNG.standard_normal((7, 3)).astype(np.float32)
    v = RNG.standard_normal(7).astype(np.float32)
    _close(Tensor(a) @ Tensor(b), a @ b, rtol=1e-4, atol=1e-5)
    _close(Tensor(a).dot(Tensor(v)), a @ v, rtol=1e-4, atol=1e-5)
    _close(Tensor(v) @ Tensor(b), v @ b, rtol=1e-4, atol=1e-5)
    batch = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    _close(Tensor(batch) @ Tensor(b), batch @ b, rtol=1e-4, atol=1e-5)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert (Tensor(ints) @ Tensor(ints.T)).tolist() == (ints @ ints.T).tolist()


def test_creation_functions():
    assert Tensor.zeros(2, 3).tolist() == np.zeros((2, 3)).tolist()
    assert Tensor.ones((2,)).tolist() == [1.0, 1.0]
    assert Tensor.full((2, 2), 7).tolist() == [[7, 7], [7, 7]]
    assert Tensor.full((2, 2), 7).dtype == dtypes.int32
    assert Tensor.arange(5).tolist() == list(range(5))
    _close(Tensor.arange(1.0, 2.0, 0.25), np.arange(1.0, 2.0, 0.25, dtype=np.float32))
    assert Tensor.arange(10, 0, -3).tolist() == list(range(10, 0, -3))
    _close(Tensor.eye(3, 4), np.eye(3, 4, dtype=np.float32))
    e = Tensor.empty(4, 5)
    assert e.shape == (4, 5) and e.numpy().shape == (4, 5)
    base = Tensor(A)
    assert base.zeros_like().tolist() == np.zeros_like(A).tolist()
    assert base.ones_like().shape == A.shape
    assert base.full_like(2.0).tolist() == np.full_like(A, 2.0).tolist()


def test_random_numbers_are_seeded_and_well_distributed():
    Tensor.manual_seed(42)
    a = Tensor.rand(1000).numpy()
    Tensor.manual_seed(42)
    b = Tensor.rand(1000).numpy()
    np.testing.assert_array_equal(a, b)
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    r = Tensor.randint(1000, low=3, high=9).numpy()
    assert r.min() == 3 and r.max() == 8
    assert Tensor.rand(2, 3).shape == (2, 3) and Tensor.rand_like(Tensor(A)).shape == A.shape


@pytest.mark.parametrize("dt", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                "uint64", "float16", "float32", "float64"])
def test_dtypes_round_trip_and_cast(dt):
    data = np.array([0, 1, 2, 3], dtype=dt)
    t = Tensor(data)
    assert t.dtype.name == dt
    np.testing.assert_array_equal(t.numpy(), data)
    np.testing.assert_array_equal((t.cast(dtypes.float64) + 1).numpy(), data.astype(np.float64) + 1)


def test_weak_python_scalars_keep_the_tensor_dtype():
    assert (Tensor([1.0], dtype=dtypes.float16) * 2.0).dtype == dtypes.float16
    assert (Tensor([1.0]) * 2.0).dtype == dtypes.float32
    assert (Tensor([1], dtype=dtypes.int8) + 1).dtype == dtypes.int8
    assert (Tensor([1]) + 1).dtype == dtypes.int32
    assert (Tensor([1]) + 1.5).dtype == dtypes.float32
    assert (Tensor([True]) + 1).dtype == dtypes.int32
    assert (Tensor([1], dtype=dtypes.int8) + Tensor([1], dtype=dtypes.uint8)).dtype == dtypes.int16
    assert (Tensor([1], dtype=dtypes.int32) + Tensor([1.0], dtype=dtypes.float16)).dtype == dtypes.float16
    assert Tensor([1, 2]).div(2).tolist() == [0.5, 1.0]


def test_item_tolist_and_scalar_tensors():
    assert Tensor(3.5).item() == 3.5
    assert Tensor([[1, 2]]).tolist() == [[1, 2]]
    with pytest.raises(ValueError):
        Tensor([1, 2]).item()


def test_shape_errors_name_both_shapes_and_the_op():
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5,\).*add"):
        Tensor(A) + Tensor(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="matmul"):
        Tensor(A) @ Tensor(A)
    with pytest.raises(ValueError, match="reshape"):
        Tensor(A).reshape(5, 5)


def test_zero_size_tensors():
    z = Tensor(np.zeros((0, 3), dtype=np.float32))
    assert (z + 1).numpy().shape == (0, 3)
    assert z.sum(0).tolist() == [0.0, 0.0, 0.0]
    assert z.sum().item() == 0.0


# ---- properties: random shapes and chains of ops against numpy ----------------------------------

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)

UNARY_CHAIN = {
    "neg": (lambda t: -t, np.negative), "exp": (lambda t: (t * 0.3).exp(), lambda a: np.exp(a * np.float32(0.3))),
    "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0)), "tanh": (lambda t: t.tanh(), np.tanh),
    "sq": (lambda t: t * t, lambda a: a * a), "add1": (lambda t: t + 1, lambda a: a + np.float32(1)),
    "sin": (lambda t: t.sin(), np.sin), "abs": (lambda t: t.abs(), np.abs),
}
MOVES = {
    "T": (lambda t: t.T, lambda a: a.T), "flip0": (lambda t: t.flip(0), lambda a: np.flip(a, 0)),
    "flat": (lambda t: t.flatten(), lambda a: a.flatten()), "step": (lambda t: t[::-2], lambda a: a[::-2]),
    "pad": (lambda t: t.pad(((1, 2),) + ((0, 0),) * (t.ndim - 1)),
            lambda a: np.pad(a, ((1, 2),) + ((0, 0),) * (a.ndim - 1))),
}


@given(shape=shapes, ops=st.lists(st.sampled_from(sorted(UNARY_CHAIN) + sorted(MOVES)), min_size=1, max_size=8),
       reduce_axis=st.one_of(st.none(), st.integers(0, 2)), seed=st.integers(0, 2**16))
def test_random_op_chains_match_numpy(shape, ops, reduce_axis, seed):
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    t, a = Tensor(data), data
    for name in ops:
        op, ref = UNARY_CHAIN.get(name) or MOVES[name]
        t, a = op(t), ref(a)
    if reduce_axis is not None and reduce_axis < a.ndim:
        t, a = t.sum(reduce_axis), a.sum(axis=reduce_axis)
    _close(t, a, rtol=1e-4, atol=1e-4)


@given(shape_a=shapes, shape_b=shapes, seed=st.integers(0, 2**16),
       op=st.sampled_from(["add", "mul", "sub", "maximum", "lt"]))
def test_random_broadcasting_binary_ops_match_numpy(shape_a, shape_b, seed, op):
    rng = np.random.default_rng(seed)
    # make shape_b broadcast-compatible with shape_a by keeping a suffix and setting some axes to 1
    n = min(len(shape_a), len(shape_b))
    shape_b = tuple(1 if rng.random() < 0.4 else s for s in shape_a[len(shape_a) - n:])
    a = rng.standard_normal(shape_a).astype(np.float32)
    b = rng.standard_normal(shape_b).astype(np.float32)
    fn = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum, "lt": np.less}[op]
    tensor_fn = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "sub": lambda x, y: x - y,
                 "maximum": lambda x, y: x.maximum(y), "lt": lambda x, y: x < y}[op]
    _close(tensor_fn(Tensor(a), Tensor(b)), fn(a, b))
    _close(tensor_fn(Tensor(b), Tensor(a)), fn(b, a))


@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_random_matmuls_match_numpy(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    _close((Tensor(a) @ Tensor(b)).relu().sum(1), np.maximum(a @ b, 0).sum(1), rtol=1e-4, atol=1e-4)


def test_minimum_and_argmax_propagate_nan_as_torch_and_numpy_do():
    a = np.array([np.nan, 1.0, 2.0, -1.0], dtype=np.float32)
    b = np.array([1.0, np.nan, 0.5, -3.0], dtype=np.float32)
    np.testing.assert_array_equal(Tensor(a).minimum(Tensor(b)).numpy(), np.minimum(a, b))
    assert Tensor(a).argmax().item() == int(np.argmax(a)) == 0
    assert Tensor(b).argmin().item() == int(np.argmin(b)) == 1
    assert Tensor(np.array([[1, 5, 5]], dtype=np.int32)).minimum(3).tolist() == [[1, 3, 3]]
