"""Creation: tensors from shapes and fill rules (full, zeros, arange, linspace, eye) and random ones (rand,
randn, randint, normal, uniform and the initializers kaiming, glorot, scaled uniform).

Why a module of its own: creation methods are classmethods that build leaves (a constant, an ARANGE,
Threefry draws, or fresh storage); every other op method builds on an existing tensor. Each accepts
tinygrad's and PyTorch's forms: a shape as separate ints or one tuple, `dtype`, `device` and
`requires_grad`. Negative sizes raise ValueError, as in both.

Random values come from the counter-based generator (tensor/random.py): the same seed gives the same values
on any device. The initializers follow tinygrad's definitions (fan_in is the product of all axes but
the first).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence, Union

import numpy as np

from atensor.tensor import random as _random
from atensor.config import settings
from atensor.dtype import dtypes, to_dtype
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.hcq.device import canonical
from atensor.tensor.base import AnyTensor


Scalar = Union[int, float, bool]


def _ints(args: Sequence) -> tuple[int, ...]:
    """Ints given separately or as one tuple/list (a shape, an axis order)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    if not all(isinstance(a, (int, np.integer)) for a in args):
        raise ValueError(f"expected ints or one tuple of ints, got {tuple(args)!r}")
    return tuple(int(a) for a in args)


def _shape_arg(shape: Sequence) -> tuple[int, ...]:
    """A shape given as ints or as one tuple/list; negative sizes raise ValueError."""
    out = _ints(shape)
    if any(s < 0 for s in out):
        raise ValueError(f"a shape cannot have negative sizes, got {out}")
    return out


def _grad(t: AnyTensor, requires_grad: Optional[bool]) -> AnyTensor:
    """`t` with `requires_grad` set. A tensor that requires grad gets its own storage (filled lazily,
    as `clone()`): a constant is one broadcast scalar, whose gradient would be the sum over all its
    elements, where a user means one gradient per element."""
    if requires_grad:
        t = t.clone()
    if requires_grad is not None:
        t.requires_grad = requires_grad
    return t


