"""The numpy backend's render-time plans and fast numpy paths (backend/numpy/plans.py), against numpy.

Each fast path must give what the plain numpy call gives: a branch-free where is bit-exact, a view
planned at render time reads the same elements as the View says, a planned contraction equals the
einsum of its broadcast operands, a padded add equals adding the zero-padded array. The end-to-end
tests build the graphs that take these paths (ReLU backward, concatenation, softmax over few classes,
a one-element tensor broadcast over a large one) and check the kernel used the path.
"""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.graph.view import View
from atensor.backend.numpy import render as numpy_backend
from atensor.backend.numpy.plans import AddPads, Contraction, Window, keep_freed_memory, max_last, where

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def new_kernels(run) -> list:
    """The kernel functions compiled while `run()` runs."""
    before = set(numpy_backend._cache)
    run()
    return [fn for ast, fn in numpy_backend._cache.items() if ast not in before]


def holds(fn, plan_type: type) -> bool:
    """True when the kernel `fn` calls a plan object of `plan_type`."""
    return any(isinstance(v, plan_type) for v in fn.__globals__.values())


def uses(fn, helper: str) -> bool:
    """True when the kernel `fn` calls the plan method or helper named `helper`."""
    named = (getattr(getattr(v, "__func__", v), "__name__", None) for v in fn.__globals__.values())
    return helper in named


# ---- where: the bits of x where cond, else those of y ------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8,
                                   np.bool_])
def test_where_is_bit_exact_for_every_dtype_and_operand_shape(dtype):
    x = (rng.standard_normal((48, 40)) * 10).astype(dtype)
    y = (rng.standard_normal((48, 40)) * 10).astype(dtype)
    cond = rng.standard_normal((48, 40)) < 0
    x0, y1 = np.array(x[0, 0]), np.array(y[1, 1])
    for a, b in [(x, y), (x0, y), (x, y1), (x0, y1),
                 (x.T.copy().T, y[:, ::-1])]:  # 0-d operands, non-contiguous operands
        got, want = where(cond, a, b), np.where(cond, a, b)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_where_keeps_nan_infinity_and_signed_zero():
    x = np.array([np.nan, -0.0, np.inf, 1.0] * 400, np.float32)
    y = np.array([0.0, np.nan, -np.inf, -0.0] * 400, np.float32)
    cond = rng.standard_normal(1600) < 0
    np.testing.assert_array_equal(where(cond, x, y).view(np.int32), np.where(cond, x, y).view(np.int32))


