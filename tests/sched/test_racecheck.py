"""The race check: tasks with no path between them never touch the same bytes where one writes.

The reference below is the definition itself (a transitive closure and every pair of accesses), so
the fast checker is compared against it on random graphs, on the scheduler's own graphs and on both
with one edge dropped; symbolic ranges are proved with z3 for every value of their variables.
"""
from __future__ import annotations

import itertools
import re
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

from atensor import Tensor
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import Variable
from atensor.graph.view import View
from atensor.sched import prove
from atensor.sched.racecheck import check_race_free
from atensor.sched.schedule import schedule
from atensor.graph.taskgraph import Access, Copy, RaceError, TaskGraph


def reference_races(graph: TaskGraph, edges) -> bool:
    """True when some two tasks with no path between them touch a common byte and one writes."""
    n = len(graph.tasks)
    reach = [set() for _ in range(n)]
    preds = [set() for _ in range(n)]
    for a, b in edges:
        preds[b].add(a)
    for i in range(n):
        for p in preds[i]:
            reach[i] |= reach[p] | {p}
    for ti, tj in itertools.combinations(graph.tasks, 2):
        ordered = ti.id in reach[tj.id]
        for a in ti.accesses:
            for b in tj.accesses:
                if a.buffer is b.buffer and "w" in (a.mode + b.mode) and a.start < b.end and b.start < a.end \
                        and a.start < a.end and b.start < b.end and not ordered:
                    return True
    return False


def agrees(graph: TaskGraph, edges) -> bool:
    """Runs the checker with `edges`; asserts it agrees with the reference; True when it rejected."""
    expected = reference_races(graph, edges)
    try:
        check_race_free(graph, edges)
        rejected = False
    except RaceError:
        rejected = True
    assert rejected == expected, f"checker {'rejected' if rejected else 'accepted'}, reference disagrees"
    return rejected


def dropping_each_edge(graph: TaskGraph) -> list[bool]:
    edges = graph.edges()
    return [agrees(graph, edges[:k] + edges[k + 1:]) for k in range(len(edges))]


def _spec(size: int = 64) -> BufferSpec:
    return BufferSpec("CPU", size, dtypes.uint8)


def _roots(*tensors: Tensor) -> list[Node]:
    roots = []
    for t in tensors:
        n = t.node
        spec = BufferSpec(n.device, n.size, n.dtype)
        view = View.create((n.size,)).reshape(n.shape)
        roots.append(Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), view))
    return roots


# ---- concrete ranges ------------------------------------------------------------------------------------
accesses = st.lists(st.tuples(st.integers(0, 2), st.sampled_from("rw"), st.integers(0, 40),
                              st.integers(1, 24)), min_size=1, max_size=3)


@given(st.lists(accesses, min_size=2, max_size=14), st.data())
def test_checker_agrees_with_the_definition_on_random_graphs_with_random_edges_dropped(tasks, data):
    buffers = [_spec(), _spec(), _spec()]
    graph = TaskGraph()
    for accs in tasks:
        graph.add(Copy(buffers[0], buffers[1], 0, 0, 1),
                  [Access(buffers[b], mode, s, s + n) for b, mode, s, n in accs])
    edges = graph.edges()
    assert not agrees(graph, edges)  # what TaskGraph.add builds is race-free
    keep = data.draw(st.lists(st.booleans(), min_size=len(edges), max_size=len(edges)))
    agrees(graph, [e for e, k in zip(edges, keep) if k])


def test_partial_overlaps_and_disjoint_chunks():
    buf = _spec(100)
    graph = TaskGraph()
    graph.add(Copy(buf, buf, 0, 0, 1), [Access(buf, "w", 0, 50)])      # 0
    graph.add(Copy(buf, buf, 0, 0, 1), [Access(buf, "w", 50, 100)])    # 1: disjoint chunk, concurrent
    graph.add(Copy(buf, buf, 0, 0, 1), [Access(buf, "r", 40, 60)])     # 2: reads both
    assert graph.tasks[1].deps == set() and graph.tasks[2].deps == {0, 1}
    check_race_free(graph)
    with pytest.raises(RaceError, match=r"task 1 .* task 2 .* bytes \[50, 60\)"):
        check_race_free(graph, [(0, 2)])


# ---- the scheduler's graphs ------------------------------------------------------------------------------
def _programs():
    x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8))
    a = (x * 2).exp()
    yield [a.sum(0), a.max(1), (a + 1).contiguous().sum()]
    y = Tensor(np.zeros(16, dtype=np.float32))
    y[2:6] = x[0, :4]
    y[8:12] = x[1, :4] * 3
    yield [y]
    z = Tensor(np.ones((4, 4), dtype=np.float32))
    w = (z @ z.T).to("CPU:1") + 1
    yield [w, (z.sum(0).to("CPU:1") * 2).contiguous()]


def test_scheduler_graphs_are_accepted_and_rejected_with_any_needed_edge_dropped():
    rejections = 0
    for tensors in _programs():
        graph = schedule(_roots(*tensors)).graph
        assert not agrees(graph, graph.edges())
        rejections += sum(dropping_each_edge(graph))
    assert rejections > 0


# ---- symbolic ranges ---------------------------------------------------------------------------------
def _writer(graph: TaskGraph, buf: BufferSpec, mode: str, start, end):
    return graph.add(Copy(buf, buf, 0, 0, 1, name=f"{mode}{len(graph)}"), [Access(buf, mode, start, end)])


