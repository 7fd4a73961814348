"""The realize pipeline: from "these tensors, realized" to a submitted plan and the handle to await.

Why a module of its own: `Tensor.realize()` only says what to realize (tensor/tensor.py); `realize` here
issues it, and the dispatcher thread (engine/dispatch.py) runs `_prepare` later, off the event loop (or the
caller does at once, for a small graph while the dispatcher is idle): an output buffer and an
ASSIGN root per computed tensor, then scheduling (sched/), the race and bounds proofs, commit, and
execution (engine/plan.py): a graph structured like one realized before submits the Plan kept on its
schedule-cache template (`program_of`: a CapturedProgram, engine/program.py) with its own buffers in the template's slots, so it is neither
built as a TaskGraph nor lowered again. The jit (jit/jit.py) records the schedules that this path ran
and keeps their plans.

A tensor is never written from the dispatcher thread except its `_swap` slot: the tensor takes its
new node (a view of its storage) the next time its node is read.
"""
from __future__ import annotations

import time
import weakref
from typing import Any, Optional

from atensor.config import settings
from atensor import ledger
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.rewrite import substitute
from atensor.graph.view import View
from atensor.hcq.buffer import Buffer
from atensor.engine.handle import RealizeHandle
from atensor.engine.dispatch import Job, Recording, dispatcher, recording
from atensor.sched import cache, schedule as sched
from atensor.engine.plan import Submission, execute
from atensor.engine.program import CapturedProgram
from atensor.ledger import versions


def _storage_base(node: Node) -> Optional[Node]:
    base = node.base()
    return base if base.op in (Ops.BUFFER, Ops.ASSIGN) else None


def _follow_storage(node: Node) -> Node:
    """`node` with its storage (if it is a view of one) at the storage's newest version."""
    base = _storage_base(node)
    if base is not None:
        latest = ledger.latest(versions.storage_of(base))
        if base is not latest:
            if node is base:  # the common cases without a general rewrite: the storage itself,
                return latest
            if node.src[0] is base:  # or one view of it
                return latest.view(node.arg)
            return substitute([node], {base: latest})[node]
    return node


# a realize of at most this many nodes to compute (stopping at buffers and realized values) is planned
# on the calling thread when the dispatcher is idle: scheduling a cached graph of that size and
# lowering it costs tens of microseconds, less than the hand-off to the dispatcher thread and back
INLINE_MAX_NODES = 64


def realize(captured: list[tuple[Any, Node]], result: Any) -> RealizeHandle:
    """Issues the realize of `captured` ((tensor, its node) pairs) and returns the handle to await
    (it returns `result`). Small graphs are planned and submitted here, on the caller's thread, when
    nothing is queued before them; the others (and any realize while race proofs are on: z3 takes
    milliseconds, and so does compiling every kernel to C) go to the dispatcher thread, in issue order."""
    pending = versions.pending_heads()
    job = Job(None, [], [])
    job.record = recording.get()
    job.plan = lambda: _prepare(job, captured, pending)
    if settings.racecheck or settings.native == "all" \
            or not _small([n for _, n in captured] + pending, INLINE_MAX_NODES) \
            or not dispatcher.run_inline(job, keep_error=True):
        dispatcher.submit(job)
    return RealizeHandle(job, result)