def _fan_in(shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else 1


class CreationOps:
    """The creation classmethods of Tensor (a mixin)."""
    __slots__ = ()

    @classmethod
    def empty(cls, *shape, dtype: Any = None, device: Optional[str] = None,
              requires_grad: Optional[bool] = None) -> Self:
        """A tensor with storage and unspecified values."""
        from atensor.graph.node import BufferSpec
        from atensor.hcq.device import Device
        shape = _shape_arg(shape)
        dev = canonical(device or settings.default_device)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        spec = BufferSpec(dev, math.prod(shape), dt)
        Device.get(dev).allocate(spec)
        return _grad(cls(spec.node(0).reshape(shape)), requires_grad)

    @classmethod
    def full(cls, shape: Sequence[int], fill_value: Scalar, dtype: Any = None, device: Optional[str] = None,
             requires_grad: Optional[bool] = None) -> Self:
        """A constant tensor (a broadcast scalar: no storage until realized)."""
        shape = _shape_arg((shape,)) if isinstance(shape, (tuple, list)) else _shape_arg((int(shape),))
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        return _grad(cls(Node.const(fill_value, dt, canonical(device or settings.default_device), shape)),
                     requires_grad)

    @classmethod
    def zeros(cls, *shape, dtype: Any = None, device: Optional[str] = None,
              requires_grad: Optional[bool] = None) -> Self:
        """A tensor of zeros (the default float unless `dtype`)."""
        return cls.full(_shape_arg(shape), 0.0, dtype=dtype or dtypes.default_float, device=device,
                        requires_grad=requires_grad)

    @classmethod
    def ones(cls, *shape, dtype: Any = None, device: Optional[str] = None,
             requires_grad: Optional[bool] = None) -> Self:
        """A tensor of ones (the default float unless `dtype`); `Tensor.ones(3, requires_grad=True)`."""
        return cls.full(_shape_arg(shape), 1.0, dtype=dtype or dtypes.default_float, device=device,
                        requires_grad=requires_grad)

    @classmethod
    def arange(cls, start: Scalar, stop: Optional[Scalar] = None, step: Scalar = 1, dtype: Any = None,
               device: Optional[str] = None, requires_grad: Optional[bool] = None) -> Self:
        """Values start, start+step, ... below stop (as numpy's arange)."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange: step must not be zero")
        size = max(0, math.ceil((stop - start) / step))
        floats = any(isinstance(v, float) for v in (start, stop, step))
        last = start + (size - 1) * step
        if dtype is not None:
            dt = to_dtype(dtype)
        elif floats:
            dt = dtypes.default_float
        else:  # an int range beyond int32 is int64 (tinygrad's rule)
            dt = dtypes.default_int if size == 0 or max(abs(start), abs(last)) < 2 ** 31 - 1 else dtypes.int64
        if dtypes.is_int(dt) and size and not (dt.min <= start <= dt.max and dt.min <= last <= dt.max):
            raise OverflowError(f"arange({start}, {stop}, {step}) does not fit {dt.name}")
        node = Node.make(Ops.ARANGE, dt, (), (start, step, size, canonical(device or settings.default_device)))
        return _grad(cls(node), requires_grad)

    @classmethod
    def linspace(cls, start: Scalar, stop: Scalar, steps: int, dtype: Any = None,
                 device: Optional[str] = None, requires_grad: Optional[bool] = None) -> Self:
        """`steps` values evenly spaced from `start` to `stop`, both included (PyTorch's linspace)."""
        if steps < 0:
            raise ValueError(f"linspace: the number of steps must be non-negative, got {steps}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt == dtypes.bool:
            raise ValueError("linspace with a bool dtype is not supported")
        if steps == 1:
            return cls.full((1,), start, dtype=dt, device=device, requires_grad=requires_grad)
        ramp = cls.arange(steps, dtype=dtypes.default_float, device=device)
        return _grad((ramp * ((stop - start) / (steps - 1)) + start).cast(dt), requires_grad)

    @classmethod
    def eye(cls, n: int, m: Optional[int] = None, dtype: Any = None, device: Optional[str] = None,
            requires_grad: Optional[bool] = None) -> Self:
        """The n x m identity matrix."""
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ValueError(f"eye: sizes must be non-negative, got {n} and {m}")
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, m)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return _grad((rows == cols).cast(dt), requires_grad)

    # ---- random ----------------------------------------------------------------------------------
    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Seeds the counter-based generator: the same seed gives the same values on any device."""
        _random.manual_seed(seed)

    @classmethod
    def rand(cls, *shape, dtype: Any = None, device: Optional[str] = None,
             requires_grad: Optional[bool] = None) -> Self:
        """Uniform values in [0, 1), from Threefry counters (see tensor/random.py)."""
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return _grad(cls(_random.uniform_node(shape, dt, canonical(device or settings.default_device))),
                     requires_grad)

    @classmethod
    def randn(cls, *shape, dtype: Any = None, device: Optional[str] = None,
              requires_grad: Optional[bool] = None) -> Self:
        """Standard normal values (Box-Muller on two uniform draws)."""
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        u = cls.rand(2, *shape, dtype=dtypes.float32, device=device)
        u1, u2 = u[0], u[1]
        return _grad(((1 - u1).log() * -2).sqrt().mul((u2 * (2 * math.pi)).cos()).cast(dt), requires_grad)

    @classmethod
    def randint(cls, *shape, low: int = 0, high: int = 10, dtype: Any = None, device: Optional[str] = None,
                requires_grad: Optional[bool] = None) -> Self:
        """Integers uniform in [low, high)."""
        if high <= low:
            raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
        shape = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.int32
        if not dtypes.is_int(dt):
            raise TypeError(f"randint makes integers; got dtype {dt.name}")
        bits = cls(_random.bits_node(shape, canonical(device or settings.default_device)))
        return _grad((bits % (high - low)).cast(dt) + low, requires_grad)

    @classmethod
    def normal(cls, *shape, mean: float = 0.0, std: float = 1.0, dtype: Any = None,
               device: Optional[str] = None, requires_grad: Optional[bool] = None) -> Self:
        """Normal values with `mean` and `std`."""
        return _grad(cls.randn(*shape, dtype=dtype, device=device) * std + mean, requires_grad)

    @classmethod
    def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype: Any = None,
                device: Optional[str] = None, requires_grad: Optional[bool] = None) -> Self:
        """Uniform values in [low, high)."""
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        x = cls.rand(*shape, dtype=dtypes.float32 if dtypes.is_int(dt) else dt, device=device)
        return _grad((x * (high - low) + low).cast(dt), requires_grad)

    @classmethod
    def scaled_uniform(cls, *shape, dtype: Any = None, device: Optional[str] = None,
                       requires_grad: Optional[bool] = None) -> Self:
        """Uniform in [-1, 1) scaled by 1/sqrt(numel) (tinygrad's)."""
        dims = _shape_arg(shape)
        x = cls.uniform(*dims, low=-1.0, high=1.0, dtype=dtype, device=device) * (math.prod(dims) ** -0.5)
        return _grad(x, requires_grad)

    @classmethod
    def glorot_uniform(cls, *shape, dtype: Any = None, device: Optional[str] = None,
                       requires_grad: Optional[bool] = None) -> Self:
        """Glorot (Xavier) uniform: bound sqrt(6 / (shape[0] + prod(shape[1:])))."""
        dims = _shape_arg(shape)
        bound = math.sqrt(6 / ((dims[0] if dims else 1) + math.prod(dims[1:])))
        return _grad(cls.uniform(*dims, low=-bound, high=bound, dtype=dtype, device=device), requires_grad)

    @classmethod
    def kaiming_uniform(cls, *shape, a: float = 0.01, dtype: Any = None, device: Optional[str] = None,
                        requires_grad: Optional[bool] = None) -> Self:
        """He (Kaiming) uniform with leaky-ReLU slope `a`: bound sqrt(6 / ((1 + a^2) * fan_in))."""
        dims = _shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_fan_in(dims))
        return _grad(cls.uniform(*dims, low=-bound, high=bound, dtype=dtype, device=device), requires_grad)

    @classmethod
    def kaiming_normal(cls, *shape, a: float = 0.01, dtype: Any = None, device: Optional[str] = None,
                       requires_grad: Optional[bool] = None) -> Self:
        """He (Kaiming) normal with leaky-ReLU slope `a`: std sqrt(2 / ((1 + a^2) * fan_in))."""
        dims = _shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_fan_in(dims))
        return _grad(cls.normal(*dims, mean=0.0, std=std, dtype=dtype, device=device), requires_grad)

    # ---- like another tensor -----------------------------------------------------------------------
    def full_like(self, fill_value: Scalar, **kw) -> Self:
        """A constant tensor of this tensor's shape (and dtype and device unless given)."""
        return type(self).full(self.shape, fill_value, dtype=kw.get("dtype", self.dtype),
                               device=kw.get("device", self.device), requires_grad=kw.get("requires_grad"))

    def zeros_like(self, **kw) -> Self:
        return self.full_like(0, **kw)

    def ones_like(self, **kw) -> Self:
        return self.full_like(1, **kw)

    def empty_like(self, **kw) -> Self:
        return type(self).empty(*self.shape, dtype=kw.get("dtype", self.dtype), device=kw.get("device", self.device))

    def rand_like(self, **kw) -> Self:
        return type(self).rand(*self.shape, dtype=kw.get("dtype", self.dtype), device=kw.get("device", self.device))

    def randn_like(self, **kw) -> Self:
        return type(self).randn(*self.shape, dtype=kw.get("dtype", self.dtype), device=kw.get("device", self.device))