def test_rows_at_start_pos_and_start_pos_plus_one_are_disjoint_for_every_value():
    s = Variable("start_pos", 0, 15)
    buf = _spec(16 * 16)
    graph = TaskGraph()
    _writer(graph, buf, "w", 16 * s, 16 * s + 16)
    _writer(graph, buf, "w", 16 * (s + 1), 16 * (s + 1) + 16)
    assert graph.edges() == []  # the interval test on the linear difference sees they never overlap
    check_race_free(graph)


def test_z3_proves_what_intervals_cannot_even_and_odd_slots():
    s, t = Variable("s", 0, 10), Variable("t", 0, 10)
    buf = _spec(64)
    graph = TaskGraph()
    _writer(graph, buf, "w", 2 * s, 2 * s + 1)
    _writer(graph, buf, "w", 2 * t + 1, 2 * t + 2)
    assert graph.edges() == [(0, 1)]  # TaskGraph.add cannot tell by intervals: a conservative edge
    calls = prove.stats.z3_calls
    check_race_free(graph, [])  # ... that z3 shows unnecessary: the slots never meet
    assert prove.stats.z3_calls == calls + 1


def test_a_symbolic_race_names_tasks_buffer_bytes_and_values():
    s, t = Variable("s", 0, 7), Variable("t", 3, 9)
    buf = _spec(64)
    graph = TaskGraph()
    _writer(graph, buf, "w", 4 * s, 4 * s + 4)
    _writer(graph, buf, "r", 4 * t, 4 * t + 4)
    assert graph.edges() == [(0, 1)]
    check_race_free(graph)
    with pytest.raises(RaceError) as err:
        check_race_free(graph, [])
    msg = str(err.value)
    assert "task 0" in msg and "task 1" in msg and str(buf) in msg
    s_val, t_val = int(re.search(r"\bs=(\d+)", msg)[1]), int(re.search(r"\bt=(\d+)", msg)[1])
    assert s_val == t_val and f"[{4 * s_val}, {4 * s_val + 4})" in msg


def test_a_symbolic_write_against_concrete_neighbours():
    s = Variable("s", 0, 3)
    buf = _spec(64)
    graph = TaskGraph()
    _writer(graph, buf, "w", 0, 16)               # 0: concrete, before s's range
    _writer(graph, buf, "w", 16 + 4 * s, 20 + 4 * s)  # 1: somewhere in [16, 32)
    _writer(graph, buf, "r", 32, 64)              # 2: after it
    _writer(graph, buf, "r", 24, 28)              # 3: overlaps for s = 2
    assert graph.tasks[1].deps == set() and graph.tasks[2].deps == set() and graph.tasks[3].deps == {1}
    check_race_free(graph)
    with pytest.raises(RaceError, match="s=2"):
        check_race_free(graph, [])


def test_a_realized_kv_cache_graph_with_its_edge_dropped_is_rejected():
    s = Variable("start_pos", 0, 7)
    cache = Tensor(np.zeros((8, 4), dtype=np.float32))
    sp = s.bind(3)
    row = cache.shrink(((sp, sp + 1), None))
    row.assign(Tensor(np.ones((1, 4), dtype=np.float32)))
    out = cache.shrink(((sp, sp + 1), None)) * 2
    graph = schedule([cache.node.base(), *_roots(out)]).graph
    assert any(not isinstance(a.start, int) for t in graph.tasks for a in t.accesses)  # symbolic ranges
    check_race_free(graph)
    edges = graph.edges()
    assert edges
    for k in range(len(edges)):
        with pytest.raises(RaceError, match="start_pos="):
            check_race_free(graph, edges[:k] + edges[k + 1:])


# ---- cost ---------------------------------------------------------------------------------------------
def test_ten_thousand_task_pipeline_is_checked_in_near_linear_time():
    """A pipeline of 10,000 tasks over 64 buffers in chunks; the old all-pairs check took minutes."""
    bufs = [_spec(4096) for _ in range(64)]
    graph = TaskGraph()
    for k in range(10_000):
        src, dst = bufs[k % 64], bufs[(k * 7 + 1) % 64]
        chunk = (k // 64) % 16 * 256
        graph.add(Copy(src, dst, chunk, chunk, 256),
                  [Access(src, "r", chunk, chunk + 256), Access(dst, "w", chunk, chunk + 256)])
    start = time.perf_counter()
    check_race_free(graph)
    elapsed = time.perf_counter() - start
    assert elapsed < 10  # generous: shared CI machines; locally well under a second
    last = len(graph.tasks) - 1
    with pytest.raises(RaceError, match=f"task {last}"):
        check_race_free(graph, [e for e in graph.edges() if e[1] != last])


def test_ring_allreduce_graphs_with_a_needed_edge_dropped_are_rejected():
    allreduce = pytest.importorskip("atensor.sched.allreduce")
    from atensor.graph.ops import ReduceOp
    devices = ("CPU:0", "CPU:1", "CPU:2", "CPU:3")
    graph = TaskGraph()
    ins = [(BufferSpec(d, 1003, dtypes.float32), 0) for d in devices]
    outs = [(BufferSpec(d, 1003, dtypes.float32), 0) for d in devices]
    allreduce.lower(graph, ReduceOp.SUM, False, dtypes.float32, devices, ins, outs, 1003, algorithm="ring")
    assert not agrees(graph, graph.edges())
    assert any(dropping_each_edge(graph))  # reduce-scatter and all-gather steps need their edges
