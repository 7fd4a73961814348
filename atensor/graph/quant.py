"""Packed weight formats: GGUF's block layouts, one row of a table each, and the argument of the ops
that read them.

Why here, in graph/: a quantized matmul is a node of the lazy graph (`Ops.QMATMUL`), scheduled,
proved in bounds and replayed like any kernel, so its argument (which format, how many rows and
columns) must be a hashable value the graph can intern. Only the layouts live here; dequantizing is
the backends' (backend/quant/numpy_kernels.py for numpy, backend/quant/kernels.py for C).

The layouts (ggml-common.h), per block of `block` elements stored in `block_bytes` bytes:
    Q4_0  18 bytes: fp16 d, 16 bytes of nibbles              value d * (q - 8)
    Q4_1  20 bytes: fp16 d, fp16 m, 16 bytes of nibbles      value d * q + m
    Q8_0  34 bytes: fp16 d, 32 int8                          value d * q
    F16    2 bytes: one IEEE half                            BF16  2 bytes: the top half of a float32
In Q4_0 and Q4_1, element j of a block sits in the low nibble of byte j and element j + 16 in its
high nibble. A row of a packed matrix is `cols / block` blocks, rows one after another: GGUF's own
(out, in) order, so a matmul reads each row's blocks in order.

Invariant: every value a format decodes is exact in float32 (d * q has at most 15 significant bits;
Q4_1 adds m with one rounding, the same in every backend), so a packed model computes with exactly
the weights of its float32 dequantization; only the order of the sums differs.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantFormat:
    """One block layout: `block` elements in `block_bytes` bytes; `code` is the C kernels' number."""
    name: str
    block: int
    block_bytes: int
    code: int

    def row_bytes(self, cols: int) -> int:
        """Bytes of one row of `cols` elements; raises when `cols` is not a whole number of blocks."""
        if cols % self.block:
            raise ValueError(f"a {self.name} row holds whole blocks of {self.block} elements; "
                             f"{cols} columns is not a multiple of {self.block}")
        return cols // self.block * self.block_bytes


Q4_0 = QuantFormat("q4_0", 32, 18, 0)
Q4_1 = QuantFormat("q4_1", 32, 20, 1)
Q8_0 = QuantFormat("q8_0", 32, 34, 2)
F16 = QuantFormat("f16", 1, 2, 3)
BF16 = QuantFormat("bf16", 1, 2, 4)
FORMATS: dict[str, QuantFormat] = {f.name: f for f in (Q4_0, Q4_1, Q8_0, F16, BF16)}


def format_named(name: str) -> QuantFormat:
    """The format called `name` (q4_0, q4_1, q8_0, f16, bf16, any case); raises naming the known ones."""
    found = FORMATS.get(name.lower())
    if found is None:
        raise ValueError(f"no packed format {name!r}; atensor reads {', '.join(FORMATS)}")
    return found


ACTIVATIONS = ("float32", "q8_0")  # a QMATMUL's numerics: x as given, or quantized to Q8_0 per 32
Q8ACT_FLAG = 16  # the C kernels' format code | this: activations quantized (backend/quant/q8_c.py)


@dataclass(frozen=True)
class PackedShape:
    """What a QMATMUL or DEQUANT node reads: a (rows, cols) matrix packed as `format`, as a flat
    uint8 source of `rows * format.row_bytes(cols)` bytes. `activations` is a QMATMUL's numerics:
    "float32" (the default: x as given, the weights decoded exactly) or "q8_0" (llama.cpp's: each row
    of x quantized to Q8_0 per 32 values and block dot products in integers; F16 and BF16 weights keep
    float32 activations)."""
    format: QuantFormat
    rows: int
    cols: int
    activations: str = "float32"

    def __post_init__(self) -> None:
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations={self.activations!r}: a packed matmul's activations are one of "
                             f"{ACTIVATIONS}")

    @property
    def q8act(self) -> bool:
        """Whether a QMATMUL quantizes x (only for the block formats: F16 and BF16 keep float32)."""
        return self.activations == "q8_0" and self.format.block == 32

    @property
    def kernel_code(self) -> int:
        """The format's number for the C kernels, with Q8ACT_FLAG when x is quantized."""
        return self.format.code | (Q8ACT_FLAG if self.q8act else 0)

    @property
    def nbytes(self) -> int:
        return self.rows * self.format.row_bytes(self.cols)
