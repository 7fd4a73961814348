"""`Contraction`: a matmul-shaped reduce, sum(a * b, axes) over two broadcast views, as BLAS gemms.

The numpy backend plans it once, when it renders the kernel (backend/numpy/plans.py explains why plans):
axes in both operands that are kept are batch axes, those only in one are the rows (a) or columns (b),
those in both that are reduced are the inner axis; the broadcast (stride-0) axes are dropped from the
views themselves, so the operands go to BLAS without an intermediate broadcast array.

Views BLAS cannot read. A gemm needs each operand as matrices with one unit stride; a permuted view
or the sliding-window view of a convolution (im2col: axes that overlap, `tensor/windows.py`) is copied
first. Copied whole, a convolution's window operand is many times its input (a 5x5 kernel: 25x), so
the copy and the gemm each stream it through memory: measured on MNIST's 128x32x24x24 layer, a
batched gemm over the whole im2col copy ran at 42 GFLOP/s where one sample's gemm, its copy in
cache, ran at 62. So when an operand needs a copy larger than `CHUNK_BYTES`, the contraction runs in
chunks along that operand's outermost axis (a batch, row or column axis: each chunk fills its part of
the result; an inner axis: the chunks' products add up), each chunk's copy about `CHUNK_BYTES`,
which stays in L2. A copy is laid out so the source is read in order: the matrix axis whose source
strides are smaller goes inner, and BLAS reads the transposed layout.

The result is laid out as the kernel's output axes want it when one gemm can say it: (batch, rows,
cols), or (batch, cols, rows) computed as b^T a^T, so that no transposed result reaches the next view.
"""
from __future__ import annotations

import math
import threading
from typing import Optional

import numpy as np

from atensor.backend.gemm.axes import contraction_groups
from atensor.backend.gemm.window import WindowGemm
from atensor.backend.gemm.window_c import gather
from atensor.graph.view import View

CHUNK_BYTES = 2 << 20  # an operand copy above this is done, and contracted, chunk by chunk
SCRATCH_MAX_BYTES = 4 * CHUNK_BYTES  # a thread keeps at most this per operand for chunk copies
KEPT_CHUNK_MIN_BYTES = 16 << 10  # a chunk along a kept axis 0 is one index when its copy is at least this
SAMPLE_GEMM_MIN_ELEMENTS = 256  # a per-sample gemm (`_samples_as_batch`) writes at least this many results


