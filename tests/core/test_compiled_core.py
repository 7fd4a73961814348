"""The compiled core (atensor/core/ccore.c) against its specification, the Python functions it replaces:
the same key, order and slots from the schedule key walk on random graphs, the same interned node
from either `Node.make`, the same errors, one node per key and unique spec uids under threads.

The comparisons need the compiled core to be the one running (the default where it is built); under
ATENSOR_CORE=python they skip, and the rest of the suite tests the Python core. Where a C compiler is
there and the compiled core was not chosen away, it must have been built: a silent fallback would leave
the compiled core untested."""
from __future__ import annotations

import gc
import os
import shutil
import sys
import sysconfig
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from atensor import Tensor, core
from atensor.dtype import dtypes
from atensor.graph import node as node_module
from atensor.graph.node import BufferSpec, GraphError, Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.sched import cache

compiled = pytest.mark.skipif(core.ccore is None, reason="the compiled core is not the one running "
                              "(ATENSOR_CORE=python, or not built)")
python_make = node_module.python_core["make"]


def test_the_compiled_core_is_built_where_a_c_compiler_is():
    if os.environ.get("ATENSOR_CORE", "c").strip().lower() == "python":
        assert core.implementation == "python" and core.ccore is None
        return
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None or not os.path.exists(os.path.join(sysconfig.get_paths()["include"],
                                                                         "Python.h")):
        pytest.skip(f"no C compiler ({compiler}) or Python headers here: the fallback is expected")
    assert core.implementation == "c", "a C compiler is here but atensor.core._ccore did not import: " \
                                       "build it with `pip install -e .` (or setup.py build_ext --inplace)"


def test_an_unknown_core_setting_is_refused_naming_both_choices():
    import subprocess
    result = subprocess.run([sys.executable, "-c", "import atensor"], capture_output=True, text=True,
                            env={**os.environ, "ATENSOR_CORE": "fast"})
    assert result.returncode != 0
    assert "ATENSOR_CORE='fast'" in result.stderr and "'python'" in result.stderr


# ---- the schedule key walk -----------------------------------------------------------------------

def _no_entry(node_id: int) -> None:
    return None


_UNARY = [lambda t: t.exp(), lambda t: t * 0.5, lambda t: t.T if t.ndim == 2 else t.reshape(-1),
          lambda t: t.sum(axis=0, keepdim=True).expand(*t.shape), lambda t: (t > 0.25).where(t, 1.0),
          lambda t: t.cast(dtypes.int32).cast(dtypes.float32), lambda t: t[1:].pad(((0, 1),) + ((0, 0),) * (t.ndim - 1))]
_BINARY = [lambda a, b: a + b, lambda a, b: a * b - a, lambda a, b: a.maximum(b)]


@st.composite
def graphs(draw) -> list[Node]:
    """A few roots over a random graph of ops on 2-4 leaf buffers (some read twice, some shared)."""
    shape = draw(st.sampled_from([(4,), (3, 4), (2, 2)]))
    leaves = [Tensor.empty(*shape) for _ in range(draw(st.integers(2, 4)))]
    made = list(leaves)
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            made.append(draw(st.sampled_from(_UNARY))(draw(st.sampled_from(made))))
        else:
            a, b = draw(st.sampled_from(made)), draw(st.sampled_from(made))
            if a.shape == b.shape:
                made.append(draw(st.sampled_from(_BINARY))(a, b))
    picked = draw(st.lists(st.sampled_from(made), min_size=1, max_size=3))
    return [t.node for t in picked]


@compiled
@given(graphs(), st.integers(0, 3))
def test_the_compiled_walk_gives_the_python_walks_key_order_and_slots(roots, knob):
    settings = (knob,)
    expected = cache.python_walk_key(roots, settings, _no_entry)
    found = cache.walk_key(roots, settings, _no_entry)
    assert expected is not None and found is not None
    assert found.key == expected.key
    assert [id(n) for n in found.order] == [id(n) for n in expected.order]
    assert found.leaves == expected.leaves
    assert [id(n) for n in found.buffer_nodes] == [id(n) for n in expected.buffer_nodes]
    assert found.key == cache.graph_key(toposort(roots), settings).key


