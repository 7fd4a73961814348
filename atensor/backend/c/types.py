"""C types of atensor's dtypes, and `Unsupported`: what the C renderers (backend/c/render.py, backend/gemm/c_gemm.py,
backend/gpu/render.py) share without importing one another.
"""
from __future__ import annotations

from atensor.dtype import DType, dtypes


class Unsupported(Exception):
    """The kernel uses something the C renderer does not lower; it stays a numpy kernel."""


CTYPES = {dtypes.bool: "uint8_t", dtypes.int8: "int8_t", dtypes.uint8: "uint8_t", dtypes.int16: "int16_t",
          dtypes.uint16: "uint16_t", dtypes.int32: "int32_t", dtypes.uint32: "uint32_t",
          dtypes.int64: "int64_t", dtypes.uint64: "uint64_t", dtypes.float32: "float",
          dtypes.float64: "double"}


def ctype(dtype: DType) -> str:
    """The C type of `dtype`; raises Unsupported for one C kernels do not handle (half floats)."""
    found = CTYPES.get(dtype)
    if found is None:
        raise Unsupported(f"dtype {dtype}")
    return found
