"""`WindowGemm`: a convolution's forward contraction as a few gemms per sample over a small copy.

Why: the forward contracts the weight (Cout, C, *kernel) with the sliding-window view (N, C, *kernel,
*out) of the input. Copied whole per sample (im2col, backend/gemm/contraction.py), the window view is the input
times the kernel's size (25x for 5x5) and the copy costs about a third of the gemm: MNIST's
128x32x24x24 5x5 layer spent ~12 ms copying 164 MB next to ~37 ms of sgemm. But the window view's
outer kernel axis (kh) and outer output axis (oh) walk the same input rows: for each kh, the matrix
(C, kw) x (oh, ow) is a plain strided matrix of one copy Y (C, kw, H, ow) of the input that only
unfolds the inner kernel axes (5x the input, which stays in L2). So the forward is, per sample, one
copy of Y and one gemm per outer kernel offset `t` adding into the sample's output, the weight's
slice W[:, :, t] (Cout x C*kw) times Y read from row t (leading dimension H * ow). Measured on that
layer, one thread, a loaded 2-core machine: 47-55 ms where the whole im2col copy and one gemm took
53-62 ms (the gemms with K = 160 run near the K = 800 one's speed: 67 vs 69 GFLOP/s).

It is one foreign call per contraction (backend/gemm/window_c.py: the copies and the gemms of every sample,
with the GIL released), planned once when the kernel is rendered. `WindowGemm.plan` takes only what
it can say exactly: axis 0 kept (the samples), the weight the same for every sample, no batch axis
(one group), the result's (rows, cols) laid out as the kernel's output, the window axis pair (t, p)
with stride(t) a multiple m of stride(p) and p the first output axis of the window (so rows t * m ...
of Y are the t-th matrix), gemms with at least `MIN_INNER` inner elements, and a window large enough
that backend/gemm/contraction.py chunks it (a smaller one fits in cache whole, and its one big gemm measured as
fast or faster). Anything else stays with backend/gemm/contraction.py's im2col.

Invariant: Y's p axis has (n_t - 1) * m + n_p rows (the union of what every t reads), so the copy
reads exactly the elements the window view reads, never outside its source.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from atensor.backend.gemm import openblas
from atensor.backend.gemm.axes import contraction_groups
from atensor.backend.gemm.window_c import window_gemm_function
from atensor.graph.view import View

# a gemm with fewer inner elements runs too far below BLAS's speed: im2col instead. Measured (one thread,
# im2col -> window gemms, ms): K' = C * kw of 192: 17.9 -> 15.8, 96: 5.2 -> 4.5, 24: 1.72 -> 1.24, 5 (MNIST's
# first layer, 128x1x28x28 k5): 6.0 -> 2.7, 3: 0.75 -> 0.76
MIN_INNER = 4


class WindowGemm:
    """sum(a * b, axes) for the weight view `a` and the window view `b` (module docstring), run by
    `__call__` into a new array of the contraction's keepdims shape."""

    def __init__(self, fn: Any, blas: openblas.BlasFunctions, a_view: View, b_view: View, keep: tuple[int, ...],
                 dtype: np.dtype, rows: list[int], inner: list[int], own: list[int], t: int, m: int):
        shape = a_view.shape
        self.fn, self.gemm, self.ilp64 = fn, blas.sgemm if dtype == np.float32 else blas.dgemm, int(blas.ilp64)
        self.keep, self.dtype = keep, dtype
        self.chunks = shape[0]  # the samples (1: one gemm chain)
        p, rest = own[0], own[1:]
        rest_size = math.prod(shape[i] for i in rest)
        y_rows = (shape[t] - 1) * m + shape[p]
        kept_inner = [i for i in inner if i != t]
        # Y: the window without axis t, its p axis grown to every row some t reads; copied dense
        y_axes = kept_inner + [p] + rest
        self.y_shape = tuple(y_rows if i == p else shape[i] for i in y_axes)
        self.y_view = (b_view.offset, tuple(b_view.strides[i] for i in y_axes))
        self.y_arrays = (np.array(self.y_shape, np.int64), np.array(self.y_view[1], np.int64))  # for the C call
        self.src_step = b_view.strides[0] if shape[0] > 1 else 0
        self.taps, self.m = shape[t], math.prod(shape[i] for i in rows)
        self.n, self.k = shape[p] * rest_size, math.prod(shape[i] for i in kept_inner)
        self.ldy, self.y_step = y_rows * rest_size, m * rest_size
        # the weight as (t, rows, inner without t), dense: the t-th gemm's left operand
        w_axes = [t] + rows + kept_inner
        self.w_view = (a_view.offset, tuple(shape[i] for i in w_axes), tuple(a_view.strides[i] for i in w_axes))
        self.out_step = self.m * self.n

    @staticmethod
    def plan(a_view: View, b_view: View, axes: tuple[int, ...], keep: tuple[int, ...],
             dtype: np.dtype) -> Optional["WindowGemm"]:
        """The plan for this contraction, or None when it is not a convolution forward this class
        runs exactly (module docstring)."""
        fn = window_gemm_function(dtype) if dtype in (np.float32, np.float64) else None
        blas = openblas.functions() if fn is not None else None
        shape = a_view.shape
        if blas is None or not shape or 0 in axes:
            return None
        if shape[0] > 1 and (a_view.strides[0] != 0 or b_view.strides[0] <= 0):
            return None  # the weight is the same for every sample, each sample's window further on
        if a_view.mask is not None or b_view.mask is not None or a_view.variables() or b_view.variables():
            return None
        if not all(isinstance(v, int) for v in (a_view.offset, b_view.offset, *a_view.strides, *b_view.strides)):
            return None
        batch, rows, inner, cols = contraction_groups(a_view, b_view, axes)
        lead = [0] if shape[0] > 1 else []
        own = cols[len(lead):]  # the window's own output axes, the samples' axis left out
        if batch or not rows or not inner or not own or cols[:len(lead)] != lead or len(keep) != len(shape):
            return None
        if any(i in axes for i in rows + cols) or any(shape[i] != 1 and i not in inner for i in axes):
            return None
        # the output is (samples, rows, cols): the kernel's own layout of the kept axes
        if sorted(rows + cols) != lead + rows + own:
            return None
        p = own[0]
        sp = b_view.strides[p]
        pairs = [i for i in inner if b_view.strides[i] > 0 and sp > 0 and b_view.strides[i] % sp == 0]
        if not pairs or any(b_view.strides[i] < 0 for i in inner + cols):
            return None
        t = min(pairs, key=lambda i: b_view.strides[i])  # the outer kernel axis, not the channels
        m = b_view.strides[t] // sp
        if math.prod(shape[i] for i in inner if i != t) < MIN_INNER:
            return None
        y_size = math.prod(shape[i] for i in inner + own if i != t) // shape[p] * ((shape[t] - 1) * m + shape[p])
        if y_size >= math.prod(shape[i] for i in inner + own):
            return None  # the copy would be no smaller than im2col's
        return WindowGemm(fn, blas, a_view, b_view, keep, np.dtype(dtype), rows, inner, own, t, m)

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The contraction of the weight's source `x` and the window's source `y`, keepdims shape."""
        fx, fy = _flat(x, self.dtype), _flat(y, self.dtype)
        offset, shape, strides = self.w_view
        y_offset, y_strides = self.y_view
        # both reads must lie inside their sources (the views and the invariant say they do): checked,
        # as C reads what it is told
        last_w = offset + sum((n - 1) * s for n, s in zip(shape, strides))
        last = y_offset + (self.chunks - 1) * self.src_step + sum((n - 1) * s for n, s in zip(self.y_shape, y_strides))
        if last_w >= fx.size or last >= fy.size:
            raise ValueError(f"window gemm: the views read elements {last_w} and {last} of sources of {fx.size} "
                             f"and {fy.size}: a planning bug, please report it with the convolution's shapes")
        item = fx.itemsize
        weight = np.ascontiguousarray(np.lib.stride_tricks.as_strided(
            fx[offset:], shape, tuple(s * item for s in strides)))
        scratch = np.empty(self.y_shape, self.dtype)
        out = np.empty(self.keep, self.dtype)
        y_shape, y_st = self.y_arrays
        self.fn(self.gemm, self.ilp64, self.chunks, fy.ctypes.data + y_offset * item, self.src_step,
                len(self.y_shape), y_shape.ctypes.data, y_st.ctypes.data, scratch.ctypes.data,
                weight.ctypes.data, self.taps, self.m, self.n, self.k, self.ldy, self.y_step,
                out.ctypes.data, self.out_step)
        return out


def _flat(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`x` as a C-contiguous 1-D array of `dtype`."""
    flat = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
    return flat if flat.dtype == dtype else flat.astype(dtype)