@compiled
@given(graphs(), st.data())
def test_the_compiled_walk_stops_where_the_python_walk_stops(roots, data):
    nodes = toposort(roots)
    marked = {id(n) for n in data.draw(st.lists(st.sampled_from(nodes), max_size=2))}
    table = {i: "value" for i in marked}
    for has_entry in (table.get, lambda i: table.get(i)):  # a dict's get (read directly) and any callable
        expected = cache.python_walk_key(roots, (1,), has_entry)
        found = cache.walk_key(roots, (1,), has_entry)
        assert (found is None) == (expected is None) == bool(marked)
        if found is not None:
            assert found.key == expected.key


@compiled
def test_the_compiled_walk_raises_what_has_entry_raises_and_refuses_non_nodes():
    roots = [(Tensor.empty(4) + 1).node]

    def broken(node_id: int) -> None:
        raise KeyError("ledger gone")

    with pytest.raises(KeyError, match="ledger gone"):
        cache.walk_key(roots, (1,), broken)
    with pytest.raises(TypeError, match="roots must be Nodes"):
        cache.walk_key([roots[0], "x"], (1,), _no_entry)


# ---- Node.make ----------------------------------------------------------------------------------

@compiled
@given(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.EXP2, Ops.NEG, Ops.CMPLT, Ops.WHERE, Ops.CONTIGUOUS]),
       st.sampled_from([(4,), (2, 3)]), st.booleans())
def test_either_make_gives_the_one_interned_node(op, shape, c_first):
    a, b = Tensor.empty(*shape).node, Tensor.empty(*shape).node
    if op is Ops.WHERE:
        args = (op, dtypes.float32, (a.alu(Ops.CMPLT, b), a, b))
    elif op is Ops.CMPLT:
        args = (op, dtypes.bool, (a, b))
    elif op in (Ops.EXP2, Ops.NEG, Ops.CONTIGUOUS):
        args = (op, dtypes.float32, (a,))
    else:
        args = (op, dtypes.float32, (a, b))
    first, second = (Node.make, python_make) if c_first else (python_make, Node.make)
    made = first(*args)
    assert second(*args) is made
    assert type(made) is Node and made.shape == shape and made.device == a.device
    assert node_module._interned[(args[0], args[1], args[2], None)]() is made
    with pytest.raises(AttributeError, match="immutable"):
        made.shape = (1,)


@compiled
def test_the_compiled_make_raises_the_general_rules_errors():
    a, b = Tensor.empty(4).node, Tensor.empty(3).node
    for make in (Node.make, python_make):
        with pytest.raises(GraphError, match=r"shape mismatch in ADD: \(4,\) and \(3,\)"):
            make(Ops.ADD, dtypes.float32, (a, b))
        with pytest.raises(GraphError, match="dtype mismatch in MUL"):
            make(Ops.MUL, dtypes.float32, (a, Tensor.empty(4, dtype=dtypes.int32).node))
        with pytest.raises(TypeError):
            make(Ops.ADD, dtypes.float32, [a, a])  # a list is not a key
    assert Node.make(Ops.BUFFER, dtypes.float32, (), (BufferSpec("CPU", 2, dtypes.float32), 0)).shape == (2,)


@compiled
@pytest.mark.parametrize("case", ["valid", "valid into a pending assign", "wrong shape", "other device",
                                  "masked view", "no storage"])
def test_either_make_gives_one_assign_node_or_the_same_error(case):
    spec = BufferSpec("CPU:0", 6, dtypes.float32)
    storage, value, view = spec.node(0), Tensor.empty(6).node, View.create((6,))
    if case == "valid into a pending assign":
        storage = Node.make(Ops.ASSIGN, dtypes.float32, (storage, value), view)
    elif case == "wrong shape":
        value = Tensor.empty(3).node
    elif case == "other device":
        value = Tensor.empty(6, device="CPU:1").node
    elif case == "masked view":
        view = View.create((4,)).pad(((1, 1),))
        value = Tensor.empty(6).node
    elif case == "no storage":
        storage = Tensor.empty(6).exp().node
    args = (Ops.ASSIGN, dtypes.float32, (storage, value), view)
    if case.startswith("valid"):
        first = python_make(*args)
        assert Node.make(*args) is first and first.shape == (6,) and first.device == "CPU:0"
        buffer_node = Node.make(Ops.BUFFER, dtypes.float32, (), (spec, 3))
        assert python_make(Ops.BUFFER, dtypes.float32, (), (spec, 3)) is buffer_node
        assert buffer_node.shape == (6,) and buffer_node.device == "CPU:0"
        return
    errors = []
    for make in (python_make, Node.make):
        with pytest.raises(GraphError) as raised:
            make(*args)
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("make", ["running", "python"])
@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_a_dead_node_leaves_the_table_and_a_new_one_takes_its_key(make):
    maker = Node.make if make == "running" else python_make
    a = BufferSpec("CPU", 5, dtypes.float32).node(0)
    key = (Ops.EXP2, dtypes.float32, (a,), None)
    first = maker(*key)
    first_id = id(first)
    del first
    gc.collect()
    assert key not in node_module._interned
    again = maker(*key)
    assert node_module._interned[key]() is again and again.shape == (5,)
    del again, first_id


