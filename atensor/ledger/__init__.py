"""The storage ledger: what changes about storage while graph/ objects stay immutable values.

A `BufferSpec` (graph/node.py) names a buffer and a `Node` names a value; neither changes once made.
What does change lives here, and only here:

- per buffer spec, its **version** (how many assigns into it were realized: a BUFFER node names one
  version), its **pending head** (the newest lazy ASSIGN into it, what a Tensor viewing the buffer
  follows) and its **runtime** (the device memory hcq/ attaches, an `hcq.buffer.Buffer`);
- per node, its **realized value**: the BUFFER view that holds the node's value once a realize
  committed it (ledger/versions.py decides when such a value is still valid).

Where it is kept, and why. Both tables sit here, keyed by identity, and hold the graph objects
weakly, so an entry lives exactly as long as its spec or node (tests/test_ledger.py measures both):
a spec's `Record` is keyed by the spec's `uid` (never reused) and dropped by a weak reference's
callback when the spec dies, which frees its runtime buffer with it; a realized value is keyed by
`id(node)` and dropped the same way when the node dies (the callback runs before the node's memory,
and so its id, can be reused; a value view never refers back to the node it holds). Lookups are one
dict probe: they happen for every node of every graph scheduled, and a `WeakKeyDictionary` costs a
Python call and a new weak reference per probe. The graph objects carry nothing of this (their
attributes are read-only, graph/node.py). One reference does keep a spec alive: a pending head is an
ASSIGN into it, and the node table of graph/node.py holds its BUFFER node's key, spec included,
strongly; so a lazy assign never realized keeps its buffer, exactly as when the head was an
attribute of the spec.

Locking. `lock` (a `threading.Lock`, not reentrant) guards every write of versions, heads, the set
of pending specs and realized values: a Tensor sets a head on the user's thread while the
dispatcher commits a graph, and a commit's writes must be seen together. Who writes: ledger/versions.py
(a Schedule's commit, the jit's version counts, heads set and dropped), through the `*_locked`
functions while holding `lock` or through `set_head`, which takes it (tensor*.py and engine/ set
heads through ledger/versions.py; graph/multi.py's `assemble` through the hook registered with
graph/node.py, as graph/ may not import this module). Reads take no lock: each read
is of one attribute or one dict entry, atomic under the GIL, and a reader that needs several to
agree (scheduling a graph) holds `lock` itself. Runtimes are attached once per spec by hcq/buffer.py
(`attach_runtime`, under `lock`, so two threads never make two Buffers for one spec), and told
when the spec dies (`runtime.spec_died()`, from the record's weak-reference callback). The weak
callback that drops a dead node's value takes no lock (it may run on any thread, inside any code
that drops the last reference to a node, including code holding `lock`); it only removes the entry
it made.
"""
from __future__ import annotations

import threading
import weakref
from functools import partial
from typing import Any, Callable, Optional, TypeVar

from atensor import core
from atensor.graph.node import BufferSpec, Node, register_ledger
from atensor.graph.ops import Ops

T = TypeVar("T")

lock = threading.Lock()


class Record(weakref.ref):
    """The ledger's entry for one buffer spec, which is also the spec's weak reference: when the spec
    dies its callback (`_drop_record`) is given the record itself and drops it. Made by `_new_record`.
    Written only under `lock`, by the functions below.

    (A weakref subclass, not a record holding `weakref.ref(spec, partial(_drop_record, uid))`: one
    object per spec instead of three, 0.25 against 0.5-0.7 us of CPU here; every fresh result buffer
    of an eager realize and of a jit replay makes one.)"""
    __slots__ = ("version", "head", "runtime", "uid")
    version: int             # realized assigns into the buffer
    head: Optional[Node]     # the newest lazy version (an ASSIGN) not yet realized
    runtime: Any             # the hcq Buffer (device memory), made on first use
    uid: int                 # the spec's uid: the key of this record in `_records`

    def __repr__(self) -> str:
        return f"Record(version={self.version}, head={self.head!r}, runtime={self.runtime!r})"


def _new_record(spec: BufferSpec) -> Record:
    """A fresh record of `spec` (version 0, no head, no runtime); the caller puts it in `_records`."""
    record = Record(spec, _drop_record)
    record.version, record.head, record.runtime, record.uid = 0, None, None, spec.uid
    return record


# uid -> the record of a spec that has state (a version above 0, a head or a runtime buffer)
_records: dict[int, Record] = {}
_records_get = _records.get
# buffers whose pending head no issued realize has claimed yet, in the order their heads were set (a
# dict as an ordered set: `pending_heads` lists them in program order, never in hash or id order, so
# a jit capture collects them the same way on every call). Uids, not a WeakSet: adding to one is three
# Python calls; a dead spec's uid goes with its record.
_pending: dict[int, None] = {}
# realized values: id(node) -> (weak reference to the node, the BUFFER view holding its value)
_values: dict[int, tuple[weakref.ref, Node]] = {}
_values_get = _values.get

