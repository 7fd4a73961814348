"""C kernels for im2col and col2im: copying a strided window view into a dense buffer, and adding
many strided windows of one array into another, each in one foreign call.

Why: a convolution's input gradient adds, for every sample, one window of the column gradient per
kernel offset into the sample's input gradient (numpy_plans.RowsThenAddPads). In numpy that is one
np.add per window and sample: 3200 calls on MNIST's 128x32x24x24 layer with a 5x5 kernel, each on
12800 elements in rows of 20, measured at ~28 us a call (2 ns an element: numpy's loop overhead per
short row). One C call per sample runs all its windows at memory speed and with the GIL released.
The forward's im2col is the reverse, a copy of one sample's window view (C, *kernel, *out) into a
dense scratch buffer before its gemm (backend/gemm/contraction.py): np.copyto walks it in rows of 20 elements too,
measured 21 ms of the 128 samples' copies where `gather` takes 11.6 ms (a loaded 2-core machine).

The library is compiled on first use with the system C compiler (backend/c/compiler.py finds it and
keeps the cache directory), separately from the kernels' libraries, so it exists before any kernel
is compiled. Without a compiler, `add_windows` is None and callers use numpy.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

import numpy as np

from atensor.backend.c import library

SOURCE = r"""
#include <stdint.h>
typedef int64_t i64;
/* each window: its last two axes one block of nested loops, the axes above an odometer that moves
   both pointers by their strides (a stride-2 convolution's rows are 4 elements long: recomputing the
   offsets from every index per row cost more than the adds) */