class Contraction:
    """sum(a * b, axes) with keepdims, where a and b are the broadcast views `a_view`, `b_view` of two
    sources, as np.matmul calls (a BLAS gemm per batch element), chunked when an operand's copy is
    large (module docstring). `usable` is False for a one-sided sum (an axis reduced in only one
    operand), which the backend leaves to einsum."""

    def __init__(self, a_view: View, b_view: View, axes: tuple[int, ...], dtype: np.dtype):
        shape = a_view.shape
        batch, rows, inner, cols = contraction_groups(a_view, b_view, axes)
        self.usable = not any(i in axes for i in rows + cols) and not a_view.variables() \
            and not b_view.variables() and a_view.mask is None and b_view.mask is None
        if not self.usable:
            return
        self.dtype = dtype
        present = set(batch + rows + inner + cols)
        self.keep = tuple(1 if (i in axes or i not in present) else shape[i] for i in range(len(shape)))
        full = tuple(1 if i in axes else shape[i] for i in range(len(shape)))
        self.full = None if full == self.keep else full
        self.views = (a_view, b_view, axes)
        self.parts: dict[int, Contraction] = {}  # by chunk length
        self.row_part: Optional[Contraction] = None  # one row of axis 0 (`row`)
        self.row_strides = (a_view.strides[0], b_view.strides[0]) if shape else (0, 0)
        self.chunk = _chunk_plan(a_view, b_view, axes, dtype.itemsize, (batch, rows, inner), (batch, inner, cols))
        self.window: Optional[WindowGemm] = None  # a convolution's forward, per sample in C (backend/gemm/window.py)
        if self.chunk is not None:
            axis, block = self.chunk
            self.axis_reduced = axis in axes
            self.strides = (a_view.strides[axis], b_view.strides[axis])
            self.window = WindowGemm.plan(a_view, b_view, axes, self.keep, dtype)
            return
        batch, rows, cols = _samples_as_batch(shape, batch, rows, cols)
        self.batch_shape = tuple(shape[i] for i in batch)
        self.groups = (len(batch), len(rows), len(inner), len(cols))
        self.a = _select(a_view, batch + rows + inner)
        self.b = _select(b_view, batch + inner + cols)
        item = dtype.itemsize
        self.copies = (_copy_needed(self.a, len(batch), len(rows), len(inner), item),
                       _copy_needed(self.b, len(batch), len(inner), len(cols), item))
        out_axes = sorted(batch + rows + cols)
        # the result's layout: (batch, rows, cols), or (batch, cols, rows) when that is the output's order
        self.swap = bool(rows) and bool(cols) and out_axes == sorted(batch) + cols + rows and \
            batch == sorted(batch)
        order = batch + (cols + rows if self.swap else rows + cols)
        self.result_shape = self.batch_shape + tuple(shape[i] for i in order[len(batch):])
        self.perm = None if order == out_axes else tuple(order.index(i) for i in out_axes)

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The contraction of the sources `x` (of a_view) and `y` (of b_view)."""
        result = self._kept(x, y)
        return result if self.full is None else np.broadcast_to(result, self.full)

    def _kept(self, x: np.ndarray, y: np.ndarray, into: Optional[np.ndarray] = None) -> np.ndarray:
        """The result in its keepdims shape; written into `into` (of that shape) when given."""
        if self.chunk is not None:
            if self.window is not None and into is None:
                return self.window(x, y)
            return self._chunked(x, y, into)
        nb, nr, ni, nc = self.groups
        left = _matrices(_read(x, self.a), nb, nr, ni, 0, self.copies[0])
        right = _matrices(_read(y, self.b), nb, ni, nc, 1, self.copies[1])
        if self.swap:
            left, right = right.swapaxes(-1, -2), left.swapaxes(-1, -2)
        if into is not None and self.perm is None and into.dtype == self.dtype == left.dtype:
            try:  # the gemm writes the caller's array (a chunk of a larger result) itself
                target = np.reshape(into, left.shape[:-1] + right.shape[-1:], copy=False)
            except ValueError:
                target = None
            if target is not None:
                np.matmul(left, right, out=target)
                return into
        result = np.matmul(left, right).reshape(self.result_shape)
        if self.perm is not None:
            result = result.transpose(self.perm)
        if result.dtype != self.dtype:
            result = result.astype(self.dtype)
        result = result.reshape(self.keep)
        if into is not None:
            into[...] = result
            return into
        return result

    def rows(self) -> int:
        """How many rows `row` computes: the size of axis 0 when it is a kept axis (a convolution's
        batch), else 0."""
        shape, axes = self.views[0].shape, self.views[2]
        if not shape or 0 in axes or shape[0] <= 1 or min(self.row_strides) < 0:
            return 0
        return shape[0]

    def row(self, x: np.ndarray, y: np.ndarray, index: int, into: np.ndarray) -> None:
        """Writes the result's row `index` of axis 0 into `into` (keepdims shape, axis 0 of size 1);
        only when `rows()` is not 0. A consumer that reads the result one row at a time (numpy_plans.
        RowsThenAddPads) then never needs the whole result in memory."""
        part = self.row_part
        if part is None:
            part = self.row_part = Contraction(*(_cut(v, 0, 1) for v in self.views[:2]), self.views[2], self.dtype)
        sa, sb = self.row_strides
        fx, fy = _flat(x), _flat(y)
        part._kept(fx[index * sa:] if sa else fx, fy[index * sb:] if sb else fy, into=into)

    def _chunked(self, x: np.ndarray, y: np.ndarray, into: Optional[np.ndarray]) -> np.ndarray:
        axis, block = self.chunk  # type: ignore[misc]
        size = self.views[0].shape[axis]
        fx, fy = _flat(x), _flat(y)
        sa, sb = self.strides
        out = into
        if out is None and not self.axis_reduced:
            out = np.empty(self.keep, self.dtype)
        for start in range(0, size, block):
            length = min(block, size - start)
            part = self.parts.get(length)
            if part is None:
                part = self.parts[length] = Contraction(*(_cut(v, axis, length) for v in self.views[:2]),
                                                        self.views[2], self.dtype)
            xs, ys = fx[start * sa:] if sa else fx, fy[start * sb:] if sb else fy
            if not self.axis_reduced:  # each chunk fills its slice of the result
                index = [slice(None)] * len(self.keep)
                index[axis] = slice(start, start + length)
                part._kept(xs, ys, into=out[tuple(index)])  # type: ignore[index]
            elif start == 0:  # the chunks' products add up
                out = part._kept(xs, ys, into=out)
                if into is None and (not out.flags.writeable or out.base is not None):
                    out = np.array(out, self.dtype)
            else:
                np.add(out, part._kept(xs, ys), out=out)
        assert out is not None
        return out


def _samples_as_batch(shape: tuple[int, ...], batch: list[int], rows: list[int],
                      cols: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(batch, rows, cols) with axis 0 moved into the batch when it is a row or column axis whose place
    in the output, first, no single gemm can write: a convolution's column gradient (n, C, *kernel,
    *out) from rows (n, *out) and columns (C, *kernel), or a small convolution's forward (n, Cout, *out)
    from rows Cout and columns (n, *out). One gemm per sample (the other operand read at stride 0) then
    writes the output in its own order; the single gemm's result, transposed, cost the next kernel a
    permuted copy (measured on examples/train.py's CNN: col2im's copy of the transposed column gradient
    took ~1.5 ms of its 6.5 ms step). Only when each sample's gemm writes at least `SAMPLE_GEMM_MIN_ELEMENTS`."""
    if batch or not rows or not cols or not shape or shape[0] <= 1 or (0 not in rows and 0 not in cols):
        return batch, rows, cols
    out_axes = sorted(rows + cols)
    rest_rows, rest_cols = [i for i in rows if i != 0], [i for i in cols if i != 0]
    if out_axes in (rows + cols, cols + rows) or not rest_rows or not rest_cols or \
            out_axes[1:] not in (rest_rows + rest_cols, rest_cols + rest_rows):
        return batch, rows, cols  # one gemm writes it already, or no per-sample gemm can
    per_sample = math.prod(shape[i] for i in rest_rows + rest_cols)
    if per_sample < SAMPLE_GEMM_MIN_ELEMENTS:
        return batch, rows, cols
    return [0], rest_rows, rest_cols