@pytest.mark.parametrize("make", ["running", "python"])
def test_threads_interning_the_same_keys_get_one_node_per_key(make):
    maker = Node.make if make == "running" else python_make
    sources = [BufferSpec("CPU", 8, dtypes.float32).node(0) for _ in range(40)]
    found: list[list[Node]] = []
    start = threading.Barrier(4)

    def intern() -> None:
        start.wait()
        mine = []
        for _ in range(30):
            for s in sources:
                mine.append(maker(Ops.MUL, dtypes.float32, (s, s)))
                # a view's key hashes in Python code (View.__hash__): a thread switch may come mid-probe
                mine.append(Node.make_view(s, View.create((2, 4))))
        found.append(mine)

    threads = [threading.Thread(target=intern) for _ in range(4)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len(found) == 4
    for other in found[1:]:
        assert all(x is y for x, y in zip(found[0], other))


# ---- BufferSpec --------------------------------------------------------------------------------

def test_spec_uids_are_unique_and_increase_across_threads():
    made: list[list[int]] = [[] for _ in range(4)]

    def specs(out: list[int]) -> None:
        for _ in range(2000):
            out.append(BufferSpec("CPU", 1, dtypes.float32).uid)

    threads = [threading.Thread(target=specs, args=(m,)) for m in made]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    every = [u for m in made for u in m]
    assert len(set(every)) == len(every) == 8000
    assert all(m == sorted(m) for m in made)
    assert BufferSpec.last_uid() >= max(every)
    spec = BufferSpec("CPU:1", 3, dtypes.int32)
    assert (spec.device, spec.size, spec.dtype, spec.uid) == ("CPU:1", 3, dtypes.int32, BufferSpec.last_uid())
    with pytest.raises(AttributeError, match="immutable"):
        spec.size = 4


def test_an_eager_round_trip_computes_what_numpy_does():
    x = Tensor(np.arange(16, dtype=np.float32))
    for _ in range(5):
        x = (x + 1).realize()
    np.testing.assert_array_equal(x.numpy(), np.arange(16, dtype=np.float32) + 5)


# ---- the inline-size check of a realize -----------------------------------------------------------

@compiled
@given(graphs(), st.integers(0, 12))
def test_the_compiled_size_check_agrees_with_the_python_one(roots, limit):
    from atensor.engine import realize
    assert realize._small(roots, limit) == realize.python_small(roots, limit)
    assert realize._small(roots, 64) and realize.python_small(roots, 64)  # (no graph drawn here is bigger)


# ---- the per-tensor loops of a realize ----------------------------------------------------------------

def _tensors_of_every_kind() -> list[Tensor]:
    """Computed values (and views of them), realized buffers (and views), a tensor given twice, a pending
    assign's view, and a tensor realized but not read since (its Storage still on it)."""
    computed = (Tensor(np.arange(6, dtype=np.float32)) * 2 + 1).sum()
    viewed = (Tensor(np.ones((2, 3), dtype=np.float32)) + 1).reshape(3, 2)
    stored = Tensor(np.arange(4, dtype=np.float32))
    target = Tensor(np.zeros(4, dtype=np.float32))
    target[0:2].assign(Tensor(np.ones(2, dtype=np.float32)))  # (a pending assign into a buffer)
    issued = (Tensor(np.ones(3, dtype=np.float32)) - 1).realize()  # (its Storage on it, not read yet)
    return [computed, viewed, stored, stored.reshape(2, 2), computed, target, issued]


@compiled
@pytest.mark.parametrize("keep_graphs", [False, True])
def test_the_compiled_capture_and_storages_agree_with_the_python_ones(keep_graphs):
    from atensor.engine import realize
    from atensor.tensor import tensor as tensor_module
    results = {}
    for name, capture, storages in (("c", tensor_module._capture, realize._storages),
                                    ("python", tensor_module.python_capture, realize.python_storages)):
        tensors = _tensors_of_every_kind()
        captured = capture(tuple(tensors), keep_graphs)
        assert [t for t, _ in captured] == tensors
        items, given = storages(captured)
        results[name] = (
            [(n.op, n.shape) for _, n in captured],
            [(n.op, n.shape, type(s).__name__, s is not None and s.lazy is n and s._node is None and not s.reaped)
             for n, s in items],
            [(spec.size, node.op) for spec, node in given],
            [t._swap is not None for t in tensors],
            [getattr(t, "_ctx", None) is n for t, (_, n) in zip(tensors, captured)],
            items[4][1] is items[0][1])  # the tensor given twice: one Storage
        for node, storage in items:
            assert storage is None or isinstance(storage, realize.Storage)
        realize.ledger.unclaim(given)
        for t in tensors:  # (what a realize of them would have made: none is submitted here)
            t._swap = None
        tensors[5].realize().wait()  # (the pending assign: realized, not left to later tests)
        assert tensors[5].numpy().tolist() == [1.0, 1.0, 0.0, 0.0]
    assert results["c"] == results["python"]
    assert results["c"][5]


# ---- the ledger's commit ---------------------------------------------------------------------------

@pytest.mark.parametrize("commit", ["running", "python"])
@pytest.mark.parametrize("pending_head", [True, False])
@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_a_committed_assign_advances_the_version_holds_its_value_and_forgets_it_when_the_node_dies(
        commit, pending_head):
    from atensor import ledger
    committing = ledger.commit_assign_locked if commit == "running" else ledger.python_core["commit_assign_locked"]
    spec = BufferSpec("CPU:0", 4, dtypes.float32)
    assign = Node.make(Ops.ASSIGN, dtypes.float32, (spec.node(0), Tensor.empty(4).exp().node), View.create((4,)))
    if pending_head:
        ledger.set_head(spec, assign)
        assert ledger.pending_heads()[-1] is assign
    with ledger.lock:
        committing(assign, spec)
        committing(assign, spec)  # a second commit: the next version, the entry replaced
    assert ledger.version(spec) == 2 and ledger.head(spec) is None
    assert assign not in ledger.pending_heads()
    held = ledger.value(assign)
    assert held is Node.make(Ops.BUFFER, dtypes.float32, (), (spec, 2)) and held.shape == (4,)
    key = id(assign)
    del assign
    gc.collect()
    assert ledger.value_entry(key) is None


@compiled
def test_the_compiled_commit_refuses_what_is_not_a_spec():
    from atensor import ledger
    node = Tensor.empty(2).node  # (made before taking the lock: making storage takes it too)
    with pytest.raises(TypeError, match="BufferSpec"):
        with ledger.lock:
            ledger.commit_assign_locked(node, "buf")


# ---- a tensor's node at its storage's newest version ------------------------------------------------

@compiled
def test_the_compiled_follow_gives_what_the_python_follow_gives_at_every_version():
    from atensor import ledger
    from atensor.engine import realize
    t = Tensor(np.arange(6, dtype=np.float32)).realize()
    t.wait()
    stored = t.node  # a BUFFER at its current version
    spec = stored.arg[0] if stored.op is Ops.BUFFER else stored.base().arg[0]
    views = [stored, stored.reshape((2, 3)), stored.reshape((2, 3)).permute((1, 0)), Tensor.empty(6).exp().node]
    for stage in ("current", "pending assign", "realized since"):
        if stage == "pending assign":
            t.assign(t + 1)
        elif stage == "realized since":
            t.realize().wait()
        for node in views + [t._node, ledger.latest(spec)]:
            assert realize._follow_storage(node) is realize.python_follow_storage(node), (stage, node)
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32) + 1)