def test_relu_backward_on_a_large_batch_matches_numpy_and_selects_branch_free():
    x = rand(128, 96)
    t = Tensor(x, requires_grad=True)
    result = {}

    def run() -> None:
        (t.relu() * 3.0).sum().backward()
        result["grad"] = t.grad.numpy()
    kernels = new_kernels(run)
    got = result["grad"]
    want = np.where(x > 0, 3.0, np.where(x == 0, 1.5, 0.0)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert any("_where(" in fn.__atensor_source__ for fn in kernels)


# ---- views planned at render time ------------------------------------------------------------------

def test_window_reads_what_the_view_says():
    flat = np.arange(60, dtype=np.float32)
    base = View.create((3, 4, 5))
    cases = [base, base.permute((2, 0, 1)), base.shrink(((1, 3), (0, 4), (2, 5))),
             base.flip((False, True, True)),
             View.create((3, 1, 5)).expand((3, 4, 5)), base.pad(((1, 0), (0, 2), (1, 1))),
             base.shrink(((0, 0), (0, 4), (0, 5)))]
    cube = flat.reshape(3, 4, 5)
    want_of = [cube, cube.transpose(2, 0, 1), cube[1:3, :, 2:],
               cube[:, ::-1, ::-1], np.broadcast_to(flat[:15].reshape(3, 1, 5), (3, 4, 5)),
               np.pad(cube, ((1, 0), (0, 2), (1, 1))), np.zeros((0, 4, 5), np.float32)]
    for view, want in zip(cases, want_of):
        got = Window(view).read(flat)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_window_reads_a_non_contiguous_source_in_row_major_order():
    x = np.arange(20, dtype=np.int32).reshape(4, 5).T  # (5, 4), read in its own row-major order
    view = View((2, 4), (4, 1), 8, None)
    want = np.ascontiguousarray(x).reshape(-1)[8:16].reshape(2, 4)
    np.testing.assert_array_equal(Window(view).read(x), want)


def test_window_stores_into_its_region_only():
    buf = np.zeros(30, np.float32)
    view = View((3, 4), (1, 3), 2, None)  # a transposed window starting at 2
    Window(view).store(buf, np.arange(12, dtype=np.float64).reshape(3, 4))
    want = np.zeros(30, np.float32)
    want[2:14] = np.arange(12).reshape(3, 4).T.reshape(-1)
    np.testing.assert_array_equal(buf, want)


def test_padded_add_equals_adding_the_zero_padded_array_and_leaves_its_inputs():
    source, x = rand(6), rand(16)
    pad = View.create((6,)).pad(((4, 6),))
    want = x + np.pad(source, (4, 6))
    kept_x, kept_source = x.copy(), source.copy()
    np.testing.assert_array_equal(Window(pad).add_into(x, source, in_place=False), want)
    np.testing.assert_array_equal(x, kept_x)
    got = Window(pad).add_into(x, source, in_place=True)
    assert got is x
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(source, kept_source)


def test_concatenation_matches_numpy_and_adds_into_padded_regions():
    a, b, c = rand(300), rand(2000), rand(7)
    result = {}
    kernels = new_kernels(lambda: result.setdefault("cat", Tensor(a).cat(Tensor(b), Tensor(c)).numpy()))
    np.testing.assert_array_equal(result["cat"], np.concatenate([a, b, c]))
    # three pieces: one chain of adds into padded regions (AddPads), no zero-padded temporaries
    assert any(uses(fn, "add_into") or holds(fn, AddPads) for fn in kernels)


def test_pad_then_add_to_a_tensor_that_is_read_again_keeps_it():
    x, y = rand(5, 8), rand(3, 4)
    tx = Tensor(x)
    s = tx + Tensor(y).pad(((1, 1), (2, 2)))
    got, again = (s * tx).numpy(), tx.numpy()
    np.testing.assert_allclose(got, (x + np.pad(y, ((1, 1), (2, 2)))) * x, rtol=1e-6)
    np.testing.assert_array_equal(again, x)


# ---- contractions planned at render time -------------------------------------------------------------

def broadcast(x: np.ndarray, axes: tuple[int, ...], shape: tuple[int, ...]) -> tuple[View, np.ndarray]:
    """The View that puts `x`'s dims at `axes` of `shape` (others broadcast), and its numpy twin."""
    strides = [0] * len(shape)
    inner = View.create(x.shape).strides
    for axis, stride in zip(axes, inner):
        strides[axis] = stride
    in_axis_order = x.transpose(np.argsort(axes))  # x's dims sorted by the axis they go to
    expanded = in_axis_order.reshape([shape[i] if i in axes else 1 for i in range(len(shape))])
    return View(shape, tuple(strides), 0, None), np.broadcast_to(expanded, shape)


@pytest.mark.parametrize("shape,a_axes,b_axes,reduce", [
    ((5, 6, 7), (0, 2), (1, 2), (2,)),        # x @ w.T
    ((7, 5, 6), (0, 1), (0, 2), (0,)),        # g.T @ x (a weight gradient)
    ((2, 5, 6, 7), (0, 1, 3), (0, 2, 3), (3,)),  # batched
    ((5, 3, 6, 7), (0, 3), (2, 3), (3,)),      # axis 1 in neither operand: broadcast in the result
    ((5, 6, 7), (0, 2), (2, 1), (2,)),        # b's dims in the other order
])
def test_contraction_equals_the_einsum_of_its_broadcast_operands(shape, a_axes, b_axes, reduce):
    a = rand(*(shape[i] for i in a_axes))
    b = rand(*(shape[i] for i in b_axes))
    a_view, a_full = broadcast(a, a_axes, shape)
    b_view, b_full = broadcast(b, b_axes, shape)
    plan = Contraction(a_view, b_view, reduce, np.dtype(np.float32))
    assert plan.usable
    got = plan(a.reshape(-1), b.reshape(-1))
    want = (a_full.astype(np.float64) * b_full).sum(reduce, keepdims=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_one_sided_sum_is_left_to_einsum():
    a_view, _ = broadcast(rand(3, 5), (0, 2), (3, 4, 5))
    b_view, _ = broadcast(rand(4), (1,), (3, 4, 5))
    assert not Contraction(a_view, b_view, (1, 2), np.dtype(np.float32)).usable


def test_linear_layer_forward_and_backward_match_numpy():
    x, w = rand(32, 20), rand(12, 20)
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = tx @ tw.T
    (out * out).sum().backward()
    g = 2 * (x @ w.T)
    np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tw.grad.numpy(), g.T @ x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tx.grad.numpy(), g @ w, rtol=1e-4, atol=1e-4)


# ---- reductions, scalars, casts ----------------------------------------------------------------------

def test_max_over_a_short_last_axis_matches_numpy_with_nan():
    x = rand(64, 10)
    x[3, 4] = np.nan
    np.testing.assert_array_equal(max_last(x, (1, 0), (64, 1)), np.max(x, axis=1, keepdims=True))
    y = rand(6, 20, 10)
    np.testing.assert_array_equal(max_last(y, (2, 0, 1), (6, 20, 1)), np.max(y, axis=2, keepdims=True))


def test_softmax_over_few_classes_matches_numpy():
    x = rand(256, 10)
    got = Tensor(x).softmax(-1).numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    ints = rng.integers(-50, 50, (64, 9)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).max(-1).numpy(), ints.max(-1))


