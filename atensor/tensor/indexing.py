"""Indexing with tensors: advanced getitem and setitem (numpy's rules), gather, scatter, scatter_reduce,
index_select, masked_fill and one_hot.

Why two graph ops (GATHER, SCATTER) instead of tinygrad's one-hot compositions: tinygrad turns
`x[idx]` into `(idx[..., None] == arange(N)) * x` summed over N, which its compiler folds back into
a load. The numpy backend cannot fold it, so the one-hot way costs O(len(idx) * N) (an embedding
lookup of 512 tokens in a 50k vocabulary of width 768 would be a 20 GFLOP matmul instead of a
copy). GATHER and SCATTER work on a *flat* source with flat positions computed by ordinary
elementwise ops, so every indexing method here is index arithmetic around one of them:

    GATHER(source (N,), index)            out[p] = source[index[p]], 0 where index[p] is outside [0, N)
    SCATTER(base (N,), index, values, r)  base with values written ("set"), added ("sum") or maxed
                                          ("max") at index; positions outside [0, N) write nothing

Out-of-range tensor indices therefore read 0 and write nothing, as in tinygrad (the values are not
known when the graph is built, so they cannot raise like PyTorch). Integer and slice indices are
checked when the index is applied and raise IndexError, before any restriction on writing through a
view is reported. A boolean mask used as an index selects a data-dependent number of elements, so
its values must be known: a realized mask is turned into integer indices (numpy's nonzero); an
unrealized one inside an event loop raises NotRealizedError naming the await to use. `t[mask] = v`
with `v` a scalar (or broadcastable to the masked elements' trailing shape) stays lazy: a `where`.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence

import numpy as np

from atensor.dtype import dtypes, least_upper_float
from atensor.graph.symbolic import SymbolicError, is_symbolic
from atensor.graph.node import GraphError, Node
from atensor.graph.ops import Ops
from atensor.tensor.base import TensorBase, _axis, broadcast_shape
from atensor.tensor.base import AnyTensor


_BASIC = (int, slice, type(None), type(Ellipsis))


def _is_tensor(x: Any) -> bool:
    return isinstance(x, TensorBase)


class AssignDTypeError(RuntimeError, TypeError):
    """Float values written into an integer or bool tensor (they would be truncated silently)."""


def check_assign_dtype(target: Any, value: Any) -> None:
    """Raises AssignDTypeError, naming both dtypes, when float values are written into an integer or
    bool tensor; tinygrad raises too. Integers into floats, and same-kind casts, are allowed."""
    if dtypes.is_float(target):
        return
    if _is_tensor(value):
        kind = value.dtype
    elif isinstance(value, float) or (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
        kind = dtypes.default_float
    else:
        return
    if dtypes.is_float(kind):
        raise AssignDTypeError(f"cannot assign {kind.name} values into a {target.name} tensor (they would be "
                               f"truncated); cast them first, e.g. value.cast(dtypes.{target.name})")


class IndexOps:
    """Indexing methods of Tensor (a mixin): basic and advanced getitem, setitem, gather and scatter."""
    __slots__ = ()

    # ---- parsing ---------------------------------------------------------------------------------
    def _index_entries(self, index: Any) -> list[Any]:
        """The index as one entry per output-producing position: None, slice, int or an integer tensor,
        with Ellipsis expanded, lists and arrays made tensors and boolean masks made integer tensors.
        Raises IndexError for out-of-range ints and too many indices."""
        cls = type(self)
        items = list(index) if isinstance(index, tuple) else [index]
        entries: list[Any] = []
        for item in items:
            if isinstance(item, (list, tuple, np.ndarray)):  # a sequence of indices (PyTorch also takes tuples)
                item = cls(np.asarray(item), device=self.device)
            if isinstance(item, (bool, np.bool_)):
                raise TypeError("a Python bool as an index is not supported; use a boolean tensor")
            if isinstance(item, (np.integer,)):
                item = int(item)
            if not (isinstance(item, _BASIC) or _is_tensor(item)):
                raise TypeError(f"unsupported index {item!r}: use ints, slices, None, ..., or "
                                f"integer/boolean tensors")
            entries.append(item)
        if sum(e is Ellipsis for e in entries) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        consumed = sum(e.ndim if _is_tensor(e) and e.dtype == dtypes.bool else
                       (0 if e is None or e is Ellipsis else 1) for e in entries)
        if consumed > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        if Ellipsis in [e for e in entries if not _is_tensor(e)]:
            at = next(i for i, e in enumerate(entries) if e is Ellipsis)
            entries = entries[:at] + [slice(None)] * (self.ndim - consumed) + entries[at + 1:]
        else:
            entries = entries + [slice(None)] * (self.ndim - consumed)
        out: list[Any] = []
        dim = 0
        for e in entries:
            if e is None:
                out.append(None)
                continue
            if _is_tensor(e) and e.dtype == dtypes.bool:
                mask_shape = self.shape[dim:dim + e.ndim]
                if e.shape != mask_shape:
                    raise IndexError(f"boolean index of shape {e.shape} does not match the indexed axes "
                                     f"{mask_shape}")
                out.extend(cls(c, device=self.device) for c in np.nonzero(e.numpy()))
                dim += e.ndim
                continue
            size = self.shape[dim]
            if isinstance(e, int) and not -size <= e < size:
                raise IndexError(f"index {e} is out of bounds for axis {dim} with size {size}")
            if _is_tensor(e) and not dtypes.is_int(e.dtype):
                raise IndexError(f"tensors used as indices must be integer or boolean, got {e.dtype.name}")
            out.append(e)
            dim += 1
        return out

    # ---- getitem ---------------------------------------------------------------------------------
    def _basic_index(self, index: Any) -> Self:
        """Basic indexing: ints, slices (any step), None and Ellipsis."""
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, TensorBase) or isinstance(i, (list, type(None).__class__)) and not i is None
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

    def __getitem__(self, index: Any) -> Self:
        """numpy's indexing: ints, slices (any step), None, ..., and integer or boolean tensors (advanced
        indexing; several broadcast together, and their result axes go where numpy puts them)."""
        entries = self._index_entries(index)
        if not any(_is_tensor(e) for e in entries):
            return self._basic_index(tuple(entries))
        x, positions, flat, _ = self._advanced(entries)
        rest = [d for d in range(x.ndim) if d not in positions]
        rest_shape = tuple(x.shape[d] for d in rest)
        source = x.permute(*positions, *rest).reshape(-1)
        full = _row_index(flat, rest_shape)
        out = self._new(Node.make(Ops.GATHER, self.dtype, (source.node, full.node)))
        return _place_result(out, positions, flat.ndim)

    def _advanced(self, entries: list[Any]) -> tuple[Self, list[int], Self, Self]:
        """(x, positions, flat, valid): x is this tensor under the basic part of the index (tensor and
        int entries kept as whole axes), positions are x's axes that tensors and ints index, flat is
        the row-major position into those axes (broadcast shape of the indices), -1 where invalid."""
        cls = type(self)
        basic = tuple(slice(None) if (isinstance(e, int) or _is_tensor(e)) else e for e in entries)
        x = self._basic_index(basic)
        positions = [i for i, e in enumerate(entries) if isinstance(e, int) or _is_tensor(e)]
        sizes = [x.shape[p] for p in positions]
        wide = dtypes.int64 if math.prod(self.shape) >= 2 ** 31 - 1 else dtypes.int32
        indices = [cls.full((), e, dtype=wide, device=self.device) if isinstance(e, int) else e.cast(wide)
                   for e, p in zip((entries[p] for p in positions), positions)]
        indices = [(i < 0).where(i + size, i) for i, size in zip(indices, sizes)]
        shape = broadcast_shape(*(i.shape for i in indices), op="indexing")
        flat: Optional[Self] = None
        valid: Optional[Self] = None
        stride = 1
        for i, size in reversed(list(zip(indices, sizes))):
            term = i * stride if stride != 1 else i
            flat = term if flat is None else flat + term
            ok = (i >= 0) & (i < size)
            valid = ok if valid is None else valid & ok
            stride *= size
        assert flat is not None and valid is not None
        flat = valid.where(flat, -1)._broadcast_to(shape)
        return x, positions, flat, valid._broadcast_to(shape)

    # ---- setitem ---------------------------------------------------------------------------------
    def __setitem__(self, index: Any, value: Any) -> None:
        """Writes `value` (broadcast, cast to this dtype) into the indexed elements, lazily and in program
        order. Indices are checked first (IndexError); a tensor without storage gets storage holding its
        current value, so `t = a * 2; t[0] = 1` changes `t` and never `a`."""
        check_assign_dtype(self.dtype, value)
        entries = self._index_entries(index) if not _is_mask_index(self, index, value) else None
        self._own_storage_for_write()
        if entries is None:  # t[mask] = scalar-like: a lazy where over the whole tensor
            mask = index
            if not _is_tensor(value):
                value = type(self).full((), value, dtype=self.dtype, device=self.device)
            cond = mask.reshape(*mask.shape, *([1] * (self.ndim - mask.ndim)))._broadcast_to(self.shape)
            self.assign(cond.where(value.cast(self.dtype), self))
            return
        if not any(_is_tensor(e) for e in entries):
            self._basic_index(tuple(entries)).assign(value)
            return
        x, positions, flat, _ = self._advanced(entries)
        rest = [d for d in range(x.ndim) if d not in positions]
        rest_shape = tuple(x.shape[d] for d in rest)
        order = positions + rest
        gathered_shape = _placed_shape(flat.shape, rest_shape, positions)
        cls = type(self)
        value = value if _is_tensor(value) else cls.full((), value, dtype=self.dtype, device=self.device)
        value = value.cast(self.dtype)._broadcast_to(gathered_shape)
        value = _unplace(value, positions, flat.ndim)  # to (index shape..., rest...)
        moved = x.permute(*order)
        full = _row_index(flat, rest_shape)
        node = Node.make(Ops.SCATTER, self.dtype, (moved.reshape(-1).node, full.node, value.node), "set")
        new = self._new(node).reshape(moved.shape).permute(*_inverse(order))
        x.assign(new)

    def _own_storage_for_write(self) -> None:
        base = self.node.base()
        if base.op not in (Ops.BUFFER, Ops.ASSIGN) and base.op.name != "MULTI":
            self._node = self.clone().node

    # ---- gather / scatter ------------------------------------------------------------------------
    def _positions(self, dim: int, index: Self, op: str) -> Self:
        """Flat positions into this tensor for torch's gather/scatter: index's own coordinates on
        every axis but `dim`, where the index's values are used. -1 where out of range."""
        if index.ndim != self.ndim or not dtypes.is_int(index.dtype):
            raise GraphError(f"{op}: index must be an integer tensor with {self.ndim} dimensions, got "
                             f"{index.dtype.name} of shape {index.shape}")
        if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
            raise GraphError(f"{op}: index shape {index.shape} is larger than {self.shape} outside axis "
                             f"{dim}")
        cls = type(self)
        wide = dtypes.int64 if math.prod(self.shape) >= 2 ** 31 - 1 else dtypes.int32
        idx = index.cast(wide)
        flat: Optional[Self] = None
        stride = 1
        for d in reversed(range(self.ndim)):
            if d == dim:
                coord = idx
            else:
                shape = [1] * self.ndim
                shape[d] = index.shape[d]
                coord = cls.arange(index.shape[d], dtype=wide, device=self.device).reshape(*shape)
            term = coord * stride if stride != 1 else coord
            flat = term if flat is None else flat + term
            stride *= self.shape[d]
        assert flat is not None
        ok = (idx >= 0) & (idx < self.shape[dim])
        return ok.where(flat._broadcast_to(index.shape), -1)

    def gather(self, dim: int, index: Self) -> Self:
        """torch.gather: out[i][j] = self[index[i][j]][j] for dim 0 (and so on); index has this tensor's
        number of dimensions, and out has index's shape. Out-of-range indices give 0."""
        dim = _axis(dim, self.ndim)
        flat = self._positions(dim, index, "gather")
        return self._new(Node.make(Ops.GATHER, self.dtype, (self.reshape(-1).node, flat.node)))

    def _scatter_flat(self, dim: int, index: Self, src: Any, reduce: str, op: str) -> Self:
        dim = _axis(dim, self.ndim)
        flat = self._positions(dim, index, op)
        cls = type(self)
        if _is_tensor(src):
            if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
                raise GraphError(f"{op}: src of shape {src.shape} is smaller than index {index.shape}")
            values = src.cast(self.dtype).shrink(tuple((0, i) for i in index.shape))
        else:
            values = cls.full(index.shape, src, dtype=self.dtype, device=self.device)
        node = Node.make(Ops.SCATTER, self.dtype, (self.reshape(-1).node, flat.node, values.node), reduce)
        return self._new(node).reshape(self.shape)

    def scatter(self, dim: int, index: Self, src: Any, reduce: Optional[str] = None) -> Self:
        """torch.scatter (out of place): a copy with self[index[i][j]][j] = src[i][j] for dim 0. `src` may be
        a scalar. With duplicate positions the last write wins; reduce="add" or "multiply" combines them
        with this tensor's values instead. A tensor `src` must have this tensor's dtype (PyTorch's rule)."""
        if _is_tensor(src) and src.dtype != self.dtype:
            raise GraphError(f"scatter: src is {src.dtype.name}, this tensor {self.dtype.name}; cast one")
        if reduce is not None:
            if reduce not in ("add", "multiply"):
                raise GraphError(f"scatter reduce={reduce!r}; use 'add' or 'multiply'")
            if reduce == "multiply":
                values = src if _is_tensor(src) else type(self).full(index.shape, src, dtype=self.dtype,
                                                                     device=self.device)
                return self._scatter_prod(dim, index, values, include_self=True)
            return self._scatter_flat(dim, index, src, "sum", "scatter")
        return self._scatter_flat(dim, index, src, "set", "scatter")

    def scatter_reduce(self, dim: int, index: Self, src: Self, reduce: str,
                       include_self: bool = True) -> Self:
        """torch.scatter_reduce for reduce in "sum", "prod", "amax", "amin", "mean": values at the same
        position combine; `include_self=False` leaves this tensor's values out where something is
        scattered. `src` must have this tensor's dtype (PyTorch's rule)."""
        if reduce not in ("sum", "prod", "amax", "amin", "mean"):
            raise GraphError(f"scatter_reduce reduce={reduce!r}; use sum, prod, amax, amin or mean")
        if _is_tensor(src) and src.dtype != self.dtype:
            raise GraphError(f"scatter_reduce: src is {src.dtype.name}, this tensor {self.dtype.name}; cast one")
        if reduce == "prod":
            return self._scatter_prod(dim, index, src, include_self)
        base = self
        if not include_self:
            hit = self.zeros_like(dtype=dtypes.bool)._scatter_flat(dim, index, True, "set", "scatter_reduce")
            identities = {"sum": 0, "mean": 0, "amax": _lowest(self.dtype), "amin": _highest(self.dtype)}
            identity = identities[reduce]
            base = hit.where(self._const_like(identity), self)
        if reduce in ("sum", "mean"):
            total = base._scatter_flat(dim, index, src, "sum", "scatter_reduce")
            if reduce == "sum":
                return total
            counts = self.zeros_like(dtype=dtypes.int32)._scatter_flat(dim, index, 1, "sum", "scatter_reduce")
            counts = counts + (1 if include_self else 0)
            out = total / counts.maximum(1).cast(least_upper_float(self.dtype))
            return out if dtypes.is_float(self.dtype) else out.floor().cast(self.dtype)
        if reduce == "amax":
            return base._scatter_flat(dim, index, src, "max", "scatter_reduce")
        flip = (lambda t: ~t) if not dtypes.is_float(self.dtype) else (lambda t: -t)
        return flip(flip(base)._scatter_flat(dim, index, flip(src.cast(self.dtype)), "max", "scatter_reduce"))

    def _scatter_prod(self, dim: int, index: Self, src: Self, include_self: bool) -> Self:
        """The product of the values scattered to each position (times this tensor's value there with
        `include_self`). Integers and bools multiply exactly, wrapping as numpy and torch do (a SCATTER
        "prod"). Floats go through sums, whose gradient rule exists: exp of the summed log-magnitudes,
        the sign from the count of negatives, zero where a zero was scattered (~1e-7 relative error per
        factor)."""
        cls = type(self)
        if not dtypes.is_float(self.dtype):
            base = self
            if not include_self:
                hit = self.zeros_like(dtype=dtypes.bool)._scatter_flat(dim, index, True, "set", "scatter_reduce")
                base = hit.where(self._const_like(1), self)
            return base._scatter_flat(dim, index, src, "prod", "scatter_reduce")
        ft = least_upper_float(self.dtype)
        values = src.cast(ft)
        zero_f, zero_i = self.zeros_like(dtype=ft), self.zeros_like(dtype=dtypes.int32)
        magnitude = zero_f._scatter_flat(dim, index, values.abs().log(), "sum", "scatter_reduce")
        negatives = zero_i._scatter_flat(dim, index, (values < 0).cast(dtypes.int32), "sum", "scatter_reduce")
        zeros = zero_i._scatter_flat(dim, index, (values == 0).cast(dtypes.int32), "sum", "scatter_reduce")
        hit = self.zeros_like(dtype=dtypes.bool)._scatter_flat(dim, index, True, "set", "scatter_reduce")
        sign = (negatives % 2 == 1).where(cls.full((), -1.0, dtype=ft, device=self.device), 1.0)
        product = (zeros > 0).where(zero_f, magnitude.exp() * sign)
        combined = product * self.cast(ft) if include_self else product
        out = hit.where(combined, self.cast(ft))
        return out if dtypes.is_float(self.dtype) else out.round().cast(self.dtype)

    def index_select(self, dim: int, index: Self) -> Self:
        """The slices of `dim` named by the 1-D integer tensor `index`, in its order."""
        dim = _axis(dim, self.ndim)
        if index.ndim != 1:
            raise GraphError(f"index_select needs a 1-D index, got shape {index.shape}")
        return self[(slice(None),) * dim + (index,)]

    def masked_fill(self, mask: Self, value: Any) -> Self:
        """`value` where `mask` (broadcast) is true, else this tensor; the dtype stays this tensor's."""
        fill = value.cast(self.dtype) if _is_tensor(value) else type(self).full((), value, dtype=self.dtype,
                                                                                device=self.device)
        return mask.cast(dtypes.bool).where(fill, self)

    def one_hot(self, num_classes: int = -1) -> Self:
        """An integer tensor with a new last axis of size `num_classes`, 1 at each value (tinygrad and
        PyTorch). `num_classes=-1` takes max + 1, which needs this tensor's values (realized)."""
        if not dtypes.is_int(self.dtype):
            raise GraphError(f"one_hot needs an integer tensor, got {self.dtype.name}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1 if self.numel() else 0
        classes = type(self).arange(num_classes, dtype=self.dtype, device=self.device)
        return (self.unsqueeze(-1) == classes).cast(dtypes.default_int)


def _lowest(dt) -> Any:
    if dt == dtypes.bool:
        return False
    return int(np.iinfo(dt.np).min) if dtypes.is_int(dt) else -math.inf


def _highest(dt) -> Any:
    if dt == dtypes.bool:
        return True
    return int(np.iinfo(dt.np).max) if dtypes.is_int(dt) else math.inf


def _is_mask_index(t: Any, index: Any, value: Any) -> bool:
    """`t[mask] = v` that can stay lazy: one boolean tensor over t's leading axes, and a value that
    broadcasts to the trailing axes (a value with one row per selected element needs the mask's data)."""
    if not (_is_tensor(index) and index.dtype == dtypes.bool and index.shape == t.shape[:index.ndim]):
        return False
    if not _is_tensor(value):
        return True
    trailing = t.shape[index.ndim:]
    try:
        return broadcast_shape(value.shape, trailing) == trailing and value.ndim <= len(trailing)
    except GraphError:
        return False


def _row_index(flat: AnyTensor, rest_shape: tuple[int, ...]) -> AnyTensor:
    """Positions into (rows, *rest_shape) flattened: flat row indices (shape B) -> shape B + rest."""
    if not rest_shape:
        return flat
    count = math.prod(rest_shape)
    cls = type(flat)
    inner = cls.arange(count, dtype=flat.dtype, device=flat.device).reshape(*rest_shape)
    rows = flat.reshape(*flat.shape, *([1] * len(rest_shape)))
    return rows * count + inner.reshape(*([1] * flat.ndim), *rest_shape)


def _adjacent(positions: list[int]) -> bool:
    return positions == list(range(positions[0], positions[0] + len(positions)))


def _place_result(out: AnyTensor, positions: list[int], nb: int) -> AnyTensor:
    """out has axes (index axes..., rest...); numpy puts the index axes where the indexed axes were when
    those were adjacent, else first."""
    if not _adjacent(positions) or positions[0] == 0:
        return out
    k = positions[0]
    rest = out.ndim - nb
    order = list(range(nb, nb + k)) + list(range(nb)) + list(range(nb + k, nb + rest))
    return out.permute(*order)


def _placed_shape(index_shape: tuple[int, ...], rest_shape: tuple[int, ...],
                  positions: list[int]) -> tuple[int, ...]:
    if not _adjacent(positions) or positions[0] == 0:
        return tuple(index_shape) + tuple(rest_shape)
    k = positions[0]
    return tuple(rest_shape[:k]) + tuple(index_shape) + tuple(rest_shape[k:])


def _unplace(value: AnyTensor, positions: list[int], nb: int) -> AnyTensor:
    """The inverse of `_place_result`: value in numpy's result layout -> (index axes..., rest...)."""
    if not _adjacent(positions) or positions[0] == 0:
        return value
    k = positions[0]
    order = list(range(k, k + nb)) + list(range(k)) + list(range(k + nb, value.ndim))
    return value.permute(*order)


def _inverse(order: Sequence[int]) -> list[int]:
    inv = [0] * len(order)
    for i, o in enumerate(order):
        inv[o] = i
    return inv


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
