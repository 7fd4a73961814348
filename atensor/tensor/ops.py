"""Tensor operations: creation, elementwise math, reductions, movement and matmul.

Each method builds graph nodes; nothing runs. Broadcasting follows numpy: shapes align on the right
and axes of size 1 expand (a stride-0 view, never a copy). Python scalars are weak (dtype.py).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence, Union

from atensor.dtype import DType, dtypes, least_upper_dtype, least_upper_float, to_dtype
from atensor.graph.node import GraphError, Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.symbolic import SymbolicError, is_symbolic
from atensor.tensor.create import CreationOps, _ints


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


class TensorOps(CreationOps):
    """The op methods of Tensor; see tensor/tensor.py for storage and realize."""
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
        else:
            raise TypeError(f"unsupported operand for {op}: Tensor and {type(other).__name__}")
        x, y = x.cast(dt), y.cast(dt)
        shape = broadcast_shape(x.shape, y.shape, op=op)
        x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        return (y, x) if reverse else (x, y)

    def _binary(self, op: Ops, other: Any, name: str, reverse: bool = False) -> Self:
        x, y = self._operands(other, name, reverse)
        return self._new(x.node.alu(op, y.node))

    def cast(self, dtype: Any) -> Self:
        """Values converted to `dtype` (float to int truncates toward zero)."""
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

    def __add__(self, x): return self.add(x)
    def __radd__(self, x): return self.add(x, True)
    def __sub__(self, x): return self.sub(x)
    def __rsub__(self, x): return self.sub(x, True)
    def __mul__(self, x): return self.mul(x)
    def __rmul__(self, x): return self.mul(x, True)
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
    def __le__(self, x): return (self > x).logical_not()
    def __ge__(self, x): return (self < x).logical_not()
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
        if isinstance(x, TensorOps) and dtypes.is_int(x.dtype) and dtypes.is_int(self.dtype):
            wide = dtypes.int64 if self.dtype.itemsize < 8 else self.dtype  # 2**31 fits; the cast back wraps
            power = type(self).full((), 2, dtype=wide, device=self.device) ** x.cast(wide)
            return (self.cast(wide) * power).cast(self.dtype)
        if not dtypes.is_int(self.dtype) or not isinstance(x, int) or x < 0:
            raise RuntimeError(f"<< needs an integer tensor and a non-negative int, got {self.dtype.name} and {x!r}")
        return self * (1 << x) if x < self.dtype.itemsize * 8 else self * 0

    def rshift(self, x: Any) -> Self:
        """x >> n for an integer tensor: floor division by 2**n (arithmetic shift for signed ints); n may be
        an integer tensor."""
        if isinstance(x, TensorOps) and dtypes.is_int(x.dtype) and dtypes.is_int(self.dtype):
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
        return self.cast(dtypes.bool) & (x.cast(dtypes.bool) if isinstance(x, TensorOps) else bool(x))

    def logical_or(self, x: Any) -> Self:
        return self.cast(dtypes.bool) | (x.cast(dtypes.bool) if isinstance(x, TensorOps) else bool(x))

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

    def sigmoid(self) -> Self:
        """1 / (1 + e^-x), from t = e^-|x| (never overflows): 1 / (1 + t) for x >= 0, t / (1 + t) below,
        so the value and the gradient stay finite at any x."""
        x = self.cast(least_upper_float(self.dtype))
        positive = x >= 0
        t = positive.where(-x, x).exp()  # e^-|x|, with the gradient of the branch each side takes
        inv = (1 + t).reciprocal()
        return positive.where(inv, t * inv)

    def relu(self) -> Self:
        """x where positive, else 0; the gradient at 0 is 0 (PyTorch's and tinygrad's)."""
        return (self > 0).where(self, 0)


    def where(self, x: Any, y: Any) -> Self:
        """`x` where this (bool) tensor is true, else `y`; all three broadcast."""
        cls = type(self)
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

    # ---- reductions ----------------------------------------------------------------------------
    def _reduce_axes(self, axis: Any) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted({_axis(a, self.ndim) for a in axes}))

    def _reduce(self, op: ReduceOp, axis: Any, keepdim: bool) -> Self:
        axes = self._reduce_axes(axis)
        node = self.node.reduce(op, axes) if self.ndim else self.node
        out = self._new(node)
        if not keepdim:
            out = out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
        return out

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Self:
        """Sum over `axis` (all when None); small ints and bools accumulate in int32 / uint32."""
        acc = to_dtype(dtype) if dtype is not None else _sum_dtype(self.dtype)
        return self.cast(acc)._reduce(ReduceOp.SUM, axis, keepdim)

    def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Self:
        acc = to_dtype(dtype) if dtype is not None else _sum_dtype(self.dtype)
        return self.cast(acc)._reduce(ReduceOp.PROD, axis, keepdim)

    def max(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self._reduce(ReduceOp.MAX, axis, keepdim)

    def min(self, axis: Any = None, keepdim: bool = False) -> Self:
        if dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def mean(self, axis: Any = None, keepdim: bool = False) -> Self:
        """Arithmetic mean; integer tensors give the default float."""
        axes = self._reduce_axes(axis)
        count = math.prod(self.shape[a] for a in axes)
        out = self.cast(least_upper_float(self.dtype)).sum(axis, keepdim)
        return out / count if count else out * math.nan

    def any(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self.cast(dtypes.bool).max(axis, keepdim)

    def all(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self.logical_not().any(axis, keepdim).logical_not()

    def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Self:
        """Index of the first maximum along `axis` (of the flattened tensor when None)."""
        if axis is None:
            return self.flatten().argmax(0, keepdim=False)
        axis = _axis(axis, self.ndim)
        n = self.shape[axis]
        if n == 0:
            raise ValueError("argmax of an empty axis")
        is_max = self == self.max(axis, keepdim=True)
        if dtypes.is_float(self.dtype):
            is_max = is_max | (self != self)  # a NaN is the maximum (torch and numpy: its first index)
        shape = [1] * self.ndim
        shape[axis] = n
        count_down = type(self).arange(n, 0, -1, device=self.device).reshape(*shape)
        return (n - (is_max * count_down).max(axis, keepdim)).cast(dtypes.int32)

    def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> Self:
        flipped = ~self if (dtypes.is_int(self.dtype) or self.dtype == dtypes.bool) else -self
        return flipped.argmax(axis, keepdim)

    # ---- movement ------------------------------------------------------------------------------
    def reshape(self, *shape) -> Self:
        """The same values in a new shape; one axis may be -1."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        # None keeps that axis's size (tinygrad's form)
        shape = [self.shape[i] if s is None else int(s) for i, s in enumerate(shape)] if shape else []
        if shape.count(-1) > 1:
            raise GraphError(f"reshape: only one axis may be -1, got {tuple(shape)}")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.numel() % known:
                raise GraphError(f"reshape: cannot reshape {self.shape} to {tuple(shape)}")
            shape[shape.index(-1)] = self.numel() // known
        return self._new(self.node.reshape(tuple(shape)))

    view = reshape

    def permute(self, *order) -> Self:
        order = tuple(_axis(a, self.ndim) for a in _ints(order))
        if len(set(order)) != len(order) or len(order) != self.ndim:
            raise GraphError(f"permute: {order} is not a permutation of the axes of shape {self.shape}")
        return self._new(self.node.permute(order))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Self:
        order = list(range(self.ndim))
        a, b = _axis(dim0, self.ndim), _axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    @property
    def T(self) -> Self:
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *shape) -> Self:
        shape = _ints(shape)
        new = tuple(s if n == -1 else n for s, n in zip((1,) * (len(shape) - self.ndim) + self.shape, shape))
        return self._broadcast_to(new)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self:
        if self.ndim == 0:
            return self.reshape(1)
        a, b = _axis(start_dim, self.ndim), _axis(end_dim, self.ndim)
        return self.reshape(*self.shape[:a], math.prod(self.shape[a:b + 1]), *self.shape[b + 1:])

    def squeeze(self, dim: Optional[int] = None) -> Self:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if self.ndim == 0:
            _axis(dim, 0, "squeeze dim")  # -1 and 0 name a 0-d tensor's no axes
            return self
        d = _axis(dim, self.ndim)
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

    def unsqueeze(self, dim: int) -> Self:
        d = _axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def pad(self, padding: Sequence, value: Scalar = 0.0) -> Self:
        """Pads with `value`. `padding` is ((before, after), ...) per axis (None for none), or torch's
        flat (left, right, top, bottom, ...) starting at the last axis."""
        if all(isinstance(p, int) for p in padding):
            if len(padding) % 2:
                raise GraphError(f"flat padding needs pairs, got {tuple(padding)}")
            pairs = [(0, 0)] * self.ndim
            for i in range(len(padding) // 2):
                pairs[self.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
        else:
            pairs = [(0, 0) if p is None else tuple(p) for p in padding]
        if len(pairs) != self.ndim:
            raise GraphError(f"pad: {len(pairs)} pairs for a tensor with {self.ndim} dimensions")
        if any(b < 0 or a < 0 for b, a in pairs):
            shrink = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
            return self.shrink(shrink).pad([(max(0, b), max(0, a)) for b, a in pairs], value)
        out = self._new(self.node.pad(tuple(pairs)))
        if value == 0:
            return out
        inside = type(self).full(self.shape, True, dtype=dtypes.bool, device=self.device)
        return inside._new(inside.node.pad(tuple(pairs))).where(out, value)

    def shrink(self, arg: Sequence) -> Self:
        """Keeps [begin, end) per axis (None keeps the whole axis)."""
        bounds = tuple((0, s) if a is None else tuple(a) for a, s in zip(arg, self.shape))
        return self._new(self.node.shrink(bounds))

    def flip(self, axis: Any) -> Self:
        listed = [_axis(a, self.ndim) for a in ((axis,) if isinstance(axis, int) else axis)]
        axes = set(listed)
        if len(axes) != len(listed):
            raise GraphError(f"flip: axis {tuple(axis)} names an axis twice")
        return self._new(self.node.flip(tuple(i in axes for i in range(self.ndim))))

    def __getitem__(self, index: Any) -> Self:
        """Basic indexing: ints, slices (any step), None and Ellipsis."""
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, TensorOps) or isinstance(i, (list, type(None).__class__)) and not i is None
               for i in index if not isinstance(i, (int, slice, type(None), type(Ellipsis)))):
            raise TypeError("tensor and list indices are not supported yet; use ints, slices, None and ...")
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        real = sum(1 for i in index if i is not None and i is not Ellipsis)
        if real > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (self.ndim - real) + index[at + 1:]
        else:
            index = index + (slice(None),) * (self.ndim - real)
        node = self.node
        bounds, flips, steps, out_shape, dim = [], [], [], [], 0
        for i in index:
            if i is None:
                out_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(i, bool) or not isinstance(i, (int, slice)):
                raise TypeError(f"unsupported index {i!r}")
            if isinstance(i, int):
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
                i = i + size if i < 0 else i
                bounds.append((i, i + 1)); flips.append(False); steps.append(1)  # noqa: E702
            elif is_symbolic(i.start) or is_symbolic(i.stop):
                bounds.append(_symbolic_slice(i, size, dim)); flips.append(False); steps.append(1)  # noqa: E702
                out_shape.append(bounds[-1][1] - bounds[-1][0])
            else:
                start, stop, step = i.indices(size)
                count = len(range(start, stop, step))
                if count == 0:
                    bounds.append((0, 0)); flips.append(False); steps.append(1)  # noqa: E702
                elif step > 0:
                    bounds.append((start, start + (count - 1) * step + 1)); flips.append(False); steps.append(step)  # noqa: E702
                else:
                    low = start + (count - 1) * step
                    bounds.append((low, start + 1)); flips.append(True); steps.append(-step)  # noqa: E702
                out_shape.append(count)
            dim += 1
        node = node.shrink(tuple(bounds)).flip(tuple(flips)).stride(tuple(steps))
        return self._new(node.reshape(tuple(out_shape)))

    # ---- matmul --------------------------------------------------------------------------------
    def dot(self, w: Self) -> Self:
        """Matrix product with numpy's rules for 1-D and batched operands (a BLAS call in the kernel)."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise GraphError(f"matmul needs tensors with at least one dimension, got {x.shape} and {w.shape}")
        k = x.shape[-1]
        kw = w.shape[-2] if w.ndim > 1 else w.shape[0]
        if k != kw:
            raise GraphError(f"matmul: shapes {x.shape} and {w.shape} do not align ({k} != {kw})")
        a, b = x, w
        dt = least_upper_dtype(a.dtype, b.dtype)
        a, b = a.cast(dt), b.cast(dt)
        if b.ndim == 1:
            return (a * b).sum(-1)
        if a.ndim == 1:
            return (a.reshape(k, 1) * b).sum(-2)
        a = a.reshape(*a.shape[:-1], 1, k)
        b = b.transpose(-1, -2).reshape(*b.shape[:-2], 1, b.shape[-1], k)
        return (a * b).sum(-1)

    matmul = dot


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


def _symbolic_slice(index: slice, size: int, dim: int) -> tuple[Any, Any]:
    """The (start, stop) shrink bounds of a slice whose bounds are bound Variables or expressions of them
    (`cache[:, pos:pos + n]`: a fixed length at a symbolic offset). The length must come out an int:
    shapes stay ints (graph/symbolic.py), and the bounds are proved inside the axis for every value the
    variables may take when the shrink is made."""
    if index.step not in (None, 1):
        raise IndexError(f"a slice at a Variable position takes step 1, got step {index.step!r} on axis {dim}")
    start = 0 if index.start is None else index.start
    stop = size if index.stop is None else index.stop
    if isinstance(start, int) and start < 0 or isinstance(stop, int) and stop < 0:
        raise IndexError(f"a slice at a Variable position counts from the start: negative bound on axis {dim}")
    if is_symbolic(stop - start):
        raise SymbolicError(f"slice {start}:{stop} of axis {dim} has a length that depends on a Variable; "
                            f"atensor's shapes are ints (symbolic offsets only): slice a fixed length "
                            f"(`x[pos:pos + n]`), or a fixed window (`x[0:window]`) with a mask for the cells past "
                            f"the position")
    return start, stop
