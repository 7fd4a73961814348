"""The schedule cache: structurally equal graphs reuse one TaskGraph template, with identical results."""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

import atensor
from atensor import Tensor
from atensor.sched import cache


def _step(w: Tensor, x: Tensor) -> Tensor:
    return ((x @ w).relu() * 2 + 1).sum(axis=0)


def test_a_repeated_structure_hits_the_cache_and_gives_the_same_values():
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((8, 4)).astype(np.float32))
    first = _step(w, Tensor(rng.standard_normal((16, 8)).astype(np.float32)))
    first.realize().wait()
    hits, misses = cache.stats["hits"], cache.stats["misses"]
    for _ in range(3):
        data = rng.standard_normal((16, 8)).astype(np.float32)
        out = _step(w, Tensor(data))
        out.realize().wait()
        np.testing.assert_allclose(out.numpy(), (np.maximum(data @ w.numpy(), 0) * 2 + 1).sum(0), rtol=1e-5)
    assert (cache.stats["hits"], cache.stats["misses"]) == (hits + 3, misses)  # each realize hit, none missed


def test_cached_assign_chains_keep_versions_and_values_right():
    counter = Tensor(np.zeros(4, dtype=np.float32))
    for i in range(6):  # the same assign structure each time: hits after the first
        counter.assign(counter * 2 + 1)
        snapshot = (counter + 0).contiguous()
        Tensor.realize(counter, snapshot).wait()
        assert snapshot.tolist() == [float(2 ** (i + 1) - 1)] * 4
    assert counter.tolist() == [63.0] * 4


def test_a_hit_schedules_the_same_task_graph_as_a_fresh_schedule():
    from atensor.graph.node import BufferSpec, Node
    from atensor.graph.ops import Ops
    from atensor.graph.view import View
    from atensor.sched.schedule import schedule

    def roots(t: Tensor) -> list[Node]:
        n = t.node
        spec = BufferSpec(n.device, n.size, n.dtype)
        return [Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), View.create((n.size,)).reshape(n.shape))]

    def shape_of(graph) -> list:
        return [(t.work.kind, t.work.name, t.device, sorted(t.deps), [(a.mode, a.start, a.end) for a in t.accesses])
                for t in graph.tasks]

    x = Tensor(np.ones((4, 4), dtype=np.float32))
    a = schedule(roots(((x * 3).to("CPU:1").exp().contiguous() + 1).sum()))
    with atensor.Context(schedule_cache=False):
        y = Tensor(np.ones((4, 4), dtype=np.float32))
        fresh = schedule(roots(((y * 3).to("CPU:1").exp().contiguous() + 1).sum()))
    z = Tensor(np.ones((4, 4), dtype=np.float32))
    hit = schedule(roots(((z * 3).to("CPU:1").exp().contiguous() + 1).sum()))
    assert fresh.template is None and hit.template is not None  # scheduled afresh, and from the cache
    assert shape_of(a.graph) == shape_of(fresh.graph) == shape_of(hit.graph)
    assert {t.work.ast for t in hit.graph.tasks if t.work.kind == "kernel"} == \
        {t.work.ast for t in fresh.graph.tasks if t.work.kind == "kernel"}
    # a hit gives fresh temporaries and the new graph's own buffers
    bufs = lambda g: {a.buffer for t in g.tasks for a in t.accesses}  # noqa: E731
    assert not bufs(a.graph) & bufs(hit.graph)


@given(ops=st.lists(st.sampled_from(["add", "mul", "exp", "T", "sum0", "copy"]), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_with_and_without_the_cache_every_program_gives_the_same_values(ops, seed):
    data = np.random.default_rng(seed).standard_normal((3, 3)).astype(np.float32)

    def program() -> np.ndarray:
        t = Tensor(data)
        for op in ops:
            t = {"add": lambda v: v + 1, "mul": lambda v: v * 0.5, "exp": lambda v: (v * 0.1).exp(),
                 "T": lambda v: v.T if v.ndim == 2 else v, "sum0": lambda v: v.sum(0, keepdim=True),
                 "copy": lambda v: v.to("CPU:1" if v.device == "CPU:0" else "CPU:0")}[op](t)
        return t.numpy()

    with atensor.Context(schedule_cache=False):
        expected = program()
    np.testing.assert_allclose(program(), expected, rtol=1e-6)
    misses = cache.stats["misses"]
    np.testing.assert_allclose(program(), expected, rtol=1e-6)  # now from the cache
    assert cache.stats["misses"] == misses, "a realize of the program's third run missed the cache"
