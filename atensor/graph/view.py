"""Views: how a shape maps onto a flat buffer, without copying.

A `View` is (shape, strides, offset, mask) in elements: element `idx` of the view reads the source at
`offset + sum(idx[i] * strides[i])` when `mask[i][0] <= idx[i] < mask[i][1]` for every axis, and is 0
elsewhere (that is how `pad` is expressed). reshape, permute, expand, pad, shrink and flip each give a
new View of the same source, or None when one View cannot express the result (a reshape that splits a
permuted or padded axis); the graph then stacks a second view on top, and a backend materializes the
first one.

Offsets, mask bounds and shape dims may be symbolic (`graph/symbolic.py`: linear in bound Variables, e.g.
a shrink at `start_pos`, or a KV cache read `[:, :start_pos+1]`); strides are always ints. A dim of
symbolic size is laid out at its largest value: `strides_for` and `size` use each dim's maximum, so a
buffer of shape (4, n) with n in [1, 16] holds 4*16 elements and row i starts at 16*i whatever n is.
That keeps every index linear (no stride is a product with a variable) and one buffer serves every
value. A reshape that would need a stride depending on a variable (splitting or merging a symbolic dim
with another dim that is not 1) raises SymbolicError. Integers stay plain ints on every path.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping, Optional

from atensor.graph.symbolic import Expr, SymbolicError, Variable, as_sym, evaluate, hi_of, is_symbolic, rebind, \
    unbind, variables_of

Shape = tuple[int, ...]  # each dim an int or, for a symbolic-length view, a linear Expr (see above)


def strides_for(shape: Shape) -> tuple[int, ...]:
    """Row-major strides in elements, 0 for axes of size 1 (they never move the index); a symbolic dim
    counts at its maximum (the layout of a buffer of symbolic shape)."""
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc if size != 1 else 0)
        acc *= size if type(size) is int else hi_of(size)
    return tuple(reversed(strides))


def max_size(shape: Shape) -> int:
    """Elements of `shape` with each symbolic dim at its maximum: the size of a buffer of that shape."""
    n = 1
    for s in shape:
        n *= s if type(s) is int else hi_of(s)
    return n


def symbolic_shape(shape: Shape) -> bool:
    """True when some dim of `shape` depends on a variable."""
    return any(type(s) is not int for s in shape)


# `strides_for` of a view's shape (a tuple of ints): asked for on every identity test of a view
_cached_strides = functools.lru_cache(maxsize=4096)(strides_for)


@dataclass(frozen=True)
class View:
    """A strided, optionally masked window onto a flat source. Immutable and hashable."""
    shape: Shape
    strides: tuple[int, ...]
    offset: Expr = 0
    mask: Optional[tuple[tuple[Expr, Expr], ...]] = None

    def __hash__(self) -> int:
        # views key the node table on every graph op; hash the fields once per view
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.shape, self.strides, self.offset, self.mask))
            object.__setattr__(self, "_hash", cached)
        return cached

    @staticmethod
    def create(shape: Shape) -> View:
        """The contiguous view of `shape` (one object per shape: views are immutable, and a reused
        one has its hash already)."""
        return _contiguous(tuple(shape))

    @property
    def size(self) -> int:
        """Elements, a symbolic dim counted at its maximum."""
        return math.prod(self.shape) if not symbolic_shape(self.shape) else max_size(self.shape)

    @property
    def contiguous(self) -> bool:
        """True when the view is the source itself read in order (possibly shifted by `offset`)."""
        return self.mask is None and self.strides == _cached_strides(self.shape)

    def is_identity(self, source_size: int) -> bool:
        return self.contiguous and self.offset == 0 and self.size == source_size

    def index_range(self) -> tuple[Expr, Expr]:
        """Smallest and largest source index read by a valid element; (0, -1) when none is valid.
        Symbolic when the offset or mask is: then it holds for every value that leaves an element
        valid."""
        bounds = self.mask or tuple((0, s) for s in self.shape)
        if any(_definitely_empty(lo, hi) for lo, hi in bounds):
            return 0, -1
        lo = hi = self.offset
        for (b, e), st in zip(bounds, self.strides):
            if st >= 0:
                lo, hi = lo + st * b, hi + st * (e - 1)
            else:
                lo, hi = lo + st * (e - 1), hi + st * b
        return lo, hi

    # ---- symbolic offsets ----------------------------------------------------------------------
    def variables(self) -> tuple[Variable, ...]:
        """The variables in the offset and mask (empty for a concrete view: the common case)."""
        if type(self.offset) is int and (self.mask is None or
                                         all(type(b) is int and type(e) is int for b, e in self.mask)) \
                and not symbolic_shape(self.shape):
            return ()
        found = list(variables_of(self.offset))
        for s in self.shape:
            found += variables_of(s)
        for b, e in self.mask or ():
            found += variables_of(b) + variables_of(e)
        return tuple(dict.fromkeys(found))

    def evaluate(self, values: Optional[Mapping[Variable, int]] = None) -> View:
        """The concrete view for the variables' `values` (keyed by unbound variable) or, without them,
        for the values the variables are bound to."""
        if not self.variables():
            return self
        mask = None if self.mask is None else \
            tuple((evaluate(b, values), evaluate(e, values)) for b, e in self.mask)
        shape = tuple(evaluate(s, values) for s in self.shape)
        return View(shape, self.strides, evaluate(self.offset, values), mask)

    def unbind(self, into: dict[Variable, int]) -> View:
        """This view over unbound variables; their values are added to `into`."""
        if not self.variables():
            return self
        mask = None if self.mask is None else tuple((unbind(b, into), unbind(e, into)) for b, e in self.mask)
        shape = tuple(unbind(s, into) for s in self.shape)
        return View(shape, self.strides, unbind(self.offset, into), mask)

    def rebind(self, values: Mapping[Variable, int]) -> View:
        """This view with its bound variables bound to `values` instead (keyed by unbound variable)."""
        if not self.variables():
            return self
        mask = None if self.mask is None else tuple((rebind(b, values), rebind(e, values)) for b, e in self.mask)
        return View(tuple(rebind(s, values) for s in self.shape), self.strides, rebind(self.offset, values), mask)

    # ---- movement ops --------------------------------------------------------------------------
    def permute(self, order: tuple[int, ...]) -> View:
        mask = tuple(self.mask[i] for i in order) if self.mask else None
        return View(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset, mask)

    def expand(self, shape: Shape) -> View:
        strides = tuple(0 if old != new else st for old, new, st in zip(self.shape, shape, self.strides))
        mask = None
        if self.mask:
            # a broadcast axis of an empty mask (a pad of nothing, flipped: (1, 1)) stays empty
            mask = tuple(m if old == new else ((0, 0) if _definitely_empty(*m) else (0, new))
                         for m, old, new in zip(self.mask, self.shape, shape))
        return View(tuple(shape), strides, self.offset, mask)

    def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
        offset = self.offset + sum(b * st for (b, _), st in zip(arg, self.strides))
        shape = _int_shape(tuple(e - b for b, e in arg), "shrink")
        mask = None
        if self.mask:
            mask = tuple((min(max(mb, b), e) - b, max(min(me, e), b) - b) for (mb, me), (b, e) in zip(self.mask, arg))
        return View(shape, self.strides, offset, _simplify_mask(mask, shape))

    def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
        if all(b == 0 and a == 0 for b, a in arg):
            return self
        shape = _int_shape(tuple(s + b + a for s, (b, a) in zip(self.shape, arg)), "pad")
        offset = self.offset - sum(b * st for (b, _), st in zip(arg, self.strides))
        old = self.mask or tuple((0, s) for s in self.shape)
        mask = tuple((mb + b, me + b) for (mb, me), (b, _) in zip(old, arg))
        return View(shape, self.strides, offset, _simplify_mask(mask, shape))

    def flip(self, axes: tuple[bool, ...]) -> View:
        offset = self.offset + sum((s - 1) * st for s, st, f in zip(self.shape, self.strides, axes) if f and s > 0)
        strides = tuple(-st if f else st for st, f in zip(self.strides, axes))
        mask = None
        if self.mask:
            mask = tuple((s - e, s - b) if f else (b, e) for (b, e), s, f in zip(self.mask, self.shape, axes))
        return View(self.shape, strides, offset, _simplify_mask(mask, self.shape))

    def stride(self, steps: tuple[int, ...]) -> View:
        """Every `steps[i]`-th element along axis i (steps >= 1), starting with the first."""
        shape = tuple((s + k - 1) // k for s, k in zip(self.shape, steps))
        strides = tuple(st * k for st, k in zip(self.strides, steps))
        mask = None
        if self.mask:
            mask = tuple(((b + k - 1) // k, (e + k - 1) // k) for (b, e), k in zip(self.mask, steps))
        return View(shape, strides, self.offset, _simplify_mask(mask, shape))

    def reshape(self, shape: Shape) -> Optional[View]:
        """The same elements in a new shape, or None when one View cannot say it."""
        shape = tuple(shape)
        if shape == self.shape:
            return self
        if symbolic_shape(shape) or symbolic_shape(self.shape):
            return self._reshape_symbolic(shape)
        if math.prod(shape) == 0:
            return View.create(shape)
        if self.contiguous:
            return View(shape, strides_for(shape), self.offset, None)
        if self.mask is not None:
            if any(b != 0 or e != s for (b, e), s in zip(self.mask, self.shape)):
                return self._reshape_masked(shape)
        strides = _nocopy_reshape_strides(self.shape, self.strides, shape)
        return None if strides is None else View(shape, strides, self.offset, None)

    def _reshape_symbolic(self, shape: Shape) -> Optional[View]:
        """Reshapes the int runs between symbolic dims one by one (`reshape_segments`); None when one
        of them cannot be said by one View."""
        segments = reshape_segments(self.shape, shape)
        if not segments:  # a flat buffer at the symbolic shape it holds
            return View(shape, strides_for(shape), self.offset, None) if self.contiguous else None
        new_strides: list[int] = [0] * len(shape)
        new_mask: list = [(0, s) for s in shape]
        for old_axes, new_axes in segments:
            if len(old_axes) == 1 and len(new_axes) == 1 and type(self.shape[old_axes[0]]) is not int:
                new_strides[new_axes[0]] = self.strides[old_axes[0]]
                if self.mask is not None:
                    new_mask[new_axes[0]] = self.mask[old_axes[0]]
                continue
            sub = View(tuple(self.shape[i] for i in old_axes), tuple(self.strides[i] for i in old_axes), 0,
                       None if self.mask is None else tuple(self.mask[i] for i in old_axes))
            if sub.mask is not None and all(b == 0 and e == s for (b, e), s in zip(sub.mask, sub.shape)):
                sub = View(sub.shape, sub.strides, 0, None)
            moved = sub.reshape(tuple(shape[i] for i in new_axes))
            if moved is None or (moved.offset != 0):
                return None
            for j, i in enumerate(new_axes):
                new_strides[i] = moved.strides[j]
                if moved.mask is not None:
                    new_mask[i] = moved.mask[j]
        return View(shape, tuple(new_strides), self.offset, _simplify_mask(tuple(new_mask), shape))

    def _reshape_masked(self, shape: Shape) -> Optional[View]:
        """Masked reshapes that only add or remove axes of size 1 keep their mask.

        Invariant: a view whose every element is masked stays all-masked. Rank 0 has no axis to
        carry an empty range (mask `()` means "valid"), so an all-masked view reshaped to `()`
        gives None and the graph keeps the masked view under a second one."""
        if any(_definitely_empty(b, e) for b, e in self.mask):
            return None if not shape else View(shape, strides_for(shape), 0, tuple((0, 0) for _ in shape))
        old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask) if s != 1]
        if [s for s in shape if s != 1] != [s for s, _, _ in old]:
            return None
        it = iter(old)
        strides, mask = [], []
        for s in shape:
            if s == 1:
                strides.append(0)
                mask.append((0, 1))
            else:
                _, st, m = next(it)
                strides.append(st)
                mask.append(m)
        return View(shape, tuple(strides), self.offset, tuple(mask))

    def compose(self, after: View) -> Optional[View]:
        """The single View equal to applying `after` to this view's output, or None."""
        if self.contiguous:
            return View(after.shape, after.strides, after.offset + self.offset, after.mask)
        if after.contiguous and after.offset == 0 and after.size == self.size:
            return self.reshape(after.shape)
        return None


