"""`DirectReplay`: a verified jit program's replay bound and submitted from the caller's thread in a
constant handful of Python calls, and `LastCall`: the previous call's key, checked by identity.

Why: a one-kernel jitted awaited call cost ~175 Python calls (counted with sys.setprofile), of which
the kernel's own foreign call is one. The general replay (jit/captured.py `CallProgram.replay`, a
`Job` run by `Dispatcher.run_inline`, `run_records`, `CapturedProgram.submit`, `Plan.submit`, then a
`RealizeHandle` awaited) builds per call what is the same on every call of one key: the key tuple,
the mapping of captured buffers to this call's, the plan found for the program, the job. For the
common program (one captured realize; no random draws, no Variables, no input passed twice) this
module fixes all of that once, so a call is:

1. the key: the arguments are compared with the previous call's (`LastCall.inputs_of`): the same view
   object (or an equal one), dtype, device and size per argument, training mode and no_grad alike,
   no lazy assign pending that the program touches. No key tuple is built or hashed;
2. the plan's swapped buffers, in its order, taken straight from the inputs and this call's fresh
   result specs (`sources`); a fresh result the record binds, of a size the device's SmallPool
   recycles, gets its memory and its ledger record at its version in one step (hcq/device.py
   `fresh_small`, in C with the compiled core:
   no allocation inside the binding, no version advance after it), and so does a fresh result of a
   one-net-command plan (engine/net_replay.py) of the caching allocator's sizes (`fresh_pooled`); then,
   a lowering choice made once per plan:
   - the plan has a `ReplayRecord` (engine/replay.py: one queue, native one-thread kernels, a light
     plan): its one foreign call binds and runs the program here, and the await is one
     `hcq/loop.py` checkpoint: no job, no handle, no wake-up (`run` returns no handle);
   - otherwise (a CL plan's lean replay, a collective's net command, a plan too big for a record,
     several queues), with at most jit.py's INLINE_MAX_REPLAY_TASKS tasks: `Plan.submit` from here,
     as the general path's inline job would;
3. the result tensors on the fresh buffers (`Node.make_like` of the captured result views);
4. a submitted plan polled (engine/handle.py `finished_here`: each queue's `poll`, which publishes a
   command found done and, on a CL queue, waits on this thread for a short one, hcq/cl_queue.py; a
   collective's net command that finished on this thread, engine/net_replay.py, is found done): done
   and not failed, the await is one checkpoint as a record's; else a handle on the submission, awaited
   as any.

What it keeps from the general path: the order (it runs only while the dispatcher has nothing queued
or being planned, claimed as `run_inline` does; a record only while every queue is idle, as
`Plan.submit` requires); failures (a record declines on a read of a failed task's contents, a stale
version or a pending assign, and the general path raises or flushes; `Plan.submit` raises what it
raises on the general path); the ledger's versions (the program's `assigned` buffers advance exactly
as `run_records` advances them); profiles and DEBUG=2 (a profile makes the jit skip this module; a
record declines under DEBUG=2, so the general path makes their spans and echoes); cancellation (the
checkpoint is the await's cancellation point, as it is for a handle found done). Whenever it
declines, nothing has been changed and the call takes the general path.

Why it stays beside the general replay, measured: it runs the plan's own fast cases through the plan's
entries (`Plan.run_record`, `Plan.submit`, the only submitter), so what it skips is the jit's per-call
key, mapping, job and handle. A one-kernel jitted awaited call on 16 elements under trio (`y = await
step(y)`, the calling thread's CPU per call, 3 alternating rounds of 500 calls in fresh processes, load
~10, AMD EPYC Zen 4, 2 cores, at 4715a1c): 19.6-21.3 us with it, 29.6-35.7 us with it declined
(`DirectReplay.possible` false): it saves 10-14 us a call, half the call. Where the rest went, and what
took it out (bench/jit_replay.py, 4 alternating fresh-process rounds of 1000 calls, AMD EPYC Zen 5, 2
cores, load ~4.6; bench/jit_replay_breakdown.py for the stages): 14.0 -> 9.6 us trio, 13.6 -> 9.7 asyncio,
12.8 -> 9.2 blocking, by the fresh result made in one step in C (hcq/device.py `fresh_small`: its Buffer,
pooled memory and ledger record at its version, ~1.3 us of Python before) and its death in C (the ledger's
record callback and the memory's return to the pool, ~0.3 us), the pool's count under the device's one
lock (~0.3 us), the checkpoint's loop lookup (~0.1 us), and per-call Python here (comprehensions, recipe
unpacking, ~0.5 us). Left, per call: the Plan.run_record path through Queue.run_here (the bind, the
command's run and its publish with GlobalCounters and the signal's stamp: ~3 us), the jit's driver and key
(~1.5 us), the dispatcher claim (~0.4 us), the result Node and Tensor (~0.5 us).

The call handed to the queue's worker (bench/jit_replay.py's `x + 1` on 256 KiB: a submitted plan, no
record) is no slower than at 17a658c, as a round once suggested (trio 116 against 102 us): alternating
fresh-process rounds against /work/wt/base (17a658c), AMD EPYC Zen 5, 2 cores, pair ratios base/this of
the medians, wall and caller CPU: load 1.5-1.7 (3 rounds) trio 1.05x/1.07x, asyncio 1.06x/1.08x,
blocking 1.00x/1.02x; load 4.2-5.9 (5 rounds) 1.00x/1.15x, 0.97x/0.97x, 1.11x/1.21x; single rounds
range 77-156 us, so one round's gap is noise. Where its ~80 us go (strace -f: 5.5 futex calls a call
against 0.02 for the 16-element call): the doorbell's wake of the worker (`Doorbell.post`, ~46 us a call
under cProfile, with the GIL kept), the GIL passed between the caller and the worker (which takes it to
publish after the native program), and the awaiting task parked in its loop's epoll until the worker's
wake-up (then two epoll_ctl). Tried and measured without effect (single-case pairs at load ~4.5-5, not
kept): the awaiting task polling the ring (`Doorbell.finished`) for up to 30 or 100 us before it parks;
the worker spinning 8192 pauses instead of 256 before its futex wait. Not tried: the worker leaving the
GIL alone for a program the host published, which needs the ring to know of the host's publish.

Invariant: a `DirectReplay` is valid for the plan it was made from (`current`, the program's
`CapturedProgram._current` at the time); a re-lowered plan (newer kernels) or a profile makes it
decline, and the jit makes it again from the new plan. It is run by the thread that claimed the
dispatcher (engine/dispatch.py `claim`), so the plan's state needs no lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from atensor import ledger
from atensor.backend.c import registry
from atensor.config import current_settings
from atensor.engine.dispatch import dispatcher
from atensor.engine.handle import RealizeHandle, finished_here
from atensor.engine.program import CapturedProgram
from atensor.engine.replay import ReplayRecord
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.hcq.device import Device, all_idle, fresh_pooled, fresh_small
from atensor.hcq.smallpool import SmallPool
from atensor.ledger import versions
from atensor.tensor.autograd import grad_disabled
from atensor.tensor.tensor import Tensor

_VIEW, _BUFFER = Ops.VIEW, Ops.BUFFER
_FRESH, _INPUT, _FIXED = "fresh", "input", "fixed"
_record_of = ledger.record_of
_make_like = Node.make_like
_pending_heads = versions.pending_heads


def _runtime_of(spec: BufferSpec) -> Any:
    """`spec`'s runtime buffer, or None when it has none yet (nothing ever ran on it)."""
    record = _record_of(spec.uid)
    return None if record is None else record.runtime


