"""The realize pipeline: from "these tensors, realized" to a submitted plan and the handle to await.

Why a module of its own: `Tensor.realize()` only says what to realize (tensor/tensor.py); `realize` here
issues it, and the dispatcher thread (engine/dispatch.py) runs `_prepare` later, off the event loop (or the
caller does at once, for a small graph while the dispatcher is idle): each computed tensor's storage
(a buffer and the ASSIGN into it), then scheduling (sched/), the race and bounds proofs, commit, and
execution (engine/plan.py): a graph structured like one realized before submits the CapturedProgram of
its schedule-cache template (`program_of`, engine/program.py) with its own buffers in the template's
slots, so it is neither built as a TaskGraph nor lowered again. The jit (jit/jit.py) records the
schedules that this path ran and keeps them as CapturedPrograms. A realize planned inline (small, or
up to `HOT_MAX_NODES` nodes while the dispatcher is idle) whose graph hits a hot template with a twin
replayed by record (or, on one CL device, by its lean replay, or a heavy twin's kept runners) is run
before any `Job` is made, as that twin's `EagerReplay` (engine/eager_replay.py, `_hot_hit`):
when it declines, the key and template it found go on to `schedule`, so nothing is walked twice.

When a tensor's storage is decided: when `realize()` is called (a `Storage` on the tensor's `_swap`
slot), not when the realize is planned. Deciding it at planning let a write issued meanwhile
(`c[0:1].assign(v)` right after `c.realize()`) see a pure value and give it storage of its own, so
the write was lost or not depending on which thread planned the realize (issue 33). The Storage is
made by whichever thread needs it first; the dispatcher never writes a tensor's node.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Optional

from atensor import core
from atensor.config import current_settings
from atensor import ledger
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.rewrite import substitute
from atensor.graph.view import View
from atensor.hcq.buffer import Buffer, InFlight
from atensor.hcq.gcpause import gc_paused
from atensor.engine.handle import RealizeHandle
from atensor.engine.dispatch import Job, Recording, dispatcher, reaper, recording
from atensor.sched import cache, schedule as sched
from atensor.engine.plan import execute
from atensor.engine.submission import Submission
from atensor.engine.program import CapturedProgram
from atensor.engine.eager_replay import EagerReplay
from atensor.hcq.device import all_idle
from atensor.ledger import versions
from atensor.profiler import collector
from atensor.profiler.events import HostSpan


def _storage_base(node: Node) -> Optional[Node]:
    base = node.base()
    return base if base.op in (Ops.BUFFER, Ops.ASSIGN) else None


_VIEW, _BUFFER, _ASSIGN = Ops.VIEW, Ops.BUFFER, Ops.ASSIGN


def _follow_storage(node: Node) -> Node:
    """`node` with its storage (if it is a view of one) at the storage's newest version."""
    base = node
    while base.op is _VIEW:
        base = base.src[0]
    if base.op is _BUFFER:
        spec, version = base.arg
        record = ledger.record_of(spec.uid)
        # the common case, without building the newest BUFFER node: is it this one?
        if (version == 0) if record is None else (record.head is None and record.version == version):
            return node
    elif base.op is _ASSIGN:
        storage = base.src[0]  # (an ASSIGN's target is a BUFFER or an ASSIGN, never a view)
        while storage.op is _ASSIGN:
            storage = storage.src[0]
        spec = storage.arg[0]
        record = ledger.record_of(spec.uid)
        if record is not None and record.head is base:  # still the buffer's newest (pending) version
            return node
    else:
        return node
    return _follow_to_latest(node, base, spec)


def _follow_to_latest(node: Node, base: Node, spec: BufferSpec) -> Node:
    """`_follow_storage` of a `node` whose storage `base` (of `spec`) is not the newest version."""
    latest = ledger.latest(spec)
    if base is latest:
        return node
    if node is base:  # the common cases without a general rewrite: the storage itself,
        return latest
    if node.src[0] is base:  # or one view of it
        return latest.view(node.arg)
    return substitute([node], {base: latest})[node]


python_follow_storage = _follow_storage  # the specification, whichever runs (tests/core/ compares the two)
if core.ccore is not None:  # the common cases in C (atensor/core/ledger.c), the rest `_follow_to_latest`
    core.ccore.configure_follow(Ops.VIEW, _follow_to_latest)
    _follow_storage = core.ccore.follow_storage  # noqa: F811


