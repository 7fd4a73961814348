"""The TaskGraph: what one realize runs, and which task must wait for which.

Why a task graph and not a list: the devices' queues run concurrently, so the order of a list says
nothing about what may overlap. Each task says which byte ranges of which buffers it reads and
writes; an edge a -> b exists when b touches bytes a touched and one of them writes (read after
write, write after read, write after write). Tasks with no path between them may run at the same
time on different queues; the race check (sched/racecheck.py) proves that such tasks never touch
the same bytes with a write. Ranges, not whole buffers, are compared so that the chunks of an
allreduce that write disjoint parts of one buffer stay concurrent.

Edges to work still pending from *earlier* realizes are not in the graph: that work is on the
queues already, and hcq/ orders the new tasks after it through each buffer's pending writers and
readers (timeline signal values), so one graph never has to know about another.

It lives in graph/ because it is the contract between two layers that may not import each other
upward: sched/ builds it, hcq/ runs it (docs/design.md: hcq does not import sched). It names
devices and queues by string; it knows nothing of their runtimes.

Invariant: `tasks` is in a topological order (every edge goes from an earlier to a later task).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Union

from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import ReduceOp
from atensor.graph.symbolic import Expr, SymbolicError, Variable


@dataclass(frozen=True)
class Access:
    """Bytes [start, end) of `buffer`, read ("r") or written ("w") by a task. `start` and `end` are
    ints, or linear expressions in unbound Variables (graph/symbolic.py) for views at a variable
    offset: then the range is meant for every value in the variables' bounds."""
    buffer: BufferSpec
    mode: str
    start: Expr
    end: Expr

    def overlaps(self, other: Access) -> bool:
        """True unless the ranges are disjoint for every value of their variables (so an edge is added
        whenever they may overlap: a spare edge costs concurrency, a missing one correctness)."""
        if self.buffer is not other.buffer:
            return False
        try:  # ints, or linear expressions decided over their variables' bounds
            return self.start < other.end and other.start < self.end
        except SymbolicError:  # overlapping for some values only
            return True

    def covers(self, other: Access) -> bool:
        """True when this range contains `other`'s for every value of their variables."""
        try:
            return self.start <= other.start and other.end <= self.end
        except SymbolicError:
            return False


@dataclass(eq=False)
class Kernel:
    """A fused computation: `ast` is STORE(view of PARAM 0, value) over PARAM leaves; `buffers[i]`
    is what PARAM i names. Structurally equal kernels have the identical `ast`."""
    ast: Node
    buffers: tuple[BufferSpec, ...]
    device: str
    name: str
    flops: int = 0
    kind: str = "kernel"
    queue: str = "compute"
    var_vals: dict[Variable, int] = field(default_factory=dict)  # values of the ast's variables
    ops: str = ""  # what it computes, op by op (sched/kernel_names.py): the profiler shows it on hover


@dataclass(eq=False)
class Copy:
    """Copies `nbytes` from `src` at byte `src_offset` to `dst` at `dst_offset` (maybe across devices)."""
    src: BufferSpec
    dst: BufferSpec
    src_offset: int
    dst_offset: int
    nbytes: int
    name: str = "copy"
    kind: str = "copy"
    queue: str = "copy"

    @property
    def device(self) -> str:
        return self.dst.device


@dataclass(eq=False)
class NetAllReduce:
    """`count` elements of `src` at element `src_offset`, reduced with `op` over every process of the
    world (an MPI allreduce, run by the `net` queue of `dst`'s device), written to `dst` at
    `dst_offset`; the same range of the same buffer means in place. `mean` divides by the number of
    partials in the world: `local_parts` (this process's devices, reduced before) times the processes.
    The graph names no communicator: the net queue of each device has its own (atensor/dist/)."""
    src: BufferSpec
    dst: BufferSpec
    src_offset: int
    dst_offset: int
    count: int
    op: ReduceOp
    mean: bool = False
    local_parts: int = 1
    name: str = "net_allreduce"
    kind: str = "allreduce"
    queue: str = "net"

    @property
    def device(self) -> str:
        return self.dst.device


Work = Union[Kernel, Copy, NetAllReduce]


@dataclass(eq=False)
class Task:
    """One node of the TaskGraph: the work, where it runs, what it touches and whom it waits for."""
    id: int
    work: Work
    accesses: tuple[Access, ...]
    deps: set[int] = field(default_factory=set)

    @property
    def device(self) -> str:
        return self.work.device

    @property
    def name(self) -> str:
        return self.work.name

    @property
    def queue(self) -> str:
        return self.work.queue


class RaceError(AssertionError):
    """Two tasks with no path between them touch the same bytes and one writes."""


class TaskGraph:
    """Tasks in topological order with dependency edges derived from their accesses."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        # per buffer: the accesses so far, newest last, pruned when a write covers them
        self._history: dict[BufferSpec, list[tuple[int, Access]]] = {}

    def add(self, work: Work, accesses: Iterable[Access]) -> Task:
        """Appends a task; edges to every earlier task it conflicts with (RAW, WAR, WAW)."""
        task = Task(len(self.tasks), work, tuple(accesses))
        for acc in task.accesses:
            history = self._history.setdefault(acc.buffer, [])
            for other_id, other in history:
                if other_id != task.id and (acc.mode == "w" or other.mode == "w") and acc.overlaps(other):
                    task.deps.add(other_id)
        for acc in task.accesses:
            history = self._history[acc.buffer]
            if acc.mode == "w":
                history[:] = [(i, a) for i, a in history if not acc.covers(a)]
            history.append((task.id, acc))
        self.tasks.append(task)
        return task

    def __len__(self) -> int:
        return len(self.tasks)

    def edges(self) -> list[tuple[int, int]]:
        return [(d, t.id) for t in self.tasks for d in sorted(t.deps)]

    def buffers(self) -> set[BufferSpec]:
        return {a.buffer for t in self.tasks for a in t.accesses}

