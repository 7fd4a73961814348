"""backend/gemm/window.py: a convolution's forward as one small copy and a gemm per outer kernel offset
per sample, against the contraction computed in float64 by numpy (tests/tensor/test_api_conv.py has the
end-to-end comparisons with PyTorch)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atensor.backend.gemm import contraction

from atensor.backend.gemm import window as window_gemm
from atensor.backend.gemm.contraction import Contraction
from atensor.backend.gemm.window import WindowGemm
from atensor.graph.view import View, strides_for

RNG = np.random.default_rng(7)


def _conv_views(n: int, c: int, spatial: tuple[int, ...], o: int, kernel: tuple[int, ...],
                stride: tuple[int, ...], dilation: tuple[int, ...]):
    """conv2d's contraction views as tensor/windows.py makes them: the weight (1, 1, o, c, *kernel, 1...)
    broadcast and the input's window view (n, 1, 1, c, *kernel, *out), and the reduced axes."""
    out = tuple((s - d * (k - 1) - 1) // st + 1 for s, k, st, d in zip(spatial, kernel, stride, dilation))
    dims = len(kernel)
    shape = (n, 1, o, c, *kernel, *out)
    w_strides = strides_for((o, c, *kernel))
    weight = View(shape, (0, 0, *w_strides, *([0] * dims)))
    sp = strides_for(spatial)
    plane = math.prod(spatial)
    window = View(shape, (c * plane, 0, 0, plane, *(d * s for d, s in zip(dilation, sp)),
                          *(st * s for st, s in zip(stride, sp))))
    return weight, window, tuple(range(3, 4 + dims))


def _expected(a: np.ndarray, b: np.ndarray, va: View, vb: View, axes: tuple[int, ...]) -> np.ndarray:
    ra = np.lib.stride_tricks.as_strided(a, va.shape, tuple(s * a.itemsize for s in va.strides))
    rb = np.lib.stride_tricks.as_strided(b, vb.shape, tuple(s * b.itemsize for s in vb.strides))
    return (ra.astype(np.float64) * rb).sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c, spatial, kernel, stride, dilation, runs", [
    (6, (9, 8), (3, 2), (1, 1), (1, 1), True),
    (6, (11, 10), (3, 3), (1, 1), (2, 1), True),     # dilation: each offset reads every other row
    (6, (11, 10), (3, 3), (1, 2), (1, 1), True),     # a strided inner axis is copied, not looped
    (5, (20,), (4,), (1,), (3,), True),               # 1-D: the copy is the input itself
    (5, (12,), (4,), (1,), (3,), False),              # a copy no smaller than im2col's: im2col
    (3, (5, 6, 7), (2, 3, 2), (1, 1, 1), (1, 1, 2), True),  # 3-D: one gemm per depth offset
    (6, (11, 10), (3, 3), (2, 1), (1, 1), False),    # a strided outer axis: im2col as before
])
@pytest.mark.parametrize("n", [3, 1])
def test_a_window_gemm_equals_the_contraction(monkeypatch, dtype, c, spatial, kernel, stride, dilation, runs, n):
    monkeypatch.setattr(contraction, "CHUNK_BYTES", 1 << 8)
    monkeypatch.setattr(contraction, "KEPT_CHUNK_MIN_BYTES", 64)
    monkeypatch.setattr(window_gemm, "MIN_INNER", 2)
    o = 4
    va, vb, axes = _conv_views(n, c, spatial, o, kernel, stride, dilation)
    if n == 1:  # the View convention: a size-1 axis has stride 0
        va, vb = (View(v.shape, (0,) + v.strides[1:]) for v in (va, vb))
    x = RNG.standard_normal(n * c * math.prod(spatial)).astype(dtype)
    w = RNG.standard_normal(o * c * math.prod(kernel)).astype(dtype)
    plan = Contraction(va, vb, axes, np.dtype(dtype))
    assert plan.chunk == (0, 1) if n > 1 else (plan.chunk is not None or not runs)
    assert (plan.window is not None) == runs
    got = plan(w, x)
    assert got.dtype == dtype and got.shape == plan.keep
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, _expected(w, x, va, vb, axes), rtol=tol, atol=tol)
    again = plan(w, x[::-1].copy())  # a second call reuses nothing of the first's result
    np.testing.assert_allclose(again, _expected(w, x[::-1].copy(), va, vb, axes), rtol=tol, atol=tol)
    np.testing.assert_allclose(got, _expected(w, x, va, vb, axes), rtol=tol, atol=tol)


def test_only_a_forward_with_enough_inner_elements_per_gemm_runs_here():
    va, vb, axes = _conv_views(4, 1, (10, 10), 4, (3, 3), (1, 1), (1, 1))
    keep = tuple(1 if i in axes else s for i, s in enumerate(va.shape))
    assert WindowGemm.plan(va, vb, axes, keep, np.dtype(np.float32)) is None  # 1 * 3 < MIN_INNER
    va, vb, axes = _conv_views(4, 64, (10, 10), 4, (3, 3), (1, 1), (1, 1))
    assert WindowGemm.plan(va, vb, axes, keep, np.dtype(np.float32)) is not None
    assert WindowGemm.plan(va, vb, axes, keep, np.dtype(np.int32)) is None
    # the weight's gradient sums over the samples: not a forward
    shape = va.shape
    grad = View(shape, (4 * 64, 0, 64, 0, 0, 0, 8, 1))
    assert WindowGemm.plan(grad, vb, (0, 7, 8), tuple(1 if i in (0, 7, 8) else s for i, s in enumerate(shape)),
                           np.dtype(np.float32)) is None


def test_the_window_gemm_refuses_sources_too_small_for_its_views():
    va, vb, axes = _conv_views(2, 64, (6, 6), 4, (3, 3), (1, 1), (1, 1))
    keep = tuple(1 if i in axes else s for i, s in enumerate(va.shape))
    plan = WindowGemm.plan(va, vb, axes, keep, np.dtype(np.float32))
    assert plan is not None
    w = np.ones(4 * 64 * 9, np.float32)
    with pytest.raises(ValueError, match="window gemm"):  # the C call would read past the end
        plan(w, np.ones(2 * 64 * 36 - 1, np.float32))
    with pytest.raises(ValueError, match="window gemm"):
        plan(w[:-1], np.ones(2 * 64 * 36, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, step", [
    ((70, 3), (2, 1)), ((5000,), (3,)), ((4, 5, 6, 7, 8), (1, 2, 1, 3, 1)), ((9, 8, 7, 20), (1, 1, -1, 1)),
    ((2, 3, 4, 5, 6, 7), (1, 1, 1, 1, 1, 2)),
])
def test_the_c_gather_copies_any_strided_view_as_np_copyto_does(dtype, shape, step):
    from atensor.backend.gemm.window_c import gather, GATHER_MIN_SIZE
    base = RNG.standard_normal(tuple(n * abs(s) for n, s in zip(shape, step))).astype(dtype)
    view = base[tuple(slice(None, None, s) for s in step)]
    view = view.transpose(tuple(reversed(range(view.ndim)))) if view.ndim > 2 else view  # permuted too
    assert view.size >= GATHER_MIN_SIZE or view.size * 10 < GATHER_MIN_SIZE
    dst = np.empty(view.shape, dtype)
    gather(dst, view)
    np.testing.assert_array_equal(dst, view)
