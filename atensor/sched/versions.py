"""The version ledger: which buffer version each node names, which lazy assign is pending on each
buffer, and which nodes' values already sit in a buffer. `schedule` (sched/schedule.py) reads it to
decide what a graph must compute and what it must realize along; a `Schedule`'s commit writes it.

Versions keep lazy reads honest. A BUFFER node names one version of its buffer; an ASSIGN makes the
next. A graph that reads a version older than the buffer's newest realized one would see data that
was overwritten since it was built: that raises StaleReadError instead of silently differing from
eager code. A pending assign (`x.assign(y * 2)`, not yet realized) is program state, so it never
goes stale: a realize that overwrites what it reads realizes it along (`_flush_along`).

Locking: `_becomes_lock` guards every write of the ledger (`becomes`, `BufferSpec.version`,
`BufferSpec.head`, `_pending_specs`): a Tensor sets a head from the user's thread while the
dispatcher commits a graph. The names with an underscore are the ledger's own, read only by
sched/schedule.py besides this module.
"""
from __future__ import annotations

import threading
import weakref
from typing import Iterable, Optional

from atensor.graph.node import BufferSpec, GraphError, Node, toposort
from atensor.graph.ops import Ops


# realized values: node -> BUFFER view that now holds it; written by a Schedule's commit, read by Tensor
class _Becomes:
    """node -> the BUFFER view that holds its realized value. Kept on the node itself (its `realized`
    slot, which is not part of its identity): lookups happen for every node of every graph, and a
    weak-keyed dict costs a Python call each. Lives and dies with the node, like a weak key."""

    @staticmethod
    def get(node: Node, default: Optional[Node] = None) -> Optional[Node]:
        found = node.realized
        return default if found is None else found

    def __contains__(self, node: Node) -> bool:
        return node.realized is not None

    def __getitem__(self, node: Node) -> Node:
        found = node.realized
        if found is None:
            raise KeyError(node)
        return found

    def __setitem__(self, node: Node, target: Node) -> None:
        node.realized = target


becomes = _Becomes()
_becomes_lock = threading.Lock()


class StaleReadError(RuntimeError):
    """A lazy value reads a buffer version that a realized assign has overwritten since."""


class AssignCycleError(StaleReadError):
    """One kernel would need a buffer both before and after an assign to it (tinygrad raises a
    RuntimeError "cycle detected in graph" for the same programs)."""


def _realized(node: Node) -> Optional[Node]:
    """The buffer node holding `node`'s value, if it was realized and still holds it. A realized
    ASSIGN always maps (reading an overwritten one is a stale read, caught by the version check);
    a realized *value* is only a cache: once its buffer is written again, the value is recomputed
    from its own inputs instead, so writing into a realized tensor never changes values that were
    derived from the same expression."""
    found = becomes.get(node)
    if found is None or node.op is Ops.ASSIGN:
        return found
    base = found.base()
    if base.op is not Ops.BUFFER or base.arg[1] != base.arg[0].version:
        return None
    # contents a failed task wrote are no value: a structurally equal graph built later computes it again
    return None if _holds_failure(base.arg[0]) else found


def _holds_failure(spec: BufferSpec) -> bool:
    """True when the device memory hcq/ attached to `spec` holds what a failed task wrote (duck-typed:
    sched/ knows no runtime, only that `runtime.write_failure()` says so)."""
    runtime = spec.runtime
    return runtime is not None and runtime.write_failure() is not None


def storage_of(node: Node) -> BufferSpec:
    """The buffer under a chain of views and assigns."""
    node = node.base()
    while node.op is Ops.ASSIGN:
        node = node.src[0]
    if node.op is not Ops.BUFFER:
        raise GraphError(f"{node.op.name} node has no storage")
    return node.arg[0]


# buffers that may have a pending (lazy, unrealized) assign, see `set_head` and `_flush_along`
_pending_specs: weakref.WeakSet[BufferSpec] = weakref.WeakSet()


def set_head(spec: BufferSpec, head: Node) -> None:
    """Makes `head` (an ASSIGN into `spec`) the buffer's newest lazy version."""
    with _becomes_lock:
        spec.head = head
        _pending_specs.add(spec)


def settle_head(spec: BufferSpec) -> None:
    """Counts `spec`'s pending assign as realized when a replayed graph (engine/jit.py) has written the
    version it makes: the assign's target is the version before the buffer's current one."""
    with _becomes_lock:
        head = spec.head
        if head is not None and head.src[0].op is Ops.BUFFER and head.src[0].arg[1] == spec.version - 1:
            becomes[head] = spec.node()
            spec.head = None
            _pending_specs.discard(spec)


def drop_head(spec: BufferSpec, head: Node) -> None:
    """Forgets `head` as `spec`'s pending assign (a realize that would have made it failed before
    anything was committed); a newer head set since is kept."""
    with _becomes_lock:
        if spec.head is head:
            spec.head = None
            _pending_specs.discard(spec)


def advance_versions(specs: Iterable[BufferSpec]) -> None:
    """Counts one more realized assign into each of `specs`: what a replayed graph's commit does
    (engine/jit.py), under the same lock as `Schedule.commit`."""
    with _becomes_lock:
        for spec in specs:
            spec.version += 1


def pending_heads() -> list[Node]:
    """The newest lazy version of every buffer that has one, in no particular order. A realize takes
    this snapshot when it is issued (program order), and `schedule` realizes along every pending
    assign that still reads a version the realize overwrites."""
    with _becomes_lock:
        if not _pending_specs:  # the common case: a WeakSet's len is cheap, iterating it is not
            return []
        return [h for spec in list(_pending_specs) if (h := spec.head) is not None]


