"""backend/gemm/conv_c.py: convolutions' contractions lowered to loops of gemms inside native C kernels.

Forward, input gradient and weight gradient (and the bias's) against PyTorch over strides, paddings,
dilations, groups and channel counts, with every kernel compiled to C (`native="all"`); the lowerings
are counted, so a test fails if the path it is about was not taken. A jitted step checks that the
replays (native programs) give the same values.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import atensor
from atensor import Tensor
from atensor.backend.gemm import conv_c
from atensor.backend.c import compiler

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler: no native kernels")


@pytest.fixture
def taken(monkeypatch):
    """How often each lowering of backend/gemm/conv_c.py emitted a kernel during the test."""
    counts = {"taps": 0, "looped": 0}
    for name, key in (("_taps", "taps"), ("_looped", "looped")):
        real = getattr(conv_c, name)

        def spy(*args, _real=real, _key=key):
            done = _real(*args)
            counts[_key] += bool(done)
            return done
        monkeypatch.setattr(conv_c, name, spy)
    return counts


def _check(n, cin, cout, size, k, stride=1, padding=0, dilation=1, groups=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, size, size + 1), dtype=np.float32)
    w = rng.standard_normal((cout, cin // groups, k, k), dtype=np.float32)
    b = rng.standard_normal((cout,), dtype=np.float32)
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=padding, dilation=dilation,
                                    groups=groups).relu()
    up = rng.standard_normal(tuple(ty.shape), dtype=np.float32)
    (ty * torch.tensor(up)).sum().backward()
    with atensor.Context(native="all"):
        ax, aw, ab = (Tensor(v, requires_grad=True) for v in (x, w, b))
        ay = ax.conv2d(aw, ab, stride=stride, padding=padding, dilation=dilation, groups=groups).relu()
        (ay * Tensor(up)).sum().backward()
        Tensor.realize(ay, ax.grad, aw.grad, ab.grad)
    for name, got, ref in (("y", ay, ty), ("dx", ax.grad, tx.grad), ("dw", aw.grad, tw.grad),
                           ("db", ab.grad, tb.grad)):
        ref = ref.detach().numpy()
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4 * (np.abs(ref).max() + 1), err_msg=name)


@pytest.mark.parametrize("shape,tapped", [
    ((2, 8, 16, 12, 5, 1, 2), True),         # padding: taps over the kernel rows, forward and weight gradient
    ((2, 8, 12, 12, 3, 1, 1, 2, 2), True),   # dilation, groups (a batch axis of the gemms)
    ((2, 8, 8, 13, 3, 2, 1), False),         # stride 2, gemms too small for taps: numpy's kernels
])
def test_conv_matches_torch(shape, tapped, taken):
    _check(*shape)
    assert (taken["taps"] > 0) == tapped, f"taps taken {taken['taps']} times"


@settings(max_examples=2, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(6, 11), st.integers(1, 4),
       st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.sampled_from([1, 2]))
def test_conv_any_shape_matches_torch(n, cin, cout, size, k, stride, padding, dilation, groups):
    if (size + 2 * padding - dilation * (k - 1) - 1) < 0:
        return  # the kernel does not fit
    _check(n, cin * groups * 2, cout * groups * 2, size, k, stride, padding, dilation, groups)


def test_rows_that_do_not_merge_run_as_loops(taken):
    """x.permute(0, 2, 1) @ w: the rows (n, h) do not merge; the samples' axis becomes a loop."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 64, 32), dtype=np.float32), rng.standard_normal((64, 16), dtype=np.float32)
    with atensor.Context(native="all"):
        got = (Tensor(x).permute(0, 2, 1) @ Tensor(w)).numpy()
    np.testing.assert_allclose(got, x.transpose(0, 2, 1) @ w, rtol=1e-5, atol=1e-4)
    assert taken["looped"] > 0


def test_jitted_conv_step_replays_match_torch():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 8, 12, 12), dtype=np.float32)
    w0 = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    w = Tensor(w0, requires_grad=True)

    @atensor.jit
    def step(x: Tensor) -> list[Tensor]:
        loss = x.conv2d(w, padding=1).relu().sum()
        loss.backward()
        return [loss, w.grad]
    for _ in range(4):  # run, capture, compile, then replay
        w.grad = None
        loss, grad = step(Tensor(x))
    tw = torch.tensor(w0, requires_grad=True)
    ref = torch.nn.functional.conv2d(torch.tensor(x), tw, padding=1).relu().sum()
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-4)
    np.testing.assert_allclose(grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_col2im_under_max_pool_backward_is_its_own_kernel(monkeypatch):
    """conv -> max_pool -> conv: the second convolution's input gradient (col2im) is padded again by
    max-pool's backward; the scheduler makes it a kernel of its own (sched/schedule.py `_pads_col2im`)."""
    from atensor.sched import schedule
    hits = []
    real = schedule._pads_col2im
    monkeypatch.setattr(schedule, "_pads_col2im", lambda node: hits.append(real(node)) or hits[-1])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 12, 12), dtype=np.float32)
    w1, w2 = rng.standard_normal((8, 4, 3, 3), dtype=np.float32), rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    tx, tw1, tw2 = (torch.tensor(v, requires_grad=True) for v in (x, w1, w2))
    tl = torch.nn.functional.conv2d(torch.nn.functional.max_pool2d(
        torch.nn.functional.conv2d(tx, tw1).relu(), 2), tw2).square().sum()
    tl.backward()
    ax, aw1, aw2 = (Tensor(v, requires_grad=True) for v in (x, w1, w2))
    loss = ax.conv2d(aw1).relu().max_pool2d().conv2d(aw2).square().sum()
    loss.backward()
    Tensor.realize(loss, ax.grad, aw1.grad).wait()
    np.testing.assert_allclose(loss.item(), tl.item(), rtol=1e-4)
    for got, ref in ((ax.grad, tx.grad), (aw1.grad, tw1.grad)):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-3 * np.abs(ref.numpy()).max())
    assert any(hits), "the col2im under max-pool's backward was fused"