#define AT_ADD_WINDOWS(NAME, T)                                                                    \
void NAME(T *restrict dst, const T *restrict src, i64 count, i64 ndim, const i64 *shape,           \
          const i64 *dst_off, const i64 *dst_st, const i64 *src_off, const i64 *src_st) {         \
  for (i64 w = 0; w < count; w++) {                                                                \
    const i64 *sh = shape + w * ndim, *ds = dst_st + w * ndim, *ss = src_st + w * ndim;            \
    i64 idx[16] = {0}, outer = 1;                                                                  \
    i64 top = ndim > 1 ? ndim - 2 : 0;                                                             \
    for (i64 d = 0; d < top; d++) outer *= sh[d];                                                  \
    i64 n0 = sh[ndim - 1], d0 = ds[ndim - 1], s0 = ss[ndim - 1];                                   \
    i64 n1 = ndim > 1 ? sh[ndim - 2] : 1, d1 = ndim > 1 ? ds[ndim - 2] : 0, s1 = ndim > 1 ? ss[ndim - 2] : 0; \
    T *to_block = dst + dst_off[w]; const T *from_block = src + src_off[w];                        \
    for (i64 o = 0; o < outer; o++) {                                                              \
      T *to = to_block; const T *from = from_block;                                                \
      if (d0 == 1 && s0 == 1) {                                                                    \
        for (i64 j = 0; j < n1; j++, to += d1, from += s1) for (i64 i = 0; i < n0; i++) to[i] += from[i]; \
      } else {                                                                                     \
        for (i64 j = 0; j < n1; j++, to += d1, from += s1)                                         \
          for (i64 i = 0; i < n0; i++) to[i * d0] += from[i * s0];                                 \
      }                                                                                            \
      for (i64 d = top - 1; d >= 0; d--) {                                                         \
        to_block += ds[d]; from_block += ss[d];                                                    \
        if (++idx[d] < sh[d]) break;                                                               \
        to_block -= ds[d] * sh[d]; from_block -= ss[d] * sh[d]; idx[d] = 0;                        \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
}
AT_ADD_WINDOWS(atensor_add_windows_f32, float)
AT_ADD_WINDOWS(atensor_add_windows_f64, double)
/* dst (dense, row-major) = the view of src at these element strides. The last two axes are one block
   of nested loops (a window's rows of kw elements are often 2 to 5 long: an odometer step per row
   cost more than the copy), the axes above walk an odometer once per block. */
#define AT_GATHER(NAME, T)                                                                         \
void NAME(T *restrict dst, const T *restrict src, i64 ndim, const i64 *shape, const i64 *st) {      \
  i64 idx[16] = {0}, outer = 1;                                                                    \
  i64 n0 = shape[ndim - 1], s0 = st[ndim - 1];                                                     \
  i64 n1 = ndim > 1 ? shape[ndim - 2] : 1, s1 = ndim > 1 ? st[ndim - 2] : 0;                       \
  i64 top = ndim > 1 ? ndim - 2 : 0;                                                               \
  for (i64 d = 0; d < top; d++) outer *= shape[d];                                                 \
  const T *block = src;                                                                            \
  for (i64 o = 0; o < outer; o++) {                                                                \
    const T *row = block;                                                                          \
    if (s0 == 1) {                                                                                 \
      for (i64 j = 0; j < n1; j++, row += s1, dst += n0) for (i64 i = 0; i < n0; i++) dst[i] = row[i]; \
    } else {                                                                                       \
      for (i64 j = 0; j < n1; j++, row += s1, dst += n0)                                           \
        for (i64 i = 0; i < n0; i++) dst[i] = row[i * s0];                                         \
    }                                                                                              \
    for (i64 d = top - 1; d >= 0; d--) {                                                           \
      block += st[d];                                                                              \
      if (++idx[d] < shape[d]) break;                                                              \
      block -= st[d] * shape[d]; idx[d] = 0;                                                       \
    }                                                                                              \
  }                                                                                                \
}
AT_GATHER(atensor_gather_f32, float)
AT_GATHER(atensor_gather_f64, double)
/* A window contraction chunk by chunk (backend/gemm/window.py): for each chunk c, y = gather(src + c * src_step),
   then out_c = sum over t of A_t (m x k) . y[t * y_step:] (k x n, leading dimension ldy): one gemm per t,
   the first with beta 0, the rest adding into out_c (m x n, contiguous), at out + c * out_step. */
typedef void (*at_sgemm32)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                           float, float *, int);
typedef void (*at_sgemm64)(int, int, int, long long, long long, long long, float, const float *, long long,
                           const float *, long long, float, float *, long long);
typedef void (*at_dgemm32)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                           double, double *, int);
typedef void (*at_dgemm64)(int, int, int, long long, long long, long long, double, const double *, long long,
                           const double *, long long, double, double *, long long);
#define AT_WINDOW_GEMM(NAME, GATHER, T, G32, G64)                                                  \
void NAME(void *gemm, i64 ilp64, i64 chunks, const T *src, i64 src_step, i64 ndim, const i64 *shape,   \
          const i64 *st, T *y, const T *a, i64 taps, i64 m, i64 n, i64 k, i64 ldy, i64 y_step,       \
          T *out, i64 out_step) {                                                                  \
  for (i64 c = 0; c < chunks; c++) {                                                               \
    GATHER(y, src + c * src_step, ndim, shape, st);                                                \
    for (i64 t = 0; t < taps; t++) {                                                               \
      T beta = t ? 1 : 0;                                                                          \
      if (ilp64) ((G64)gemm)(101, 111, 111, m, n, k, 1, a + t * m * k, k, y + t * y_step, ldy, beta, \
                             out + c * out_step, n);                                               \
      else ((G32)gemm)(101, 111, 111, (int)m, (int)n, (int)k, 1, a + t * m * k, (int)k, y + t * y_step, \
                       (int)ldy, beta, out + c * out_step, (int)n);                                \
    }                                                                                              \
  }                                                                                                \
}
AT_WINDOW_GEMM(atensor_window_gemm_f32, atensor_gather_f32, float, at_sgemm32, at_sgemm64)
AT_WINDOW_GEMM(atensor_window_gemm_f64, atensor_gather_f64, double, at_dgemm32, at_dgemm64)
"""
MAX_DIMS = 16

_lock = threading.Lock()
_functions: Optional[dict[np.dtype, ctypes._CFuncPtr]] = None
_gathers: Optional[dict[np.dtype, ctypes._CFuncPtr]] = None
_window_gemms: dict[np.dtype, ctypes._CFuncPtr] = {}
_tried = False


def _load() -> Optional[dict[np.dtype, ctypes._CFuncPtr]]:
    """The compiled window-add functions by dtype (compiled once per machine and source), or None;
    the gathers go to `_gathers`, the window gemms to `_window_gemms`."""
    global _functions, _gathers, _tried
    with _lock:
        if _tried:
            return _functions
        _tried = True
        try:
            lib = library.load_helper("windows", SOURCE)
        except Exception:  # noqa: BLE001 - no working compiler or loader: numpy does the adds
            return None
        functions = {}
        for dtype, name in ((np.dtype(np.float32), "atensor_add_windows_f32"),
                            (np.dtype(np.float64), "atensor_add_windows_f64")):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 5
            fn.restype = None
            functions[dtype] = fn
        gathers = {}
        for dtype, name in ((np.dtype(np.float32), "atensor_gather_f32"),
                            (np.dtype(np.float64), "atensor_gather_f64")):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 2
            fn.restype = None
            gathers[dtype] = fn
        for dtype, name in ((np.dtype(np.float32), "atensor_window_gemm_f32"),
                            (np.dtype(np.float64), "atensor_window_gemm_f64")):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int64,
                                                                        ctypes.c_int64] + \
                [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 6 + [ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None
            _window_gemms[dtype] = fn
        _functions, _gathers = functions, gathers
        return functions


GATHER_MIN_SIZE = 4096  # below this np.copyto's call is as cheap as the foreign call
_gather_plans: dict[tuple, Optional[tuple[ctypes._CFuncPtr, np.ndarray, np.ndarray, int]]] = {}


def _gather_plan(source: np.ndarray) -> Optional[tuple[ctypes._CFuncPtr, np.ndarray, np.ndarray, int]]:
    """(function, shape, element strides, rank) that copy `source`'s layout, its adjacent axes merged
    where they chain; None when no compiled gather fits (dtype, rank, strides not whole elements)."""
    key = (source.dtype, source.shape, source.strides)
    if key in _gather_plans:
        return _gather_plans[key]
    plan = None
    item = source.itemsize
    if _load() is not None and _gathers is not None and source.dtype in _gathers and \
            all(s % item == 0 for s in source.strides):
        merged: list[list[int]] = []  # [size, element stride], size-1 axes left out
        for n, st in zip(source.shape, source.strides):
            if n == 1:
                continue
            if merged and merged[-1][1] == st // item * n:
                merged[-1] = [merged[-1][0] * n, st // item]
            else:
                merged.append([n, st // item])
        merged = merged or [[1, 1]]
        if len(merged) <= MAX_DIMS:
            plan = (_gathers[source.dtype], np.array([m[0] for m in merged], np.int64),
                    np.array([m[1] for m in merged], np.int64), len(merged))
    if len(_gather_plans) > 4096:  # many shapes (a long-running server): start over
        _gather_plans.clear()
    _gather_plans[key] = plan
    return plan


def window_gemm_function(dtype: np.dtype) -> Optional[ctypes._CFuncPtr]:
    """The compiled chunked window contraction of `dtype` (float32 or float64), or None."""
    _load()
    return _window_gemms.get(np.dtype(dtype))


def gather(dst: np.ndarray, source: np.ndarray) -> None:
    """dst[...] = source, for a C-contiguous `dst` of `source`'s shape and dtype: one C call when
    `source` is large and a compiled gather fits it, else np.copyto."""
    plan = _gather_plan(source) if source.size >= GATHER_MIN_SIZE else None
    if plan is None:
        np.copyto(dst, source)
        return
    fn, shape, strides, ndim = plan
    fn(dst.ctypes.data, source.ctypes.data, ndim, shape.ctypes.data, strides.ctypes.data)


class WindowAdds:
    """dst[window_k of dst] += src[window_k of src] for K windows given as (shape, dst offset, dst
    strides, src offset, src strides) in elements, all of one rank: `run(dst, src)` is one C call."""
    __slots__ = ("count", "ndim", "arrays", "fn")

    def __init__(self, windows: list[tuple[tuple[int, ...], int, tuple[int, ...], int, tuple[int, ...]]],
                 dtype: np.dtype):
        functions = _load() if windows else None
        self.fn = functions.get(np.dtype(dtype)) if functions else None
        # size-1 axes add nothing but loop overhead (a strided convolution's frame has them innermost):
        # dropped, and every window given the same rank with leading size-1 axes
        squeezed = []
        for shape, d_off, d_st, s_off, s_st in windows:
            axes = [i for i, n in enumerate(shape) if n != 1] or [len(shape) - 1]
            squeezed.append(([shape[i] for i in axes], d_off, [d_st[i] for i in axes], s_off, [s_st[i] for i in axes]))
        ndim = max((len(w[0]) for w in squeezed), default=0)
        windows = [([1] * (ndim - len(sh)) + sh, d_off, [0] * (ndim - len(sh)) + ds, s_off,
                    [0] * (ndim - len(sh)) + ss) for sh, d_off, ds, s_off, ss in squeezed]
        if self.fn is None or not 0 < ndim <= MAX_DIMS:
            self.fn = None
            return
        self.count, self.ndim = len(windows), ndim
        as_i64 = lambda values: np.ascontiguousarray(np.array(values, dtype=np.int64).reshape(-1))
        self.arrays = [as_i64([w[0] for w in windows]), as_i64([w[1] for w in windows]),
                       as_i64([w[2] for w in windows]), as_i64([w[3] for w in windows]),
                       as_i64([w[4] for w in windows])]

    @property
    def available(self) -> bool:
        """False when there is no compiled function for this dtype or rank (use numpy)."""
        return self.fn is not None

    def run(self, dst: np.ndarray, src: np.ndarray) -> None:
        """The adds, into the C-contiguous `dst` from the C-contiguous `src`."""
        shape, d_off, d_st, s_off, s_st = (a.ctypes.data for a in self.arrays)
        self.fn(dst.ctypes.data, src.ctypes.data, self.count, self.ndim, shape, d_off, d_st, s_off, s_st)
