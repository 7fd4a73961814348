"""Kernel expressions at one symbolic element, as z3 terms: what the bounds checker reasons about when
an index or a guard is computed inside the kernel (a gather's index, the mask that guards it).

Why z3 terms of the exact integer semantics: an index computed as `idx * 4 + i % 4`, guarded by
`(idx >= 0) & (idx < n)`, is safe only because of how those integer ops behave, including their
wrap-around. So integers are bit-vectors of their dtype's width (numpy wraps, so does z3's bit-vector
arithmetic; IDIV floors and MOD takes the divisor's sign, as graph/semantics.py says), booleans are
z3 booleans, and element positions and view arithmetic are bit-vectors just wide enough that no
view's index computation can wrap (`position_width`: numpy computes them in 64-bit intp, which never
wraps for real buffers; solving at 20 bits instead of 64 makes the divisions of reshaped views ~10x
cheaper for z3).

What is *not* modelled is deliberately unconstrained: every float value (z3 reals are not IEEE
floats, so `x + 1 > x` must not be "proved"), every load of data (a function of the position it is
loaded from: the same element read twice is the same value), reductions, random bits. A float cast
to int or to bool is therefore an unconstrained value: a guard made only of it proves nothing, while
the same access guarded by `i < size` on the element position is proved safe.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from atensor.dtype import DType, dtypes
from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.symbolic import as_sym, hi_of, lo_of
from atensor.graph.view import View
from atensor.sched.prove import Symbols, z3mod


def position_width(nodes: Sequence[Node], sizes: Sequence[int] = ()) -> int:
    """Bits for element positions and view arithmetic below `nodes` such that nothing wraps: every
    shape, size, view offset and view index (over the view's shape) fits, with a sign bit to spare."""
    bound = max(sizes, default=1)
    for n in toposort(list(nodes)):
        bound = max(bound, n.size, *n.shape)
        if n.op is Ops.VIEW:
            v = n.arg
            reach = max(abs(lo_of(v.offset)), abs(hi_of(v.offset)))
            reach += sum(abs(st) * max(s - 1, 0) for st, s in zip(v.strides, v.shape))
            for b, e in v.mask or ():
                reach = max(reach, abs(lo_of(b)), abs(hi_of(b)), abs(lo_of(e)), abs(hi_of(e)))
            bound = max(bound, reach)
        elif n.op is Ops.ARANGE:
            bound = max(bound, abs(int(n.arg[0])) + abs(int(n.arg[1])) * n.arg[2])
    return min(64, max(8, bound.bit_length() + 2))


class Translator:
    """Builds z3 terms for nodes of one kernel at given element positions (64-bit bit-vectors)."""

    def __init__(self, symbols: Symbols, width: int = 64):
        self.sym = symbols
        self.width = width  # of positions and view arithmetic; see position_width
        self.z3 = z3mod()
        self._memo: dict[tuple, Any] = {}
        self._loads: dict[Node, Any] = {}

    # ---- positions and symbolic offsets ----------------------------------------------------------
    def positions(self, shape: Sequence[int], name: str = "i") -> tuple[list[Any], list[Any]]:
        """Fresh element coordinates for `shape` and the constraints 0 <= i_d < shape_d."""
        z3 = self.z3
        coords = [self.sym.fresh(f"{name}{d}", self.width) for d in range(len(shape))]
        return coords, [z3.And(z3.UGE(c, 0), z3.ULT(c, s)) for c, s in zip(coords, shape)]

    def offset(self, x: Any) -> Any:
        """An int or a linear symbolic expression as a 64-bit term (variables keep their bounds)."""
        z3 = self.z3
        if type(x) is int:
            return z3.BitVecVal(x, self.width)
        s = as_sym(x)
        total = z3.BitVecVal(s.const, self.width)
        for v, c in s.terms:
            total = total + c * self.sym.var(v, self.width)
        return total

    def view_index(self, view: View, coords: Sequence[Any]) -> tuple[Any, Optional[Any]]:
        """(flat source index, validity or None) of the element at `coords` of `view`."""
        z3 = self.z3
        flat = self.offset(view.offset)
        for c, st in zip(coords, view.strides):
            if st:
                flat = flat + st * c
        if view.mask is None:
            return flat, None
        valid = [z3.And(self.offset(b) <= c, c < self.offset(e)) for c, (b, e) in zip(coords, view.mask)]
        return flat, z3.And(*valid)

    # ---- values -----------------------------------------------------------------------------------
    def value(self, node: Node, coords: Sequence[Any]) -> Any:
        """The value of `node` at element `coords`, as a z3 term of the node's dtype's sort."""
        key = (node, tuple(c.get_id() for c in coords))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._value(node, list(coords))
        return found

    def _opaque(self, node: Node, coords: list[Any]) -> Any:
        """An unconstrained value of the node's sort, the same for the same node and position."""
        return self.sym.fresh(f"{node.op.name.lower()}_value", _sort(node.dtype))

    def _value(self, node: Node, coords: list[Any]) -> Any:
        z3, op = self.z3, node.op
        sort = _sort(node.dtype)
        if op is Ops.CONST:
            value = node.arg[0]
            if sort == "bool":
                return z3.BoolVal(bool(value))
            if sort == "real":
                return self._opaque(node, coords)
            return z3.BitVecVal(int(value), sort)
        if op is Ops.VIEW:
            src = node.src[0]
            flat, valid = self.view_index(node.arg, coords)
            inner = _unravel(flat, src.shape, self.width)
            loaded = self.value(src, inner)
            return loaded if valid is None else z3.If(valid, loaded, _zero(node.dtype))
        if op is Ops.PARAM:
            return self._load(node, coords[0])
        if op is Ops.ARANGE and sort not in ("real", "bool"):
            start, step = int(node.arg[0]), int(node.arg[1])
            return _fit(start + step * coords[0], self.width, sort, True)
        if op is Ops.CAST:
            return self._cast(node, coords)
        if op is Ops.WHERE:
            c, a, b = (self.value(s, coords) for s in node.src)
            return z3.If(c, a, b)
        if sort == "real" or any(_sort(s.dtype) == "real" for s in node.src):
            return self._opaque(node, coords)
        args = [self.value(s, coords) for s in node.src] if node.src else []
        result = _integer_op(z3, op, node.src[0].dtype if node.src else node.dtype, args)
        return result if result is not None else self._opaque(node, coords)

    def _load(self, param: Node, flat: Any) -> Any:
        """Data read from buffer parameter `param` at `flat`: a function of the position only."""
        z3 = self.z3
        fn = self._loads.get(param)
        if fn is None:
            sort = _sort(param.dtype)
            rng = z3.BoolSort() if sort == "bool" else z3.RealSort() if sort == "real" else \
                z3.BitVecSort(sort)
            name = str(self.sym.fresh(f"data{param.arg[0]}"))
            fn = self._loads[param] = z3.Function(name, z3.BitVecSort(self.width), rng)
        return fn(flat)

    def _cast(self, node: Node, coords: list[Any]) -> Any:
        z3 = self.z3
        src = node.src[0]
        to, frm = _sort(node.dtype), _sort(src.dtype)
        if frm == "real" or to == "real":
            return self._opaque(node, coords)  # float <-> int/bool: unconstrained
        x = self.value(src, coords)
        if to == "bool":
            return x if frm == "bool" else x != 0
        if frm == "bool":
            return z3.If(x, z3.BitVecVal(1, to), z3.BitVecVal(0, to))
        return _fit(x, frm, to, src.dtype.kind == "i")


def _sort(dtype: DType) -> Any:
    """"bool", "real" (floats: opaque), or the bit width of an integer dtype."""
    if dtype == dtypes.bool:
        return "bool"
    if dtype.kind == "f":
        return "real"
    return 8 * dtype.itemsize


def _zero(dtype: DType) -> Any:
    z3 = z3mod()
    sort = _sort(dtype)
    if sort == "bool":
        return z3.BoolVal(False)
    if sort == "real":
        return z3.RealVal(0)
    return z3.BitVecVal(0, sort)


def _fit(x: Any, frm: int, to: int, signed: bool) -> Any:
    """A bit-vector of width `frm` converted to width `to` (numpy's wrap on narrowing)."""
    z3 = z3mod()
    if to == frm:
        return x
    if to < frm:
        return z3.Extract(to - 1, 0, x)
    return (z3.SignExt if signed else z3.ZeroExt)(to - frm, x)


def _unravel(flat: Any, shape: Sequence[int], width: int) -> list[Any]:
    """Row-major coordinates in `shape` (no size 0) of the flat index `flat`, each in range."""
    z3 = z3mod()
    coords = []
    for d, size in enumerate(shape):
        inner = math.prod(shape[d + 1:])
        coord = z3.UDiv(flat, inner) if inner != 1 else flat
        coords.append(z3.URem(coord, size) if size != 1 else z3.BitVecVal(0, width))
    return coords


def _integer_op(z3: Any, op: Ops, dtype: DType, a: list[Any]) -> Optional[Any]:
    """Integer and boolean ops with numpy's semantics; None for what is left unconstrained."""
    boolean, unsigned = dtype == dtypes.bool, dtype.kind == "u"
    if op is Ops.NOT:
        return z3.Not(a[0]) if boolean else ~a[0]
    if op in (Ops.AND, Ops.OR, Ops.XOR):
        if boolean:
            return {Ops.AND: z3.And, Ops.OR: z3.Or, Ops.XOR: z3.Xor}[op](a[0], a[1])
        return {Ops.AND: lambda x, y: x & y, Ops.OR: lambda x, y: x | y, Ops.XOR: lambda x, y: x ^ y}[op](*a)
    if op is Ops.CMPEQ:
        return a[0] == a[1]
    if op is Ops.CMPNE:
        return a[0] != a[1]
    if boolean:
        return None
    if op is Ops.CMPLT:
        return z3.ULT(a[0], a[1]) if unsigned else a[0] < a[1]
    if op is Ops.ADD:
        return a[0] + a[1]
    if op is Ops.SUB:
        return a[0] - a[1]
    if op is Ops.MUL:
        return a[0] * a[1]
    if op is Ops.NEG:
        return -a[0]
    if op is Ops.MAX:
        bigger = z3.UGT(a[0], a[1]) if unsigned else a[0] > a[1]
        return z3.If(bigger, a[0], a[1])
    zero = z3.BitVecVal(0, a[0].size()) if op in (Ops.IDIV, Ops.MOD) else None
    if op is Ops.MOD:
        # z3py has no SMod function in every release; `%` on bit-vectors is the signed modulo (bvsmod)
        rem = z3.URem(a[0], a[1]) if unsigned else (a[0] % a[1])
        return z3.If(a[1] == 0, zero, rem)
    if op is Ops.IDIV:
        if unsigned:
            return z3.If(a[1] == 0, zero, z3.UDiv(a[0], a[1]))
        return z3.If(a[1] == 0, zero, (a[0] - (a[0] % a[1])) / a[1])  # floor division
    return None
