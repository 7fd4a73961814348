"""Kernel bounds: every load and store of a kernel, under its valid mask, stays inside its buffer.

A seeded set of out-of-bounds kernels (hand-built ASTs, as a buggy scheduler or lowering would emit
them) must each be rejected with a counterexample; the kernels real programs produce must pass.
Indexed loads (gathers) are described by `IndexedLoad`: a flat index the kernel computes and the
guard under which it loads; data and floats in them are unconstrained.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import Variable
from atensor.graph.view import View
from atensor.sched import boundscheck, prove
from atensor.sched.boundscheck import BoundsError, IndexedLoad, check_indexed_load, check_kernel

f32, i32 = dtypes.float32, dtypes.int32


def param(k: int, size: int, dtype=f32) -> Node:
    return Node.make(Ops.PARAM, dtype, (), (k, size))


def view(src: Node, shape, strides, offset=0, mask=None) -> Node:
    return Node.make(Ops.VIEW, src.dtype, (src,), View(tuple(shape), tuple(strides), offset, mask))


def store(target: Node, value: Node) -> Node:
    return Node.make(Ops.STORE, value.dtype, (target, value))


def kernel_reading(load: Node) -> Node:
    """STORE(contiguous view of PARAM 0, load + 1): a kernel whose only interesting access is `load`."""
    out = param(0, load.size)
    target = view(out, load.shape, View.create(load.shape).strides)
    one = Node.const(1.0, f32, "kernel", load.shape)
    return store(target, load.alu(Ops.ADD, one))


def arange(n: int, dtype=i32) -> Node:
    return Node.make(Ops.ARANGE, dtype, (), (0, 1, n, "kernel"))


def const(v, dtype, shape) -> Node:
    return Node.const(v, dtype, "kernel", shape)


# ---- seeded out-of-bounds kernels -----------------------------------------------------------------
s = Variable("s", 0, 8)
SEEDED = {
    "negative offset": (view(param(1, 8), (4,), (1,), -1), r"index -1 .* \(4,\)|index -1"),
    "flip with an offset one short": (view(param(1, 8), (4,), (-1,), 2), r"index -1"),
    "padded view whose valid part runs past the end": (view(param(1, 8), (6,), (1,), 4, ((1, 5),)),
                                                         r"element \(4,\).* index 8"),
    "permuted 2-d view with a column too many": (view(param(1, 12), (4, 4), (1, 4), 0, ((0, 4), (0, 4))),
                                                 r"element \(3, 3\).* index 15"),
    "reshape of a permuted view reading past the permuted shape": (
        view(view(param(1, 16), (4, 4), (1, 4)), (3, 6), (6, 1), 0, ((0, 3), (0, 6))), r"index 17"),
    "symbolic offset that reaches past the end": (view(param(1, 8), (4,), (1,), s, ((0, 4),)),
                                                  r"s=(5|6|7|8)"),
    "symbolic pad that shifts one too far": (view(param(1, 4), (12,), (1,), -s + 1, ((s, s + 4),)),
                                             r"index 4 .*s="),
}


@pytest.mark.parametrize("name", SEEDED)
def test_seeded_out_of_bounds_loads_are_rejected_with_a_counterexample(name):
    load, pattern = SEEDED[name]
    with pytest.raises(BoundsError, match=pattern):
        check_kernel(kernel_reading(load), name)


def test_a_store_past_the_end_is_rejected_even_where_its_mask_is_false():
    # the backend writes every element of a store target, so its mask does not protect it
    target = view(param(0, 8), (4,), (1,), 6, ((0, 2),))
    with pytest.raises(BoundsError, match=r"store .* index 9"):
        check_kernel(store(target, const(1.0, f32, (4,))))


def test_a_store_through_a_flipped_view_that_starts_below_zero_is_rejected():
    target = view(param(0, 8), (4,), (-1,), 2)
    with pytest.raises(BoundsError, match=r"store .* index -1"):
        check_kernel(store(target, const(1.0, f32, (4,))))


def test_a_store_of_the_wrong_shape_is_rejected():
    with pytest.raises(BoundsError, match="shape"):
        check_kernel(store(view(param(0, 8), (4,), (1,)), const(1.0, f32, (2, 2))))


# ---- kernels that are in bounds ----------------------------------------------------------------------
def test_symbolic_views_in_bounds_are_proved_for_every_value():
    good = [
        view(param(1, 12), (4,), (1,), s),                      # 4 elements at s in [0, 8]
        view(param(1, 4), (12,), (1,), -s, ((s, s + 4),)),       # a pad at s: intervals on the expressions
        view(param(1, 16), (16,), (1,), 4 - s, ((s - 4, s + 1),)),  # mask not provably inside: z3
    ]
    calls = prove.stats.z3_calls
    for load in good:
        check_kernel(kernel_reading(load))
    assert prove.stats.z3_calls == calls + 1  # only the last needed z3


def test_results_are_cached_by_the_kernel_structure():
    ast = kernel_reading(view(param(1, 64), (8, 8), (1, 8)))
    check_kernel(ast)
    hits = boundscheck.cache_stats.hits
    same = kernel_reading(view(param(1, 64), (8, 8), (1, 8)))  # built again: the same interned node
    assert same is ast
    check_kernel(same)
    assert boundscheck.cache_stats.hits == hits + 1
    bad = kernel_reading(view(param(1, 8), (4,), (1,), -1))
    for _ in range(2):
        with pytest.raises(BoundsError):
            check_kernel(bad)


def test_a_proof_that_times_out_is_a_rejection(monkeypatch):
    def timeout(*_a, **_k):
        raise prove.ProofTimeout("z3 could not decide within 1 ms")
    monkeypatch.setattr(boundscheck, "find_counterexample", timeout)
    t = Variable("t", 0, 3)
    with pytest.raises(BoundsError, match="cannot prove"):
        check_kernel(kernel_reading(view(param(1, 8), (4,), (1,), t, ((t - 1, 4),))))


def test_every_kernel_of_real_programs_passes_and_runs():
    x = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    programs = [
        (x.permute(2, 0, 1).reshape(4, 6) * 2,
         np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1).reshape(4, 6) * 2),
        (x.pad(((1, 1), (0, 2), (3, 0))).sum(2), np.pad(np.arange(24.).reshape(2, 3, 4),
                                                       ((1, 1), (0, 2), (3, 0))).sum(2)),
        (x[:, ::-1, 1::2].flip(0), np.arange(24.).reshape(2, 3, 4)[:, ::-1, 1::2][::-1]),
        (x.reshape(6, 4) @ x.reshape(4, 6), np.arange(24.).reshape(6, 4) @ np.arange(24.).reshape(4, 6)),
    ]
    with atensor.Context(racecheck=True):
        for t, expected in programs:
            np.testing.assert_allclose(t.numpy(), expected)


# ---- indexed loads (gathers) -------------------------------------------------------------------------
def data(k: int, n: int, dtype) -> Node:
    return param(k, n, dtype)


def test_an_unguarded_computed_index_past_the_end_is_rejected():
    index = arange(8).alu(Ops.ADD, const(3, i32, (8,)))
    msg = check_indexed_load(IndexedLoad(param(1, 8), index))
    found = re.search(r"position \((\d),\) reads index (\d+)", msg)
    position, read = int(found[1]), int(found[2])  # any true counterexample: index = position + 3 >= 8
    assert read == position + 3 >= 8
    assert check_indexed_load(IndexedLoad(param(1, 11), index)) is None  # intervals suffice


def test_the_same_index_guarded_by_position_less_than_size_passes():
    i = arange(8)
    index = i.alu(Ops.ADD, const(3, i32, (8,)))
    guard = i.alu(Ops.CMPLT, const(5, i32, (8,)))
    assert check_indexed_load(IndexedLoad(param(1, 8), index, guard)) is None
    loose = i.alu(Ops.CMPLT, const(6, i32, (8,)))
    assert "position (5,)" in check_indexed_load(IndexedLoad(param(1, 8), index, loose))


def test_a_float_cast_to_bool_is_an_unconstrained_guard():
    floats = data(2, 8, f32)
    guard = floats.cast(dtypes.bool)
    index = arange(8).alu(Ops.ADD, const(3, i32, (8,)))
    msg = check_indexed_load(IndexedLoad(param(1, 8), index, guard))
    assert msg and "although its guard holds" in msg
    both = guard.alu(Ops.AND, arange(8).alu(Ops.CMPLT, const(5, i32, (8,))))
    assert check_indexed_load(IndexedLoad(param(1, 8), index, both)) is None


def test_an_index_from_data_through_a_cast_is_safe_only_under_its_own_range_guard():
    idx = data(2, 6, f32).cast(i32)  # a float tensor of indices, cast to int: any value at all
    assert "position" in check_indexed_load(IndexedLoad(param(1, 10), idx))
    in_range = idx.alu(Ops.CMPLT, const(10, i32, (6,))).alu(
        Ops.AND, idx.alu(Ops.CMPLT, const(0, i32, (6,))).alu(Ops.NOT))
    assert check_indexed_load(IndexedLoad(param(1, 10), idx, in_range)) is None
    upper_only = idx.alu(Ops.CMPLT, const(10, i32, (6,)))
    msg = check_indexed_load(IndexedLoad(param(1, 10), idx, upper_only))
    assert msg and "index -" in msg


def test_index_math_through_a_reshape_of_a_permuted_view():
    # positions of a (3, 4) arange read in transposed order, as a flat 12-vector: 0, 4, 8, 1, 5, 9, ...
    grid = view(arange(12), (3, 4), (4, 1))
    transposed = view(grid, (4, 3), (1, 4))
    flat = view(transposed, (12,), (1,))  # a view of a view: index math with division and remainder
    index = flat.alu(Ops.ADD, const(4, i32, (12,)))
    assert "outside [0, 12)" in check_indexed_load(IndexedLoad(param(1, 12), index))
    same_guard = flat.alu(Ops.CMPLT, const(8, i32, (12,)))
    assert check_indexed_load(IndexedLoad(param(1, 12), index, same_guard)) is None
    wrong_order = arange(12).alu(Ops.CMPLT, const(8, i32, (12,)))  # guards positions, not the index
    assert "outside" in check_indexed_load(IndexedLoad(param(1, 12), index, wrong_order))


def test_a_guard_from_a_pad_mask():
    inside = view(const(True, dtypes.bool, ()), (10,), (0,), 0, ((2, 7),))  # True on [2, 7), padded
    index = arange(10).alu(Ops.SUB, const(2, i32, (10,)))
    assert check_indexed_load(IndexedLoad(param(1, 5), index, inside)) is None
    assert "position" in check_indexed_load(IndexedLoad(param(1, 4), index, inside))


def test_int32_wraparound_is_not_mistaken_for_a_small_index():
    big = const(2 ** 30, i32, (4,))
    index = arange(4).alu(Ops.MUL, big).alu(Ops.MUL, const(4, i32, (4,)))  # wraps to 0 for every position
    assert check_indexed_load(IndexedLoad(param(1, 1), index)) is None
    index2 = arange(4).alu(Ops.MUL, big)  # 0, 2^30, -2^31, -2^30
    assert "outside" in check_indexed_load(IndexedLoad(param(1, 2 ** 31), index2))


def test_registered_indexed_loads_are_checked_inside_kernels(monkeypatch):
    # a stand-in gather: WHERE(guard, <some op>, 0) where the op loads at computed positions
    guard = arange(8).alu(Ops.CMPLT, const(5, i32, (8,)))
    index = arange(8).alu(Ops.ADD, const(3, i32, (8,)))
    gathered = Node.make(Ops.WHERE, f32, (guard, const(1.0, f32, (8,)), const(0.0, f32, (8,))))
    monkeypatch.setitem(boundscheck.INDEXED_LOADS, Ops.WHERE,
                        lambda n: [IndexedLoad(param(1, 8), index, n.src[0])])
    check_kernel(kernel_reading(gathered))
    monkeypatch.setitem(boundscheck.INDEXED_LOADS, Ops.WHERE, lambda n: [IndexedLoad(param(1, 8), index)])
    boundscheck.clear_cache()
    with pytest.raises(BoundsError, match="indexed load"):
        check_kernel(kernel_reading(gathered))
    boundscheck.clear_cache()


def test_a_copy_past_the_end_of_its_buffer_is_rejected():
    from atensor.graph.node import BufferSpec
    from atensor.graph.taskgraph import Access, Copy, TaskGraph
    src, dst = BufferSpec("CPU", 8, f32), BufferSpec("CPU", 4, f32)
    graph = TaskGraph()
    graph.add(Copy(src, dst, 16, 0, 16), [Access(src, "r", 16, 32), Access(dst, "w", 0, 16)])
    boundscheck.check_graph(graph)
    graph.add(Copy(src, dst, 24, 8, 16), [Access(src, "r", 24, 40), Access(dst, "w", 8, 24)])
    with pytest.raises(BoundsError, match=r"task 1: .*bytes \[24, 40\) of buf"):
        boundscheck.check_graph(graph)


def test_gathers_from_tensor_indexing_are_proved_by_their_guard():
    assert Ops.GATHER in boundscheck.INDEXED_LOADS  # fails, not skips, if gathers lose their proof
    table = Tensor(np.arange(20, dtype=np.float32).reshape(5, 4))
    idx = Tensor(np.array([4, 0, 2], dtype=np.int32)).float().cast(dtypes.int32)  # indices through casts
    calls = prove.stats.z3_calls
    boundscheck.clear_cache()
    with atensor.Context(racecheck=True):
        out = table[idx].numpy()
    np.testing.assert_array_equal(out, np.arange(20).reshape(5, 4)[[4, 0, 2]])
    assert prove.stats.z3_calls > calls  # the index is data: intervals cannot decide, z3 proved it