def test_a_one_element_tensor_broadcast_over_a_large_array_matches_numpy():
    x, s = rand(4, 96, 384), rand(1)  # large enough for a chunked region
    t = (Tensor(x) * Tensor(s) + 1.0).exp() - Tensor(s)
    np.testing.assert_allclose(t.numpy(), np.exp(x * s + 1) - s, rtol=1e-5)
    small = (Tensor(rand(300)) / Tensor(s).reshape(1, 1).sum()).numpy()
    assert small.shape == (300,)


def test_casts_without_errstate_convert_as_numpy_does():
    ints = rng.integers(-1000, 1000, 50).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).float().numpy(), ints.astype(np.float32))
    floats = rand(50) * 100
    np.testing.assert_array_equal(Tensor(floats).int().numpy(), floats.astype(np.int32))  # truncates
    np.testing.assert_array_equal(Tensor(floats > 0).float().numpy(), (floats > 0).astype(np.float32))


def test_keeping_freed_memory_can_be_turned_off():
    assert keep_freed_memory(0) is False
    assert keep_freed_memory(128 << 20) in (True, False)  # False off glibc


def test_a_one_sided_sum_of_broadcast_operands_renders_through_einsum():
    a, b = rand(6, 1, 5), rand(1, 4, 1)
    got = (Tensor(a).expand(6, 4, 5) * Tensor(b).expand(6, 4, 5)).sum((1, 2)).numpy()
    np.testing.assert_allclose(got, (a * b).sum((1, 2)), rtol=1e-5, atol=1e-6)


def test_a_matmul_of_a_window_at_a_variable_offset_matches_numpy():
    from atensor.graph.symbolic import Variable
    s = Variable("start", 0, 24)
    x, w = rand(32, 16), rand(16, 12)
    tx, tw = Tensor(x), Tensor(w)
    for start in (0, 5):
        rows = tx.shrink(((s.bind(start), s.bind(start) + 8), None))  # an 8-row window at `start`
        np.testing.assert_allclose((rows @ tw).numpy(), x[start:start + 8] @ w, rtol=1e-5, atol=1e-5)
