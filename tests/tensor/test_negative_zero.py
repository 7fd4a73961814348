"""-0.0 and 0.0 compare and hash equal, so a constant cache, node interning or a schedule-cache key
that holds one hands it back for the other: `x * -0.0` then computed `x * 0.0` (graph/node.py
NegativeZero keeps them apart). Each case builds the 0.0 form first, then the -0.0 one, and compares
signs with numpy's."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

X = np.array([1.0, -2.0, 0.0, -0.0], dtype=np.float32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("zero", [0.0, -0.0])
@pytest.mark.parametrize("op", ["mul", "add", "radd", "sub"])
def test_scalar_zero_operands_keep_their_sign(op: str, zero: float) -> None:
    f = {"mul": lambda a, z: a * z, "add": lambda a, z: a + z, "radd": lambda a, z: z + a,
         "sub": lambda a, z: a - z}[op]
    for z in (-zero, zero):  # the other sign first, so a cache entry for it exists
        _same_bits(f(Tensor(X), z).numpy(), f(X, np.float32(z)))


def test_full_and_where_keep_the_sign() -> None:
    _same_bits(Tensor.full((3,), 0.0).numpy(), np.full(3, 0.0, np.float32))
    _same_bits(Tensor.full((3,), -0.0).numpy(), np.full(3, -0.0, np.float32))
    cond = np.array([True, False])
    _same_bits(Tensor(cond).where(0.0, 1.0).numpy(), np.where(cond, 0.0, 1.0).astype(np.float32))
    _same_bits(Tensor(cond).where(-0.0, 1.0).numpy(), np.where(cond, -0.0, 1.0).astype(np.float32))
