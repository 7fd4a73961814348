"""The name the Tensor mixins use for "a tensor" in their annotations, without importing tensor/tensor.py.

tensor/tensor.py builds `Tensor` from the op mixins (tensor/ops.py, tensor/mathops.py, ...), so a mixin that
imported tensor/tensor.py back, even under `TYPE_CHECKING`, would close an import circle through all of them
(tests/test_layering.py forbids that). Instead a mixin method annotates with `typing.Self`: the class
it is called on, which is `Tensor`. A free helper function has no `Self`; it takes and returns
`AnyTensor`, which a type checker reads as `Any`: such helpers call methods from every mixin, and no
type smaller than `Tensor` itself declares them all. Runtime code in the mixins makes new tensors with
`type(self)(...)` or `self._new(...)`, never by naming `Tensor`.
"""
from __future__ import annotations

from typing import Any, TypeAlias, Union

from atensor.dtype import DType, dtypes
from atensor.graph.node import GraphError

AnyTensor: TypeAlias = Any  # a Tensor, where `Self` is not available (free functions, staticmethods)

Scalar = Union[int, float, bool]


def _axis(axis: int, ndim: int, op: str = "axis") -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IndexError(f"{op} {axis} is out of range for a tensor with {ndim} dimensions")
    return axis + ndim if axis < 0 else axis


def broadcast_shape(*shapes: tuple[int, ...], op: str = "op") -> tuple[int, ...]:
    """numpy's broadcast of `shapes`; a clear error naming them when they do not broadcast."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for sizes in zip(*padded):
        big = {s for s in sizes if s != 1}
        if len(big) > 1:
            raise GraphError(f"shapes {' and '.join(map(str, shapes))} cannot broadcast in {op}")
        out.append(big.pop() if big else 1)
    return tuple(out)


def _wrap(value: int, dt: DType) -> int:
    """`value` reduced modulo 2**bits into `dt`'s range (two's complement for signed dtypes)."""
    bits = dt.itemsize * 8
    v = value & ((1 << bits) - 1)
    return v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v


def _sum_dtype(dt: DType) -> DType:
    if dt == dtypes.bool or (dt.kind == "i" and dt.itemsize < 4):
        return dtypes.int32
    if dt.kind == "u" and dt.itemsize < 4:
        return dtypes.uint32
    return dt


class TensorBase:
    """The last base of `Tensor`: `isinstance(x, TensorBase)` is how an op mixin tells a Tensor apart from
    a Python value without importing tensor.py."""
    __slots__ = ()
