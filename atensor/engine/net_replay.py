"""`NetAlone`: the lean replay of a kept-runner plan whose only task is a net command that starts on the
submitting thread (a jitted allreduce across processes): the general path's fast case for that plan,
made and submitted by `Plan.submit`.

Why: such a replay is one collective, started on the caller's thread (`Runner.here`, dist/native_net.py)
and, when it finishes within its bound, published there with no hand-off to the net queue's worker.
Around it the general `Plan.submit` still looks for pending work per buffer, decides between its
lowering choices, lists the task's place, and binds the queue's native program to a fresh bases array
(a closure and a Runner per replay): host work before the collective starts, on the critical path of
every rank. All of it is the same on every replay of the plan, so this record keeps:
- the net queue's program of one RUN op, bound ONCE to a bases array of its own (`run`): a replay
  writes its base into the array (only while every queue is idle, so no earlier run reads it); with
  no native program runner loaded (no kernel was compiled), the runner itself, as the general path;
- the task's summary (name, bytes, flops) for the command.
A replay is then: the kept runner's address slots pointed at the swapped buffers (as every replay of
kept runners), one value reserved, one Command, the buffers told (as the general path tells them:
`Plan._note_program` with a program, `Plan._note` without), and `Queue.start_here`: the queue
interface, called by the plan.

What it keeps from the general path: used only while every queue is idle, no profile is taken and
DEBUG < 2 (the conditions under which the general path would start the same command the same way);
a read of a failed task's contents is refused first (the plan's read-first check); a failure of the
collective is published on the command's value as the general path's is (`Queue.start_here`).

The buffers are told of the replay (`Plan._note` or `_note_program`: the values of its write and read)
only when its command leaves this thread: when the runner submits it to the queue's worker, or fails
here (its failure is published on its value, which the written buffers must name). A command finished
here is published before `Plan.submit` returns, while the dispatcher is claimed, so no plan can ever
see its value pending: telling the buffers of a value already reached changes nothing but the written
buffers' failures, which a write clears (`Buffer.note`), and the replay clears those itself. Measured
in-process (2 ranks, 1 MiB, AMD EPYC Zen 5, 2 cores): the telling took ~2 us of the ~15 us of host
work before the collective started, on a cache the previous collective left cold.

Invariant: `start` is called by the dispatching thread only (Plan.submit, through `Queue.start_here`),
while every queue is idle; `told` holds one replay's telling from `tell_later` until `start` returns.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional, Sequence

from atensor.backend.c import programs
from atensor.backend.runner import Runner
from atensor.graph.taskgraph import Task
from atensor.hcq.buffer import Buffer
from atensor.hcq.queue import Command, Queue

# how a plan tells a submission's buffers of it: (bufs, signals, bases) -> None (Plan._note, _note_program)
Tell = Callable[[list[Buffer], list, list[int]], None]


class NetAlone:
    """The fixed part of a one-net-command replay (see the module docstring)."""

    def __init__(self, queue: Queue, runner: Runner, summary: tuple[str, int, int], task: Task,
                 written: tuple[int, ...]):
        self.queue, self.signal, self.task = queue, queue.signal, task
        self.here = runner.here
        self.written = written  # the plan's buffers (indexes) the command writes
        # one replay's (tell, bufs, signals, bases) until its command leaves this thread or is done here
        self.told: Optional[tuple[Tell, list[Buffer], list, list[int]]] = None
        self.bases = (ctypes.c_uint64 * 1)()
        # with native programs, the queue's worker takes a submitted command over in C (a doorbell's
        # ring), as the general path's program of it; else the runner's own fn, as the general path's
        self.program = programs.programs_available()
        self.run = programs.Program([(programs.RUN, 0, 0, 0)], [runner]).bind(self.bases) \
            if self.program else runner
        self.name, self.nbytes, self.flops = summary

    def command(self, base: int, task_id: int) -> Command:
        """The replay's command, its value `base + 1`; its program reads `base` from the record's array."""
        self.bases[0] = base
        return Command(base + 1, (), self.run, self.name, "kernel", task_id, self.nbytes, self.flops, (), 1)

    def tell_later(self, tell: Tell, bufs: list[Buffer], signals: list, bases: list[int]) -> None:
        """Keeps the replay's telling of its buffers (`tell(bufs, signals, bases)`) for `start`, which
        makes it only if the command leaves this thread (module docstring)."""
        self.told = (tell, bufs, signals, bases)

    def start(self, submit: Callable[[], None], alone: bool) -> bool:
        """The command's `Runner.here`, as `Queue.start_here` calls it, telling the buffers only when the
        command is submitted (before `submit`) or fails here (before the error reaches the queue, which
        publishes it); done here, it clears the written buffers' failures, as telling them would."""
        try:
            done = self.here(lambda: self._submit(submit), alone)
        except BaseException:
            self._tell()
            raise
        told = self.told
        if done and told is not None:
            bufs = told[1]
            for bi in self.written:
                if bufs[bi].failure is not None:
                    bufs[bi].failure = None
        self.told = None
        return done

    def _submit(self, submit: Callable[[], None]) -> None:
        self._tell()
        submit()

    def _tell(self) -> None:
        told = self.told
        if told is not None:
            self.told = None
            told[0](told[1], told[2], told[3])


def net_alone_for(queues: Sequence[Queue], runs: Sequence[Optional[Runner]], remake: Sequence[int],
                  summary: tuple[str, int, int], task: Task,
                  notes: Sequence[tuple[int, tuple[tuple[int, int, bool], ...]]]) -> Optional[NetAlone]:
    """The lean record of a kept-runner plan of ONE task whose runner is a native net command that starts
    on the submitting thread; else None (the general path). `notes`: the plan's (buffer index, (queue,
    offset, write) entries), as `Layout.notes`."""
    if len(runs) != 1 or len(queues) != 1 or remake:
        return None
    run = runs[0]
    if run is None or run.here is None or run.native is None or run.rebind is not None:
        return None
    written = tuple(bi for bi, entries in notes if any(write for _, _, write in entries))
    return NetAlone(queues[0], run, summary, task, written)


__all__ = ["NetAlone", "net_alone_for"]
