"""The BLAS calls of the C renderer: which gemm or gemv computes a contraction, at which strides.

Why apart from c_render.py: the renderer decides *that* a REDUCE over a product of two views is a
matrix product; this module decides how BLAS is told about the operands (transpose flags, leading
dimensions, vector increments), pure functions of strides and sizes that tests can check on their own.
A product with one row or one column is a gemv: OpenBLAS's gemm with m = 1 packs the whole matrix
before it multiplies, which measured 3x slower than gemv for batch-1 decode's matrix-vector products.
"""
from __future__ import annotations

from atensor.graph.view import View

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112


def merged_stride(view: View, group: list[int]) -> int | None:
    """The one stride that walks `group`'s axes of `view` as a single row-major axis; None when
    their strides do not chain (an empty group walks nothing: stride 0)."""
    if not group:
        return 0
    for x, y in zip(group, group[1:]):
        if view.strides[x] != view.strides[y] * view.shape[y]:
            return None
    return view.strides[group[-1]]


def gemv_shape(m: int, k: int, n: int, la: tuple[int, int], lb: tuple[int, int], sa_k: int,
               sb_k: int) -> tuple[int, int, int, int, bool] | None:
    """The gemv of an (m x k) . (k x n) product with m == 1 or n == 1, as (transpose flag, rows, cols,
    leading dimension of the matrix, whether the vector is the first operand); None for a gemm (or a
    vector broadcast along k, whose stride 0 BLAS does not take)."""
    if m == 1 and (sa_k != 0 or k == 1):  # x (k) . B (k x n): B^T x
        trans, ld = lb
        return (CBLAS_TRANS, k, n, ld, True) if trans == CBLAS_NO_TRANS else (CBLAS_NO_TRANS, n, k, ld, True)
    if n == 1 and (sb_k != 0 or k == 1):  # A (m x k) . b (k): A b
        trans, ld = la
        return (CBLAS_NO_TRANS, m, k, ld, False) if trans == CBLAS_NO_TRANS else (CBLAS_TRANS, k, m, ld, False)
    return None


def blas_layout(rows: int, cols: int, s_row: int, s_col: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) for a rows x cols matrix at these strides, or None."""
    if s_row < 0 or s_col < 0:
        return None
    if cols == 1 or s_col == 1:
        ld = s_row if rows > 1 else max(cols, 1)
        return (CBLAS_NO_TRANS, ld) if ld >= max(cols, 1) else None
    if rows == 1 or s_row == 1:
        ld = s_col if cols > 1 else max(rows, 1)
        return (CBLAS_TRANS, ld) if ld >= max(rows, 1) else None
    return None


__all__ = ["CBLAS_NO_TRANS", "CBLAS_ROW_MAJOR", "CBLAS_TRANS", "blas_layout", "gemv_shape", "merged_stride"]
