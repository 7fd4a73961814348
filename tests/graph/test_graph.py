"""graph/: interning, inference errors, views that never copy, and the simplification rules."""
from __future__ import annotations

import numpy as np
import pytest

from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, GraphError, Node
from atensor.graph.ops import Ops
from atensor.graph.simplify import simplify
from atensor.graph.view import View

F32 = dtypes.float32


def _buf(size: int = 12) -> Node:
    return BufferSpec("CPU:0", size, F32).node(0)


def test_nodes_are_interned():
    b = _buf()
    one = Node.const(1.0, F32, "CPU:0", (12,))
    assert b.alu(Ops.ADD, one) is b.alu(Ops.ADD, one)
    assert b.reshape((3, 4)) is b.reshape((3, 4))
    assert b.alu(Ops.ADD, one) is not b.alu(Ops.MUL, one)


def test_inference_errors_name_op_and_operands():
    b = _buf().reshape((3, 4))
    with pytest.raises(GraphError, match=r"shape mismatch in ADD: \(3, 4\) and \(12,\)"):
        b.alu(Ops.ADD, _buf())
    other = BufferSpec("CPU:1", 12, F32).node(0).reshape((3, 4))
    with pytest.raises(GraphError, match="different devices.*CPU:0 and CPU:1"):
        b.alu(Ops.MUL, other)
    with pytest.raises(GraphError, match="reshape"):
        b.reshape((5,))
    with pytest.raises(GraphError, match="expand"):
        b.expand((3, 5))


def test_views_compose_into_one_view_without_copies():
    b = _buf(24)
    v = b.reshape((2, 3, 4)).permute((2, 0, 1)).shrink(((1, 3), (0, 2), (0, 3))).flip((False, True, False))
    assert v.op is Ops.VIEW and v.src[0] is b  # one view straight over the buffer
    ref = np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1)[1:3, 0:2, 0:3][:, ::-1]
    view = v.arg
    flat = np.arange(24)
    got = np.lib.stride_tricks.as_strided(flat[view.offset:], view.shape, tuple(s * 8 for s in view.strides))
    np.testing.assert_array_equal(got, ref)


def test_reshape_that_cannot_be_one_view_stacks_a_second_view():
    b = _buf(24)
    permuted = b.reshape((4, 6)).permute((1, 0))
    flat = permuted.reshape((24,))
    assert flat.op is Ops.VIEW and flat.src[0] is permuted


def test_view_index_range_and_masks():
    v = View.create((4,)).pad(((2, 1),))
    assert v.shape == (7,) and v.mask == ((2, 6),)
    assert v.index_range() == (0, 3)
    s = View.create((10,)).stride((3,))
    assert s.shape == (4,) and s.index_range() == (0, 9)


def test_simplify_folds_constants_and_identities():
    b = _buf().reshape((3, 4))
    c = lambda v: Node.const(v, F32, "CPU:0", (3, 4))  # noqa: E731
    expr = b.alu(Ops.MUL, c(1.0)).alu(Ops.ADD, c(-0.0)).alu(Ops.SUB, c(0.0)).alu(Ops.NEG).alu(Ops.NEG)
    assert simplify([expr])[expr] is b
    kept = b.alu(Ops.ADD, c(0.0))  # -0.0 + 0.0 is 0.0: adding 0.0 changes a float's value
    assert simplify([kept])[kept] is kept
    folded = c(2.0).alu(Ops.MUL, c(3.0)).alu(Ops.ADD, c(1.0))
    out = simplify([folded])[folded]
    assert out.op is Ops.VIEW and out.src[0].op is Ops.CONST and out.src[0].arg[0] == 7.0
    assert out.shape == (3, 4)


def test_simplify_keeps_casts_that_change_dtype():
    b = BufferSpec("CPU:0", 4, dtypes.int32).node(0)
    expr = b.cast(F32).alu(Ops.ADD, Node.const(-0.0, F32, "CPU:0", (4,)))
    out = simplify([expr])[expr]
    assert out.op is Ops.CAST and out.dtype == F32
