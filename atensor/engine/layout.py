"""`Layout`: what lowering a task list finds once, and every submission of its Plan reads unchanged.

Why a type of its own: a Plan (engine/plan.py) is submitted once (an eager realize) or many times (a
captured program, engine/program.py). What lowering finds does not change between submissions: each
task's queue and place in that queue's list, its waits on other queues (merged: the newest place per
queue), its buffers and how it uses them, its size, what each buffer is told once the graph is
submitted, and which native kernels may run as one batch. Keeping it in one record, apart from the
state that submissions change (kept runners, address slots, native programs), says which is which.

Invariant: a Layout is not written after `__init__`; its lists are indexed by task (in the tasks'
topological order), by queue (`queues`) or by buffer (`buffers`).
"""
from __future__ import annotations

from typing import Collection, NamedTuple

from atensor.backend.c import registry
from atensor.graph.node import BufferSpec
from atensor.graph.symbolic import evaluate
from atensor.graph.taskgraph import Copy, Kernel, Task
from atensor.hcq.device import Device
from atensor.hcq.queue import Queue

# An eager plan of at most this many kernels and copies, touching at most this many bytes and doing at
# most this many flops, runs on the thread that plans it (the caller's, for a realize planned inline)
# when every queue it uses is idle and nothing is pending on its buffers: the await then finds its
# values published and returns without a hand-off to a worker and back (two thread wake-ups, ~100 us
# on these machines). The bound this keeps: such a plan runs for at most ~50 us (4 numpy kernels of
# 16 KiB; bench/overhead.py's round trip runs one of 64 bytes in 5-10 us), less than planning it.
INLINE_MAX_TASKS = 4
INLINE_MAX_BYTES = 64 << 10
INLINE_MAX_FLOPS = 1 << 16


class TaskInfo(NamedTuple):
    """What a command of one task says of it: its name and kind, the bytes it touches (at lowering, for
    a task with Variables), its flops, and the tasks it depends on (for the profile's arrows)."""
    name: str
    kind: str
    nbytes: int
    flops: int
    deps: tuple[int, ...]


class Layout:
    """`tasks` (a graph's, in topological order) lowered once; see the module docstring. `slots` are the
    buffers submissions replace, `keep_runners` whether the plan is submitted many times with its
    runners kept (engine/plan.py), `copies_on_producer` the producer layout."""

    def __init__(self, tasks: list[Task], slots: Collection, copies_on_producer: bool, keep_runners: bool):
        self.epoch = registry.REGISTRY.epoch  # the compiled kernels it was lowered with (a newer epoch re-lowers)
        self.from_slots = bool(slots) and not keep_runners
        self.once = not keep_runners
        self.queues: list[Queue] = []
        queue_index: dict[Queue, int] = {}
        self.buffers: list[BufferSpec] = []
        buffer_index: dict[BufferSpec, int] = {}
        self.task_queue: list[int] = []
        self.task_pos: list[int] = []
        # per task: (queue, place) of its newest dependency on each other queue
        self.waits_inside: list[tuple[tuple[int, int], ...]] = []
        self.accesses: list[tuple[tuple[int, bool], ...]] = []      # (buffer, reading)
        self.static: list[TaskInfo] = []
        self.read_first: list[tuple[int, str]] = []  # (buffer, task name): read before the graph writes it
        counts: list[int] = []
        symbolic = False  # some task's work has Variables: its size at capture bounds no later replay
        written: set[int] = set()
        last: dict[tuple[int, int, bool], int] = {}                 # (buffer, queue, write) -> place
        queue_of: dict[tuple[str, str], Queue] = {}
        for task in tasks:
            work = task.work
            where = (work.device, work.queue)
            queue = queue_of.get(where)
            if queue is None:
                queue = queue_of[where] = Device.get(where[0]).queue(where[1])
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
            var_vals = getattr(work, "var_vals", None)
            symbolic = symbolic or bool(var_vals)
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
            for spec in getattr(work, "buffers", ()):  # one without an access (size 0) is swapped too
                if spec not in buffer_index:
                    buffer_index[spec] = len(self.buffers)
                    self.buffers.append(spec)
            written.update(bi for bi, reading in accesses if not reading)
            self.accesses.append(tuple(accesses))
            self.static.append(TaskInfo(task.name, work.kind, nbytes, getattr(work, "flops", 0),
                                        tuple(sorted(task.deps))))
        self.counts = counts
        self.signals = [q.signal for q in self.queues]
        self.written_index = sorted(written)  # the buffers some task writes (places in `buffers`)
        # tiny enough to run on the planning thread itself when its queues are idle (see `submit`)
        # (a jit replay's too, unless its sizes depend on Variables bound per replay)
        # `light`: within the bytes and flops bounds whatever its task count (a replay of native kernels
        # only runs here up to engine/replay.py's RECORD_MAX_TASKS: ~0.1-1 us a kernel in C)
        self.light = (self.once or not symbolic) and all(type(t.work) in (Kernel, Copy) for t in tasks) and \
            sum(info.nbytes for info in self.static) <= INLINE_MAX_BYTES and \
            sum(info.flops for info in self.static) <= INLINE_MAX_FLOPS
        self.tiny = len(tasks) <= INLINE_MAX_TASKS and self.light
        self.by_queue: list[list[int]] = [[] for _ in self.queues]
        for i, qi in enumerate(self.task_queue):
            self.by_queue[qi].append(i)
        # per buffer: what it is told once the graph is submitted, (queue, place, write) each
        grouped: dict[int, list[tuple[int, int, bool]]] = {}
        for (bi, qi, write), pos in last.items():
            grouped.setdefault(bi, []).append((qi, pos + 1, write))
        self.notes = [(bi, tuple(entries)) for bi, entries in grouped.items()]
        self.tasks = tasks
        # task i touches a slot: its runner is rebound or made again on each submission
        self.touched = [any(a.buffer in slots for a in t.accesses) or
                        any(s in slots for s in getattr(t.work, "buffers", ())) for t in tasks] \
            if keep_runners and slots else [False] * len(tasks)
        # a task another queue waits for ends a batch of native kernels (its value is published as
        # soon as it is done); a task that waits for another queue starts one
        self.ends_batch = [False] * len(tasks)
        for i, waits in enumerate(self.waits_inside):
            for dq, dpos in waits:
                self.ends_batch[self.by_queue[dq][dpos]] = True

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
