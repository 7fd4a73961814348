"""The race check: every two tasks of a TaskGraph with no path between them touch disjoint bytes of
each buffer they share wherever one of them writes.

Why not "all pairs with a reachability matrix": a 10,000-task graph has 50 million pairs and a
transitive closure of 10^8 bits, and the test suite runs this check on every graph it schedules. So
concrete ranges are checked by a sweep that keeps, per buffer, a *shadow* of its bytes: disjoint
segments, each with the last task that wrote it and the tasks that read it since. Tasks are visited
in topological order; a read must be reachable from the segment's last writer, a write from the
last writer and every reader since. A write then becomes the only history of its bytes. This is
enough (the argument of vector-clock race detectors such as FastTrack): if A and B conflict on a
byte and some writes W1..Wk of that byte lie between them, each consecutive pair was checked, and
paths compose. Each query is first a direct-edge lookup (TaskGraph.add makes exactly these edges,
so that is the common case), else a backward search pruned to tasks after the source. Cost: near
linear in the number of accesses and segments.

Symbolic ranges (an Access at a view offset like `16*start_pos`) are checked pairwise against every
other access of their buffer with no path between the two tasks: first the exact interval test on
the linear difference (disjoint for every value?), then z3 for what intervals cannot settle (the
disjunction "a before b or b before a" that flips with the values, or integer facts such as parity).
A failure names the two tasks, the buffer, the overlapping bytes and the variables' values.
"""
from __future__ import annotations

import bisect
from typing import Iterable, Optional

from atensor.graph.node import BufferSpec
from atensor.graph.symbolic import SymbolicError, evaluate, is_symbolic, variables_of
from atensor.sched.prove import ProofTimeout, Symbols, find_counterexample
from atensor.graph.taskgraph import Access, RaceError, TaskGraph


class _Reach:
    """Path queries on a DAG whose edges go from lower to higher task ids."""

    def __init__(self, preds: list[set[int]]):
        self.preds = preds
        self._known: set[tuple[int, int]] = set()

    @staticmethod
    def from_edges(n: int, edges: Iterable[tuple[int, int]]) -> _Reach:
        preds: list[set[int]] = [set() for _ in range(n)]
        for a, b in edges:
            if not 0 <= a < b < n:
                raise ValueError(f"edge {a} -> {b} does not go forward in the task order (0..{n - 1})")
            preds[b].add(a)
        return _Reach(preds)

    def path(self, i: int, j: int) -> bool:
        """True when j == i or some path leads from task i to task j (i < j)."""
        if i == j or i in self.preds[j] or (i, j) in self._known:
            return True
        if i > j:
            return False
        stack, seen = [j], {j}
        preds = self.preds
        while stack:
            node = stack.pop()
            for p in preds[node]:
                if p == i:
                    self._known.add((i, j))
                    return True
                if p > i and p not in seen:
                    seen.add(p)
                    stack.append(p)
        return False


class _Shadow:
    """One buffer's bytes as sorted disjoint segments [start, end) with (last writer, readers since)."""
    __slots__ = ("starts", "segs")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.segs: list[list] = []  # [start, end, writer or -1, readers tuple]

    def _split(self, at: int) -> None:
        k = bisect.bisect_right(self.starts, at) - 1
        if k >= 0:
            seg = self.segs[k]
            if seg[0] < at < seg[1]:
                self.segs.insert(k + 1, [at, seg[1], seg[2], seg[3]])
                self.starts.insert(k + 1, at)
                seg[1] = at

    def overlapping(self, start: int, end: int) -> list[list]:
        k = max(bisect.bisect_right(self.starts, start) - 1, 0)
        found = []
        while k < len(self.segs) and self.segs[k][0] < end:
            if self.segs[k][1] > start:
                found.append(self.segs[k])
            k += 1
        return found

    def write(self, start: int, end: int, task: int) -> None:
        self._split(start)
        self._split(end)
        lo = bisect.bisect_left(self.starts, start)
        hi = bisect.bisect_left(self.starts, end)
        self.segs[lo:hi] = [[start, end, task, ()]]
        self.starts[lo:hi] = [start]

    def read(self, start: int, end: int, task: int) -> None:
        self._split(start)
        self._split(end)
        lo = bisect.bisect_left(self.starts, start)
        hi = bisect.bisect_left(self.starts, end)
        merged: list[list] = []
        at = start
        for seg in self.segs[lo:hi]:
            if seg[0] > at:
                merged.append([at, seg[0], -1, (task,)])
            readers = seg[3] if seg[3] and seg[3][-1] == task else seg[3] + (task,)
            merged.append([seg[0], seg[1], seg[2], readers])
            at = seg[1]
        if at < end:
            merged.append([at, end, -1, (task,)])
        self.segs[lo:hi] = merged
        self.starts[lo:hi] = [seg[0] for seg in merged]


