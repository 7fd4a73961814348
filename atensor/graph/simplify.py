"""Simplification rules: constant folding, algebraic identities and view folding.

Each rule is one line of the table; `simplify(roots)` applies them all to a fixed point.
"""
from __future__ import annotations

from typing import Any, Optional

from atensor.dtype import dtypes
from atensor.graph.node import NegativeZero, Node
from atensor.graph.ops import BINARY, ELEMENTWISE, Ops, UNARY
from atensor.graph.rewrite import Pat, PatternMatcher, graph_rewrite
from atensor.graph.semantics import fold_constant

_NOT_FOLDED = frozenset({Ops.THREEFRY, Ops.BITCAST})


def const_value(node: Node) -> Optional[Any]:
    """The scalar value of a constant node or a broadcast view of one; None for anything else."""
    if node.op is Ops.CONST:
        return node.arg[0]
    if node.op is Ops.VIEW and node.src[0].op is Ops.CONST and node.arg.mask is None:
        return node.src[0].arg[0]
    return None


def _is_const(value: Any):
    return lambda n: (v := const_value(n)) is not None and v == value and not isinstance(v, bool)


def _adds_nothing(n: Node) -> bool:
    """A constant whose addition leaves every value as it is: 0 for integers, but -0.0 for floats
    (0.0 turns -0.0 into 0.0, and the float 0.0 constant is a different value from -0.0, graph/node.py)."""
    v = const_value(n)
    if v is None or isinstance(v, bool) or v != 0:
        return type(v) is NegativeZero
    return not dtypes.is_float(n.dtype)


def _all_const(n: Node) -> bool:
    return n.op not in _NOT_FOLDED and all(const_value(s) is not None for s in n.src)


def _fold(x: Node) -> Node:
    value = fold_constant(x.op, x.dtype, [s.dtype for s in x.src], [const_value(s) for s in x.src])
    return Node.const(value, x.dtype, x.device, x.shape)


def _same_dtype(n: Node) -> bool:
    return all(s.dtype == n.dtype for s in n.src)


def _view_of_view(v: Node) -> Optional[Node]:
    inner = v.src[0]
    merged = inner.arg.compose(v.arg)
    return None if merged is None else inner.src[0].view(merged)


def _const_view(v: Node) -> Optional[Node]:
    value = const_value(v.src[0])
    if v.src[0].op is Ops.CONST or value is None or v.arg.mask is not None:
        return None
    return Node.const(value, v.dtype, v.device, v.shape)


def _may_simplify(n: Node) -> bool:
    """An elementwise node can only match a rule below with a constant, view or same-op operand."""
    if n.op not in ELEMENTWISE:
        return True
    for s in n.src:
        if s.op is Ops.CONST or s.op is Ops.VIEW or s.op is n.op:
            return True
    return n.op is Ops.VIEW or n.op is Ops.CAST or n.op is Ops.DETACH


x = Pat(name="x")
SIMPLIFY = PatternMatcher([
    # constant folding
    (Pat(UNARY | BINARY | {Ops.WHERE}, name="x", where=_all_const), _fold),
    # identities (only where the result keeps the operand's dtype, so no implicit cast is lost)
    (Pat(Ops.ADD, (x, Pat(where=_adds_nothing)), commutative=True, name="n", where=_same_dtype), lambda x, n: x),
    (Pat(Ops.SUB, (x, Pat(where=_is_const(0))), name="n", where=_same_dtype), lambda x, n: x),
    (Pat(Ops.MUL, (x, Pat(where=_is_const(1))), commutative=True, name="n", where=_same_dtype), lambda x, n: x),
    (Pat(Ops.FDIV, (x, Pat(where=_is_const(1))), name="n", where=_same_dtype), lambda x, n: x),
    (Pat(Ops.NEG, (Pat(Ops.NEG, (x,)),)), lambda x: x),
    (Pat(Ops.NOT, (Pat(Ops.NOT, (x,)),), where=lambda n: n.dtype == dtypes.bool), lambda x: x),
    (Pat(Ops.CAST, (x,), name="c", where=lambda c: c.dtype == c.src[0].dtype), lambda x, c: x),
    # DETACH only stops gradients; the value is its source's
    (Pat(Ops.DETACH, (x,)), lambda x: x),
    # views of views fold into one view; a view of a constant is a constant of the new shape
    (Pat(Ops.VIEW, (Pat(Ops.VIEW),), name="v"), _view_of_view),
    (Pat(Ops.VIEW, name="v"), _const_view),
], prefilter=_may_simplify)


def simplify(roots: list[Node]) -> dict[Node, Node]:
    """Applies the simplification rules below `roots`; returns old -> simplified."""
    return graph_rewrite(roots, SIMPLIFY)
