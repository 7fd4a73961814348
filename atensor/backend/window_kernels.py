"""A C kernel for col2im: adding many strided windows of one array into another, in one foreign call.

Why: a convolution's input gradient adds, for every sample, one window of the column gradient per
kernel offset into the sample's input gradient (numpy_plans.RowsThenAddPads). In numpy that is one
np.add per window and sample: 3200 calls on MNIST's 128x32x24x24 layer with a 5x5 kernel, each on
12800 elements in rows of 20, measured at ~28 us a call (2 ns an element: numpy's loop overhead per
short row). One C call per sample runs all its windows at memory speed and with the GIL released.

The library is compiled on first use with the system C compiler (backend/native.py finds it and
keeps the cache directory), separately from the kernels' libraries, so it exists before any kernel
is compiled. Without a compiler, `add_windows` is None and callers use numpy.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

import numpy as np

from atensor.backend import native

SOURCE = r"""
#include <stdint.h>
typedef int64_t i64;
#define AT_ADD_WINDOWS(NAME, T)                                                                    \
void NAME(T *restrict dst, const T *restrict src, i64 count, i64 ndim, const i64 *shape,           \
          const i64 *dst_off, const i64 *dst_st, const i64 *src_off, const i64 *src_st) {         \
  for (i64 w = 0; w < count; w++) {                                                                \
    const i64 *sh = shape + w * ndim, *ds = dst_st + w * ndim, *ss = src_st + w * ndim;            \
    i64 idx[16] = {0}, outer = 1;                                                                  \
    for (i64 d = 0; d + 1 < ndim; d++) outer *= sh[d];                                             \
    i64 n = sh[ndim - 1], dl = ds[ndim - 1], sl = ss[ndim - 1];                                    \
    for (i64 o = 0; o < outer; o++) {                                                              \
      i64 dp = dst_off[w], sp = src_off[w];                                                        \
      for (i64 d = 0; d + 1 < ndim; d++) { dp += idx[d] * ds[d]; sp += idx[d] * ss[d]; }           \
      T *restrict to = dst + dp; const T *restrict from = src + sp;                                \
      if (dl == 1 && sl == 1) { for (i64 i = 0; i < n; i++) to[i] += from[i]; }                    \
      else { for (i64 i = 0; i < n; i++) to[i * dl] += from[i * sl]; }                             \
      for (i64 d = ndim - 2; d >= 0; d--) { if (++idx[d] < sh[d]) break; idx[d] = 0; }             \
    }                                                                                              \
  }                                                                                                \
}
AT_ADD_WINDOWS(atensor_add_windows_f32, float)
AT_ADD_WINDOWS(atensor_add_windows_f64, double)
"""
MAX_DIMS = 16

_lock = threading.Lock()
_functions: Optional[dict[np.dtype, ctypes._CFuncPtr]] = None
_tried = False


def _load() -> Optional[dict[np.dtype, ctypes._CFuncPtr]]:
    """The compiled functions by dtype (compiled once per machine and source), or None."""
    global _functions, _tried
    with _lock:
        if _tried:
            return _functions
        _tried = True
        try:
            lib = native.load_helper("windows", SOURCE)
        except Exception:  # noqa: BLE001 - no working compiler or loader: numpy does the adds
            return None
        functions = {}
        for dtype, name in ((np.dtype(np.float32), "atensor_add_windows_f32"),
                            (np.dtype(np.float64), "atensor_add_windows_f64")):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 5
            fn.restype = None
            functions[dtype] = fn
        _functions = functions
        return functions


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
