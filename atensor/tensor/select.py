"""Selection and sorting: sort, argsort, topk, nonzero and masked_select.

sort is a rank computation, not a sorting network: along the sorted axis, element i's place is the
number of elements that come before it (smaller, or equal and earlier: a stable sort, PyTorch's
`stable=True`), an (n, n) comparison summed per row. The permutation is scattered from those places,
and the values are a gather of the input by it, so the gradient of the values is the gather's (each
input element gets the gradient of the place it went to). O(n^2) per row, one fused reduce; tinygrad's
bitonic network is O(n log^2 n) but costs log^2 n kernels, and the rows this serves (top-k of logits,
sorting scores) are short. NaN sorts after every number, as in PyTorch.

nonzero and masked_select have a data-dependent length. Without `size` the mask's values are read
(a sync accessor: inside an event loop, realize the mask first); with `size` (tinygrad's form) the
result is lazy: positions come from a cumulative sum of the mask and values are scattered to them,
with `fill_value` after the last one.
"""
from __future__ import annotations

from typing import Any, Optional, Self

import numpy as np

from atensor.dtype import dtypes
from atensor.tensor.base import _axis
from atensor.tensor.base import AnyTensor



def _before(a: AnyTensor, b: AnyTensor, descending: bool) -> AnyTensor:
    """True where `a` sorts strictly before `b` (NaN after every number, in either direction)."""
    if not dtypes.is_float(a.dtype):
        return (a > b) if descending else (a < b)
    a_nan, b_nan = a.isnan(), b.isnan()
    plain = (a > b) if descending else (a < b)
    return (plain & a_nan.logical_not()) | (b_nan & a_nan.logical_not())


def _same(a: AnyTensor, b: AnyTensor) -> AnyTensor:
    same = a == b
    return same | (a.isnan() & b.isnan()) if dtypes.is_float(a.dtype) else same


class SelectOps:
    """Sorting and selection methods of Tensor (a mixin)."""
    __slots__ = ()

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Self, Self]:
        """(values, indices) sorted along `dim`, stably (equal values keep their order); indices are int32."""
        if self.ndim == 0:
            return self, self._const_like(0, dtypes.int32)
        dim = _axis(dim, self.ndim)
        x = self.transpose(dim, -1) if dim != self.ndim - 1 else self
        n = x.shape[-1]
        cls = type(self)
        if n <= 1 or x.numel() == 0:
            idx = cls.zeros(*x.shape, dtype=dtypes.int32, device=self.device)
        else:
            key = x.detach()
            a, b = key.unsqueeze(-1), key.unsqueeze(-2)        # (..., i, 1) and (..., 1, j)
            i = cls.arange(n, device=self.device).reshape(n, 1)
            j = cls.arange(n, device=self.device).reshape(1, n)
            comes_first = _before(b, a, descending) | (_same(b, a) & (j < i))   # j goes before i
            place = comes_first.cast(dtypes.int32).sum(-1)      # (..., i): where element i goes
            order = cls.arange(n, dtype=dtypes.int32, device=self.device).reshape(*((1,) * (x.ndim - 1)), n)
            order = order.expand(*x.shape)
            idx = cls.zeros(*x.shape, dtype=dtypes.int32, device=self.device).scatter(-1, place, order)
        values = x.gather(-1, idx)
        if dim != self.ndim - 1:
            values, idx = values.transpose(dim, -1), idx.transpose(dim, -1)
        return values, idx

    def argsort(self, dim: int = -1, descending: bool = False) -> Self:
        """The indices that sort this tensor along `dim` (stably)."""
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True,
             sorted: Optional[bool] = None) -> tuple[Self, Self]:  # noqa: A002 - PyTorch's name
        """(values, indices) of the `k` largest (or smallest) elements along `dim`, in sorted order."""
        if sorted is False or not sorted_:
            raise NotImplementedError("topk(sorted=False) is not supported; the results come sorted")
        d = _axis(dim, self.ndim) if self.ndim else 0
        size = self.shape[d] if self.ndim else 1
        if not 0 <= k <= size:
            raise ValueError(f"topk: k={k} is out of range for a dimension of size {size}")
        values, idx = self.sort(d, descending=largest)
        if self.ndim == 0:
            return values, idx
        bounds = [None] * self.ndim
        bounds[d] = (0, k)
        return values.shrink(bounds), idx.shrink(bounds)

    def masked_select(self, mask: Self, size: Optional[int] = None, fill_value: Any = 0) -> Self:
        """The elements where `mask` (bool, broadcast to this shape) is true, as a 1-D tensor in row-major
        order. Without `size` the mask's values are read now; with `size` the result has that length
        (lazy), cut or padded with `fill_value`."""
        if mask.dtype != dtypes.bool:
            raise RuntimeError(f"masked_select expects a bool mask, got {mask.dtype.name}")
        shape = tuple(np.broadcast_shapes(self.shape, mask.shape))
        x = self._broadcast_to(shape).reshape(-1)
        flat_mask = mask._broadcast_to(shape).reshape(-1)
        cls = type(self)
        if size is None:
            where = np.flatnonzero(flat_mask.numpy()).astype(np.int32)
            return x[cls(where, device=self.device)] if where.size else cls.zeros(0, dtype=self.dtype,
                                                                                 device=self.device)
        base = cls.full((size,), fill_value, dtype=self.dtype, device=self.device)
        if x.numel() == 0 or size == 0:
            return base
        position = flat_mask.cast(dtypes.int32).cumsum() - 1
        position = flat_mask.where(position, -1)
        return base.scatter(0, position, x)

    def nonzero(self, size: Optional[int] = None, fill_value: int = 0) -> Self:
        """The int32 coordinates (count, ndim) of the nonzero elements, in row-major order; `size` makes it
        lazy and of that many rows, as masked_select."""
        cls = type(self)
        if self.ndim == 0:
            count = size if size is not None else int(bool(self.item()))
            return cls.zeros(count, 0, dtype=dtypes.int32, device=self.device)
        mask = self != 0
        if size is None:
            found = np.argwhere(mask.numpy()).astype(np.int32).reshape(-1, self.ndim)
            return cls(found, device=self.device)
        columns = []
        for axis, n in enumerate(self.shape):
            shape = [1] * self.ndim
            shape[axis] = n
            coord = cls.arange(n, dtype=dtypes.int32, device=self.device).reshape(*shape).expand(*self.shape)
            columns.append(coord.masked_select(mask, size=size, fill_value=fill_value))
        return columns[0].stack(*columns[1:], dim=1)
