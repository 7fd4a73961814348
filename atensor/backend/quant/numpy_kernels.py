"""Packed weights in numpy: each format's blocks decoded to float32, and the numpy kernels of QMATMUL
and DEQUANT.

Why a numpy path at all: it is the reference the C kernels are held to in tests (beside the gguf
package's own `dequantize`), and what runs when no C compiler is there or `settings.native` is "0".
It decodes the whole matrix per call, so it is slow; the C kernels (backend/quant/kernels.py) never
materialize the weights.

Each decode works on the bytes as a (rows, blocks, block_bytes) uint8 array; d and m are fp16 read
through a uint8 -> float16 view, widened to float32 before any arithmetic (graph/quant.py: every value
is then exact, and Q4_1's `d * q + m` rounds once, as in C).
"""
from __future__ import annotations

import numpy as np

from atensor.graph.quant import BF16, F16, PackedShape, Q4_0, Q4_1, Q8_0


def _half(raw: np.ndarray) -> np.ndarray:
    """fp16 numbers in the last axis's pairs of bytes (little endian), as float32 with that axis gone."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) values: element j is byte j's low nibble, j + 16 its high nibble."""
    return np.concatenate([raw & 0x0F, raw >> 4], axis=-1).astype(np.float32)


def dequantize(packed: np.ndarray, shape: PackedShape) -> np.ndarray:
    """The (rows, cols) float32 matrix a flat uint8 array holds in `shape.format`."""
    fmt, rows, cols = shape.format, shape.rows, shape.cols
    data = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)  # the bytes, whatever the dtype
    if data.size != shape.nbytes:
        raise ValueError(f"a {fmt.name} ({rows}, {cols}) matrix is {shape.nbytes} bytes, got {data.size}")
    if fmt is F16:
        return data.view("<f2").astype(np.float32).reshape(rows, cols)
    if fmt is BF16:
        return (data.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(rows, cols)
    blocks = data.reshape(rows, cols // fmt.block, fmt.block_bytes)
    d = _half(blocks[..., 0:2])[..., None]
    if fmt is Q8_0:
        values = d * blocks[..., 2:].view(np.int8).astype(np.float32)
    elif fmt is Q4_0:
        values = d * (_nibbles(blocks[..., 2:]) - np.float32(8))
    elif fmt is Q4_1:
        values = d * _nibbles(blocks[..., 4:]) + _half(blocks[..., 2:4])[..., None]
    else:  # a format added to graph/quant.py's table without its decode here
        raise NotImplementedError(f"no numpy decode of {fmt.name}")
    return values.astype(np.float32).reshape(rows, cols)


def qmatmul(x: np.ndarray, packed: np.ndarray, shape: PackedShape) -> np.ndarray:
    """x (..., cols) float32 times the packed matrix transposed: (..., rows), with `shape.activations`'
    numerics."""
    if shape.q8act:
        return qmatmul_q8act(x, packed, shape)
    weights = dequantize(packed, shape)
    return (x.reshape(-1, shape.cols).astype(np.float32) @ weights.T).reshape(x.shape[:-1] + (shape.rows,))


def quantize_rows_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x (m, cols) as Q8_0 blocks, llama.cpp's way: (q (m, cols/32, 32) int8, d (m, cols/32)
    float32) with d = max|x| / 127 per block and q = round(x / d) (x times the float32 inverse of d,
    halves rounded away from zero as C's roundf does)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = blocks * inverse[..., None]
    whole = np.trunc(v)
    q = np.where(np.abs(v - whole) == np.float32(0.5), whole + np.sign(v), np.round(v))
    return q.astype(np.int8), d


def _weight_ints(packed: np.ndarray, shape: PackedShape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer weights (rows, blocks, 32): Q4_0's nibbles minus 8, Q4_1's nibbles, Q8_0's int8; d and
    m (rows, blocks) float32, m zero but for Q4_1)."""
    fmt = shape.format
    blocks = np.ascontiguousarray(packed).reshape(-1).view(np.uint8).reshape(shape.rows, -1, fmt.block_bytes)
    d = _half(blocks[..., 0:2])
    if fmt is Q8_0:
        return blocks[..., 2:].view(np.int8).astype(np.int32), d, np.zeros_like(d)
    if fmt is Q4_0:
        return _nibbles(blocks[..., 2:]).astype(np.int32) - 8, d, np.zeros_like(d)
    return _nibbles(blocks[..., 4:]).astype(np.int32), d, _half(blocks[..., 2:4])


def qmatmul_q8act(x: np.ndarray, packed: np.ndarray, shape: PackedShape, chunk: int = 2048) -> np.ndarray:
    """The Q8-activation product (backend/quant/q8_c.py's numerics) in numpy: per block the integer dot
    product of the weights and x's Q8_0 values, scaled by d_w * d_x (Q4_1 adds m_w * d_x * sum(q_x));
    the blocks summed in float64. Weight rows go `chunk` at a time (the integer products are
    (rows, rows of x, blocks) int64)."""
    lead = x.shape[:-1]
    q, dx = quantize_rows_q8(x.reshape(-1, shape.cols))
    qx, sx = q.astype(np.int64), q.astype(np.int64).sum(-1)
    out = np.empty((q.shape[0], shape.rows), np.float64)
    for r0 in range(0, shape.rows, chunk):
        part = PackedShape(shape.format, min(chunk, shape.rows - r0), shape.cols)
        row_bytes = shape.format.row_bytes(shape.cols)
        ints, dw, mw = _weight_ints(np.ascontiguousarray(packed).reshape(-1).view(np.uint8)[
            r0 * row_bytes:(r0 + part.rows) * row_bytes], part)
        dots = np.einsum("rbj,ibj->irb", ints.astype(np.int64), qx)
        scale = dw.astype(np.float64)[None] * dx.astype(np.float64)[:, None]
        out[:, r0:r0 + part.rows] = (scale * dots).sum(-1) + (mw.astype(np.float64)[None] * (
            dx.astype(np.float64) * sx)[:, None]).sum(-1)
    return out.astype(np.float32).reshape(lead + (shape.rows,))


__all__ = ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "dequantize", "qmatmul", "qmatmul_q8act", "quantize_rows_q8"]
