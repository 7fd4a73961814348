"""Elementwise ops of Tensor: dtype casts, arithmetic and comparison operators with numpy's
broadcasting, unary math, rounding, tests for nan/inf, the inverse trigonometric and hyperbolic
functions, and `where`.

Each method builds graph nodes; nothing runs. Broadcasting follows numpy: shapes align on the right
and axes of size 1 expand (a stride-0 view, never a copy). Python scalars are weak (dtype.py). The
functions without a graph op of their own are compositions of existing ops, so their gradients come
from the ops' rules: erf is the Abramowitz-Stegun 7.1.26 polynomial (absolute error below 1.5e-7,
enough for float32); asin is Abramowitz-Stegun 4.4.46 (absolute error below 2e-8, tinygrad's choice),
and acos and atan are built from it; the hyperbolic inverses use the log forms, with |x| and the sign
split off where the direct form would cancel badly for negative x. Rounding is built from TRUNC:
floor, ceil, and round half to even (numpy's and PyTorch's rule).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence

import numpy as np

from atensor.dtype import DType, dtypes, least_upper_dtype, least_upper_float, to_dtype
from atensor.graph.node import GraphError, Node, cached_const as _const_node, signed_zero
from atensor.graph.symbolic import as_dim, is_symbolic, lo_of
from atensor.graph.ops import COMPARISON, Ops
from atensor.tensor.base import Scalar, TensorBase, _wrap, broadcast_shape


_ASIN = (-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
         -0.2145988016, 1.5707963050)
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _poly(x: Any, coefficients: tuple[float, ...]) -> Any:
    """Horner's rule, highest power first."""
    out = x * 0 + coefficients[0]
    for c in coefficients[1:]:
        out = out * x + c
    return out



_BOOL = dtypes.bool
# the range of each integer dtype, for the weak-scalar fast path (DType.min/max ask numpy each time)
_INT_RANGE: dict[DType, tuple[int, int]] = {}


def _same_shape_operand(node: Node, other: Any, cls: type) -> Optional[Node]:
    """The node of `other` as the second operand of an elementwise op on `node` when nothing needs casting
    or broadcasting: a tensor of `node`'s shape and dtype, or a Python int or float that stays `node`'s
    dtype as a weak scalar (any of them for a float dtype, an int in range for an integer one) on one
    device. None otherwise: `_operands` then applies the general rules (promotion, broadcasting, wrap).
    This is what the general rules give in these cases, without their Python calls (most ops are these)."""
    kind = type(other)
    if kind is cls:
        found = other.node
        return found if found.dtype is node.dtype and found.shape == node.shape else None
    if kind is not float and kind is not int:
        return None
    dt = node.dtype
    if dt.kind != "f":
        if kind is float or dt.kind not in "iu":
            return None
        bounds = _INT_RANGE.get(dt)
        if bounds is None:
            bounds = _INT_RANGE[dt] = (dt.min, dt.max)
        if not bounds[0] <= other <= bounds[1]:
            return None
    device = node.device
    if other == 0 and kind is float:  # -0.0 equals 0.0 as a cache key (graph/node.py NegativeZero)
        other = signed_zero(other)
    if type(device) is str:
        return _const_node(other, dt, device, node.shape)
    # a sharded or replicated `node` (MULTI, graph/multi.py): the scalar made on each device in the shape
    # of that device's shard, laid out like `node`, so the op runs per shard as it is. The general rules
    # build the same values from a replicated 0-d constant that is broadcast and then sliced per device:
    # 3-4 more nodes per operand (the flagship's 2-device step makes ~20 such operands)
    return Node.make(Ops.MULTI, dt, tuple([_const_node(other, dt, s.device, s.shape) for s in node.src]),
                     node.arg)


