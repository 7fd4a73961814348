"""Random tensor programs and their numpy model, for the differential fuzzer (tests/fuzz).

A program is a list of `Op`s applied in turn to a running value that starts as input 0; some ops
bring in another input (a broadcasting operand, a condition). It is drawn op by op with hypothesis
while the numpy model runs alongside, so every op fits the shape and dtype it is applied to: the
same program then runs on atensor (`run(program, tensors, AT)`) and on numpy
(`run(program, arrays, NP)`), and the two results must agree.

Values are small integers (halves for floats), so nearly every op the programs use is exact in float32 and
in int32: results on different kernel paths (numpy backend, C kernels, jit replays) must be equal, not
close, and any difference is a defect, not rounding.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from hypothesis import strategies as st

from atensor import Tensor, dtypes

DTYPES = ("int32", "float32", "bool")
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"


def examples(ci: int) -> int:
    """Examples per property: `ci` in CI (the derandomized `ci` profile), 25 times more at night."""
    return ci * 25 if LONG else ci


@dataclass(frozen=True)
class Op:
    """One step: `kind` and its arguments (plain Python values, so a failing program prints well)."""
    kind: str
    args: tuple = ()


@dataclass
class Program:
    inputs: list[tuple[tuple[int, ...], str]]  # (shape, dtype) of each input; input 0 starts the chain
    ops: list[Op]


def make_input(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Small exact values: integers in [-3, 3] (halves for floats), or random bools."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    values = rng.integers(-3, 4, shape)
    return (values * 0.5).astype(np.float32) if dtype == "float32" else values.astype(np.int32)


# ---- the two interpreters ----------------------------------------------------------------------------
IDENTITY = {"max": {"float32": -np.inf, "int32": np.iinfo(np.int32).min, "bool": False},
            "min": {"float32": np.inf, "int32": np.iinfo(np.int32).max, "bool": True}}


class _Numpy:
    """The model: numpy, with atensor's documented semantics where numpy has none (reductions over
    empty axes give the identity; sums of int32 and bool stay int32)."""

    @staticmethod
    def unary(x: np.ndarray, fn: str) -> np.ndarray:
        if fn == "neg":
            return np.negative(x)
        if fn == "not":
            return np.logical_not(x)
        if fn == "relu":
            return np.maximum(x, np.zeros((), x.dtype))
        return np.abs(x)

    @staticmethod
    def scalar(x: np.ndarray, op: str, c: Any) -> np.ndarray:
        c = np.array(c, x.dtype)
        with np.errstate(all="ignore"):
            return {"add": np.add, "mul": np.multiply, "sub": np.subtract, "max": np.maximum,
                    "lt": np.less, "eq": np.equal, "floordiv": np.floor_divide, "mod": np.remainder,
                    "div": np.divide}[op](x, c)

    @staticmethod
    def binary(x: np.ndarray, op: str, y: np.ndarray, swap: bool) -> np.ndarray:
        a, b = (y, x) if swap else (x, y)
        return {"add": np.add, "mul": np.multiply, "sub": np.subtract, "max": np.maximum,
                "and": np.logical_and, "or": np.logical_or, "lt": np.less}[op](a, b)

    @staticmethod
    def where(x: np.ndarray, cond: np.ndarray, c: Any) -> np.ndarray:
        return np.where(cond, x, np.array(c, x.dtype))

    @staticmethod
    def cast(x: np.ndarray, dtype: str) -> np.ndarray:
        return x.astype(dtype)

    @staticmethod
    def reduce(x: np.ndarray, op: str, axis: Optional[tuple[int, ...]], keepdim: bool) -> np.ndarray:
        if op == "sum":
            acc = np.float32 if x.dtype == np.float32 else np.int64
            return np.sum(x.astype(acc), axis=axis, keepdims=keepdim).astype(
                np.float32 if x.dtype == np.float32 else np.int32)
        fn = np.max if op == "max" else np.min
        return fn(x, axis=axis, keepdims=keepdim, initial=IDENTITY[op][x.dtype.name])

    @staticmethod
    def movement(x: np.ndarray, kind: str, arg: Any) -> np.ndarray:
        if kind == "permute":
            return np.transpose(x, arg)
        if kind == "reshape":
            return x.reshape(arg)
        if kind == "expand":
            return np.broadcast_to(x, arg)
        if kind == "pad":
            return np.pad(x, arg)
        if kind == "flip":
            return np.flip(x, arg)
        if kind == "slice":
            return x[tuple(slice(*s) for s in arg)]
        if kind == "index":
            axis, i = arg
            return x[(slice(None),) * axis + (i,)]
        return x.copy()  # contiguous


class _Atensor:
    @staticmethod
    def unary(x: Tensor, fn: str) -> Tensor:
        return {"neg": lambda: -x, "not": lambda: x.logical_not(), "relu": lambda: x.relu(),
                "abs": lambda: x.abs()}[fn]()

    @staticmethod
    def scalar(x: Tensor, op: str, c: Any) -> Tensor:
        return {"add": lambda: x + c, "mul": lambda: x * c, "sub": lambda: x - c, "max": lambda: x.maximum(c),
                "lt": lambda: x < c, "eq": lambda: x == c, "floordiv": lambda: x // c, "mod": lambda: x % c,
                "div": lambda: x / c}[op]()

    @staticmethod
    def binary(x: Tensor, op: str, y: Tensor, swap: bool) -> Tensor:
        a, b = (y, x) if swap else (x, y)
        return {"add": lambda: a + b, "mul": lambda: a * b, "sub": lambda: a - b, "max": lambda: a.maximum(b),
                "and": lambda: a & b, "or": lambda: a | b, "lt": lambda: a < b}[op]()

    @staticmethod
    def where(x: Tensor, cond: Tensor, c: Any) -> Tensor:
        return cond.where(x, c)

    @staticmethod
    def cast(x: Tensor, dtype: str) -> Tensor:
        return x.cast(getattr(dtypes, dtype))

    @staticmethod
    def reduce(x: Tensor, op: str, axis: Optional[tuple[int, ...]], keepdim: bool) -> Tensor:
        return getattr(x, op)(axis, keepdim)

    @staticmethod
    def movement(x: Tensor, kind: str, arg: Any) -> Tensor:
        if kind == "permute":
            return x.permute(*arg)
        if kind == "reshape":
            return x.reshape(*arg) if arg else x.reshape(())
        if kind == "expand":
            return x.expand(*arg)
        if kind == "pad":
            return x.pad(arg)
        if kind == "flip":
            return x.flip(arg)
        if kind == "slice":
            return x[tuple(slice(*s) for s in arg)]
        if kind == "index":
            axis, i = arg
            return x[(slice(None),) * axis + (i,)]
        return x.contiguous()


NP, AT = _Numpy(), _Atensor()
MOVEMENT = ("permute", "reshape", "expand", "pad", "flip", "slice", "index", "contiguous")


def step(lib: Any, x: Any, op: Op, inputs: list[Any]) -> Any:
    """`op` applied to the running value `x` by `lib` (NP or AT); `inputs` are the program's inputs."""
    kind, a = op.kind, op.args
    if kind == "unary":
        return lib.unary(x, *a)
    if kind == "scalar":
        return lib.scalar(x, *a)
    if kind == "binary":
        return lib.binary(x, a[0], inputs[a[1]], a[2])
    if kind == "where":
        return lib.where(x, inputs[a[0]], a[1])
    if kind == "cast":
        return lib.cast(x, *a)
    if kind == "reduce":
        return lib.reduce(x, *a)
    return lib.movement(x, kind, a[0] if a else None)


