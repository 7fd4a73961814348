"""conv2d, max_pool2d and avg_pool2d against PyTorch CPU (numpy has no convolution)."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

torch = pytest.importorskip("torch", reason="PyTorch (a test-only dependency) is not installed: "
                                                "pip install torch")
F = torch.nn.functional
RNG = np.random.default_rng(11)


@pytest.mark.parametrize("groups, stride, padding, dilation, bias", [
    (1, 1, 0, 1, True), (1, 2, 1, 1, False), (2, 1, 2, 2, True), (4, (2, 1), (1, 0), (1, 2), True),
    (1, 3, (0, 2), 1, False),
])
def test_conv2d_matches_pytorch(groups, stride, padding, dilation, bias):
    x = RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 4 // groups, 3, 2)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32) if bias else None
    got = Tensor(x).conv2d(Tensor(w), Tensor(b) if bias else None, groups=groups, stride=stride,
                           padding=padding, dilation=dilation)
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b) if bias else None, stride=stride,
                   padding=padding, dilation=dilation, groups=groups)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_with_flat_asymmetric_padding_and_a_size_zero_batch():
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 2, 2)).astype(np.float32)
    got = Tensor(x).conv2d(Tensor(w), padding=(1, 0, 2, 1))  # (left, right, top, bottom)
    ref = F.conv2d(F.pad(torch.tensor(x), (1, 0, 2, 1)), torch.tensor(w))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    empty = Tensor(np.zeros((0, 2, 5, 5), dtype=np.float32)).conv2d(Tensor(w))
    assert empty.numpy().shape == (0, 3, 4, 4)


@pytest.mark.parametrize("kernel, stride, padding, dilation", [
    (2, None, 0, 1), (3, 1, 1, 1), ((3, 2), (2, 1), (1, 0), 1), (2, 2, 1, 2),
])
def test_pooling_matches_pytorch(kernel, stride, padding, dilation):
    x = RNG.standard_normal((2, 3, 8, 7)).astype(np.float32)
    tx = torch.tensor(x)
    got = Tensor(x).max_pool2d(kernel, stride, dilation=dilation, padding=padding)
    ref = F.max_pool2d(tx, kernel, stride, padding=padding, dilation=dilation)
    np.testing.assert_allclose(got.numpy(), ref.numpy())
    if dilation == 1:
        for include in (True, False):
            got = Tensor(x).avg_pool2d(kernel, stride, padding=padding, count_include_pad=include)
            ref = F.avg_pool2d(tx, kernel, stride, padding=padding, count_include_pad=include)
            np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


# ---- the bench's layers (bench/conv.py) at a small batch: values and both gradients ----------------------
@pytest.mark.parametrize("x_shape, w_shape, kw", [
    ((2, 32, 24, 24), (32, 32, 5, 5), {}),                        # MNIST-sized: chunked per sample
    ((1, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}),            # ResNet-sized: chunked along channels
    ((2, 16, 20, 20), (32, 8, 3, 3), {"groups": 2, "stride": 2, "padding": 1, "dilation": 2}),
    ((2, 8, 12, 10, 9), (6, 8, 3, 2, 3), {"padding": (1, 0, 1), "stride": (2, 1, 1)}),
])
def test_conv_forward_and_gradients_match_pytorch_on_the_bench_layers(x_shape, w_shape, kw):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    tx, tw = Tensor(x), Tensor(w)
    out = tx.conv2d(tw, **kw)
    g = RNG.standard_normal(out.shape).astype(np.float32)
    gx, gw = out.gradient(tx, tw, gradient=Tensor(g))
    out.realize(gx, gw)
    px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = (F.conv2d if len(x_shape) == 4 else F.conv3d)(px, pw, **kw)
    ref.backward(torch.tensor(g))
    for got, want in ((out, ref), (gx, px.grad), (gw, pw.grad)):
        want = want.detach().numpy()
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


# ---- convolutions whose forward runs as a small copy and a gemm per outer kernel offset (backend/gemm/window.py) ---
@pytest.mark.parametrize("x_shape, w_shape, kw", [
    ((8, 32, 24, 24), (16, 32, 3, 3), {"padding": 1}),
    ((8, 32, 22, 20), (8, 32, 3, 3), {"dilation": (2, 1), "bias": True}),
    ((1, 64, 32, 32), (16, 64, 3, 3), {"padding": 1}),          # one sample: one chain of gemms
    ((8, 128, 200), (16, 128, 5), {"stride": 1}),                 # 1-D: the copy is the input itself
    ((4, 16, 10, 10, 10), (8, 16, 3, 3, 3), {"padding": (1, 0, 1)}),  # 3-D: a gemm per depth offset
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_conv_forward_by_window_gemms_and_its_gradients_match_pytorch(monkeypatch, x_shape, w_shape, kw, dtype):
    from atensor.backend.gemm.window import WindowGemm
    calls = []
    run = WindowGemm.__call__
    monkeypatch.setattr(WindowGemm, "__call__", lambda self, x, y: calls.append(1) or run(self, x, y))
    kw = dict(kw)
    bias = RNG.standard_normal(w_shape[0]).astype(dtype) if kw.pop("bias", False) else None
    x = RNG.standard_normal(x_shape).astype(dtype)
    w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    tx, tw = Tensor(x), Tensor(w)
    out = tx.conv2d(tw, Tensor(bias) if bias is not None else None, **kw)
    g = RNG.standard_normal(out.shape).astype(dtype)
    gx, gw = out.gradient(tx, tw, gradient=Tensor(g))
    out.realize(gx, gw)
    px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(x_shape)]
    ref = conv(px, pw, torch.tensor(bias) if bias is not None else None, **kw)
    ref.backward(torch.tensor(g))
    tol = 1e-4 if dtype == np.float32 else 1e-9
    for got, want in ((out, ref), (gx, px.grad), (gw, pw.grad)):
        want = want.detach().numpy()
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol * float(np.abs(want).max()))
    # after the reads, which wait for the realize: it runs on the queues, and a fresh compile cache
    # (CI's) makes its first kernel late enough for an earlier check to see no call yet
    assert calls, "the forward did not run as window gemms"


def test_a_window_gemm_forward_reads_a_permuted_weight_and_a_sliced_input(monkeypatch):
    from atensor.backend.gemm.window import WindowGemm
    calls = []
    run = WindowGemm.__call__
    monkeypatch.setattr(WindowGemm, "__call__", lambda self, x, y: calls.append(1) or run(self, x, y))
    x = RNG.standard_normal((10, 32, 26, 24)).astype(np.float32)
    w = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32)  # stored (in, out, kh, kw)
    got = Tensor(x)[1:9, :, 1:25].conv2d(Tensor(w).permute(1, 0, 2, 3), padding=1)
    ref = F.conv2d(torch.tensor(x)[1:9, :, 1:25], torch.tensor(w).permute(1, 0, 2, 3), padding=1)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    assert calls
