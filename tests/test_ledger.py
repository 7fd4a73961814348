"""The storage ledger (atensor/ledger/): graph objects stay immutable, and what the ledger holds
lives exactly as long as the node or buffer spec it describes."""
from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from atensor import Tensor, ledger
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.hcq.buffer import Buffer
from atensor.ledger import versions
from tests.waiting import soon


def _storage(t: Tensor) -> BufferSpec:
    return versions.storage_of(t.node)


def test_graph_objects_refuse_every_write_even_after_realizes_and_assigns():
    a = Tensor(np.arange(6, dtype=np.float32))
    b = (a * 2).realize()
    a.assign(a + 1).realize()
    assert b.numpy().tolist() == [0, 2, 4, 6, 8, 10] and a.numpy().tolist() == [1, 2, 3, 4, 5, 6]
    spec, node = _storage(a), (a + 3).node
    for name in ("uid", "device", "size", "dtype", "version", "head", "runtime"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(spec, name, None)
    for name in ("op", "dtype", "src", "arg", "shape", "device", "realized"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(node, name, None)
    with pytest.raises(AttributeError, match="immutable"):
        del node.op
    assert node.op is Ops.ADD and spec.size == 6  # untouched


def test_the_ledger_counts_versions_and_pending_heads_of_an_assign():
    a = Tensor(np.zeros(3, dtype=np.float32))
    spec = _storage(a)
    assert ledger.version(spec) == 0 and ledger.head(spec) is None
    a.assign(a + 1)
    head = ledger.head(spec)
    assert head is not None and head.op is Ops.ASSIGN and ledger.latest(spec) is head
    a.realize().numpy()
    assert ledger.version(spec) == 1 and ledger.head(spec) is None
    assert ledger.latest(spec) is ledger.current(spec) is spec.node(1)
    assert ledger.value(head) is spec.node(1)
    np.testing.assert_array_equal(a.numpy(), np.ones(3, dtype=np.float32))


def test_a_realized_value_is_freed_with_its_node():
    a = Tensor(np.arange(4, dtype=np.float32))
    before = ledger.statistics()["values"]
    value = a + 10
    node = value.node
    value.realize().numpy()
    target = ledger.value(node)
    assert target is not None and ledger.statistics()["values"] > before
    target_ref, node_ref = weakref.ref(target), weakref.ref(node)
    del value, node, target
    assert node_ref() is None  # reference counting alone: no collection
    assert soon(lambda: target_ref() is None and ledger.statistics()["values"] == before)


def test_realizing_1000_fresh_tensors_keeps_the_live_buffers_bounded():
    gc.collect()
    values = ledger.statistics()["values"]  # what earlier tests left (their nodes may still live)
    seen: weakref.WeakSet[Buffer] = weakref.WeakSet()
    most = 0
    for i in range(1000):
        t = (Tensor(np.full(8, i, dtype=np.float32)) * 2 + 1).realize()
        assert t.numpy()[0] == 2 * i + 1
        seen.add(ledger.runtime(_storage(t)))
        most = max(most, len(seen))
        del t
    # each round's input and result buffers die with their tensors (no cyclic collection needed)
    assert most <= 8 and soon(lambda: len(seen) <= 2), (len(seen), most)
    assert ledger.statistics()["values"] - values < 50  # the realized values went with their nodes


def test_fresh_nodes_never_inherit_the_value_of_a_dead_node_with_the_same_id():
    ids: set[int] = set()
    reused = 0
    for i in range(2000):
        n = (Tensor(np.full(2, i, dtype=np.float32)) + 1)
        node = n.node
        reused += id(node) in ids
        ids.add(id(node))
        assert ledger.value(node) is None, i
        assert n.realize().numpy()[0] == i + 1
        del n, node
    assert reused > 0  # the ids did come back, so the check above had cases to catch


def test_a_specs_record_and_its_runtime_buffer_go_when_the_spec_dies():
    records = ledger.statistics()["records"]
    t = Tensor(np.arange(5, dtype=np.float32))
    t.assign(t * 3).realize()
    np.testing.assert_array_equal(t.numpy(), np.arange(5, dtype=np.float32) * 3)
    spec = _storage(t)
    assert ledger.version(spec) == 1 and ledger.statistics()["records"] == records + 1
    spec_ref, buffer_ref = weakref.ref(spec), weakref.ref(ledger.runtime(spec))
    del t, spec
    assert soon(lambda: spec_ref() is None)  # no cyclic collection needed
    assert ledger.statistics()["records"] == records  # the record, the one owner of the Buffer, went too
    # no next realize needed: the idle dispatcher and queue worker keep nothing of their last one
    assert soon(lambda: buffer_ref() is None)


def test_two_threads_attaching_a_runtime_get_one_buffer():
    spec = BufferSpec("CPU:0", 4, dtypes.float32)
    made: list[int] = []
    start = threading.Barrier(8)

    def make(s: BufferSpec) -> Buffer:
        made.append(1)
        return Buffer(s)

    def attach(out: list) -> None:
        start.wait()
        out.append(ledger.attach_runtime(spec, make))

    found: list[Buffer] = []
    threads = [threading.Thread(target=attach, args=(found,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(b) for b in found}) == 1 and ledger.runtime(spec) is found[0]


def test_a_buffer_node_names_the_version_it_was_asked_for():
    spec = BufferSpec("CPU:0", 3, dtypes.int32)
    assert spec.node(0) is Node.make(Ops.BUFFER, dtypes.int32, (), (spec, 0)) is ledger.current(spec)
    with pytest.raises(TypeError):
        spec.node()  # type: ignore[call-arg]  # which version must be said: the current one is the ledger's


def test_a_constant_assigned_into_a_tensor_is_not_read_back_from_it_by_later_graphs():
    """`x[0] = 0.0` writes the interned constant 0.0 into x's buffer; a later graph that uses 0.0 (relu's
    zero) computes it, and is not tied to x's buffer (it has only its own input's)."""
    import numpy as np
    from atensor.sched.schedule import schedule
    from tests.sched.test_schedule import _roots
    import trio

    async def write_a_zero():
        t = Tensor([1.0, 2.0, 3.0])
        x = t * 2
        x[0] = 0.0
        await Tensor.realize(x, t)
    trio.run(write_a_zero)
    v = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8) - 4)
    graph = schedule(_roots((v * 1.5 + 0.5).relu().sum(axis=1))).graph
    assert [len(task.work.buffers) for task in graph.tasks] == [2]  # the output and v, not x
    assert graph.tasks[0].name == "mul_add_relu_sum 8x8"
