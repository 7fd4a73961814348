"""Math beyond the core ops: cumulative ops, softmax family, statistics, norms, rounding, tests for
nan/inf, and the activation functions, all as compositions of existing graph ops.

Cumulative ops (cumsum, cumprod, cummax) use tinygrad's idea: compare positions to build the
triangle "i <= j", fill the rest with the op's identity and reduce, which is O(n^2) per row; above
`2 * _BLOCK` elements the axis is split into blocks (cumulate inside each block, then across the block
totals), so the cost stays O(n * _BLOCK). erf is the Abramowitz-Stegun 7.1.26 polynomial (absolute
error below 1.5e-7, enough for float32). Rounding is built from TRUNC: floor, ceil, and round half
to even (numpy's and PyTorch's rule).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self

import numpy as np

from atensor.dtype import dtypes, least_upper_float
from atensor.graph.node import GraphError
from atensor.graph.ops import Ops, ReduceOp
from atensor.tensor.ops import TensorOps, _axis, _sum_dtype
from atensor.graph.semantics import reduce_identity
from atensor.tensor.activations import ActivationOps
from atensor.tensor.nn import NNOps
from atensor.tensor.select import SelectOps
from atensor.tensor.base import AnyTensor


_BLOCK = 32


class MathOps(ActivationOps, SelectOps, NNOps):
    """Math methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- cumulative ------------------------------------------------------------------------------
    def _cumulate(self, op: ReduceOp, axis: int) -> Self:
        axis = _axis(axis, self.ndim) if self.ndim else _axis(axis, 0)
        if self.ndim == 0:
            return self
        x = self.transpose(axis, -1) if axis != self.ndim - 1 else self
        out = _cum_last(x, op)
        return out.transpose(axis, -1) if axis != self.ndim - 1 else out

    def cumsum(self, axis: int = 0) -> Self:
        """Running sums along `axis` (small ints and bools accumulate in int32, as `sum`)."""
        return self.cast(_sum_dtype(self.dtype))._cumulate(ReduceOp.SUM, axis)

    def cumprod(self, axis: int = 0) -> Self:
        """Running products along `axis`."""
        return self.cast(_sum_dtype(self.dtype))._cumulate(ReduceOp.PROD, axis)

    def cummax(self, axis: int = 0) -> tuple[Self, Self]:
        """(running maxima, their indices) along `axis`, as tinygrad's and PyTorch's cummax; with ties
        the index is that of the last element equal to the running maximum (PyTorch's)."""
        values = self._cumulate(ReduceOp.MAX, axis)
        return values, self._running_index(values, axis)

    def cummin(self, axis: int = 0) -> tuple[Self, Self]:
        """(running minima, their indices) along `axis`."""
        flip = self.dtype == dtypes.bool or dtypes.is_int(self.dtype)
        inverse = ~self if flip else -self
        values = inverse._cumulate(ReduceOp.MAX, axis)
        values = ~values if flip else -values
        return values, self._running_index(values, axis)

    def _running_index(self, values: Self, axis: int) -> Self:
        """For each position j along `axis`, the last i <= j with self[i] == values[j] (int32)."""
        if self.ndim == 0:
            return self._const_like(0, dtypes.int32)
        axis = _axis(axis, self.ndim)
        n = self.shape[axis]
        cls = type(self)
        x, v = self.transpose(axis, -1).detach(), values.transpose(axis, -1).detach()
        i = cls.arange(n, device=self.device).reshape(n, 1)
        j = cls.arange(n, device=self.device).reshape(1, n)
        match = (x.unsqueeze(-1) == v.unsqueeze(-2)) & (i <= j)  # (..., i, j)
        count_up = cls.arange(1, n + 1, device=self.device).reshape(n, 1)
        last = ((match.cast(dtypes.int32) * count_up).max(-2) - 1).cast(dtypes.int32)
        return last.transpose(axis, -1)

    def logcumsumexp(self, axis: int = 0) -> Self:
        """log(cumsum(exp(x))) along `axis`; output j is computed around the running maximum up to j (so
        no term underflows), through the (j, i <= j) triangle: O(n^2) per row."""
        x = self.cast(least_upper_float(self.dtype))
        if x.ndim == 0:
            return x
        axis = _axis(axis, x.ndim)
        x = x.transpose(axis, -1)
        n = x.shape[-1]
        m = x.cummax(-1)[0].detach()
        m = m.isinf().where(m._const_like(0.0), m)
        cls = type(self)
        keep = cls.arange(n, device=self.device).reshape(1, n) <= cls.arange(n, device=self.device).reshape(n, 1)
        diff = x.unsqueeze(-2) - m.unsqueeze(-1)                      # (..., j, i)
        terms = keep.where(diff, diff._const_like(-math.inf)).exp()
        return (terms.sum(-1).log() + m).transpose(axis, -1)

    # ---- softmax family and statistics -----------------------------------------------------------
    def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Self:
        """log(sum(exp(x))) over `axis`, computed around the maximum so it does not overflow."""
        x = self.cast(least_upper_float(self.dtype))
        m = x.max(axis, keepdim=True)
        m = m.isinf().where(m._const_like(0.0), m).detach()
        out = (x - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze_axes(x._reduce_axes(axis))

    def squeeze_axes(self, axes: tuple[int, ...]) -> Self:
        """This tensor without the listed axes (each of size 1)."""
        return self.reshape(*(s for i, s in enumerate(self.shape) if i not in axes))

    def softmax(self, axis: int = -1) -> Self:
        """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum for stability."""
        x = self.cast(least_upper_float(self.dtype))
        e = (x - x.max(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Self:
        """x - logsumexp(x) along `axis`."""
        x = self.cast(least_upper_float(self.dtype))
        return x - x.logsumexp(axis, keepdim=True)

    def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Self:
        """Variance over `axis` with `correction` (1: unbiased, PyTorch's default; 0: population)."""
        x = self.cast(least_upper_float(self.dtype))
        axes = x._reduce_axes(axis)
        n = math.prod(x.shape[a] for a in axes)
        sq = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim=keepdim)
        return sq / max(n - correction, 0)  # n <= correction: x / 0, inf (or nan for 0), as PyTorch

    def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Self:
        """Standard deviation: the square root of `var`."""
        return self.var(axis, keepdim, correction).sqrt()

    def std_mean(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> tuple[Self, Self]:
        """(std, mean) over `axis`, as torch.std_mean."""
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def var_mean(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> tuple[Self, Self]:
        """(var, mean) over `axis`, as torch.var_mean."""
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Self:
        """|self - other| <= atol + rtol * |other| elementwise (equal infinities are close; NaNs only with
        `equal_nan`), as torch.isclose."""
        other = other if isinstance(other, TensorOps) else self._const_like(other)
        exact = self == other
        if not (dtypes.is_float(self.dtype) or dtypes.is_float(other.dtype)):
            return exact
        finite = (self - other).abs() <= (other.abs() * rtol + atol)
        out = exact | (finite & self.isfinite() & other.isfinite())
        return out | (self.isnan() & other.isnan()) if equal_nan else out

    def norm(self, ord: Any = 2, axis: Any = None, keepdim: bool = False) -> Self:
        """Vector norm over `axis` (all axes when None): ord 2 (default), 1, inf, -inf, 0 or any p."""
        x = self.cast(least_upper_float(self.dtype)).abs()
        if ord == 2:
            return x.square().sum(axis, keepdim).sqrt()
        if ord == 1:
            return x.sum(axis, keepdim)
        if ord == math.inf:
            return x.max(axis, keepdim)
        if ord == -math.inf:
            return x.min(axis, keepdim)
        if ord == 0:
            return (x != 0).cast(x.dtype).sum(axis, keepdim)
        return x.pow(ord).sum(axis, keepdim).pow(1.0 / ord)

    # ---- elementwise helpers ---------------------------------------------------------------------
    def clamp(self, min: Any = None, max: Any = None) -> Self:  # noqa: A002 (PyTorch's names)
        """Values limited to [min, max]; either bound may be a tensor."""
        if min is None and max is None:
            raise GraphError("clamp needs at least one of min and max")
        out = self  # selects, not max/min: the gradient is 1 at the bounds, as PyTorch's
        if min is not None:
            out = (out < min).where(min, out) if isinstance(min, TensorOps) else \
                (out < min).where(out._const_like(min), out)
        if max is not None:
            out = (out > max).where(max, out) if isinstance(max, TensorOps) else \
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

    # ---- activations -----------------------------------------------------------------------------
    def gelu(self, approximate: str = "tanh") -> Self:
        """GELU; tinygrad's tanh approximation by default, the exact erf form with approximate="none"."""
        x = self.cast(least_upper_float(self.dtype))
        if approximate == "none":
            return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    def silu(self) -> Self:
        """x * sigmoid(x)."""
        return self * self.sigmoid()

    swish = silu

    def softplus(self, beta: float = 1.0) -> Self:
        """log(1 + exp(beta * x)) / beta, computed without overflow."""
        bx = self.cast(least_upper_float(self.dtype)) * beta
        return (bx.relu() + ((-bx.abs()).exp() + 1).log()) * (1 / beta)

    def mish(self) -> Self:
        """x * tanh(softplus(x))."""
        return self * self.softplus().tanh()

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Self:
        """Values clipped to [min_val, max_val]."""
        return self.clamp(min_val, max_val)

    def leaky_relu(self, neg_slope: float = 0.01) -> Self:
        """x where positive, else neg_slope * x."""
        return (self < 0).where(self * neg_slope, self)

    def elu(self, alpha: float = 1.0) -> Self:
        """x where positive, else alpha * (exp(x) - 1)."""
        x = self.cast(least_upper_float(self.dtype))
        return (x > 0).where(x, alpha * (x.exp() - 1))

    def relu6(self) -> Self:
        return self.clamp(0, 6)


def _cum_last(x: AnyTensor, op: ReduceOp) -> AnyTensor:
    """The cumulative `op` along the last axis of `x`."""
    n = x.shape[-1]
    if n <= 2 * _BLOCK or x.numel() == 0:
        return _cum_small(x, op)
    blocks = -(-n // _BLOCK)
    pad = blocks * _BLOCK - n
    identity = reduce_identity(op, x.dtype)
    padded = TensorOps.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], identity) if pad else x
    tiles = padded.reshape(*x.shape[:-1], blocks, _BLOCK)
    inside = _cum_small(tiles, op)  # within each block
    totals = inside[..., -1]                          # (..., blocks)
    before = _cum_last(totals, op)                    # inclusive running totals of the blocks
    shifted = TensorOps.pad(before, [(0, 0)] * (before.ndim - 1) + [(1, 0)], identity)[..., :-1]
    combined = _combine(inside, shifted.unsqueeze(-1), op)
    return combined.reshape(*x.shape[:-1], blocks * _BLOCK)[..., :n]


def _combine(a: AnyTensor, b: AnyTensor, op: ReduceOp) -> AnyTensor:
    if op is ReduceOp.SUM:
        return a + b
    if op is ReduceOp.PROD:
        return a * b
    return a.maximum(b)


def _cum_small(x: AnyTensor, op: ReduceOp) -> AnyTensor:
    """Cumulative op along the last axis through the (n, n) triangle: O(n^2) per row."""
    n = x.shape[-1]
    cls = type(x)
    i = cls.arange(n, device=x.device).reshape(n, 1)
    j = cls.arange(n, device=x.device).reshape(1, n)
    keep = i <= j                                      # (i, j): element i counts toward output j
    grid = x.unsqueeze(-1).expand(*x.shape, n)         # (..., i, j)
    filled = keep.where(grid, grid._const_like(reduce_identity(op, x.dtype)))
    return filled._reduce(op, -2, keepdim=False)
