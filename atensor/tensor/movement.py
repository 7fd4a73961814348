"""Joining, splitting and rearranging: cat, stack, split, chunk, repeat, repeat_interleave, tile, pad with
constant/reflect/replicate/circular modes, roll, tril and triu.

All are compositions of movement ops (views, never copies until a kernel reads them) and elementwise
ops, in tinygrad's style: `cat` pads every part to the full size and adds them (each padded part is
zero outside its own slot), `repeat` expands a new axis of stride 0 and folds it into the old one,
`reflect` padding is a flipped shrink joined on each side. Gradients therefore come from the rules
for views and elementwise ops; no new graph op is needed.

The primitive movements (reshape, permute, expand, pad with a constant, shrink, flip) each make one view
node; the rest are built from them.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence, Union


from atensor.dtype import dtypes, least_upper_dtype
from atensor.graph.node import GraphError
from atensor.graph.symbolic import SymbolicError, as_dim, is_symbolic
from atensor.graph.view import symbolic_shape
from atensor.tensor.base import AnyTensor, Scalar, _axis



def _ints(args: Sequence) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(_dim(a) for a in args)


def _dim(a: Any):
    """A size argument: an int as before (`int(a)`), a Variable or Sym as a symbolic dim."""
    return as_dim(a) if is_symbolic(a) else int(a)

class MovementOps:
    """Movement methods of Tensor (a mixin): views that change shape, order or extent, and joins."""
    __slots__ = ()

    # ---- movement ------------------------------------------------------------------------------
    def reshape(self, *shape) -> Self:
        """The same values in a new shape; one axis may be -1."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        # None keeps that axis's size (tinygrad's form)
        shape = [self.shape[i] if s is None else _dim(s) for i, s in enumerate(shape)] if shape else []
        if shape.count(-1) > 1:
            raise GraphError(f"reshape: only one axis may be -1, got {tuple(shape)}")
        if -1 in shape:
            if symbolic_shape(self.shape):
                raise SymbolicError(f"reshape: -1 in {tuple(shape)} for the symbolic shape {self.shape}; give "
                                    f"every dim (a symbolic dim stays as it is)")
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

    def _pad_constant(self, padding: Sequence, value: Scalar = 0.0) -> Self:
        """Pads with `value`. `padding` is ((before, after), ...) per axis (None for none), or torch's
        flat (left, right, top, bottom, ...) starting at the last axis."""
        pairs = _pairs(padding, self.ndim)
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



    def cat(self, *others: Self, dim: int = 0) -> Self:
        """This tensor and `others` joined along `dim`; every other axis must match. Parts of size 0
        along `dim` are allowed."""
        if isinstance(self, (list, tuple)):  # Tensor.cat([a, b]) (PyTorch's form)
            return self[0].cat(*self[1:], *others, dim=dim)
        if len(others) == 1 and isinstance(others[0], (list, tuple)):
            others = tuple(others[0])
        parts = [self, *others]
        dim = _axis(dim, self.ndim)
        for p in parts:
            if p.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(p.shape, self.shape))
                                          if i != dim):
                raise GraphError(f"cat: shape {p.shape} does not match {self.shape} outside axis {dim}")
        dt = least_upper_dtype(*(p.dtype for p in parts))
        total = sum(p.shape[dim] for p in parts)
        out = None
        at = 0
        for p in parts:
            size = p.shape[dim]
            pairs = [(0, 0)] * self.ndim
            pairs[dim] = (at, total - at - size)
            padded = p.cast(dt).pad(pairs) if size else None
            at += size
            if padded is not None:
                out = padded if out is None else (out | padded if dt == dtypes.bool else out + padded)
        if out is None:  # every part is empty along dim
            shape = list(self.shape)
            shape[dim] = 0
            return type(self).zeros(*shape, dtype=dt, device=self.device)
        return out

    def stack(self, *others: Self, dim: int = 0) -> Self:
        """This tensor and `others` (all the same shape) joined along a new axis `dim`; also
        `Tensor.stack([a, b])`."""
        if isinstance(self, (list, tuple)):
            if others:
                raise GraphError("stack: pass the tensors either as one list or as separate arguments, not both "
                                 "(a list first, then more tensors)")
            return self[0].stack(*self[1:], dim=dim)
        if len(others) == 1 and isinstance(others[0], (list, tuple)):
            others = tuple(others[0])
        for o in others:
            if o.shape != self.shape:
                raise GraphError(f"stack: every tensor must have shape {self.shape}, got {o.shape}")
        dim = _axis(dim, self.ndim + 1)
        return self.unsqueeze(dim).cat(*(o.unsqueeze(dim) for o in others), dim=dim)

    def split(self, sizes: Union[int, Sequence[int]], dim: int = 0) -> tuple[Self, ...]:
        """Pieces along `dim`: of `sizes` each (the last may be smaller) or of the listed sizes."""
        dim = _axis(dim, self.ndim)
        n = self.shape[dim]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise GraphError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
        if sum(sizes) != n:
            raise GraphError(f"split sizes {list(sizes)} do not add up to {n} along axis {dim}")
        out, at = [], 0
        for s in sizes:
            bounds = [None] * self.ndim
            bounds[dim] = (at, at + s)
            out.append(self.shrink(bounds))
            at += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        """`chunks` pieces along `dim` of ceil(size / chunks) each (fewer when they run out), as PyTorch."""
        if chunks <= 0:
            raise GraphError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[_axis(dim, self.ndim)]
        return self.split(max(1, -(-n // chunks)), dim) if n else (self,) * 1

    def repeat(self, *repeats: int) -> Self:
        """PyTorch's repeat (numpy's tile with at least as many repeats as axes): the whole tensor
        repeated along each axis; extra leading repeats add axes."""
        reps = _ints(repeats)
        if len(reps) < self.ndim:
            raise GraphError(f"repeat needs at least {self.ndim} repeats, got {reps}")
        x = self.reshape(*((1,) * (len(reps) - self.ndim) + self.shape))
        interleaved = [d for s in x.shape for d in (1, s)]
        expanded = [d for r, s in zip(reps, x.shape) for d in (r, s)]
        final = [r * s for r, s in zip(reps, x.shape)]
        return x.reshape(*interleaved).expand(*expanded).reshape(*final)

    def tile(self, *reps: int) -> Self:
        """numpy's tile: like repeat, but fewer repeats than axes repeat the trailing axes."""
        r = _ints(reps)
        return self.repeat(*((1,) * (self.ndim - len(r)) + r))

    def repeat_interleave(self, repeats: int, dim: Any = None) -> Self:
        """Each element repeated `repeats` times along `dim` (of the flattened tensor when None)."""
        if not isinstance(repeats, int):
            raise NotImplementedError("repeat_interleave with per-element repeats (a tensor) is not "
                                      "supported")
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else _axis(dim, self.ndim)
        expanded = x.unsqueeze(d + 1).expand(*x.shape[:d + 1], repeats, *x.shape[d + 1:])
        return expanded.reshape(*x.shape[:d], x.shape[d] * repeats, *x.shape[d + 1:])

    def pad(self, padding: Sequence, mode: str = "constant", value: Any = 0.0) -> Self:
        """Pads with `mode`: "constant" (with `value`), "reflect" (mirror without the edge),
        "replicate" (the edge repeated) or "circular" (wrap around). `padding` is ((before, after), ...)
        per axis (None for none), or PyTorch's flat (left, right, top, bottom, ...) from the last axis."""
        if not isinstance(mode, str):  # padding._pad_constant(value) called positionally
            mode, value = "constant", mode
        if mode == "constant":
            return self._pad_constant(padding, value)
        if mode not in ("reflect", "replicate", "circular"):  # PyTorch's (and tinygrad's) error for a mode
            raise NotImplementedError(f"pad mode {mode!r} is not implemented; use constant, reflect, replicate "
                                      f"or circular")
        pairs = _pairs(padding, self.ndim)
        # Negative padding crops, as PyTorch's: a circular pad wraps what is left after the crop, a reflect or
        # replicate pad mirrors (repeats) the whole axis and is cropped after.
        crop = tuple((max(0, -b), max(0, -a)) for b, a in pairs)
        pairs = [(max(0, b), max(0, a)) for b, a in pairs]
        x = self
        if mode == "circular" and any(b or a for b, a in crop):
            x = x.shrink(tuple((b, s - a) for (b, a), s in zip(crop, x.shape)))
        for d, (before, after) in enumerate(pairs):
            if not (before or after):
                continue
            n = x.shape[d]
            limit = n - 1 if mode == "reflect" else n
            if (mode != "replicate" and max(before, after) > limit) or n == 0:
                raise GraphError(f"{mode} padding of {(before, after)} is too large for axis {d} of size {n}")
            parts = []
            if before:
                parts.append(_edge(x, d, mode, before, start=True))
            parts.append(x)
            if after:
                parts.append(_edge(x, d, mode, after, start=False))
            x = parts[0].cat(*parts[1:], dim=d)
        if mode != "circular" and any(b or a for b, a in crop):
            x = x.shrink(tuple((b, s - a) for (b, a), s in zip(crop, x.shape)))
        return x

    def roll(self, shifts: Union[int, Sequence[int]], dims: Union[int, Sequence[int], None] = None) -> Self:
        """Elements shifted by `shifts` along `dims`, wrapping around (of the flattened tensor when None)."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(*self.shape)
        if dims is None and not isinstance(shifts, int):
            if len(shifts) != 1:
                raise GraphError(f"roll: {len(shifts)} shifts need as many dims")
            shifts = shifts[0]
        shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        if len(shift_list) != len(dim_list):
            raise GraphError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims")
        x = self
        for s, d in zip(shift_list, dim_list):
            d = _axis(d, self.ndim)
            n = x.shape[d]
            if n == 0 or s % n == 0:
                continue
            s %= n
            head, tail = x.split([n - s, s], d)
            x = tail.cat(head, dim=d)
        return x

    # ---- windows, diagonals and grids -------------------------------------------------------------
    def unfold(self, dim: int, size: int, step: int) -> Self:
        """PyTorch's Tensor.unfold: the windows of `size` elements every `step` along `dim`; axis `dim`
        becomes the window count and a last axis of `size` is added. Each window offset is one strided
        slice, so the windows are views and the gradient adds up where they overlap."""
        dim = _axis(dim, self.ndim) if self.ndim else _axis(dim, 1)
        n = self.shape[dim] if self.ndim else 1
        if step <= 0:
            raise RuntimeError(f"unfold: step must be positive, got {step}")
        if not 0 <= size <= n:
            raise RuntimeError(f"unfold: size {size} is larger than dimension {dim} of size {n}")
        count = (n - size) // step + 1
        if size == 0:  # empty windows, still a view of this tensor (so its gradient is zeros, not none)
            bounds: list[Any] = [None] * (self.ndim + 1)
            bounds[dim], bounds[-1] = (0, count), (0, 0)
            return self.unsqueeze(-1).shrink(bounds)
        parts = []
        for k in range(size):
            index = [slice(None)] * self.ndim
            index[dim] = slice(k, k + (count - 1) * step + 1, step)
            parts.append(self[tuple(index)].unsqueeze(-1))
        return parts[0].cat(*parts[1:], dim=-1)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Self:
        """Axis `dim` split into `sizes` (one may be -1)."""
        dim = _axis(dim, self.ndim)
        sizes = list(sizes)
        if sizes.count(-1) == 1:
            known = 1
            for s in sizes:
                known *= s if s != -1 else 1
            sizes[sizes.index(-1)] = self.shape[dim] // known if known else 0
        return self.reshape(*self.shape[:dim], *sizes, *self.shape[dim + 1:])

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Self:
        """The diagonal of the (dim1, dim2) planes (above it with offset > 0, below with < 0), as a last
        axis (PyTorch's). A view: the plane flattened, padded by one per row and the first column kept."""
        a, b = _axis(dim1, self.ndim), _axis(dim2, self.ndim)
        if a == b:
            raise RuntimeError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
        rest = [d for d in range(self.ndim) if d not in (a, b)]
        x = self.permute(*rest, a, b)
        rows, cols = x.shape[-2:]
        bounds: list[Any] = [None] * (x.ndim - 2)
        if offset >= 0:
            x = x.shrink(bounds + [None, (min(offset, cols), cols)])
        else:
            x = x.shrink(bounds + [(min(-offset, rows), rows), None])
        m = min(x.shape[-2:])
        batch = x.shape[:-2]
        if m == 0:
            return type(self).zeros(*batch, 0, dtype=self.dtype, device=self.device)
        square = x.shrink(bounds + [(0, m), (0, m)]).reshape(*batch, m * m)
        padded = square._pad_constant([(0, 0)] * len(batch) + [(0, m)])
        return padded.reshape(*batch, m, m + 1)[..., 0]

    def diag(self, diagonal: int = 0) -> Self:
        """A 1-D tensor made the `diagonal` of a square matrix (zeros elsewhere), or the diagonal of a 2-D
        one, as torch.diag."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise RuntimeError(f"diag needs a 1-D or 2-D tensor, got shape {self.shape}")
        n = self.shape[0]
        # row i gets v_i followed by n zeros; the first n*n elements are the diagonal matrix
        rows = self.reshape(n, 1)._pad_constant([(0, 0), (0, n)]).reshape(n * (n + 1))[:n * n].reshape(n, n)
        k = abs(diagonal)
        if k == 0:
            return rows
        return rows._pad_constant([(0, k), (k, 0)] if diagonal > 0 else [(k, 0), (0, k)])

    def meshgrid(self, *others: Self, indexing: str = "ij") -> tuple[Self, ...]:
        """Coordinate grids of this tensor and `others` (each 1-D or 0-d), as torch.meshgrid: "ij" is
        matrix indexing, "xy" swaps the first two axes (Cartesian)."""
        if indexing not in ("ij", "xy"):
            raise RuntimeError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        parts = [t.reshape(-1) for t in (self, *others)]
        sizes = [p.shape[0] for p in parts]
        if indexing == "xy" and len(parts) > 1:
            sizes[0], sizes[1] = sizes[1], sizes[0]
        out = []
        for k, p in enumerate(parts):
            axis = k if indexing == "ij" or len(parts) < 2 or k > 1 else 1 - k
            shape = [1] * len(parts)
            shape[axis] = p.shape[0]
            out.append(p.reshape(*shape).expand(*sizes))
        return tuple(out)

    def _triangle(self, diagonal: int, lower: bool) -> Self:
        if self.ndim < 2:
            raise GraphError(f"{'tril' if lower else 'triu'} needs at least 2 dimensions, got {self.shape}")
        rows, cols = self.shape[-2:]
        cls = type(self)
        r = cls.arange(rows, device=self.device).reshape(rows, 1)
        c = cls.arange(cols, device=self.device).reshape(1, cols)
        keep = (c - r <= diagonal) if lower else (c - r >= diagonal)
        return keep.where(self, self._const_like(0))

    def tril(self, diagonal: int = 0) -> Self:
        """The lower triangle of the last two axes (element [i, j] kept where j - i <= diagonal), else 0."""
        return self._triangle(diagonal, True)

    def triu(self, diagonal: int = 0) -> Self:
        """The upper triangle of the last two axes (element [i, j] kept where j - i >= diagonal), else 0."""
        return self._triangle(diagonal, False)


def _pairs(padding: Sequence, ndim: int) -> list[tuple[int, int]]:
    """`padding` as one (before, after) pair per axis: from PyTorch's flat (left, right, top, bottom, ...),
    which starts at the last axis, or from one pair (or None) per axis."""
    if all(isinstance(p, int) for p in padding):
        if len(padding) % 2:
            raise GraphError(f"flat padding needs pairs, got {tuple(padding)}")
        if len(padding) > 2 * ndim:
            raise GraphError(f"flat padding {tuple(padding)} has {len(padding) // 2} pairs for a tensor with {ndim} "
                             f"dimensions; give at most one (left, right) pair per dimension, the last first")
        pairs = [(0, 0)] * ndim
        for i in range(len(padding) // 2):
            pairs[ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
        return pairs
    pairs = [(0, 0) if p is None else (p[0], p[1]) for p in padding]
    if len(pairs) != ndim:
        raise GraphError(f"pad: {len(pairs)} pairs for a tensor with {ndim} dimensions")
    return pairs


def _edge(x: AnyTensor, d: int, mode: str, width: int, start: bool) -> AnyTensor:
    """The `width` elements padded on one side of axis `d`."""
    n = x.shape[d]
    bounds: list[Any] = [None] * x.ndim
    if mode == "replicate":
        bounds[d] = (0, 1) if start else (n - 1, n)
        shape = list(x.shape)
        shape[d] = width
        return x.shrink(bounds).expand(*shape)
    if mode == "reflect":
        bounds[d] = (1, width + 1) if start else (n - 1 - width, n - 1)
        return x.shrink(bounds).flip(d)
    bounds[d] = (n - width, n) if start else (0, width)  # circular
    return x.shrink(bounds)
