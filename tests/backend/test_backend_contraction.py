"""The numpy backend's contraction path (a matmul-shaped reduce becomes np.matmul on BLAS), its
in-place reuse of temporaries and its chunked elementwise regions, against numpy.

Written for the transformer of atensor/models/bert.py, whose linear layers, attention products and
long elementwise chains (GELU) are exactly these shapes.
"""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.backend.numpy.render import _contract, _sum_of_product

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


# ---- elementwise regions computed in cache-sized chunks (numpy_backend._elementwise_regions) ----------

def test_long_elementwise_chain_over_a_large_array_matches_numpy():
    from atensor.backend.numpy.render import CHUNK_ELEMENTS
    x, bias = rand(8, 64, 512), rand(512)
    assert x.size >= 4 * CHUNK_ELEMENTS  # large enough to be chunked
    t = Tensor(x) + Tensor(bias)
    ax = t.maximum(-t)
    out = (t.maximum(0.0) - ax * (ax * ax * -0.5).exp() * 0.25 + (ax + 1.0).reciprocal()).numpy()
    y = x + bias
    a = np.abs(y)
    want = np.maximum(y, 0) - a * np.exp(a * a * -0.5) * 0.25 + 1 / (a + 1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_region_values_read_after_the_region_are_kept_whole():
    # `s` is made inside a chunked region and read again by a reduce and by a later elementwise op
    x = rand(4, 96, 384)
    s = (Tensor(x) * 2.0 + 1.0).exp() * 0.5
    total = s.sum(-1, keepdim=True)
    out = (s / total + s * 3.0).numpy()
    sn = np.exp(x * 2 + 1) * 0.5
    np.testing.assert_allclose(out, sn / sn.sum(-1, keepdims=True) + sn * 3, rtol=2e-5)


def test_region_with_comparisons_where_and_casts_matches_numpy():
    x = rand(3, 128, 400)
    t = Tensor(x)
    out = ((t > 0.5).where(t * 2.0, -t) + (t < 0).cast("float32") * 10.0 - 1.0).numpy()
    want = np.where(x > 0.5, x * 2, -x) + (x < 0).astype(np.float32) * 10 - 1
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_chunk_plan_keeps_chunks_near_the_target_size():
    from atensor.backend.numpy.render import CHUNK_ELEMENTS, _chunk_plan
    assert _chunk_plan((16, 128)) is None  # too small to gain
    axis, step = _chunk_plan((48, 24, 1536))
    assert axis == 0 and step == 1
    axis, step = _chunk_plan((1, 512, 1536))
    assert axis == 1 and step * 1536 <= CHUNK_ELEMENTS


def test_a_summed_axis_that_both_operands_broadcast_multiplies_the_product():
    """sum over an axis of size 5 that neither operand varies along: 5 times the matrix product, not a
    gemm that drops the axis (found by the native tier's differential tests)."""
    a = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    ta = Tensor(a).reshape(16, 1, 8, 1).expand(16, 5, 8, 16)
    tb = Tensor(b).reshape(1, 1, 8, 16).expand(16, 5, 8, 16)
    np.testing.assert_allclose((ta * tb).sum((1, 2)).numpy().reshape(16, 16), 5 * (a @ b), rtol=1e-4, atol=1e-4)


def test_a_reduce_of_a_cast_one_element_value():
    assert Tensor(np.array([[-0.68]], dtype=np.float32)).any(1).tolist() == [True]
    assert Tensor(np.array([[0.0]], dtype=np.float32)).any(1).tolist() == [False]
