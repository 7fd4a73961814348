"""The `Plan`: a TaskGraph lowered to one command list per queue, submitted once or many times.

Why one mechanism: an eager realize and an `atensor.jit` replay put the same kind of graph on the
same queues. Lowering finds, once per graph, the queue of every task and its place in that queue's
list, which tasks of other queues it waits for (waits merged: the newest per queue), its size, its
runner (engine/lower.py), and which buffers to tell about its work. What changes from one submission
to the next is computed by `submit`:

- the signal values: each queue's values are reserved as one block (`Queue.reserve`), so a task's
  value is the block's base plus its fixed place in the queue's list (waits between tasks likewise);
- the waits on work still pending from earlier realizes, from each buffer's pending writers and
  readers (reads wait for pending writes and fail with them; writes also wait for pending reads);
- for a jit replay, the buffers: `mapping` swaps captured buffers for the replay's. A kept native
  runner is pointed at them by rewriting its address slots (patching.py); other runners of tasks that
  touch a swapped buffer are made again from their works copied with the new buffers.

An eager realize makes a plan and submits it once (`execute`), or, for a graph structured like one
realized before, submits the `CapturedProgram` (engine/program.py) of its schedule-cache template,
whose plan is lowered from the template's slots (every buffer is in each submission's mapping, runners
are made per submission, and each submission is an eager one); a jit keeps one CapturedProgram per
captured realize, whose plans keep their runners, and submits them on every replay. All go through
`submit`, and this is the only module that hands command lists to queues (`Queue.reserve`, `submit`,
`run_here`, `start_here`; tests/test_one_submitter.py): the one-call record (engine/replay.py) and the
lean CL replay (engine/cl_replay.py) make the commands of their fast cases, and `submit` reserves
their values and hands them to the queue through the same interface as every other command.

Lowering choices, all inside `submit` (a plan submitted once keeps one command per task):
- a replay of a light plan (layout.py's bytes and flops bounds, at most replay.py's RECORD_MAX_TASKS
  tasks) on one queue whose runners are all one-thread native ones, with every queue idle and no
  profile: its `ReplayRecord` (engine/replay.py) binds the swapped buffers and runs the whole program
  on this thread in ONE foreign call (backend/c/replay.py), then publishes; without a C compiler (or
  for any other plan) the choices below, in Python, with the same semantics;
- a replay of a kept-runner plan on ONE OpenCL queue, with every queue idle and no profile: its `CLReplay`
  (engine/cl_replay.py) enqueues every task's launches as one command of that queue;
- a tiny plan (at most layout.py's INLINE_MAX_TASKS kernels and copies, bytes and flops bounded, no Variables in
  a replay's) whose queues are idle and whose buffers have nothing pending runs on the planning
  thread itself (`Queue.run_here`), in task order (one command per task; a replay on one queue
  batches its native kernels into one): eager or replayed, the await then finds it done;
- when nothing is pending, no profile is taken and every task is native (compiled kernels, memcpy
  copies), each queue gets ONE command, a native program: its waits on other queues and the values
  other queues wait for go through C timelines (backend/c/programs.py `Program`), so a multi-device step
  runs without the GIL or a Python wake-up between its tasks; jit replays then use the producer
  layout, where a copy between CPU devices runs on the queue that made its data;
- otherwise native kernels that follow each other on a queue are one command (`programs.batch`); a run
  ends at a task another queue waits for (its value is published as soon as it is done) and starts at
  a task that waits for another queue.
- a replay of ONE task on an idle queue whose runner can start on this thread (`Runner.here`: a net
  command) starts it here (`Queue.start_here`; with native programs, from its `NetAlone` record,
  engine/net_replay.py: none of the choices above is made again per replay); the runner submits its command only when it is
  still in flight after its bound (or before it starts, for a long one), and the queue's worker
  takes it over from this thread and finishes it; in a replay of native programs of more tasks, a
  queue's first task that is such a command and waits for nothing is started here the same way,
  once every list is submitted (its program's first op takes it over).
A command publishes the value of its last task; the values before it are reached at the same moment
on the Python timeline and carry no stamp of their own (a profile, which needs a span per kernel,
turns both off).

Failure propagation: a task that reads a buffer whose contents come from a failed task is refused
before anything is submitted; a command whose wait fails does not run and publishes DependencyFailed.

Each buffer is told only of the last write and the last read per queue, which is all it keeps; in a
submission of native programs the buffers every replay touches follow the plan's clock instead
(hcq/buffer.py), told once: only the swapped buffers learn each replay's values.

Invariant: only the dispatching thread (the dispatcher, or a caller planning inline while it holds
the dispatcher, engine/dispatch.py) calls `submit`, so reserving values and noting buffers need no lock.
"""
from __future__ import annotations

