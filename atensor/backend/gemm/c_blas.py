"""The BLAS calls of the C renderer: which gemm or gemv computes a contraction, at which strides.

Why apart from backend/c/render.py: the renderer decides *that* a REDUCE over a product of two views is a
matrix product; this module decides how BLAS is told about the operands (transpose flags, leading
dimensions, vector increments), pure functions of strides and sizes that tests can check on their own.
A product with one row or one column is a gemv: OpenBLAS's gemm with m = 1 packs the whole matrix
before it multiplies, which measured 3x slower than gemv for batch-1 decode's matrix-vector products;
a product of a few rows over a matrix that fits in cache (attention's group of query rows against a
key block) is one gemv per row, for the same reason.
"""
from __future__ import annotations

from typing import NamedTuple

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


# A product with at most GEMV_ROWS rows (or columns) whose other operand fits in cache is one gemv per
# row: OpenBLAS's gemm packs the matrix before it multiplies, which dominates a small product. Measured
# (one thread, /tmp microbenchmark in the commit message): 3 rows of a 256x64 attention key block, 15.8 us
# as a gemm against 11.9 us as 4 gemvs at m = 4 and 8.4 us at m = 2; at m = 8 they tie, at 16 gemm
# wins 1.7x. A matrix too big for cache is read from memory once per gemv: there gemm wins at m = 4
# (576x3072, 1.1 ms against 2.7 ms).
GEMV_ROWS = 4
GEMV_MATRIX_BYTES = 1 << 20
# A float32 product of 2..ROWS_MAX rows with a matrix too big for cache, stored as nn.Linear's weight is
# (x (m x k) . W^T, W n x k: a few requests' rows through a layer) is c_prelude's at_sgemm_rows, which
# reads W once with the m rows of x in L1 (at most ROWS_BYTES of them), on one thread. Measured (/tmp
# microbenchmark on this 2-core machine, W several times the cache, against numpy's OpenBLAS gemm on
# both cores): 1536x576 at m = 2 190-210 us against 403-415, m = 4 286-324 against 427-432; 49152x576
# m = 2 5.7-7.7 ms against 14.7-15.5, m = 4 8.5-11.8 against 15.2-15.6; 576x1536 m = 2 187-189 against
# 336-379, but m = 4 (24 KiB of rows) 539-547 against 354-369, and m = 8 at k = 576 753 against 407:
# hence the bounds. With W as (k x n) rows (x . W, the layout models/llama.py stores) OpenBLAS's gemm
# stays: kernels that stream it 16 or 256 columns at a time were 1.5-4x slower than it here.
ROWS_MAX = 4
ROWS_BYTES = 16 << 10


class GemvPlan(NamedTuple):
    """`count` gemvs computing an (m x k) . (k x n) product: matrix-vector products of one operand (the
    matrix: transpose flag, rows, cols, leading dimension) with rows of the first operand
    (`vector_first`) or columns of the second, each result vector written into the [m, n] result."""
    trans: int
    rows: int
    cols: int
    ld: int
    vector_first: bool
    count: int        # gemvs: rows of the first operand, or columns of the second
    vector_step: int  # element offset from one vector to the next within its operand
    inc: int          # element stride within a vector
    out_step: int     # element offset from one result vector to the next in the [m, n] result
    out_inc: int      # element stride within a result vector