# a realize of at most this many nodes to compute (stopping at buffers and realized values) is planned
# on the calling thread when the dispatcher is idle: scheduling a cached graph of that size and
# lowering it costs tens of microseconds, less than the hand-off to the dispatcher thread and back
INLINE_MAX_NODES = 64
# a realize of more nodes, up to this many, is first tried as a hot template's replay on the calling
# thread when the dispatcher is idle (`_hot_hit`): an eager training step's graph (the flagship's: 128
# to 256 nodes) whose template has a heavy twin. The walks cost tens of microseconds in C; on a decline
# the key goes along to the dispatcher, so nothing is walked twice
HOT_MAX_NODES = 1024


def realize(captured: list[tuple[Any, Node]], result: Any) -> RealizeHandle:
    """Issues the realize of `captured` ((tensor, its node) pairs) and returns the handle to await
    (it returns `result`). Each computed tensor's storage is fixed here (a `Storage`, made by the
    first thread that needs it), so a write into the tensor or into a view of it issued before this
    realize completes lands in the tensor's buffer, ordered after it, whichever thread plans the
    realize and whenever (docs/semantics.md, rule 3). Small graphs are planned and submitted here,
    when nothing is queued before them; the others (and any realize while race proofs are on: z3
    takes milliseconds, and so does compiling every kernel to C) go to the dispatcher thread, in
    issue order."""
    # one Storage per tensor: for a big realize, no collection may stop the loop while they are made
    if len(captured) > INLINE_MAX_NODES:
        with gc_paused():
            items, given = _storages(captured)
    else:
        items, given = _storages(captured)
    if given:
        ledger.claim(given)
    pending = versions.pending_heads()
    record = recording.get()
    config = current_settings()
    nodes = [n for n, _ in items]
    # small alone, and (below) small with the pending assigns a general plan may take along; a hot hit
    # takes none along (`_hot_hit` declines then), so unrelated pending assigns, however big, leave it
    # on the caller's thread: before, 10 assigns a program left pending sent every later realize of it
    # to the dispatcher thread
    small = _small(nodes, INLINE_MAX_NODES)
    if config.racecheck or config.native == "all" or not (small or record is None and config.schedule_cache
                                                          and _small(nodes, HOT_MAX_NODES)) \
            or not dispatcher.claim():
        job = _job(items, given, pending, record, None)
        dispatcher.submit(job)
        return RealizeHandle(job, result)
    found = None  # planned here, holding the dispatcher: first as a hot template's replay, if it is one
    if record is None and config.schedule_cache:
        try:
            handle, found = _hot_hit(items, pending, config, result)
        except BaseException:
            dispatcher.unclaim()
            raise
        if handle is not None:
            dispatcher.unclaim()
            return handle
    job = _job(items, given, pending, record, found)
    if not small or pending and not _small(nodes + pending, INLINE_MAX_NODES):
        # nothing was planned or committed: the dispatcher plans it, in issue order (queued before the
        # role is given back, so no realize is planned between the key `found` and its use)
        dispatcher.submit(job)
        dispatcher.unclaim()
        return RealizeHandle(job, result)
    dispatcher.run_claimed(job, keep_error=True)
    return RealizeHandle(job, result)


def _job(items: list[tuple[Node, Optional[Storage]]], given: list[tuple[BufferSpec, Node]],
         pending: list[Node], record: Optional[Recording], found: Optional[_Found]) -> Job:
    """The general path's `Job` of a realize (`_prepare` on the dispatching thread)."""
    job = Job(None, [])
    job.record = record
    job.plan = lambda: _prepare(job, items, given, pending, found)
    return job


# a graph's key and its template (None: a miss), found by `_hot_hit` on these roots while holding the
# dispatcher, for `schedule` to use rather than walk the graph again (no key: the walk met a realized value)
_Found = tuple[Optional[cache.GraphKey], Optional[cache.Template], list[Node]]


