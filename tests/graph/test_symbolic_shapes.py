"""Symbolic-length views (graph/view.py): a dim that is a linear expression of bound Variables, as in a KV
cache read `cache[:, :start_pos+1]`. Each case runs eagerly (the numpy backend renders the concrete kernel
for the value) and under the jit (one capture, replays that rebind the Variable; with native="all" the C
kernels loop to the value), checked against numpy at several values. Then what is refused, and the bounds
proof over a Variable's whole range."""
from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor, TinyJit, Variable
from atensor.backend.c import compiler
from atensor.backend.c.render import render_c
from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.symbolic import SymbolicError
from atensor.graph.view import View
from atensor.sched.boundscheck import BoundsError, check_kernel
from atensor.sched.schedule import schedule

N = Variable("n", 1, 10)
RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 10)).astype(np.float32)
B = RNG.standard_normal((10, 4)).astype(np.float32)
VALUES = (3, 7, 1, 10, 5)  # the first runs, the second is captured, the third checked, then replays


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def head(t: Tensor, n) -> Tensor:
    """The first n columns: a view of symbolic length."""
    return t.shrink((None, (0, n)))


CASES = {
    "shrink read": (lambda a, b, n: head(a, n) * 2, lambda n: A[:, :n] * 2),
    "sum over the symbolic axis": (lambda a, b, n: head(a, n).sum(1), lambda n: A[:, :n].sum(1)),
    "max over the symbolic axis": (lambda a, b, n: head(a, n).max(1), lambda n: A[:, :n].max(1)),
    "mean divides by the run-time length": (lambda a, b, n: head(a, n).mean(1), lambda n: A[:, :n].mean(1)),
    "softmax": (lambda a, b, n: head(a, n).softmax(-1), lambda n: _softmax(A[:, :n])),
    "matmul contracting the symbolic dim": (lambda a, b, n: head(a, n).softmax(-1) @ b.shrink(((0, n), None)),
                                            lambda n: _softmax(A[:, :n]) @ B[:n]),
    "matmul producing a symbolic x symbolic-free result": (lambda a, b, n: head(a, n) @ head(a, n).T,
                                                          lambda n: A[:, :n] @ A[:, :n].T),
    "elementwise between equal symbolic dims, permuted": (
        lambda a, b, n: (head(a, n) * head(a * 3, n)).T.reshape(n, 3, 1), lambda n: (A[:, :n] ** 2 * 3).T[..., None]),
}


