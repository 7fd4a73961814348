"""A value cached in a buffer is not read from there by a graph that assigns to that buffer (found by
tests/fuzz): after `t[0] = 0` is realized, the constant 0 is known to live in t's first element; the
graph of `t[::-1] = v; t[1] = 0` then read the 0 from t before the first assign and wrote t after both,
one kernel on both sides of an assign, and raised AssignCycleError for a program eager code runs."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float32])
def test_writes_after_a_realized_write_of_the_same_constant_run_in_program_order(dtype) -> None:
    start = np.array([1, 2, 3], dtype)
    t = Tensor(start.copy())
    t[0] = 0
    t.numpy()
    t[::-1] = Tensor(np.array([1, 1, 1], dtype))
    t[:0:-1] = 0
    want = start.copy()
    want[0] = 0
    want[::-1] = np.array([1, 1, 1], dtype)
    want[:0:-1] = 0
    np.testing.assert_array_equal(t.numpy(), want)


def test_a_value_realized_into_a_buffer_is_still_read_correctly_after_that_buffer_changes() -> None:
    a = Tensor(np.arange(3, dtype=np.float32))
    v = a * 2
    t = Tensor(np.zeros(3, np.float32))
    t.assign(v)
    t.numpy()                     # v's value now also lives in t
    t.assign(t + v)               # reads v while overwriting t: v is computed again, not read from t
    t[1] = v[2]
    np.testing.assert_array_equal(t.numpy(), [0.0, 4.0, 8.0])
    np.testing.assert_array_equal(v.numpy(), [0.0, 2.0, 4.0])