def _hot_hit(items: list[tuple[Node, Optional[Storage]]], pending: list[Node], config: Any,
             result: Any) -> tuple[Optional[RealizeHandle], Optional[_Found]]:
    """A realize whose graph hits a hot template with an `EagerReplay` (engine/eager_replay.py), run
    here: (its handle, None): finished, or on the submission of a CL twin's lean replay or a heavy
    twin's plan still running. Its roots are the ones `_prepare` finds, in its order: each computed
    tensor's new ASSIGN and each pending assign it was given (`ledger.claim`ed by `realize`), per shard
    of a sharded one. Otherwise (declined, nothing run or committed) (None, what was found of its key
    and template, or None). The caller holds the dispatcher; nothing is captured along, and of the
    `pending` assigns none may have to be realized along (`_flush_along`: one reads a version this
    graph overwrites), else it declines."""
    if collector.is_active() or config.debug >= 2 or not all_idle():
        return None, None
    bases: dict[int, Node] = {}
    for node, storage in items:  # the roots `_prepare` would find, in its order (per shard of a MULTI)
        stored = storage.node() if storage is not None else node
        for part in stored.src if stored.op is Ops.MULTI else (stored,):
            base = part.base()
            if base.op is _BUFFER:
                continue  # (a realized value: nothing to compute; every queue is idle, nothing to wait for)
            if base.op is not _ASSIGN:
                return None, None
            bases.setdefault(id(base), base)
    if not bases:
        return None, None
    roots = list(bases.values())
    if pending and len(versions._flush_along(roots, pending)) != len(roots):
        return None, None  # (`schedule` takes them along)
    key = cache.walk_key(roots, (config.allreduce_bucket_bytes,), ledger.value_entry)
    if key is None:  # a realized value in the graph: `schedule` substitutes it, without this walk again
        return None, (None, None, roots)
    template = cache.lookup(key)
    found = (key, template, roots)
    program = _programs.get(template) if template is not None else None
    if program is None or program.twin is None:
        return None, found
    replay = program.eager
    if replay is None or not replay.valid():
        replay = program.eager = EagerReplay.of(program)
        if replay is None:
            return None, found
    handle = replay.run(key, template, roots, result)
    if handle is False:
        return None, found  # a stale or failed read: the general path raises it
    return handle, None


def _storages(captured: list[tuple[Any, Node]]) -> tuple[list[tuple[Node, Optional[Storage]]],
                                                         list[tuple[BufferSpec, Node]]]:
    """`realize`'s items (each node with the Storage made for it, or None) and the pending assigns it
    realizes as they are (not made here)."""
    items: list[tuple[Node, Optional[Storage]]] = []
    given: list[tuple[BufferSpec, Node]] = []  # pending assigns realized as they are (not made here)
    view, buffer, assign, multi = Ops.VIEW, Ops.BUFFER, Ops.ASSIGN, Ops.MULTI
    for t, node in captured:  # (runs per tensor on the caller's thread: kept to a few attribute reads)
        swap = t._swap
        if swap is not None and swap.lazy is node:  # the same tensor given twice
            items.append((node, swap))
            continue
        base = node
        while base.op is view:
            base = base.src[0]
        if base.op is buffer:
            items.append((node, None))
        elif base.op is assign or node.op is multi:
            _other_item(t, node, items, given)
        else:
            storage = t._swap = Storage(node)
            items.append((node, storage))
    return items, given


def _other_item(t: Any, node: Node, items: list[tuple[Node, Optional[Storage]]],
                given: list[tuple[BufferSpec, Node]]) -> None:
    """`_storages`' item of a tensor whose node is (a view of) a pending assign, realized as it is (its
    assign given), or a sharded tensor's MULTI: as it is when every shard has storage, else with a
    Storage of its own."""
    base = node
    while base.op is Ops.VIEW:
        base = base.src[0]
    if base.op is Ops.ASSIGN:
        given.append((versions.storage_of(base), base))
        items.append((node, None))
    elif _needs_storage(node):
        storage = t._swap = Storage(node)
        items.append((node, storage))
    else:
        given.extend((versions.storage_of(b), b) for b in _assign_bases(node))
        items.append((node, None))


# one lock for every Storage: making one takes microseconds, and two threads rarely want one at once
_storage_lock = threading.Lock()