# The two one-probe reads of the scheduler's per-node loop (ledger/versions.py `_realized`), without a
# Python call around them: `record_of(spec.uid)` is the spec's Record or None (read its `version` and
# `runtime`, never write them), `value_entry(id(node))` is (weak reference, value view) or None.
record_of = _records_get
value_entry = _values_get


def _drop_record(record: Record, pop: Callable[..., Any] = _records.pop,
                 discard: Callable[..., Any] = _pending.pop) -> None:
    """A spec died (`record` is its weak reference): its record (and the runtime buffer it holds) goes,
    and the runtime is told (`runtime.spec_died()`: hcq/buffer.py gives the memory back to its device
    then). No lock: see the header."""
    uid = record.uid
    pop(uid, None)
    discard(uid, None)
    runtime = record.runtime
    if runtime is not None:
        runtime.spec_died()


def _record(spec: BufferSpec) -> Record:
    """`spec`'s record, made on first write. The caller holds `lock`."""
    record = _records_get(spec.uid)
    if record is None:
        record = _records[spec.uid] = _new_record(spec)
    return record


# ---- buffer specs ---------------------------------------------------------------------------------
def version(spec: BufferSpec) -> int:
    """How many assigns into `spec` were realized (committed) so far."""
    record = _records_get(spec.uid)
    return 0 if record is None else record.version


def current(spec: BufferSpec) -> Node:
    """The BUFFER node of `spec`'s current (newest realized) version."""
    return Node.make(Ops.BUFFER, spec.dtype, (), (spec, version(spec)))


def head(spec: BufferSpec) -> Optional[Node]:
    """`spec`'s pending head: its newest lazy ASSIGN, or None."""
    record = _records_get(spec.uid)
    return None if record is None else record.head


def latest(spec: BufferSpec) -> Node:
    """The newest version of `spec`: the pending ASSIGN if one is lazy, else the realized buffer."""
    record = _records_get(spec.uid)
    if record is None:
        return Node.make(Ops.BUFFER, spec.dtype, (), (spec, 0))
    found = record.head
    return found if found is not None else Node.make(Ops.BUFFER, spec.dtype, (), (spec, record.version))


def runtime(spec: BufferSpec) -> Any:
    """The runtime buffer hcq/ attached to `spec`, or None when none was made yet."""
    record = _records_get(spec.uid)
    return None if record is None else record.runtime


def attach_runtime(spec: BufferSpec, make: Callable[[BufferSpec], T]) -> T:
    """`spec`'s runtime buffer, made with `make(spec)` on first use (once, even from two threads).
    It lives exactly as long as the spec."""
    uid = spec.uid
    record = _records_get(uid)
    if record is not None:
        found = record.runtime
        if found is not None:
            return found
    with lock:
        record = _records_get(uid)
        if record is None:
            record = _records[uid] = _new_record(spec)
        found = record.runtime
        if found is None:
            found = record.runtime = make(spec)
    return found


def attach_new(spec: BufferSpec, runtime: Any, version: int) -> None:
    """Records `spec`, made just now and seen by nothing else yet (no record can exist: a jit replay's
    fresh result, hcq/device.py `fresh_small`), with its runtime buffer and `version` realized assigns:
    what `attach_runtime` then `versions.advance_versions` would leave, in one record made once."""
    record = _new_record(spec)
    record.version, record.runtime = version, runtime
    with lock:
        _records[spec.uid] = record


def set_head(spec: BufferSpec, node: Node, claimed: bool = False) -> None:
    """Makes `node` (an ASSIGN into `spec`) the buffer's newest lazy version; `claimed` when an issued
    realize takes it along (see `claim`)."""
    with lock:
        record = _records_get(spec.uid)
        if record is None:
            record = _records[spec.uid] = _new_record(spec)
        record.head = node
        _pending.pop(spec.uid, None)  # a new head is the newest pending work: last in program order
        if not claimed:
            _pending[spec.uid] = None


def claim(heads: list[tuple[BufferSpec, Node]]) -> None:
    """Notes that an issued realize takes each `(spec, head)` along: `pending_heads` stops listing the
    head (its realize will commit it), while `head`/`latest` still name it until that commit, so a
    view or an assign made meanwhile builds on it. A head replaced since is left as it is."""
    if not heads:  # (most realizes take none along)
        return
    with lock:
        for spec, node in heads:
            record = _records_get(spec.uid)
            if record is not None and record.head is node:
                _pending.pop(spec.uid, None)


