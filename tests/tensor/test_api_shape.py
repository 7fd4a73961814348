"""Joining, splitting and rearranging against numpy (PyTorch's pad modes where numpy names them
differently): cat, stack, split, chunk, repeat, repeat_interleave, tile, pad, roll, tril, triu."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, dtypes

A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_cat_and_stack_match_numpy_including_empty_parts_and_mixed_dtypes():
    b = np.ones((2, 1, 4), dtype=np.float32)
    e = np.zeros((2, 0, 4), dtype=np.float32)
    np.testing.assert_array_equal(Tensor(A).cat(Tensor(b), Tensor(e), Tensor(A), dim=1).numpy(),
                                  np.concatenate([A, b, e, A], axis=1))
    np.testing.assert_array_equal(Tensor(A).cat(Tensor(A), dim=-1).numpy(), np.concatenate([A, A], -1))
    ints = Tensor(np.arange(4, dtype=np.int32).reshape(1, 4))
    mixed = Tensor(A[0]).cat(ints, dim=0)
    assert mixed.dtype == dtypes.float32
    np.testing.assert_array_equal(mixed.numpy(), np.concatenate([A[0], np.arange(4).reshape(1, 4)]))
    np.testing.assert_array_equal(Tensor(A).stack(Tensor(A * 2), dim=2).numpy(), np.stack([A, A * 2], axis=2))
    flags = Tensor([True, False]).cat(Tensor([False, True]))
    assert flags.tolist() == [True, False, False, True]
    assert Tensor(e).cat(Tensor(e), dim=1).shape == (2, 0, 4)


def test_split_and_chunk_match_pytorch_rules():
    parts = Tensor(A).split(2, dim=2)
    assert [p.shape for p in parts] == [(2, 3, 2), (2, 3, 2)]
    parts = Tensor(A).split([1, 3], dim=-1)
    for p, r in zip(parts, np.split(A, [1], axis=-1)):
        np.testing.assert_array_equal(p.numpy(), r)
    chunks = Tensor(np.arange(10)).chunk(3)
    assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [c.shape for c in Tensor(np.arange(5)).split(2)] == [(2,), (2,), (1,)]


def test_repeat_tile_and_repeat_interleave_match_numpy():
    np.testing.assert_array_equal(Tensor(A).repeat(2, 1, 3).numpy(), np.tile(A, (2, 1, 3)))
    np.testing.assert_array_equal(Tensor(A).repeat(2, 1, 1, 2).numpy(), np.tile(A, (2, 1, 1, 2)))
    np.testing.assert_array_equal(Tensor(A).tile(2).numpy(), np.tile(A, 2))
    np.testing.assert_array_equal(Tensor(A).repeat_interleave(2, dim=1).numpy(), np.repeat(A, 2, axis=1))
    np.testing.assert_array_equal(Tensor(A).repeat_interleave(3).numpy(), np.repeat(A, 3))


@pytest.mark.parametrize("mode, np_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                           ("circular", "wrap"),
                                           ("constant", "constant")])
def test_pad_modes_match_numpy(mode, np_mode):
    pairs = ((0, 0), (2, 1), (1, 3))
    got = Tensor(A).pad(pairs, mode=mode).numpy()
    np.testing.assert_array_equal(got, np.pad(A, pairs, mode=np_mode))
    flat = Tensor(A).pad((1, 2, 2, 0), mode=mode).numpy()  # PyTorch's (left, right, top, bottom)
    np.testing.assert_array_equal(flat, np.pad(A, ((0, 0), (2, 0), (1, 2)), mode=np_mode))


def test_pad_constant_value_and_too_large_reflect():
    np.testing.assert_array_equal(Tensor(A).pad(((1, 0), (0, 0), (0, 2)), value=-1.0).numpy(),
                                  np.pad(A, ((1, 0), (0, 0), (0, 2)), constant_values=-1.0))
    with pytest.raises(ValueError, match="too large"):
        Tensor(A).pad(((0, 0), (3, 0), (0, 0)), mode="reflect")


def test_roll_tril_triu_match_numpy():
    np.testing.assert_array_equal(Tensor(A).roll(2, 2).numpy(), np.roll(A, 2, 2))
    np.testing.assert_array_equal(Tensor(A).roll((-1, 5), (0, 1)).numpy(), np.roll(A, (-1, 5), (0, 1)))
    np.testing.assert_array_equal(Tensor(A).roll(7).numpy(), np.roll(A, 7))
    for k in (-1, 0, 2):
        np.testing.assert_array_equal(Tensor(A).tril(k).numpy(), np.tril(A, k))
        np.testing.assert_array_equal(Tensor(A).triu(k).numpy(), np.triu(A, k))
