"""What each op computes, as numpy functions: the reference that constant folding and the numpy
kernel backend share, so the two can never disagree.

Conventions (PyTorch's, which numpy shares): `IDIV` is floor division, `MOD` takes the divisor's
sign, `MAX` propagates NaN, comparisons give bool. Integer division by zero gives 0 (numpy's
behaviour) instead of trapping.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from atensor.dtype import DType, dtypes
from atensor.graph.ops import Ops, ReduceOp


def _not(x: np.ndarray) -> np.ndarray:
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def _trunc(x: np.ndarray) -> np.ndarray:
    return np.trunc(x) if x.dtype.kind == "f" else x


def threefry2x32(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011): a counter-based random function.
    Each uint64 counter with a uint64 key gives 64 random bits; the same (counter, key) always gives the
    same bits, whatever the device, order or batching: that is what makes `rand` reproducible."""
    counter = np.asarray(counter, dtype=np.uint64)
    key = np.asarray(key, dtype=np.uint64)
    mask32 = np.uint64(0xFFFFFFFF)
    x0 = (counter & mask32).astype(np.uint32)
    x1 = (counter >> np.uint64(32)).astype(np.uint32)
    k0 = np.broadcast_to((key & mask32).astype(np.uint32), x0.shape)
    k1 = np.broadcast_to((key >> np.uint64(32)).astype(np.uint32), x0.shape)
    k2 = k0 ^ k1 ^ np.uint32(0x1BD11BDA)
    ks = (k0, k1, k2)
    rotations = (13, 15, 26, 6, 17, 29, 16, 24)
    with np.errstate(over="ignore"):
        x0 = x0 + k0
        x1 = x1 + k1
        for block in range(5):
            for r in range(4):
                rot = np.uint32(rotations[(block % 2) * 4 + r])
                x0 = x0 + x1
                x1 = (x1 << rot) | (x1 >> (np.uint32(32) - rot))
                x1 = x1 ^ x0
            x0 = x0 + ks[(block + 1) % 3]
            x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return (x1.astype(np.uint64) << np.uint64(32)) | x0.astype(np.uint64)


UNARY_FNS: dict[Ops, Callable[[np.ndarray], np.ndarray]] = {
    Ops.NEG: np.negative, Ops.RECIP: np.reciprocal, Ops.SQRT: np.sqrt, Ops.EXP: np.exp, Ops.LOG: np.log,
    Ops.SIN: np.sin, Ops.COS: np.cos, Ops.TANH: np.tanh, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.TRUNC: _trunc, Ops.NOT: _not,
}

BINARY_FNS: dict[Ops, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.true_divide,
    Ops.IDIV: np.floor_divide, Ops.MOD: np.remainder, Ops.MAX: np.maximum, Ops.POW: np.power,
    Ops.CMPLT: np.less, Ops.CMPEQ: np.equal, Ops.CMPNE: np.not_equal, Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.THREEFRY: threefry2x32,
}


def reduce_identity(op: ReduceOp, dtype: DType) -> Any:
    """The value a reduction of zero elements gives: 0 for sum, 1 for prod, the lowest value for max."""
    if op is ReduceOp.SUM:
        return False if dtype == dtypes.bool else 0
    if op is ReduceOp.PROD:
        return True if dtype == dtypes.bool else 1
    if dtype == dtypes.bool:
        return False
    if dtypes.is_int(dtype):
        return np.iinfo(dtype.np).min
    return -np.inf


def reduce_fn(op: ReduceOp, x: np.ndarray, axes: tuple[int, ...], dtype: DType) -> np.ndarray:
    """Reduces `x` over `axes`, keeping them as size-1 axes, with the result in `dtype`."""
    npdt = dtype.np
    if op is ReduceOp.MAX:
        if x.size == 0:
            return np.full(tuple(1 if i in axes else s for i, s in enumerate(x.shape)),
                           reduce_identity(op, dtype), dtype=npdt)
        return np.max(x, axis=axes, keepdims=True)
    acc = npdt
    if dtype in (dtypes.float16, dtypes.bfloat16):
        acc = np.float32  # accumulate half precision in float32, as PyTorch does
    if dtype == dtypes.bool:
        fn = np.any if op is ReduceOp.SUM else np.all
        return fn(x, axis=axes, keepdims=True)
    fn = np.sum if op is ReduceOp.SUM else np.prod
    out = fn(x, axis=axes, keepdims=True, dtype=acc)
    return out if out.dtype == npdt else out.astype(npdt)


def cast_fn(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Converts values to `dtype` (float to int truncates toward zero, as C and PyTorch do)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype.np)


def gather_fn(source: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`source[index]` for a flat source, with 0 where the index is outside [0, len(source))."""
    valid = (index >= 0) & (index < source.shape[0])
    if source.shape[0] == 0:
        return np.zeros(index.shape, dtype=source.dtype)
    picked = source[np.where(valid, index, 0)]
    return np.where(valid, picked, np.zeros((), dtype=source.dtype))


def scatter_fn(base: np.ndarray, index: np.ndarray, values: np.ndarray, reduce: str) -> np.ndarray:
    """A copy of the flat `base` with `values` written at `index` ("set": the last write to a position
    wins), added ("sum"), maxed ("max") or multiplied ("prod": exact in integers, wrapping as numpy and
    torch do) into it; indices outside [0, len(base)) write nothing."""
    out = np.array(base, copy=True)
    valid = (index >= 0) & (index < base.shape[0])
    at, vals = index[valid], np.asarray(values)[valid]
    if reduce == "set":
        out[at] = vals
    elif out.dtype == np.bool_:  # sum and max of bools are both "any", prod is "all"
        (np.logical_and if reduce == "prod" else np.logical_or).at(out, at, vals)
    else:
        {"sum": np.add, "max": np.maximum, "prod": np.multiply}[reduce].at(out, at, vals)
    return out


def bitcast_fn(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Reinterprets the bits of `x` as `dtype` (same item size)."""
    return np.ascontiguousarray(x).view(dtype.np)


def fold_constant(op: Ops, dtype: DType, src_dtypes: list[DType], values: list[Any]) -> Any:
    """Evaluates an elementwise op on Python scalars in the sources' dtype arithmetic (constant folding)."""
    arrays = [np.asarray(v, dtype=dt.np) for v, dt in zip(values, src_dtypes)]
    with np.errstate(all="ignore"):
        if op in UNARY_FNS:
            out = UNARY_FNS[op](arrays[0])
        elif op is Ops.CAST:
            out = cast_fn(arrays[0], dtype)
        elif op is Ops.WHERE:
            out = np.where(arrays[0], arrays[1], arrays[2])
        else:
            out = BINARY_FNS[op](*arrays)
    return np.asarray(out).astype(dtype.np).item()
