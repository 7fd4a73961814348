"""What a movement op or a view gives on a node, decided once per layout: `MovePlan`.

Why: a movement op (reshape, permute, expand, pad, shrink, stride, flip) or `Node.view` on a node is a
pure function of the node's layout (its own View when it is a VIEW node, its shape, its base's shape)
and of the op's argument. Worked out per call, it was the costliest part of building a node: the
argument's checks, a new View (a frozen dataclass), the folding into the node's own view, the identity
tests, and the new VIEW node's bounds check (`_infer`: the view must not read past its source), about
25-55 us of the 2-core machine's CPU per op (bench/node_build.py), where an elementwise op costs 5-8.
A model builds the same few layouts on every step (a training step's transposes and reshapes, the
backward's undoing of them), so the outcome is kept per layout in a bounded cache; a hit costs one
dictionary lookup, and the node is then made with its shape known (`Node.make_view`), skipping
`_infer`. An argument that is invalid raises each time (exceptions are not cached), with the same
errors as before.

Invariant: a plan holds only Views and shapes, never a Node, so the cache keeps no graph alive.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional

from atensor.graph.symbolic import SymbolicError, hi_of
from atensor.graph.view import Shape, View, contiguous_view, max_size, reshape_segments, symbolic_shape

# what a plan says the result is
SELF = 0     # the node itself (the op changes nothing)
BASE = 1     # the VIEW node's source (the views cancel out)
ON_BASE = 2  # a VIEW of the VIEW node's source through `view` (folded into one view)
ON_SELF = 3  # a VIEW of the node itself through `view`


@dataclass(frozen=True, slots=True)
class MovePlan:
    """The outcome of a movement op or view on a node of some layout: `kind` (SELF, BASE, ON_BASE,
    ON_SELF) and, for the last two, the View of the new VIEW node, already checked to read inside its
    source."""
    kind: int
    view: Optional[View] = None


_SAME, _TO_BASE = MovePlan(SELF), MovePlan(BASE)


class MoveError(ValueError):
    """An invalid movement argument; `Node` raises it as its GraphError (this module sits under node.py)."""


def _size(shape: Shape) -> int:
    return math.prod(shape) if not symbolic_shape(shape) else max_size(shape)


def check_move(shape: Shape, name: str, arg: Any) -> bool:
    """Raises MoveError (or SymbolicError) for an argument that does not fit `shape`; True when the op
    changes nothing."""
    if name == "reshape":
        if symbolic_shape(arg) or symbolic_shape(shape):
            reshape_segments(shape, arg)  # raises SymbolicError for what it cannot say
        elif math.prod(arg) != _size(shape):
            raise MoveError(f"reshape: cannot reshape {shape} ({_size(shape)} elements) to {arg}")
        return arg == shape
    if name == "permute":
        if sorted(arg) != list(range(len(shape))):
            raise MoveError(f"permute: {arg} is not a permutation of the axes of shape {shape}")
        return arg == tuple(range(len(arg)))
    if name == "expand":
        if len(arg) != len(shape) or any(s != n and s != 1 for s, n in zip(shape, arg)):
            raise MoveError(f"expand: cannot expand shape {shape} to {arg} (only axes of size 1 expand)")
        return arg == shape
    if name == "pad":
        if len(arg) != len(shape) or any(b < 0 or a < 0 for b, a in arg):
            raise MoveError(f"pad: padding {arg} does not fit shape {shape} (one non-negative pair per axis)")
        return all(b == 0 and a == 0 for b, a in arg)
    if name == "shrink":
        try:
            fits = len(arg) == len(shape) and all(0 <= b <= e <= s for (b, e), s in zip(arg, shape))
        except SymbolicError:
            raise SymbolicError(f"shrink: bounds {arg} fit shape {shape} for some values of their "
                                f"variables only; give each Variable bounds (min, max) under which every "
                                f"bound stays inside its axis") from None
        if not fits:
            raise MoveError(f"shrink: bounds {arg} do not fit shape {shape}")
        return all(b == 0 and e == s for (b, e), s in zip(arg, shape))
    if name == "stride":
        if len(arg) != len(shape) or any(k < 1 for k in arg):
            raise MoveError(f"stride: steps {arg} do not fit shape {shape} (one step >= 1 per axis)")
        return all(k == 1 for k in arg)
    if name == "flip":
        return not any(arg)
    raise MoveError(f"no movement op {name!r}")


def _on(view: View, source_shape: Shape, kind: int) -> MovePlan:
    """A plan making a VIEW node through `view` of a source of `source_shape`, after `_infer`'s check."""
    if view.mask is None and view.size and _size(source_shape) < hi_of(view.index_range()[1]) + 1:
        raise MoveError(f"view {view} reads past the end of its source of shape {source_shape}")
    return MovePlan(kind, view)


def _view_plan(own: Optional[View], shape: Shape, base_shape: Optional[Shape], view: View) -> MovePlan:
    """`Node.view`'s rule: the node (its own View `own` when it is a VIEW node of a base of `base_shape`,
    else None; its shape `shape`) seen through `view`; folds into the node's own view when one View can
    say both."""
    if view.shape == shape and view is contiguous_view(shape):  # the identity: the common case
        return _SAME
    if own is not None:
        merged = own.compose(view)
        if merged is not None:
            if merged.is_identity(_size(base_shape)) and merged.shape == base_shape:
                return _TO_BASE
            return _on(merged, base_shape, ON_BASE)
    if view.is_identity(_size(shape)) and view.shape == shape:
        return _SAME
    return _on(view, shape, ON_SELF)


@functools.lru_cache(maxsize=8192)
def view_plan(own: Optional[View], shape: Shape, base_shape: Optional[Shape], view: View) -> MovePlan:
    """`_view_plan`, kept per layout."""
    return _view_plan(own, shape, base_shape, view)


@functools.lru_cache(maxsize=8192)
def move_plan(own: Optional[View], shape: Shape, base_shape: Optional[Shape], name: str, arg: Any) -> MovePlan:
    """The movement op `name` with `arg` (a tuple) on a node of that layout (see `_view_plan`), kept per
    layout; raises MoveError or SymbolicError for an argument that does not fit."""
    if check_move(shape, name, arg):
        return _SAME
    if own is not None:
        moved = getattr(own, name)(arg)
        if moved is not None:
            if moved.is_identity(_size(base_shape)) and moved.shape == base_shape:
                return _TO_BASE
            return _on(moved, base_shape, ON_BASE)
    return _view_plan(own, shape, base_shape, getattr(View.create(shape), name)(arg))


__all__ = ["BASE", "MoveError", "MovePlan", "ON_BASE", "ON_SELF", "SELF", "check_move", "move_plan", "view_plan"]
