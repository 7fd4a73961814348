"""The numpy backend's contraction path (a matmul-shaped reduce becomes np.matmul on BLAS) and its
in-place reuse of temporaries, against numpy.

Written for the transformer of atensor/models/bert.py, whose linear layers, attention products and
long elementwise chains (GELU) are exactly these shapes.
"""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.hcq.numpy_backend import _contract, _sum_of_product

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((5, 7), (7, 3)),            # plain
    ((2, 3, 5, 7), (7, 4)),      # a linear layer on (B, L, in)
    ((2, 3, 5, 7), (2, 3, 7, 4)),  # attention-like batched product
    ((3, 1, 5, 7), (1, 4, 7, 2)),  # batch broadcast on both sides
    ((7,), (7, 3)),              # vector @ matrix
    ((5, 7), (7,)),              # matrix @ vector
    ((1, 7), (7, 1)),            # one row, one column
])
def test_matmul_matches_numpy(a_shape, b_shape):
    a, b = rand(*a_shape), rand(*b_shape)
    got = (Tensor(a) @ Tensor(b)).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_of_permuted_and_transposed_views_matches_numpy():
    q, k, v = rand(2, 6, 3, 4), rand(2, 6, 3, 4), rand(2, 6, 3, 4)  # (B, L, H, D)
    tq, tk, tv = (Tensor(x).permute(0, 2, 1, 3) for x in (q, k, v))  # (B, H, L, D), strided views
    got = ((tq @ tk.transpose(-1, -2)) @ tv).numpy()
    nq, nk, nv = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    np.testing.assert_allclose(got, (nq @ nk.swapaxes(-1, -2)) @ nv, rtol=1e-4, atol=1e-5)


def test_linear_layer_with_transposed_weight_matches_numpy():
    x, w, bias = rand(4, 9, 16), rand(12, 16), rand(12)
    got = (Tensor(x) @ Tensor(w).T + Tensor(bias)).numpy()
    np.testing.assert_allclose(got, x @ w.T + bias, rtol=1e-5, atol=1e-5)


def test_contract_puts_result_axes_in_increasing_order():
    # a: axes (0, 2), b: axes (1, 2); reduce 2 -> result axes (0, 1): an outer-shaped matmul
    a, b = rand(3, 5), rand(4, 5)
    result, axes = _contract(a, [0, 2], b, [1, 2], (2,))
    assert axes == [0, 1]
    np.testing.assert_allclose(result, a @ b.T, rtol=1e-5, atol=1e-5)
    # rows after columns in axis order: the result is transposed back
    result, axes = _contract(a, [1, 2], b, [0, 2], (2,))
    assert axes == [0, 1]
    np.testing.assert_allclose(result, (a @ b.T).T, rtol=1e-5, atol=1e-5)


def test_one_sided_reduction_falls_back_to_einsum():
    a = np.broadcast_to(rand(3, 1, 5), (3, 4, 5))
    b = np.broadcast_to(rand(1, 4, 1), (3, 4, 5))
    got = _sum_of_product(a, b, (1, 2), np.dtype(np.float32))
    np.testing.assert_allclose(got, (a * b).sum((1, 2), keepdims=True), rtol=1e-5, atol=1e-5)


def test_elementwise_chain_reusing_temporaries_keeps_shared_values():
    # t is read by two later ops: it must not be overwritten in place by the first of them
    x = rand(64, 33)
    t = Tensor(x).exp()
    got = ((t * 2.0 + 1.0).sqrt() + t.reciprocal() * t).numpy()
    e = np.exp(x)
    np.testing.assert_allclose(got, np.sqrt(e * 2 + 1) + (1 / e) * e, rtol=1e-5)


def test_inputs_are_not_written_by_an_elementwise_chain():
    x = rand(128)
    t = Tensor(x)
    out = ((t + 1.0) * 3.0 - t).numpy()
    np.testing.assert_allclose(out, (x + 1) * 3 - x, rtol=1e-6)
    np.testing.assert_array_equal(t.numpy(), x)
