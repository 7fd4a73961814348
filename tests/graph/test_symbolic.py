"""Symbolic variables: `Variable(name, min, max)` and `.bind(value)` in shrink/pad offsets, so one
compiled kernel (and one task graph structure) serves every value, e.g. a KV cache written at
`start_pos`. Only offsets and mask bounds may be symbolic; shapes stay ints."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import SymbolicError, Sym, Variable, evaluate, unbind
from atensor.graph.view import View
from atensor.backend.numpy import render as numpy_backend
from atensor.sched.schedule import schedule
from atensor.graph.taskgraph import Kernel


# ---- the expressions ---------------------------------------------------------------------------------
def test_linear_expressions_normalize_and_plain_ints_stay_ints():
    s = Variable("s", 0, 15)
    assert (s + 1) - s == 1 and type((s + 1) - s) is int
    assert 3 * s + 2 - s == 2 * s + 2
    assert isinstance(2 * s, Sym) and repr(-s + 4) == "-s + 4"
    assert (4 * s + 8) // 4 == s + 2
    with pytest.raises(SymbolicError):
        (2 * s + 1) // 2
    with pytest.raises(SymbolicError, match="linear"):
        s * s


def test_comparisons_are_decided_for_every_value_in_the_bounds_or_raise():
    s = Variable("s", 0, 15)
    assert 0 <= s < 16 and s < s + 1 and not s > 15
    with pytest.raises(SymbolicError, match="some values"):
        s < 8


def test_bind_and_unbind():
    s = Variable("s", 0, 15)
    b = s.bind(7)
    assert b.value == 7 and b != s and b.unbound == s
    assert evaluate(4 * b + 1) == 29 and evaluate(4 * s + 1, {s: 2}) == 9
    values: dict = {}
    assert unbind(4 * b + 1, values) == 4 * s + 1 and values == {s: 7}
    with pytest.raises(SymbolicError, match="outside its bounds"):
        s.bind(16)
    with pytest.raises(SymbolicError, match="both 7 and 8"):
        unbind(s.bind(8) + 0 * s, values)


# ---- views -------------------------------------------------------------------------------------------
def test_shrink_at_a_variable_keeps_the_shape_an_int_and_the_offset_symbolic():
    s = Variable("start_pos", 0, 15)
    t = Tensor(np.zeros((16, 4), dtype=np.float32))
    row = t.shrink(((s.bind(3), s.bind(3) + 1), None))
    assert row.shape == (1, 4) and all(type(d) is int for d in row.shape)
    assert row.node.arg.offset == 4 * s.bind(3)
    head = t.shrink(((0, s.bind(3)), None))  # a symbolic length: tests/graph/test_symbolic_shapes.py
    assert head.shape == (s.bind(3) + 0, 4) and head.node.arg.strides == (4, 1)
    with pytest.raises(SymbolicError):
        t.shrink(((s.bind(3), s.bind(3) + 2), None))  # s + 2 <= 16 fails for s = 15


def test_different_values_are_different_nodes_but_one_kernel():
    s = Variable("start_pos", 0, 15)
    t = Tensor(np.zeros((16, 4), dtype=np.float32))
    a, b = (t.shrink(((s.bind(v), s.bind(v) + 1), None)) * 2 for v in (3, 4))
    assert a.node is not b.node
    graphs = []
    for x in (a, b):
        n = x.node
        spec = BufferSpec(n.device, n.size, n.dtype)
        graphs.append(schedule([Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n),
                                          View.create((n.size,)).reshape(n.shape))]).graph)
    (ka,), (kb,) = ([t.work for t in g.tasks] for g in graphs)
    assert isinstance(ka, Kernel) and ka.ast is kb.ast  # structure, not value
    assert ka.var_vals == {s: 3} and kb.var_vals == {s: 4}
    ranges = [[(a.mode, a.start, a.end) for a in g.tasks[0].accesses] for g in graphs]
    assert ranges[0] == ranges[1]  # byte ranges over the unbound variable, not its values


# ---- end to end --------------------------------------------------------------------------------------
def test_kv_cache_written_at_start_pos_compiles_once_and_matches_numpy():
    s = Variable("start_pos", 0, 7)
    cache = Tensor(np.zeros((8, 4), dtype=np.float32))
    ref = np.zeros((8, 4), dtype=np.float32)
    compiles = []
    for pos in range(8):
        sp = s.bind(pos)
        x = np.full((1, 4), pos + 1, dtype=np.float32)
        cache.shrink(((sp, sp + 1), None)).assign(Tensor(x) * 2)
        ref[pos] = x[0] * 2
        row = (cache.shrink(((sp, sp + 1), None)) + 1).numpy()
        np.testing.assert_array_equal(row, ref[pos:pos + 1] + 1)
        compiles.append(numpy_backend.compile_count)
    assert compiles[1:] == [compiles[1]] * 7  # every later value reuses the kernels of the first
    np.testing.assert_array_equal(cache.numpy(), ref)


async def test_pad_at_a_variable_offset():
    s = Variable("s", 0, 5)
    x = Tensor(np.arange(1, 4, dtype=np.float32))
    for pos in (0, 2, 5):
        out = x.pad(((s.bind(pos), 5 - s.bind(pos)),)) * 10
        await out.realize()
        np.testing.assert_array_equal(out.numpy(), np.pad(np.arange(1, 4), (pos, 5 - pos)) * 10)


async def test_a_symbolic_row_copied_to_another_device_and_back_into_a_symbolic_row():
    s = Variable("s", 0, 3)
    src = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4))
    dst = Tensor(np.zeros((4, 4), dtype=np.float32), device="CPU:1")
    for pos in range(4):
        sp = s.bind(pos)
        dst.shrink(((3 - sp, 4 - sp), None)).assign(src.shrink(((sp, sp + 1), None)).to("CPU:1"))
    await dst.realize()
    np.testing.assert_array_equal(dst.numpy(), np.arange(16).reshape(4, 4)[::-1])


def test_two_rows_at_start_pos_written_in_one_realize_need_no_edge_between_them():
    s = Variable("start_pos", 0, 6)
    cache = Tensor(np.zeros((8, 2), dtype=np.float32))
    sp = s.bind(2)
    a = cache.shrink(((sp, sp + 1), None)).assign(Tensor(np.ones((1, 2), dtype=np.float32)))
    b = cache.shrink(((sp + 1, sp + 2), None)).assign(Tensor(np.full((1, 2), 2, dtype=np.float32)))
    graph = schedule([a.node.base(), b.node.base()]).graph
    writes = [t for t in graph.tasks if any(x.mode == "w" and x.buffer.size == 16 for x in t.accesses)]
    assert len(writes) == 2 and not (writes[1].deps & {writes[0].id})  # disjoint for every start_pos
    ref = np.zeros((8, 2), dtype=np.float32)
    for pos in (2, 5):
        sp = s.bind(pos)
        cache.shrink(((sp, sp + 1), None)).assign(Tensor(np.full((1, 2), pos, dtype=np.float32)))
        cache.shrink(((sp + 1, sp + 2), None)).assign(Tensor(np.full((1, 2), -pos, dtype=np.float32)))
        ref[pos], ref[pos + 1] = pos, -pos
    np.testing.assert_array_equal(cache.numpy(), ref)
