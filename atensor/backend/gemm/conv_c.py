"""Contractions the C renderer's single gemm cannot read in place, lowered as loops of BLAS calls.

Why: a convolution's forward and weight gradient are REDUCEs of a product of two views where one is
the overlapping window view of the input (im2col without the copy), whose axes never merge into a
matrix; backend/c/render.py's `_gemm` needs each operand as one matrix, so these kernels stayed on numpy
(backend/gemm/contraction.py, backend/gemm/window.py): a kernel of their own, with the bias and activation after them a
second kernel, run by Python in a jit replay. Lowered here they are part of the native kernel: the
epilogue fuses, the jit's native programs hold them, and the scheduler, profiler and bounds checks see
one kernel like any other. Measured (beautiful_mnist's step at batch 128, one thread, process CPU time
per kernel on a loaded 2-core machine): the 32->32 5x5 layer's weight gradient 84 -> 49 ms (numpy's
im2col chunks against taps), its forward 47-53 -> 49-54 ms (the same algorithm as backend/gemm/window.py).

Two lowerings, tried in order:
- `taps` (backend/gemm/window.py's idea, generalised and in C): an operand whose axes t and p, in different
  groups (one reduced, one the operand's own), step through its source at strides st_t = m * st_p is
  gathered, once per iteration of the loop axes (the batch axes and those of p's group before p), into
  a dense scratch Y without t whose p axis is grown to (n_t - 1) * m + n_p rows; the product over t is
  then n_t gemms, the t-th reading Y from row t * m. For the forward t is the kernel's row and p the
  output's row: Y is the input times the kernel's width (5x for 5x5) where im2col is 25x; for the weight
  gradient t is the kernel's row again, now an output axis, and p the reduced output row. The other
  operand is read in place when its groups merge, else gathered once (the weight, as (t, rows, inner)).
  Of the candidate pairs the one with the largest smallest gemm dimension, then the fewest gemm calls,
  then the smallest Y is taken.
- `looped`: axes peeled off the front of a group that does not merge (rows, columns, or inner) become
  `for` loops around one gemm, as batch axes do; a peeled inner axis accumulates (beta 1 after a
  memset).
Neither takes a contraction whose result is read through masked views (col2im: the input's gradient
as masked windows of the column gradient): per element in C that measured 4.8x slower than numpy's
per-sample adds (numpy_plans.RowsThenAddPads), so those kernels stay on numpy.

Invariant: every pointer a gemm or a gather is given stays inside its source: a gather reads the
elements of its view, and Y's grown p axis the rows t * m + p of every tap t and row p, with any rows
between them (when m > n_p) inside the span of those, so inside the source; the gemms read only the
scratches and the in-place operand's own view (the scheduler's bounds check proves the views).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from atensor.backend.gemm.c_blas import CBLAS_ROW_MAJOR, blas_layout, merged_stride
from atensor.graph.ops import Ops
from atensor.graph.view import View, strides_for

# a sub-gemm smaller than this (m * k * n) is not worth a BLAS call per loop iteration
MIN_SUB_GEMM = 4096


@dataclass(frozen=True)
class Peeled:
    """A contraction's axes split into loops and one gemm: `loops` (outermost first) run around it,
    `rows`, `inner`, `cols` are the gemm's merged groups, `reduced_loops` the loop axes summed over."""
    batch: list[int]
    loop_rows: list[int]
    rows: list[int]
    loop_inner: list[int]
    inner: list[int]
    loop_cols: list[int]
    cols: list[int]


def _peel(view: View, group: list[int], others: Optional[View] = None) -> tuple[list[int], list[int]]:
    """(leading axes to loop over, the rest) so the rest of `group` merges in `view` (and `others`)."""
    loops, rest = [], list(group)
    while len(rest) > 1 and (merged_stride(view, rest) is None or
                             (others is not None and merged_stride(others, rest) is None)):
        loops.append(rest.pop(0))
    return loops, rest


