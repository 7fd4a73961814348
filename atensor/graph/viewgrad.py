"""The gradient of a VIEW node's source: `view_backward`, gradient.py's one rule for every movement op.

Why a module of its own: a View folds reshape, permute, expand, pad, shrink, flip and stride into
strides, offset and mask, so its backward is one general procedure (undo the mask, sum the stride-0
axes, flip, permute, place each element at its stride), with col2im and a scatter-add for views whose
windows overlap; it is most of the backward's code and none of the other rules need it.

The movement ops that undo a view depend only on the view and its source's shape, never on the
gradient node, so `_undo_steps` works them out once per pair (a bounded cache of (method, arguments)
steps) and `_undo_view` applies them: a training step undoes the same few views every step, and this
was 60% of building the flagship's backward (bench/node_build.py).
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Optional

from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.view import Shape, View, strides_for


class _Overlap(Exception):
    """The view reads some source elements more than once along different axes (sliding windows)."""


def view_backward(grad: Node, view: View, src_shape: Shape) -> Node:
    """The gradient of a view's source (shape `src_shape`) given the gradient of the view's output.

    The View reads source element `offset + sum(idx[i] * strides[i])` for each valid `idx`; the
    source's gradient sums the output gradient of every `idx` that reads it. Movement ops give views
    that undo with movement ops and sums; a view whose windows overlap (the sliding windows of a
    convolution) is split into one non-overlapping view per kernel offset, each undone by a pad
    (col2im as a sum of pads, `_split_windows`); a scatter-add of the gradient to the positions read
    is the last resort (more than SPLIT_MAX_PIECES pieces, or no split makes the pieces disjoint)."""
    try:
        return _undo_view(grad, view, src_shape)
    except _Overlap:
        pass
    try:
        return _split_windows(grad, view, src_shape)
    except _Overlap:
        return _scatter_back(grad, view, src_shape)


SPLIT_MAX_PIECES = 512  # more kernel offsets than this: one scatter-add instead of a sum of pads


def _split_windows(grad: Node, view: View, src_shape: Shape) -> Node:
    """col2im: a view whose windows overlap (a convolution's (n, c, *kernel, *out) window view) as the
    sum over the offsets of its fewest overlapping axes (the kernel's) of non-overlapping views, each
    undone by a pad. The broadcast (stride-0) axes are summed once first, so the gradient they carry
    (a contraction, when it is a product) stays one node."""
    if view.size == 0 or (view.mask is not None and any(b >= e for b, e in view.mask)):
        return Node.const(0.0, grad.dtype, grad.device, src_shape)
    shape, strides, offset = list(view.shape), list(view.strides), view.offset
    if view.mask is not None:  # elements outside the mask read nothing
        grad = grad.shrink(view.mask)
        offset += sum(b * st for (b, _), st in zip(view.mask, strides))
        shape = [e - b for b, e in view.mask]
    summed = tuple(i for i, (s, st) in enumerate(zip(shape, strides)) if st == 0 and s != 1)
    grad = grad.reduce(ReduceOp.SUM, summed)
    keep = [i for i, (s, st) in enumerate(zip(shape, strides)) if st != 0 and s != 1]
    shape, strides = [shape[i] for i in keep], [strides[i] for i in keep]
    grad = grad.reshape(tuple(shape))
    best: Optional[tuple[int, ...]] = None
    for chosen in _subsets(len(shape)):
        pieces = math.prod(shape[i] for i in chosen)
        if pieces > SPLIT_MAX_PIECES or (best is not None and pieces >= math.prod(shape[i] for i in best)):
            continue
        rest = [i for i in range(len(shape)) if i not in chosen]
        if _disjoint([shape[i] for i in rest], [strides[i] for i in rest]):
            best = chosen
    if best is None:
        raise _Overlap()
    rest = [i for i in range(len(shape)) if i not in best]
    sub_shape = tuple(shape[i] for i in rest)
    # the source framed by all the view's strides (a strided convolution's (n, c, h / s, s, w / s, s)):
    # there every piece, strided or not, is a plain window, undone by one pad
    frame = _stride_frame(strides, math.prod(src_shape))
    target = tuple(src_shape) if frame is None else frame
    parts = []
    for at in itertools.product(*(range(shape[i]) for i in best)):
        where = dict(zip(best, at))
        piece = grad.shrink(tuple((where[i], where[i] + 1) if i in where else (0, s)
                                  for i, s in enumerate(shape))).reshape(sub_shape)
        start = offset + sum(k * strides[i] for i, k in where.items())
        sub = View(sub_shape, tuple(strides[i] for i in rest), start)
        if frame is not None:
            framed = _in_frame(piece, sub, frame)
            if framed is not None:
                parts.append(framed)
                continue
            target = tuple(src_shape)
            parts = [p.reshape(target) for p in parts]
            frame = None
        parts.append(_undo_view(piece, sub, target))
    # each part is usually a pad reshaped to the source's shape: add the pads (an add into the padded
    # region only, in the backends) and reshape the sum once
    inner = [p.src[0] if p.op is Ops.VIEW and p.arg.contiguous and p.arg.offset == 0 else None for p in parts]
    if all(i is not None and i.shape == inner[0].shape and i.size == p.size for i, p in zip(inner, parts)):
        parts = inner
    total = parts[0]
    for part in parts[1:]:
        total = total.alu(Ops.ADD, part)
    return total.reshape(tuple(src_shape))


def _stride_frame(strides: list[int], size: int) -> Optional[tuple[int, ...]]:
    """The shape whose contiguous strides are exactly the view's distinct strides (and 1), when each
    divides the one above it and the source's size: e.g. (n, c, h / 2, 2, w / 2, 2) for a stride-2
    convolution's window view of an (n, c, h, w) source. None otherwise."""
    distinct = sorted({abs(st) for st in strides} | {1}, reverse=True)
    if any(st <= 0 for st in strides) or size % distinct[0]:
        return None
    dims = [size // distinct[0]]
    for outer, inner in zip(distinct, distinct[1:]):
        if outer % inner:
            return None
        dims.append(outer // inner)
    return tuple(dims)


def _in_frame(piece: Node, sub: View, frame: tuple[int, ...]) -> Optional[Node]:
    """The gradient of the non-overlapping view `sub` placed in the source framed as `frame` (one pad),
    or None when `sub` is not a window of the frame (its axes do not each walk one frame axis)."""
    frame_strides = strides_for(frame)
    place = {st: i for i, st in enumerate(frame_strides) if frame[i] != 1}
    lengths, last = [1] * len(frame), -1
    for n, st in zip(sub.shape, sub.strides):
        if n == 1:
            continue
        axis = place.get(st)
        if axis is None or axis <= last:  # not a frame axis, or out of the frame's order
            return None
        lengths[axis], last = n, axis
    window = _as_window(lengths, list(frame_strides), sub.offset, frame)
    if window is None:
        return None
    return piece.reshape(tuple(lengths)).pad(window)


def _subsets(n: int) -> list[tuple[int, ...]]:
    """Every subset of range(n) with at least one element, smallest first."""
    return [c for r in range(1, n + 1) for c in itertools.combinations(range(n), r)]


def _disjoint(shape: list[int], strides: list[int]) -> bool:
    """True when a view of these (non-zero) strides reads each source element at most once (the rule
    `_undo_view` places elements by: each axis's stride spans all the axes inside it)."""
    canvas = 1
    for n, st in sorted(zip(shape, (abs(s) for s in strides)), key=lambda p: p[1]):
        if st < canvas:
            return False
        canvas += (n - 1) * st
    return True


def _scatter_back(grad: Node, view: View, src_shape: Shape) -> Node:
    """The general case: the flat source position each output element read (-1 where the mask says
    it read nothing), and a scatter-add of the gradient to those positions."""
    size = math.prod(src_shape)
    dev, idt = grad.device, dtypes.int64 if size >= 2**31 else dtypes.int32
    ndim = len(view.shape)
    position = Node.const(view.offset, idt, dev, view.shape)
    valid: Optional[Node] = None
    for axis, (n, stride) in enumerate(zip(view.shape, view.strides)):
        along = Node.make(Ops.ARANGE, idt, (), (0, 1, n, dev))
        along = along.reshape(tuple(n if i == axis else 1 for i in range(ndim))).expand(view.shape)
        if stride:
            position = position.alu(Ops.ADD, along.alu(Ops.MUL, Node.const(stride, idt, dev, view.shape)))
        if view.mask is not None and view.mask[axis] != (0, n):
            lo, hi = view.mask[axis]
            inside = Node.const(lo - 1, idt, dev, view.shape).alu(Ops.CMPLT, along).alu(
                Ops.AND, along.alu(Ops.CMPLT, Node.const(hi, idt, dev, view.shape)))
            valid = inside if valid is None else valid.alu(Ops.AND, inside)
    if valid is not None:
        position = valid.alu(Ops.WHERE, position, Node.const(-1, idt, dev, view.shape))
    flat = (view.size,)
    base = Node.const(0.0, grad.dtype, dev, (size,))
    out = Node.make(Ops.SCATTER, grad.dtype, (base, position.reshape(flat), grad.reshape(flat)), "sum")
    return out.reshape(tuple(src_shape))


def _framing(strides: list[int], size: int, src_shape: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """The source read as the contiguous array whose strides these are (a flat buffer seen as the
    tensor's N-d shape), or None when the strides are not those of one contiguous array."""
    if len(strides) == len(src_shape):
        return src_shape
    if not strides or strides[-1] != 1 or any(st <= 0 for st in strides):
        return None
    outer = [size] + list(strides[:-1])
    if any(a % b for a, b in zip(outer, strides)):
        return None
    return tuple(a // b for a, b in zip(outer, strides))


def _as_window(shape: list[int], strides: list[int], offset: int,
               src_shape: tuple[int, ...]) -> Optional[tuple[tuple[int, int], ...]]:
    """The (before, after) padding per axis when a view of `shape`/`strides`/`offset` is the window
    [b, b + shape) of a contiguous `src_shape` source on every axis, else None."""
    if len(shape) != len(src_shape) or offset < 0:
        return None
    contiguous = strides_for(src_shape)
    pads, rest = [], offset
    for n, st, src, cst in zip(shape, strides, src_shape, contiguous):
        if n != 1 and st != cst:
            return None
        begin = rest // cst if cst else 0
        rest -= begin * cst
        if begin + n > src:
            return None
        pads.append((begin, src - begin - n))
    return tuple(pads) if rest == 0 else None


def _undo_view(grad: Node, view: View, src_shape: Shape) -> Node:
    """The gradient of the source of `view` (shape `src_shape`) from the view's output gradient `grad`,
    by movement ops and sums (raises _Overlap when the view reads an element twice along different
    axes). The ops depend only on the view and the source's shape, so they are worked out once per
    pair (`_undo_steps`) and applied here: a training step undoes the same few views every step."""
    try:
        steps = _undo_steps(view, tuple(src_shape))
    except TypeError:  # an unhashable part: worked out without the cache
        steps = _undo_steps.__wrapped__(view, tuple(src_shape))
    for name, args in steps:
        if name == "zero":
            return Node.const(0.0, grad.dtype, grad.device, src_shape)
        grad = getattr(grad, name)(*args)
    return grad


@functools.lru_cache(maxsize=4096)
def _undo_steps(view: View, src_shape: Shape) -> tuple[tuple[str, tuple], ...]:
    """The (Node method, arguments) steps that undo `view` on its output gradient (`_undo_view`)."""
    steps: list[tuple[str, tuple]] = []
    size = math.prod(src_shape)
    if size == 0 or view.size == 0 or (view.mask is not None and any(b >= e for b, e in view.mask)):
        return (("zero", ()),)
    shape, strides, offset = list(view.shape), list(view.strides), view.offset
    # 1. the mask: elements outside it read nothing (padding), so only the inside passes gradient
    if view.mask is not None:
        steps.append(("shrink", (view.mask,)))
        offset += sum(b * st for (b, _), st in zip(view.mask, strides))
        shape = [e - b for b, e in view.mask]
    # 1b. a plain window of a contiguous source (a slice, the kernel offsets of a convolution): one pad.
    #     The general placement below gives the same values through a chain of flat pads and reshapes,
    #     each a copy of the whole source when its input is computed (measured: 25 such chains made a
    #     5x5 convolution's input gradient ~10x slower than its two BLAS contractions)
    wide = [(n, st) for n, st in zip(shape, strides) if n != 1]  # axes of size 1 read one element
    framed = _framing([st for _, st in wide], size, tuple(src_shape))
    window = _as_window([n for n, _ in wide], [st for _, st in wide], offset, framed) if framed else None
    if window is not None:
        steps += [("reshape", (tuple(n for n, _ in wide),)), ("pad", (window,)), ("reshape", (tuple(src_shape),))]
        return tuple(steps)
    # 2. stride-0 axes read one element many times (expand): their gradients add up
    summed = tuple(i for i, (s, st) in enumerate(zip(shape, strides)) if st == 0 and s != 1)
    steps.append(("reduce", (ReduceOp.SUM, summed)))
    keep = [i for i, (s, st) in enumerate(zip(shape, strides)) if st != 0 and s != 1]
    shape, strides = [shape[i] for i in keep], [strides[i] for i in keep]
    steps.append(("reshape", (tuple(shape),)))
    # 3. negative strides walk the source backwards (flip)
    flips = tuple(st < 0 for st in strides)
    if any(flips):
        steps.append(("flip", (flips,)))
        for i, st in enumerate(strides):
            if st < 0:
                offset += (shape[i] - 1) * st
                strides[i] = -st
    # 4. the axis order (permute): outermost axis first, that is, largest stride first
    order = sorted(range(len(strides)), key=lambda i: -strides[i])
    steps.append(("permute", (tuple(order),)))
    shape, strides = [shape[i] for i in order], [strides[i] for i in order]
    if offset == 0 and math.prod(shape) == size and tuple(strides) == strides_for(tuple(shape)):
        steps.append(("reshape", (tuple(src_shape),)))  # what is left reads every element once, in order
        return tuple(steps)
    # 5. place each element at its stride: from the innermost axis out, pad every row of the
    #    inner "canvas" to the axis's stride, merge the axis into the canvas and drop the padding
    #    after its last row
    canvas = 1
    steps.append(("reshape", (tuple(shape) + (1,),)))
    for axis in reversed(range(len(shape))):
        stride = strides[axis]
        if stride < canvas:
            raise _Overlap()
        if stride > canvas:
            steps.append(("pad", (((0, 0),) * (axis + 1) + ((0, stride - canvas),),)))
        steps.append(("reshape", (tuple(shape[:axis]) + (shape[axis] * stride,),)))
        used = (shape[axis] - 1) * stride + canvas  # without the last row's padding
        if used < shape[axis] * stride:
            steps.append(("shrink", (tuple((0, s) for s in shape[:axis]) + ((0, used),),)))
        canvas = used
    # 6. the canvas starts at `offset` of the flat source
    steps += [("pad", (((offset, size - offset - canvas),),)), ("reshape", (tuple(src_shape),))]
    return tuple(steps)


__all__ = ["SPLIT_MAX_PIECES", "view_backward"]