@dataclass(eq=False)
class ResultRecipe:
    """How one result tensor's node is made on a replay's buffers: the captured BUFFER node, the view
    over it (None when the result is the buffer itself), and where its buffer comes from: ("fresh",
    k), ("input", i) or ("fixed", 0) (a buffer of the program's own: the captured node as it is)."""
    buffer: Node
    view: Optional[Node]
    source: tuple[str, int]


@dataclass(eq=False)
class DirectReplay:
    """One program's replay on the calling thread; see the module docstring."""
    owner: CapturedProgram                # the program's one captured realize
    current: tuple                        # owner._current when made: (epoch, profiling, plan)
    record: Optional[ReplayRecord]        # the plan's one-call replay; None: Plan.submit it (module docstring)
    sources: list[tuple[bool, int]]       # per swapped buffer, in the record's order: (fresh?, index)
    # (device, size, dtype, made, version) of each fresh result buffer: `made`, the CPU device on which
    # hcq/device.py gives it memory and its ledger record at `version` in one step (`fresh_small`: a
    # result the record binds, of recycled size; `fresh_pooled`: a result of a one-net-command plan,
    # engine/net_replay.py, of the caching allocator's sizes), or None: then the plan's binding allocates
    # it and `assigned` counts its version
    fresh: list[tuple[str, int, Any, Optional[Device], int]]
    # the buffers each replay advances a version of (`CapturedProgram.assigned`, as run_records maps
    # them): ("fresh", k), ("input", i) or ("fixed", the program's own spec)
    assigned: list[tuple[str, Any]]
    results: list[ResultRecipe]
    # the inputs the record reads before writing them (a read of a failed task's contents is refused)
    input_reads: list[int]

    def __post_init__(self) -> None:
        # what `run` reads per call, unpacked once: the fresh results `fresh_small` makes, as (k, device,
        # version, the pool's key of its size), those `fresh_pooled` makes, as (k, device, version), and
        # per result (buffer, view, source kind, index), the kind one of the interned strings _FRESH,
        # _INPUT, _FIXED (compared by identity)
        self.small = [(k, made, version, (size * dtype.itemsize, dtype.np))
                      for k, (_, size, dtype, made, version) in enumerate(self.fresh)
                      if made is not None and size * dtype.itemsize < SmallPool.MAX_NBYTES]
        self.pooled = [(k, made, version) for k, (_, size, dtype, made, version) in enumerate(self.fresh)
                       if made is not None and size * dtype.itemsize >= SmallPool.MAX_NBYTES]
        kinds = {"fresh": _FRESH, "input": _INPUT, "fixed": _FIXED}
        self.made = [(r.buffer, r.view, kinds[r.source[0]], r.source[1]) for r in self.results]

    @staticmethod
    def possible(records: list[CapturedProgram], inputs: list[BufferSpec], has_draws: bool,
                 has_variables: bool) -> bool:
        """Whether a captured call is of the kind a direct replay may run (module docstring): one
        realize, no random draws, no Variables, no input passed twice."""
        return len(records) == 1 and not has_draws and not has_variables and len(set(inputs)) == len(inputs)

    @staticmethod
    def of(records: list[CapturedProgram], inputs: list[BufferSpec], fresh: list[BufferSpec],
           results: list[Node], max_tasks: int) -> Optional[DirectReplay]:
        """The direct replay of a captured call that is `possible`, or None when its plan has not
        decided on a record yet (the jit asks again on a later call), has none and more than
        `max_tasks` tasks (the dispatcher plans it, off the caller's thread), or its buffers are not
        all inputs, fresh results and the program's own."""
        owner = records[0]
        if not owner.lowered():
            return None
        plan = owner.plan()
        record = plan.record
        if plan.swapped is None or record is None or (record is False and len(owner.tasks) > max_tasks):
            return None
        if not isinstance(record, ReplayRecord):
            record = None  # the plan is submitted (Plan.submit) from the calling thread
        at_input = {spec: i for i, spec in enumerate(inputs)}
        at_fresh = {spec: k for k, spec in enumerate(fresh)}
        sources = []
        for spec in plan.swapped:
            if spec in at_fresh:
                sources.append((True, at_fresh[spec]))
            elif spec in at_input:
                sources.append((False, at_input[spec]))
            else:
                return None  # a random draw's counter, say: the general path maps it
        assigned = [("fresh", at_fresh[spec]) if spec in at_fresh else
                    ("input", at_input[spec]) if spec in at_input else ("fixed", spec)
                    for spec in owner.assigned]
        made: list[Optional[Device]] = [None] * len(fresh)
        if record is not None:  # fresh results the record binds (it needs their memory) of a recycled size
            for j, device in record.bound:
                is_fresh, k = sources[j]
                if is_fresh and device.kind == "CPU" and 0 < fresh[k].nbytes < SmallPool.MAX_NBYTES:
                    made[k] = device
        elif plan.net is not None:  # a one-net-command plan binds its fresh results: made with memory too
            for k, spec in enumerate(fresh):
                if spec.device.startswith("CPU:") and spec.nbytes >= SmallPool.MAX_NBYTES:
                    made[k] = Device.get(spec.device)
        versions_of = [sum(1 for kind, at in assigned if kind == "fresh" and at == k) if made[k] is not None
                       else 0 for k in range(len(fresh))]
        assigned = [(kind, at) for kind, at in assigned if kind != "fresh" or made[at] is None]
        recipes = []
        for node in results:
            view = None
            if node.op is _VIEW and len(node.src) == 1:
                view, node = node, node.src[0]
            if node.op is not _BUFFER:
                return None
            spec = node.arg[0]
            source = ("fresh", at_fresh[spec]) if spec in at_fresh else \
                ("input", at_input[spec]) if spec in at_input else ("fixed", 0)
            recipes.append(ResultRecipe(node, view, source))
        input_reads = [] if record is None else \
            [sources[j][1] for j, _ in record.reads_swapped if not sources[j][0]]
        return DirectReplay(owner, owner._current, record, sources,
                            [(spec.device, spec.size, spec.dtype, made[k], versions_of[k])
                             for k, spec in enumerate(fresh)], assigned, recipes, input_reads)

    def valid(self) -> bool:
        """False once the program's plan is not the one this was made from (re-lowered, or a profile)."""
        current = self.owner._current
        return current is self.current and current[0] == registry.REGISTRY.epoch

    def run(self, inputs: list[BufferSpec]) -> Optional[tuple[list[Tensor], Optional[RealizeHandle]]]:
        """Binds `inputs` and fresh result buffers and submits the program from here: (the result
        tensors, None) when the record ran it or the submitted plan is done (the tensors are realized),
        (the result tensors, the handle to await) when the plan is still running; None, with nothing changed, when it cannot run
        now (the general path then submits the call). Raises what the submission raises (a read of a
        failed task's contents; nothing of the replay is then kept)."""
        record = self.record
        if record is not None:
            if current_settings().debug >= 2 or not all_idle():
                return None
            for buf, _ in record.reads_fixed:
                if buf.writes or buf.failure is not None:
                    return None  # the general path refuses the read, or waits for the write
            for i in self.input_reads:  # only an input can hold a failed task's contents
                buf = _runtime_of(inputs[i])
                if buf is not None and (buf.writes or buf.failure is not None):
                    return None
        fresh = []
        for device, size, dtype, _, _ in self.fresh:
            fresh.append(BufferSpec(device, size, dtype))
        new_specs = []
        for is_fresh, k in self.sources:
            new_specs.append(fresh[k] if is_fresh else inputs[k])
        if not dispatcher.claim():
            return None
        plan = self.current[2]
        try:
            for k, small, version, key in self.small:
                fresh_small(small, fresh[k], version, key)
            for k, device, version in self.pooled:
                fresh_pooled(device, fresh[k], version)
            if self.assigned:
                versions.advance_versions([fresh[at] if kind == "fresh" else inputs[at] if kind == "input"
                                           else at for kind, at in self.assigned])
            if record is not None:
                plan.run_record(new_specs)
                handle = None
            else:  # what the general path's job would have planned (run_records of one record)
                submission = plan.submit(dict(zip(plan.swapped, new_specs)))
        finally:
            dispatcher.unclaim()
        tensors = []
        for buffer, view, kind, at in self.made:
            if kind is not _FIXED:
                buffer = _make_like(buffer, (), (fresh[at] if kind is _FRESH else inputs[at], buffer.arg[1]))
            tensors.append(Tensor(buffer if view is None else _make_like(view, (buffer,), view.arg)))
        if record is None:  # after the tensors: the device runs meanwhile
            handle = None if finished_here(submission) else RealizeHandle.of_submission(submission, None)
        return tensors, handle