import ctypes
import time
from typing import Callable, Collection, Optional

from atensor.config import current_settings, settings
from atensor.backend.c import programs
from atensor.backend.runner import Runner
from atensor.graph.node import BufferSpec
from atensor.graph.taskgraph import Task, TaskGraph
from atensor.engine import cl_replay, lower_cl
from atensor.engine.layout import Layout
from atensor.engine.net_replay import NetAlone, net_alone_for
from atensor.engine.lower import fill_slots, runner_for, swap_buffers
from atensor.engine.patching import AddressSlots
from atensor.engine.replay import RECORD_MAX_TASKS, ReplayRecord, record_for
from atensor.engine.submission import Submission
from atensor.hcq.buffer import Buffer, Clock
from atensor.hcq.device import all_idle
from atensor.hcq.queue import Command, Queue
from atensor.hcq.signal import Signal
from atensor.profiler import collector
from atensor.profiler.events import HostSpan


_next_task_id = 0


def take_task_ids(count: int) -> int:
    """The first of `count` new task ids. Ids are unique per process, so a profile never confuses two
    realizes; only the dispatching thread plans, so no lock."""
    global _next_task_id
    base = _next_task_id
    _next_task_id += count
    return base


def wait_for_pending(waits: dict, own: Signal, reading: bool, pending_writes: list,
                     pending_reads: list) -> None:
    """Adds to `waits` (signal -> (value, check)) the work still pending on a buffer that a task on the
    queue of `own` reads (`reading`) or writes: a read waits for pending writes (and fails with them);
    a write also waits for pending reads. Work on the task's own queue is ordered already."""
    for sig, v in pending_writes:
        if sig is not own:
            old = waits.get(sig)
            if old is None or old[0] < v:
                waits[sig] = (v, reading or (old is not None and old[1]))
    if not reading:
        for sig, v in pending_reads:
            if sig is not own:
                old = waits.get(sig)
                if old is None or old[0] < v:
                    waits[sig] = (v, old is not None and old[1])


_KEPT = ("kept runners",)  # the key of a program built of the plan's kept runners (`_programs_of`)


def _refuse_failed_read(buf: Buffer, name: str) -> None:
    """Raises when `buf`, which task `name` reads before the graph writes it, holds the contents of a
    task that failed: nothing of the graph is submitted then."""
    if buf.writes:
        buf.pending_writes()  # folds a finished write that failed into `failure`
    failure = buf.failure
    if failure is not None:
        raise RuntimeError(f"{name} reads {buf.name}, whose contents come from a task that failed: "
                           f"{failure}") from failure


def execute(graph: TaskGraph) -> Submission:
    """An eager realize's graph, planned and submitted once; returns what to await."""
    return Plan(graph.tasks).submit()


