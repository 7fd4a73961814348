"""Zero-size tensors through every op: shapes as numpy gives them, reductions of an empty axis give the
identity, a cat with an empty part works, and realizing a size-0 result is a no-op."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atensor import Tensor

E = np.zeros((2, 0, 3), dtype=np.float32)
I = np.zeros((0, 4), dtype=np.int32)

# (name, atensor op, numpy reference or None when only the shape is compared)
OPS = [
    ("add", lambda t: t + 1, lambda a: a + 1), ("exp", lambda t: t.exp(), np.exp),
    ("where", lambda t: (t > 0).where(t, -t), lambda a: np.where(a > 0, a, -a)),
    ("sum_empty_axis", lambda t: t.sum(1), lambda a: a.sum(1)),
    ("sum_all", lambda t: t.sum(), lambda a: a.sum()),
    ("prod_empty_axis", lambda t: t.prod(1), lambda a: a.prod(1)),
    ("max_empty_axis", lambda t: t.max(1), lambda a: np.full((2, 3), -np.inf, np.float32)),
    ("mean", lambda t: t.mean(0), lambda a: a.mean(0)), ("any", lambda t: t.any(1), lambda a: a.any(1)),
    ("all", lambda t: t.all(1), lambda a: a.all(1)),
    ("logsumexp", lambda t: t.logsumexp(1), lambda a: np.full((2, 3), -np.inf, np.float32)),
    ("softmax", lambda t: t.softmax(1), lambda a: a),
    ("cumsum", lambda t: t.cumsum(1), lambda a: np.cumsum(a, 1)),
    ("cumprod", lambda t: t.cumprod(2), lambda a: np.cumprod(a, 2)),
    ("cummax", lambda t: t.cummax(1)[0], lambda a: a),
    ("reshape", lambda t: t.reshape(0, 6), lambda a: a.reshape(0, 6)),
    ("permute", lambda t: t.permute(2, 0, 1), None),
    ("getitem", lambda t: t[:, :, 1:], lambda a: a[:, :, 1:]),
    ("tensor_index", lambda t: t[Tensor([1, 0])], lambda a: a[[1, 0]]),
    ("empty_tensor_index", lambda t: t[Tensor(np.zeros(0, np.int32))], lambda a: a[np.zeros(0, np.int32)]),
    ("gather", lambda t: t.gather(1, Tensor(np.zeros((2, 0, 3), np.int32))), lambda a: a),
    ("cat", lambda t: t.cat(t, dim=1), lambda a: np.concatenate([a, a], 1)),
    ("cat_into", lambda t: Tensor(np.ones((2, 1, 3), np.float32)).cat(t, dim=1),
     lambda a: np.ones((2, 1, 3))),
    ("stack", lambda t: t.stack(t), lambda a: np.stack([a, a])),
    ("split", lambda t: t.split(1, dim=0)[1], lambda a: a[1:2]),
    ("repeat", lambda t: t.repeat(2, 3, 1), lambda a: np.tile(a, (2, 3, 1))),
    ("pad", lambda t: t.pad(((0, 0), (1, 1), (0, 0)), value=5.0),
     lambda a: np.pad(a, ((0, 0), (1, 1), (0, 0)), constant_values=5)),
    ("pad_replicate_other_axis", lambda t: t.pad(((1, 1), (0, 0), (0, 0)), mode="replicate"), None),
    ("roll", lambda t: t.roll(1, 1), lambda a: a), ("tril", lambda t: t.tril(), lambda a: np.tril(a)),
    ("matmul", lambda t: t @ Tensor(np.ones((3, 4), np.float32)), lambda a: a @ np.ones((3, 4), np.float32)),
    ("matmul_empty_k", lambda t: t.permute(0, 2, 1) @ Tensor(np.ones((2, 0, 5), np.float32)),
     lambda a: a.transpose(0, 2, 1) @ np.ones((2, 0, 5), np.float32)),
    ("einsum", lambda t: Tensor.einsum("ijk->ki", t), lambda a: np.einsum("ijk->ki", a)),
    ("var", lambda t: t.var(2), lambda a: a.var(2, ddof=1)),
    ("norm", lambda t: t.norm(), lambda a: np.float32(0)),
    ("round", lambda t: t.round(), np.round), ("erf", lambda t: t.erf(), lambda a: a),
    ("gelu", lambda t: t.gelu(), lambda a: a), ("isnan", lambda t: t.isnan(), np.isnan),
    ("clone", lambda t: t.clone(), lambda a: a), ("contiguous", lambda t: t.contiguous(), lambda a: a),
    ("masked_fill", lambda t: t.masked_fill(t > 0, 1.0), lambda a: a),
    ("one_hot", lambda t: Tensor(I[:, 0]).one_hot(3), lambda a: np.zeros((0, 3), np.int32)),
    ("scatter", lambda t: t.scatter(1, Tensor(np.zeros((2, 0, 3), np.int32)), 1.0), lambda a: a),
    ("max_pool", lambda t: Tensor(np.zeros((0, 1, 4, 4), np.float32)).max_pool2d(2),
     lambda a: np.zeros((0, 1, 2, 2))),
]


@pytest.mark.parametrize("name, op, ref", OPS, ids=[o[0] for o in OPS])
def test_zero_size_through_every_op(name, op, ref):
    out = op(Tensor(E))
    got = out.numpy()
    if ref is None:
        assert got.size == 0 or name.startswith("pad")
        return
    want = np.asarray(ref(E))
    assert got.shape == want.shape, (got.shape, want.shape)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), equal_nan=True)


async def test_realizing_a_size_zero_result_is_a_no_op_and_an_empty_setitem_writes_nothing():
    t = Tensor(I)
    out = await (t * 2).realize()
    assert out.numpy().shape == (0, 4)
    u = Tensor([1.0, 2.0])
    u[Tensor(np.zeros(0, np.int32))] = 5.0
    u[2:] = 9.0
    assert (await u.realize()).tolist() == [1.0, 2.0]
    assert math.isnan((await Tensor(E).mean().realize()).item())
