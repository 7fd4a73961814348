"""NaN compares false every way round (IEEE, numpy, PyTorch): `x <= y` is not `!(x > y)`, and relu
keeps NaN (PyTorch's relu, numpy's maximum), with PyTorch's gradient."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from atensor import Tensor

X = np.array([np.nan, -1.0, 0.0, -0.0, 2.0, -np.inf, np.inf], dtype=np.float32)
Y = np.array([0.0, np.nan, 0.0, 1.0, np.inf, -np.inf, 2.0], dtype=np.float32)


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_comparisons_with_nan_match_numpy(op: str) -> None:
    f = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
         "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}[op]
    np.testing.assert_array_equal(f(Tensor(X), Tensor(Y)).numpy(), f(X, Y))
    np.testing.assert_array_equal(f(Tensor(X), 0.0).numpy(), f(X, np.float32(0.0)))
    np.testing.assert_array_equal(f(1.0, Tensor(X)).numpy(), f(np.float32(1.0), X))


def test_relu_keeps_nan_with_torchs_gradient() -> None:
    t = Tensor(X, requires_grad=True)
    y = t.relu()
    y.sum().backward()
    ref = torch.tensor(X, requires_grad=True)
    ry = ref.relu()
    ry.sum().backward()
    np.testing.assert_array_equal(y.numpy(), ry.detach().numpy())
    np.testing.assert_array_equal(t.grad.numpy(), ref.grad.numpy())