class ElementwiseOps:
    """Elementwise methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- broadcasting and dtypes ---------------------------------------------------------------
    def _const_like(self, value: Scalar, dtype: Optional[DType] = None) -> Self:
        return type(self).full(self.shape, value, dtype=dtype or self.dtype, device=self.device)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Self:
        if self.shape == tuple(shape):
            return self
        full = broadcast_shape(self.shape, tuple(shape), op="expand")
        if full != tuple(shape):
            raise GraphError(f"cannot broadcast shape {self.shape} to {tuple(shape)}")
        node = self.node
        if len(shape) > len(self.shape):
            node = node.reshape((1,) * (len(shape) - len(self.shape)) + self.shape)
        return self._new(node.expand(tuple(shape)))

    def _operands(self, other: Any, op: str, reverse: bool = False) -> tuple[Self, Self]:
        """Both operands as tensors of one dtype and shape; Python scalars are weak."""
        cls = type(self)
        x = self
        if isinstance(other, cls):
            y = other
            dt = least_upper_dtype(x.dtype, y.dtype)
        elif isinstance(other, (bool, int, float)):
            if isinstance(other, float) and not dtypes.is_float(x.dtype):
                dt = dtypes.default_float
            elif isinstance(other, int) and not isinstance(other, bool) and x.dtype == dtypes.bool:
                dt = dtypes.default_int
            else:
                dt = x.dtype
            if dtypes.is_int(dt) and type(other) is int and not dt.min <= other <= dt.max:
                other = _wrap(other, dt)  # a weak int wraps to the tensor's dtype, as in C and tinygrad
            if isinstance(x.device, str):  # fast path: one cached constant node of the final shape
                x = x.cast(dt)
                y = cls(Node.const(other, dt, x.device, x.shape))
                return (y, x) if reverse else (x, y)
            y = cls.full((), other, dtype=dt, device=x.device)
        elif is_symbolic(other):
            y = x._symbolic_scalar(other)  # a mean's count over a symbolic axis, a length in an expression
            dt = x.dtype if dtypes.is_float(x.dtype) else dtypes.default_int
        else:
            raise TypeError(f"unsupported operand for {op}: Tensor and {type(other).__name__}")
        x, y = x.cast(dt), y.cast(dt)
        shape = broadcast_shape(x.shape, y.shape, op=op)
        x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        return (y, x) if reverse else (x, y)

    def _symbolic_scalar(self, expr: Any) -> Self:
        """A 0-d int tensor holding the value of `expr` (a Variable or linear Sym) at run time: the count
        of a constant of that length, a reduce the kernel loops to the bound value (graph/view.py), so
        one kernel serves every value."""
        low = lo_of(expr)
        length = as_dim(expr - low if low else expr)
        ones = type(self).full((1,), 1, dtype=dtypes.int32, device=self.device).expand(length)
        count = ones.sum()
        return count + low if low else count

    def _binary(self, op: Ops, other: Any, name: str, reverse: bool = False) -> Self:
        node = self.node
        operand = _same_shape_operand(node, other, type(self))
        if operand is not None:  # the common case: nothing to cast or broadcast (see _same_shape_operand)
            a, b = (operand, node) if reverse else (node, operand)
            return self._new(Node.make(op, _BOOL if op in COMPARISON else node.dtype, (a, b)))
        x, y = self._operands(other, name, reverse)
        return self._new(x.node.alu(op, y.node))

    def cast(self, dtype: Any) -> Self:
        """Values converted to `dtype` (float to int truncates toward zero)."""
        if dtype is self._node.dtype:
            return self
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._new(self.node.cast(dt))

    def bitcast(self, dtype: Any) -> Self:
        """The same bits read as `dtype` (same item size)."""
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise GraphError(f"bitcast from {self.dtype.name} to {dt.name}: item sizes differ")
        return self._new(Node.make(Ops.BITCAST, dt, (self.node,)))

    def float(self) -> Self:
        return self.cast(dtypes.float32)

    def half(self) -> Self:
        return self.cast(dtypes.float16)

    def double(self) -> Self:
        return self.cast(dtypes.float64)

    def int(self) -> Self:
        return self.cast(dtypes.int32)

    def long(self) -> Self:
        return self.cast(dtypes.int64)

    def bool(self) -> Self:
        return self.cast(dtypes.bool)

    def _float_unary(self, op: Ops) -> Self:
        node = self.node
        if node.dtype.kind == "f":
            return self._new(Node.make(op, node.dtype, (node,)))
        x = self.cast(least_upper_float(self.dtype))
        return self._new(x.node.alu(op))

    # ---- elementwise ---------------------------------------------------------------------------
    def add(self, x: Any, reverse: bool = False) -> Self:
        return self._binary(Ops.ADD, x, "add", reverse)

    def sub(self, x: Any, reverse: bool = False) -> Self:
        return self._binary(Ops.SUB, x, "sub", reverse)

    def mul(self, x: Any, reverse: bool = False) -> Self:
        return self._binary(Ops.MUL, x, "mul", reverse)

    def div(self, x: Any, reverse: bool = False, rounding_mode: Optional[str] = None) -> Self:
        """True division (integer operands give the default float); `rounding_mode="trunc"` rounds the
        quotient toward zero and `"floor"` toward -inf, keeping integer operands' dtype (PyTorch's)."""
        if rounding_mode is None and self._node.dtype.kind == "f":  # a float quotient of the operands' dtype
            return self._binary(Ops.FDIV, x, "div", reverse)
        a, b = self._operands(x, "div", reverse)
        if rounding_mode not in (None, "trunc", "floor"):
            raise GraphError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if rounding_mode is not None and dtypes.is_int(a.dtype):
            floor = a._new(a.node.alu(Ops.IDIV, b.node))
            if rounding_mode == "floor":
                return floor
            inexact = (floor * b) != a  # floor and trunc differ where the signs differ and it is inexact
            return (inexact & ((a < 0) != (b < 0))).where(floor + 1, floor)
        dt = least_upper_float(a.dtype)
        q = self._new(a.cast(dt).node.alu(Ops.FDIV, b.cast(dt).node))
        if rounding_mode is None:
            return q
        return q.trunc() if rounding_mode == "trunc" else q.floor()

    def floordiv(self, x: Any, reverse: bool = False) -> Self:
        """Floor division (numpy's and PyTorch's `//`)."""
        return self._binary(Ops.IDIV, x, "floordiv", reverse)

    def mod(self, x: Any, reverse: bool = False) -> Self:
        """Remainder with the divisor's sign (numpy's and PyTorch's `%`)."""
        return self._binary(Ops.MOD, x, "mod", reverse)

    def pow(self, x: Any, reverse: bool = False) -> Self:
        """self ** x; an integer tensor to a negative integer power raises (its result is not an integer)."""
        if not reverse and isinstance(x, int) and x < 0 and dtypes.is_int(self.dtype):
            raise RuntimeError(f"integers to negative integer powers are not allowed ({self.dtype.name} ** {x})")
        return self._binary(Ops.POW, x, "pow", reverse)

    def maximum(self, x: Any) -> Self:
        return self._binary(Ops.MAX, x, "maximum")

    def minimum(self, x: Any) -> Self:
        """The smaller of the two, elementwise: -max(-a, -b) (~max(~a, ~b) for integers), so NaN
        propagates and a tie splits the gradient in half, as PyTorch's minimum."""
        a, b = self._operands(x, "minimum")
        if a.dtype == dtypes.bool:
            return a & b
        if dtypes.is_int(a.dtype):
            return ~(~a).maximum(~b)
        return -((-a).maximum(-b))

    # (the most used operators call `_binary` itself: one Python call fewer per op than through `add`)
    def __add__(self, x): return self._binary(Ops.ADD, x, "add")
    def __radd__(self, x): return self._binary(Ops.ADD, x, "add", True)
    def __sub__(self, x): return self._binary(Ops.SUB, x, "sub")
    def __rsub__(self, x): return self._binary(Ops.SUB, x, "sub", True)
    def __mul__(self, x): return self._binary(Ops.MUL, x, "mul")
    def __rmul__(self, x): return self._binary(Ops.MUL, x, "mul", True)
    def __truediv__(self, x): return self.div(x)
    def __rtruediv__(self, x): return self.div(x, True)
    def __floordiv__(self, x): return self.floordiv(x)
    def __rfloordiv__(self, x): return self.floordiv(x, True)
    def __mod__(self, x): return self.mod(x)
    def __rmod__(self, x): return self.mod(x, True)
    def __pow__(self, x): return self.pow(x)
    def __rpow__(self, x): return self.pow(x, True)
    def __neg__(self): return self.neg()
    def __matmul__(self, x): return self.matmul(x)
    def __rmatmul__(self, x): return type(self)(x, device=self.device).matmul(self) if not isinstance(x, type(self)) else x.matmul(self)
    def __lt__(self, x): return self._binary(Ops.CMPLT, x, "lt")
    def __gt__(self, x): return self._binary(Ops.CMPLT, x, "gt", reverse=True)
    # x <= y is (x < y) | (x == y), not !(x > y): a comparison with NaN is false either way round
    def __le__(self, x): return (self < x) | (self == x)
    def __ge__(self, x): return (self > x) | (self == x)
    def __eq__(self, x): return self._binary(Ops.CMPEQ, x, "eq")  # type: ignore[override]
    def __ne__(self, x): return self._binary(Ops.CMPNE, x, "ne")  # type: ignore[override]
    def __and__(self, x): return self._binary(Ops.AND, x, "and")
    def __or__(self, x): return self._binary(Ops.OR, x, "or")
    def __xor__(self, x): return self._binary(Ops.XOR, x, "xor")
    def __rand__(self, x): return self._binary(Ops.AND, x, "and", True)
    def __ror__(self, x): return self._binary(Ops.OR, x, "or", True)
    def __rxor__(self, x): return self._binary(Ops.XOR, x, "xor", True)
    def __invert__(self): return self.bitwise_not()
    def __lshift__(self, x): return self.lshift(x)
    def __rshift__(self, x): return self.rshift(x)

    def bitwise_not(self) -> Self:
        """~x for integers and bools (logical not for bools)."""
        if dtypes.is_float(self.dtype):
            raise RuntimeError(f"bitwise_not needs an integer or bool tensor, got {self.dtype.name}")
        return self._new(self.node.alu(Ops.NOT))

    def lshift(self, x: Any) -> Self:
        """x << n for an integer tensor: multiplication by 2**n (wrapping like the dtype); n may be an
        integer tensor."""
        if isinstance(x, TensorBase) and dtypes.is_int(x.dtype) and dtypes.is_int(self.dtype):
            wide = dtypes.int64 if self.dtype.itemsize < 8 else self.dtype  # 2**31 fits; the cast back wraps
            power = type(self).full((), 2, dtype=wide, device=self.device) ** x.cast(wide)
            return (self.cast(wide) * power).cast(self.dtype)
        if not dtypes.is_int(self.dtype) or not isinstance(x, int) or x < 0:
            raise RuntimeError(f"<< needs an integer tensor and a non-negative int, got {self.dtype.name} and {x!r}")
        return self * (1 << x) if x < self.dtype.itemsize * 8 else self * 0

    def rshift(self, x: Any) -> Self:
        """x >> n for an integer tensor: floor division by 2**n (arithmetic shift for signed ints); n may be
        an integer tensor."""
        if isinstance(x, TensorBase) and dtypes.is_int(x.dtype) and dtypes.is_int(self.dtype):
            wide = dtypes.int64 if self.dtype.itemsize < 8 else self.dtype
            power = type(self).full((), 2, dtype=wide, device=self.device) ** x.cast(wide)
            return (self.cast(wide) // power).cast(self.dtype)
        if not dtypes.is_int(self.dtype) or not isinstance(x, int) or x < 0:
            raise RuntimeError(f">> needs an integer tensor and a non-negative int, got {self.dtype.name} and {x!r}")
        if x >= self.dtype.itemsize * 8:
            return (self < 0).where(self._const_like(-1), self._const_like(0))
        if self.dtype.itemsize < 8 and (1 << x) > self.dtype.max:
            return (self.cast(dtypes.int64) // (1 << x)).cast(self.dtype)
        return self // (1 << x)

    def sequential(self, layers: Sequence[Any]) -> Self:
        """Applies the callables in `layers` in order: `x.sequential([l1, l2])` is `l2(l1(x))`."""
        out = self
        for layer in layers:
            out = layer(out)
        return out
    def __bool__(self):
        raise TypeError("the truth value of a lazy Tensor is ambiguous; use .item() or .any()/.all() and realize")
    __hash__ = object.__hash__

    def eq(self, x): return self == x
    def ne(self, x): return self != x
    def lt(self, x): return self < x
    def gt(self, x): return self > x
    def le(self, x): return self <= x
    def ge(self, x): return self >= x

    def logical_not(self) -> Self:
        return self._new(self.cast(dtypes.bool).node.alu(Ops.NOT))

    def logical_and(self, x: Any) -> Self:
        return self.cast(dtypes.bool) & (x.cast(dtypes.bool) if isinstance(x, TensorBase) else bool(x))

    def logical_or(self, x: Any) -> Self:
        return self.cast(dtypes.bool) | (x.cast(dtypes.bool) if isinstance(x, TensorBase) else bool(x))

    def neg(self) -> Self:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._new(self.node.alu(Ops.NEG))

    def abs(self) -> Self:
        """|x|; for floats x * sign(x), so the gradient at 0 is 0 (PyTorch's)."""
        if self.dtype == dtypes.bool or dtypes.is_unsigned(self.dtype):
            return self
        return self * self.sign() if dtypes.is_float(self.dtype) else (self < 0).where(-self, self)

    def exp(self) -> Self: return self._float_unary(Ops.EXP)
    def log(self) -> Self: return self._float_unary(Ops.LOG)
    def exp2(self) -> Self: return self._float_unary(Ops.EXP2)
    def log2(self) -> Self: return self._float_unary(Ops.LOG2)
    def sqrt(self) -> Self: return self._float_unary(Ops.SQRT)
    def sin(self) -> Self: return self._float_unary(Ops.SIN)
    def cos(self) -> Self: return self._float_unary(Ops.COS)
    def tanh(self) -> Self: return self._float_unary(Ops.TANH)
    def reciprocal(self) -> Self: return self._float_unary(Ops.RECIP)
    def rsqrt(self) -> Self: return self.sqrt().reciprocal()
    def tan(self) -> Self: return self.sin() / self.cos()
    def square(self) -> Self: return self * self


    def where(self, x: Any, y: Any) -> Self:
        """`x` where this (bool) tensor is true, else `y`; all three broadcast."""
        cls = type(self)
        cond_node = self.node
        if cond_node.dtype is _BOOL:  # the common cases: nothing to cast or broadcast
            if type(x) is cls:
                value = x.node
                if value.shape == cond_node.shape:
                    other = _same_shape_operand(value, y, cls)
                    if other is not None:
                        return self._new(Node.make(Ops.WHERE, value.dtype, (cond_node, value, other)))
            elif type(y) is cls:  # a scalar where true (relu's 0), a tensor else
                value = y.node
                if value.shape == cond_node.shape:
                    other = _same_shape_operand(value, x, cls)
                    if other is not None:
                        return self._new(Node.make(Ops.WHERE, value.dtype, (cond_node, other, value)))
        cond = self.cast(dtypes.bool)
        if not isinstance(x, cls) and not isinstance(y, cls):
            dt = dtypes.from_py(x) if dtypes.from_py(x) == dtypes.from_py(y) else dtypes.default_float
            x, y = cls.full((), x, dtype=dt, device=self.device), cls.full((), y, dtype=dt, device=self.device)
        elif not isinstance(x, cls):
            x, y = y._operands(x, "where", reverse=True)
        elif not isinstance(y, cls):
            x, y = x._operands(y, "where")
        else:
            x, y = x._operands(y, "where")
        shape = broadcast_shape(cond.shape, x.shape, y.shape, op="where")
        c, a, b = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
        return self._new(c.node.alu(Ops.WHERE, a.node, b.node))


    # ---- elementwise helpers ---------------------------------------------------------------------
    def clamp(self, min: Any = None, max: Any = None) -> Self:  # noqa: A002 (PyTorch's names)
        """Values limited to [min, max]; either bound may be a tensor."""
        if min is None and max is None:
            raise GraphError("clamp needs at least one of min and max")
        out = self  # selects, not max/min: the gradient is 1 at the bounds, as PyTorch's
        if min is not None:
            out = (out < min).where(min, out) if isinstance(min, TensorBase) else \
                (out < min).where(out._const_like(min), out)
        if max is not None:
            out = (out > max).where(max, out) if isinstance(max, TensorBase) else \
                (out > max).where(out._const_like(max), out)
        return out

    clip = clamp  # tinygrad's name

    def lerp(self, end: Any, weight: Any) -> Self:
        """self + (end - self) * weight."""
        return self + (end - self) * weight

    def sign(self) -> Self:
        """-1, 0 or 1 by the sign (NaN stays NaN), in this tensor's dtype."""
        if self.dtype == dtypes.bool:
            return self
        zero = self * 0 if dtypes.is_float(self.dtype) else self._const_like(0)
        return (self > 0).where(self._const_like(1), (self < 0).where(self._const_like(-1), zero))

    def trunc(self) -> Self:
        """Rounds toward zero (integers unchanged)."""
        return self if not dtypes.is_float(self.dtype) else self._new(self.node.alu(Ops.TRUNC))

    def floor(self) -> Self:
        """Rounds toward -inf."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (t > self).where(t - 1, t)

    def ceil(self) -> Self:
        """Rounds toward +inf."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (t < self).where(t + 1, t)

    def round(self) -> Self:
        """Rounds to the nearest integer, halves to even (numpy's and PyTorch's rule)."""
        if not dtypes.is_float(self.dtype):
            return self
        f = self.floor()
        diff = self - f
        odd = (f - (f * 0.5).floor() * 2) != 0
        up = (diff > 0.5) | ((diff == 0.5) & odd)
        return up.where(f + 1, f)

    def isnan(self) -> Self:
        """True where the value is NaN."""
        return self != self if dtypes.is_float(self.dtype) else self._const_like(False, dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Self:
        """True where the value is +inf (when `detect_positive`) or -inf (when `detect_negative`)."""
        if not dtypes.is_float(self.dtype):
            return self._const_like(False, dtypes.bool)
        pos, neg = self == math.inf, self == -math.inf
        if detect_positive and detect_negative:
            return pos | neg
        return pos if detect_positive else (neg if detect_negative else self._const_like(False, dtypes.bool))

    def isfinite(self) -> Self:
        return (self.isinf() | self.isnan()).logical_not()

    def nan_to_num(self, nan: float = 0.0, posinf: Optional[float] = None,
                   neginf: Optional[float] = None) -> Self:
        """NaN, +inf and -inf replaced (by default: 0, the dtype's largest and lowest finite values)."""
        if not dtypes.is_float(self.dtype):
            return self
        info = np.finfo(self.dtype.np)
        hi = float(info.max) if posinf is None else posinf
        lo = float(info.min) if neginf is None else neginf
        out = self.isnan().where(self._const_like(nan), self)
        out = (out == math.inf).where(out._const_like(hi), out)
        return (out == -math.inf).where(out._const_like(lo), out)

    def erf(self) -> Self:
        """The error function (Abramowitz and Stegun 7.1.26, absolute error < 1.5e-7)."""
        x = self.cast(least_upper_float(self.dtype))
        a = x.abs()
        t = (a * 0.3275911 + 1).reciprocal()
        poly = ((((t * 1.061405429 - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
        y = 1 - poly * (-(a * a)).exp()
        return x.sign() * y



    def _as_float(self) -> Self:
        return self.cast(least_upper_float(self.dtype))

    # ---- inverse trigonometric and hyperbolic ------------------------------------------------------
    def asin(self) -> Self:
        """arcsin, for x in [-1, 1] (NaN outside)."""
        x = self._as_float()
        a = x.abs()
        return x.sign() * (math.pi / 2 - (1.0 - a).sqrt() * _poly(a, _ASIN))

    def acos(self) -> Self:
        """arccos, for x in [-1, 1]."""
        return math.pi / 2 - self.asin()

    def atan(self) -> Self:
        """arctan: asin(x / sqrt(1 + x^2))."""
        x = self._as_float()
        return (x / (x * x + 1).sqrt()).asin()

    def sinh(self) -> Self:
        """(e^x - e^-x) / 2."""
        x = self._as_float()
        return (x.exp() - (-x).exp()) * 0.5

    def cosh(self) -> Self:
        """(e^x + e^-x) / 2."""
        x = self._as_float()
        return (x.exp() + (-x).exp()) * 0.5

    def asinh(self) -> Self:
        """sign(x) * log(|x| + sqrt(x^2 + 1))."""
        x = self._as_float()
        a = x.abs()
        return x.sign() * (a + (a * a + 1).sqrt()).log()

    def acosh(self) -> Self:
        """log(x + sqrt(x^2 - 1)), for x >= 1."""
        x = self._as_float()
        return (x + (x * x - 1).sqrt()).log()

    def atanh(self) -> Self:
        """log((1 + x) / (1 - x)) / 2, for x in (-1, 1)."""
        x = self._as_float()
        return ((1 + x) / (1 - x)).log() * 0.5

    def log10(self) -> Self:
        """Base-10 logarithm."""
        return self._as_float().log2() * math.log10(2)

    # ---- two-operand helpers -----------------------------------------------------------------------
    def copysign(self, other: Any) -> Self:
        """|self| with the sign of `other` (a -0.0 counts as negative, as in C and PyTorch)."""
        x = self._as_float()
        o = other if isinstance(other, TensorBase) else x._const_like(float(other))
        negative = (o < 0) | ((o == 0) & ((1 / o) < 0))
        a = x.abs()
        return negative.where(-a, a)

    def fmod(self, other: Any) -> Self:
        """C's fmod: the remainder with the sign of the dividend, self - trunc(self / other) * other."""
        if dtypes.is_int(self.dtype) and not (isinstance(other, TensorBase) and dtypes.is_float(other.dtype)) \
                and not isinstance(other, float):
            return self - self.div(other, rounding_mode="trunc") * other
        x = self._as_float()
        return x - x.div(other, rounding_mode="trunc") * other

    def logaddexp(self, other: Any) -> Self:
        """log(e^self + e^other), computed around the larger of the two."""
        x = self._as_float()
        m = x.maximum(other).detach()
        m = m.isinf().where(m._const_like(0.0), m)
        return ((x - m).exp() + (other - m).exp()).log() + m