def _int_shape(shape: tuple, op: str) -> Shape:
    """`shape` with each dim an int or a linear Expr that is never negative over its variables' bounds."""
    if any(type(s) is not int for s in shape):
        for s in shape:
            if is_symbolic(s):
                if as_sym(s).min < 0:
                    raise SymbolicError(f"{op}: dim {s} of the resulting shape {shape} is negative for some values "
                                        f"of its variables; narrow the Variable's bounds")
        shape = tuple(s if type(s) is int or is_symbolic(s) else int(s) for s in shape)
    return shape


def reshape_segments(old: Shape, new: Shape) -> list[tuple[list[int], list[int]]]:
    """How a reshape of a shape with symbolic dims pairs axes: each symbolic dim of `old` must be a dim
    of `new`, in the same order, and the int dims between them must hold the same number of elements;
    returns the int runs as (old axes, new axes) pairs, the symbolic dims as one-axis pairs. Raises
    SymbolicError otherwise (merging or splitting a symbolic dim would need a stride that depends on a
    variable: expressions stay linear)."""
    def runs(shape):
        out, cur = [], []
        for i, s in enumerate(shape):
            if type(s) is int:
                cur.append(i)
            else:
                out.append(cur)
                out.append([i])
                cur = []
        out.append(cur)
        return out
    if len(old) == 1 and type(old[0]) is int and old[0] == max_size(new):
        return []  # a flat buffer seen at the symbolic shape it holds (laid out at the maximum)
    a, b = runs(old), runs(new)
    ok = len(a) == len(b)
    if ok:
        for ra, rb in zip(a, b):
            sym_a = len(ra) == 1 and type(old[ra[0]]) is not int
            sym_b = len(rb) == 1 and type(new[rb[0]]) is not int
            if sym_a != sym_b or (sym_a and old[ra[0]] != new[rb[0]]) or \
                    (not sym_a and math.prod(old[i] for i in ra) != math.prod(new[i] for i in rb)):
                ok = False
                break
    if not ok:
        raise SymbolicError(f"reshape: cannot reshape {tuple(old)} to {tuple(new)}: each symbolic dim must stay "
                            f"a dim of its own, in order, with the same number of elements between them "
                            f"(a stride that depends on a variable is not linear); reshape the int dims only")
    return list(zip(a, b))


