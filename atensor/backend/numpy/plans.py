"""Work the numpy backend does once, when it renders a kernel, instead of on every call.

A kernel of the flagship MLP's training step runs in tens of microseconds, so the Python around each
numpy call matters as much as the call: `as_strided` costs ~6 us where the `np.ndarray` constructor
costs ~1 us, deciding whether a view is a reshape costs ~2 us of View properties, planning a matmul
(squeeze, transposes, reshapes) ~25 us. The shapes and strides of every view are known when the
kernel is rendered, so each decision is taken there and stored in a small plan object the generated
code calls:

- `Window`: one concrete view read from (or written into) a flat source: a reshape, a strided window
  or a zero-padded copy.
- `Contraction` (backend/gemm/contraction.py): a matmul-shaped reduce, sum(a * b, axes) over two broadcast views,
  as np.matmul calls on the views' sources, chunked when an operand (a convolution's im2col) must be
  copied.
- `add_window`: x + pad(y) as an in-place add into the padded region (a concatenation, e.g. the
  gradients of parameters packed in one buffer, is a sum of such pads).

And two numpy calls that are far slower than they need be:
- `where`: np.where branches per element; on a random condition (ReLU's backward) it runs ~7x
  slower than a branch-free select of the bits, ((x ^ y) * cond) ^ y, exact for every dtype.
- `max_last`: np.maximum.reduce along a short last axis (a softmax over 10 classes) costs ~100 ns per
  row; reducing the transposed copy along its first axis is elementwise and ~4x faster.
Views with symbolic offsets have no concrete plan; the backend renders them the general way.

And one process setting (`keep_freed_memory`): every numpy call allocates its result, and glibc
malloc serves an array over 128 KiB with a fresh mmap and, once two such arrays are freed, returns
the heap's top to the OS: each 256 KiB temporary then costs ~100 us of page faults, more than the
arithmetic. Raising malloc's mmap and trim thresholds keeps freed memory for the next kernel (up to
`settings.malloc_keep_bytes`): measured 1.6x on the MLP's backward kernel.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

from atensor.backend.gemm.contraction import Contraction, blasable, contraction_groups
from atensor.backend.gemm.window_c import WindowAdds
from atensor.graph.view import View, strides_for

_SAME_SIZE_INT = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
WHERE_MIN_SIZE = 1024  # below this np.where's single call beats the select's four


def strided(flat: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """The window of the contiguous 1-D `flat` at element `offset` with element `strides`; no copy."""
    item = flat.itemsize
    byte_strides = tuple(s * item for s in strides)
    try:  # the constructor checks the window lies inside `flat`, and is ~6x cheaper than as_strided
        return np.ndarray(shape, flat.dtype, flat, offset * item, byte_strides)
    except (TypeError, ValueError):  # not a buffer numpy can wrap (e.g. read-only): the general way
        return as_strided(flat[offset:], shape, byte_strides)


# views at symbolic offsets (evaluated per call) are read and written the general way:
def view_of(x: np.ndarray, view: View) -> np.ndarray:
    """`x` (any array, read in row-major order) seen through `view`, without copying unless padded."""
    if view.mask is None and view.offset == 0 and view.size == x.size and view.contiguous:
        return x.reshape(view.shape)  # a reshape: numpy copies only when x's strides cannot say it
    flat = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
    if view.size == 0:
        return np.empty(view.shape, dtype=x.dtype)
    if view.mask is None:
        return strided(flat, view.offset, view.shape, view.strides)
    out = np.zeros(view.shape, dtype=x.dtype)
    if any(b >= e for b, e in view.mask):
        return out
    inner = View(view.shape, view.strides, view.offset, None).shrink(view.mask)
    out[tuple(slice(b, e) for b, e in view.mask)] = strided(flat, inner.offset, inner.shape, inner.strides)
    return out


def target_of(buf: np.ndarray, view: View) -> np.ndarray:
    """The writable array `view` selects in `buf` (a store target: never masked)."""
    if view.contiguous:
        return buf[view.offset:view.offset + view.size].reshape(view.shape)
    return strided(buf, view.offset, view.shape, view.strides)


def store_into(buf: np.ndarray, view: View, value: np.ndarray) -> None:
    """Writes `value` into the elements `view` selects in `buf` (a store target: never masked)."""
    if view.size == 0:
        return
    if view.contiguous:
        target = buf[view.offset:view.offset + view.size].reshape(view.shape)
    else:
        target = strided(buf, view.offset, view.shape, view.strides)
    np.copyto(target, value, casting="unsafe")



class Window:
    """How to read a concrete `view` of a source array (any array, read in row-major order)."""
    __slots__ = ("view", "shape", "size", "reshape", "offset", "strides", "pad", "inner")

    def __init__(self, view: View):
        assert not view.variables(), "a symbolic view has no concrete window"
        self.view, self.shape, self.size = view, view.shape, view.size
        self.reshape = view.mask is None and view.offset == 0 and view.contiguous
        self.offset, self.strides = view.offset, view.strides
        self.pad: Optional[tuple[slice, ...]] = None  # the valid region of a padded view
        self.inner: Optional[View] = None  # the unpadded view of that region
        if view.mask is not None and not any(b >= e for b, e in view.mask):
            self.pad = tuple(slice(b, e) for b, e in view.mask)
            self.inner = View(view.shape, view.strides, view.offset, None).shrink(view.mask)

    def read(self, x: np.ndarray) -> np.ndarray:
        """`x` seen through the view, without copying unless padded (or `x` is not C-contiguous)."""
        if self.reshape and x.size == self.size:
            return x.reshape(self.shape)  # numpy copies only when x's strides cannot say it
        if self.size == 0:
            return np.empty(self.shape, dtype=x.dtype)
        flat = x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)
        if self.view.mask is None:
            return strided(flat, self.offset, self.shape, self.strides)
        out = np.zeros(self.shape, dtype=x.dtype)
        if self.inner is not None:
            out[self.pad] = strided(flat, self.inner.offset, self.inner.shape, self.inner.strides)
        return out

    def target(self, buf: np.ndarray) -> np.ndarray:
        """The writable window of the flat `buf` (a store target: never padded)."""
        if self.view.contiguous:
            return buf[self.offset:self.offset + self.size].reshape(self.shape)
        return strided(buf, self.offset, self.shape, self.strides)

    def store(self, buf: np.ndarray, value: np.ndarray) -> None:
        """Writes `value` (broadcast, cast) into the window of the flat `buf`."""
        if self.size:
            np.copyto(self.target(buf), value, casting="unsafe")

    def add_into(self, x: np.ndarray, source: np.ndarray, in_place: bool) -> np.ndarray:
        """x + (`source` seen through this padded view): the region outside the padding is left as x
        (x + 0 there, except that -0.0 stays -0.0), the valid region gets the source added in place.
        `x` itself is written when `in_place` (a temporary only this add reads)."""
        out = x if in_place and x.shape == self.shape else np.array(np.broadcast_to(x, self.shape))
        if self.inner is not None:
            flat = np.ascontiguousarray(source).reshape(-1)
            region = out[self.pad]
            np.add(region, strided(flat, self.inner.offset, self.inner.shape, self.inner.strides), out=region)
        return out


class AddPads:
    """x + pad_1(s_1) + ... + pad_K(s_K), a chain of adds of padded views (a convolution's input
    gradient, col2im: one pad per kernel offset, each a window of the same column gradient), in one
    pass: the output is filled in slabs along its first axis, each slab small enough to stay in cache
    while all K windows add into it, instead of K passes over the whole output; when every pad reads
    one source and the output fits in cache, one C call (backend/gemm/window_c.py) does all the adds. `x` is
    None when the chain starts from the first pad itself (zeros elsewhere)."""
    __slots__ = ("windows", "keep", "shape", "rows", "adds")

    def __init__(self, windows: list[Window], shape: tuple[int, ...], dtype: np.dtype):
        self.keep = [i for i, w in enumerate(windows) if w.inner is not None]  # fully padded: adds 0
        self.windows, self.shape = [windows[i] for i in self.keep], shape
        per_row = math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
        self.rows = max(1, ADD_PADS_SLAB_BYTES // max(per_row, 1))
        self.adds: Optional[WindowAdds] = None
        if shape and math.prod(shape) * dtype.itemsize <= ADD_PADS_C_MAX_BYTES:
            out_strides = strides_for(tuple(shape))
            self.adds = WindowAdds([(w.inner.shape, sum(p.start * st for p, st in zip(w.pad, out_strides)),
                                     tuple(st if n != 1 else 0 for st, n in zip(out_strides, w.inner.shape)),
                                     w.inner.offset, w.inner.strides) for w in self.windows], dtype)

    def __call__(self, x: Optional[np.ndarray], in_place: bool, dtype: np.dtype, *sources: np.ndarray) -> np.ndarray:
        """The sum; `x` is written when `in_place` (a temporary only this chain reads)."""
        if x is None:
            out = np.zeros(self.shape, dtype)
        else:
            out = x if in_place and x.shape == self.shape else np.array(np.broadcast_to(x, self.shape))
        sources = tuple(sources[i] for i in self.keep)
        if self.adds is not None and self.adds.available and sources and out.flags.c_contiguous and \
                out.dtype == dtype and all(s is sources[0] for s in sources) and sources[0].dtype == dtype:
            self.adds.run(out, np.ascontiguousarray(sources[0]))
            return out
        reads = []
        for w, source in zip(self.windows, sources):
            flat = np.ascontiguousarray(source).reshape(-1)
            reads.append((w.pad, strided(flat, w.inner.offset, w.inner.shape, w.inner.strides)))
        if not self.shape:
            for _, view in reads:
                out += view
            return out
        for start in range(0, self.shape[0], self.rows):
            stop = min(start + self.rows, self.shape[0])
            for pad, view in reads:
                lo, hi = max(start, pad[0].start), min(stop, pad[0].stop)
                if lo < hi:
                    region = out[(slice(lo, hi),) + pad[1:]]
                    np.add(region, view[lo - pad[0].start:hi - pad[0].start], out=region)
        return out


ADD_PADS_C_MAX_BYTES = 8 << 20  # an output up to this size gets all its adds in one C call
ADD_PADS_SLAB_BYTES = 512 << 10  # the slab of the output AddPads fills at a time


class RowsThenAddPads:
    """A chain of adds of padded windows of one contraction's result that is computed one row (index
    of axis 0) at a time and read by nothing else: a convolution's input gradient, where the result is
    the column gradient (n, c, *kernel, *out) and the windows are col2im's. Each row is computed into
    a buffer that stays in cache and added into the output's row right away, so the column gradient
    (25x the input for a 5x5 kernel) never goes through memory whole. Each window must read row i of
    the result for row i of the output (checked by `fits`)."""
    __slots__ = ("contraction", "shape", "row_shape", "reads", "adds")

    def __init__(self, contraction: Contraction, windows: list[Window], result_shape: tuple[int, ...],
                 shape: tuple[int, ...], dtype: np.dtype):
        self.contraction, self.shape = contraction, shape
        self.row_shape = (1,) + tuple(result_shape[1:])
        self.reads = [(w.pad[1:], w.inner.offset, w.inner.shape[1:], w.inner.strides[1:]) for w in windows
                      if w.inner is not None]
        row_strides = strides_for(tuple(shape[1:]))
        # the same adds as one C call per row (backend/gemm/window_c.py), where a compiler exists
        self.adds = WindowAdds([(view_shape, sum(p.start * st for p, st in zip(pad, row_strides)),
                                 tuple(st if n != 1 else 0 for st, n in zip(row_strides, view_shape)),
                                 offset, strides)
                                for pad, offset, view_shape, strides in self.reads], dtype)

    @staticmethod
    def fits(windows: list[Window], result_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        """True when every window reads, for row i of the output, only row i of the result."""
        if not shape or not result_shape or shape[0] != result_shape[0]:
            return False
        row = math.prod(result_shape[1:])
        for w in windows:
            if w.inner is None:
                continue
            if w.pad[0] != slice(0, shape[0]) or w.inner.strides[0] != row:
                return False
            lo, hi = View(w.inner.shape[1:], w.inner.strides[1:], w.inner.offset, None).index_range()
            if not (0 <= lo and hi < row) or not isinstance(lo, int) or not isinstance(hi, int):
                return False
        return True

    def __call__(self, x: np.ndarray, y: np.ndarray, base: Optional[np.ndarray], in_place: bool,
                 dtype: np.dtype) -> np.ndarray:
        """base + the windows' sum, from the contraction's sources `x` and `y`."""
        if base is None:
            out = np.zeros(self.shape, dtype)
        else:
            out = base if in_place and base.shape == self.shape else np.array(np.broadcast_to(base, self.shape))
        row = np.empty(self.row_shape, dtype)
        flat = row.reshape(-1)
        if self.adds.available and out.flags.c_contiguous and out.dtype == dtype:
            rows = out.reshape(self.shape[0], -1)
            for i in range(self.shape[0]):
                self.contraction.row(x, y, i, row)
                self.adds.run(rows[i], flat)
            return out
        views = [(pad, strided(flat, offset, shape, strides)) for pad, offset, shape, strides in self.reads]
        for i in range(self.shape[0]):
            self.contraction.row(x, y, i, row)
            target = out[i]
            for pad, view in views:
                region = target[pad]
                np.add(region, view, out=region)
        return out


def where(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """np.where(cond, x, y), branch-free for large arrays: the bits of x where cond, else those of y.
    x and y are arrays of cond's shape or 0-d (as the operands of an elementwise node are)."""
    it = _SAME_SIZE_INT.get(x.dtype.itemsize)
    if cond.dtype != np.bool_ or x.dtype != y.dtype or it is None or cond.size < WHERE_MIN_SIZE \
            or x.shape not in ((), cond.shape) or y.shape not in ((), cond.shape):
        return np.where(cond, x, y)
    picked = cond.astype(it)  # 1 where cond, else 0 (a SIMD cast, unlike a ufunc's dtype= cast)
    yb = y.view(it)
    np.multiply(picked, np.bitwise_xor(x.view(it), yb), out=picked)  # x ^ y where cond, else 0
    return np.bitwise_xor(picked, yb, out=picked).view(x.dtype)


def max_last(x: np.ndarray, perm: tuple[int, ...], keep: tuple[int, ...]) -> np.ndarray:
    """The max over the last axis of `x` (keepdims: `keep`), from a copy with that axis first
    (`perm`): one elementwise np.maximum per element of the short axis instead of a loop per row."""
    return np.maximum.reduce(np.ascontiguousarray(x.transpose(perm)), axis=0).reshape(keep)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more on 64-bit hosts


def keep_freed_memory(keep_bytes: int) -> bool:
    """Asks glibc malloc to keep up to `keep_bytes` of freed memory, and to take arrays up to
    min(keep_bytes, 32 MiB) from that reusable heap instead of a fresh mmap. Process-wide; 0 or a
    libc other than glibc leaves malloc alone. True when the thresholds were set."""
    if keep_bytes <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    keep = min(keep_bytes, 2**31 - 1)
    return bool(mallopt(_M_MMAP_THRESHOLD, min(keep, _MMAP_THRESHOLD_MAX))) and \
        bool(mallopt(_M_TRIM_THRESHOLD, keep))


__all__ = ["AddPads", "Contraction", "RowsThenAddPads", "Window", "blasable", "contraction_groups", "keep_freed_memory", "max_last",
           "strided", "where"]