# ---- a jit replay's fresh small result buffer --------------------------------------------------------

def _buffer_state(buf) -> dict:
    """Every slot of a hcq Buffer, its lock and dicts by kind (each Buffer has its own)."""
    from atensor.hcq.buffer import Buffer
    state = {}
    for name in Buffer.__slots__:
        if name == "__weakref__":
            continue
        value = getattr(buf, name)
        if name == "_lock":
            value = (type(value), value.locked())
        elif name == "memory":
            value = (value.shape, value.dtype, value.__array_interface__["data"][0])
        elif name == "release":
            value = (value[0].__func__, value[0].__self__, value[1][0], value[1][2])
        state[name] = value
    return state


@compiled
@pytest.mark.parametrize("version", [0, 1, 3])
def test_the_compiled_fresh_small_leaves_what_its_python_specification_leaves(version):
    """hcq/device.py's `fresh_small` in C (atensor/core/fresh.c) against `python_fresh_small`: the same
    Buffer slot by slot, ledger record, recycled memory, device bytes and peak, pool; the memory comes
    back to the pool when the spec dies. With no dead memory of the size, the C one runs the Python one."""
    from atensor import ledger
    from atensor.hcq import device as device_module
    dev = device_module.Device.get("CPU:0")
    key = (48, np.dtype(np.float32))
    found = {}
    for way, fresh in (("c", device_module.fresh_small), ("python", device_module.python_fresh_small)):
        assert (way == "c") == (fresh is core.ccore.fresh_small)
        gc.collect()
        dev._small.clear()
        kept = dev._small.take(*key)  # one dead memory of the size, kept by the pool
        dev._small.give(kept)
        before, peak = dev.bytes_in_use, dev.peak_bytes
        spec = BufferSpec("CPU:0", 12, dtypes.float32)
        buf = fresh(dev, spec, version, key)
        record = ledger.record_of(spec.uid)
        assert record.runtime is buf and record.version == version and record.head is None
        assert record.uid == spec.uid
        assert ledger.version(spec) == version and ledger.runtime(spec) is buf and record() is spec
        state = _buffer_state(buf)
        assert state["memory"][2] == kept[2] and state["release"][1] is dev._small  # the recycled memory
        state["uid"] = state["uid"] - spec.uid
        for name, at in (("memory", 2), ("_address", None), ("release", 3)):  # the kept memory's address
            value = state[name]
            state[name] = "kept" if at is None else (*value[:at], "kept", *value[at + 1:])
        found[way] = (state, dev.bytes_in_use - before, max(0, dev.peak_bytes - peak),
                      dev._small.statistics())
        del spec, buf, record
        gc.collect()
        assert dev.bytes_in_use == before and dev._small.take(*key) is kept  # given back with the spec
    assert found["c"] == found["python"]
    assert found["c"][1] == 48 and found["c"][3] == {"entries": 0, "kept_bytes": 0}


