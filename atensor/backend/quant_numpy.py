"""Packed weights in numpy: each format's blocks decoded to float32, and the numpy kernels of QMATMUL
and DEQUANT.

Why a numpy path at all: it is the reference the C kernels are held to in tests (beside the gguf
package's own `dequantize`), and what runs when no C compiler is there or `settings.native` is "0".
It decodes the whole matrix per call, so it is slow; the C kernels (quant_kernels.py) never
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
    """x (..., cols) float32 times the packed matrix transposed: (..., rows)."""
    weights = dequantize(packed, shape)
    return (x.reshape(-1, shape.cols).astype(np.float32) @ weights.T).reshape(x.shape[:-1] + (shape.rows,))


__all__ = ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "dequantize", "qmatmul"]