def gemv_plan(m: int, k: int, n: int, la: tuple[int, int], lb: tuple[int, int],
              strides: tuple[int, int, int, int], itemsize: int) -> GemvPlan | None:
    """The gemvs of an (m x k) . (k x n) product whose operands have strides (sa_m, sa_k, sb_k, sb_n) and
    BLAS layouts `la`, `lb`: one gemv when m == 1 or n == 1, one per row (column) when there are at
    most GEMV_ROWS of them and the other operand fits in GEMV_MATRIX_BYTES; None for a gemm (or a
    vector broadcast along k, whose stride 0 BLAS does not take)."""
    sa_m, sa_k, sb_k, sb_n = strides
    rows_ok = m == 1 or (m <= GEMV_ROWS and k * n * itemsize <= GEMV_MATRIX_BYTES)
    cols_ok = n == 1 or (n <= GEMV_ROWS and m * k * itemsize <= GEMV_MATRIX_BYTES)
    if rows_ok and (sa_k != 0 or k == 1) and (m == 1 or m <= n or not cols_ok):
        trans, ld = lb  # x (k) . B (k x n): B^T x, for each row x of A
        head = (CBLAS_TRANS, k, n, ld) if trans == CBLAS_NO_TRANS else (CBLAS_NO_TRANS, n, k, ld)
        return GemvPlan(*head, True, m, sa_m, sa_k or 1, n, 1)
    if cols_ok and (sb_k != 0 or k == 1):
        trans, ld = la  # A (m x k) . b (k): A b, for each column b of B
        head = (CBLAS_NO_TRANS, m, k, ld) if trans == CBLAS_NO_TRANS else (CBLAS_TRANS, k, m, ld)
        return GemvPlan(*head, False, n, sb_n, sb_k or 1, 1, n)
    return None


def rows_plan(m: int, k: int, la: tuple[int, int], lb: tuple[int, int], itemsize: int) -> tuple[int, int] | None:
    """(lda, ldw) when an (m x k) . (k x n) product that `gemv_plan` left to a gemm is at_sgemm_rows: 2 to
    ROWS_MAX float32 rows of A with k contiguous (`la` not transposed), B = W^T with W's rows of k
    contiguous (`lb` transposed), and the rows within ROWS_BYTES; else None."""
    if itemsize != 4 or not 2 <= m <= ROWS_MAX or m * k * itemsize > ROWS_BYTES:
        return None
    if la[0] != CBLAS_NO_TRANS or lb[0] != CBLAS_TRANS:
        return None
    return la[1], lb[1]


# A float32 product of 1..SMALL_ROWS rows whose other operand (k x n) is at most SMALL_MATRIX_BYTES (in
# L2) is c_prelude's at_sgemm_rows (W^T stored n x k) or at_sgemm_rows_nn (B stored k x n), not BLAS:
# attention's scores and its probabilities-times-values at decode, a head's few query rows against its
# key and value blocks. Measured (SmolLM2's decode attention, 3 query rows per key head, a 128-position
# window of 64-wide heads, one thread): the kernel took 15.3 us with a gemv per row (OpenBLAS: 18 calls,
# 60% of the kernel) and 11.1-12.0 us with these (/tmp per-kernel timer, the kernels called directly).
SMALL_ROWS = 4
SMALL_MATRIX_BYTES = 256 << 10


def small_plan(m: int, k: int, n: int, la: tuple[int, int], lb: tuple[int, int],
               itemsize: int) -> tuple[str, int, int] | None:
    """(the prelude function, lda, ldb) when an (m x k) . (k x n) product is a few float32 rows of A with
    k contiguous against a matrix small enough for cache: `at_sgemm_rows` when B is W^T with W's rows of
    k contiguous (`lb` transposed), `at_sgemm_rows_nn` when B's rows of n are contiguous; else None."""
    if itemsize != 4 or not 1 <= m <= SMALL_ROWS or k * n * itemsize > SMALL_MATRIX_BYTES:
        return None
    if la[0] != CBLAS_NO_TRANS:
        return None
    if n == 1 and lb == (CBLAS_NO_TRANS, 1):  # a contiguous column (RMSNorm's x . x): one W row of k
        return "at_sgemm_rows", la[1], k
    return ("at_sgemm_rows" if lb[0] == CBLAS_TRANS else "at_sgemm_rows_nn"), la[1], lb[1]


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


__all__ = ["CBLAS_NO_TRANS", "CBLAS_ROW_MAJOR", "CBLAS_TRANS", "GEMV_MATRIX_BYTES", "GEMV_ROWS", "GemvPlan",
           "ROWS_BYTES", "ROWS_MAX", "SMALL_MATRIX_BYTES", "SMALL_ROWS", "blas_layout", "gemv_plan",
           "merged_stride", "rows_plan", "small_plan"]
