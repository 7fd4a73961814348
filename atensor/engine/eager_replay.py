"""`EagerReplay`: an eager realize that hits a hot template, bound and run from the caller's thread.

Why: an eager `x = x + 1; await x.realize()` whose graph hits a hot schedule-cache template already
ends in one foreign call (the twin's `ReplayRecord`, engine/replay.py), but the general path reaches
it through ~30 Python functions around it: a `Job` run by `Dispatcher.run_inline` (with the
collector paused), `_prepare`'s output buffers held in flight, a `Schedule` with a commit closure,
`for_fill`'s mapping dict, the written buffers held in flight again, `CapturedProgram.submit`,
`Plan.submit`'s checks, a `Submission` and a handle on the job (measured at 17a658c on the loaded
2-core Zen 5: 31 us in `_prepare` of a 51 us round trip, schedule 6, commit 3, `Plan.submit` 9.5).
For a template's twin whose plan has a record, what is the same on every hit is fixed here once
(the twin's plan, its record, the place in `Template.fill`'s list of each buffer the record binds),
so a hit is, on the thread that claimed the dispatcher (engine/realize.py `realize`):

1. the graph's key (`walk_key`) and template (`cache.lookup`): what the general path's `schedule`
   computes first, handed on to it when this declines, so nothing is walked twice;
2. the version check and the record's read-first check, which decline (nothing changed) where the
   general path would raise or wait: it then raises exactly what it raises;
3. the record run (`Plan.run_record`: the plan is still the one module that hands commands to a
   queue), then the commit (`record_realized`, with what `Schedule.commit` passes it);
4. no job, no submission: the caller gets a finished handle (engine/handle.py `RealizeHandle.finished`).

A twin on one OpenCL device has no record (its kernels are not native) but the plan's lean CL replay
(engine/cl_replay.py: one command of all launches); a hit of it is steps 1-2, then `Plan.submit` of the
twin's plan from here (its lean case: the plan is the submitter), the commit while the device runs, and
one poll (engine/handle.py `finished_here`, as jit/direct.py polls): a short kernel is waited for on this
thread and published, and the handle is finished; otherwise it is a handle on the submission
(`RealizeHandle.of_submission`), awaited as the general path's.

Measured (bench/round_trip_breakdown.py --count 2000, 3 alternating rounds against 17a658c, C core,
load 8-10, the same Zen 5): 35.1-38.0 us a round trip under trio and asyncio against 52.0-68.0; with
the Python core 53.3-58.7 against 72.8-78.7. On CL (pocl's pthread driver, 16 floats, `bench/opencl.py
--round-trip --calls 2000`, 5 alternating rounds against main at dc6c8e7, C core, load 4.2-4.5, the same
Zen 5): the eager row's median 70.1 (trio) and 58.7 (asyncio) us against 81.1 and 90.9; the calling
thread's CPU per round trip 63 and 59 against 75 and 78. Of the rest (`bench/opencl.py --breakdown`):
`Plan.submit` ~29 (pocl's clEnqueueNDRangeKernel 13-15 of it: a fresh output per hit sets the kernel's
arguments again), the poll ~5-14 (the kernel's own time, waited for), the commit 3, the key 1.5.

A heavy twin (a plan too heavy for a record: the flagship's eager training step, engine/program.py
`twin_heavy`) is run the same way: steps 1-2 (its read-first check is the plan layout's `read_first`,
found once), `Plan.submit` of the twin's plan from here (its kept runners pointed at the hit's buffers,
each queue's kernels one native program), the commit while the queues run, and a handle on the
submission. engine/realize.py tries it for a graph of up to `HOT_MAX_NODES` nodes, and also for a
realize that takes pending assigns along as they are (`opt.step(loss)`: the updates are roots of the
key walk, committed by `record_realized` as `Schedule.commit` would). What it skips is the hand-off to
the dispatcher thread and its wake-up, the `Job`, `_prepare`, `schedule` and `for_fill`: measured on
the flagship's step (1 device, 1 BLAS thread), the caller's `realize()` took 290-350 us of its CPU where
the dispatcher thread's took 330-430 before (the rest is `Plan.submit`'s binding and allocation). In one
process, alternating blocks of 20 steps with this replay declined (the general path, the key walk still
on the caller's thread), 1 BLAS thread, on the 2-core Zen 5: the main thread's CPU with it against the
main and dispatcher threads' without it 1303 against 1081 + 367 us a step at load 8.1 (the process's
2.09 against 2.19 ms), 1657 against 1234 + 414 at load 6.2; the step's wall time 0.965x, 0.88x and 1.09x
in three runs at load 5.3-8.1. With 2 BLAS threads the comparison is confounded: each kernel's thread
count is chosen by timing its runs (backend/gemm/blas.py `MeasuredThreads`), and the choice moved
between blocks (0.94x-1.26x).

A lowering choice of the one mechanism, not a second engine: the template, its program, its twin
and the twin plan's record are the schedule cache's and `Plan.submit`'s own; this only skips the
glue between them. What it keeps from the general path (tests/engine/test_eager_replay.py checks each):
- the order: it runs only with the dispatcher claimed (nothing queued or being planned) and every
  queue idle (`all_idle`), no profile, no capture, no race proofs, DEBUG < 2, no pending assign
  to realize along (`_flush_along`);
- the ledger: the same versions, realized values and heads (`record_realized` with the same
  arguments); the record runs (or the lean replay's submission tells the buffers its pending writes)
  before the commit, so no other thread sees a committed version whose data is not written, or not
  known to be pending, yet (the general path holds those buffers in flight across that window);
- failures: a stale read or a read of a failed task's contents declines, and the general path raises;
  the record's native kernels cannot fail; anything its run or the submission raises is committed and
  kept as the general path keeps a failed submission (written buffers marked failed, raised at the
  await); a CL launch that fails publishes KernelError on its command, the poll leaves it to the
  handle on the submission, and the await raises it, as the general path's (tests/opencl/
  test_cl_eager_replay.py);
- the twin's state: made only from a plan whose record (or lean replay) exists (`Plan.submit` makes
  it on the twin's first submission), and invalid once the plan is not the twin's current one (`valid`: re-lowered for
  newer kernels, or a profile), as jit/direct.py's `DirectReplay` is.

Temporaries: a heavy twin's hit keeps the temporaries it ran with (`Template.fill`'s buffers past the
leaves: only the twin's plan reads or writes them, no tensor or ledger record names them) and the next
hit fills its slots with them again, so `Plan.submit` binds only the user-visible buffers anew: the
kept ones are already where its address slots point (patching.py `AddressSlots.bind` skips a buffer
bound there already) and need no allocation. No hit can still be using them: a hit runs only with
every queue idle (engine/realize.py `_hot_hit`), so the last one's commands are done; the memory is
what the plan's `AddressSlots.bound` held between hits anyway. Not kept: temporaries of a twin that
reads one before writing it (`keeps_temps`: its contents would carry from hit to hit; none does), and
those of a hit whose run raised (marked failed). The general path's submission of the same twin takes
fresh ones, as before; the results are the same bit for bit (tests/engine/test_eager_heavy_replay.py).
Measured on the flagship's eager step (1 device, 1 BLAS thread, the 2-core Zen 5): allocations 15 -> 3
a step and `Plan.submit`'s CPU 258 -> 157, 268 -> 205, 360 -> 257 us a step (three in-process runs of
alternating 20-step blocks, temporaries kept against fresh, load 6.9-8.1); the main and dispatcher
threads' CPU a step 0.936x main at faf3ab4's (median of 12 alternating process pairs of 200 steps, 791
against 827 us, range 0.74-1.16x, load 2.7-3.9) and 0.79x ba44c22's.

Invariant: `run` is called by the thread holding the dispatcher (engine/dispatch.py `claim`), while
every queue is idle; the plan's state needs no lock then.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from atensor.backend.c import registry
from atensor.engine.cl_replay import CLReplay
from atensor.engine.handle import RealizeHandle, finished_here
from atensor.engine.plan import Plan
from atensor.engine.program import CapturedProgram
from atensor.engine.replay import ReplayRecord
from atensor.graph.node import BufferSpec, Node
from atensor.hcq.buffer import Buffer
from atensor.ledger import record_of as _record_of
from atensor.ledger.versions import record_realized
from atensor.sched.cache import GraphKey, Template


@dataclass(eq=False)
class EagerReplay:
    """A hot template's twin plan and its fast case (a record, or the lean CL replay: at most one is
    set; neither for a heavy twin, submitted with its kept runners), with where each buffer it binds
    sits in a hit's fill list (see the module docstring)."""
    twin: CapturedProgram
    current: tuple               # twin._current when made: (epoch, profiling, plan)
    plan: Plan
    record: Optional[ReplayRecord]   # the plan's one-call record, run here (`Plan.run_record`)
    lean: Optional[CLReplay]         # else its lean CL replay, submitted here (`Plan.submit`)
    swapped_fill: list[int]      # per buffer the plan binds (its `swapped` order): its fill index
    written: list[int]           # places in `swapped` of the buffers it writes (marked failed if it raises)
    # a heavy twin's (neither record nor lean replay): the buffers a task reads before the plan writes
    # them, as places in `swapped` (`Plan.submit` refuses a failed one: checked first, to decline)
    read_first: list[int] = field(default_factory=list)
    # a heavy twin's temporaries (buffers only its plan reads and writes, never a user's), kept from
    # its last hit for the next one: see "Temporaries" in the module docstring
    temps: Optional[list[BufferSpec]] = None
    keeps_temps: Optional[bool] = None  # found on the first run: no temporary is read before written

    @staticmethod
    def of(program: CapturedProgram) -> Optional[EagerReplay]:
        """The eager replay of a template's `program` whose twin has a plan with a record or a lean CL
        replay (a light twin), or is heavy (its kept runners submitted by `Plan.submit`), else None (not
        hot yet, or its plan has not been submitted yet or has decided on neither)."""
        twin = program.twin
        if twin is None or not twin.lowered():
            return None
        plan = twin.plan()
        record, lean = plan.record, plan.lean
        if plan.swapped is None:
            return None
        read_first: list[int] = []
        if program.twin_heavy:
            record = lean = None
            place = {bi: j for j, bi in enumerate(plan.swapped_index)}
            written_at = set(plan.layout.written_index)
            written = [j for j, bi in enumerate(plan.swapped_index) if bi in written_at]
            read_first = [place[bi] for bi, _ in plan.layout.read_first if bi in place]
            if len(read_first) != len(plan.layout.read_first):
                return None  # (a twin's buffers are all placeholders: every one is swapped)
        elif isinstance(record, ReplayRecord):
            lean, written = None, list(record.written_swapped)
        elif record is False and lean is not None:
            record = None
            written = [j for j, entries in lean.notes_swapped if any(write for _, write in entries)]
        else:
            return None
        at = {placeholder: index for placeholder, (_, index) in zip(program.placeholders, program.slot_fill)}
        return EagerReplay(twin, twin._current, plan, record, lean, [at[spec] for spec in plan.swapped],
                           written, read_first)

    def valid(self) -> bool:
        """False once the twin's plan is not the one this was made from (re-lowered, or a profile)."""
        current = self.twin._current
        return current is self.current and current[0] == registry.REGISTRY.epoch

    def run(self, key: GraphKey, template: Template, roots: list[Node], result: Any) -> RealizeHandle | bool:
        """Runs the hit of `template` whose graph `key` describes (its `roots`, the assigns it realizes)
        and commits what it realizes, as `Schedule.commit` would; returns the handle that awaits it and
        returns `result`: finished when it ran to its end here, else on the lean replay's submission.
        Returns False, with nothing changed, when it declines: a stale read (`check_versions`) or a read
        of a failed task's contents (`Plan.submit`'s read-first check), which the general path raises.
        What the run or the submission raises is committed all the same, its written buffers marked
        failed, as the general path leaves a failed submission: an error is raised at the await, an
        interrupt (not an Exception) from here."""
        record_of = _record_of
        for node in key.buffer_nodes:  # `check_versions`, without its raise
            spec, version = node.arg
            found = record_of(spec.uid)
            if found is not None and version < found.version:
                return False
        replay = self.record if self.record is not None else self.lean
        if replay is None and self.keeps_temps is None:
            leaves = template.leaf_count
            self.keeps_temps = all(self.swapped_fill[j] < leaves for j in self.read_first)
        fill, realized, _ = template.fill(key, self.temps)
        new_specs = [fill[i] for i in self.swapped_fill]
        if replay is None:  # a heavy twin
            reads = [(Buffer.of(new_specs[j]), None) for j in self.read_first]
        else:
            reads = replay.reads_fixed if not replay.reads_swapped else replay.reads_of(new_specs)
        for buf, _ in reads:
            if buf.writes:
                buf.pending_writes()  # folds a finished write that failed into `failure`
            if buf.failure is not None:
                return False
        failure: Optional[BaseException] = None
        submission = None
        try:
            if self.record is not None:
                self.plan.run_record(new_specs)
            else:  # the lean case or a heavy twin's kept runners (the checks pass, as above); the
                # queues run while this commits
                submission = self.plan.submit(dict(zip(self.plan.swapped, new_specs)))
        except BaseException as exc:  # (native kernels cannot fail: a failed allocation, an interrupt)
            failure = exc
        record_realized(realized, key.order, {}, roots, roots)
        if self.keeps_temps:  # (a failed run's are dropped: the next hit takes fresh ones)
            self.temps = fill[template.leaf_count:] if failure is None else None
        if failure is not None:
            for j in self.written:
                Buffer.of(new_specs[j]).failure = failure
            if not isinstance(failure, Exception):
                raise failure  # (an interrupt: raised from the call, as the general path's inline plan does)
        if submission is None or finished_here(submission):
            return RealizeHandle.finished(result, failure)
        return RealizeHandle.of_submission(submission, result)


__all__ = ["EagerReplay"]
