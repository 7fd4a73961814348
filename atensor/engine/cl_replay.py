"""`CLReplay`: a jit replay of a plan on one OpenCL queue, enqueued as ONE command with no bookkeeping
per task: the general path's fast case for that plan, made and submitted by `Plan.submit`.

Why: the general `Plan.submit` makes, on every submission, a Command per task with its wait tuple,
notes every buffer through the layout, and hands the list to `CLQueue.submit`, which walks each
command's waits and hands each command to the completion thread: ~60-80 us of Python for a one-kernel
replay whose kernel pocl enqueues in ~10-20 us (bench/opencl.py --breakdown). For a kept-runner plan
whose tasks are all device commands of one CL queue, everything but the buffers and the Variables'
values is the same on every replay, so the plan builds this record once (`lean_for`) and a replay
(`Plan.submit`, the one module that hands commands to queues) is:

1. the swapped buffers' memories stored into the runners' argument lists (`Runner.device_args`;
   fresh result buffers get their memory here) and the bound Variables' values refreshed
   (`Runner.rebind`): each kernel's enqueue sets only the arguments that changed (lower_cl.py);
2. the queue's values reserved as one block, as the general path does;
3. ONE command whose value is the block's last, submitted as any (`Queue.submit`): its runner's
   `enqueue` is every task's `enqueue`, in task order, with no wait list (`sequence`), so the queue
   keeps one record for the completion thread and the awaiting host polls once, whatever the task
   count;
4. the buffers told that value (`Buffer.note_all`, as `Plan._note`); unless the queue ran the command
   here (`CLQueue.run_here`: a command known short is launched, waited for and published from this
   thread through the compiled core, atensor/core/cl.c) and it succeeded: then, as after a
   `ReplayRecord`'s run, the buffers it wrote are only told they were overwritten (`overwrote`).

What it keeps from the general path (tests/opencl/test_cl_replay.py checks each):
- order: it is used only while every queue is idle (`all_idle`), so the graph waits for nothing
  outside itself, and the in-order queue runs its tasks in task (topological) order;
- failures: a read of a buffer whose contents come from a failed task is refused before anything is
  enqueued (the plan checks `reads_of`); an enqueue that raises, or a launch whose event fails,
  publishes KernelError for the one command, and the submission lists it, so the await raises it;
- memory: the buffers it binds stay referenced by the command until its value is published
  (cl_queue.py's invariant), so no memory a launch uses is freed early;
- counters: the queue's `commands_run` counts one command, as a batch's does.
Not this path (`Plan.submit`'s general one): a profile or DEBUG=2 (a span per task), a plan on more than one
queue, a task whose runner has a host part (`failed`: a host kernel), starts on the host (`here`), or
is made again per replay (a copy that touches a swapped buffer).

Why it stays a record of its own inside the plan, measured: a one-kernel jitted awaited call on CL
(pocl, 16 elements, trio, the calling thread's CPU per call, alternating rounds of 500 calls in
fresh processes, load ~10, AMD EPYC Zen 4, 2 cores, at 4715a1c): 51-56 us with it, 69-74 us with
`lean_for` returning None (the general path's kept runners), in 2 of 3 rounds (the third, at a load
spike, 105 against 69). A hot eager graph on one CL device takes it too (engine/program.py's twin).

Invariant: `bind`, `command` and `note` are called by the dispatching thread only (Plan.submit),
while every queue is idle.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from atensor import ledger
from atensor.backend.runner import Runner
from atensor.engine.patching import AddressSlots
from atensor.graph.node import BufferSpec
from atensor.graph.taskgraph import Task
from atensor.hcq.buffer import Buffer
from atensor.hcq import cl_native
from atensor.hcq.cl_queue import CLQueue
from atensor.hcq.device import Device
from atensor.hcq.queue import Command
from atensor.hcq.signal import Signal


def _host_never_runs() -> None:
    raise RuntimeError("a lean CL replay's command runs on its OpenCL queue only (its runner's enqueue); "
                       "nothing runs it from the host")


def sequence(enqueues: Sequence) -> Callable[[Any, Any], tuple[Any, Any]]:
    """One `Runner.enqueue` that enqueues each of `enqueues` in order (the first after `events`, the
    rest after it by the queue's order): (the first launch's first event, the last one's last)."""
    def enqueue(queue: Any, events: Any) -> tuple[Any, Any]:
        first = last = None
        for one in enqueues:
            start, last = one(queue, events)
            events = ()
            if first is None:
                first = start
        return first, last
    return enqueue


def sequence_launch(launches: Sequence[Callable[[int], tuple[int, int]]], core: Any
                    ) -> Callable[[int], tuple[int, int]]:
    """One `Runner.launch` that launches each of `launches` in order: (the first's first event, the last
    one's last), every other event released (`core`: the compiled core, hcq/cl_native.py). A launch that
    raises is raised once the launches before it have finished (their events waited for and released)."""
    release, finish = core.cl_release, core.cl_finish

    def launch(queue: int) -> tuple[int, int]:
        first = last = 0
        try:
            for one in launches:
                start, end = one(queue)
                if first == 0:
                    first = start
                elif last != first:
                    release(last)
                if start != first and start != end:
                    release(start)
                last = end
        except Exception:
            if first:
                finish(first, last)
            raise
        return first, last
    return launch


class CLReplay:
    """The fixed part of a one-CL-queue replay (see the module docstring): the kept runners' enqueues in
    task order, where the swapped buffers sit in their argument lists, what each buffer is told."""

    def __init__(self, queue: CLQueue, runs: Sequence[Runner], slots: Optional[AddressSlots],
                 swapped: Sequence[BufferSpec], fixed: Sequence[Buffer], notes: Sequence[tuple[int, tuple]],
                 swapped_index: Sequence[int], reads: Sequence[tuple[int, str]], summary: tuple[str, int, int],
                 first: Task):
        self.queue, self.signal = queue, queue.signal
        self.count = len(runs)
        self.rebinds = [run.rebind for run in runs if run.rebind is not None]
        places = slots.device_slots if slots is not None else [[] for _ in swapped]
        # (place in `swapped`, its device, (argument list, index) of each runner that passes it)
        self.bound = [(j, Device.get(spec.device), entries)
                      for j, (spec, entries) in enumerate(zip(swapped, places)) if entries]
        place = {bi: j for j, bi in enumerate(swapped_index)}
        # each buffer's notes as (write, offset from the block's base) pairs: a fixed Buffer's, or a
        # swapped one's by its place in `swapped` (every queue is this one)
        self.notes_fixed = [(fixed[bi], [(offset, write) for _, offset, write in entries])
                            for bi, entries in notes if bi not in place]
        self.notes_swapped = [(place[bi], [(offset, write) for _, offset, write in entries])
                              for bi, entries in notes if bi in place]
        # the buffers the replay writes: fixed Buffers, and places in `swapped` (`overwrote`)
        self.written_fixed = [buf for buf, entries in self.notes_fixed if any(write for _, write in entries)]
        self.written_swapped = [j for j, entries in self.notes_swapped if any(write for _, write in entries)]
        self.reads_fixed = [(fixed[bi], name) for bi, name in reads if bi not in place]
        self.reads_swapped = [(place[bi], name) for bi, name in reads if bi in place]
        self.name, self.nbytes, self.flops = summary
        # names the replay's work for the queue's short-command test (CLQueue.poll): its device time
        # at the last replay; one record, one key
        self.slots = slots
        enqueue = runs[0].enqueue if len(runs) == 1 else sequence([run.enqueue for run in runs])
        launch = None  # the compiled launch, when every runner has one (the queue's `run_here` uses it)
        if all(run.launch is not None for run in runs):
            core = cl_native.native()
            launch = runs[0].launch if len(runs) == 1 else sequence_launch([run.launch for run in runs], core)
        self.runner = Runner(_host_never_runs, enqueue=enqueue, device_key=("cl replay", id(self)), launch=launch)
        self.first = first  # the task a failure is reported against (`Submission.placed`)

    def reads_of(self, new_specs: list[BufferSpec]) -> list[tuple[Buffer, str]]:
        """The buffers the replay with `new_specs` reads before writing them, each with its reader."""
        if not self.reads_swapped:
            return self.reads_fixed
        of = Buffer.of
        return self.reads_fixed + [(of(new_specs[j]), name) for j, name in self.reads_swapped]

    def bind(self, new_specs: list[BufferSpec]) -> list[Optional[Buffer]]:
        """Stores `new_specs`' memories (the swapped buffers' replacements; a fresh one allocated here)
        into the runners' argument lists and refreshes the bound Variables; returns the Buffers bound
        (None for a swapped buffer no launch passes), which the command keeps alive."""
        runtime = ledger.runtime
        buffers: list[Optional[Buffer]] = [None] * len(new_specs)
        for j, device, entries in self.bound:
            spec = new_specs[j]
            buf = runtime(spec)
            if buf is None or buf.memory is None:
                buf = device.allocate(spec)
            memory = buf.memory
            for args, k in entries:
                args[k] = memory
            buffers[j] = buf
        if self.slots is not None:  # what the lists point into is the command's to keep alive now
            self.slots.bound = []
        for rebind in self.rebinds:
            rebind()
        return buffers

    def command(self, base: int, buffers: list[Optional[Buffer]]) -> Command:
        """The replay's one command, its value the last of the block reserved from `base`, keeping
        `buffers` (from `bind`) until it is published."""
        return Command(base + self.count, (), self.runner, self.name, "kernel", self.first.id, self.nbytes,
                       self.flops, (), self.count, keep=buffers)

    def note(self, base: int, buffers: list[Optional[Buffer]], new_specs: list[BufferSpec]) -> None:
        """Tells each buffer the values of its last write and read in the replay from `base`."""
        signal = self.signal
        for buf, entries in self.notes_fixed:
            buf.note_all([(signal, base + offset, write) for offset, write in entries])
        of = Buffer.of
        for j, entries in self.notes_swapped:
            buf = buffers[j]
            if buf is None:
                buf = of(new_specs[j])
            buf.note_all([(signal, base + offset, write) for offset, write in entries])

    def overwrote(self, base: int, buffers: list[Optional[Buffer]], new_specs: list[BufferSpec]) -> bool:
        """True when the replay from `base` was published already, without failure (the queue ran it
        here, `CLQueue.run_here`): then the buffers it wrote are told they were overwritten (their earlier
        failures and published writes forgotten) and need no notes, as after a `ReplayRecord`'s run;
        False when it is in flight or failed (the caller notes them, `note`)."""
        value = base + self.count
        signal = self.signal
        if signal.value < value or (signal.has_failures() and signal.failure(value) is not None):
            return False
        if self.written_fixed:
            Buffer.all_overwritten(self.written_fixed)
        for j in self.written_swapped:
            buf = buffers[j]
            if buf is None:
                buf = Buffer.of(new_specs[j])
            if buf.failure is not None or buf.writes:
                buf.overwritten()
        return True

    def placed(self, value: int) -> list[tuple[Signal, int, Task]]:
        """The submission's `placed` list: one entry, the command (a failure is reported against it)."""
        return [(self.signal, value, self.first)]


def lean_for(queues: Sequence, runs: Sequence[Optional[Runner]], remake: Sequence[int],
             slots: Optional[AddressSlots], swapped: Sequence[BufferSpec], fixed: Sequence[Buffer],
             notes: Sequence[tuple[int, tuple]], swapped_index: Sequence[int], reads: Sequence[tuple[int, str]],
             summary: tuple[str, int, int], first: Task) -> Optional[CLReplay]:
    """The lean record of a kept-runner plan (the arguments are the plan's, engine/plan.py) when its tasks
    are all device commands of ONE OpenCL queue that run on the device alone, none made again per
    replay; else None (the plan keeps the general path)."""
    if len(queues) != 1 or not isinstance(queues[0], CLQueue) or remake or not runs:
        return None
    for run in runs:
        if run is None or run.enqueue is None or run.failed is not None or run.here is not None:
            return None
    return CLReplay(queues[0], runs, slots, swapped, fixed, notes, swapped_index, reads, summary, first)


__all__ = ["CLReplay", "lean_for"]
