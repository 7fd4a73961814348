"""Kernel names say what a kernel computes (its main ops and the shape of its work), and a profile
shows each kernel's whole op list on hover: the Chrome trace's args, the HTML page's span details."""
from __future__ import annotations

import json

import numpy as np

import atensor
from atensor import Tensor
from atensor.profiler.html import page_data

RNG = np.random.default_rng(3)


def _kernel_names(fn) -> list[str]:
    with atensor.profile() as prof:
        fn().realize().wait()
    return [s.name for s in prof.spans if s.kind == "kernel"]


def test_a_fused_matmul_relu_sum_a_matmul_and_a_sum_have_names_that_tell_them_apart():
    a = Tensor(RNG.standard_normal((32, 16)).astype(np.float32))
    b = Tensor(RNG.standard_normal((16, 8)).astype(np.float32))
    Tensor.realize(a, b).wait()
    assert _kernel_names(lambda: (a @ b).relu().sum()) == ["matmul_relu_sum 32x8x16"]  # M x N x K
    assert _kernel_names(lambda: a @ b) == ["matmul 32x8x16"]
    assert _kernel_names(lambda: a.sum()) == ["sum 32x16"]
    assert _kernel_names(lambda: a.max(axis=0)) == ["max 32x16"]
    assert _kernel_names(lambda: (a * 2 + 1).exp()) == ["mul_add_exp 32x16"]  # the output's shape
    assert _kernel_names(lambda: a.softmax()) == ["max_sub_exp_sum+1 32x16"]  # at most four ops named


def test_a_profile_shows_each_kernels_op_list_in_the_trace_args_and_the_html_details(tmp_path):
    a = Tensor(RNG.standard_normal((32, 16)).astype(np.float32))
    b = Tensor(RNG.standard_normal((16, 8)).astype(np.float32))
    Tensor.realize(a, b).wait()
    with atensor.profile() as prof:
        (a @ b).relu().sum().realize().wait()
    want = "matmul over 32x8x16 -> 32x8x1; relu 32x8; sum over 32x8 -> 1x1"
    trace = tmp_path / "trace.json"
    prof.export(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    [kernel] = [e for e in events if e.get("ph") == "X" and e["name"] == "matmul_relu_sum 32x8x16"]
    assert kernel["args"]["ops"] == want
    assert atensor.profiler.Profile.load(str(trace)).timeline().kernel_ops == {kernel["name"]: want}
    spans = page_data(prof.timeline())["spans"]
    assert [s[11] for s in spans if s[3] == kernel["name"]] == [want]  # the hover's "ops" row


def test_a_convolution_is_named_by_its_sliding_axes_and_a_matmul_stays_a_matmul():
    x = Tensor(RNG.standard_normal((2, 3, 8, 8)).astype(np.float32))
    w = Tensor(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))
    x1 = Tensor(RNG.standard_normal((2, 3, 16)).astype(np.float32))
    w1 = Tensor(RNG.standard_normal((4, 3, 5)).astype(np.float32))
    w_1x1 = Tensor(RNG.standard_normal((4, 3, 1, 1)).astype(np.float32))
    up = Tensor(RNG.standard_normal((2, 4, 8, 8)).astype(np.float32))
    Tensor.realize(x, w, x1, w1, w_1x1, up).wait()
    # the work's shape: batch x groups x out channels x in channels x kernel x output positions
    assert _kernel_names(lambda: x.conv2d(w, padding=1)) == ["conv2d 2x1x4x3x3x3x8x8"]
    assert _kernel_names(lambda: x.conv2d(w, stride=2)) == ["conv2d 2x1x4x3x3x3x3x3"]
    assert _kernel_names(lambda: x.conv2d(w, dilation=2, padding=2).relu().sum()) == ["conv2d_relu_sum 2x1x4x3x3x3x8x8"]
    assert _kernel_names(lambda: x1.conv2d(w1)) == ["conv1d 2x1x4x3x5x12"]
    assert _kernel_names(lambda: x.conv2d(w_1x1)) == ["matmul 2x1x4x3x1x1x8x8"]  # no window slides: a matmul
    b = Tensor(RNG.standard_normal((2, 8, 8)).astype(np.float32))
    assert _kernel_names(lambda: x.reshape(2, 24, 8) @ b) == ["matmul 2x24x8x8"]
    xg = Tensor(x.numpy(), requires_grad=True)
    wg = Tensor(w.numpy(), requires_grad=True)

    (xg.conv2d(wg, padding=1) * up).sum().backward()
    # the weight's gradient sums the input's windows times the output's gradient: a convolution too;
    # the input's is a matmul over the output channels, its windows summed back onto the padded grid
    assert _kernel_names(lambda: wg.grad) == ["conv2d 2x1x4x3x3x3x8x8"]
    with atensor.profile() as prof:
        xg.grad.realize().wait()
    [kernel] = [s for s in prof.spans if s.kind == "kernel"]
    assert kernel.name == "matmul_fold 2x1x4x3x3x3x8x8"
    assert prof.timeline().kernel_ops[kernel.name].endswith("fold of 9 windows of 2x1x1x3x3x3x8x8 -> 2x3x10x10")