def unclaim(heads: list[tuple[BufferSpec, Node]]) -> None:
    """Gives back the claims of a realize that failed before committing: each head that is still its
    buffer's head is pending again, for a later realize to take (and raise from, if it fails again)."""
    with lock:
        for spec, node in heads:
            record = _records_get(spec.uid)
            if record is not None and record.head is node:
                _pending[spec.uid] = None


def claimed(spec: BufferSpec) -> bool:
    """True when `spec` has a pending head that an issued realize has claimed (see `claim`)."""
    record = _records_get(spec.uid)
    return record is not None and record.head is not None and spec.uid not in _pending

def clear_head_locked(spec: BufferSpec, node: Optional[Node] = None) -> None:
    """Forgets `spec`'s pending head (only if it is `node`, when given: a newer head set since stays).
    The caller holds `lock`."""
    record = _records_get(spec.uid)
    if record is not None and record.head is not None and (node is None or record.head is node):
        record.head = None
        _pending.pop(spec.uid, None)


def advance_locked(spec: BufferSpec) -> int:
    """Counts one more realized assign into `spec`; returns the new version. The caller holds `lock`."""
    record = _record(spec)
    record.version += 1
    return record.version


def commit_assign_locked(node: Node, spec: BufferSpec) -> None:
    """A realized assign `node` into `spec`: the buffer's next version, which holds `node`'s value;
    `node` stops being the pending head. The caller holds `lock`. (One call for what a commit does per
    assign: `advance_locked`, `set_value_locked` of `current`, `clear_head_locked`.)"""
    uid = spec.uid
    record = _records_get(uid)
    if record is None:
        record = _records[uid] = _new_record(spec)
    record.version = version = record.version + 1
    key = id(node)
    target = Node.make(Ops.BUFFER, spec.dtype, (), (spec, version))
    _values[key] = (weakref.ref(node, partial(_forget, key)), target)
    if record.head is node:
        record.head = None
        _pending.pop(spec.uid, None)


def pending_heads() -> list[Node]:
    """The newest lazy version of every buffer that has one and that no issued realize has claimed,
    in the order the heads were set (program order)."""
    if not _pending:  # the common case, read without the lock (one read: atomic under the GIL)
        return []
    with lock:
        return [h for uid in list(_pending) if (r := _records_get(uid)) is not None and (h := r.head) is not None]


# ---- realized values ------------------------------------------------------------------------------
def value(node: Node) -> Optional[Node]:
    """The BUFFER view recorded as holding `node`'s value, or None (whether it still holds it is
    ledger/versions.py's question: `_realized`)."""
    entry = _values_get(id(node))
    return None if entry is None else entry[1]


def set_value_locked(node: Node, target: Node) -> None:
    """Records that `target` (a BUFFER view) holds `node`'s value, for as long as `node` lives.
    The caller holds `lock`."""
    key = id(node)
    _values[key] = (weakref.ref(node, partial(_forget, key)), target)


def _forget(key: int, ref: weakref.ref, get: Callable[..., Any] = _values_get,
            pop: Callable[..., Any] = _values.pop) -> None:
    """A node with a realized value died: its entry goes (no lock, see the header). Only the entry
    this reference was made for: a replaced entry's reference died with it, before its node."""
    entry = get(key)
    if entry is not None and entry[0] is ref:
        pop(key, None)


register_ledger(set_head)

# the Python functions the compiled core replaces, kept for tests/core/'s comparisons (whichever runs)
python_core = {"commit_assign_locked": commit_assign_locked, "set_value_locked": set_value_locked,
               "attach_new": attach_new, "drop_record": _drop_record}
if core.ccore is not None:  # the commit in C (atensor/core/ledger.c): the same tables, the same lock rules
    core.ccore.configure_ledger(Record, _records, _new_record, _values, _pending)
    # a dead spec's record dropped in C, its Buffer's small memory given back in C (core/fresh.c); the
    # records made from here on (by `_new_record` and `attach_new`) get it as their callback
    _drop_record = core.ccore.drop_record  # noqa: F811
    core.ccore.configure_attach(lock, _drop_record)
    commit_assign_locked = core.ccore.commit_assign_locked  # noqa: F811
    set_value_locked = core.ccore.set_value_locked  # noqa: F811
    attach_new = core.ccore.attach_new  # noqa: F811


def statistics() -> dict[str, int]:
    """Sizes of the ledger's tables: buffer records, realized values, buffers with a pending head."""
    return {"records": len(_records), "values": len(_values), "pending": len(_pending)}
