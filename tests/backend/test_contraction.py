"""backend/gemm/contraction.py: chunked contractions (a convolution's im2col operand) against np.einsum, and
numpy_plans.AddPads (col2im) against adding the zero-padded arrays one by one."""
from __future__ import annotations

import numpy as np
import pytest

from atensor.backend.gemm import contraction
from atensor.backend.gemm.contraction import Contraction
from atensor.backend.numpy.plans import AddPads, Window
from atensor.graph.view import View

RNG = np.random.default_rng(5)


def _window_conv(n: int, c: int, h: int, w: int, o: int, k: int, stride: int, dilation: int):
    """The views of conv2d's contraction: the weight (1, o, c, k, k, 1, 1) broadcast and the input's
    overlapping window view (n, 1, c, k, k, oh, ow), and the einsum that computes the same."""
    oh, ow = (h - dilation * (k - 1) - 1) // stride + 1, (w - dilation * (k - 1) - 1) // stride + 1
    shape = (n, o, c, k, k, oh, ow)
    weight = View(shape, (0, c * k * k, k * k, k, 1, 0, 0))
    window = View(shape, (c * h * w, 0, h * w, dilation * w, dilation, stride * w, stride))
    return weight, window, shape


def _expected(a: np.ndarray, b: np.ndarray, va: View, vb: View, axes: tuple[int, ...]) -> np.ndarray:
    ra = np.lib.stride_tricks.as_strided(a, va.shape, tuple(s * a.itemsize for s in va.strides))
    rb = np.lib.stride_tricks.as_strided(b, vb.shape, tuple(s * b.itemsize for s in vb.strides))
    return (ra.astype(np.float64) * rb).sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("chunk_bytes", [1 << 10, 1 << 14, 1 << 40])
@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2)])
def test_a_window_contraction_equals_einsum_whether_chunked_or_not(monkeypatch, chunk_bytes, stride, dilation):
    monkeypatch.setattr(contraction, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(contraction, "KEPT_CHUNK_MIN_BYTES", 64)
    n, c, h, w, o, k = 3, 4, 9, 8, 5, 3
    x = RNG.standard_normal(n * c * h * w).astype(np.float32)
    wt = RNG.standard_normal(o * c * k * k).astype(np.float32)
    va, vb, shape = _window_conv(n, c, h, w, o, k, stride, dilation)
    forward = Contraction(va, vb, (2, 3, 4), np.dtype(np.float32))
    if chunk_bytes in (1 << 10, 1 << 40):  # the windows take ~5-17 KB: chunked, and not
        assert (forward.chunk is not None) == (chunk_bytes == 1 << 10)
    np.testing.assert_allclose(forward(wt, x), _expected(wt, x, va, vb, (2, 3, 4)), rtol=1e-5, atol=1e-5)
    # the weight's gradient: the upstream gradient against the windows, summed over (n, oh, ow), an
    # inner axis the chunks add up along
    dy = RNG.standard_normal(n * o * shape[5] * shape[6]).astype(np.float32)
    vg = View(shape, (o * shape[5] * shape[6], shape[5] * shape[6], 0, 0, 0, shape[6], 1))
    grad_w = Contraction(vg, vb, (0, 5, 6), np.dtype(np.float32))
    np.testing.assert_allclose(grad_w(dy, x), _expected(dy, x, vg, vb, (0, 5, 6)), rtol=1e-4, atol=1e-4)
    # the columns' gradient: the upstream gradient against the weight, summed over o
    grad_cols = Contraction(vg, va, (1,), np.dtype(np.float32))
    np.testing.assert_allclose(grad_cols(dy, wt), _expected(dy, wt, vg, va, (1,)), rtol=1e-5, atol=1e-5)


def test_a_chunk_copy_reuses_the_threads_scratch_and_the_results_stay_independent(monkeypatch):
    monkeypatch.setattr(contraction, "CHUNK_BYTES", 1 << 10)
    va, vb, _ = _window_conv(2, 3, 7, 7, 4, 3, 1, 1)
    plan = Contraction(va, vb, (2, 3, 4), np.dtype(np.float32))
    x1, x2 = (RNG.standard_normal(2 * 3 * 7 * 7).astype(np.float32) for _ in range(2))
    wt = RNG.standard_normal(4 * 3 * 9).astype(np.float32)
    first = plan(wt, x1)
    second = plan(wt, x2)
    np.testing.assert_allclose(first, _expected(wt, x1, va, vb, (2, 3, 4)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, _expected(wt, x2, va, vb, (2, 3, 4)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_base", [False, True])
@pytest.mark.parametrize("slab", [1, 64, 1 << 20])
def test_add_pads_equals_adding_each_zero_padded_window(monkeypatch, with_base, slab):
    monkeypatch.setattr("atensor.backend.numpy.plans.ADD_PADS_SLAB_BYTES", slab)
    source = RNG.standard_normal((5, 3, 2, 2, 4, 4)).astype(np.float32)  # (n, c, kh, kw, oh, ow) columns
    windows, want = [], np.zeros((5, 3, 5, 5), np.float32)
    base = RNG.standard_normal((5, 3, 5, 5)).astype(np.float32)
    if with_base:
        want += base
    for a in range(2):
        for b in range(2):
            piece = View(source.shape, tuple(s // 4 for s in source.strides)).shrink(
                ((0, 5), (0, 3), (a, a + 1), (b, b + 1), (0, 4), (0, 4))).reshape((5, 3, 4, 4))
            windows.append(Window(piece.pad(((0, 0), (0, 0), (a, 1 - a), (b, 1 - b)))))
            want[:, :, a:a + 4, b:b + 4] += source[:, :, a, b]
    plan = AddPads(windows, (5, 3, 5, 5), np.dtype(np.float32))
    assert plan.adds is not None  # the C path, where a compiler exists; the numpy path below
    got = plan(base.copy() if with_base else None, True, np.dtype(np.float32), *([source] * 4))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    copies = [source.copy() for _ in range(4)]  # distinct sources: the numpy slabs
    got = plan(base.copy() if with_base else None, True, np.dtype(np.float32), *copies)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [2, 6])
def test_a_result_led_by_the_samples_axis_is_one_gemm_per_sample_in_the_outputs_order(n):
    # the column gradient (n, c, k, k, oh, ow): rows (n, oh, ow) of the upstream gradient, columns (c, k,
    # k) of the weight; one gemm can only write (n, oh, ow, c, k, k), a gemm per sample writes it in order
    c, o, k, oh = 3, 5, 3, 4
    shape = (n, o, c, k, k, oh, oh)
    vg = View(shape, (o * oh * oh, oh * oh, 0, 0, 0, oh, 1))
    vw = View(shape, (0, c * k * k, k * k, k, 1, 0, 0))
    plan = Contraction(vg, vw, (1,), np.dtype(np.float32))
    assert plan.groups[0] == 1 and plan.perm is None
    dy = RNG.standard_normal(n * o * oh * oh).astype(np.float32)
    wt = RNG.standard_normal(o * c * k * k).astype(np.float32)
    got = plan(dy, wt)
    assert got.flags.c_contiguous  # the next kernel (col2im) reads it without a copy
    np.testing.assert_allclose(got, _expected(dy, wt, vg, vw, (1,)), rtol=1e-5, atol=1e-5)
    # too small a gemm per sample: one gemm and a transposed result, as before
    small = (n, o, 1, 1, 2, oh, 1)
    plan = Contraction(View(small, (o * oh, oh, 0, 0, 0, 1, 0)), View(small, (0, 2, 0, 0, 1, 0, 0)), (1,),
                       np.dtype(np.float32))
    assert plan.groups[0] == 0
