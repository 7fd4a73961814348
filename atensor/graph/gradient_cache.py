"""The backward graph's structure, kept per forward template, so that a repeated eager training step does
not build its backward rule by rule again.

Why: an eager step builds a new forward graph every time (its parameters are new versions of their
buffers, so every node above them is new), and `compute_gradient` then walks it and applies one rule per
node: the VIEW rules alone (graph/viewgrad.py, each a handful of movement plans) took ~300 us of the
flagship's ~900 us backward on the main thread (Zen 4, `bench/train_step.py`'s step without the jit).
But the backward's structure is a function of the forward's structure only: the rules read ops, dtypes,
args and shapes, and fold constants, never a buffer's contents. So the first time a structure is seen,
the nodes the backward made are recorded as (op, dtype, arg, shape, device, sources), each source a
position in the forward's topological order, a constant, or an earlier made node; a later forward of the
same structure gets its gradients by remaking those nodes on its own forward nodes (`Node.make_like`, no
rules, no shape inference), which gives the very nodes (interned) a fresh `compute_gradient` would.

The structure (`Template.key`) is the forward's nodes in topological order, each as its op, dtype, arg and
sources' positions, a BUFFER as its spec's first position, size, dtype and device (not the spec itself,
nor its version: a new batch tensor of the same layout is the same template), with the seed, the targets'
and the independent leaves' positions. A record holds no forward node, so no buffer stays alive through
it; its constants are CONST nodes and what the rules made of them only.

compute_gradient (graph/gradient.py) stays the specification: tests/tensor/test_backward_cache.py holds
the remade gradients to a fresh build (the same nodes) and to PyTorch's values.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from atensor.dtype import DType
from atensor.graph.gradient import compute_gradient
from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.simplify import const_value

_BUFFER = Ops.BUFFER


@dataclass(frozen=True)
class Made:
    """One node the backward made, remade by `Node.make_like` (which reads op, dtype, shape and device)
    from `src`: positions in the values of a replay (the forward's nodes, then the constants, then the
    nodes made before this one)."""
    op: Ops
    dtype: DType
    arg: Any
    shape: tuple
    device: Any
    src: tuple[int, ...]


@dataclass(frozen=True)
class Backward:
    """A recorded backward: the constants it used, the nodes it made in order, and per target (its
    forward position) the value position of its gradient."""
    constants: tuple[Node, ...]
    made: tuple[Made, ...]
    gradients: tuple[tuple[int, int], ...]

    def replay(self, order: list[Node]) -> dict[Node, Node]:
        """The gradients of the targets of `order` (a forward of this record's structure)."""
        values = [*order, *self.constants]
        make = Node.make_like
        for step in self.made:
            values.append(make(step, tuple([values[i] for i in step.src]), step.arg))  # type: ignore[arg-type]
        return {order[target]: values[at] for target, at in self.gradients}


@dataclass
class BackwardCache:
    """Recorded backwards by forward structure, the most recently used `size` of them.

    Lock: `lock`, held to read and write `entries` (two threads may differentiate at once). Lifetime:
    the process; `clear()` empties it (the tests compare a hit with a fresh build). `enabled` False
    makes every call a fresh `compute_gradient`."""
    size: int = 64
    enabled: bool = True
    hits: int = 0
    misses: int = 0
    entries: dict[tuple, Optional[Backward]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        """Forgets every record (and the counts)."""
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = 0


CACHE = BackwardCache()


def structure(order: list[Node], index: dict[Node, int]) -> tuple:
    """The forward's structure (module docstring): equal for two graphs whose backward rules make the
    same nodes up to the forward's own."""
    specs: dict[Any, int] = {}
    parts = []
    for node in order:
        if node.op is _BUFFER:
            spec = node.arg[0]
            first = specs.setdefault(spec, len(specs))
            parts.append((_BUFFER, node.dtype, first, spec.size, spec.device))
        else:
            parts.append((node.op, node.dtype, node.arg, tuple([index[s] for s in node.src])))
    return tuple(parts)


def gradients(order: list[Node], index: dict[Node, int], root: Node, seed: Node, targets: set[Node],
              leaves: frozenset[Node]) -> dict[Node, Node]:
    """`compute_gradient(root, seed, targets, leaves)`, remade from the record of its forward structure
    when there is one. `order` is `toposort([root])` and `index` each of its nodes' position; every
    target and leaf is in it. A seed that is not a constant (a user's gradient tensor) is not cached."""
    cache = CACHE
    if not cache.enabled or not _constant(seed):
        return compute_gradient(root, seed, targets, leaves)
    key = (structure(order, index), seed, tuple(sorted(index[t] for t in targets)),
           tuple(sorted(index[leaf] for leaf in leaves)))
    try:
        hash(key)
    except TypeError:  # an arg that cannot be a key (none is today: node args are interning keys too)
        return compute_gradient(root, seed, targets, leaves)
    with cache.lock:
        record = cache.entries.pop(key, False)
        if record is not False:
            cache.entries[key] = record  # the most recently used last
            cache.hits += 1
    if record is not False and record is not None:
        return record.replay(order)
    grads = compute_gradient(root, seed, targets, leaves)
    if record is False:  # first seen: record it (None when it cannot be: a buffer outside the forward)
        recorded = _record(order, index, grads)
        with cache.lock:
            cache.misses += 1
            cache.entries[key] = recorded
            while len(cache.entries) > cache.size:
                del cache.entries[next(iter(cache.entries))]
    return grads


def _constant(seed: Node) -> bool:
    """Whether `seed` is a constant (on one device, or one per device): the loss's implicit 1."""
    return const_value(seed) is not None or (seed.op is Ops.MULTI and all(const_value(s) is not None
                                                                          for s in seed.src))


def _record(order: list[Node], index: dict[Node, int], grads: dict[Node, Node]) -> Optional[Backward]:
    """The nodes of `grads` outside the forward, as constants (those that do not depend on it) and made
    nodes; None when a constant part holds a buffer (it would be kept alive, and it is not structure)."""
    walk = toposort(list(grads.values()), stop=index.__contains__)
    constants: list[Node] = []
    made: list[Node] = []
    depends: set[Node] = set()  # the made nodes: each depends on the forward
    for node in walk:
        if node in index:
            continue
        if any(s in index or s in depends for s in node.src):
            made.append(node)
            depends.add(node)
        elif node.op is _BUFFER or node.op is Ops.ASSIGN:
            return None
        else:
            constants.append(node)
    at = dict(index)
    for node in constants:
        at[node] = len(at)
    steps = []
    for node in made:
        steps.append(Made(node.op, node.dtype, node.arg, node.shape, node.device, tuple([at[s] for s in node.src])))
        at[node] = len(at)
    return Backward(tuple(constants), tuple(steps), tuple((index[t], at[g]) for t, g in grads.items()))
