"""Porting defects from tinygrad and PyTorch programs (issue 18, section 2): each test is one thing a
ported program does, checked against what eager PyTorch computes or raises."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import atensor
from atensor import Tensor, dtypes
from tests.torch_reference import needs_torch, torch


@needs_torch
def test_the_loss_read_after_opt_step_is_the_loss_before_the_step_as_in_pytorch():
    from atensor.nn.optim import SGD
    w0 = np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float32)
    x0 = np.array([[1.0, 0.5], [-1.0, 2.0]], dtype=np.float32)
    w, x = Tensor(w0, requires_grad=True), Tensor(x0)
    opt = SGD([w], lr=0.1)
    losses = []
    for _ in range(3):
        loss = (x @ w).relu().square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())  # tinygrad's and PyTorch's order: step, then read the loss
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    expected = []
    for _ in range(3):
        tloss = (torch.tensor(x0) @ tw).relu().square().sum()
        topt.zero_grad()
        tloss.backward()
        topt.step()
        expected.append(tloss.item())
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5)


def test_a_loss_kept_by_backward_still_differentiates_again():
    w = Tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    first = w.grad.numpy().copy()
    w.grad = None
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), first)
    assert loss.item() == 5.0


def test_a_plain_lazy_value_read_after_its_input_was_overwritten_still_raises():
    from atensor.sched.schedule import StaleReadError
    w = Tensor([1.0, 2.0])
    y = w * 2
    w.assign(Tensor([5.0, 5.0]))
    w.realize().wait()
    with pytest.raises(StaleReadError):
        y.numpy()


def test_a_jit_whose_plain_argument_changes_every_call_warns_once_that_it_is_not_replayed():
    @atensor.jit
    def step(x, scale):
        return x * scale

    x = Tensor([1.0, 2.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [step(x, k).numpy() for k in range(5)]
    said = [w for w in caught if issubclass(w.category, atensor.JitWarning)]
    assert len(said) == 1 and "not replayed" in str(said[0].message)
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out, [k * 1.0, k * 2.0])


def test_float_values_assigned_into_an_int_tensor_raise_naming_both_dtypes():
    t = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="float32.*int32"):
        t.assign(Tensor([1.5, 2.5, 3.5]))
    with pytest.raises(RuntimeError, match="int32"):
        t[0] = 1.5
    t[0] = 7  # ints into ints are fine
    f = Tensor([1.0, 2.0])
    f.assign(Tensor([3, 4]))  # ints into floats too
    assert t.tolist() == [7, 2, 3] and f.tolist() == [3.0, 4.0]


def test_stack_and_cat_take_a_list_as_pytorch_does():
    a, b = Tensor([1, 2]), Tensor([3, 4])
    assert Tensor.stack([a, b]).tolist() == [[1, 2], [3, 4]]
    assert Tensor.stack([a, b], dim=1).tolist() == [[1, 3], [2, 4]]
    assert Tensor.cat([a, b]).tolist() == [1, 2, 3, 4]
    assert a.cat([b]).tolist() == [1, 2, 3, 4]


def test_reshape_with_none_keeps_that_axis():
    assert Tensor.ones(2, 3, 4).reshape(None, -1).shape == (2, 12)
    assert Tensor.ones(2, 3, 4).reshape(None, None, 2, 2).shape == (2, 3, 2, 2)


def test_creation_takes_requires_grad():
    w = Tensor.ones(3, requires_grad=True)
    assert w.requires_grad
    (w * Tensor([1.0, 2.0, 3.0])).sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 3.0]
    assert Tensor.zeros(2, requires_grad=True).requires_grad and Tensor.rand(2, requires_grad=True).requires_grad


def test_big_python_ints_are_int64():
    t = Tensor([2 ** 40, 1])
    assert t.dtype == dtypes.int64 and t.tolist() == [2 ** 40, 1]
    assert Tensor([1, 2]).dtype == dtypes.int32


def test_variable_nn_optim_and_sequential_are_reachable_as_in_tinygrad():
    from atensor import Variable
    assert Variable("n", 1, 8).bind(3).value == 3
    from atensor import nn
    assert nn.optim.SGD is not None and atensor.nn.optim.Adam is not None
    layers = [lambda x: x + 1, lambda x: x * 2]
    assert Tensor([1.0]).sequential(layers).tolist() == [4.0]


def test_a_device_index_beyond_the_devices_is_a_clear_error_when_used():
    with pytest.raises(ValueError, match="CPU:99.*ATENSOR_MAX_DEVICES"):
        Tensor([1, 2], device="CPU:99")


@needs_torch
@pytest.mark.parametrize("make, error", [
    (lambda: Tensor.ones(3)[5], IndexError),
    (lambda: Tensor.ones(3, 4).sum(axis=3), IndexError),
    (lambda: Tensor.ones(-1), ValueError),
    (lambda: Tensor.ones(2, 3).reshape(4, 4), ValueError),
    (lambda: Tensor.ones(2, 3) + Tensor.ones(4, 3), ValueError),
])
def test_exception_types_follow_pytorch(make, error):
    with pytest.raises(error):
        make()


def test_dtype_min_max_and_tinygrad_dtype_names():
    assert dtypes.int8.min == -128 and dtypes.uint8.max == 255 and dtypes.float32.max == float("inf")
    assert dtypes.float is dtypes.float32 and dtypes.half is dtypes.float16 and dtypes.long is dtypes.int64
    assert dtypes.int is dtypes.int32 and dtypes.char is dtypes.int8 and dtypes.uchar is dtypes.uint8
    assert Tensor.ones(2, 3).ndim == 2


@pytest.mark.parametrize("make", [
    lambda: Tensor.ones(2, 4) @ Tensor.ones(1, 3),
    lambda: Tensor(3.0) @ Tensor.ones(3, 3),
    lambda: Tensor.ones(3, 4).permute(0, 0),
    lambda: Tensor.ones(3, 4).flip((1, -1)),
    lambda: Tensor.ones(3, 4).reshape(-1, -1, 2),
    lambda: Tensor.ones(3).clip(None, None),
    lambda: Tensor([1, 2]) ** -2,
    lambda: Tensor.ones(2, 4).roll((1, 2)),
])
def test_invalid_operations_raise_runtime_error_as_in_pytorch(make):
    with pytest.raises(RuntimeError):
        make()


def test_a_padded_element_read_through_a_0d_index_is_the_pad_value():
    t = Tensor([5.0, 6.0]).pad(((1, 0),))
    assert t[0].item() == 0.0 and t[1].item() == 5.0
    assert Tensor([5.0]).pad(((0, 3),), value=2.0)[2].item() == 2.0
    assert Tensor([5.0]).pad(((1, 0),))[0].item() == 0.0  # a size-1 source: its view has stride 0


def test_int_ranges_and_weak_ints_beyond_int32():
    assert Tensor.arange(2 ** 31, 2 ** 31 + 3).dtype == dtypes.int64
    with pytest.raises(OverflowError):
        Tensor.arange(129, dtype=dtypes.int8)
    assert (Tensor([0], dtype="int") | 0xFFFFFFFF).item() == -1  # a weak int wraps, as in C and tinygrad
    with pytest.raises(IndexError):
        Tensor.ones(3).squeeze(2)
    with pytest.raises(IndexError):
        Tensor(1.0).cumsum(1)
