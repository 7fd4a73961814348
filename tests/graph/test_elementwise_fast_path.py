"""The elementwise fast paths (Node.make's inline inference, tensor/elementwise.py's same-shape operands)
give what the general rules give: the same dtypes and values (numpy as the reference) and the same errors."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, GraphError, Node
from atensor.graph.ops import Ops


def _buffer(dtype=dtypes.float32, size: int = 4, device: str = "CPU") -> Node:
    return BufferSpec(device, size, dtype).node(0)


@pytest.mark.parametrize("op, src, message", [
    (Ops.ADD, lambda: (_buffer(), _buffer(dtypes.int32)), "dtype mismatch"),
    (Ops.MUL, lambda: (_buffer(), _buffer(size=5)), "shape mismatch"),
    (Ops.WHERE, lambda: (_buffer(), _buffer(), _buffer()), "bool condition"),
    (Ops.ADD, lambda: (_buffer(), _buffer(device="CPU:1")), "different devices"),
])
def test_an_invalid_elementwise_node_still_raises_naming_the_problem(op, src, message):
    with pytest.raises(GraphError, match=message):
        Node.make(op, dtypes.float32, src())


def test_a_fast_node_has_its_sources_shape_and_device_and_is_interned():
    a, b = _buffer(size=6), _buffer(size=6)
    made = Node.make(Ops.ADD, dtypes.float32, (a, b))
    assert (made.shape, made.device) == ((6,), "CPU")
    assert Node.make(Ops.ADD, dtypes.float32, (a, b)) is made
    assert Node.make(Ops.ADD, dtypes.float32, (b, a)) is not made  # source order is part of the node
    assert Node.make(Ops.SUB, dtypes.float32, (a, b)) is not made
    assert Node.make(Ops.CMPLT, dtypes.bool, (a, b)).dtype == dtypes.bool


INT8 = np.array([-128, -1, 0, 127], dtype=np.int8)
F32 = np.array([-1.5, 0.0, 2.0, 3.25], dtype=np.float32)
I32 = np.array([-3, 0, 2, 7], dtype=np.int32)


@pytest.mark.parametrize("build, expect", [
    (lambda: Tensor(INT8) + 1, INT8 + np.int8(1)),                        # weak int in range: int8
    (lambda: Tensor(INT8) + 300, INT8 + np.int8(44)),                     # out of range: wraps (general path)
    (lambda: Tensor(I32) + 2.5, I32.astype(np.float32) + np.float32(2.5)),  # float scalar: default float
    (lambda: Tensor(F32) * 2, F32 * np.float32(2)),
    (lambda: 1 - Tensor(F32), np.float32(1) - F32),                        # reversed operands
    (lambda: Tensor(F32) * Tensor(F32.astype(np.float16)), F32 * F32.astype(np.float16).astype(np.float32)),
    (lambda: Tensor(I32) / 2, I32.astype(np.float32) / np.float32(2)),
    (lambda: Tensor(F32) / Tensor(F32 + 1), F32 / (F32 + 1)),
    (lambda: Tensor(I32).relu(), np.maximum(I32, 0)),
    (lambda: Tensor(F32).relu(), np.maximum(F32, 0)),
    (lambda: (Tensor(I32) > 0).where(Tensor(I32), 0.5), np.where(I32 > 0, I32, 0.5).astype(np.float32)),
    (lambda: Tensor(F32) < 1, F32 < 1),
    (lambda: Tensor(I32).exp(), np.exp(I32.astype(np.float32))),
    (lambda: Tensor(F32) + Tensor(F32.reshape(1, 4) * 0 + 1).reshape(4), F32 + 1),
])
def test_elementwise_results_match_numpy_in_value_and_dtype(build, expect):
    out = build()
    assert out.dtype.np == expect.dtype
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-6)


def test_a_tensor_made_by_an_op_starts_without_gradient_state_and_requires_grad_still_registers():
    x = Tensor(F32, requires_grad=True)
    y = x * 2 + 1
    assert y.requires_grad is None and y.grad is None
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 2, np.float32))
