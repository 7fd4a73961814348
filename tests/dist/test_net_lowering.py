"""Allreduce across processes, in one process: the hierarchical lowering's tasks (hand-derived), its
values through a stand-in transport, the net track in the profile, and the world's helpers. No
MPI is needed here: `FakeTransport` plays a world where every other process holds the same partials."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import atensor
from atensor import Tensor, dist
from atensor.dist import profile as dist_profile
from atensor.dist.processes import DistError, World
from atensor.dtype import dtypes
from atensor.graph import multi
from atensor.graph.node import BufferSpec
from atensor.graph.ops import ReduceOp
from atensor.graph.taskgraph import NetAllReduce, TaskGraph
from atensor.hcq import net
from atensor.profiler.collector import Profile
from atensor.profiler.events import HostSpan, Span
from atensor.sched import allreduce as ar
from atensor.sched.racecheck import check_race_free

RNG = np.random.default_rng(11)


class FakeTransport:
    """A world of `size` processes that all hold this process's values: an allreduce sum is the value
    times `size`. Records each call's device and length."""

    def __init__(self, size: int) -> None:
        self.size, self.calls = size, []

    def allreduce(self, device: str, send: Optional[np.ndarray], recv: np.ndarray, op: ReduceOp) -> None:
        assert op is ReduceOp.SUM
        self.calls.append((device, recv.size))
        np.multiply(recv if send is None else send, self.size, out=recv)


@pytest.fixture
def two_processes():
    fake = FakeTransport(2)
    net.install(fake)
    try:
        yield fake
    finally:
        net.install(None)


def _lower(algorithm: str, n: int, size: int, mean: bool = False) -> tuple[TaskGraph, list, list]:
    devices = tuple(f"CPU:{i}" for i in range(n))
    graph = TaskGraph()
    ins = [(BufferSpec(d, size, dtypes.float32), 0) for d in devices]
    outs = [(BufferSpec(d, size, dtypes.float32), 0) for d in devices]
    model = ar.CostModel(chunk_choices=(1,))
    ar.lower(graph, ReduceOp.SUM, mean, dtypes.float32, devices, ins, outs, size, algorithm, model,
             processes=True)
    return graph, ins, outs


def test_ring_across_processes_puts_one_net_task_per_device_between_reduce_scatter_and_all_gather():
    """n = 2, one chunk: reduce-scatter (copy + reduce per device), then device q allreduces segment
    q + 1 across processes in place on its own net queue, then the all-gather sends that segment on."""
    graph, _, outs = _lower("ring", 2, 10)
    check_race_free(graph)
    kinds = [(t.queue, type(t.work).__name__) for t in graph.tasks]
    assert kinds[4:6] == [("net", "NetAllReduce")] * 2
    nets = [t for t in graph.tasks if isinstance(t.work, NetAllReduce)]
    segments = {0: (5, 10), 1: (0, 5)}  # device q holds segment (q + 1) % 2 after the reduce-scatter
    for q, task in enumerate(nets):
        work = task.work
        assert work.device == f"CPU:{q}" and work.src is work.dst is outs[q][0]
        assert (work.dst_offset, work.dst_offset + work.count) == segments[q]
        reduce = graph.tasks[max(task.deps)]
        assert reduce.queue == "compute" and reduce.device == f"CPU:{q}"  # after the process's sum
    gathers = graph.tasks[6:]
    assert all(t.work.step.phase == "all-gather" for t in gathers)
    assert all(nets[(t.work.src.device == "CPU:1")].id in t.deps for t in gathers)


def test_naive_across_processes_reduces_on_the_root_then_one_net_task_then_broadcasts():
    graph, ins, outs = _lower("naive", 3, 8)
    names = [(t.work.step.phase if hasattr(t.work, "step") else "net", t.device) for t in graph.tasks]
    assert names == [("gather", "CPU:0"), ("gather", "CPU:0"), ("reduce", "CPU:0"), ("net", "CPU:0"),
                     ("broadcast", "CPU:1"), ("broadcast", "CPU:2")]
    net_task = graph.tasks[3]
    assert net_task.work.src is net_task.work.dst is outs[0][0] and net_task.work.local_parts == 3


