"""A captured TaskGraph lowered once, submitted many times (atensor.jit's replays).

Why: `execute` plans a graph from scratch: the queue of every task, its place in that queue, which
tasks of other queues it waits for, its size, its callable, which buffers to tell about its work.
For a graph that is submitted again and again with a few buffers swapped (jit inputs and results),
all of that is the same every time except three things, which `submit` computes:

- the signal values: each queue's values are reserved as one block, so a task's value is the block's
  base plus its fixed place in the queue's list (waits between tasks of the graph likewise);
- the waits on work still pending from earlier realizes, from each buffer's pending writers and
  readers, exactly as `execute` finds them;
- the callables of tasks that touch a swapped buffer (the others are kept).

Each buffer is told only of the last write and the last read per queue, which is all it keeps; in a
submission of native programs the buffers every replay touches follow the plan's clock instead
(buffer.py), told once: only the swapped buffers learn each replay's values.

Native work (backend/native.py) is submitted in few commands when nothing is pending and no profile is
being taken:
- when every task of the graph is native (compiled kernels, memcpy copies), each queue gets ONE
  command, a native program: its waits on other queues and the values other queues wait for go
  through C timelines, so a multi-device step (backward, allreduce copies, optimizer) runs without
  the GIL or a Python wake-up between its tasks; such replays use a plan in the producer layout, where
  a copy between CPU devices runs on the queue that made its data instead of a copy queue's thread;
- otherwise native kernels that follow each other on a queue are one command (`native.batch`); a run
  ends at a task another queue waits for (its value is published as soon as it is done) and starts
  at a task that waits for another queue.
A command publishes the value of its last task; the values before it are reached at the same moment
on the Python timeline and carry no stamp of their own (a profile, which needs a span per kernel,
turns both off).

Runners of tasks that touch swapped buffers are kept too: once the plan's last submission is done,
`rebind` rewrites their argument blocks in place for the new buffers, so programs stay valid; while
it still runs, a replay gets runners of its own.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

from atensor.graph.node import BufferSpec
from atensor.graph.symbolic import evaluate
from atensor.backend import native
from atensor.hcq.buffer import Buffer, Clock
from atensor.hcq.device import Device, all_idle
from atensor.engine.executor import Submission, _runner, take_task_ids, wait_for_pending
from atensor.engine.patching import AddressSlots
from atensor.hcq.queue import Command, Queue
from atensor.hcq.signal import Signal
from atensor.profiler import collector
from atensor.graph.taskgraph import Copy, Task


def _nothing_to_run() -> None:
    """Kept in place of a task that runs nothing (NULL devices), so it is not looked up again."""


_NOTHING_TO_RUN = _nothing_to_run


class ReplayPlan:
    """`tasks` (a captured graph's, in order) lowered once; `swapped[i]` says task i touches a buffer
    that `submit`'s mapping replaces."""

    def __init__(self, tasks: list[Task], swapped: list[bool], copies_on_producer: bool = False):
        self.epoch = native.epoch  # the compiled kernels it was lowered with (a newer epoch re-lowers)
        self.queues: list[Queue] = []
        queue_index: dict[Queue, int] = {}
        self.buffers: list[BufferSpec] = []
        buffer_index: dict[BufferSpec, int] = {}
        self.task_queue: list[int] = []
        self.task_pos: list[int] = []
        # per task: (queue, place) of its newest dependency on each other queue
        self.waits_inside: list[tuple[tuple[int, int], ...]] = []
        self.accesses: list[tuple[tuple[int, bool], ...]] = []      # (buffer, reading)
        self.static: list[tuple[str, str, int, int, tuple[int, ...]]] = []
        self.read_first: list[tuple[int, str]] = []  # (buffer, task name): read before the graph writes it
        counts: list[int] = []
        written: set[int] = set()
        last: dict[tuple[int, int, bool], int] = {}                 # (buffer, queue, write) -> place
        for task in tasks:
            queue = Device.get(task.device).queue(task.queue)
            if copies_on_producer:
                queue = self._producer_queue(task, queue)
            qi = queue_index.get(queue)
            if qi is None:
                qi = queue_index[queue] = len(self.queues)
                self.queues.append(queue)
                counts.append(0)
            pos = counts[qi]
            counts[qi] += 1
            self.task_queue.append(qi)
            self.task_pos.append(pos)
            newest: dict[int, int] = {}
            for dep in task.deps:
                dq = self.task_queue[dep]
                if dq != qi and newest.get(dq, -1) < self.task_pos[dep]:
                    newest[dq] = self.task_pos[dep]
            self.waits_inside.append(tuple(newest.items()))
            accesses = []
            nbytes = 0
            var_vals = getattr(task.work, "var_vals", None)
            for acc in task.accesses:
                bi = buffer_index.get(acc.buffer)
                if bi is None:
                    bi = buffer_index[acc.buffer] = len(self.buffers)
                    self.buffers.append(acc.buffer)
                reading = acc.mode == "r"
                if reading and bi not in written:
                    self.read_first.append((bi, task.name))
                accesses.append((bi, reading))
                last[(bi, qi, not reading)] = pos
                span = acc.end - acc.start
                nbytes += span if type(span) is int else evaluate(span, var_vals)
            for spec in getattr(task.work, "buffers", ()):  # one without an access (size 0) is bound too
                if spec not in buffer_index:
                    buffer_index[spec] = len(self.buffers)
                    self.buffers.append(spec)
            written.update(bi for bi, reading in accesses if not reading)
            self.accesses.append(tuple(accesses))
            self.static.append((task.name, task.work.kind, nbytes, getattr(task.work, "flops", 0),
                                tuple(sorted(task.deps))))
        self.counts = counts
        self.by_queue: list[list[int]] = [[] for _ in self.queues]
        for i, qi in enumerate(self.task_queue):
            self.by_queue[qi].append(i)
        # per buffer: what it is told once the graph is submitted, (queue, place, write) each
        grouped: dict[int, list[tuple[int, int, bool]]] = {}
        for (bi, qi, write), pos in last.items():
            grouped.setdefault(bi, []).append((qi, pos + 1, write))
        self.notes = [(bi, tuple(entries)) for bi, entries in grouped.items()]
        self.runners: list[Optional[Callable[[], None]]] = [None] * len(tasks)
        self.tasks = tasks
        self.keep_runner = [not s for s in swapped]
        # a task another queue waits for ends a batch of native kernels (its value is published as
        # soon as it is done); a task that waits for another queue starts one
        self.ends_batch = [False] * len(tasks)
        for i, waits in enumerate(self.waits_inside):
            for dq, dpos in waits:
                self.ends_batch[self.by_queue[dq][dpos]] = True
        self.batches: dict[tuple[int, ...], tuple[tuple[int, ...], Callable[[], None]]] = {}
        # per queue: (the ids of the runners it was built of, program)
        self.programs: dict[int, tuple[tuple[int, ...], native.Program]] = {}
        self.summaries: dict[int, tuple[str, int, int]] = {}  # per queue: its program command's name, bytes, flops
        self.last_final: list[tuple[Signal, int]] = []  # the values the last submission ends at
        # found on the first submission (the mapping's keys are the same on every replay):
        self.swapped: Optional[list[BufferSpec]] = None    # the buffers replays swap, captured names
        self.swapped_index: list[int] = []                  # their places in `buffers`
        self.fixed_bufs: list[Buffer] = []                  # the Buffer of each captured spec
        # made on the first submission of native programs (`_note_program`):
        self.clock: Optional[Clock] = None                  # what the buffers every replay touches follow
        self.swapped_notes: list = []                       # `notes` of the swapped buffers
        self.written_fixed: list[Buffer] = []               # the buffers every replay writes
        # once every runner is built and kept: where the swapped buffers' addresses sit (patching.py)
        self.slots: Optional[AddressSlots] = None
        self.runs: list = []
        self.all_native = False

    def _producer_queue(self, task: Task, queue: Queue) -> Queue:
        """Where a copy between CPU devices runs in the producer layout: on the one queue that made
        what it copies, or, when no task of the graph made it (an input), on the destination's compute
        queue (a memcpy of a few hundred KB costs less than handing over to the copy queue's thread and
        back: two cross-thread wake-ups per copy on a busy machine). Anything else stays."""
        device = Device.get(task.device)
        if not isinstance(task.work, Copy) or device.kind != "CPU":
            return queue
        if not task.deps:
            return device.queue("compute") if Device.get(task.work.src.device).kind == "CPU" else queue
        producers = {self.queues[self.task_queue[d]] for d in task.deps}
        if len(producers) != 1:
            return queue
        producer = producers.pop()
        return producer if Device.get(producer.device).kind == "CPU" else queue

    def submit(self, works_of: Callable[[], list[Any]], mapping: dict[BufferSpec, BufferSpec]) -> Submission:
        """Puts the tasks on the queues; `works_of()` gives their works with the buffers `mapping`
        swaps (only called when a runner must be built or rebound through its work)."""
        if self.swapped is None:  # the buffers of the graph that replays swap: the same on every replay
            self.swapped_index = [bi for bi, s in enumerate(self.buffers) if s in mapping]
            self.swapped = [self.buffers[bi] for bi in self.swapped_index]
            self.fixed_bufs = [Buffer.of(s) for s in self.buffers]
        new_specs = [mapping[s] for s in self.swapped]
        bufs = self.fixed_bufs.copy()
        for bi, spec in zip(self.swapped_index, new_specs):
            bufs[bi] = Buffer.of(spec)
        for bi, name in self.read_first:
            failure = bufs[bi].failure
            if failure is not None:
                raise RuntimeError(f"{name} reads {bufs[bi].name}, whose contents come from a task that "
                                   f"failed: {failure}") from failure
        if all_idle():  # the common case between steps: nothing can be pending, no snapshot to take
            before, quiet = [], True
        else:
            before = [b.pending() for b in bufs]
            quiet = not any(w or r for w, r in before)  # nothing pending: only the graph's own waits
        bases = []
        for queue, count in zip(self.queues, self.counts):
            bases.append(queue._reserved)
            queue._reserved += count
        signals = [q.signal for q in self.queues]
        base_id = take_task_ids(len(self.tasks))
        placed: list = [None] * len(self.tasks)
        profiling = collector.is_active()  # dependency ids only feed the profile's arrows
        sub = Submission(placed=placed)
        # queue by queue, each list handed over as soon as it is built: the first device starts while
        # the next one's list is made (waits across queues are by value, so the order is free)
        batching = quiet and not profiling
        # a runner of swapped buffers is rewritten in place once the last submission is done with it
        reuse = all(sig.value >= value for sig, value in self.last_final)
        if reuse and self.slots is not None:  # every runner is built: only addresses change
            self.slots.bind(new_specs)
            runs = self.runs
        else:
            if self.slots is not None and not reuse:  # the runners still running keep their buffers
                for run, kept_runner in zip(self.runs, self.keep_runner):
                    if not kept_runner and run is not None:
                        run.keep_alive = self.slots.bound
            works = works_of()
            runs = [self._run_of(i, works, reuse) for i in range(len(works))]
            self.runs = runs
            self.all_native = all(r is not None and getattr(r, "native", None) is not None and r.threads == 1
                                  for r in runs)
            kept = all(r is self.runners[i] for i, r in enumerate(runs) if not self.keep_runner[i])
            self.slots = AddressSlots.find(self.tasks, runs, self.swapped, [not k for k in self.keep_runner]) \
                if kept else None
            if self.slots is not None:  # the runners' blocks point into this submission's buffers
                self.slots.bound = new_specs
        self.last_final = [(q.signal, b + c) for q, b, c in zip(self.queues, bases, self.counts)]
        if batching and self.all_native and native.programs_available():
            slots = [native.timeline_slot(q) for q in self.queues]
            if None not in slots:
                lists = self._programs_of(runs, slots, bases, base_id, signals, placed, sub)
                self._note_program(bufs, signals, bases)
                # handed over last and back to back: the queues start at once (doorbell.py), so
                # the host's bookkeeping above does not compete with them for the cores
                for queue, commands in lists:
                    queue.submit(commands)
                return sub
        for qi, members in enumerate(self.by_queue):
            own = signals[qi]
            commands = []
            group: list[tuple[int, Callable[[], None]]] = []  # native kernels run as one command
            for i in members:
                run = runs[i]
                if batching:
                    if getattr(run, "native", None) is not None and run.threads == 1:
                        if group and self.waits_inside[i]:
                            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                        group.append((i, run))
                        if self.ends_batch[i]:
                            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                        continue
                    self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
                value = bases[qi] + self.task_pos[i] + 1
                if quiet:
                    waits = tuple([(signals[dq], bases[dq] + dpos + 1, True)
                                   for dq, dpos in self.waits_inside[i]])
                else:
                    waits = self._waits(i, own, signals, bases, before)
                name, kind, nbytes, flops, deps = self.static[i]
                commands.append(Command(value, waits, run, name, kind, base_id + i, nbytes, flops,
                                        tuple([base_id + d for d in deps]) if profiling else ()))
                placed[i] = (own, value, self.tasks[i])
            self._flush(group, commands, bases[qi], base_id, signals, bases, placed, own)
            queue = self.queues[qi]
            sub.final[queue] = bases[qi] + self.counts[qi]
            queue.submit(commands)
        self._note(bufs, signals, bases)
        return sub

    def _note(self, bufs: list[Buffer], signals: list[Signal], bases: list[int]) -> None:
        """Tells each buffer the values of its last write and last read per queue in this submission."""
        for bi, entries in self.notes:
            bufs[bi].note_all([(signals[qi], bases[qi] + offset, write) for qi, offset, write in entries])

    def _note_program(self, bufs: list[Buffer], signals: list[Signal], bases: list[int]) -> None:
        """`_note` for a submission of native programs (nothing in it can fail): the buffers every
        replay touches follow the plan's clock, told once, so only the clock and the swapped buffers
        learn this submission's values."""
        if self.clock is None:
            self.clock = Clock(signals, self)
            swapped = set(self.swapped_index)
            for bi, entries in self.notes:
                if bi not in swapped:
                    self.fixed_bufs[bi].follow(self.clock, tuple((qi, off) for qi, off, w in entries if w),
                                               tuple((qi, off) for qi, off, w in entries if not w))
            self.swapped_notes = [(bi, entries) for bi, entries in self.notes if bi in swapped]
            self.written_fixed = [self.fixed_bufs[bi] for bi, entries in self.notes
                                  if bi not in swapped and any(w for _, _, w in entries)]
        self.clock.advance(bases, [b + c for b, c in zip(bases, self.counts)])
        for buf in self.written_fixed:
            buf.overwritten()
        for bi, entries in self.swapped_notes:
            bufs[bi].note_all([(signals[qi], bases[qi] + offset, write) for qi, offset, write in entries])

    def _programs_of(self, runs: list, slots: list[int], bases: list[int], base_id: int,
                     signals: list[Signal], placed: list, sub: Submission) -> list[tuple[Queue, list[Command]]]:
        """Every task is native: each queue gets one command, a native program whose waits on other
        queues and whose values other queues wait for go through the C timelines (native.Program).
        Returns the (queue, command list) pairs to submit."""
        lists = []
        bases_c = (ctypes.c_uint64 * len(bases))(*bases)
        for qi, members in enumerate(self.by_queue):
            ids = tuple([id(runs[i]) for i in members])
            kept = self.programs.get(qi)
            program = kept[1] if kept is not None and kept[0] == ids else None
            if program is None:
                ops: list[tuple[int, int, int, int]] = []
                program_runs: list = []
                for i in members:
                    for dq, dpos in self.waits_inside[i]:
                        ops.append((native.WAIT, slots[dq], dq, dpos + 1))
                        program_runs.append(None)
                    ops.append((native.RUN, 0, 0, 0))
                    program_runs.append(runs[i])
                    if self.ends_batch[i]:  # another queue waits for it
                        ops.append((native.PUBLISH, slots[qi], qi, self.task_pos[i] + 1))
                        program_runs.append(None)
                program = native.Program(ops, program_runs)
                self.programs[qi] = (ids, program)  # valid while these runners are the ones in use
            first = members[0]
            value = bases[qi] + self.counts[qi]
            name, nbytes, flops = self._program_summary(qi)
            own = signals[qi]
            for i in members:
                placed[i] = (own, value, self.tasks[i])
            queue = self.queues[qi]
            sub.final[queue] = value
            lists.append((queue, [Command(value, (), program.bind(bases_c), name, "kernel", base_id + first,
                                          nbytes, flops, ())]))
        return lists

    def _program_summary(self, qi: int) -> tuple[str, int, int]:
        """The name, bytes and flops of queue qi's program command (the same on every submission)."""
        found = self.summaries.get(qi)
        if found is None:
            members = self.by_queue[qi]
            first = members[0]
            name = self.static[first][0] if len(members) == 1 else \
                f"{len(members)} tasks from {self.static[first][0]}"
            found = self.summaries[qi] = (name, sum(self.static[i][2] for i in members),
                                          sum(self.static[i][3] for i in members))
        return found

    def _run_of(self, i: int, works: list[Any], reuse: bool) -> Optional[Callable[[], None]]:
        run = self.runners[i]
        if run is not None and not self.keep_runner[i]:  # touches a swapped buffer
            if reuse:
                run.rebind(works[i])
                return run
            run = None
        if run is None:
            run = _runner(works[i])
            if self.keep_runner[i] or getattr(run, "rebind", None) is not None:
                self.runners[i] = _NOTHING_TO_RUN if run is None else run
        return None if run is _NOTHING_TO_RUN else run

    def _flush(self, group: list[tuple[int, Callable[[], None]]], commands: list[Command], base: int,
               base_id: int, signals: list[Signal], bases: list[int], placed: list, own: Signal) -> None:
        """The native kernels of `group` ((task, runner) pairs) as one command; empties it."""
        if not group:
            return
        tasks = [i for i, _ in group]
        first, last = tasks[0], tasks[-1]
        key = tuple(tasks)
        ids = tuple([id(r) for _, r in group])
        kept = self.batches.get(key)
        run = kept[1] if kept is not None and kept[0] == ids else None
        if run is None:
            run = group[0][1] if len(group) == 1 else native.batch([r for _, r in group])
            self.batches[key] = (ids, run)  # valid while these runners are the ones in use
        waits = tuple([(signals[dq], bases[dq] + dpos + 1, True) for dq, dpos in self.waits_inside[first]])
        value = base + self.task_pos[last] + 1
        name = self.static[first][0] if len(group) == 1 else f"{len(group)} kernels from {self.static[first][0]}"
        nbytes = sum(self.static[i][2] for i in tasks)
        flops = sum(self.static[i][3] for i in tasks)
        commands.append(Command(value, waits, run, name, "kernel", base_id + first, nbytes, flops, ()))
        for i in tasks:
            placed[i] = (own, value, self.tasks[i])
        group.clear()

    def _waits(self, i: int, own: Signal, signals: list[Signal], bases: list[int],
               before: list[tuple[list, list]]) -> tuple:
        """Task i's waits: on the graph's tasks of other queues, and on work still pending on its
        buffers (reads wait for pending writes; writes also for pending reads), as `execute` finds."""
        waits: dict = {}
        for dq, dpos in self.waits_inside[i]:
            waits[signals[dq]] = (bases[dq] + dpos + 1, True)
        for bi, reading in self.accesses[i]:
            wait_for_pending(waits, own, reading, *before[bi])
        return tuple([(s, v, c) for s, (v, c) in waits.items()])
