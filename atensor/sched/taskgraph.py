"""The TaskGraph: what one realize runs, and which task must wait for which.

Why a task graph and not a list: the devices' queues run concurrently, so the order of a list says
nothing about what may overlap. Each task says which byte ranges of which buffers it reads and
writes; an edge a -> b exists when b touches bytes a touched and one of them writes (read after
write, write after read, write after write). Tasks with no path between them may run at the same
time on different queues; the race check below proves that such tasks never touch the same bytes
with a write. Ranges, not whole buffers, are compared so that the chunks of an allreduce that write
disjoint parts of one buffer stay concurrent.

Edges to work still pending from *earlier* realizes are not in the graph: that work is on the
queues already, and hcq/ orders the new tasks after it through each buffer's pending writers and
readers (timeline signal values), so one graph never has to know about another.

Invariant: `tasks` is in a topological order (every edge goes from an earlier to a later task).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from atensor.graph.node import BufferSpec, Node


@dataclass(frozen=True)
class Access:
    """Bytes [start, end) of `buffer`, read ("r") or written ("w") by a task."""
    buffer: BufferSpec
    mode: str
    start: int
    end: int

    def overlaps(self, other: Access) -> bool:
        return self.buffer is other.buffer and self.start < other.end and other.start < self.end


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


Work = Union[Kernel, Copy]


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
                history[:] = [(i, a) for i, a in history if not (acc.start <= a.start and a.end <= acc.end)]
            history.append((task.id, acc))
        self.tasks.append(task)
        return task

    def __len__(self) -> int:
        return len(self.tasks)

    def edges(self) -> list[tuple[int, int]]:
        return [(d, t.id) for t in self.tasks for d in sorted(t.deps)]

    def buffers(self) -> set[BufferSpec]:
        return {a.buffer for t in self.tasks for a in t.accesses}


def check_race_free(graph: TaskGraph, edges: Optional[Iterable[tuple[int, int]]] = None) -> None:
    """Proves that every two tasks with no path between them touch disjoint bytes wherever one of
    them writes (concrete ranges: interval arithmetic). Raises RaceError with a counterexample.
    `edges` overrides the graph's own edges (to check a graph with one edge removed)."""
    edge_list = list(graph.edges() if edges is None else edges)
    n = len(graph.tasks)
    preds: list[set[int]] = [set() for _ in range(n)]
    for a, b in edge_list:
        preds[b].add(a)
    # reach[i]: bitmask of tasks with a path to i (tasks are topologically ordered)
    reach = [0] * n
    for i in range(n):
        mask = 0
        for p in preds[i]:
            mask |= reach[p] | (1 << p)
        reach[i] = mask
    by_buffer: dict[BufferSpec, list[tuple[int, Access]]] = {}
    for task in graph.tasks:
        for acc in task.accesses:
            by_buffer.setdefault(acc.buffer, []).append((task.id, acc))
    for buf, accesses in by_buffer.items():
        for (i, a), (j, b) in itertools.combinations(accesses, 2):
            if i == j or (a.mode == "r" and b.mode == "r") or not a.overlaps(b):
                continue
            lo, hi = (i, j) if i < j else (j, i)
            if not (reach[hi] >> lo) & 1:
                start, end = max(a.start, b.start), min(a.end, b.end)
                raise RaceError(
                    f"race on {buf}: task {i} ({graph.tasks[i].name}, {a.mode}) and task {j} "
                    f"({graph.tasks[j].name}, {b.mode}) both touch bytes [{start}, {end}) with no "
                    f"dependency path between them")