def test_one_device_per_process_is_a_single_net_task_from_the_partial_to_the_result():
    graph, ins, outs = _lower("auto", 1, 8)
    assert len(graph.tasks) == 1
    work = graph.tasks[0].work
    assert isinstance(work, NetAllReduce) and work.src is ins[0][0] and work.dst is outs[0][0]


@pytest.mark.parametrize("algorithm,n,size", [("ring", 2, 1000), ("ring", 3, 2**16 + 5), ("naive", 2, 7),
                                              ("naive", 1, 9)])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_hierarchical_allreduce_values_match_numpy(two_processes, algorithm, n, size, op):
    """With every other process holding the same partials, the world's sum is `processes` times the
    local sum and the world's mean is the local mean, on every device."""
    devices = tuple(f"CPU:{i}" for i in range(n))
    data = RNG.standard_normal((n, size)).astype(np.float32)
    parts = [Tensor(row, device=d).node for row, d in zip(data, devices)]
    out = Tensor(multi.allreduce(parts, ReduceOp.SUM, algorithm, mean=op == "mean", processes=True))
    out.realize().wait()
    want = data.mean(0) if op == "mean" else 2 * data.sum(0)
    for shard in out.shards:
        np.testing.assert_allclose(shard.numpy(), want, rtol=1e-5, atol=1e-5)
    assert two_processes.calls and all(d in devices for d, _ in two_processes.calls)


def test_allreduces_of_realized_tensors_are_one_net_task_each_writing_the_result(two_processes, monkeypatch):
    """`dist.allreduce` of several realized tensors (one device per process), realized together:
    one net task each, from the tensor to the result, and nothing else (no copy out of a bucket)."""
    monkeypatch.setattr("atensor.dist.collective.world", lambda: World(0, 2, ("CPU:0",)))
    data = [RNG.standard_normal(k).astype(np.float32) for k in (1000, 7, 64)]
    xs = [Tensor(a, device="CPU:0") for a in data]
    Tensor.realize(*xs).wait()
    with atensor.profile() as prof:
        outs = [dist.allreduce(x) for x in xs]
        outs[0].realize(*outs[1:]).wait()
    assert sorted((s.queue, s.kind) for s in prof.spans) == [("net", "allreduce")] * 3
    for out, a in zip(outs, data):
        np.testing.assert_allclose(out.numpy(), 2 * a, rtol=1e-6)


def test_net_commands_run_on_each_devices_net_track_in_the_profile(two_processes):
    devices = ("CPU:0", "CPU:1")
    data = RNG.standard_normal((2, 1 << 18)).astype(np.float32)
    parts = [Tensor(row, device=d).node for row, d in zip(data, devices)]
    with atensor.profile() as prof:
        out = Tensor(multi.allreduce(parts, ReduceOp.SUM, "ring", processes=True))
        out.realize().wait()
    nets = [s for s in prof.spans if s.queue == "net"]
    assert {s.device for s in nets} == set(devices) and all(s.kind == "allreduce" for s in nets)
    np.testing.assert_allclose(out.shards[1].numpy(), 2 * data.sum(0), rtol=1e-5)


def test_in_a_world_of_one_process_collectives_are_the_identity():
    assert dist.world().size == 1
    t = Tensor([1.0, 2.0])
    assert dist.allreduce(t) is t
    parts = [Tensor(np.arange(4, dtype=np.float32) + k, device=f"CPU:{k}").node for k in range(2)]
    out = Tensor(multi.allreduce(parts, ReduceOp.SUM, "naive", processes=True))  # no transport: one process
    out.realize().wait()
    np.testing.assert_array_equal(out.shards[1].numpy(), 2 * np.arange(4) + 1)


def test_allreduce_of_a_tensor_split_over_devices_says_to_reduce_or_replicate_first(monkeypatch):
    monkeypatch.setattr("atensor.dist.collective.world", lambda: World(0, 2, ("CPU:0", "CPU:1")))
    t = Tensor(np.ones((4, 2), np.float32)).shard(("CPU:0", "CPU:1"), axis=0)
    with pytest.raises(Exception, match="split on axis 0"):
        dist.allreduce(t)