@compiled
def test_the_compiled_fresh_small_takes_the_python_path_without_dead_memory_or_under_a_profile(monkeypatch):
    from atensor import ledger, profile
    from atensor.hcq import device as device_module
    dev = device_module.Device.get("CPU:0")
    key = (40, np.dtype(np.float32))
    calls = []
    python = device_module.python_fresh_small

    def spec_path(*args):
        calls.append(args[2])
        return python(*args)
    core.ccore.configure_fresh(device_module.Buffer, device_module.SmallPool, threading.Lock,
                               device_module.collector, spec_path)
    try:
        dev._small.clear()
        spec = BufferSpec("CPU:0", 10, dtypes.float32)
        buf = core.ccore.fresh_small(dev, spec, 1, key)  # nothing kept: fresh memory, from Python
        assert calls == [1] and ledger.runtime(spec) is buf and buf.memory.shape == (10,)
        del spec, buf
        gc.collect()  # now one is kept
        with profile() as prof:
            spec = BufferSpec("CPU:0", 10, dtypes.float32)
            buf = core.ccore.fresh_small(dev, spec, 2, key)  # a profile: Python, which records the memory
        assert calls == [1, 2] and ledger.version(spec) == 2
        assert any(m.device == "CPU:0" for m in prof.memory)
        spec = BufferSpec("CPU:0", 10, dtypes.float32)
        buf = core.ccore.fresh_small(dev, spec, 0, key)
        assert calls == [1, 2] or ledger.runtime(spec) is buf  # (C when the profile's memory was kept)
    finally:
        core.ccore.configure_fresh(device_module.Buffer, device_module.SmallPool, threading.Lock,
                                   device_module.collector, python)


