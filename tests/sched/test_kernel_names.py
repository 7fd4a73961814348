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