def _definitely_empty(b: Expr, e: Expr) -> bool:
    """True when the range [b, e) is empty for every value of its variables."""
    if type(b) is int and type(e) is int:
        return b >= e
    try:
        return b >= e
    except SymbolicError:
        return False


def _simplify_mask(mask, shape):
    if mask is None:
        return None
    if any(_definitely_empty(b, e) for b, e in mask):
        return tuple((0, 0) for _ in shape)
    if all(b == 0 and e == s for (b, e), s in zip(mask, shape)):
        return None
    return tuple(mask)


def _nocopy_reshape_strides(old_shape: Shape, old_strides: tuple[int, ...], new_shape: Shape):
    """numpy's no-copy reshape: strides for `new_shape` over the same memory, or None."""
    old = [(s, st) for s, st in zip(old_shape, old_strides) if s != 1]
    new_dims = list(new_shape)
    new_strides = [0] * len(new_dims)
    oi = ni = 0
    old_dims = [s for s, _ in old]
    old_st = [st for _, st in old]
    nonone = [i for i, s in enumerate(new_dims) if s != 1]
    new_core = [new_dims[i] for i in nonone]
    core_strides = [0] * len(new_core)
    oj, nj = 1, 1
    while ni < len(new_core) and oi < len(old_dims):
        np_, op = new_core[ni], old_dims[oi]
        while np_ != op:
            if np_ < op:
                np_ *= new_core[nj]
                nj += 1
            else:
                op *= old_dims[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if old_st[ok] != old_dims[ok + 1] * old_st[ok + 1]:
                return None
        core_strides[nj - 1] = old_st[oj - 1]
        for nk in range(nj - 1, ni, -1):
            core_strides[nk - 1] = core_strides[nk] * new_core[nk]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    for i, st in zip(nonone, core_strides):
        new_strides[i] = st
    return tuple(new_strides)


@functools.lru_cache(maxsize=4096)
def _contiguous(shape: Shape) -> View:
    return View(shape, strides_for(shape), 0, None)


# the contiguous View of a tuple shape, the one object `View.create` gives for it (what `Node.view` compares a
# view with, by identity, to see the identity view without its general test)
contiguous_view = _contiguous