def run(program: Program, inputs: list[Any], lib: Any) -> Any:
    x = inputs[0]
    for op in program.ops:
        x = step(lib, x, op, inputs)
    return x


# ---- drawing programs ----------------------------------------------------------------------------------
def shapes(max_rank: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of rank 0..max_rank with sizes 0..4 (0 and 1 often)."""
    return st.lists(st.sampled_from([0, 1, 1, 2, 3, 4]), max_size=max_rank).map(tuple)


def _scalar_for(dtype: str, draw: Callable) -> Any:
    if dtype == "float32":
        return draw(st.integers(-3, 3)) * 0.5
    return draw(st.integers(-3, 3))


def _broadcast_partner(shape: tuple[int, ...], draw: Callable) -> tuple[int, ...]:
    """A shape that broadcasts against `shape` to `shape`: some axes 1, maybe fewer leading axes."""
    drop = draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    return tuple(1 if draw(st.booleans()) else s for s in kept)


def _reshape_target(shape: tuple[int, ...], draw: Callable) -> tuple[int, ...]:
    choice = draw(st.sampled_from(["flat", "insert1", "drop1", "merge", "split"]))
    size = math.prod(shape)
    if choice == "flat":
        return (size,)
    if choice == "insert1":
        at = draw(st.integers(0, len(shape)))
        return shape[:at] + (1,) + shape[at:]
    if choice == "drop1" and 1 in shape:
        at = shape.index(1)
        return shape[:at] + shape[at + 1:]
    if choice == "merge" and len(shape) >= 2:
        at = draw(st.integers(0, len(shape) - 2))
        return shape[:at] + (shape[at] * shape[at + 1],) + shape[at + 2:]
    if choice == "split":
        for at, s in enumerate(shape):
            if s in (4, 6, 8, 9, 12):
                f = 2 if s % 2 == 0 else 3
                return shape[:at] + (f, s // f) + shape[at + 1:]
    return (size,)


def _slice_for(size: int, draw: Callable) -> tuple[Optional[int], Optional[int], int]:
    step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    stop = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    return start, stop, step


@st.composite
def programs(draw: Callable, max_ops: int = 6, movement_weight: int = 2, first: tuple[tuple[str, ...], ...] = (),
             shape: Any = None, dtype: Any = None) -> Program:
    """A random program (its ops fit the shapes and dtypes the model computes while drawing). `first`
    lists, step by step, the kinds the program's first ops are drawn from (where one fits), before
    `max_ops` random ones; `shape` and `dtype` are strategies for input 0."""
    dtype = draw(dtype if dtype is not None else st.sampled_from(DTYPES))
    shape = draw(shape if shape is not None else shapes())
    inputs = [(shape, dtype)]
    rng = np.random.default_rng(0)
    arrays = [make_input(shape, dtype, rng)]
    x = arrays[0]
    ops: list[Op] = []
    count = draw(st.integers(1, max_ops))
    for n in range(len(first) + count):
        dt = x.dtype.name
        kinds = list(first[n]) if n < len(first) else \
            ["unary", "scalar", "binary", "where", "cast", "reduce"] + list(MOVEMENT) * movement_weight
        kind = draw(st.sampled_from(kinds))
        op: Optional[Op] = None
        if kind == "unary":
            fn = "not" if dt == "bool" else draw(st.sampled_from(["neg", "relu", "abs"]))
            op = Op("unary", (fn,))
        elif kind == "scalar" and dt != "bool":
            name = draw(st.sampled_from(["add", "mul", "sub", "max", "lt", "eq", "mod"]
                                        + (["floordiv"] if dt == "int32" else ["div"])))
            op = Op("scalar", (name, _scalar_for(dt, draw)))
        elif kind == "binary":
            partner = _broadcast_partner(x.shape, draw)
            inputs.append((partner, dt))
            arrays.append(make_input(partner, dt, rng))
            names = ["and", "or"] if dt == "bool" else ["add", "mul", "sub", "max", "lt"]
            op = Op("binary", (draw(st.sampled_from(names)), len(arrays) - 1, draw(st.booleans())))
        elif kind == "where" and dt != "bool":
            partner = _broadcast_partner(x.shape, draw)
            inputs.append((partner, "bool"))
            arrays.append(make_input(partner, "bool", rng))
            op = Op("where", (len(arrays) - 1, _scalar_for(dt, draw)))
        elif kind == "cast":
            targets = [d for d in DTYPES if d != dt and (d != "int32" or np.isfinite(x).all())]
            op = Op("cast", (draw(st.sampled_from(targets)),))  # no float-to-int cast of an infinity
        elif kind == "reduce" and x.ndim:
            op_name = draw(st.sampled_from(["sum", "max", "min"]))
            axes = draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True))
            op = Op("reduce", (op_name, tuple(sorted(axes)), draw(st.booleans())))
        elif kind == "permute" and x.ndim >= 2:
            op = Op("permute", (tuple(draw(st.permutations(range(x.ndim)))),))
        elif kind == "reshape":
            op = Op("reshape", (_reshape_target(x.shape, draw),))
        elif kind == "expand" and 1 in x.shape:
            op = Op("expand", (tuple(draw(st.sampled_from([1, 2, 3])) if s == 1 else s for s in x.shape),))
        elif kind == "pad" and x.ndim:
            op = Op("pad", (tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in x.shape),))
        elif kind == "flip" and x.ndim:
            axes = draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True))
            op = Op("flip", (tuple(sorted(axes)),))
        elif kind == "slice" and x.ndim:
            op = Op("slice", (tuple(_slice_for(s, draw) for s in x.shape),))
        elif kind == "index" and x.ndim and any(x.shape):
            axis = draw(st.sampled_from([a for a, s in enumerate(x.shape) if s]))
            op = Op("index", ((axis, draw(st.integers(-x.shape[axis], x.shape[axis] - 1))),))
        elif kind == "contiguous":
            op = Op("contiguous")
        if op is None:
            continue
        x = step(NP, x, op, arrays)
        if x.size > 4096:  # expands and pads of pads: keep programs small
            break
        ops.append(op)
    return Program(inputs, ops)


def fresh_inputs(program: Program, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_input(shape, dtype, rng) for shape, dtype in program.inputs]


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal shape and dtype; equal values for integers and bools, and for floats up to float32
    rounding (sums of large values may be added in another order on another path)."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, numpy model {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy model {want.dtype}"
    if want.dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)
