"""The gradient through a packed-weight matmul (graph/gradient.py's QMATMUL rule): x's gradient is the
output gradient times the decoded weights, as for a float32 matmul; the packed bytes get none. What a
LoRA on a quantized base model trains through."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1"])
def test_the_gradient_of_x_through_a_packed_matmul_is_numpys_with_the_decoded_weights(fmt):
    from atensor.graph import quant
    from atensor.nn.packed import PackedWeight
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((48, 64)).astype(np.float32)
    raw = gguf.quantize(weights, getattr(gguf.GGMLQuantizationType, fmt))
    w = PackedWeight.from_bytes(np.ascontiguousarray(raw).view(np.uint8).reshape(-1), getattr(quant, fmt),
                                rows=48, cols=64)
    decoded = w.dequantize().numpy()
    x_np = rng.standard_normal((2, 3, 64)).astype(np.float32)
    x = Tensor(x_np, requires_grad=True)
    y = w.linear(x)
    (y * y).sum().backward()
    want = 2 * (x_np @ decoded.T) @ decoded  # d/dx sum((x W^T)^2)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-3)
    assert w.packed.grad is None
