"""The rest of tinygrad's Tensor API (issue 18, section 3), each method against PyTorch: the forward
values, and the gradients of every float input where the function is differentiable."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pytest

from atensor import Tensor, dtypes
from tests.torch_reference import needs_torch, torch

pytestmark = needs_torch
F = torch.nn.functional


def check(shapes: list, ours: Callable, theirs: Optional[Callable] = None, grad: bool = True, low: float = -2.0,
          high: float = 2.0, atol: float = 1e-5, rtol: float = 1e-4, grad_atol: float = 1e-4, seed: int = 0,
          vals: Optional[list] = None) -> None:
    """ours(*atensor inputs) against theirs(*torch inputs) (the same function by default): values and,
    with `grad`, the gradient of the sum of the output with respect to each input."""
    theirs = theirs or ours
    rng = np.random.default_rng(seed)
    data = [np.asarray(v, dtype=np.float32) for v in vals] if vals is not None else \
        [rng.uniform(low, high, size=s).astype(np.float32) for s in shapes]
    ts = [torch.tensor(d, requires_grad=grad) for d in data]
    xs = [Tensor(d) for d in data]
    expected, got = theirs(*ts), ours(*xs)
    np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), atol=atol, rtol=rtol)
    if grad:
        want = torch.autograd.grad(theirs(*ts).sum(), ts, allow_unused=True)
        have = ours(*xs).sum().gradient(*xs, materialize_grads=True)
        for w, h in zip(want, have):
            ref = np.zeros(h.shape, np.float32) if w is None else w.numpy()
            np.testing.assert_allclose(h.numpy(), ref, atol=grad_atol, rtol=1e-3)


# ---- unary math and activations ----------------------------------------------------------------------
@pytest.mark.parametrize("name, ours, theirs, low, high", [
    ("asin", lambda x: x.asin(), torch.asin, -0.97, 0.97),
    ("acos", lambda x: x.acos(), torch.acos, -0.97, 0.97),
    ("atan", lambda x: x.atan(), torch.atan, -5, 5),
    ("sinh", lambda x: x.sinh(), torch.sinh, -3, 3),
    ("cosh", lambda x: x.cosh(), torch.cosh, -3, 3),
    ("asinh", lambda x: x.asinh(), torch.asinh, -5, 5),
    ("acosh", lambda x: x.acosh(), torch.acosh, 1.1, 5),
    ("atanh", lambda x: x.atanh(), torch.atanh, -0.9, 0.9),
    ("log10", lambda x: x.log10(), torch.log10, 0.1, 10),
    ("softsign", lambda x: x.softsign(), F.softsign, -4, 4),
    ("quick_gelu", lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), -4, 4),
    ("hardsigmoid", lambda x: x.hardsigmoid(), F.hardsigmoid, -4, 4),
    ("hardswish", lambda x: x.hardswish(), F.hardswish, -4, 4),
    ("selu", lambda x: x.selu(), F.selu, -3, 3),
    ("celu", lambda x: x.celu(), F.celu, -3, 3),
    ("logsigmoid", lambda x: x.logsigmoid(), F.logsigmoid, -30, 30),
    ("softmin", lambda x: x.softmin(), lambda x: F.softmin(x, -1), -3, 3),
    ("sinc", lambda x: x.sinc(), torch.sinc, -3, 3),
])
def test_elementwise_function_matches_pytorch_with_gradients(name, ours, theirs, low, high):
    check([(4, 7)], ours, theirs, low=low, high=high, atol=2e-5)


def test_copysign_fmod_logaddexp_match_pytorch():
    check([(3, 5), (3, 5)], lambda a, b: a.copysign(b), torch.copysign)
    check([(3, 5), (3, 5)], lambda a, b: a.fmod(b), torch.fmod, low=0.5, high=3, grad=False)
    check([(3, 5), (3, 5)], lambda a, b: a.logaddexp(b), torch.logaddexp)
    ints = np.array([7, -7, 5, -5]), np.array([2, 2, -3, -3])
    assert Tensor(ints[0]).fmod(Tensor(ints[1])).tolist() == torch.fmod(*map(torch.tensor, ints)).tolist()


def test_shifts_bitwise_not_and_rounding_division_match_pytorch():
    a, b = np.array([7, -7, 6, -1], dtype=np.int32), np.array([2, 2, -4, 3], dtype=np.int32)
    ta, tb = torch.tensor(a), torch.tensor(b)
    assert (Tensor(a) << 3).tolist() == (ta << 3).tolist()
    assert (Tensor(a) >> 1).tolist() == (ta >> 1).tolist()
    assert Tensor(a).bitwise_not().tolist() == torch.bitwise_not(ta).tolist()
    for mode in ("trunc", "floor"):
        assert Tensor(a).div(Tensor(b), rounding_mode=mode).tolist() == torch.div(ta, tb, rounding_mode=mode).tolist()
        check([(4, 5), (4, 5)], lambda x, y, m=mode: x.div(y, rounding_mode=m),
              lambda x, y, m=mode: torch.div(x, y, rounding_mode=m), low=0.5, high=3, grad=False)


# ---- reductions and scans ----------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1])
def test_cummax_cummin_return_values_and_indices_as_pytorch(axis):
    x = np.array([[1, 3, 3, 2, 5], [0, -1, 4, 4, -2]], dtype=np.float32)
    for ours, theirs in ((Tensor(x).cummax(axis), torch.cummax(torch.tensor(x), axis)),
                         (Tensor(x).cummin(axis), torch.cummin(torch.tensor(x), axis))):
        np.testing.assert_array_equal(ours[0].numpy(), theirs.values.numpy())
        np.testing.assert_array_equal(ours[1].numpy(), theirs.indices.numpy())
    check([(3, 6)], lambda t: t.cummax(axis)[0], lambda t: torch.cummax(t, axis).values)
    check([(3, 6)], lambda t: t.cummin(axis)[0], lambda t: torch.cummin(t, axis).values)


def test_logcumsumexp_std_mean_and_isclose_match_pytorch():
    check([(3, 70)], lambda t: t.logcumsumexp(1), lambda t: torch.logcumsumexp(t, 1), low=-30, high=30)
    check([(4, 5)], lambda t: t.std_mean(1)[0], lambda t: torch.std_mean(t, 1)[0])
    check([(4, 5)], lambda t: t.std_mean(0, correction=0)[1], lambda t: torch.std_mean(t, 0, correction=0)[1])
    a = np.array([1.0, 1.0 + 1e-6, np.inf, np.nan, 2.0, -np.inf], dtype=np.float32)
    b = np.array([1.0, 1.0, np.inf, np.nan, 2.1, np.inf], dtype=np.float32)
    for equal_nan in (False, True):
        assert Tensor(a).isclose(Tensor(b), equal_nan=equal_nan).tolist() == \
            torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=equal_nan).tolist()


# ---- selection and sorting ---------------------------------------------------------------------------
@pytest.mark.parametrize("dim, descending", [(-1, False), (0, True), (1, False)])
def test_sort_argsort_topk_match_pytorch_stably(dim, descending):
    x = np.random.default_rng(1).integers(0, 4, size=(5, 6, 7)).astype(np.float32)  # many ties
    v, i = Tensor(x).sort(dim, descending)
    tv, ti = torch.tensor(x).sort(dim=dim, descending=descending, stable=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_array_equal(Tensor(x).argsort(dim, descending).numpy(), ti.numpy())
    check([(5, 6, 7)], lambda t: t.sort(dim, descending)[0], lambda t: t.sort(dim=dim, descending=descending)[0])
    y = np.random.default_rng(2).standard_normal((5, 9)).astype(np.float32)
    tk, ttk = Tensor(y).topk(3, dim=1), torch.tensor(y).topk(3, dim=1)
    np.testing.assert_array_equal(tk[1].numpy(), ttk.indices.numpy())
    check([(5, 9)], lambda t: t.topk(3, 1)[0], lambda t: t.topk(3, 1).values)


def test_sort_puts_nan_last_as_pytorch():
    x = np.array([3.0, np.nan, -1.0, 2.0], dtype=np.float32)
    assert Tensor(x).argsort().tolist() == torch.tensor(x).argsort().tolist()


def test_nonzero_and_masked_select_match_pytorch():
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    tx = torch.tensor(x)
    np.testing.assert_array_equal((Tensor(x) > 0.5).nonzero().numpy(), (tx > 0.5).nonzero().numpy())
    np.testing.assert_array_equal(Tensor(x).masked_select(Tensor(x) > 0).numpy(), tx.masked_select(tx > 0).numpy())
    check([(6, 5)], lambda t: t.masked_select(Tensor(x) > 0), lambda t: t.masked_select(tx > 0))
    t, mask = Tensor([0, 1, 2, 3]), Tensor([True, False, True, True])
    assert t.masked_select(mask, size=5, fill_value=-1).tolist() == [0, 2, 3, -1, -1]  # lazy form
    assert Tensor([[1, 0], [0, 2]]).nonzero(size=3, fill_value=-1).tolist() == [[0, 0], [1, 1], [-1, -1]]


# ---- shape -----------------------------------------------------------------------------------------------
def test_unfold_unflatten_diagonal_diag_match_pytorch():
    check([(8,)], lambda t: t.unfold(0, 3, 2))
    check([(3, 7, 4)], lambda t: t.unfold(1, 2, 1))
    check([(3, 3, 3)], lambda t: t.unfold(1, 0, 8))  # empty windows: the gradient is zeros
    check([(4, 6)], lambda t: t.unflatten(1, (2, 3)))
    for offset in (0, 1, -2):
        check([(4, 5)], lambda t, o=offset: t.diagonal(o))
    check([(2, 3, 4)], lambda t: t.diagonal(0, 1, 2))
    for k in (0, 2, -1):
        check([(4,)], lambda t, k=k: t.diag(k))
    check([(4, 4)], lambda t: t.diag())


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_matches_pytorch(indexing):
    a, b, c = np.arange(3.0), np.arange(4.0), np.arange(2.0)
    ours = Tensor(a).meshgrid(Tensor(b), Tensor(c), indexing=indexing)
    theirs = torch.meshgrid(torch.tensor(a), torch.tensor(b), torch.tensor(c), indexing=indexing)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o.numpy(), t.numpy())


# ---- creation ----------------------------------------------------------------------------------------------
def test_linspace_normal_and_initializers():
    np.testing.assert_allclose(Tensor.linspace(-1, 2, 7).numpy(), torch.linspace(-1, 2, 7).numpy(), atol=1e-6)
    assert Tensor.linspace(3, 5, 1).tolist() == [3.0] and Tensor.linspace(0, 1, 5, dtype=dtypes.int32).dtype == dtypes.int32
    Tensor.manual_seed(0)
    n = Tensor.normal(200, 300, mean=2.0, std=3.0).numpy()
    assert abs(n.mean() - 2.0) < 0.05 and abs(n.std() - 3.0) < 0.05
    k = Tensor.kaiming_uniform(64, 32, 3, 3, a=0.0).numpy()
    bound = np.sqrt(6 / (32 * 9))
    assert k.min() >= -bound and k.max() <= bound and k.max() > 0.9 * bound
    g = Tensor.glorot_uniform(30, 40).numpy()
    assert abs(g).max() <= np.sqrt(6 / 70)
    with pytest.raises(ValueError):
        Tensor.kaiming_uniform(3, -2)


# ---- losses, normalization, dropout, interpolate -------------------------------------------------------------
def test_losses_as_tensor_methods_match_pytorch():
    target = np.array([0, 2, 1, 2])
    ty = torch.tensor(target)
    check([(4, 3)], lambda x: x.cross_entropy(Tensor(target)), lambda x: F.cross_entropy(x, ty))
    check([(4, 3)], lambda x: x.cross_entropy(Tensor(target), label_smoothing=0.1, reduction="sum"),
          lambda x: F.cross_entropy(x, ty, label_smoothing=0.1, reduction="sum"))
    check([(4, 3)], lambda x: x.log_softmax().nll_loss(Tensor(target)), lambda x: F.nll_loss(x.log_softmax(1), ty))
    w = np.array([0.2, 1.0, 3.0], dtype=np.float32)
    check([(4, 3)], lambda x: x.log_softmax().nll_loss(Tensor(target), weight=Tensor(w), ignore_index=1),
          lambda x: F.nll_loss(x.log_softmax(1), ty, weight=torch.tensor(w), ignore_index=1))
    check([(4, 3)], lambda x: x.sparse_categorical_crossentropy(Tensor(target)), lambda x: F.cross_entropy(x, ty))
    probs = np.array([0.0, 1.0, 1.0, 0.0], dtype=np.float32)
    check([(4,)], lambda x: x.sigmoid().binary_crossentropy(Tensor(probs)),
          lambda x: F.binary_cross_entropy(x.sigmoid(), torch.tensor(probs)))
    check([(4,)], lambda x: x.binary_crossentropy_logits(Tensor(probs)),
          lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(probs)), low=-20, high=20)


def test_layernorm_normalize_and_dropout():
    check([(3, 4, 5)], lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,)))
    check([(3, 4, 5)], lambda x: x.layernorm(axis=(1, 2)), lambda x: F.layer_norm(x, (4, 5)))
    check([(6, 5)], lambda x: x.normalize(), lambda x: F.normalize(x))
    check([(6, 5)], lambda x: x.normalize(p=1, dim=0), lambda x: F.normalize(x, p=1, dim=0))
    x = Tensor.ones(100, 100)
    assert x.dropout(0.5) is x  # not training: the identity
    with Tensor.train():
        kept = x.dropout(0.25).numpy()
    assert set(np.unique(kept)) <= {np.float32(0.0), np.float32(1 / 0.75)} and abs((kept == 0).mean() - 0.25) < 0.03


@pytest.mark.parametrize("size, mode, align", [((7,), "linear", False), ((3,), "linear", True),
                                               ((5, 9), "bilinear", False), ((9, 4), "bilinear", True),
                                               ((7, 3), "nearest", False), ((2, 5, 3), "trilinear", False)])
def test_interpolate_matches_pytorch(size, mode, align):
    shape = (2, 3) + (5, 6, 4)[:len(size)]
    kw = {"align_corners": align} if "linear" in mode else {}
    check([shape], lambda x: x.interpolate(size, mode=mode, **kw),
          lambda x: F.interpolate(x, size=size, mode=mode, **kw))


# ---- convolution and pooling ------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, w, kw", [
    ((2, 3, 11), (4, 3, 3), {}), ((2, 4, 10), (6, 2, 3), {"groups": 2, "stride": 2, "padding": 1}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"padding": 1}), ((2, 3, 7, 8), (4, 3, 3, 3), {"dilation": 2}),
    ((2, 2, 6, 6), (3, 2, 3, 3), {"padding": (1, 1)}),
])
def test_conv_over_any_number_of_spatial_axes_matches_pytorch(x, w, kw):
    theirs = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(x)]
    check([x, w], lambda a, b: a.conv2d(b, **kw), lambda a, b: theirs(a, b, **kw), atol=1e-4)


def test_conv_padding_per_side_is_pytorch_pad_order():
    check([(1, 2, 6, 7), (3, 2, 3, 3)], lambda a, b: a.conv2d(b, padding=(2, 1, 0, 3)),
          lambda a, b: F.conv2d(F.pad(a, (2, 1, 0, 3)), b), atol=1e-4)


@pytest.mark.parametrize("x, w, kw", [
    ((2, 4, 9), (4, 3, 3), {"stride": 2}), ((1, 4, 5, 6), (4, 2, 3, 2), {"stride": 2, "padding": 1, "groups": 2}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"stride": (2, 3), "output_padding": (1, 2), "dilation": 1}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"stride": 2}), ((1, 2, 5, 5), (2, 3, 3, 3), {"dilation": 2, "padding": 2}),
])
def test_conv_transpose_matches_pytorch(x, w, kw):
    theirs = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(x)]
    ours = {3: Tensor.conv_transpose1d, 4: Tensor.conv_transpose2d, 5: Tensor.conv_transpose3d}[len(x)]
    check([x, w], lambda a, b: ours(a, b, **kw), lambda a, b: theirs(a, b, **kw), atol=1e-4)


@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "ceil_mode": True},
                                {"kernel_size": (2, 3), "stride": 2, "padding": 1, "ceil_mode": True},
                                {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                 "count_include_pad": False}])
def test_pooling_ceil_mode_matches_pytorch(kw):
    check([(2, 3, 8, 9)], lambda x: x.avg_pool2d(**kw), lambda x: F.avg_pool2d(x, **kw))
    mkw = {k: v for k, v in kw.items() if k != "count_include_pad"}
    check([(2, 3, 8, 9)], lambda x: x.max_pool2d(**mkw), lambda x: F.max_pool2d(x, **mkw))


def test_max_pool_return_indices_and_max_unpool_match_pytorch():
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 8)).astype(np.float32)
    tx = torch.tensor(x)
    for kw in ({"kernel_size": 2}, {"kernel_size": (3, 2), "stride": 2, "padding": 1}, {"kernel_size": 3, "dilation": 2}):
        v, i = Tensor(x).max_pool2d(**kw, return_indices=True)
        tv, ti = F.max_pool2d(tx, **kw, return_indices=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
    kw = {"kernel_size": 2, "stride": 2}
    un = Tensor.max_unpool2d(*Tensor(x).max_pool2d(**kw, return_indices=True), **kw, output_size=(9, 8))
    tun = F.max_unpool2d(*F.max_pool2d(tx, **kw, return_indices=True), **kw, output_size=(9, 8))
    np.testing.assert_array_equal(un.numpy(), tun.numpy())


def test_pooling_in_one_and_three_dimensions_matches_pytorch():
    check([(2, 3, 10)], lambda x: x.max_pool2d(3, stride=2), lambda x: F.max_pool1d(x, 3, stride=2))
    check([(1, 2, 4, 6, 5)], lambda x: x.avg_pool2d((2, 3, 2)), lambda x: F.avg_pool3d(x, (2, 3, 2)))


def test_einsum_with_a_repeated_index_and_implicit_ellipsis_output_match_pytorch():
    check([(4, 4)], lambda a: Tensor.einsum("ii->i", a), lambda a: torch.einsum("ii->i", a))
    check([(3, 5, 5)], lambda a: Tensor.einsum("...ii->...", a), lambda a: torch.einsum("...ii->...", a))
    check([(3, 8, 9), (3, 7, 9)], lambda a, b: Tensor.einsum("...id, ...jd", a, b),
          lambda a, b: torch.einsum("...id, ...jd", a, b), atol=1e-4)


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_prod_and_scatter_multiply_match_pytorch(include_self):
    rng = np.random.default_rng(5)
    x, src = rng.standard_normal((4, 5, 6)).astype(np.float32), rng.standard_normal((4, 5, 6)).astype(np.float32)
    src[0, 0, 0] = 0.0
    index = rng.integers(0, 3, size=(3, 4, 5))
    ours = Tensor(x).scatter_reduce(1, Tensor(index.astype(np.int32)), Tensor(src), "prod", include_self=include_self)
    theirs = torch.tensor(x).scatter_reduce(1, torch.tensor(index), torch.tensor(src), "prod", include_self=include_self)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    ours = Tensor(x).scatter(1, Tensor(index.astype(np.int32)), 2.0, reduce="multiply")
    np.testing.assert_allclose(ours.numpy(), torch.tensor(x).scatter(1, torch.tensor(index), 2.0, reduce="multiply"))


def test_tie_gradients_of_relu_abs_minimum_and_clip_are_pytorch_s():
    check(None, lambda x: x.relu(), torch.relu, vals=[[-1.0, 0.0, 2.0]])
    check(None, lambda x: x.abs(), torch.abs, vals=[[-1.0, 0.0, 2.0]])
    check(None, lambda x, y: x.minimum(y), torch.minimum, vals=[[1.0, 2.0, 3.0], [1.0, 3.0, 2.0]])
    check(None, lambda x: x.clip(-2.5, 1.5), lambda x: x.clip(-2.5, 1.5), vals=[[-3.0, -2.5, 0.0, 1.5, 2.0]])
    check(None, lambda x: x.sigmoid(), torch.sigmoid, vals=[[-400.0, -2.0, 0.0, 2.0, 400.0]])


def test_a_gradient_through_comparisons_only_is_zero_as_pytorch():
    check([(3, 4), (3, 4)], lambda a, b: a.copysign(b), torch.copysign)
    e = Tensor.ones(2, 0)
    assert Tensor.ones(2, 3).cat(e, dim=1).sum().gradient(e)[0].shape == (2, 0)


def test_tuples_inside_an_index_are_index_lists_as_in_pytorch():
    x = np.random.default_rng(6).standard_normal((2, 5, 6)).astype(np.float32)
    for index in (((0,),), ((1, 0), (2, 1)), (((0,),),), (1, (2, 1, 0))):
        np.testing.assert_array_equal(Tensor(x)[index].numpy(), torch.tensor(x)[index].numpy())


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_negative_padding_crops_in_every_mode_as_pytorch(mode):
    check([(1, 2, 5, 6)], lambda x: x.pad((2, -1, -1, 2), mode=mode), lambda x: F.pad(x, (2, -1, -1, 2), mode=mode))
