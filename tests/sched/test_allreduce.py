"""Allreduce: naive and ring lowerings against numpy, the cost model's choices, bucketing, and the
pipelining of ring steps (copies on copy queues overlapping reduce kernels on compute queues)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.graph.node import BufferSpec, GraphError, Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.sched import allreduce as ar
from atensor.sched import schedule as sched
from atensor.graph.taskgraph import TaskGraph
from atensor.sched.racecheck import check_race_free

RNG = np.random.default_rng(3)
REFERENCE = {"sum": lambda a: a.sum(0), "max": lambda a: a.max(0), "mean": lambda a: a.mean(0)}


def devices(n: int) -> tuple[str, ...]:
    return tuple(f"CPU:{i}" for i in range(n))


def parts_of(data: np.ndarray, devs: tuple[str, ...]) -> list[Tensor]:
    return [Tensor(row, device=d) for row, d in zip(data, devs)]


def graph_of(*tensors: Tensor) -> TaskGraph:
    """The TaskGraph that realizing the shards of `tensors` into fresh buffers would run."""
    roots = []
    for t in tensors:
        for s in t.node.src:
            spec = BufferSpec(s.device, s.size, s.dtype)
            whole = View.create((s.size,)).reshape(s.shape)
            roots.append(Node.make(Ops.ASSIGN, s.dtype, (spec.node(0), s), whole))
    return sched.schedule(roots).graph


def steps(graph: TaskGraph) -> list[ar.AllReduceStep]:
    return [t.work.step for t in graph.tasks if t.work.kind == ar.ALLREDUCE_KIND]


@pytest.mark.parametrize("size", [1, 7, 1000, 2**20 + 3])
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("algorithm", ["naive", "ring"])
def test_allreduce_matches_numpy(algorithm, op, size):
    """Every device ends with op over all partials, for sizes that split unevenly into segments."""
    n = 4 if size > 1000 else 3
    data = RNG.standard_normal((n, size)).astype(np.float32)
    out = Tensor.allreduce(parts_of(data, devices(n)), op, algorithm)
    out.realize().wait()
    assert out.device == devices(n) and out.shape == (size,)
    for shard in out.shards:
        np.testing.assert_allclose(shard.numpy(), REFERENCE[op](data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ["naive", "ring"])
def test_allreduce_on_every_device_count(n, algorithm):
    data = RNG.integers(-50, 50, (n, 37)).astype(np.int32)
    out = Tensor.allreduce(parts_of(data, devices(n)), "sum", algorithm)
    for shard in out.shards:
        np.testing.assert_array_equal(shard.numpy(), data.sum(0))
    prod = Tensor.allreduce(parts_of(data % 3 + 1, devices(n)), "prod", algorithm)
    np.testing.assert_array_equal(prod.shards[-1].numpy(), (data % 3 + 1).prod(0))


def test_mean_of_integers_is_an_error():
    parts = parts_of(np.ones((2, 3), np.int32), devices(2))
    with pytest.raises(GraphError, match="float"):
        Tensor.allreduce(parts, "mean").realize().wait()


@pytest.mark.parametrize("n", [2, 4])
def test_ring_structure(n):
    """Ring: 2(n-1) steps, each a copy to the next device per chunk; reduce kernels only in the
    reduce-scatter half; every step's task on its device's copy or compute queue; race-free."""
    out = Tensor.allreduce([Tensor.empty(1000, device=d) for d in devices(n)], "sum", "ring")
    graph = graph_of(out)
    check_race_free(graph)
    chunks = 1 + max(s.chunk for s in steps(graph))
    copies = [t for t in graph.tasks if isinstance(t.work, ar.AllReduceCopy)]
    kernels = [t for t in graph.tasks if isinstance(t.work, ar.AllReduceKernel)]
    assert len(copies) == 2 * (n - 1) * n * chunks and len(kernels) == (n - 1) * n * chunks
    assert {t.queue for t in copies} == {"copy"} and {t.queue for t in kernels} == {"compute"}
    assert {t.work.step.phase for t in kernels} == {"reduce-scatter"}
    for t in copies:
        assert t.work.src.device != t.work.dst.device  # every ring copy crosses to the next device
        assert int(t.work.dst.device[-1]) == (int(t.work.src.device[-1]) + 1) % n


def test_naive_structure():
    """Naive: n-1 copies into the root, one reduce kernel, n-1 copies out: 2n - 1 tasks."""
    out = Tensor.allreduce([Tensor.empty(1000, device=d) for d in devices(4)], "sum", "naive")
    graph = graph_of(out)
    phases = [s.phase for s in steps(graph)]
    assert phases == ["gather"] * 3 + ["reduce"] + ["broadcast"] * 3


def test_cost_model_choices():
    """Small buffers go naive (fewest tasks), large ones ring (bandwidth); more data, more chunks."""
    model = ar.CostModel(cores=2)
    for n in (2, 3, 4):
        assert model.choose(n, 4 << 10).algorithm == "naive"
        assert model.choose(n, 64 << 20).algorithm == "ring"
    chunks = [model.choose(4, size << 20).chunks for size in (16, 64, 256, 1024)]
    assert chunks == sorted(chunks) and chunks[-1] > chunks[0]
    # a faster task launch moves the crossover down; forcing keeps the best chunk count
    cheap = dataclasses.replace(model, alpha=1e-6)
    assert cheap.choose(4, 256 << 10).algorithm == "ring"
    assert model.choose(4, 4 << 10, algorithm="ring").algorithm == "ring"
    # only one device needs the result: a reduce, which the ring cannot do cheaper
    assert model.choose(4, 64 << 20, receivers=1).algorithm == "naive"
    # the predictions are the formulas in the code: naive pays its serial gather, ring its tasks
    assert model.naive(4, 0, 4) == pytest.approx(7 * model.alpha)
    assert model.ring(4, 0, 2) == pytest.approx(3 * 4 * 3 * 2 * model.alpha)


def test_auto_uses_the_model():
    small = graph_of(Tensor.allreduce([Tensor.empty(16, device=d) for d in devices(4)]))
    assert {s.algorithm for s in steps(small)} == {"naive"}
    big = graph_of(Tensor.allreduce([Tensor.empty(4 << 20, device=d) for d in devices(4)]))
    assert {s.algorithm for s in steps(big)} == {"ring"}


def test_gather_of_one_result_reduces_to_that_device_only():
    """`sum` of a sharded tensor moved to one device needs the reduction there only: no broadcast."""
    t = Tensor(RNG.standard_normal((8, 5)).astype(np.float32)).shard(devices(4), axis=0)
    total = t.sum(axis=0).to("CPU:2")
    roots = [Node.make(Ops.ASSIGN, total.dtype, (BufferSpec("CPU:2", 5, total.dtype).node(0), total.node),
                       View.create((5,)))]
    graph = sched.schedule(roots).graph
    assert [s.phase for s in steps(graph)] == ["gather"] * 3 + ["reduce"]
    np.testing.assert_allclose(total.numpy(), t.numpy().sum(0), rtol=1e-5)


def test_allreduces_of_one_realize_share_a_bucket():
    """Three sums over a sharded axis realized together run as one allreduce over a bucket."""
    devs = devices(3)
    data = [RNG.standard_normal((6, k)).astype(np.float32) for k in (5, 11, 3)]
    sums = [(Tensor(d).shard(devs, axis=0) * 2).sum(axis=0) for d in data]
    graph = graph_of(*sums)
    check_race_free(graph)
    assert [s.phase for s in steps(graph)].count("reduce") == 1  # one naive allreduce, not three
    sums[0].realize(*sums[1:]).wait()
    for s, d in zip(sums, data):
        for shard in s.shards:
            np.testing.assert_allclose(shard.numpy(), (d * 2).sum(0), rtol=1e-5)


def test_allreduces_of_realized_buffers_write_their_results_without_copies():
    """Collectives over partials that are realized buffers already share no bucket: each is an
    allreduce of its own either way, so its result is written where it is stored (not into an output
    bucket and copied out of it: a copy per result that competed with the transfers)."""
    devs = devices(2)
    data = [RNG.standard_normal((2, k)).astype(np.float32) for k in (5, 7, 3)]
    parts = [parts_of(a, devs) for a in data]
    Tensor.realize(*[p for ps in parts for p in ps]).wait()
    outs = [Tensor.allreduce(ps, "sum") for ps in parts]
    graph = graph_of(*outs)
    check_race_free(graph)
    assert all(t.work.kind == ar.ALLREDUCE_KIND for t in graph.tasks), [t.work.name for t in graph.tasks]
    assert [s.phase for s in steps(graph)].count("reduce") == 3
    outs[0].realize(*outs[1:]).wait()
    for out, a in zip(outs, data):
        for shard in out.shards:
            np.testing.assert_allclose(shard.numpy(), a.sum(0), rtol=1e-5)


def test_data_parallel_gradients_are_bucketed():
    """The weight gradients of a data-parallel step are one bucketed allreduce."""
    devs = devices(2)
    x = Tensor(RNG.standard_normal((6, 4)).astype(np.float32)).shard(devs, axis=0)
    w1 = Tensor(RNG.standard_normal((4, 5)).astype(np.float32)).to(devs)
    w2 = Tensor(RNG.standard_normal((5, 2)).astype(np.float32)).to(devs)
    for w in (w1, w2):
        w.requires_grad = True
    ((x @ w1).relu() @ w2).sum().backward()
    graph = graph_of(w1.grad, w2.grad)
    assert [s.phase for s in steps(graph)].count("reduce") == 1


def test_ring_chunks_pipeline_copies_and_reduces(monkeypatch):
    """Chunks are disjoint byte ranges: the copy of chunk i+1 has no edge to the reduce of chunk i,
    so the copy queue may run it while the compute queue reduces chunk i (checked on the graph; the
    stamps of the run are checked below)."""
    monkeypatch.setattr(ar, "MODEL", dataclasses.replace(ar.MODEL, alpha=1e-7, chunk_choices=(4,)))
    out = Tensor.allreduce([Tensor.empty(4096, device=d) for d in devices(4)], "sum", "ring")
    graph = graph_of(out)
    reach: list[set[int]] = []
    for task in graph.tasks:
        reach.append(set(task.deps).union(*(reach[d] for d in task.deps)))
    tasks = graph.tasks
    pairs = 0
    for k in (t for t in tasks if isinstance(t.work, ar.AllReduceKernel) and t.work.step.step == 0):
        nxt = [c for c in tasks if isinstance(c.work, ar.AllReduceCopy) and c.device == k.device
               and c.work.step == dataclasses.replace(k.work.step, chunk=k.work.step.chunk + 1)]
        for c in nxt:
            assert k.id not in reach[c.id] and c.id not in reach[k.id]
            pairs += 1
    assert pairs == 4 * 3  # every device, chunks 0..2 against 1..3


def test_ring_on_four_devices_overlaps_copy_and_compute_queues(monkeypatch):
    """The queues' stamps of a chunked ring allreduce on 4 devices: some copy-queue span runs while
    some compute-queue span runs."""
    monkeypatch.setattr(ar, "MODEL", dataclasses.replace(ar.MODEL, chunk_choices=(8,)))
    n, size = 4, 1 << 20
    data = RNG.standard_normal((n, size)).astype(np.float32)
    parts = parts_of(data, devices(n))
    for p in parts:
        p.realize().wait()
    out = Tensor.allreduce(parts, "sum", "ring")
    with atensor.profile() as prof:
        out.realize().wait()
    spans = [s for s in prof.spans if s.kind == ar.ALLREDUCE_KIND]
    copies = [s for s in spans if s.queue == "copy"]
    computes = [s for s in spans if s.queue == "compute"]
    assert len(copies) == 2 * 3 * 4 * 8 and len(computes) == 3 * 4 * 8
    overlapping = [(c, k) for c in copies for k in computes
                   if c.start_ns < k.end_ns and k.start_ns < c.end_ns]
    assert overlapping, "no copy-queue span overlaps a compute-queue span"
    np.testing.assert_allclose(out.shards[1].numpy(), data.sum(0), rtol=1e-4, atol=1e-4)


def test_allreduce_on_null_devices_schedules_and_runs():
    devs = ("NULL:0", "NULL:1", "NULL:2")
    for algorithm in ("naive", "ring"):
        out = Tensor.allreduce([Tensor.empty(100, device=d) for d in devs], "max", algorithm)
        out.realize().wait()
        assert out.device == devs


def test_allreduce_argument_errors():
    with pytest.raises(ValueError, match="op"):
        Tensor.allreduce(parts_of(np.ones((2, 2), np.float32), devices(2)), "median")
    with pytest.raises(ValueError, match="algorithm"):
        Tensor.allreduce(parts_of(np.ones((2, 2), np.float32), devices(2)), "sum", "tree")
    with pytest.raises(GraphError):
        Tensor.allreduce([Tensor.ones(2, device="CPU:0"), Tensor.ones(3, device="CPU:1")])