@dataclass(eq=False)
class LastCall:
    """The previous tensors-only call of a jitted function whose program replays directly: what its
    arguments looked like (per argument: the view over its buffer, or None for a bare buffer, and the
    buffer's dtype, device and size) and the modes it ran in. A call whose arguments look the same
    has the same key (jit/callkey.py `_input_key` reads exactly these), so it needs no key."""
    key: tuple
    program: Any                    # the CallProgram of `key`
    direct: DirectReplay
    views: list[Any]                # per argument: the view's arg (a View), or None for a bare buffer
    leaves: list[tuple[Any, str, int]]  # per argument: its buffer's (dtype, device, size)
    view_dtypes: list[Any]
    training: bool
    no_grad: bool

    @staticmethod
    def of(key: tuple, program: Any, direct: DirectReplay, nodes: list[Node], training: bool) -> Optional[LastCall]:
        """The description of a call of `nodes` (the arguments' nodes), or None when some argument is not
        a buffer or a single view of one."""
        views, leaves, view_dtypes = [], [], []
        for node in nodes:
            view_dtype = None
            if node.op is _VIEW:
                views.append(node.arg)
                view_dtype = node.dtype
                node = node.src[0]
            else:
                views.append(None)
            if node.op is not _BUFFER:
                return None
            spec = node.arg[0]
            leaves.append((node.dtype, spec.device, spec.size))
            view_dtypes.append(view_dtype)
        return LastCall(key, program, direct, views, leaves, view_dtypes, training, grad_disabled())

    def inputs_of(self, args: tuple, training: bool) -> Optional[list[BufferSpec]]:
        """The input buffers of a call of `args` when it has this call's key, nothing it reads is
        pending (no lazy assign it touches, no stale version read) and its direct replay is still
        `valid`, else None."""
        direct = self.direct
        current = direct.current
        if len(args) != len(self.views) or training is not self.training or grad_disabled() is not self.no_grad \
                or direct.owner._current is not current or current[0] != registry.REGISTRY.epoch \
                or (_pending_heads() and pending_for(self.program.accessed, self.program.written)):
            return None
        specs = []
        for arg, view, leaf, view_dtype in zip(args, self.views, self.leaves, self.view_dtypes):
            if type(arg) is not Tensor:
                return None
            node = arg.node
            if view is not None:
                if node.op is not _VIEW or node.dtype is not view_dtype or \
                        (node.arg is not view and node.arg != view):
                    return None
                node = node.src[0]
            if node.op is not _BUFFER:
                return None
            spec, version = node.arg
            if node.dtype is not leaf[0] or spec.size != leaf[2] or spec.device != leaf[1]:
                return None
            record = _record_of(spec.uid)
            if record is not None and (version < record.version or record.head is not None):
                return None  # a stale read (the general path raises StaleReadError), or an assign pending
            specs.append(spec)
        return specs


def pending_for(accessed: frozenset[BufferSpec], written: frozenset[BufferSpec]) -> bool:
    """True when a lazy assign is pending that a replay touching `accessed` and writing `written` must
    wait for (jit/jit.py `_flush_pending` realizes exactly these first): one into an accessed buffer,
    or one reading a written buffer. Others (a stray assign elsewhere) do not concern the replay."""
    heads = versions.pending_heads()
    if not heads:
        return False
    storage_of, specs_read = versions.storage_of, versions.specs_read
    return any(storage_of(head) in accessed or not written.isdisjoint(specs_read(head)) for head in heads)


__all__ = ["DirectReplay", "LastCall", "ResultRecipe", "pending_for"]
