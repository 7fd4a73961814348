"""The one-pass key of sched/cache.py (`walk_key`): the same key as `graph_key` of a toposort, a different
key whenever the graphs differ in any field a template depends on, and no key where the ledger holds a
value the scheduler must substitute."""
from __future__ import annotations

import pytest

from atensor import Tensor
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.ledger import value_entry
from atensor.sched import cache


def _no_entry(node_id: int) -> None:
    """A ledger without realized values (what another test realized must not change these keys)."""
    return None


def _key(roots: list[Node], settings: tuple = (1,)) -> cache.GraphKey:
    found = cache.walk_key(roots, settings, _no_entry)
    assert found is not None
    return found


def _graph(size: int = 16, device: str = "CPU", dtype=dtypes.float32, op: Ops = Ops.ADD, value: float = 0.8125,
           shared: bool = False, swap: bool = False, view: View | None = None) -> list[Node]:
    """ASSIGN(out, op(a, b) * const + a): one knob per field a key must tell apart."""
    a = BufferSpec(device, size, dtype).node(0)
    b = a if shared else BufferSpec(device, size, dtype).node(0)
    c = Node.const(value, dtype, device, (size,))
    body = Node.make(op, dtype, (b, a) if swap else (a, b))
    if view is not None:
        body = body.view(view)
    body = Node.make(Ops.ADD, dtype, (Node.make(Ops.MUL, dtype, (body, c)), a))  # a read twice: order shows
    out = BufferSpec(device, size, dtype)
    return [Node.make(Ops.ASSIGN, dtype, (out.node(0), body), View.create((size,)))]


def test_the_one_pass_key_is_graph_key_of_the_toposort():
    x, y = Tensor.empty(4, 4), Tensor.empty(4, 4)
    shared = (x + y).exp()
    diamond = [(shared * shared + x).sum(axis=1).node, (shared - y).node]  # two roots, shared nodes
    for roots in (_graph(), _graph(shared=True), diamond, [x.node], [((x.T + y) * 0.8125).node]):
        walked = _key(roots)
        reference = cache.graph_key(toposort(roots), (1,))
        assert walked.key == reference.key
        assert walked.order == reference.order and walked.leaves == reference.leaves
        assert walked.buffer_nodes == reference.buffer_nodes


def test_graphs_of_equal_structure_on_other_buffers_have_one_key():
    assert _key(_graph()).key == _key(_graph()).key
    assert _key(_graph(shared=True)).key == _key(_graph(shared=True)).key


@pytest.mark.parametrize("change", [
    {"size": 8}, {"device": "CPU:1"}, {"dtype": dtypes.int32}, {"op": Ops.SUB}, {"value": 0.4375},
    {"shared": True}, {"swap": True}, {"view": View.create((16,)).flip((True,))},
])
def test_a_graph_that_differs_in_one_field_has_another_key(change):
    """A key that missed a field (buffer size or device, dtype, op, a constant, which buffer fills which
    slot, source order, a view) would hand one graph's template to another."""
    assert _key(_graph(**change)).key != _key(_graph()).key


def test_the_scheduler_settings_are_part_of_the_key():
    roots = _graph()
    assert _key(roots, (1,)).key != _key(roots, (2,)).key


def test_no_one_pass_key_for_a_graph_reading_a_realized_value():
    x = Tensor.ones(16).contiguous().realize().wait()
    y = x + 1
    held = y.node  # (the ledger keeps a realized value while its node lives)
    y.realize().wait()
    z = (x + 1) * 2  # x + 1 has a realized value: the scheduler substitutes it, then keys the graph
    assert value_entry(id(held)) is not None and cache.walk_key([z.node], (1,), value_entry) is None
    assert z.tolist() == [4.0] * 16


def test_the_template_cache_keeps_the_recently_used_and_stays_bounded(monkeypatch):
    monkeypatch.setattr(cache, "MAX_TEMPLATES", 16)
    cache.clear()
    try:
        keys = [cache.GraphKey((("graph", i),), [], [], []) for i in range(16)]
        for key in keys:
            cache.store(key, cache.Template([], [], [], []))
        assert cache.lookup(keys[0]) is not None  # hit: now the most recent
        cache.store(cache.GraphKey((("graph", 16),), [], [], []), cache.Template([], [], [], []))
        assert len(cache._templates) <= 16
        assert cache.lookup(keys[0]) is not None  # kept: it was used after the others
        assert cache.lookup(keys[1]) is None      # the least recently used went
        assert cache.lookup(keys[15]) is not None
    finally:
        cache.clear()
