"""Indexing against numpy (and PyTorch for gather/scatter): advanced getitem and setitem with integer and
boolean tensors mixed with slices, ints, None and ..., and the gather/scatter family."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

try:
    import torch
except ImportError:  # PyTorch is a test-only dependency: the tests that compare against it skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (test-only dependency) is not installed")

A = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
I = np.array([[0, 3], [2, -1]])
J = np.array([4, 0])
K = np.array([5, 1, 0])


def T(x):
    return Tensor(x) if isinstance(x, np.ndarray) else x


INDICES = [
    (I,), (slice(None), J), (I, J), (1, slice(None), J), (I, slice(1, 4), J), (Ellipsis, K), (None, I, 0),
    (slice(None), I, J[:, None]), (-1, J), (slice(None, None, -1), J, slice(0, 6, 2)), (J - 1, J, J),
    (np.array([], dtype=np.int64),), (slice(2, 2), J),
]


@pytest.mark.parametrize("index", INDICES, ids=[str(i) for i in range(len(INDICES))])
def test_getitem_with_integer_tensors_matches_numpy(index):
    got = Tensor(A)[tuple(T(i) for i in index)].numpy()
    ref = A[index]
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def test_getitem_with_lists_and_boolean_masks_matches_numpy():
    t = Tensor(A)
    np.testing.assert_array_equal(t[[0, 2]].numpy(), A[[0, 2]])
    mask = A > 60
    np.testing.assert_array_equal(t[Tensor(mask)].numpy(), A[mask])
    row_mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(t[Tensor(row_mask), 1:3].numpy(), A[row_mask, 1:3])
    np.testing.assert_array_equal(t[:, Tensor(np.array([False, True, False, False, True]))].numpy(),
                                  A[:, [False, True, False, False, True]])


def test_out_of_range_tensor_indices_read_zero_as_in_tinygrad():
    assert Tensor([1, 2, 3])[Tensor([0, 5, -4])].tolist() == [1, 0, 0]


@pytest.mark.parametrize("index", [(I,), (1, slice(None), J), (I, slice(1, 4), J),
                                   (slice(None), I, J[:, None]),
                                   (Ellipsis, K), (J - 1, J, J)], ids=str)
def test_setitem_with_integer_tensors_matches_numpy(index):
    ref = A.copy()
    t = Tensor(A)
    shape = A[index].shape
    value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * -1
    ref[index] = value
    t[tuple(T(i) for i in index)] = Tensor(value)
    np.testing.assert_array_equal(t.numpy(), ref)
    ref[index] = 7
    t[tuple(T(i) for i in index)] = 7
    np.testing.assert_array_equal(t.numpy(), ref)


def test_setitem_with_masks_slices_and_ints_matches_numpy():
    ref, t = A.copy(), Tensor(A)
    mask = A % 7 == 0
    ref[mask] = -5
    t[Tensor(mask)] = -5
    ref[A[:, 0, 0] > 30] = np.arange(6, dtype=np.float32)  # broadcast over the masked rows' trailing axes
    t[Tensor(A[:, 0, 0] > 30)] = Tensor(np.arange(6, dtype=np.float32))
    rows = A[:, 0, 0] < 30
    ref[rows] = np.arange(rows.sum() * 30, dtype=np.float32).reshape(-1, 5, 6)  # one block per selected row
    t[Tensor(rows)] = Tensor(np.arange(rows.sum() * 30, dtype=np.float32).reshape(-1, 5, 6))
    ref[1:3, ::2, -1] = 100
    t[1:3, ::2, -1] = 100
    ref[0] = ref[3]
    t[0] = t[3]
    np.testing.assert_array_equal(t.numpy(), ref)


def test_setitem_through_a_view_of_a_view_writes_the_base():
    ref, t = A.copy(), Tensor(A)
    view, ref_view = t[1:, 2], ref[1:, 2]
    view[Tensor(np.array([0, 2]))] = 0.5
    ref_view[[0, 2]] = 0.5
    np.testing.assert_array_equal(t.numpy(), ref)


@needs_torch
def test_gather_scatter_and_scatter_reduce_match_pytorch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    for dim in range(3):
        shape = [3, 4, 5]
        shape[dim] = 6
        index = rng.integers(0, x.shape[dim], size=shape)
        index_small = index[:2, :3, :4] if dim != 0 else index[:, :3, :4]
        tx, ti = torch.tensor(x), torch.tensor(index_small)
        np.testing.assert_array_equal(Tensor(x).gather(dim, Tensor(index_small)).numpy(),
                                      torch.gather(tx, dim, ti).numpy())
        src = rng.standard_normal(index_small.shape).astype(np.float32)
        for reduce in ("sum", "amax", "amin", "mean"):
            for include_self in (True, False):
                got = Tensor(x).scatter_reduce(dim, Tensor(index_small), Tensor(src), reduce, include_self)
                ref = tx.scatter_reduce(dim, ti, torch.tensor(src), reduce, include_self=include_self)
                np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    # scatter with unique positions (duplicates have no defined winner in PyTorch)
    base = np.zeros((3, 5), dtype=np.float32)
    index = np.array([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]])
    src = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(Tensor(base).scatter(0, Tensor(index), Tensor(src)).numpy(),
                                  torch.tensor(base).scatter(0, torch.tensor(index),
                                                             torch.tensor(src)).numpy())
    np.testing.assert_array_equal(Tensor(base).scatter(1, Tensor(index[:, :2]), 9.0).numpy(),
                                  torch.tensor(base).scatter(1, torch.tensor(index[:, :2]), 9.0).numpy())


@needs_torch
def test_index_select_masked_fill_one_hot_and_where_broadcast():
    t = Tensor(A)
    np.testing.assert_array_equal(t.index_select(1, Tensor([4, 0, 4])).numpy(), A[:, [4, 0, 4]])
    mask = np.array([True, False, True, False, False, True])
    np.testing.assert_array_equal(t.masked_fill(Tensor(mask), -1).numpy(), np.where(mask, -1, A))
    labels = np.array([[0, 2], [1, 3]])
    np.testing.assert_array_equal(Tensor(labels).one_hot(4).numpy(),
                                  torch.nn.functional.one_hot(torch.tensor(labels), 4).numpy())
    assert Tensor(labels).one_hot().shape == (2, 2, 4)
    cond = A[:, :1, :] > 50
    np.testing.assert_array_equal(Tensor(cond).where(Tensor(A), Tensor(np.float32(-2.0))).numpy(),
                                  np.where(cond, A, -2.0))
    np.testing.assert_array_equal(Tensor.where(Tensor(cond), 1.0, Tensor(A)).numpy(), np.where(cond, 1.0, A))
