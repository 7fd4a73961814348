"""The C renderer's BLAS lowering: a REDUCE(SUM) over a product of two broadcast views (a matmul in
disguise) as one gemm or a few gemvs per batch element (backend/gemm/c_blas.py decides the calls), into a temporary
laid out [batch, rows, cols] and read back through strides.

Why apart from backend/c/render.py: it is the one place that turns sizes into BLAS arguments, including sizes
that depend on a variable (a symbolic-length contraction, graph/view.py): `_SymSize` plans them at their
maximum and prints the variable's expression into the call.
"""
from __future__ import annotations

import math
from typing import Any

from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.symbolic import hi_of
from atensor.graph.view import strides_for, symbolic_shape
from atensor.backend.gemm.c_blas import (CBLAS_ROW_MAJOR, blas_layout, gemv_plan, merged_stride, rows_plan,
                                    small_plan)
from atensor.backend.gemm.conv_c import looped_gemm
from atensor.backend.c.types import Unsupported, ctype as _ctype
from atensor.backend.gemm.axes import contraction_groups

NUMPY_CONTRACTION_FLOPS = 1 << 20  # a contraction this large that cannot be a gemm here stays on numpy


def render_gemm(cr: Any, n: Node) -> bool:
    """A SUM over a product of two broadcast views as BLAS gemms, rendered into `cr` (a CRenderer:
    its lines, temporaries and arrays); False when it does not fit."""
    op, axes = n.arg
    prod = n.src[0]
    if op is not ReduceOp.SUM or prod.op is not Ops.MUL or n.dtype not in (dtypes.float32, dtypes.float64):
        return False
    a, b = prod.src
    if any(x.op is not Ops.VIEW or x.arg.mask is not None or x.dtype != n.dtype
           or x.src[0].op in (Ops.CONST, Ops.ARANGE) for x in (a, b)):
        return False
    va, vb = a.arg, b.arg
    shape = va.shape
    batch, rows, inner, cols = contraction_groups(va, vb, axes)
    if any(i in axes for i in rows + cols) or any(shape[i] != 1 and i not in inner for i in axes):
        return False  # a reduced axis that both operands broadcast multiplies the sum: not a gemm
    symbolic = symbolic_shape(shape)
    if symbolic:
        if any(type(shape[i]) is not int for i in batch):
            return False
        sizes = [_blas_size(cr, shape, g) for g in (rows, inner, cols)]
        if None in sizes:
            return False
        m, k, nn = sizes
    else:
        m, k, nn = (math.prod(shape[i] for i in g) for g in (rows, inner, cols))
    if m * k * nn == 0:
        return False
    sa_m, sa_k = merged_stride(va, rows), merged_stride(va, inner)
    sb_k, sb_n = merged_stride(vb, inner), merged_stride(vb, cols)
    la = blas_layout(m, k, sa_m, sa_k) if None not in (sa_m, sa_k) else None
    lb = blas_layout(k, nn, sb_k, sb_n) if None not in (sb_k, sb_n) else None
    if la is None or lb is None:
        if not symbolic and looped_gemm(cr, n, (batch, rows, inner, cols)):
            return True  # groups that do not merge, or a window operand: loops of gemms (backend/gemm/conv_c.py)
        if not symbolic and math.prod(shape[i] for i in batch) * m * k * nn >= NUMPY_CONTRACTION_FLOPS:
            # an operand BLAS cannot read in place (a convolution's window view): numpy's chunked
            # contraction (backend/gemm/contraction.py) copies it chunk by chunk; a loop nest here would
            # run the product without BLAS, measured 3x slower on a 5x5 convolution
            raise Unsupported("a large contraction whose operand needs a copy for BLAS")
        return False
    for x in (a, b):
        if x.src[0].op is not Ops.PARAM and x.src[0] not in cr.arrays:
            return False
    ct = _ctype(n.dtype)
    size = math.prod(shape[i] for i in batch) * m * nn
    out = cr._temp(n, ct, size)
    ptr = lambda x: cr.params[x.src[0]] if x.src[0].op is Ops.PARAM else cr.arrays[x.src[0]][0]
    for x in (a, b):
        if x.src[0].op is not Ops.PARAM and cr.arrays[x.src[0]][1] != strides_for(x.src[0].shape):
            return False
    index = ["0"] * len(shape)
    opened, depth = cr._loops(shape, batch, index, 1)
    off_a = cr.offset(va.offset, va.strides, shape, [index[i] if i in batch else "0" for i in range(len(shape))])
    off_b = cr.offset(vb.offset, vb.strides, shape, [index[i] if i in batch else "0" for i in range(len(shape))])
    batch_strides = strides_for(tuple(shape[i] for i in batch))
    off_c = " + ".join([f"{index[i]} * {s * m * nn}" for i, s in zip(batch, batch_strides)
                        if shape[i] != 1] or ["0"])
    f = "s" if n.dtype == dtypes.float32 else "d"
    a_at, b_at, c_at = f"{ptr(a)} + ({off_a})", f"{ptr(b)} + ({off_b})", f"{out} + ({off_c})"
    small = small_plan(m, k, nn, la, lb, n.dtype.itemsize)
    gemv = gemv_plan(m, k, nn, la, lb, (sa_m, sa_k, sb_k, sb_n), n.dtype.itemsize) if small is None else None
    if small is not None:
        # a few rows against a matrix in cache (attention at decode): no BLAS call per row (backend/gemm/c_blas.py)
        fn, lda, ldb = small
        call = f"{fn}({m}, {nn}, {k}, {a_at}, {lda}, {b_at}, {ldb}, {c_at}, {int(nn)});"
    elif gemv is not None:
        # a few rows or columns: matrix-vector products, which read the matrix without packing it
        # (OpenBLAS's gemm with m = 1 packs the whole matrix first: 3x slower at batch-1 decode,
        # measured; backend/gemm/c_blas.py has the figures for a few rows)
        matrix, vector = (b_at, a_at) if gemv.vector_first else (a_at, b_at)
        r = cr.fresh("r") if gemv.count > 1 else "0"
        at = lambda base, step: base if r == "0" or step == 0 else f"{base} + {r} * {step}"
        call = (f"at_{f}gemv({CBLAS_ROW_MAJOR}, {gemv.trans}, {gemv.rows}, {gemv.cols}, 1, {matrix}, "
                f"{gemv.ld}, {at(vector, int(gemv.vector_step))}, {int(gemv.inc)}, 0, "
                f"{at(c_at, int(gemv.out_step))}, {int(gemv.out_inc)});")
        if r != "0":
            call = f"for (int64_t {r} = 0; {r} < {gemv.count}; {r}++) {call}"
    elif (few := rows_plan(m, k, la, lb, n.dtype.itemsize)) is not None:
        # a few rows against a big matrix: read once, not packed first (backend/gemm/c_blas.py has the figures)
        call = f"at_sgemm_rows({m}, {nn}, {k}, {a_at}, {few[0]}, {b_at}, {few[1]}, {c_at}, {int(nn)});"
    else:
        call = (f"at_{f}gemm({CBLAS_ROW_MAJOR}, {la[0]}, {lb[0]}, {m}, {nn}, {k}, 1, {a_at}, {la[1]}, "
                f"{b_at}, {lb[1]}, 0, {c_at}, {int(nn)});")
    cr.lines.extend(opened)
    cr.lines.append("  " * depth + call)
    cr.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
    # element strides of the [batch, rows, cols] result along each axis of n's shape
    strides = [0] * len(shape)
    layout = batch + rows + cols
    layout_strides = strides_for(tuple(shape[i] for i in layout))
    for i, s in zip(layout, layout_strides):
        strides[i] = s
    cr.arrays[n] = (out, tuple(strides))
    return True


def _blas_size(cr: Any, shape: tuple, group: list[int]):
    """The BLAS size of `group`'s axes of a symbolic shape: an int, a `_SymSize` when one axis is
    symbolic and the rest are 1, or None (a symbolic dim merged with others has no single stride)."""
    dims = [shape[i] for i in group if shape[i] != 1]
    if all(type(d) is int for d in dims):
        return math.prod(dims)
    if len(dims) != 1:
        return None
    return _SymSize(hi_of(dims[0]), cr.int_c(dims[0]))


class _SymSize(int):
    """A BLAS size that depends on a variable (a symbolic-length contraction). The plans of backend/gemm/c_blas.py
    compare and multiply it as its maximum, an int: every layout and leading dimension chosen for the
    maximum holds for a smaller value, since a symbolic dim is laid out at its maximum (graph/view.py).
    Printed into the C call (`{m}`), it is the C expression of its value; a leading dimension or step
    of the result layout is printed as `int(...)`, the maximum."""
    expr: str

    def __new__(cls, hi: int, expr: str) -> _SymSize:
        size = int.__new__(cls, hi)
        size.expr = expr
        return size

    def __str__(self) -> str:
        return self.expr

    def __format__(self, spec: str) -> str:
        return self.expr