def _version_key(node: Node) -> Node:
    """One identity per buffer version: a realized ASSIGN is the BUFFER node of the version it made."""
    found = becomes.get(node) if node.op is Ops.ASSIGN else None
    return found if found is not None else node


def _flush_along(roots: list[Node], pending: list[Node]) -> list[Node]:
    """`roots` plus every pending assign that reads a buffer version this graph overwrites.

    A pending assign (`x.assign(y * 2)` not yet realized) is part of the program's state, as in
    eager code, so it must never go stale: when a realize overwrites version k of `y`, every pending
    assign that reads version k is realized in the same graph, ordered before the overwrite. (Lazy
    *values* a user holds cannot be found this way: they raise StaleReadError instead.)"""
    given = set(roots)
    candidates = [h for h in pending if h not in given and _realized(h) is None]
    if not candidates:  # the common case: nothing else is pending, no walk over the graph
        return list(roots)
    in_graph: set[Node] = set(toposort(roots, stop=lambda n: _realized(n) is not None))
    candidates = [h for h in candidates if h not in in_graph]
    added: list[Node] = []
    while candidates:
        # only the assigns this graph makes overwrite anything (a realized one is a version already)
        assigns = [n for n in in_graph if n.op is Ops.ASSIGN and _realized(n) is None]
        overwritten = {_version_key(n.src[0]) for n in assigns}
        written = {storage_of(n) for n in assigns}
        # a candidate that already reads an overwritten version cannot be helped: it is left to
        # raise StaleReadError when it is realized itself, not in this unrelated realize
        keep = [h for h in candidates
                if written.isdisjoint(specs_read(h)) or _reads_any(h, overwritten, in_graph) is not True]
        if len(keep) == len(candidates):
            break
        for head in candidates:
            if head not in keep:
                added.append(head)
                in_graph.update(toposort([head], stop=lambda n: _realized(n) is not None))
        candidates = keep
    return list(roots) + added


_specs_cache: weakref.WeakKeyDictionary[Node, frozenset[BufferSpec]] = weakref.WeakKeyDictionary()


def specs_read(head: Node) -> frozenset[BufferSpec]:
    """Every buffer under `head` (cached: a node's graph never changes), a cheap first filter."""
    found = _specs_cache.get(head)
    if found is None:
        found = _specs_cache[head] = frozenset(n.arg[0] for n in toposort([head]) if n.op is Ops.BUFFER)
    return found


def _reads_any(head: Node, versions: set[Node], in_graph: set[Node]) -> Optional[bool]:
    """True when computing `head` reads one of `versions` (buffer versions, see `_version_key`), None
    when it reads a version that is already overwritten (stale), else False. The edge from an ASSIGN
    to the storage it writes (src[0]) is not a read; realized nodes and the graph's own assigns are
    materialized, so what is behind them is not read again."""
    stack, seen, hit = [head], {head}, False
    while stack:
        node = stack.pop()
        if node is not head and (_realized(node) is not None or (node.op is Ops.ASSIGN and node in in_graph)):
            continue
        for i, src in enumerate(node.src):
            read = _version_key(src) if src.op is Ops.ASSIGN else src
            if read.op is Ops.BUFFER and read.arg[1] < read.arg[0].version:
                return None
            if not (node.op is Ops.ASSIGN and i == 0) and src.op in (Ops.BUFFER, Ops.ASSIGN) \
                    and _version_key(src) in versions:
                hit = True
            if src not in seen:
                seen.add(src)
                stack.append(src)
    return hit


def check_versions(buffer_nodes: list[Node]) -> None:
    """Raises StaleReadError when a BUFFER node names a version a realized assign has overwritten."""
    for node in buffer_nodes:
        spec = node.arg[0]
        if node.arg[1] < spec.version:
            raise StaleReadError(
                f"a lazy value reads version {node.arg[1]} of {spec}, which a realized assign has "
                f"overwritten since (now version {spec.version}); realize the value before assigning "
                f"to the buffer it reads, or .clone() the input first")


def record_realized(realized: list[tuple[Node, BufferSpec]], original: list[Node], subbed: dict[Node, Node],
                    roots: list[Node], new_roots: list[Node]) -> None:
    """What a scheduled graph's commit writes into the ledger, once it is submitted: each assign in
    `realized` makes its buffer's next version; the nodes the user holds (`original`, before the
    substitution `subbed` of realized values) learn where their values now live."""
    with _becomes_lock:
        for node, spec in realized:
            spec.version += 1
            becomes[node] = spec.node()
            if spec.head is node:
                spec.head = None
                _pending_specs.discard(spec)
        # the assigns the user holds are the nodes before substitution
        for node in original:
            if node.op is Ops.ASSIGN and node not in becomes:
                done = becomes.get(subbed.get(node, node))
                if done is not None:
                    becomes[node] = done
                    spec = storage_of(node)
                    if spec.head is node:
                        spec.head = None
                        _pending_specs.discard(spec)
        for root, new_root in zip(roots, new_roots):
            value = root.src[1]
            if root.op is Ops.ASSIGN and value.op not in (Ops.BUFFER, Ops.VIEW) and value not in becomes \
                    and new_root in becomes:
                becomes[value] = becomes[new_root].view(root.arg)
