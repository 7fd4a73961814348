"""Autograd: every differentiable op's gradient rule against PyTorch on random inputs and against
central finite differences in float64; the general VIEW rule against an index-scatter reference;
backward/grad/requires_grad/detach/no_grad/train semantics."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from atensor import Tensor, dtypes
from atensor.graph.viewgrad import _scatter_back, view_backward
from atensor.graph.node import Node
from atensor.graph.view import View


from tests.torch_reference import needs_torch, torch

RNG = np.random.default_rng(0)


def _inputs(shapes, low, high):
    return [RNG.uniform(low, high, size=s) for s in shapes]


# (name, atensor function, torch function, input shapes, (low, high) of the inputs)
CASES = [
    ("neg", lambda x: -x, lambda x: -x, [(3, 4)], (-2, 2)),
    ("exp", lambda x: x.exp(), torch.exp, [(3, 4)], (-2, 2)),
    ("log", lambda x: x.log(), torch.log, [(3, 4)], (0.5, 3)),
    ("sqrt", lambda x: x.sqrt(), torch.sqrt, [(3, 4)], (0.5, 3)),
    ("rsqrt", lambda x: x.rsqrt(), torch.rsqrt, [(3, 4)], (0.5, 3)),
    ("sin", lambda x: x.sin(), torch.sin, [(3, 4)], (-3, 3)),
    ("cos", lambda x: x.cos(), torch.cos, [(3, 4)], (-3, 3)),
    ("tan", lambda x: x.tan(), torch.tan, [(3, 4)], (-1, 1)),
    ("tanh", lambda x: x.tanh(), torch.tanh, [(3, 4)], (-2, 2)),
    ("exp2", lambda x: x.exp2(), torch.exp2, [(3, 4)], (-2, 2)),
    ("log2", lambda x: x.log2(), torch.log2, [(3, 4)], (0.5, 3)),
    ("reciprocal", lambda x: x.reciprocal(), torch.reciprocal, [(3, 4)], (0.5, 3)),
    ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, [(3, 4)], (-3, 3)),
    ("relu", lambda x: x.relu(), torch.relu, [(3, 4)], (-2, 2)),
    ("abs", lambda x: x.abs(), torch.abs, [(3, 4)], (-2, 2)),
    ("square", lambda x: x.square(), torch.square, [(3, 4)], (-2, 2)),
    ("add", lambda x, y: x + y, lambda x, y: x + y, [(3, 4), (3, 4)], (-2, 2)),
    ("sub_broadcast", lambda x, y: x - y, lambda x, y: x - y, [(3, 1), (1, 4)], (-2, 2)),
    ("mul_broadcast", lambda x, y: x * y, lambda x, y: x * y, [(2, 3, 4), (4,)], (-2, 2)),
    ("div", lambda x, y: x / y, lambda x, y: x / y, [(3, 4), (3, 4)], (0.5, 2)),
    ("pow", lambda x, y: x ** y, lambda x, y: x ** y, [(3, 4), (3, 4)], (0.5, 2)),
    ("pow_scalar", lambda x: x ** 3, lambda x: x ** 3, [(3, 4)], (-2, 2)),
    ("rpow_scalar", lambda x: 2 ** x, lambda x: 2 ** x, [(3, 4)], (-2, 2)),
    ("maximum", lambda x, y: x.maximum(y), torch.maximum, [(3, 4), (3, 4)], (-2, 2)),
    ("minimum", lambda x, y: x.minimum(y), torch.minimum, [(3, 4), (3, 4)], (-2, 2)),
    ("clip", lambda x: x.clip(-0.5, 0.5), lambda x: x.clip(-0.5, 0.5), [(3, 4)], (-2, 2)),
    ("where", lambda x, y: (x > y).where(x * 2, y * y), lambda x, y: torch.where(x > y, x * 2, y * y),
     [(3, 4), (3, 4)], (-2, 2)),
    ("sum_axis", lambda x: x.sum(axis=1), lambda x: x.sum(dim=1), [(3, 4, 2)], (-2, 2)),
    ("sum_all", lambda x: x.sum(), lambda x: x.sum(), [(3, 4)], (-2, 2)),
    ("mean_keepdim", lambda x: x.mean(axis=(0, 2), keepdim=True), lambda x: x.mean(dim=(0, 2), keepdim=True),
     [(3, 4, 2)], (-2, 2)),
    ("max_axis", lambda x: x.max(axis=0), lambda x: x.amax(dim=0), [(5, 4)], (-2, 2)),
    ("min_axis", lambda x: x.min(axis=1), lambda x: x.amin(dim=1), [(3, 5)], (-2, 2)),
    ("max_all", lambda x: x.max(), lambda x: x.amax(), [(3, 5)], (-2, 2)),
    ("prod_axis", lambda x: x.prod(axis=1), lambda x: x.prod(dim=1), [(3, 4)], (-2, 2)),
    ("reshape", lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6), [(2, 3, 4)], (-2, 2)),
    ("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), [(2, 3, 4)], (-2, 2)),
    ("transpose_reshape", lambda x: x.T.reshape(12), lambda x: x.T.reshape(12), [(3, 4)], (-2, 2)),
    ("expand", lambda x: x.expand(3, 4, 5), lambda x: x.expand(3, 4, 5), [(4, 1)], (-2, 2)),
    ("pad", lambda x: x.pad(((1, 2), (0, 1))), lambda x: torch.nn.functional.pad(x, (0, 1, 1, 2)),
     [(3, 4)], (-2, 2)),
    ("pad_value", lambda x: x.pad(((1, 0), (2, 1)), value=3.0),
     lambda x: torch.nn.functional.pad(x, (2, 1, 1, 0), value=3.0), [(3, 4)], (-2, 2)),
    ("shrink", lambda x: x.shrink(((1, 3), (0, 2))), lambda x: x[1:3, 0:2], [(3, 4)], (-2, 2)),
    ("flip", lambda x: x.flip((0, 1)), lambda x: x.flip((0, 1)), [(3, 4)], (-2, 2)),
    ("getitem_steps", lambda x: x[::2, ::-3], lambda x: x[::2].flip(1)[:, ::3], [(5, 7)], (-2, 2)),
    ("getitem_int", lambda x: x[1, :, 2], lambda x: x[1, :, 2], [(3, 4, 5)], (-2, 2)),
    ("unsqueeze_squeeze", lambda x: x.unsqueeze(1).squeeze(1).flatten(), lambda x: x.flatten(),
     [(3, 4)], (-2, 2)),
    ("matmul", lambda x, y: x @ y, lambda x, y: x @ y, [(5, 3), (3, 4)], (-2, 2)),
    ("matmul_batched", lambda x, y: x @ y, lambda x, y: x @ y, [(2, 5, 3), (3, 4)], (-2, 2)),
    ("matvec", lambda x, y: x @ y, lambda x, y: x @ y, [(5, 3), (3,)], (-2, 2)),
    ("cast_roundtrip", lambda x: x.cast(dtypes.float32).cast(dtypes.float64) * 2,
     lambda x: x.float().double() * 2, [(3, 4)], (-2, 2)),
    ("contiguous", lambda x: x.T.contiguous() * x.T, lambda x: x.T.contiguous() * x.T, [(3, 4)], (-2, 2)),
    ("copy_device", lambda x: (x.to("CPU:1") * 2).to("CPU:0"), lambda x: x * 2, [(3, 4)], (-2, 2)),
    ("chain", lambda x, y: ((x @ y).tanh() * (x @ y).exp()).sum(axis=0),
     lambda x, y: ((x @ y).tanh() * (x @ y).exp()).sum(dim=0), [(4, 3), (3, 5)], (-1, 1)),
]

# ops of the wider API (tensor/indexing.py, tensor/mathops.py, tensor/contract.py), where present
_IDX = np.array([[0, 2, 2, 1], [3, 0, 1, 1], [2, 2, 3, 0]])
_API = [
    ("softmax", "softmax", lambda x: x.softmax(1), lambda x: x.softmax(1), [(3, 5)], (-3, 3)),
    ("log_softmax", "log_softmax", lambda x: x.log_softmax(0), lambda x: x.log_softmax(0), [(3, 5)], (-3, 3)),
    ("logsumexp", "logsumexp", lambda x: x.logsumexp(1), lambda x: x.logsumexp(1), [(3, 5)], (-3, 3)),
    ("cumsum", "cumsum", lambda x: x.cumsum(1), lambda x: x.cumsum(1), [(3, 5)], (-3, 3)),
    ("var", "var", lambda x: x.var(1), lambda x: x.var(1), [(3, 5)], (-3, 3)),
    ("gelu", "gelu", lambda x: x.gelu(), lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
     [(3, 5)], (-3, 3)),
    ("silu", "silu", lambda x: x.silu(), torch.nn.functional.silu, [(3, 5)], (-3, 3)),
    ("leaky_relu", "leaky_relu", lambda x: x.leaky_relu(0.1),
     lambda x: torch.nn.functional.leaky_relu(x, 0.1), [(3, 5)], (-3, 3)),
    ("gather", "gather", lambda x: x.gather(1, Tensor(_IDX.astype(np.int32))),
     lambda x: x.gather(1, torch.tensor(_IDX)), [(3, 4)], (-3, 3)),
    ("getitem_tensor", "gather", lambda x: x[Tensor(np.array([2, 0, 2], np.int32))],
     lambda x: x[torch.tensor([2, 0, 2])], [(3, 4)], (-3, 3)),
    ("scatter_reduce_sum", "scatter_reduce",
     lambda x, y: x.scatter_reduce(1, Tensor(_IDX.astype(np.int32)), y, "sum"),
     lambda x, y: x.scatter_reduce(1, torch.tensor(_IDX), y, "sum"), [(3, 4), (3, 4)], (-3, 3)),
    ("conv2d", "conv2d", lambda x, w: x.conv2d(w, padding=1, stride=(1, 2)),
     lambda x, w: torch.nn.functional.conv2d(x, w, padding=1, stride=(1, 2)),
     [(2, 3, 5, 6), (4, 3, 3, 3)], (-1, 1)),
    ("max_pool2d", "max_pool2d", lambda x: x.max_pool2d(2), lambda x: torch.nn.functional.max_pool2d(x, 2),
     [(2, 3, 4, 6)], (-3, 3)),
    ("avg_pool2d", "avg_pool2d", lambda x: x.avg_pool2d(2), lambda x: torch.nn.functional.avg_pool2d(x, 2),
     [(2, 3, 4, 6)], (-3, 3)),
]
CASES += [(name, fn, tfn, shapes, domain)
          for name, method, fn, tfn, shapes, domain in _API if hasattr(Tensor, method)]


def _atensor_grads(fn, arrays, cotangent):
    xs = [Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    loss = (out * Tensor(cotangent)).sum()
    grads = loss.gradient(*xs)
    return out.numpy(), [g.numpy() for g in grads]


def _torch_grads(fn, arrays, cotangent):
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    (out * torch.tensor(cotangent)).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in xs]


@needs_torch
@pytest.mark.parametrize("name,fn,tfn,shapes,domain", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_pytorch(name, fn, tfn, shapes, domain):
    arrays = _inputs(shapes, *domain)
    expected_out, expected = _torch_grads(tfn, arrays, np.ones(1))
    cotangent = RNG.uniform(-1, 1, size=expected_out.shape)
    expected_out, expected = _torch_grads(tfn, arrays, cotangent)
    out, grads = _atensor_grads(fn, arrays, cotangent)
    np.testing.assert_allclose(out, expected_out, rtol=1e-6, atol=1e-9)
    for g, e in zip(grads, expected):
        assert g.shape == e.shape and g.dtype == np.float64
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name,fn,tfn,shapes,domain", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, tfn, shapes, domain):
    """The directional derivative along a random direction, by central differences in float64."""
    if name == "cast_roundtrip":
        pytest.skip("float32 rounding is a step function: central differences see its steps")
    arrays = _inputs(shapes, *domain)
    out_shape = fn(*[Tensor(a) for a in arrays]).shape
    cotangent = RNG.uniform(-1, 1, size=out_shape)
    _, grads = _atensor_grads(fn, arrays, cotangent)
    directions = [RNG.uniform(-1, 1, size=a.shape) for a in arrays]
    eps = 1e-6

    def objective(sign):
        moved = [Tensor(a + sign * eps * d) for a, d in zip(arrays, directions)]
        return float((fn(*moved).numpy() * cotangent).sum())

    numeric = (objective(1) - objective(-1)) / (2 * eps)
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, directions))
    assert math.isclose(numeric, analytic, rel_tol=1e-5, abs_tol=1e-7), (numeric, analytic)


@needs_torch
def test_prod_gradient_with_zeros_is_the_product_of_the_others():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    _, (grad,) = _atensor_grads(lambda t: t.prod(axis=1), [x], np.ones(3))
    _, (expected,) = _torch_grads(lambda t: t.prod(dim=1), [x], np.ones(3))
    np.testing.assert_allclose(grad, expected)


def test_max_ties_share_the_gradient():
    x = np.array([1.0, 3.0, 3.0, 2.0])
    _, (grad,) = _atensor_grads(lambda t: t.max(), [x], np.ones(()))
    np.testing.assert_allclose(grad, [0, 0.5, 0.5, 0])


# ---- the general VIEW rule ---------------------------------------------------------------------
MOVES = st.sampled_from(["permute", "flip", "shrink", "pad", "stride", "expand", "reshape"])


def _apply(move, node, ref, data):
    """Applies one movement op to a graph node and the same op to a numpy index array `ref`
    (padding shows as -1: it reads no source element)."""
    shape = node.shape
    if move == "permute":
        order = tuple(data.draw(st.permutations(range(len(shape)))))
        return node.permute(order), ref.transpose(order)
    if move == "flip":
        axes = tuple(data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape))))
        return node.flip(axes), np.flip(ref, tuple(i for i, f in enumerate(axes) if f))
    if move == "shrink":
        bounds = []
        for s in shape:
            b = data.draw(st.integers(0, max(0, s - 1)))
            bounds.append((b, data.draw(st.integers(min(b + 1, s), s))))
        return node.shrink(tuple(bounds)), ref[tuple(slice(b, e) for b, e in bounds)]
    if move == "pad":
        pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
        return node.pad(pads), np.pad(ref, pads, constant_values=-1)
    if move == "stride":
        steps = tuple(data.draw(st.integers(1, 3)) for _ in shape)
        return node.stride(steps), ref[tuple(slice(None, None, k) for k in steps)]
    if move == "expand":
        if 1 not in shape:
            node, ref = node.reshape(shape + (1,)), ref.reshape(shape + (1,))
            shape = node.shape
        new = tuple(3 if s == 1 else s for s in shape)
        return node.expand(new), np.broadcast_to(ref, new)
    flat = ref.reshape(-1)
    target = data.draw(st.sampled_from([(flat.size,), (1, flat.size)] +
                                       ([(2, flat.size // 2)] if flat.size % 2 == 0 else [])))
    return node.reshape(target), ref.reshape(target)


@given(st.data())
def test_view_gradient_scatters_back_to_the_elements_read(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    size = math.prod(shape)
    node = Node.const(0.0, dtypes.float64, "CPU:0", (size,)).reshape(shape)
    base = Tensor(np.zeros(size)).node.reshape(shape)
    ref = np.arange(size).reshape(shape)
    view_node = base
    for move in data.draw(st.lists(MOVES, min_size=1, max_size=4)):
        view_node, ref = _apply(move, view_node, ref, data)
    assert view_node.shape == ref.shape
    cotangent = RNG.uniform(-1, 1, size=ref.shape)
    expected = np.zeros(size)
    np.add.at(expected, ref[ref >= 0], cotangent[ref >= 0])
    # the chain of views as the graph holds it (folded or stacked), differentiated view by view
    grad = Tensor(cotangent).node
    chain = []
    n = view_node
    while n.op.name == "VIEW":
        chain.append(n)
        n = n.src[0]
    for v in chain:
        grad = view_backward(grad, v.arg, v.src[0].shape)
    assert grad.shape == n.shape and node.size == size
    np.testing.assert_allclose(Tensor(grad).numpy().reshape(-1), expected)
    # the general scatter-add rule (used for overlapping windows) agrees on every view
    grad = Tensor(cotangent).node
    for v in chain:
        grad = _scatter_back(grad, v.arg, v.src[0].shape)
    np.testing.assert_allclose(Tensor(grad).numpy().reshape(-1), expected)


def test_view_backward_of_common_views_is_the_inverse_movement():
    g = Tensor(np.ones((4, 3))).node
    assert view_backward(g, View.create((3, 4)).permute((1, 0)), (3, 4)).arg.strides == (1, 3)
    g = Tensor(np.ones((3, 4))).node
    summed = view_backward(g, View.create((3, 1)).expand((3, 4)), (3, 1))
    assert summed.op.name == "REDUCE"


# ---- semantics ---------------------------------------------------------------------------------
def test_backward_fills_grad_of_tensors_that_require_it_and_accumulates():
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    c = Tensor([4.0, 5.0, 6.0])
    (w * c).sum().backward()
    assert c.grad is None
    np.testing.assert_allclose(w.grad.numpy(), [4, 5, 6])
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [6, 9, 12])


def test_parameter_used_through_several_views_gets_all_contributions():
    w = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    loss = (w.T * 2).sum() + w[1].sum() + (w @ Tensor(np.ones((3, 1)))).sum()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), [[3, 3, 3], [4, 4, 4]])


def test_backward_of_a_non_scalar_needs_a_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match="needs `gradient`"):
        (x * 2).backward()
    (x * 2).backward(Tensor([1.0, -1.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2, -2])


def test_detach_stops_the_gradient():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x.detach()).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1, 2, 3])
    y = Tensor([1.0, 2.0])
    alias = y.detach()
    alias[0:1] = 7.0  # a detached view of storage that does not require grad still aliases it
    np.testing.assert_allclose(y.numpy(), [7, 2])


def test_no_grad_results_are_detached():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with Tensor.no_grad:
        doubled = x * 2
        assert Tensor.no_grad
    assert not Tensor.no_grad
    (doubled * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 4])

    @Tensor.no_grad()
    def inside():
        return bool(Tensor.no_grad)
    assert inside() and not Tensor.no_grad
    with Tensor.no_grad, pytest.raises(RuntimeError, match="no_grad"):
        x.sum().backward()


def test_train_and_test_modes():
    assert not Tensor.training
    with Tensor.train():
        assert Tensor.training
        with Tensor.test():
            assert not Tensor.training and Tensor.no_grad
        assert Tensor.training and not Tensor.no_grad
    assert not Tensor.training


def test_gradient_through_an_assign_reaches_the_value():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    store = Tensor(np.zeros(5))
    store[1:4] = x * 3
    (store * Tensor(np.arange(5.0))).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3, 6, 9])


def test_gradient_of_an_unused_target_raises_or_is_zero():
    x, y = Tensor([1.0], requires_grad=True), Tensor([2.0], requires_grad=True)
    with pytest.raises(ValueError, match="not used"):
        (x * 2).sum().gradient(y)
    assert (x * 2).sum().gradient(y, materialize_grads=True)[0].tolist() == [0.0]


def test_integer_inputs_get_no_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    i = Tensor([3, 4], requires_grad=True)
    (x * i).sum().backward()
    assert i.grad is None
    np.testing.assert_allclose(x.grad.numpy(), [3, 4])


async def test_one_realize_runs_forward_backward_and_update():
    w = Tensor(np.array([1.0, -2.0, 3.0], np.float32), requires_grad=True)
    x = Tensor(np.array([0.5, 1.0, 2.0], np.float32))
    loss = ((w * x).sum() - 1) ** 2
    loss.backward()
    w.assign(w - w.grad * 0.1)
    await Tensor.realize(loss, w)
    err = (0.5 - 2 + 6) - 1
    assert loss.item() == pytest.approx(err ** 2)
    expected = np.array([1, -2, 3]) - 0.1 * 2 * err * np.array([0.5, 1, 2])
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_backward_after_reading_the_loss_still_works():
    w = Tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    assert loss.item() == 5.0  # realizes the loss into a buffer; its graph is kept for backward
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), [2, 4])


# ---- multi-device ------------------------------------------------------------------------------
DEVICES = ("CPU:0", "CPU:1")


def _mlp_loss(x, w1, w2):
    return ((x @ w1).relu() @ w2).tanh().mean()


@pytest.mark.parametrize("realize_weights", [False, True])
async def test_data_parallel_gradients_of_replicated_weights_equal_one_device(realize_weights):
    x, w1, w2 = RNG.standard_normal((6, 4)), RNG.standard_normal((4, 5)), RNG.standard_normal((5, 3))
    ref = [Tensor(w, requires_grad=True) for w in (w1, w2)]
    _mlp_loss(Tensor(x), *ref).backward()
    weights = [Tensor(w).shard(DEVICES) for w in (w1, w2)]  # replicated: a lazy copy per device
    if realize_weights:
        await Tensor.realize(*weights)  # now each device holds its own replica in its own buffer
    for w in weights:
        w.requires_grad = True
    _mlp_loss(Tensor(x).shard(DEVICES, axis=0), *weights).backward()
    for w, r in zip(weights, ref):
        assert w.grad.device == DEVICES and w.grad.shard_axis is None  # replicated, like the weight
        await Tensor.realize(w.grad, r.grad)
        np.testing.assert_allclose(w.grad.numpy(), r.grad.numpy(), rtol=1e-9)
        for shard in w.grad.shards:  # every device got the summed (allreduced) gradient
            np.testing.assert_allclose(shard.numpy(), r.grad.numpy(), rtol=1e-9)


def _allreduces(*grads) -> set:
    """The distinct allreduces (their partials) the gradient graphs read."""
    found, seen, stack = set(), set(), [g.node for g in grads]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op.name == "ALLREDUCE":
            found.add(node.src)
        stack.extend(node.src)
    return found


async def test_fused_replicated_parameters_and_their_flat_buffer_share_one_allreduce():
    # the parameters are views of one flat buffer per device (optim's fused=True); the gradient of the
    # flat buffer and of every parameter is then one sum over the devices, each viewing its part (one
    # allreduce per parameter and one for the flat buffer before)
    from atensor.nn import optim
    x, w1, w2 = RNG.standard_normal((6, 4)), RNG.standard_normal((4, 5)), RNG.standard_normal((5, 3))
    ref = [Tensor(w, requires_grad=True) for w in (w1, w2)]
    _mlp_loss(Tensor(x), *ref).backward()
    weights = [Tensor(w).shard(DEVICES) for w in (w1, w2)]
    opt = optim.SGD(weights, lr=0.1, fused=True)
    await Tensor.realize(*weights, *opt.targets)
    _mlp_loss(Tensor(x).shard(DEVICES, axis=0), *weights).backward()
    flat = opt.targets[0]
    assert len(_allreduces(flat.grad, *(w.grad for w in weights))) == 1
    await Tensor.realize(flat.grad, *(w.grad for w in weights), *(r.grad for r in ref))
    for w, r in zip(weights, ref):
        assert w.grad.device == DEVICES and w.grad.shard_axis is None
        for shard in w.grad.shards:
            np.testing.assert_allclose(shard.numpy(), r.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(flat.grad.numpy(), np.concatenate([r.grad.numpy().reshape(-1) for r in ref]),
                               rtol=1e-9)


async def test_gradient_of_a_sharded_tensor_is_sharded_alike():
    x = RNG.standard_normal((5, 3))
    ref = Tensor(x, requires_grad=True)
    ((ref * ref).sum(axis=1).exp()).sum().backward()
    sharded = Tensor(x).shard(DEVICES, axis=0)
    sharded.requires_grad = True
    ((sharded * sharded).sum(axis=1).exp()).sum().backward()
    assert sharded.grad.shard_axis == 0 and sharded.grad.shard_bounds == sharded.shard_bounds
    await Tensor.realize(sharded.grad, ref.grad)
    np.testing.assert_allclose(sharded.grad.numpy(), ref.grad.numpy(), rtol=1e-9)


@needs_torch
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
async def test_allreduce_gradient_goes_back_to_each_device(op):
    a_np, b_np = np.array([1.0, 5.0, 2.0]), np.array([3.0, 5.0, -1.0])
    a, b = Tensor(a_np, device="CPU:0", requires_grad=True), Tensor(b_np, device="CPU:1", requires_grad=True)
    weights = np.array([1.0, 2.0, 3.0])
    out = Tensor.allreduce([a, b], op)
    (out * Tensor(weights).shard(DEVICES)).sum().backward()
    await Tensor.realize(a.grad, b.grad)
    ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    stacked = torch.stack([ta, tb])
    reduced = {"sum": stacked.sum(0), "mean": stacked.mean(0), "max": stacked.amax(0)}[op]
    (reduced * torch.tensor(weights)).sum().backward()
    assert a.grad.device == "CPU:0" and b.grad.device == "CPU:1"
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy())


def test_backward_after_assigning_a_new_value_uses_the_new_graph():
    w = Tensor([1.0, 2.0], requires_grad=True)
    out = Tensor([0.0, 0.0])
    out.assign(w * 3)
    out.realize().wait()
    out.assign(w * w)  # a new value for the same storage: its graph, not the first one, is differentiated
    out.realize().wait()
    out.backward(Tensor([1.0, 1.0]))
    np.testing.assert_allclose(w.grad.numpy(), [2, 4])


def test_every_graph_op_has_a_gradient_rule():
    """The table covers the whole graph: leaves have no sources, STORE and PARAM exist only inside
    kernels, and a MULTI node is differentiated shard by shard (it is never another node's source)."""
    from atensor.graph.gradient import GRADIENT
    from atensor.graph.ops import LEAVES, Ops
    missing = [op.name for op in Ops if op not in GRADIENT.by_op and op not in LEAVES
               and op not in (Ops.STORE, Ops.MULTI)]
    assert missing == []


def test_requires_grad_can_be_turned_off_again():
    w = Tensor([1.0, 2.0], requires_grad=True)
    w.requires_grad = False  # the registry of tensors needing gradients must not compare tensors with ==
    assert w.requires_grad is False
    v = Tensor([3.0], requires_grad=True)
    (v * 2).sum().backward()
    assert v.grad.tolist() == [2.0] and w.grad is None
