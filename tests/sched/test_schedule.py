"""sched/: fusion, realization points, dependency edges and the race check."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.sched.schedule import schedule
from atensor.graph.taskgraph import Access, Copy, RaceError, TaskGraph
from atensor.sched.racecheck import check_race_free


def _roots(*tensors: Tensor) -> list[Node]:
    roots = []
    for t in tensors:
        n = t.node
        spec = BufferSpec(n.device, n.size, n.dtype)
        roots.append(Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), View.create((n.size,)).reshape(n.shape)))
    return roots


def test_twenty_elementwise_ops_and_a_sum_are_one_kernel():
    x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8))
    y = x
    ref = x.numpy()
    for i in range(20):
        y = (y * 1.01 + 0.5) if i % 2 == 0 else y.relu()
        ref = (ref * np.float32(1.01) + np.float32(0.5)) if i % 2 == 0 else np.maximum(ref, 0)
    out = y.sum(axis=1)
    graph = schedule(_roots(out)).graph
    assert len(graph.tasks) == 1 and graph.tasks[0].work.kind == "kernel"
    assert graph.tasks[0].name == "mul_add_relu_sum 8x8"  # its ops in the order they run, its shape
    np.testing.assert_allclose(out.numpy(), ref.sum(1), rtol=1e-5)


def test_contiguous_is_a_realization_point_and_shared_values_are_computed_once():
    x = Tensor(np.ones((4, 4), dtype=np.float32))
    shared = (x * 2).exp()
    a, b = shared.sum(0), shared.max(1)
    graph = schedule(_roots(a, b)).graph
    assert len(graph.tasks) == 3  # shared once, then each output reads it
    assert graph.tasks[1].deps == {0} and graph.tasks[2].deps == {0}
    c = (x + 1).contiguous() * 3
    assert len(schedule(_roots(c)).graph.tasks) == 2


def test_copy_to_another_device_is_a_copy_task_on_the_copy_queue():
    x = Tensor(np.arange(8, dtype=np.float32))
    y = (x * 2).to("CPU:1") + 1
    graph = schedule(_roots(y)).graph
    kinds = [t.work.kind for t in graph.tasks]
    assert kinds == ["kernel", "copy", "kernel"]
    copy = graph.tasks[1].work
    assert isinstance(copy, Copy) and copy.src.device == "CPU:0" and copy.dst.device == "CPU:1"
    assert [t.device for t in graph.tasks] == ["CPU:0", "CPU:1", "CPU:1"]
    assert graph.tasks[1].deps == {0} and graph.tasks[2].deps == {1}
    np.testing.assert_array_equal(y.numpy(), np.arange(8) * 2 + 1)


def test_reads_of_an_old_version_run_before_the_assign_that_overwrites_it():
    t = Tensor(np.arange(4, dtype=np.float32))
    before = t * 10              # reads version 0
    t.assign(t + 1)              # version 1
    after = t * 10               # reads version 1
    Tensor.realize(before, after, t).wait()
    assert before.tolist() == [0, 10, 20, 30]
    assert after.tolist() == [10, 20, 30, 40]
    assert t.tolist() == [1, 2, 3, 4]


def test_edges_come_from_overlapping_byte_ranges():
    a = BufferSpec("CPU:0", 16, Tensor([1.0]).dtype)
    g = TaskGraph()
    w_lo = g.add(Copy(a, a, 0, 0, 0, name="w_lo"), [Access(a, "w", 0, 32)])
    w_hi = g.add(Copy(a, a, 0, 0, 0, name="w_hi"), [Access(a, "w", 32, 64)])
    read_all = g.add(Copy(a, a, 0, 0, 0, name="r"), [Access(a, "r", 0, 64)])
    rewrite = g.add(Copy(a, a, 0, 0, 0, name="w2"), [Access(a, "w", 16, 48)])
    assert w_lo.deps == set() and w_hi.deps == set()        # disjoint writes stay concurrent
    assert read_all.deps == {w_lo.id, w_hi.id}               # read after write
    assert rewrite.deps == {w_lo.id, w_hi.id, read_all.id}   # write after read and after write
    check_race_free(g)
    with pytest.raises(RaceError, match="race on"):
        check_race_free(g, [e for e in g.edges() if e != (read_all.id, rewrite.id)])


def test_race_checker_rejects_scheduler_graphs_with_an_edge_removed():
    x = Tensor(np.ones(16, dtype=np.float32))
    y = ((x * 2).contiguous() + 1).contiguous().sum()
    graph = schedule(_roots(y)).graph
    check_race_free(graph)
    for edge in graph.edges():
        with pytest.raises(RaceError):
            check_race_free(graph, [e for e in graph.edges() if e != edge])