def _chunk_plan(a_view: View, b_view: View, axes: tuple[int, ...], item: int, a_groups: tuple[list[int], ...],
                b_groups: tuple[list[int], ...]) -> Optional[tuple[int, int]]:
    """(axis, block) to run the contraction in chunks of `block` along `axis`, or None: when an
    operand BLAS cannot read in place is larger than CHUNK_BYTES, its outermost axis (largest stride)
    in blocks whose copy is about CHUNK_BYTES."""
    for view, groups in ((b_view, b_groups), (a_view, a_groups)):
        own = [i for g in groups for i in g]
        selected = _select(view, own)
        nbytes = selected.size * item
        if nbytes <= CHUNK_BYTES or not _copy_needed(selected, *(len(g) for g in groups), item):
            continue
        candidates = [i for i in own if view.shape[i] > 1]
        axis = max(candidates, key=lambda i: abs(view.strides[i]))
        if a_view.strides[axis] < 0 or b_view.strides[axis] < 0:
            continue
        per_index = nbytes // view.shape[axis]
        if axis == 0 and axis not in axes and per_index >= KEPT_CHUNK_MIN_BYTES:
            return axis, 1  # one index of a kept first axis (a batch) per gemm: no transposed result
        return axis, max(1, min(view.shape[axis], CHUNK_BYTES // max(per_index, 1)))
    return None


def _copy_needed(view: View, nb: int, n1: int, n2: int, item: int) -> bool:
    """True when `view` (nb batch axes, then groups of n1 and n2 axes) is not matrices BLAS reads in
    place, so `_matrices` copies it (asked of a stand-in array with the view's strides: no data)."""
    dummy = np.lib.stride_tricks.as_strided(np.empty(1, np.uint8), view.shape,
                                            tuple(s * item for s in view.strides))
    shape = view.shape[:nb] + (math.prod(view.shape[nb:nb + n1]), math.prod(view.shape[nb + n1:]))
    try:
        merged = np.reshape(dummy, shape, copy=False)
    except ValueError:
        return True
    rows, cols = merged.shape[-2:]
    s_row, s_col = merged.strides[-2:]
    return not ((s_col == item and s_row >= cols * item) or (s_row == item and s_col >= rows * item)
                or rows * cols <= 1)


def _cut(view: View, axis: int, length: int) -> View:
    """`view` with `axis` cut to its first `length` elements (a chunk; the offset is the caller's)."""
    shape = list(view.shape)
    shape[axis] = length
    strides = list(view.strides)
    if length == 1:
        strides[axis] = 0
    return View(tuple(shape), tuple(strides), view.offset, None)


def _select(view: View, axes: list[int]) -> View:
    """`view` restricted to `axes` (in that order); the others are broadcast or size 1, so dropping
    them reads the same elements."""
    return View(tuple(view.shape[i] for i in axes), tuple(view.strides[i] for i in axes), view.offset, None)


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1)


def _read(x: np.ndarray, view: View) -> np.ndarray:
    """The strided window `view` of the source `x` (read in row-major order); no copy."""
    if view.offset == 0 and view.contiguous and view.size == x.size:
        return x.reshape(view.shape)
    if view.size == 0:
        return np.empty(view.shape, x.dtype)
    flat = _flat(x)
    item = flat.itemsize
    byte_strides = tuple(s * item for s in view.strides)
    try:  # the constructor checks the window lies inside `flat`, and is ~6x cheaper than as_strided
        return np.ndarray(view.shape, flat.dtype, flat, view.offset * item, byte_strides)
    except (TypeError, ValueError):  # not a buffer numpy can wrap (e.g. read-only): the general way
        return np.lib.stride_tricks.as_strided(flat[view.offset:], view.shape, byte_strides)


def _matrices(x: np.ndarray, nb: int, n1: int, n2: int, slot: int, copy: bool = False) -> np.ndarray:
    """x, whose axes are nb batch axes then two groups of n1 and n2 axes, as (batch..., M1, M2)
    matrices BLAS reads: a reshape when the layout allows it, else a copy into this thread's scratch
    buffer `slot` that reads x in order (the group with the smaller source strides inner; BLAS then
    reads the transpose). `copy`: known (at plan time) to need the copy."""
    batch = x.shape[:nb]
    m1, m2 = math.prod(x.shape[nb:nb + n1]), math.prod(x.shape[nb + n1:])
    if not copy:
        try:
            merged = np.reshape(x, batch + (m1, m2), copy=False)
        except ValueError:
            merged = None
        if merged is not None and blasable_in_place(merged):
            return merged
    g1, g2 = list(range(nb, nb + n1)), list(range(nb + n1, nb + n1 + n2))
    transposed = _inner_key(x, g1) < _inner_key(x, g2)  # g1 varies fastest: copy as (g2, g1)
    source = x.transpose(list(range(nb)) + g2 + g1) if transposed else x
    copied = _scratch(slot, source.shape, x.dtype)
    gather(copied, source)  # one C pass (backend/gemm/window_c.py): np.copyto loops per short row
    if transposed:
        return copied.reshape(batch + (m2, m1)).swapaxes(-1, -2)
    return copied.reshape(batch + (m1, m2))


_local = threading.local()


def _scratch(slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array of `shape` in this thread's reusable buffer `slot` (0 or 1: the two
    operands of one gemm). Reused by the next gemm of this thread, so it never outlives one
    contraction chunk: a chunk's copy then costs no allocation and no page faults."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > SCRATCH_MAX_BYTES:  # an unchunked large copy: its own array, freed after the gemm
        return np.empty(shape, dtype)
    if buffers[slot].size < nbytes:
        buffers[slot] = np.empty(nbytes, np.uint8)
    return buffers[slot][:nbytes].view(dtype).reshape(shape)


def _inner_key(x: np.ndarray, group: list[int]) -> tuple[int, ...]:
    """A group's source strides from its innermost axis out (size-1 axes left out): the smaller key is
    the group that moves faster through memory."""
    return tuple(abs(x.strides[i]) for i in reversed(group) if x.shape[i] != 1)


def blasable_in_place(x: np.ndarray) -> bool:
    """True when each matrix in x (its last two axes) has one unit stride and a leading dimension BLAS
    accepts, so np.matmul hands it to BLAS without a copy."""
    rows, cols = x.shape[-2:]
    s_row, s_col = x.strides[-2:]
    item = x.itemsize
    return (s_col == item and s_row >= cols * item) or (s_row == item and s_col >= rows * item) or rows * cols <= 1


def blasable(x: np.ndarray) -> np.ndarray:
    """`x`, copied to C order unless each matrix in it already has one unit stride (BLAS's condition;
    numpy falls back to a slow loop otherwise)."""
    return x if blasable_in_place(x) else np.ascontiguousarray(x)