def peel(va: View, vb: View, groups: tuple[list[int], ...]) -> Optional[Peeled]:
    """The loop split that makes every group a BLAS matrix, or None when none does."""
    batch, rows, inner, cols = groups
    loop_rows, rows_rest = _peel(va, rows)
    loop_inner, inner_rest = _peel(va, inner, vb)
    loop_cols, cols_rest = _peel(vb, cols)
    if not (loop_rows or loop_inner or loop_cols):
        return None
    return Peeled(batch, loop_rows, rows_rest, loop_inner, inner_rest, loop_cols, cols_rest)


def _source(r: Any, x: Any) -> Optional[str]:
    """The C pointer a view `x` reads: a PARAM or a row-major materialized array; None otherwise."""
    src = x.src[0]
    if src.op is Ops.PARAM:
        return r.params[src]
    found = r.arrays.get(src)
    return found[0] if found is not None and found[1] == strides_for(src.shape) else None


@dataclass(frozen=True)
class Taps:
    """The `taps` lowering of one contraction (module docstring): the window operand is `b` when
    `window_is_b`; `t` the tap axis (reduced when `t_inner`), `p` the axis its rows step along,
    `m` = stride(t) / stride(p); `loops` the axes run as loops (batch, then those of p's group before
    p; the first `kept_loops` are kept, the rest reduced); `y_axes` the gathered scratch's axes in
    order (p's extent grown); `own_w`, `own_o` and `inner` the gemm's groups: the window operand's own
    axes, the other operand's, and the reduced ones (without t and the loops)."""
    window_is_b: bool
    t: int
    p: int
    m: int
    t_inner: bool
    loops: list[int]
    kept_loops: int
    y_axes: list[int]
    own_w: list[int]
    own_o: list[int]
    inner: list[int]