def test_the_gradient_of_a_replicated_weight_becomes_one_hierarchical_collective(monkeypatch):
    monkeypatch.setattr("atensor.dist.collective.world", lambda: World(0, 2, ("CPU:0", "CPU:1")))
    parts = [Tensor(np.ones(3, np.float32), device=d) for d in ("CPU:0", "CPU:1")]
    local = Tensor.allreduce(parts)
    world_sum = dist.allreduce(local)
    members = world_sum.node.src
    assert all(m.arg.processes for m in members) and members[0].src == local.node.src[0].src


def test_rows_of_a_global_batch_are_split_like_array_split():
    batch = np.arange(30).reshape(10, 3)
    for size in (1, 2, 3):
        worlds = [World(r, size, ("CPU:0", "CPU:1")) for r in range(size)]
        assert [list(w.shard_rows(10)) for w in worlds] == [list(a) for a in np.array_split(np.arange(10), size)]
        for w, want in zip(worlds, np.array_split(batch, size)):
            np.testing.assert_array_equal(w.shard_batch(batch), want)
        assert worlds[0].all_devices == tuple(f"rank{r}/CPU:{k}" for r in range(size) for k in range(2))


class FakeComm:
    def __init__(self, others: list) -> None:
        self.others = others

    def allgather(self, mine):
        return [mine] + self.others

    def gather(self, value, root=0):
        return [value] + self.others

    def Barrier(self) -> None:
        pass


def test_ranks_that_disagree_at_start_up_get_an_error_naming_the_difference():
    from atensor import __version__
    base = {"atensor version": __version__, "process count": 2, "local device count": 1}
    theirs = dict(base, parameters=[((8, 16), "float32"), ((24,), "float32")])
    world = World(0, 2, ("CPU:0",), comm=FakeComm([theirs]))
    with pytest.raises(DistError, match=r"rank 1 disagrees with rank 0 on parameters: entry 1 is \(\(24,\)"):
        world.check_same(parameters=[((8, 16), "float32"), ((16,), "float32")])
    with pytest.raises(DistError, match="on local device count: 2, rank 0 has 1"):
        World(0, 2, ("CPU:0",), comm=FakeComm([dict(base, **{"local device count": 2})])).check_same()
    with pytest.raises(DistError, match="atensor version"):
        World(0, 2, ("CPU:0",), comm=FakeComm([dict(base, **{"atensor version": "0.0.1"})])).check_same()
    World(0, 2, ("CPU:0",), comm=FakeComm([base])).check_same()  # the same: no error


def test_merged_profile_puts_each_rank_on_its_own_tracks_on_rank_0s_clock(monkeypatch):
    """Rank 1's clock reads 1000 ns more than rank 0's right after the barrier: its events move
    back by 1000 ns; its devices and task ids are its own."""
    mine = Profile.from_events([Span("CPU:0", "net", 1, "a", "allreduce", 100, 200, deps=(0,))],
                               [HostSpan("schedule", "schedule", 50, 60)])
    mine.start_ns, mine.end_ns = 0, 300
    monkeypatch.setattr("atensor.dist.profile.time.perf_counter_ns", lambda: 5000)
    other = (6000, [Span("CPU:0", "net", 1, "a", "allreduce", 1100, 1300, deps=(0,))],
             [HostSpan("schedule", "schedule", 1050, 1060)], [], {}, 1000, 1400)
    world = World(0, 2, ("CPU:0",), comm=FakeComm([other]))
    out = dist_profile.merged(world, mine)
    tl = out.timeline()
    assert {s.device for s in out.spans} == {"rank0/CPU:0", "rank1/CPU:0"}
    assert out.clock_offsets[("rank1/CPU:0", "net")] == -1000
    moved = [h for h in out.host_spans if h.track == "rank1/host"][0]
    assert (moved.start_ns, moved.end_ns) == (50, 60)
    ids = {s.device: (s.task_id, s.deps) for s in out.spans}
    assert ids["rank1/CPU:0"][0] != ids["rank0/CPU:0"][0] and ids["rank1/CPU:0"][1][0] != 0
    assert (out.start_ns, out.end_ns) == (0, 400) and tl is not None


