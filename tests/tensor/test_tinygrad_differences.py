"""Where atensor's Tensor answers differently from tinygrad's, on purpose: the cases tinygrad's own test_ops
fails on atensor (tests/ports/tinygrad_known_failures.py gives each reason), tested here against the
reference atensor follows (PyTorch, or numpy where the rule is numpy's), plus the behaviours test_ops' own
skips leave unchecked (max over a NaN).

Each test says which side differs; tinygrad's suite itself runs from a tinygrad checkout
(scripts/run_tinygrad_ops.sh, docs/porting.md)."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, dtypes
from tests.torch_reference import needs_torch, torch


def test_backward_fills_grad_only_where_requires_grad_is_set():
    """PyTorch's rule: `x` (no requires_grad) gets no .grad, `w` gets d(sum(x*w))/dw = x. tinygrad fills
    every floating tensor the loss reads."""
    x_np = np.array([1.0, -2.0, 3.0], np.float32)
    x = Tensor(x_np)
    w = Tensor([0.5, 0.5, 0.5], requires_grad=True)
    (x * w).sum().backward()
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), x_np)


@needs_torch
def test_a_comparison_used_as_a_mask_passes_no_gradient_through_itself():
    """d/dt sum(t * (t < 0)) is the mask (t < 0): the comparison is a constant, as in PyTorch."""
    values = np.array([0.3, -1.2, 2.0, -0.1], np.float32)
    t = Tensor(values, requires_grad=True)
    (t * (t < 0)).sum().backward()
    ref = torch.tensor(values, requires_grad=True)
    (ref * (ref < 0)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy())
    (t != 0).sum()  # a comparison with no float path builds, and has no gradient to give
    assert not (t < 0).requires_grad


@pytest.mark.parametrize("op", ["sum", "prod"])
def test_an_unknown_dtype_name_raises_type_error_naming_the_dtypes(op):
    """tinygrad raises AttributeError from getattr(dtypes, ''); atensor says what it knows."""
    with pytest.raises(TypeError, match="unknown dtype ''.*float32"):
        getattr(Tensor([1.0, 2.0]), op)(dtype="")
    np.testing.assert_allclose(Tensor([1.0, 2.0, 3.0]).sum(dtype=dtypes.float64).numpy(), 6.0)
    assert Tensor([1.0, 2.0, 3.0]).prod(dtype="float64").dtype == dtypes.float64


@needs_torch
@pytest.mark.parametrize("data", [[1, 2, 4], [[0, 3], [5, 1]]])
def test_one_hot_minus_one_infers_the_class_count_as_pytorch_does(data):
    """num_classes=-1 means max + 1, as torch.nn.functional.one_hot; tinygrad refuses -1."""
    want = torch.nn.functional.one_hot(torch.tensor(data), -1).numpy()
    got = Tensor(data).one_hot(-1).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@needs_torch
@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_reduce_takes_a_tensor_src_as_pytorch_does(reduce):
    """scatter(dim, index, src, reduce=...) with a tensor src; tinygrad refuses it with TypeError."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 5)).astype(np.float32)
    src = rng.standard_normal((3, 4)).astype(np.float32)
    index = np.array([[0, 1, 1, 4], [2, 2, 2, 0], [3, 0, 1, 3]])
    want = torch.tensor(base).scatter(1, torch.tensor(index), torch.tensor(src), reduce=reduce).numpy()
    got = Tensor(base).scatter(dim=1, index=Tensor(index), src=Tensor(src), reduce=reduce).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("key", [
    lambda i, j: (1, slice(None), i, j),                        # int, slice, two index arrays
    lambda i, j: (1, i, slice(None), j),                        # separated by a slice
    lambda i, j: (i, 2, j),                                     # int between index arrays
    lambda i, j: (1, slice(None), slice(1, 5, 2), j),           # one array beside an int
])
def test_an_int_beside_index_arrays_counts_as_an_advanced_index_numpys_rule(key):
    """numpy (and docs/semantics.md section 8): an int among index arrays joins the broadcast index, so
    x[1, :, i, j] puts the index axes first; PyTorch and tinygrad keep them in place (shape (5, 3) here)."""
    a = np.arange(2 * 5 * 6 * 5, dtype=np.float32).reshape(2, 5, 6, 5)
    i, j = np.array([0, 1, 1]), np.array([2, 0, 4])
    want = a[key(i, j)]
    got = Tensor(a)[key(Tensor(i), Tensor(j))].numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@needs_torch
def test_sigmoid_is_exact_at_extremes_and_its_quotient_form_overflows_as_float32_does():
    """sigmoid(+-300) and its gradient are finite (1, 0; gradient 0) as in PyTorch; the quotient
    exp(x)/(1+exp(x)) at 300 is inf/inf = nan in float32, forward and backward, in PyTorch too (tinygrad
    rewrites the quotient and gets 0)."""
    values = np.array([300.0, -300.0, 0.0], np.float32)
    x = Tensor(values, requires_grad=True)
    x.sigmoid().sum().backward()
    ref = torch.tensor(values, requires_grad=True)
    torch.sigmoid(ref).sum().backward()
    np.testing.assert_allclose(x.sigmoid().numpy(), torch.sigmoid(ref).detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), ref.grad.numpy(), atol=1e-7)

    x = Tensor([300.0], requires_grad=True)
    quotient = x.exp() / (1 + x.exp())
    quotient.sum().backward()
    ref = torch.tensor([300.0], requires_grad=True)
    ref_quotient = ref.exp() / (1 + ref.exp())
    ref_quotient.sum().backward()
    assert np.isnan(quotient.numpy()[0]) and torch.isnan(ref_quotient).item()
    assert np.isnan(x.grad.numpy()[0]) and torch.isnan(ref.grad).item()


@needs_torch
@pytest.mark.parametrize("size", [(128, 128), (80, 96), (64, 64), (32, 32), (10, 10)])
def test_uint8_bilinear_interpolation_is_within_one_of_the_exact_values(size):
    """uint8 bilinear up- and downscaling is within one of the exact interpolation (PyTorch's, in float64),
    and the identity is exact. It is not PyTorch's uint8 kernel bit for bit: that one rounds fixed-point
    weights (about 15-50% of pixels differ by one, a few by two, depending on the scale), atensor lerps in
    float and rounds after each axis; tinygrad's test compares the two uint8 results exactly."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (2, 3, 64, 64), dtype=np.uint8)
    exact = torch.nn.functional.interpolate(torch.tensor(image, dtype=torch.float64), size=size,
                                            mode="bilinear").numpy()
    got = Tensor(image).interpolate(size, mode="linear").numpy()
    assert got.dtype == np.uint8 and got.shape == exact.shape
    assert np.abs(got - exact).max() <= 1.0
    if size == (64, 64):
        np.testing.assert_array_equal(got, image)


def test_max_over_a_nan_is_nan_as_numpy_says():
    """test_ops skips its test_max_nan ("broken" on some of tinygrad's backends); numpy's and PyTorch's
    answer is nan, and so is atensor's, for max and min, whole and along an axis."""
    data = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]], np.float32)
    for op in ("max", "min"):
        assert np.isnan(getattr(Tensor(data), op)().numpy())
        np.testing.assert_array_equal(getattr(Tensor(data), op)(axis=1).numpy(), getattr(np, op)(data, axis=1))