class Storage:
    """The storage a realize gives a computed tensor: a new buffer and the pending ASSIGN into it that
    computes the tensor's value (per shard for a sharded tensor). It is fixed when `realize()` is
    called and made by whichever thread needs it first: the tensor's own thread the moment it reads
    the tensor's node (to view it or to assign into it: Tensor.node), or the realize's planning.
    Made once, under `_storage_lock`; the ASSIGN is claimed by the realize (atensor/ledger/) from the
    start. Why not make it in `realize()` at once: realizing 3,000 tensors would then build 9,000
    nodes on the event loop's thread (~0.3 s measured on the 2-core CI machine), where this costs
    one small object per tensor. `reaped`: the realize is big (set by its planning thread), so the
    tensor hands its lazy graph, dead once the realize committed, to engine/dispatch.py's `Reaper.bury`."""
    __slots__ = ("lazy", "_node", "reaped")

    def __init__(self, lazy: Node):
        self.lazy = lazy
        self._node: Optional[Node] = None
        self.reaped = False

    def node(self) -> Node:
        """The tensor's node with storage: a view of the pending ASSIGN into its buffer."""
        found = self._node
        if found is None:
            with _storage_lock:
                found = self._node
                if found is None:
                    lazy = self.lazy
                    found = self._node = _with_storage(lazy) if lazy.op is Ops.MULTI else _new_storage(lazy)
        return found


python_storages = _storages  # the specification, whichever runs (tests/core/ compares the two)
if core.ccore is not None:  # the loop in C (atensor/core/walk.c); what is not a computed value, `_other_item`
    core.ccore.configure_storages(Storage, Ops.VIEW, _other_item)
    _storages = core.ccore.storages  # noqa: F811


def in_flight(node: Node) -> bool:
    """True when `node` views the storage of a realize that is issued but not yet planned (its ASSIGN
    is claimed, atensor/ledger/)."""
    base = node.src[0] if node.op is Ops.VIEW else node
    return base.op is Ops.ASSIGN and ledger.claimed(versions.storage_of(base))


def _needs_storage(node: Node) -> bool:
    if node.op is Ops.MULTI:
        return any(_storage_base(s) is None for s in node.src)
    return _storage_base(node) is None


def _with_storage(node: Node) -> Node:
    """`node` with storage: itself when it views storage (a buffer, or a pending assign into one),
    else a view of a new buffer whose pending ASSIGN (claimed) computes `node`."""
    if node.op is Ops.MULTI:
        parts = tuple(_with_storage(s) for s in node.src)
        return node if parts == node.src else Node.make(Ops.MULTI, node.dtype, parts, node.arg)
    return node if _storage_base(node) is not None else _new_storage(node)


def _new_storage(node: Node) -> Node:
    """A view of a new buffer whose pending ASSIGN (claimed) computes `node`, a computed value (no
    storage under it: a `Storage` is made only for such a node, or a MULTI, `_storages`)."""
    shape = node.shape
    size = shape[0] if len(shape) == 1 else node.size
    spec = BufferSpec(node.device, size, node.dtype)
    flat = View.create((size,))
    view = flat if shape == flat.shape else flat.reshape(shape)
    root = Node.make(Ops.ASSIGN, node.dtype, (spec.node(0), node), view)
    versions.set_head(spec, root, claimed=True)
    return root if view is flat else root.view(view)  # (the flat view of the flat buffer: itself)


def _assign_bases(node: Node) -> list[Node]:
    """The pending ASSIGNs a node with storage views (one per shard), which its realize computes."""
    parts = node.src if node.op is Ops.MULTI else (node,)
    return [b for p in parts if (b := p.base()).op is Ops.ASSIGN]


def _small(nodes: list[Node], limit: int) -> bool:
    """True when at most `limit` nodes are left to compute under `nodes` (the captured ones and the
    pending assigns the realize may take along)."""
    seen: set[Node] = set()
    stack = list(nodes)
    buffer, value_entry = Ops.BUFFER, ledger.value_entry
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > limit:
            return False
        if node.op is not buffer and value_entry(id(node)) is None:  # ledger.value(node), without a call
            stack.extend(node.src)
    return True


python_small = _small  # the specification, whichever runs (tests/core/ compares the two)
if core.ccore is not None:  # the same walk in C (atensor/core/walk.c)
    def _small(nodes: list[Node], limit: int, _walk: Any = core.ccore.small_graph) -> bool:
        """`python_small`, walked in C."""
        return _walk(nodes, limit, ledger.value_entry)