def _small(nodes: list[Node], limit: int) -> bool:
    """True when at most `limit` nodes are left to compute under `nodes` (the captured ones and the
    pending assigns the realize may take along)."""
    seen: set[Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > limit:
            return False
        if node.op is not Ops.BUFFER and ledger.value(node) is None:
            stack.extend(node.src)
    return True


def _prepare(job: Job, captured: list[tuple[Any, Node]], pending: list[Node]) -> Optional[Submission]:
    """The part of a realize that runs on the dispatcher thread: an output buffer and an ASSIGN root
    per computed tensor, then scheduling and submission. `realize()` itself only records what to
    realize, so realizing 10,000 tensors does not hold the event loop; each tensor takes its storage
    the next time its node is read (the dispatcher never writes a tensor's node: only its `_swap`)."""
    roots: list[Node] = []
    made: list[Node] = []
    swaps: list[tuple[Any, tuple[Node, Node]]] = []
    for t, node in captured:
        if node.op is Ops.MULTI:  # a sharded tensor: every shard is an output of this realize
            parts = tuple(_realize_part(s, roots, job.wait_for, job.done_buffers, made) for s in node.src)
            new = Node.make(Ops.MULTI, node.dtype, parts, node.arg)
        else:
            new = _realize_part(node, roots, job.wait_for, job.done_buffers, made)
        if new is not node:
            swaps.append((t, (node, new)))
    try:
        submission = _plan(roots, pending, job.record) if roots else None
    except BaseException:
        # the tensors keep their lazy nodes (realizing them again raises again, not reads nothing);
        # the output buffers this realize made hold nothing: their ASSIGNs must not stay pending, or
        # every later realize and jit capture would try them again and fail with this error
        for root in made:
            versions.drop_head(versions.storage_of(root), root)
        raise
    for t, swap in swaps:  # only a realize that was submitted gives its tensors their storage
        t._swap = swap
    return submission


def _realize_part(node: Node, roots: list[Node], wait_for: list[Buffer], outputs: list[Buffer],
                  made: Optional[list[Node]] = None) -> Node:
    """Adds what realizing the single-device `node` needs to `roots`, `wait_for` and `outputs` (and
    to `made` the ASSIGNs into output buffers made here); returns the node the tensor holds
    afterwards (a view of its storage)."""
    base = _storage_base(node)
    if base is not None and base.op is Ops.BUFFER:
        wait_for.append(Buffer.of(base.arg[0]))
        return node
    if base is not None:  # a pending assign: realize it
        root = base
        spec = versions.storage_of(base)
    else:
        spec = BufferSpec(node.device, node.size, node.dtype)
        view = View.create((node.size,)).reshape(node.shape)
        root = Node.make(Ops.ASSIGN, node.dtype, (spec.node(0), node), view)
        versions.set_head(spec, root)
        if made is not None:
            made.append(root)
        node = root.view(view)
    roots.append(root)
    buf = Buffer.of(spec)
    buf.hold(1)
    outputs.append(buf)
    wait_for.append(buf)
    return node


def _plan(roots: list[Node], pending: Optional[list[Node]] = None,
          record: Optional[Recording] = None) -> Submission:
    start = time.perf_counter_ns()
    result = sched.schedule(roots, pending, record.since_uid if record is not None else None)
    if record is not None:  # atensor.jit is capturing this call: keep what it ran
        record.append(result)
    # a graph structured like one realized before (a schedule-cache hit) reuses the Plan lowered from
    # its template: nothing is instantiated or lowered, the submission only fills the plan's slots
    # (not while a capture records the graph or race proofs need it)
    program = program_of(result.template) if result.template is not None and record is None \
        and not settings.racecheck else None
    if program is not None:
        mapping = program.mapping_of_fill(result.fill)
        written_specs = program.written(mapping)
    else:
        mapping = None
        written_specs = list({a.buffer for t in result.graph.tasks for a in t.accesses if a.mode == "w"})
    # buffers this graph writes count as in flight until their writes are noted by the plan, so a
    # sync accessor never reads one between commit (new version visible) and submission
    written = [Buffer.of(s) for s in written_specs]
    for buf in written:
        buf.hold(1)
    try:
        return _commit_and_execute(result, start, program, mapping, written)
    finally:
        for buf in written:
            buf.hold(-1)


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
                        mapping: Optional[dict[Any, BufferSpec]], written: list[Buffer]) -> Submission:
    from atensor.profiler import collector
    from atensor.profiler.events import HostSpan
    if settings.racecheck:  # proofs first: a violation raises before anything is committed or runs
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