@pytest.mark.parametrize("name", CASES)
def test_eager_matches_numpy_at_each_value(name):
    build, ref = CASES[name]
    for n in VALUES[:3]:
        out = build(Tensor(A), Tensor(B), N.bind(n))
        np.testing.assert_allclose(out.numpy(), ref(n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CASES)
def test_jitted_matches_numpy_and_replays_without_recapture(name):
    build, ref = CASES[name]
    step = TinyJit(lambda a, b, n: build(a, b, n).realize())
    with atensor.Context(native="all" if compiler.path() is not None else "0"):
        for n in VALUES:
            out = step(Tensor(A), Tensor(B), N.bind(n))
            assert out.numpy().shape == ref(n).shape  # a result of symbolic shape has this call's length
            np.testing.assert_allclose(out.numpy(), ref(n), rtol=1e-5, atol=1e-5)
    assert step.stats == {"calls": 5, "replays": 2, "captures": 1}


def test_a_symbolic_length_write_eager_and_jitted():
    """`cache[:, :n] = x[:, :n] * 3`: only the first n columns change, for each n."""
    cache = Tensor.zeros(3, 10).contiguous().realize()
    ref = np.zeros((3, 10), np.float32)

    @TinyJit
    def write(x: Tensor, n) -> None:
        cache.shrink((None, (0, n))).assign(x.shrink((None, (0, n))) * 3).realize()
    for n in (2, 6, 4, 9, 1):
        x = RNG.standard_normal((3, 10)).astype(np.float32)
        write(Tensor(x), N.bind(n))
        ref[:, :n] = x[:, :n] * 3
        np.testing.assert_allclose(cache.numpy(), ref, rtol=1e-6)
    assert write.stats == {"calls": 5, "replays": 2, "captures": 1}
    cache.shrink((None, (0, N.bind(5)))).assign(Tensor.ones(3, 10).shrink((None, (0, N.bind(5))))).realize()
    ref[:, :5] = 1
    np.testing.assert_allclose(cache.numpy(), ref)


def test_the_c_kernel_loops_to_the_variable_value():
    """The compiled kernel is one function for every n: its loop bound reads the variable's slot."""
    n = Variable("n", 1, 10)
    src = Node.make(Ops.PARAM, dtypes.float32, (), (1, 30))
    out = Node.make(Ops.PARAM, dtypes.float32, (), (0, 3))
    read = Node.make(Ops.VIEW, dtypes.float32, (src,), View((3, n + 0), (10, 1)))
    total = read.reduce(atensor.graph.ops.ReduceOp.SUM, (1,))
    ast = Node.make(Ops.STORE, dtypes.float32, (Node.make(Ops.VIEW, dtypes.float32, (out,), View((3, 1), (1, 0))),
                                                total))
    source = render_c(ast, "k")
    assert "var0 = (int64_t)(intptr_t)bufs[2]" in source and "< (var0)" in source


async def _await_symbolic_sum(n: int) -> np.ndarray:
    out = await head(Tensor(A), N.bind(n)).sum(1).realize()
    return out.numpy()


async def test_awaited_under_trio():
    np.testing.assert_allclose(await _await_symbolic_sum(4), A[:, :4].sum(1), rtol=1e-5)


def test_awaited_under_asyncio():
    np.testing.assert_allclose(asyncio.run(_await_symbolic_sum(6)), A[:, :6].sum(1), rtol=1e-5)
    assert trio  # trio's run is the pytest-trio test above


# ---- what is refused ---------------------------------------------------------------------------------
def test_a_length_that_can_leave_its_axis_is_refused_naming_the_bounds():
    wide = Variable("m", 1, 11)  # m = 11 would read past the 10 columns
    with pytest.raises(SymbolicError, match="give each Variable bounds"):
        head(Tensor(A), wide.bind(4))


def test_reshapes_that_would_need_a_symbolic_stride_are_refused():
    x = head(Tensor(A), N.bind(4))
    with pytest.raises(SymbolicError, match="symbolic dim must stay"):
        x.flatten()  # 3*n elements in one dim: the stride of a row would depend on n
    with pytest.raises(SymbolicError, match="-1"):
        x.reshape(-1)
    with pytest.raises(SymbolicError, match="linear"):
        Tensor.zeros(x.shape[1] * x.shape[1])  # n * n elements: not a linear expression


def test_the_bounds_proof_rejects_a_symbolic_length_past_the_end_for_some_value():
    """A view of length s+1 over 8 elements fits for s <= 7 only; with s in [0, 8] the proof finds s=8."""
    s = Variable("s", 0, 8)
    src = Node.make(Ops.PARAM, dtypes.float32, (), (1, 8))
    read = Node.make(Ops.VIEW, dtypes.float32, (src,), View((s + 1,), (1,), 0, ((0, s + 1),)))
    out = Node.make(Ops.PARAM, dtypes.float32, (), (0, 9))
    store = Node.make(Ops.STORE, dtypes.float32, (Node.make(Ops.VIEW, dtypes.float32, (out,), View.create((s + 1,))),
                                                  read))
    with pytest.raises(BoundsError, match="s=8"):
        check_kernel(store, "past the end")
    ok = Variable("s", 0, 7)
    read = Node.make(Ops.VIEW, dtypes.float32, (src,), View((ok + 1,), (1,), 0, ((0, ok + 1),)))
    check_kernel(Node.make(Ops.STORE, dtypes.float32,
                           (Node.make(Ops.VIEW, dtypes.float32, (out,), View.create((ok + 1,))), read)), "in bounds")


def test_a_contraction_over_a_symbolic_dim_is_a_gemm_call_sized_at_run_time():
    """scores = q . keys[:n]^T: one row routine call (a small matrix: the prelude's at_sgemm_rows, which
    reads keys' rows contiguously) whose length is the variable's slot, not a loop nest; the result is
    laid out at the maximum (its leading dimension an int)."""
    keys = Tensor(RNG.standard_normal((10, 64)).astype(np.float32))
    q = Tensor(RNG.standard_normal((1, 64)).astype(np.float32))
    out = q @ keys.shrink(((0, N.bind(4)), None)).T
    n = out.node
    spec = BufferSpec(n.device, n.size, n.dtype)
    root = Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), View.create((n.size,)).reshape(n.shape))
    [kernel] = [t.work for t in schedule([root]).graph.tasks if hasattr(t.work, "ast")]
    source = render_c(kernel.ast, "k")
    assert re.search(r"at_sgemm_rows\(1, \(var0\), 64, b\d \+ \(0\), 64, b\d \+ \(0\), 64, t\d \+ \(0\), 10\);",
                     source), source
    assert "for (int64_t" not in source.split("at_sgemm_rows")[0]  # no loop nest around the call


def test_writes_and_reads_of_symbolic_ranges_in_one_step_are_ordered():
    """One jitted step writes cells [0, n), reads them back, and writes their sum at cell n: the task
    graph's symbolic byte ranges order the three for every n (the race check proves it), at each n."""
    cache = Tensor.zeros(2, 11).contiguous().realize()
    ref = np.zeros((2, 11), np.float32)

    @TinyJit
    def step(x: Tensor, n) -> Tensor:
        cache.shrink((None, (0, n))).assign(x.shrink((None, (0, n))))
        total = cache.shrink((None, (0, n))).sum(1)
        cache.shrink((None, (n, n + 1))).assign(total.reshape(2, 1))
        return cache.sum(1).realize()
    for n in (3, 5, 2, 8, 10):
        x = RNG.standard_normal((2, 11)).astype(np.float32)
        out = step(Tensor(x), N.bind(n)).numpy()
        ref[:, :n] = x[:, :n]
        ref[:, n] = ref[:, :n].sum(1)
        np.testing.assert_allclose(out, ref.sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(cache.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert step.stats == {"calls": 5, "replays": 2, "captures": 1}
