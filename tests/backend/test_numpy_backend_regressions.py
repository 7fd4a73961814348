"""numpy backend regressions found by differential testing (issue 17)."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1), (1,), ()])
def test_where_on_size_one_operands_then_two_elementwise_ops(shape: tuple[int, ...]) -> None:
    """A `where` whose operands are all one-element values is a read-only broadcast in the kernel;
    the ufuncs after it must not write into it (it raised "output array is read-only")."""
    b = Tensor(np.ones(shape, bool))
    y = Tensor(np.full(shape, -1.25, np.float32))
    expected = (np.where(np.ones(shape, bool), np.float32(-1.25), np.float32(2.0)) + 1) * 2
    np.testing.assert_array_equal(((b.where(y, 2.0) + 1) * 2).numpy(), expected)
    np.testing.assert_array_equal((((b.where(y, 2.0) + 1) * 2) - 3).numpy(), expected - 3)