def test_with_a_bucket_cap_a_layers_net_allreduce_is_issued_before_the_backward_of_earlier_layers(
        two_processes, monkeypatch):
    """As within one process (tests/sched/test_allreduce_overlap.py): the gradient of the last layer
    crosses processes while earlier layers' backward still computes; the values are the world's sums."""
    monkeypatch.setattr("atensor.dist.collective.world", lambda: World(0, 2, ("CPU:0", "CPU:1")))
    devices = ("CPU:0", "CPU:1")
    sizes = [64, 256, 256, 10]
    weights = [Tensor(RNG.standard_normal((a, b)).astype(np.float32) * 0.1).to(devices)
               for a, b in zip(sizes, sizes[1:])]
    for w in weights:
        w.requires_grad = True
    h = Tensor(RNG.standard_normal((256, 64)).astype(np.float32)).shard(devices, axis=0)
    for w in weights[:-1]:
        h = (h @ w).relu()
    loss = (h @ weights[-1]).square().mean()
    loss.backward()
    local = [w.grad for w in weights]
    world = [dist.allreduce(g) for g in local]
    with atensor.Context(allreduce_bucket_bytes=1), atensor.profile() as prof:
        Tensor.realize(*world).wait()
    Tensor.realize(*local).wait()
    nets = [s.task_id for s in prof.spans if s.queue == "net"]
    matmuls = [s.task_id for s in prof.spans if s.kind == "kernel" and "matmul" in s.name]
    assert nets and min(nets) < max(matmuls), "no net allreduce was issued before the backward finished"
    for g, w in zip(local, world):
        for shard in w.shards:
            np.testing.assert_allclose(shard.numpy(), 2 * g.shards[0].numpy(), rtol=1e-5, atol=1e-6)


def test_under_a_launcher_without_mpi4py_the_program_runs_as_one_process(monkeypatch, capsys):
    import atensor.dist.processes as world_module
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(__import__("sys").modules, "mpi4py", None)  # import mpi4py raises ImportError
    monkeypatch.setattr(world_module, "_world", None)
    got = dist.init(("CPU:0", "CPU:1"))
    assert (got.rank, got.size, got.devices) == (0, 1, ("CPU:0", "CPU:1")) and net.installed() is None
    assert "mpi4py is not installed" in capsys.readouterr().err


class NeverDone:
    def Test(self) -> bool:
        return False


class StuckComm:
    """A communicator whose peers never arrive."""

    def Iallreduce(self, send, recv, op=None):
        return NeverDone()


def test_a_polling_net_command_fails_after_the_timeout_naming_the_device():
    pytest.importorskip("mpi4py")
    world = World(1, 2, ("CPU:0",), device_comms={"CPU:0": StuckComm()})
    with atensor.Context(net_wait="poll", net_timeout_s=0.05):
        with pytest.raises(DistError, match=r"on CPU:0 \(rank 1 of 2\) did not complete in 0.05 s"):
            world.allreduce("CPU:0", None, np.zeros(4, np.float32), ReduceOp.SUM)
    with pytest.raises(DistError, match="has no communicator"):
        world.allreduce("CPU:1", None, np.zeros(4, np.float32), ReduceOp.SUM)


def test_the_net_timeout_is_on_by_default():
    """A hang is an error by default (300 s: far above a legitimate collective), and configurable."""
    env = {k: v for k, v in os.environ.items() if k != "ATENSOR_NET_TIMEOUT"}
    # one process (each start imports atensor: ~1 s of CPU): the default at the first import, then each
    # value at a fresh execution of the module (importlib.reload), which reads the environment again
    code = ("import importlib, os, atensor.config as config\n"
            "print(config.settings.net_timeout_s)\n"
            "for value in ('12.5', '0'):\n"
            "    os.environ['ATENSOR_NET_TIMEOUT'] = value\n"
            "    print(importlib.reload(config).settings.net_timeout_s)\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["300.0", "12.5", "0.0"]
