"""`PackedWeight`: a weight matrix kept in its file's block format (GGUF Q4_0, Q4_1, Q8_0, F16, BF16),
multiplied without ever being dequantized in memory.

Why a weight object and not a dtype: a Q4_1 block is 32 values in 20 bytes with two scales; no
element has an address or a stride of its own, so a "q4_1 tensor" could not be viewed, sliced or
added like the Tensors around it. What a model does with a packed matrix is narrow: multiply by it
(`linear`), read rows of it (`rows`, an embedding), or decode it (`dequantize`). Each is a graph node
over a uint8 Tensor of the packed bytes (Ops.QMATMUL, Ops.DEQUANT, graph/quant.py), so it is a
kernel like any other: scheduled, proved in bounds, profiled, jit-replayed, compiled to C
(backend/quant/kernels.py) or run in numpy (backend/quant/numpy_kernels.py).

    >>> import numpy as np
    >>> from atensor import Tensor
    >>> from atensor.graph.quant import Q8_0
    >>> block = np.zeros(34, np.uint8); block[:2] = np.array([0.5], np.float16).view(np.uint8); block[2:] = 2
    >>> w = PackedWeight.from_bytes(block, Q8_0, rows=1, cols=32)
    >>> w.linear(Tensor.ones(1, 32)).tolist()
    [[32.0]]

Memory: `from_bytes` of a CPU device keeps the given array as the buffer's memory (no copy), so
weights read from a memory-mapped file stay the file's pages, shared with the page cache.
"""
from __future__ import annotations

import numpy as np

from atensor.config import settings
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.quant import PackedShape, QuantFormat
from atensor.hcq.device import Device, canonical
from atensor.tensor.tensor import Tensor


def wrap_array(array: np.ndarray, device: str | None = None) -> Tensor:
    """A tensor whose storage is `array` itself (C-contiguous; read-only arrays such as a file's
    memory map too) on a CPU device, or a copy of it elsewhere. The tensor must never be assigned into
    when `array` is read-only."""
    dev = canonical(device or settings.default_device)
    if not (isinstance(dev, str) and dev.startswith("CPU")) or not array.flags.c_contiguous:
        return Tensor(np.ascontiguousarray(array), device=dev)
    spec = BufferSpec(dev, array.size, dtypes.from_numpy(array.dtype))
    Device.get(dev).allocate(spec, data=array.reshape(-1))
    node = spec.node(0)
    return Tensor(node if array.ndim == 1 else node.reshape(array.shape))


class PackedWeight:
    """A (rows, cols) matrix packed in `format`: rows of whole blocks, one after another (GGUF's order,
    PyTorch's (out, in) for a projection). `packed` is the flat uint8 Tensor of its bytes.
    `activations` is `linear`'s numerics: "float32" (x as given, the weights decoded exactly: the
    float32 model's values) or "q8_0" (llama.cpp's: x quantized to Q8_0 per 32, integer block dot
    products; faster, not exact; graph/quant.py)."""

    def __init__(self, packed: Tensor, format: QuantFormat, rows: int, cols: int, activations: str = "float32"):
        self.shape = PackedShape(format, rows, cols, activations)
        if packed.dtype != dtypes.uint8 or packed.shape != (self.shape.nbytes,):
            raise ValueError(f"a {format.name} ({rows}, {cols}) matrix is a ({self.shape.nbytes},) uint8 tensor, "
                             f"got {packed.shape} {packed.dtype.name}")
        self.packed = packed

    @staticmethod
    def from_bytes(data: np.ndarray, format: QuantFormat, rows: int, cols: int,
                   device: str | None = None, activations: str = "float32") -> PackedWeight:
        """The matrix whose packed bytes are `data` (any shape; its bytes are read, whatever its dtype:
        an F16 matrix may come as float16), kept as they are on a CPU device when C-contiguous."""
        flat = np.asarray(data)
        flat = (flat if flat.flags.c_contiguous else np.ascontiguousarray(flat)).reshape(-1).view(np.uint8)
        return PackedWeight(wrap_array(flat, device), format, rows, cols, activations)

    @property
    def format(self) -> QuantFormat:
        return self.shape.format

    @property
    def rows(self) -> int:
        return self.shape.rows

    @property
    def cols(self) -> int:
        return self.shape.cols

    @property
    def nbytes(self) -> int:
        return self.shape.nbytes

    @property
    def device(self) -> str:
        return self.packed.device

    def linear(self, x: Tensor) -> Tensor:
        """x (..., cols) float32 @ W^T: (..., rows), one QMATMUL kernel (PyTorch's F.linear without bias)."""
        if x.dtype != dtypes.float32:
            x = x.cast(dtypes.float32)
        return Tensor(Node.make(Ops.QMATMUL, dtypes.float32, (x.node, self.packed.node), self.shape))

    def dequantize(self) -> Tensor:
        """The matrix as float32 (rows, cols): one DEQUANT kernel."""
        shape = PackedShape(self.format, self.rows, self.cols)
        return Tensor(Node.make(Ops.DEQUANT, dtypes.float32, (self.packed.node,), shape))

    def rows_at(self, ids: Tensor) -> Tensor:
        """Rows `ids` (n,) integer of the matrix as float32 (n, cols), an embedding lookup: the rows'
        bytes are gathered (an id outside [0, rows) reads zero bytes, a row of zeros), then decoded."""
        count = ids.shape[0]
        if ids.ndim != 1:
            raise ValueError(f"rows_at takes a (n,) tensor of row ids, got shape {ids.shape}")
        row_bytes = self.format.row_bytes(self.cols)
        index_type = dtypes.int32 if self.nbytes < 2 ** 31 else dtypes.int64
        clipped = ids.cast(index_type)
        inside = (clipped >= 0) * (clipped < self.rows)  # an id outside reads past the packed bytes: zeros
        first = inside.where(clipped * row_bytes, self.nbytes)
        at = first.reshape(count, 1) + Tensor.arange(row_bytes, dtype=index_type, device=self.device).reshape(1, -1)
        raw = Tensor(Node.make(Ops.GATHER, dtypes.uint8, (self.packed.node, at.reshape(-1).node)))
        shape = PackedShape(self.format, count, self.cols)
        return Tensor(Node.make(Ops.DEQUANT, dtypes.float32, (raw.node,), shape))

    def __repr__(self) -> str:
        tail = f", activations={self.shape.activations}" if self.shape.activations != "float32" else ""
        return f"PackedWeight({self.format.name}, rows={self.rows}, cols={self.cols}, {self.nbytes} bytes{tail})"