def check_race_free(graph: TaskGraph, edges: Optional[Iterable[tuple[int, int]]] = None) -> None:
    """Proves that every two tasks with no path between them touch disjoint bytes wherever one of them
    writes; symbolic ranges for every value of their variables. Raises RaceError with a
    counterexample. `edges` overrides the graph's own (to check a graph with one edge removed)."""
    tasks = graph.tasks
    if edges is None:
        for task in tasks:
            if any(d >= task.id for d in task.deps):
                raise ValueError(f"task {task.id} depends on a later task: {sorted(task.deps)}")
        reach = _Reach([task.deps for task in tasks])
    else:
        reach = _Reach.from_edges(len(tasks), edges)
    preds = reach.preds
    shadows: dict[BufferSpec, _Shadow] = {}
    symbolic: dict[BufferSpec, list[tuple[int, Access]]] = {}
    for task in tasks:
        tid = task.id
        # reads first: a task that reads and writes the same bytes does not race with itself
        for acc in sorted(task.accesses, key=lambda a: a.mode != "r"):
            if is_symbolic(acc.start) or is_symbolic(acc.end):
                symbolic.setdefault(acc.buffer, []).append((tid, acc))
                continue
            if acc.start >= acc.end:
                continue
            shadow = shadows.get(acc.buffer)
            if shadow is None:
                shadow = shadows[acc.buffer] = _Shadow()
            for seg in shadow.overlapping(acc.start, acc.end):
                writer, readers = seg[2], seg[3]
                if writer >= 0 and writer not in preds[tid] and not reach.path(writer, tid):
                    _concrete_race(graph, acc.buffer, writer, tid, "w", acc.mode, seg, acc)
                if acc.mode == "w":
                    for r in readers:
                        if r not in preds[tid] and not reach.path(r, tid):
                            _concrete_race(graph, acc.buffer, r, tid, "r", "w", seg, acc)
            if acc.mode == "w":
                shadow.write(acc.start, acc.end, tid)
            else:
                shadow.read(acc.start, acc.end, tid)
    if symbolic:
        _check_symbolic(graph, reach, symbolic)


def _concrete_race(graph: TaskGraph, buf: BufferSpec, i: int, j: int, mode_i: str, mode_j: str,
                   seg: list, acc: Access) -> None:
    start, end = max(seg[0], acc.start), min(seg[1], acc.end)
    raise RaceError(f"race on {buf}: task {i} ({graph.tasks[i].name}, {mode_i}) and task {j} "
                    f"({graph.tasks[j].name}, {mode_j}) both touch bytes [{start}, {end}) with no "
                    f"dependency path between them")


def _check_symbolic(graph: TaskGraph, reach: _Reach, symbolic: dict[BufferSpec, list]) -> None:
    on_buffer: dict[BufferSpec, list[tuple[int, Access, bool]]] = {buf: [] for buf in symbolic}
    for t in graph.tasks:
        for acc in t.accesses:
            found = on_buffer.get(acc.buffer)
            if found is not None:
                found.append((t.id, acc, is_symbolic(acc.start) or is_symbolic(acc.end)))
    for buf, accesses in on_buffer.items():
        for p, (i, a, a_sym) in enumerate(accesses):
            if not a_sym:
                continue
            for q, (j, b, b_sym) in enumerate(accesses):
                if i == j or (b_sym and q < p) or (a.mode == "r" and b.mode == "r"):
                    continue  # the same task, a pair already checked, or two reads
                if reach.path(min(i, j), max(i, j)) or not _may_overlap(a, b):
                    continue
                _prove_disjoint(graph, buf, (i, a), (j, b))


def _may_overlap(a: Access, b: Access) -> bool:
    """False when interval arithmetic shows the ranges disjoint (or one empty) for every value."""
    try:
        return not (a.end <= b.start or b.end <= a.start or a.end <= a.start or b.end <= b.start)
    except SymbolicError:
        return True


def _prove_disjoint(graph: TaskGraph, buf: BufferSpec, first: tuple[int, Access],
                    second: tuple[int, Access]) -> None:
    (i, a), (j, b) = sorted([first, second], key=lambda t: t[0])
    sym = Symbols()
    a0, a1, b0, b1 = (sym.expr(x) for x in (a.start, a.end, b.start, b.end))
    try:
        found = find_counterexample(sym, [a0 < a1, b0 < b1, a0 < b1, b0 < a1])
    except ProofTimeout as err:
        raise RaceError(f"cannot prove tasks {i} ({graph.tasks[i].name}) and {j} ({graph.tasks[j].name}) "
                        f"touch disjoint bytes of {buf}: {err}") from err
    if found is None:
        return
    values = {v.unbound: found[v.name] for x in (a.start, a.end, b.start, b.end) for v in variables_of(x)}
    ra = (evaluate(a.start, values), evaluate(a.end, values))
    rb = (evaluate(b.start, values), evaluate(b.end, values))
    start, end = max(ra[0], rb[0]), min(ra[1], rb[1])
    where = ", ".join(f"{v.name}={value}" for v, value in values.items())
    raise RaceError(f"race on {buf}: task {i} ({graph.tasks[i].name}, {a.mode}, bytes [{a.start}, {a.end})) "
                    f"and task {j} ({graph.tasks[j].name}, {b.mode}, bytes [{b.start}, {b.end})) both touch "
                    f"bytes [{start}, {end}) when {where}, with no dependency path between them")