def _prepare(job: Job, items: list[tuple[Node, Optional[Storage]]], given: list[tuple[BufferSpec, Node]],
             pending: list[Node], found: Optional[_Found] = None) -> Optional[Submission]:
    """The part of a realize that runs on the dispatcher thread (or inline): each tensor's storage
    (made here unless its thread made it already), the output buffers, then scheduling and
    submission. If it fails before anything is committed, the ASSIGNs that storage holds stay claimed
    (no later realize or jit capture takes them along) and the tensors keep them: realizing one again
    raises again. The pending assigns it was given are pending again (their claims given back)."""
    bases: dict[int, Node] = {}
    for node, storage in items:
        stored = storage.node() if storage is not None else node
        for part in stored.src if stored.op is Ops.MULTI else (stored,):
            base = _storage_base(part)
            if base is None:
                continue
            if base.op is Ops.BUFFER:
                job.wait_for.append(Buffer.of(base.arg[0]))
            else:
                bases.setdefault(id(base), base)
    roots = list(bases.values())
    for root in roots:
        buf = Buffer.of(versions.storage_of(root))
        job.in_flight.hold(buf)
        job.wait_for.append(buf)
    if found is not None and (len(found[2]) != len(roots)
                              or any(a is not b for a, b in zip(found[2], roots))):
        found = None  # (found for other roots: never, as `_hot_hit` collects them as this does)
    if roots and not _small(roots, reaper.SLICE):  # (before the commit: realized roots count as values)
        for _, storage in items:  # a big graph: freed off the caller's thread once dead (Storage.reaped)
            if storage is not None:
                storage.reaped = True
    try:
        return _plan(roots, pending, job.record, None if found is None else found[:2]) if roots else None
    except BaseException:
        ledger.unclaim(given)
        raise


def _plan(roots: list[Node], pending: Optional[list[Node]] = None, record: Optional[Recording] = None,
          found: Optional[tuple[Optional[cache.GraphKey], Optional[cache.Template]]] = None) -> Submission:
    start = time.perf_counter_ns()
    result = sched.schedule(roots, pending, record.since_uid if record is not None else None, found)
    if record is not None:  # atensor.jit is capturing this call: keep what it ran
        record.append(result)
    # a graph structured like one realized before (a schedule-cache hit) reuses the Plan lowered from
    # its template: nothing is instantiated or lowered, the submission only fills the plan's slots
    # (not while a capture records the graph or race proofs need it)
    racecheck = current_settings().racecheck
    program = program_of(result.template) if result.template is not None and record is None \
        and not racecheck else None
    if program is not None:  # (a hot template's kept-runner twin, when it may run: program.py)
        program, mapping = program.for_fill(result.fill)
        written_specs = program.written(mapping)
    else:
        mapping = None
        written_specs = list({a.buffer for t in result.graph.tasks for a in t.accesses if a.mode == "w"})
    # buffers this graph writes count as in flight until their writes are noted by the plan, so a
    # sync accessor never reads one between commit (new version visible) and submission
    with InFlight() as written:
        for spec in written_specs:
            written.hold(Buffer.of(spec))
        return _commit_and_execute(result, start, program, mapping, written.buffers, racecheck)


# Template -> its CapturedProgram. Weak: a template the cache evicts takes its program with it. Written
# only by the dispatching thread (one at a time, engine/dispatch.py), so no lock.
_programs: weakref.WeakKeyDictionary[cache.Template, CapturedProgram] = weakref.WeakKeyDictionary()


def program_of(template: cache.Template) -> CapturedProgram:
    """The captured program of `template`, made on its first hit; its plan is lowered from the
    template's slots once, which costs what lowering the instantiated graph would: every later hit
    saves it."""
    found = _programs.get(template)
    if found is None:
        found = _programs[template] = CapturedProgram.of_template(template)
    return found


def _commit_and_execute(result: sched.Schedule, start: int, program: Optional[CapturedProgram],
                        mapping: Optional[dict[Any, BufferSpec]], written: list[Buffer],
                        racecheck: bool) -> Submission:
    if racecheck:  # proofs first: a violation raises before anything is committed or runs
        from atensor.sched.boundscheck import check_graph
        from atensor.sched.racecheck import check_race_free
        check_race_free(result.graph)
        check_graph(result.graph)
    result.commit()
    if collector.is_active():
        collector.record_host(HostSpan(f"schedule {result.task_count} tasks", "schedule", start,
                                       time.perf_counter_ns()))
    try:
        if program is not None:
            return program.submit(mapping)
        return execute(result.graph)
    except BaseException as exc:
        # the commit made the written versions current, but their writes never ran: no buffer this
        # graph writes may be presented as valid (a later write clears the mark, hcq/buffer.py)
        for buf in written:
            buf.failure = exc
        raise
