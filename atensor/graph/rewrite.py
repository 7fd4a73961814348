"""A pattern rewriter: rules are (pattern, function) pairs, applied bottom-up until nothing changes.

One mechanism carries simplification, lowering and (later) gradient and multi-device rules: adding a
capability is adding rules. A `Pat` matches a node by op, dtype, argument predicate and source
patterns, binding names; the rule's function gets the bindings as keyword arguments and returns a
replacement node or None (no change). Rules for a node are looked up by its op, so a table of
hundreds of rules costs a dict lookup per node.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from atensor.graph import symbolic
from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.view import View, symbolic_shape


@dataclass(frozen=True)
class Pat:
    """Matches a node. `op` is an Ops or a set of them (None: any); `src` a tuple of Pats matched in
    order (or in any order with `commutative=True`); `name` binds the node; `where` filters."""
    op: Ops | frozenset[Ops] | None = None
    src: Optional[tuple[Pat, ...]] = None
    name: Optional[str] = None
    where: Optional[Callable[[Node], bool]] = None
    commutative: bool = False

    def ops(self) -> Optional[frozenset[Ops]]:
        if self.op is None:
            return None
        return self.op if isinstance(self.op, frozenset) else frozenset({self.op})

    def match(self, node: Node, bound: dict[str, Node]) -> bool:
        ops = self.ops()
        if ops is not None and node.op not in ops:
            return False
        if self.where is not None and not self.where(node):
            return False
        if self.name is not None:
            if self.name in bound and bound[self.name] is not node:
                return False
            bound[self.name] = node
        if self.src is None:
            return True
        if len(self.src) != len(node.src):
            return False
        orders = itertools.permutations(node.src) if self.commutative else (node.src,)
        for srcs in orders:
            trial = dict(bound)
            if all(p.match(s, trial) for p, s in zip(self.src, srcs)):
                bound.update(trial)
                return True
        return False


Rule = tuple[Pat, Callable[..., Optional[Node]]]


class PatternMatcher:
    """A table of rules indexed by the op of their top pattern."""

    def __init__(self, rules: Iterable[Rule], prefilter: Optional[Callable[[Node], bool]] = None):
        self.rules = list(rules)
        self.prefilter = prefilter  # a cheap test: False means no rule can match this node
        self.by_op: dict[Ops, list[Rule]] = {}
        self.any_op: list[Rule] = []
        for pat, fn in self.rules:
            ops = pat.ops()
            if ops is None:
                self.any_op.append((pat, fn))
            else:
                for op in ops:
                    self.by_op.setdefault(op, []).append((pat, fn))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, node: Node) -> Optional[Node]:
        """The first rule's replacement for `node`, or None when no rule applies."""
        if self.prefilter is not None and not self.prefilter(node):
            return None
        for pat, fn in itertools.chain(self.by_op.get(node.op, ()), self.any_op):
            bound: dict[str, Node] = {}
            if pat.match(node, bound):
                out = fn(**bound)
                if out is not None and out is not node:
                    return out
        return None


def graph_rewrite(roots: list[Node], matcher: PatternMatcher, max_passes: int = 1000) -> dict[Node, Node]:
    """Rewrites every node reachable from `roots` bottom-up to a fixed point; returns old -> new."""
    done: dict[Node, Node] = {}
    for node in toposort(roots):
        done[node] = _rewrite_one(node, done, matcher, max_passes)
    return done


def _rewrite_one(node: Node, done: dict[Node, Node], matcher: PatternMatcher, max_passes: int) -> Node:
    current = node
    if node.src:
        new_src = tuple(done.get(s, s) for s in node.src)
        if any(a is not b for a, b in zip(new_src, node.src)):
            current = _rebuild(node, new_src)
    for _ in range(max_passes):
        replacement = matcher.rewrite(current)
        if replacement is None:
            return current
        # a replacement may contain new nodes that need rewriting too
        if replacement.src and any(s not in done for s in replacement.src):
            sub = graph_rewrite([replacement], matcher, max_passes)
            replacement = sub[replacement]
            done.update(sub)
        current = replacement
    raise RecursionError(f"rewrite rules did not reach a fixed point on {node}")


def _rebuild(node: Node, src: tuple[Node, ...]) -> Node:
    if node.op is Ops.VIEW:
        return src[0].view(node.arg)
    return Node.make(node.op, node.dtype, src, node.arg)


def substitute(roots: list[Node], mapping: dict[Node, Node]) -> dict[Node, Node]:
    """Replaces nodes by `mapping` wherever they occur below `roots`; returns old -> new."""
    done: dict[Node, Node] = {}
    for node in toposort(roots, stop=lambda n: n in mapping):
        if node in mapping:
            done[node] = mapping[node]
        elif node.src:
            new_src = tuple(done.get(s, s) for s in node.src)
            done[node] = node if all(a is b for a, b in zip(new_src, node.src)) else _rebuild(node, new_src)
        else:
            done[node] = node
    return done


def any_match(roots: list[Node], predicate: Callable[[Node], bool]) -> Any:
    """The first node below `roots` for which `predicate` holds, or None."""
    return next((n for n in toposort(roots) if predicate(n)), None)


def unbind_ast(ast):
    """A kernel AST (a graph `Node`) with every view over unbound variables, and the values they were
    bound to: the AST then keys the compile cache by structure, not by value. Cheap when no variable
    was ever bound (the common case)."""
    if not symbolic.any_bound:  # read here: the flag changes once a variable is bound
        return ast, {}
    values: dict[symbolic.Variable, int] = {}
    done: dict = {}
    for node in toposort([ast]):
        src = tuple(done[s] for s in node.src)
        arg = node.arg.unbind(values) if node.op is Ops.VIEW or node.op is Ops.ASSIGN else node.arg
        same = arg is node.arg and all(a is b for a, b in zip(src, node.src))
        done[node] = node if same else Node.make(node.op, node.dtype, src, arg)
    return done[ast], values


def has_symbolic_shape(ast: Node) -> bool:
    """True when some view in `ast` has a dim that depends on a variable (graph/view.py)."""
    return any((n.op is Ops.VIEW or n.op is Ops.ASSIGN) and symbolic_shape(n.arg.shape) for n in toposort([ast]))


def bind_ast(ast: Node, values) -> Node:
    """The concrete kernel AST for the variables' `values` (keyed by unbound variable): every view's
    shape, offset and mask evaluated. For backends that cannot loop to a bound read at run time (numpy:
    one rendered function per value, cached by the concrete AST)."""
    done: dict = {}
    for node in toposort([ast]):
        src = tuple(done[s] for s in node.src)
        arg = node.arg.evaluate(values) if node.op is Ops.VIEW or node.op is Ops.ASSIGN else node.arg
        if node.op is Ops.VIEW and node.src[0].op not in (Ops.PARAM, Ops.CONST, Ops.ARANGE) and \
                symbolic_shape(node.src[0].shape):
            # the view's strides address its computed source laid out at the maximum (graph/view.py):
            # pad the concrete source out to that layout
            inner = src[0]
            pads = tuple((0, symbolic.hi_of(m) - c) for m, c in zip(node.src[0].shape, inner.shape))
            src = (Node.make(Ops.VIEW, inner.dtype, (inner,), View.create(inner.shape).pad(pads)),)
        same = arg is node.arg and all(a is b for a, b in zip(src, node.src))
        done[node] = node if same else Node.make(node.op, node.dtype, src, arg)
    return done[ast]