def taps_plan(va: View, vb: View, groups: tuple[list[int], ...]) -> Optional[Taps]:
    """The best `taps` split (below), or None when no axis pair of an operand overlaps."""
    batch, rows, inner, cols = groups
    shape = va.shape
    best, best_size = None, None
    for window_is_b in (True, False):
        vw = vb if window_is_b else va
        own, own_o = (cols, rows) if window_is_b else (rows, cols)
        for t in inner + own:
            for p in inner + own:
                if p == t or (t in inner) == (p in inner):
                    continue  # one kernel axis and one output axis, in different groups
                sp, st = vw.strides[p], vw.strides[t]
                if sp <= 0 or st <= 0 or st % sp:
                    continue
                pgroup, qgroup = (inner, own) if p in inner else (own, inner)
                lead = pgroup[:pgroup.index(p)]
                y_axes = [i for i in qgroup if i != t] + pgroup[pgroup.index(p):]
                grown = (shape[t] - 1) * (st // sp) + shape[p]
                size = math.prod(grown if i == p else shape[i] for i in y_axes)
                if size >= math.prod(shape[i] for i in y_axes) * shape[t]:
                    continue  # no smaller than the window itself (im2col)
                red = [i for i in inner if i != t and i not in lead]
                # the largest smallest gemm dimension first (a gemm with K = 25 runs far below one with
                # K = 160; "fewest calls" first chose, for MNIST's 5x5 layer at batch 512, taps over the
                # output rows with K = 25 and a 4.9 MB scratch: 437 ms where the kernel rows take ~200),
                # then the fewest gemm calls (each loop iteration a gather and n_t gemms), then the
                # smallest scratch
                dims = [math.prod(shape[i] for i in g) for g in
                        (own_o, [i for i in own if i != t and i not in lead], red)]
                key = (-min(dims), math.prod(shape[i] for i in batch + lead) * shape[t], size)
                if best_size is None or key < best_size:
                    kept = len(batch) + (0 if p in inner else len(lead))
                    best = Taps(window_is_b, t, p, st // sp, t in inner, batch + lead, kept, y_axes,
                                [i for i in own if i != t and i not in lead], own_o, red)
                    best_size = key
    return best


def _gather(r: Any, dst: str, src: str, base: str, extents: list[int], strides: list[int], depth: int) -> list[str]:
    """C lines copying the strided block (`extents`, element `strides`) at src + base into dense `dst`."""
    lines, at, pad = [], [base], "  " * depth
    names = []
    for n, st in zip(extents, strides):
        v = r.fresh("g")
        names.append(v)
        lines.append(pad + "  " * len(names[:-1]) + f"for (int64_t {v} = 0; {v} < {n}; {v}++)")
        at.append(f"{v} * {st}" if st != 1 else v)
    lines.append(pad + "  " * len(names) + f"*{dst}++ = {src}[{' + '.join(at)}];")
    return lines


def _taps(r: Any, n: Any, a: Any, b: Any, plan: Taps, ptr: dict, ct: str, f: str) -> bool:
    """Emits the `taps` lowering of `n`; False when the other operand cannot be read as matrices."""
    va, vb = a.arg, b.arg
    shape = va.shape
    vw, vo = (vb, va) if plan.window_is_b else (va, vb)
    w_node, o_node = (b, a) if plan.window_is_b else (a, b)
    t, p, m = plan.t, plan.p, plan.m
    size = lambda axes: math.prod(shape[i] for i in axes)  # noqa: E731
    mo, nw, k = size(plan.own_o), size(plan.own_w), size(plan.inner)
    if mo * nw * k < MIN_SUB_GEMM:
        return False
    # the window's scratch Y: per loop iteration, its p axis grown to every row some tap reads
    y_ext = [(shape[t] - 1) * m + shape[p] if i == p else shape[i] for i in plan.y_axes]
    y_dense = strides_for(tuple(y_ext))
    ys = dict(zip(plan.y_axes, y_dense))
    # Y as the gemm's matrix: (inner x own) when it is b, (own x inner) when it is a
    if plan.window_is_b:
        ly = blas_layout(k, nw, _group_stride(ys, shape, plan.inner), _group_stride(ys, shape, plan.own_w))
    else:
        ly = blas_layout(nw, k, _group_stride(ys, shape, plan.own_w), _group_stride(ys, shape, plan.inner))
    if ly is None:
        return False
    y_step = m * ys[p]  # where tap t + 1's matrix starts after tap t's
    # the other operand per (loop iteration, tap): in place when its groups merge, else gathered once
    o_loops = [i for i in plan.loops if vo.strides[i] != 0]
    o_groups = (plan.own_o, plan.inner) if plan.window_is_b else (plan.inner, plan.own_o)
    so = [merged_stride(vo, g) for g in o_groups]
    lo = blas_layout(size(o_groups[0]), size(o_groups[1]), *so) if None not in so else None
    o_pre = None
    if lo is None:
        if o_loops:
            return False
        o_axes = ([t] if vo.strides[t] != 0 else []) + o_groups[0] + o_groups[1]
        o_pre = (o_axes, [shape[i] for i in o_axes], [vo.strides[i] for i in o_axes])
        o_dense = dict(zip(o_axes, strides_for(tuple(shape[i] for i in o_axes))))
        lo = blas_layout(size(o_groups[0]), size(o_groups[1]), _group_stride(o_dense, shape, o_groups[0]),
                         _group_stride(o_dense, shape, o_groups[1]))
        if lo is None:
            return False
    kept_loops, reduced_loops = plan.loops[:plan.kept_loops], plan.loops[plan.kept_loops:]
    t_kept = not plan.t_inner
    # the result's layout: kept loops, then the kept tap axis, then (rows, cols) of the gemm
    rows_g, cols_g = (plan.own_o, plan.own_w) if plan.window_is_b else (plan.own_w, plan.own_o)
    layout = kept_loops + ([t] if t_kept else []) + rows_g + cols_g
    total = size(layout)
    out = r._temp(n, ct, total)
    accumulate = bool(reduced_loops) or not t_kept
    if reduced_loops:
        r.lines.append(f"  memset({out}, 0, {total} * sizeof({ct}));")
    y = r.fresh("y")
    r.lines.append(f"  {ct} *{y} = ({ct} *)malloc({math.prod(y_ext)} * sizeof({ct}));")
    r.temps.append(y)
    o_ptr = ptr[o_node]
    if o_pre is not None:
        o_axes, o_ext, o_st = o_pre
        name = r.fresh("o")
        r.lines.append(f"  {ct} *{name} = ({ct} *)malloc({math.prod(o_ext)} * sizeof({ct}));")
        r.temps.append(name)
        cursor = r.fresh("c")
        r.lines.append(f"  {{ {ct} *{cursor} = {name};")
        r.lines.extend(_gather(r, cursor, o_ptr, r.int_c(vo.offset), o_ext, o_st, 2))
        r.lines.append("  }")
        o_ptr, o_base, o_tap = name, "0", (o_dense[t] if vo.strides[t] != 0 else 0)
    index = ["0"] * len(shape)
    opened, depth = r._loops(shape, plan.loops, index, 1)
    at = [index[i] if i in plan.loops else "0" for i in range(len(shape))]
    if o_pre is None:
        o_base, o_tap = r.offset(vo.offset, vo.strides, shape, at), vo.strides[t]
    w_base = r.offset(vw.offset, vw.strides, shape, at)
    body = []
    pad = "  " * depth
    cursor = r.fresh("c")
    body.append(f"{pad}{{ {ct} *{cursor} = {y};")
    body.extend(_gather(r, cursor, ptr[w_node], w_base, y_ext, [vw.strides[i] for i in plan.y_axes], depth + 1))
    body.append(f"{pad}}}")
    out_strides = dict(zip(layout, strides_for(tuple(shape[i] for i in layout))))
    off_c = " + ".join(f"{index[i]} * {out_strides[i]}" for i in kept_loops if shape[i] != 1) or "0"
    tap = r.fresh("tap")
    c_at = f"{out} + ({off_c})" + (f" + {tap} * {out_strides[t]}" if t_kept else "")
    beta = "1" if reduced_loops else (f"({tap} ? 1 : 0)" if accumulate else "0")
    y_at, o_at = f"{y} + {tap} * {y_step}", f"{o_ptr} + ({o_base}) + {tap} * {o_tap}"
    (a_at, la), (b_at, lb) = ((o_at, lo), (y_at, ly)) if plan.window_is_b else ((y_at, ly), (o_at, lo))
    mm, nn_ = (mo, nw) if plan.window_is_b else (nw, mo)
    body.append(f"{pad}for (int64_t {tap} = 0; {tap} < {shape[t]}; {tap}++)")
    body.append(f"{pad}  at_{f}gemm({CBLAS_ROW_MAJOR}, {la[0]}, {lb[0]}, {mm}, {nn_}, {k}, 1, {a_at}, {la[1]}, "
                f"{b_at}, {lb[1]}, {beta}, {c_at}, {nn_});")
    r.lines.extend(opened)
    r.lines.extend(body)
    r.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
    strides = [0] * len(shape)
    for i, st in out_strides.items():
        strides[i] = st
    r.arrays[n] = (out, tuple(strides))
    return True


def _group_stride(dense: dict[int, int], shape: tuple[int, ...], group: list[int]) -> Optional[int]:
    """The one stride of `group` in a dense layout whose axis strides are `dense`; None if not chained."""
    group = [i for i in group if shape[i] != 1]
    if not group:
        return 0
    for x, y in zip(group, group[1:]):
        if dense[x] != dense[y] * shape[y]:
            return None
    return dense[group[-1]]


def looped_gemm(r: Any, n: Any, groups: tuple[list[int], ...]) -> bool:
    """Emits the REDUCE `n` (a float SUM of the product of two unmasked views, c_render's `_gemm` checked
    that) with renderer `r` as loops of gemms registered in `r.arrays`; False when no split fits (the
    caller then leaves the kernel to numpy or a loop nest)."""
    a, b = n.src[0].src
    pa, pb = _source(r, a), _source(r, b)
    if pa is None or pb is None or a.arg.variables() or b.arg.variables():
        return False
    if any(u.op is Ops.VIEW and u.src[0] is n and u.arg.mask is not None for u in r.order):
        # col2im (masked windows of a column gradient) read per element in C measured 4.8x slower
        # than numpy's per-sample adds (MNIST's 32->32 5x5 layer at batch 128: 414 against 86 ms)
        return False
    ct, f = ("float", "s") if n.dtype.itemsize == 4 else ("double", "d")
    ptr = {a: pa, b: pb}
    plan = taps_plan(a.arg, b.arg, groups)
    if plan is not None and _taps(r, n, a, b, plan, ptr, ct, f):
        return True
    return _looped(r, n, a, b, groups, ptr.get, ct, f)


def _looped(r: Any, n: Any, a: Any, b: Any, groups: tuple[list[int], ...], ptr: Any, ct: str, f: str) -> bool:
    """The `looped` lowering (module docstring); False when no split fits."""
    va, vb = a.arg, b.arg
    shape = va.shape
    plan = peel(va, vb, groups)
    if plan is None:
        return False
    size = lambda axes: math.prod(shape[i] for i in axes)  # noqa: E731
    m, k, nn = size(plan.rows), size(plan.inner), size(plan.cols)
    if m * k * nn < MIN_SUB_GEMM:
        return False
    sa_m, sa_k = merged_stride(va, plan.rows), merged_stride(va, plan.inner)
    sb_k, sb_n = merged_stride(vb, plan.inner), merged_stride(vb, plan.cols)
    if None in (sa_m, sa_k, sb_k, sb_n):
        return False
    la, lb = blas_layout(m, k, sa_m, sa_k), blas_layout(k, nn, sb_k, sb_n)
    if la is None or lb is None:
        return False
    all_rows, all_cols = plan.loop_rows + plan.rows, plan.loop_cols + plan.cols
    m_full, n_full = size(all_rows), size(all_cols)
    total = size(plan.batch) * m_full * n_full
    out = r._temp(n, ct, total)
    loops = plan.batch + plan.loop_rows + plan.loop_cols + plan.loop_inner
    index = ["0"] * len(shape)
    if plan.loop_inner:  # the peeled inner loops accumulate into the result
        r.lines.append(f"  memset({out}, 0, {total} * sizeof({ct}));")
    opened, depth = r._loops(shape, loops, index, 1)
    at = [index[i] if i in loops else "0" for i in range(len(shape))]
    off_a, off_b = r.offset(va.offset, va.strides, shape, at), r.offset(vb.offset, vb.strides, shape, at)
    # the result's element offset of this iteration's sub-block in the [batch, rows, cols] layout
    terms = []
    for i, st in zip(plan.batch, strides_for(tuple(shape[i] for i in plan.batch))):
        terms.append((i, st * m_full * n_full))
    for i, st in zip(plan.loop_rows, strides_for(tuple(shape[i] for i in plan.loop_rows))):
        terms.append((i, st * m * n_full))
    for i, st in zip(plan.loop_cols, strides_for(tuple(shape[i] for i in plan.loop_cols))):
        terms.append((i, st * nn))
    off_c = " + ".join(f"{index[i]} * {st}" for i, st in terms if shape[i] != 1) or "0"
    beta = 1 if plan.loop_inner else 0
    call = (f"at_{f}gemm({CBLAS_ROW_MAJOR}, {la[0]}, {lb[0]}, {m}, {nn}, {k}, 1, {ptr(a)} + ({off_a}), {la[1]}, "
            f"{ptr(b)} + ({off_b}), {lb[1]}, {beta}, {out} + ({off_c}), {n_full});")
    r.lines.extend(opened)
    r.lines.append("  " * depth + call)
    r.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
    strides = [0] * len(shape)
    layout = plan.batch + all_rows + all_cols
    for i, st in zip(layout, strides_for(tuple(shape[i] for i in layout))):
        strides[i] = st
    r.arrays[n] = (out, tuple(strides))
    return True


__all__ = ["MIN_SUB_GEMM", "Peeled", "looped_gemm", "peel"]
