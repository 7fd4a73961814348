"""Reductions of Tensor: sum, prod, max, min, mean, any, all, argmax/argmin, the cumulative ops,
logsumexp, the softmax family, and statistics (var, std, norms).

Cumulative ops (cumsum, cumprod, cummax) use tinygrad's idea: compare positions to build the
triangle "i <= j", fill the rest with the op's identity and reduce, which is O(n^2) per row; above
`2 * _BLOCK` elements the axis is split into blocks (cumulate inside each block, then across the block
totals), so the cost stays O(n * _BLOCK). Integer sums accumulate in at least 32 bits (numpy's rule).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self


from atensor.dtype import dtypes, least_upper_float, to_dtype
from atensor.graph.ops import ReduceOp
from atensor.graph.semantics import reduce_identity
from atensor.tensor.base import AnyTensor, TensorBase, _axis, _sum_dtype


_BLOCK = 32


class ReduceOps:
    """Reduction methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- reductions ----------------------------------------------------------------------------
    def _reduce_axes(self, axis: Any) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted({_axis(a, self.ndim) for a in axes}))

    def _reduce(self, op: ReduceOp, axis: Any, keepdim: bool) -> Self:
        axes = self._reduce_axes(axis)
        node = self.node.reduce(op, axes) if self.ndim else self.node
        if not keepdim:  # (the shape's dims are ints or Exprs already: no reshape argument to normalize)
            node = node.reshape(tuple([s for i, s in enumerate(node.shape) if i not in axes]))
        return self._new(node)

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
        other = other if isinstance(other, TensorBase) else self._const_like(other)
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



def _cum_last(x: AnyTensor, op: ReduceOp) -> AnyTensor:
    """The cumulative `op` along the last axis of `x`."""
    n = x.shape[-1]
    if n <= 2 * _BLOCK or x.numel() == 0:
        return _cum_small(x, op)
    blocks = -(-n // _BLOCK)
    pad = blocks * _BLOCK - n
    identity = reduce_identity(op, x.dtype)
    padded = x._pad_constant([(0, 0)] * (x.ndim - 1) + [(0, pad)], identity) if pad else x
    tiles = padded.reshape(*x.shape[:-1], blocks, _BLOCK)
    inside = _cum_small(tiles, op)  # within each block
    totals = inside[..., -1]                          # (..., blocks)
    before = _cum_last(totals, op)                    # inclusive running totals of the blocks
    shifted = before._pad_constant([(0, 0)] * (before.ndim - 1) + [(1, 0)], identity)[..., :-1]
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