class Plan:
    """`tasks` (a graph's, in topological order) lowered once into a `Layout` (engine/layout.py), and the
    state its submissions keep (runners, address slots, native programs). `slots` are the buffers that
    `submit`'s mapping replaces (a captured program's, engine/program.py; none for a graph submitted once).
    `keep_runners`: the plan is submitted many times and keeps its runners, rebinding the slots'
    addresses in them (a jit program); without it each submission is an eager realize's (one command
    per task), and runners are made per submission, from the works with the mapped buffers when
    there are slots (a schedule-cache template's program). `copies_on_producer`: the producer layout."""

    def __init__(self, tasks: list[Task], slots: Collection = frozenset(), copies_on_producer: bool = False,
                 keep_runners: bool = False):
        self.layout = Layout(tasks, slots, copies_on_producer, keep_runners)
        self.epoch = self.layout.epoch  # the compiled kernels it was lowered with (a newer epoch re-lowers)
        self.batches: dict[tuple[int, ...], tuple[tuple[int, ...], Runner]] = {}
        # per queue: (the ids of the runners it was built of, program)
        self.programs: dict[int, tuple[tuple[int, ...], programs.Program]] = {}
        self.summaries: dict[int, tuple[str, int, int]] = {}  # per queue: its program's name, bytes, flops
        self.last_final: list[tuple[Signal, int]] = []  # the values the last submission ends at
        # found on the first submission (the mapping's keys are the same on every submission):
        self.swapped: Optional[list[BufferSpec]] = None    # the buffers submissions swap, captured names
        self.swapped_index: list[int] = []                  # their places in `buffers`
        self.fixed_bufs: list[Buffer] = []                  # the Buffer of each captured spec
        # made on the first submission of native programs (`_note_program`):
        self.clock: Optional[Clock] = None                  # what the buffers every replay touches follow
        self.swapped_notes: list = []                       # `notes` of the swapped buffers
        self.written_fixed: list[Buffer] = []               # the buffers every replay writes
        # the runners, made on the first submission from the captured works; `remake[i]`: task i
        # touches a swapped buffer and its runner has no address slots (a numpy kernel), so every
        # submission makes it again from its work with the new buffers
        self.kept: Optional[list[Optional[Runner]]] = None
        self.rebinds: list = []  # the kept native runners' `rebind`s (kernels with Variables)
        self.remake: list[int] = []
        self.slots: Optional[AddressSlots] = None  # where the swapped buffers' addresses sit (patching.py)
        self.all_native = False
        self.kept_here = False  # some kept runner starts on the submitting thread (a net command)
        # the one-call replay of a light one-queue plan (engine/replay.py): None until the runners are
        # made, then the record or False when the plan does not qualify (or the helper did not load)
        self.record: Optional[ReplayRecord] | bool | None = None
        # the lean replay of a plan on one OpenCL queue (engine/cl_replay.py), made with `record`
        self.lean: Optional[cl_replay.CLReplay] = None
        # the lean replay of a plan whose one task is a net command started here (engine/net_replay.py)
        self.net: Optional[NetAlone] = None

    # ---- runners ---------------------------------------------------------------------------------
    def _lower_runners(self) -> None:
        """Makes every task's runner from its captured work, and finds the address slots of the
        swapped buffers in the native ones (they are kept: each submission rewrites the slots)."""
        L = self.layout
        start = time.perf_counter_ns()
        lower_cl.prepare([task.work for task in L.tasks])  # a plan's new OpenCL kernels: one build
        kept = [runner_for(task.work) for task in L.tasks]
        if collector.is_active():
            collector.record_host(HostSpan("compile kernels", "compile", start, time.perf_counter_ns()))
        self.kept = kept
        self.rebinds = [r.rebind for r in kept if r is not None and r.rebind is not None]
        self.kept_here = any(r is not None and r.here is not None for r in kept)
        # a kernel of more BLAS threads fits in a program when the C runner can set them (programs.Program)
        threads_ok = programs.program_threads()
        self.all_native = all(r is not None and r.native is not None and (r.threads == 1 or threads_ok)
                              for r in kept)
        if self.swapped:
            patchable = [t and r is not None and (r.native is not None or r.device_args is not None)
                         for t, r in zip(L.touched, kept)]
            self.remake = [i for i, t in enumerate(L.touched) if t and not patchable[i]]
            self.slots = AddressSlots.find(kept, self.swapped, patchable)

    def _runners(self, mapping: dict[BufferSpec, BufferSpec], new_specs: list[BufferSpec]) -> list:
        """This submission's runner per task: the kept ones, pointed at `new_specs` (the swapped
        buffers' replacements) when the last submission is done with them; otherwise (still running)
        fresh runners for the tasks that touch a swapped buffer."""
        L = self.layout
        if L.from_slots:  # nothing is kept: each runner is made from its work with this mapping's buffers
            fill = mapping.__getitem__
            works = [fill_slots(task.work, fill) for task in L.tasks]
            lower_cl.prepare(works)
            return [runner_for(work) for work in works]
        if self.kept is None:
            self._lower_runners()
        for rebind in self.rebinds:  # bound Variables' new values into the kept native blocks
            rebind()
        kept = self.kept
        if not self.swapped:
            return kept
        get = mapping.get
        if all(sig.value >= value for sig, value in self.last_final):  # no command still uses the slots
            self.slots.bind(new_specs)
            if not self.remake:
                return kept
            runs = kept.copy()
            for i in self.remake:
                runs[i] = runner_for(swap_buffers(L.tasks[i].work, get))
            return runs
        return [runner_for(swap_buffers(task.work, get)) if touched else run
                for task, touched, run in zip(L.tasks, L.touched, kept)]

    def _make_record(self) -> ReplayRecord | bool:
        """The plan's `ReplayRecord` when it qualifies (a kept-runner light plan on one queue whose
        runners are all native, none made again per submission), else False; made once."""
        L = self.layout
        found = None
        if not L.once and L.light and len(L.tasks) <= RECORD_MAX_TASKS and len(L.queues) == 1 \
                and not self.remake and self.all_native:
            swapped = set(self.swapped_index)
            written = set(L.written_index)
            place = {bi: j for j, bi in enumerate(self.swapped_index)}
            reads = [(self.fixed_bufs[bi], name) if bi not in place else (place[bi], name)
                     for bi, name in L.read_first]
            found = record_for(L.queues[0], self.kept, self.slots, self.swapped,
                               [self.fixed_bufs[bi] for bi in L.written_index if bi not in swapped],
                               [j for j, bi in enumerate(self.swapped_index) if bi in written],
                               self._program_summary(0), reads)
        self.record = found if found is not None else False
        if found is None and not L.once and self.kept is not None:
            self.lean = cl_replay.lean_for(L.queues, self.kept, self.remake, self.slots, self.swapped,
                                           self.fixed_bufs, L.notes, self.swapped_index, L.read_first,
                                           self._program_summary(0), L.tasks[0])
            if self.lean is None and not L.from_slots:
                self.net = net_alone_for(L.queues, self.kept, self.remake, self._program_summary(0), L.tasks[0],
                                         L.notes)
        return self.record

    # ---- submission ------------------------------------------------------------------------------
    def run_record(self, new_specs: list[BufferSpec]) -> int:
        """The plan's `ReplayRecord` run on this thread with `new_specs` (the swapped buffers'
        replacements, in `swapped`'s order); returns the value its queue is at when it returns. The
        caller checked what `submit` checks first: every queue idle, no profile, DEBUG < 2, no read of
        a failed task's contents (`submit` does; so does jit/direct.py, its fast caller)."""
        record = self.record
        queue = record.queue
        command = record.command(queue.reserve(record.count), new_specs)
        queue.run_here([command])
        value = command.value
        self.last_final = [(record.signal, value)]
        return value

    def submit(self, mapping: Optional[dict[BufferSpec, BufferSpec]] = None) -> Submission:
        """Puts the tasks on the queues, with the buffers `mapping` swaps (captured -> new); returns
        what to await. The mapping's keys must be the same on every submission of a plan."""
        L = self.layout
        mapping = mapping or {}
        record = self.record
        if record and not collector.is_active() and current_settings().debug < 2 and all_idle():
            # a light replay on one idle queue: one foreign call binds and runs it (engine/replay.py)
            new_specs = [mapping[s] for s in self.swapped]
            for buf, name in record.reads_of(new_specs):
                if buf.writes or buf.failure is not None:
                    _refuse_failed_read(buf, name)
            return Submission({record.queue: self.run_record(new_specs)}, [])
        lean = self.lean
        if lean is not None and not collector.is_active() and current_settings().debug < 2 and all_idle():
            # a replay on one idle OpenCL queue: its launches as one command (engine/cl_replay.py)
            new_specs = [mapping[s] for s in self.swapped]
            for buf, name in lean.reads_of(new_specs):
                if buf.writes or buf.failure is not None:
                    _refuse_failed_read(buf, name)
            buffers = lean.bind(new_specs)
            queue = lean.queue
            base = queue.reserve(lean.count)
            # a short one is launched, waited for and published here, in C (CLQueue.run_here)
            queue.run_here([lean.command(base, buffers)])
            if not lean.overwrote(base, buffers, new_specs):
                lean.note(base, buffers, new_specs)
            value = base + lean.count
            self.last_final = [(lean.signal, value)]
            return Submission({queue: value}, lean.placed(value))
        net = self.net
        if net is not None and not collector.is_active() and current_settings().debug < 2 and all_idle():
            return self._submit_net_alone(net, mapping)
        if self.swapped is None:  # the buffers of the graph that submissions swap
            self.swapped_index = [bi for bi, s in enumerate(L.buffers) if s in mapping]
            self.swapped = [L.buffers[bi] for bi in self.swapped_index]
            # a plan of slots has no buffers of its own (every one is in the mapping)
            self.fixed_bufs = [] if L.from_slots else [Buffer.of(s) for s in L.buffers]
        new_specs = [mapping[s] for s in self.swapped]
        bufs = self._buffers_of(new_specs)
        if all_idle():  # the common case between steps: nothing can be pending, no snapshot to take
            if record is None and self.kept is not None:
                self._make_record()  # used from the next submission on
            before, quiet = [], True
        else:
            before = [b.pending() for b in bufs]
            quiet = not any(w or r for w, r in before)  # nothing pending: only the graph's own waits
        # a tiny plan (eager, or a jit replay's) runs here, on the planning thread, when its queues have
        # nothing before it: the caller's await then finds it done, with no hand-off to a worker and no
        # wake-up back (~100-150 us of a one-kernel replay's ~210, measured with bench/jit_replay.py)
        here: Optional[list] = [] if quiet and L.tiny and all(q.idle() for q in L.queues) else None
        # a replayed plan of one task on an idle queue may start it on this thread (Runner.here: a net
        # command), without the hand-off to the queue's worker and the wake-up back
        alone = quiet and not L.once and len(L.tasks) == 1 and L.queues[0].idle()
        runs = self._runners(mapping, new_specs)
        alone = alone and runs[0] is not None  # a task that runs nothing (on a NULL device) has no runner
        # a replay of more tasks whose queue starts with a net command that waits for nothing may
        # start that collective on this thread once every list is submitted, while the workers wake
        lead = None if alone or not quiet or L.once else self._lead(runs)
        bases = [queue.reserve(count) for queue, count in zip(L.queues, L.counts)]
        signals = L.signals
        base_id = take_task_ids(len(L.tasks))
        placed: list = [None] * len(L.tasks)
        profiling = collector.is_active()  # dependency ids only feed the profile's arrows
        echo = settings.debug >= 2  # DEBUG=2: each command printed as it finishes (profiler/counters.py)
        sub = Submission(placed=placed)
        self.last_final = list(zip(signals, [b + c for b, c in zip(bases, L.counts)]))
        # a replay batches its native kernels (run here too when its one queue's are: one foreign call)
        batching = quiet and not profiling and not L.once and (here is None or len(L.queues) == 1)
        if batching and here is None and self.all_native and programs.programs_available():
            slots = [programs.timeline_slot(q) for q in L.queues]
            if None not in slots:
                lists = self._programs_of(runs, slots, bases, base_id, signals, placed, sub)
                self._note_program(bufs, signals, bases)
                if alone and runs[0].here is not None:  # its program is one RUN op: that runner's work
                    lists[0][0].start_here(lists[0][1][0], runs[0].here, lists[0][1])
                    return sub  # done here, or submitted by start_here
                if lead is not None:  # its program's first op runs it: the worker takes it over
                    lead(lambda: [queue.submit(commands) for queue, commands in lists], False)
                    return sub
                # handed over last and back to back: the queues start at once (doorbell.py), so
                # the host's bookkeeping above does not compete with them for the cores
                for queue, commands in lists:
                    queue.submit(commands)
                return sub
        # queue by queue, each list handed over as soon as it is built: the first device starts while
        # the next one's list is made (waits across queues are by value, so the order is free)
        lists = []
        for qi, members in enumerate(L.by_queue):
            own = signals[qi]
            commands: list[Command] = []
            group: list[tuple[int, Runner]] = []  # native kernels run as one command
            for i in members:
                run = runs[i]
                if batching:
                    if run is not None and run.native is not None and run.threads == 1:
                        if group and L.waits_inside[i]:
                            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                        group.append((i, run))
                        if L.ends_batch[i]:
                            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                        continue
                    self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                value = bases[qi] + L.task_pos[i] + 1
                if quiet:
                    waits = tuple([(signals[dq], bases[dq] + dpos + 1, True)
                                   for dq, dpos in L.waits_inside[i]])
                else:
                    waits = self._waits(i, own, signals, bases, before)
                name, kind, nbytes, flops, deps = L.static[i]
                commands.append(Command(value, waits, run, name, kind, base_id + i, nbytes, flops,
                                        tuple([base_id + d for d in deps]) if profiling else (), 1, echo))
                placed[i] = (own, value, L.tasks[i])
            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
            queue = L.queues[qi]
            sub.final[queue] = bases[qi] + L.counts[qi]
            if here is not None:  # one command per task, or (one queue) per batch, in task order
                here.extend((members[k], queue, command) for k, command in enumerate(commands))
            elif L.once:
                lists.append((queue, commands))  # handed over once every buffer is told (below)
            elif alone and runs[0].here is not None:
                queue.start_here(commands[0], runs[0].here, commands)  # done here, or submitted by it
            else:
                queue.submit(commands)
        self._note(bufs, signals, bases)
        if here is not None:  # in task order, which is topological: every wait is reached already
            here.sort(key=lambda entry: entry[0])
            for _, queue, command in here:
                queue.run_here([command])
            return sub
        for queue, commands in lists:
            queue.submit(commands)
        return sub

    def _buffers_of(self, new_specs: list[BufferSpec]) -> list[Buffer]:
        """The Buffer of each of the graph's buffers in a submission with `new_specs` (the swapped
        ones' replacements); raises, before anything is submitted, when a task reads a buffer before
        the graph writes it whose contents come from a task that failed."""
        bufs = self.fixed_bufs
        if self.layout.from_slots:
            bufs = [Buffer.of(spec) for spec in new_specs]
        elif new_specs:
            bufs = bufs.copy()
            for bi, spec in zip(self.swapped_index, new_specs):
                bufs[bi] = Buffer.of(spec)
        for bi, name in self.layout.read_first:
            buf = bufs[bi]
            if buf.writes or buf.failure is not None:
                _refuse_failed_read(buf, name)
        return bufs

    def _submit_net_alone(self, net: NetAlone, mapping: dict[BufferSpec, BufferSpec]) -> Submission:
        """A replay of the plan's one net command, started on this thread (engine/net_replay.py): the
        kept runner pointed at the swapped buffers, one value, the buffers told, `Queue.start_here`."""
        L = self.layout
        new_specs = [mapping[s] for s in self.swapped]
        bufs = self._buffers_of(new_specs)
        if self.slots is not None:
            self.slots.bind(new_specs)  # every queue is idle: no command still uses the slots
        queue = net.queue
        base = queue.reserve(1)
        command = net.command(base, take_task_ids(1))
        value = base + 1
        # the buffers are told only if the command leaves this thread (engine/net_replay.py says why)
        net.tell_later(self._note_program if net.program else self._note, bufs, L.signals, [base])
        self.last_final = [(net.signal, value)]
        sub = Submission({queue: value}, [(net.signal, value, net.task)])
        queue.start_here(command, net.start, [command])  # done here, or submitted by it
        return sub

    def _lead(self, runs: list) -> Optional[Callable[[Callable[[], None], bool], bool]]:
        """The `Runner.here` of a task that is the first of its idle queue and waits for no other
        queue's (a net command), else None; called before values are reserved."""
        L = self.layout
        for qi, members in enumerate(L.by_queue):
            first = runs[members[0]]
            if first is not None and first.here is not None and not L.waits_inside[members[0]] \
                    and L.queues[qi].idle():
                return first.here
        return None

    def _note(self, bufs: list[Buffer], signals: list[Signal], bases: list[int]) -> None:
        """Tells each buffer the values of its last write and last read per queue in this submission."""
        L = self.layout
        for bi, entries in L.notes:
            bufs[bi].note_all([(signals[qi], bases[qi] + offset, write) for qi, offset, write in entries])

    def _note_program(self, bufs: list[Buffer], signals: list[Signal], bases: list[int]) -> None:
        """`_note` for a submission of native programs (nothing in it can fail): the buffers every
        replay touches follow the plan's clock, told once, so only the clock and the swapped buffers
        learn this submission's values."""
        L = self.layout
        if self.clock is None:
            self.clock = Clock(signals, self)
            swapped = set(self.swapped_index)
            for bi, entries in L.notes:
                if bi not in swapped:
                    self.fixed_bufs[bi].follow(self.clock, tuple((qi, off) for qi, off, w in entries if w),
                                               tuple((qi, off) for qi, off, w in entries if not w))
            self.swapped_notes = [(bi, entries) for bi, entries in L.notes if bi in swapped]
            self.written_fixed = [self.fixed_bufs[bi] for bi, entries in L.notes
                                  if bi not in swapped and any(w for _, _, w in entries)]
        self.clock.advance(bases, [b + c for b, c in zip(bases, L.counts)])
        Buffer.all_overwritten(self.written_fixed)
        for bi, entries in self.swapped_notes:
            bufs[bi].note_all([(signals[qi], bases[qi] + offset, write) for qi, offset, write in entries])

    def _programs_of(self, runs: list, slots: list[int], bases: list[int], base_id: int,
                     signals: list[Signal], placed: list, sub: Submission) -> list[tuple[Queue, list[Command]]]:
        """Every task is native: each queue gets one command, a native program whose waits on other
        queues and whose values other queues wait for go through the C timelines (programs.Program).
        Returns the (queue, command list) pairs to submit."""
        L = self.layout
        lists = []
        bases_c = (ctypes.c_uint64 * len(bases))(*bases)
        # the kept runners (not made again for this submission) need no check per runner; and as
        # nothing in their programs can fail unless one starts a net command (`Runner.here`), the
        # tasks' places are not listed for `first_failure` (O(tasks) Python per replay otherwise)
        kept_runs = runs is self.kept
        if kept_runs and not self.kept_here:
            sub.placed = placed = []
        for qi, members in enumerate(L.by_queue):
            ids = _KEPT if kept_runs else tuple([id(runs[i]) for i in members])
            kept = self.programs.get(qi)
            program = kept[1] if kept is not None and kept[0] == ids else None
            if program is None:
                ops: list[tuple[int, int, int, int]] = []
                program_runs: list = []
                for i in members:
                    for dq, dpos in L.waits_inside[i]:
                        ops.append((programs.WAIT, slots[dq], dq, dpos + 1))
                        program_runs.append(None)
                    ops.append((programs.RUN, 0, 0, 0))
                    program_runs.append(runs[i])
                    if L.ends_batch[i]:  # another queue waits for it
                        ops.append((programs.PUBLISH, slots[qi], qi, L.task_pos[i] + 1))
                        program_runs.append(None)
                program = programs.Program(ops, program_runs)
                self.programs[qi] = (ids, program)  # valid while these runners are the ones in use
            else:
                program.retune()  # the measured thread counts for this run
            first = members[0]
            value = bases[qi] + L.counts[qi]
            name, nbytes, flops = self._program_summary(qi)
            if placed:
                own = signals[qi]
                for i in members:
                    placed[i] = (own, value, L.tasks[i])
            queue = L.queues[qi]
            sub.final[queue] = value
            lists.append((queue, [Command(value, (), program.bind(bases_c), name, "kernel", base_id + first,
                                          nbytes, flops, (), len(members), settings.debug >= 2)]))
        return lists

    def _program_summary(self, qi: int) -> tuple[str, int, int]:
        """The name, bytes and flops of queue qi's program command (the same on every submission)."""
        L = self.layout
        found = self.summaries.get(qi)
        if found is None:
            members = L.by_queue[qi]
            first = members[0]
            name = L.static[first].name if len(members) == 1 else \
                f"{len(members)} tasks from {L.static[first].name}"
            found = self.summaries[qi] = (name, sum(L.static[i].nbytes for i in members),
                                          sum(L.static[i].flops for i in members))
        return found

    def _flush(self, group: list[tuple[int, Runner]], commands: list[Command], base: int,
               base_id: int, signals: list[Signal], bases: list[int], placed: list, own: Signal) -> None:
        """The native kernels of `group` ((task, runner) pairs) as one command; empties it."""
        L = self.layout
        if not group:
            return
        tasks = [i for i, _ in group]
        first, last = tasks[0], tasks[-1]
        key = tuple(tasks)
        ids = tuple([id(r) for _, r in group])
        kept = self.batches.get(key)
        run = kept[1] if kept is not None and kept[0] == ids else None
        if run is None:
            run = group[0][1] if len(group) == 1 else programs.batch([r for _, r in group])
            self.batches[key] = (ids, run)  # valid while these runners are the ones in use
        waits = tuple([(signals[dq], bases[dq] + dpos + 1, True) for dq, dpos in L.waits_inside[first]])
        value = base + L.task_pos[last] + 1
        name = L.static[first].name if len(group) == 1 else f"{len(group)} kernels from {L.static[first].name}"
        nbytes = sum(L.static[i].nbytes for i in tasks)
        flops = sum(L.static[i].flops for i in tasks)
        commands.append(Command(value, waits, run, name, "kernel", base_id + first, nbytes, flops, (),
                                len(tasks), settings.debug >= 2))
        for i in tasks:
            placed[i] = (own, value, L.tasks[i])
        group.clear()

    def _waits(self, i: int, own: Signal, signals: list[Signal], bases: list[int],
               before: list[tuple[list, list]]) -> tuple:
        """Task i's waits: on the graph's tasks of other queues, and on work still pending on its
        buffers (reads wait for pending writes; writes also for pending reads)."""
        L = self.layout
        waits: dict = {}
        for dq, dpos in L.waits_inside[i]:
            waits[signals[dq]] = (bases[dq] + dpos + 1, True)
        for bi, reading in L.accesses[i]:
            wait_for_pending(waits, own, reading, *before[bi])
        return tuple([(s, v, c) for s, (v, c) in waits.items()])


__all__ = ["Plan", "Submission", "execute", "take_task_ids", "wait_for_pending"]