@compiled
def test_the_compiled_attach_new_records_what_the_python_one_records():
    from atensor import ledger
    died = []

    class Runtime:  # what the record holds and tells when the spec dies (an hcq Buffer)
        def spec_died(self):
            died.append(self)
    for attach in (ledger.attach_new, ledger.python_core["attach_new"]):
        spec = BufferSpec("CPU:0", 3, dtypes.float32)
        runtime = Runtime()
        attach(spec, runtime, 5)
        record = ledger.record_of(spec.uid)
        assert (record.version, record.head, record.runtime, record.uid) == (5, None, runtime, spec.uid)
        assert record() is spec
        uid = spec.uid
        del spec, record
        gc.collect()
        assert ledger.record_of(uid) is None and died[-1] is runtime  # dropped with its spec, runtime told
    with pytest.raises(TypeError, match="BufferSpec"):
        ledger.attach_new("buf", object(), 1)


@pytest.mark.parametrize("drop", ["running", "python"])
def test_a_dead_specs_record_goes_and_its_small_memory_comes_back_to_the_pool_while_its_buffer_is_held(drop):
    """The ledger's record callback (`_drop_record`, in C: ledger.c `drop_record` with fresh.c's
    `buffer_spec_died`) against its Python specification: when the spec dies (its record's weak
    reference the only thing left of it) the record and its pending mark go, the Buffer (held here,
    so it outlives its record) gives its memory back to the pool once, uncounted from the device."""
    from atensor import ledger
    from atensor.hcq import device as device_module
    dev = device_module.Device.get("CPU:0")
    key = (36, np.dtype(np.float32))
    gc.collect()
    dev._small.clear()
    before = dev.bytes_in_use
    spec = BufferSpec("CPU:0", 9, dtypes.float32)
    buf = device_module.python_fresh_small(dev, spec, 1, key)
    if drop == "python":  # the record's callback replaced by the Python one
        record = ledger.record_of(spec.uid)
        python_record = ledger.Record(spec, ledger.python_core["drop_record"])
        python_record.version, python_record.head = 1, None
        python_record.runtime, python_record.uid = buf, spec.uid
        with ledger.lock:
            ledger._records[spec.uid] = python_record
        record.runtime = None  # (the replaced record tells nobody)
        del record, python_record
    uid, address = spec.uid, buf.address()
    with ledger.lock:  # a pending mark (a head's, without the head that would keep the spec alive)
        ledger._pending[uid] = None
    assert dev.bytes_in_use == before + 36
    del spec
    gc.collect()
    assert ledger.record_of(uid) is None and uid not in ledger._pending
    assert buf.release is None and dev.bytes_in_use == before  # told once, with the buffer still held
    assert dev._small.statistics() == {"entries": 1, "kept_bytes": 36}
    assert dev._small.take(*key)[2] == address


@compiled
def test_the_compiled_record_callback_tells_other_runtimes_and_other_releases_through_their_python():
    from atensor import ledger
    from atensor.hcq.buffer import Buffer
    told = []

    class Runtime:
        def spec_died(self):
            told.append("runtime")
    spec = BufferSpec("CPU:0", 2, dtypes.float32)
    ledger.attach_new(spec, Runtime(), 0)
    other = BufferSpec("CPU:0", 2, dtypes.float32)
    buf = Buffer(other)
    buf.release = (told.append, "release")  # memory that goes elsewhere than a SmallPool
    ledger.attach_new(other, buf, 0)
    del spec, other
    gc.collect()
    assert sorted(told) == ["release", "runtime"] and buf.release is None


def test_fresh_small_buffers_made_and_dropped_on_several_threads_leave_the_count_and_pool_consistent():
    """Results made (hcq/device.py `fresh_small`) and dropped (the ledger's record callback) on four
    threads at once, C or Python: every memory comes back once, the device's bytes return to where
    they were, and no live buffer shares memory with another."""
    from atensor.hcq import device as device_module
    dev = device_module.Device.get("CPU:0")
    key = (28, np.dtype(np.float32))
    gc.collect()
    before = dev.bytes_in_use
    shared_error: list[BaseException] = []

    def work() -> None:
        try:
            held = []
            for k in range(3000):
                spec = BufferSpec("CPU:0", 7, dtypes.float32)
                held.append((spec, device_module.fresh_small(dev, spec, k % 2, key)))
                if len(held) > 5:
                    del held[:3]
            addresses = [buf.address() for _, buf in held]
            assert len(set(addresses)) == len(addresses)
        except BaseException as exc:  # noqa: BLE001 - reported on the main thread
            shared_error.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    assert not shared_error, shared_error
    assert dev.bytes_in_use == before
    taken = [dev._small.take(*key) for _ in range(24)]
    assert len({entry[2] for entry in taken}) == len(taken)  # no memory kept twice
    for entry in taken:
        dev._small.give(entry)
