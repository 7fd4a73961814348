"""The rules of the storage ledger: which buffer version each node names, which lazy assign is
pending on each buffer, and which nodes' values already sit in a buffer. The state itself is
atensor/ledger/'s; this module decides what it means and what a commit writes. `schedule`
(sched/schedule.py) reads it to decide what a graph must compute and what it must realize along; a
`Schedule`'s commit writes it (`record_realized`).

Versions keep lazy reads honest. A BUFFER node names one version of its buffer; an ASSIGN makes the
next. A graph that reads a version older than the buffer's newest realized one would see data that
was overwritten since it was built: that raises StaleReadError instead of silently differing from
eager code. A pending assign (`x.assign(y * 2)`, not yet realized) is program state, so it never
goes stale: a realize that overwrites what it reads realizes it along (`_flush_along`).

Locking: every write here holds `ledger.lock` (see atensor/ledger/'s header for what it guards);
`schedule` holds it too while it reads several realized values that must agree.
"""
from __future__ import annotations

import weakref
from typing import Iterable, Optional

from atensor import ledger
from atensor.graph.node import BufferSpec, GraphError, Node, toposort
from atensor.graph.ops import Ops
from atensor.ledger import pending_heads, set_head  # noqa: F401 - the ledger's, imported from here too

_value, _version = ledger.value, ledger.version
_value_entry, _record_of = ledger.value_entry, ledger.record_of


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
    entry = _value_entry(id(node))  # ledger.value(node) and ledger.version/runtime, inlined: this
    if entry is None:               # runs for every node of every graph scheduled
        return None
    found = entry[1]
    if node.op is Ops.ASSIGN:
        return found
    base = found.base()
    if base.op is not Ops.BUFFER:
        return None
    spec, version = base.arg
    record = _record_of(spec.uid)
    if record is None:
        return found if version == 0 else None
    if version != record.version:
        return None
    # contents a failed task wrote are no value: a structurally equal graph built later computes it again
    runtime = record.runtime
    return None if runtime is not None and runtime.write_failure() is not None else found


def storage_of(node: Node) -> BufferSpec:
    """The buffer under a chain of views and assigns."""
    node = node.base()
    while node.op is Ops.ASSIGN:
        node = node.src[0]
    if node.op is not Ops.BUFFER:
        raise GraphError(f"{node.op.name} node has no storage")
    return node.arg[0]


def settle_head(spec: BufferSpec) -> None:
    """Counts `spec`'s pending assign as realized when a replayed graph (jit/jit.py) has written the
    version it makes: the assign's target is the version before the buffer's current one."""
    with ledger.lock:
        head = ledger.head(spec)
        target = head.src[0] if head is not None else None
        if target is not None and target.op is Ops.BUFFER and target.arg[1] == ledger.version(spec) - 1:
            ledger.set_value_locked(head, ledger.current(spec))
            ledger.clear_head_locked(spec)


def drop_head(spec: BufferSpec, head: Node) -> None:
    """Forgets `head` as `spec`'s pending assign (a realize that would have made it failed before
    anything was committed); a newer head set since is kept."""
    with ledger.lock:
        ledger.clear_head_locked(spec, head)


def advance_versions(specs: Iterable[BufferSpec]) -> None:
    """Counts one more realized assign into each of `specs`: what a replayed graph's commit does
    (jit/jit.py), under the same lock as `Schedule.commit`."""
    with ledger.lock:
        for spec in specs:  # a buffer with a record already (state: a KV cache) without a call
            record = _record_of(spec.uid)
            if record is None:
                ledger.advance_locked(spec)  # makes the record
            else:
                record.version += 1


def _version_key(node: Node) -> Node:
    """One identity per buffer version: a realized ASSIGN is the BUFFER node of the version it made."""
    found = _value(node) if node.op is Ops.ASSIGN else None
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
            if read.op is Ops.BUFFER and read.arg[1] < _version(read.arg[0]):
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
        spec, version = node.arg
        record = _record_of(spec.uid)  # ledger.version(spec), without a call: once per buffer of every graph
        if record is not None and version < record.version:
            raise StaleReadError(
                f"a lazy value reads version {node.arg[1]} of {spec}, which a realized assign has "
                f"overwritten since (now version {_version(spec)}); realize the value before assigning "
                f"to the buffer it reads, or .clone() the input first")


def record_realized(realized: list[tuple[Node, BufferSpec]], original: list[Node], subbed: dict[Node, Node],
                    roots: list[Node], new_roots: list[Node]) -> None:
    """What a scheduled graph's commit writes into the ledger, once it is submitted: each assign in
    `realized` makes its buffer's next version; the nodes the user holds (`original`, before the
    substitution `subbed` of realized values) learn where their values now live."""
    with ledger.lock:
        for node, spec in realized:
            ledger.commit_assign_locked(node, spec)
        # the assigns the user holds are the nodes before substitution
        assign = Ops.ASSIGN
        for node in original:  # (`_value_entry`: `_value` without a call, for every node of every graph)
            if node.op is assign and _value_entry(id(node)) is None:
                done = _value(subbed.get(node, node))
                if done is not None:
                    ledger.set_value_locked(node, done)
                    ledger.clear_head_locked(storage_of(node), node)
        for root, new_root in zip(roots, new_roots):
            value = root.src[1]
            # a constant is never read back from where an assign wrote it: it costs nothing to compute, and
            # its interned node is in every graph that uses the number (a read would tie them to that buffer)
            if root.op is assign and value.op is not Ops.BUFFER and value.op is not Ops.VIEW \
                    and value.op is not Ops.CONST and _value_entry(id(value)) is None:
                entry = _value_entry(id(new_root))
                if entry is not None:
                    ledger.set_value_locked(value, entry[1].view(root.arg))
