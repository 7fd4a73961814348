"""dtypes, promotion and weak Python scalars.

A `DType` names a numpy dtype and carries a priority used by the promotion lattice. The lattice is
tinygrad's (itself close to JAX's): promoting two dtypes takes the least dtype that both can be
converted to without losing their kind. Python scalars are *weak*: `float32 * 2.0` stays float32,
`int32 + 1` stays int32, an int tensor with a Python float gives the default float.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, order=True)
class DType:
    """A tensor element type: `priority` orders the promotion lattice, `itemsize` is in bytes."""
    priority: int
    itemsize: int
    name: str
    kind: str  # "b" bool, "i" signed int, "u" unsigned int, "f" float

    # every DType is one of the class attributes of `dtypes`, so identity hashing is exact and fast
    __hash__ = object.__hash__

    @property
    def np(self) -> np.dtype:
        """The numpy dtype with the same layout."""
        return _NUMPY[self.name]

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    @property
    def min(self) -> Any:
        """The lowest value of this dtype (-inf for floats, as tinygrad's `DType.min`)."""
        if self.kind == "b":
            return False
        return -float("inf") if self.kind == "f" else int(np.iinfo(self.np).min)

    @property
    def max(self) -> Any:
        """The highest value of this dtype (inf for floats)."""
        if self.kind == "b":
            return True
        return float("inf") if self.kind == "f" else int(np.iinfo(self.np).max)


def _bfloat16_numpy() -> np.dtype | None:
    try:
        import ml_dtypes  # maintained bfloat16 for numpy; optional
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


class dtypes:
    """The dtype namespace, as in tinygrad: `dtypes.float32`, `dtypes.default_float`, ..."""
    bool = DType(0, 1, "bool", "b")
    int8 = DType(1, 1, "int8", "i")
    uint8 = DType(2, 1, "uint8", "u")
    int16 = DType(3, 2, "int16", "i")
    uint16 = DType(4, 2, "uint16", "u")
    int32 = DType(5, 4, "int32", "i")
    uint32 = DType(6, 4, "uint32", "u")
    int64 = DType(7, 8, "int64", "i")
    uint64 = DType(8, 8, "uint64", "u")
    float16 = DType(11, 2, "float16", "f")
    bfloat16 = DType(12, 2, "bfloat16", "f")
    float32 = DType(13, 4, "float32", "f")
    float64 = DType(14, 8, "float64", "f")
    half, float, double = float16, float32, float64
    char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
    default_float = float32
    default_int = int32

    @staticmethod
    def is_float(dt: DType) -> builtins_bool:
        return dt.kind == "f"

    @staticmethod
    def is_int(dt: DType) -> builtins_bool:
        return dt.kind in "iu"

    @staticmethod
    def is_unsigned(dt: DType) -> builtins_bool:
        return dt.kind == "u"

    @staticmethod
    def from_py(value: Any) -> DType:
        """The dtype a Python scalar (or nested list of them) takes on its own."""
        if isinstance(value, (list, tuple)):
            return max((dtypes.from_py(v) for v in value), default=dtypes.default_float)
        if isinstance(value, bool):
            return dtypes.bool
        if isinstance(value, int):  # beyond int32's range: int64 (and uint64 beyond int64's)
            if -2 ** 31 <= value < 2 ** 31:
                return dtypes.default_int
            return dtypes.int64 if -2 ** 63 <= value < 2 ** 63 else dtypes.uint64
        return dtypes.default_float

    @staticmethod
    def from_numpy(dt: np.dtype) -> DType:
        """The atensor dtype of a numpy dtype; a clear error for dtypes atensor does not have."""
        found = _FROM_NUMPY.get(dt)
        if found is not None:
            return found
        for candidate in ALL_DTYPES:
            if candidate.name in _NUMPY and _NUMPY[candidate.name] == np.dtype(dt):
                _FROM_NUMPY[dt] = candidate
                return candidate
        raise TypeError(f"numpy dtype {np.dtype(dt)} has no atensor dtype; convert the array first, "
                        f"e.g. with .astype(np.float32)")


builtins_bool = bool
ALL_DTYPES: tuple[DType, ...] = tuple(v for v in vars(dtypes).values() if isinstance(v, DType))
ALL_DTYPES = tuple(sorted(set(ALL_DTYPES)))

_NUMPY: dict[str, np.dtype] = {d.name: np.dtype(d.name) for d in ALL_DTYPES if d.name != "bfloat16"}
_FROM_NUMPY: dict = {}  # numpy dtype (or type) -> DType, filled as they are met
if (_bf16 := _bfloat16_numpy()) is not None:
    _NUMPY["bfloat16"] = _bf16

_PROMO_LATTICE: dict[DType, list[DType]] = {
    dtypes.bool: [dtypes.int8, dtypes.uint8], dtypes.int8: [dtypes.int16], dtypes.int16: [dtypes.int32],
    dtypes.int32: [dtypes.int64], dtypes.int64: [dtypes.float16, dtypes.bfloat16],
    dtypes.uint8: [dtypes.int16, dtypes.uint16], dtypes.uint16: [dtypes.int32, dtypes.uint32],
    dtypes.uint32: [dtypes.int64, dtypes.uint64], dtypes.uint64: [dtypes.float16, dtypes.bfloat16],
    dtypes.float16: [dtypes.float32], dtypes.bfloat16: [dtypes.float32], dtypes.float32: [dtypes.float64],
}


@functools.cache
def _parents(dt: DType) -> frozenset[DType]:
    if dt == dtypes.float64:
        return frozenset({dt})
    return frozenset({dt}).union(*(_parents(p) for p in _PROMO_LATTICE[dt]))


@functools.cache
def least_upper_dtype(*ds: DType) -> DType:
    """The least dtype every one of `ds` promotes to (tinygrad's lattice)."""
    return min(frozenset.intersection(*(_parents(d) for d in ds)))


def least_upper_float(dt: DType) -> DType:
    """`dt` itself if it is a float, else the default float (what `exp` of an int tensor gives)."""
    return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)


def to_dtype(spec: Any) -> DType:
    """Accepts a DType, a dtype name ("float32"), a numpy dtype or a Python type."""
    if isinstance(spec, DType):
        return spec
    if spec is float:
        return dtypes.default_float
    if spec is int:
        return dtypes.default_int
    if spec is bool:
        return dtypes.bool
    if isinstance(spec, str) and isinstance(getattr(dtypes, spec, None), DType):
        return getattr(dtypes, spec)
    try:
        return dtypes.from_numpy(np.dtype(spec))
    except TypeError as exc:
        raise TypeError(f"unknown dtype {spec!r}; use one of {[d.name for d in ALL_DTYPES]}") from exc
