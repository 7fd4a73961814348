"""Tensor ops on an OpenCL device give the CPU backend's values, forward and backward: kernels rendered
to OpenCL C (backend/gpu/render.py) from the same ASTs the CPU runs. Each case computes the same
function of the same inputs on CPU and on CL and compares the results."""
from __future__ import annotations

import numpy as np

from atensor import Tensor
from atensor.backend.gpu.dialect import OPENCL
from atensor.backend.gpu.render import render_gpu

RNG = np.random.default_rng(0)


def both(fn, *arrays, rtol=1e-5, atol=1e-5, grads=False):
    """fn on CPU tensors and on CL tensors made of `arrays`; asserts equal values (and input gradients)."""
    results = []
    for device in ("CPU", "CL"):
        inputs = [Tensor(a, device=device, requires_grad=grads and a.dtype.kind == "f") for a in arrays]
        out = fn(*inputs)
        assert out.device == f"{device}:0"
        if grads:  # before the values are read: reading realizes `out` apart from its graph
            out.sum().backward()
        values = [out.numpy()] + [t.grad.numpy() for t in inputs if grads and t.requires_grad]
        results.append(values)
    for cpu, cl in zip(*results):
        np.testing.assert_allclose(cl, cpu, rtol=rtol, atol=atol)
    return results[1][0]


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_a_fused_elementwise_chain_with_broadcasts_and_casts_matches_cpu():
    a, b = f32(7, 33), f32(1, 33)
    both(lambda x, y: ((x * y + 1).exp().log() - y.abs().sqrt()).maximum(x).cast("float32") / (y * y + 1),
         a, b)
    ints = RNG.integers(-50, 50, (5, 9)).astype(np.int32)
    divs = RNG.integers(1, 7, (5, 9)).astype(np.int32) * np.where(RNG.random((5, 9)) < 0.5, -1, 1).astype(np.int32)
    both(lambda x, y: (x // y) * 3 + x % y - (x < y).cast("int32"), ints, divs, atol=0)


def test_the_helpers_shared_with_the_c_prelude_give_numpys_values_on_cl():
    from atensor.backend.c.helpers import DOUBLE_HELPERS, SEMANTIC_HELPERS
    from atensor.backend.c.prelude import PRELUDE
    assert SEMANTIC_HELPERS in PRELUDE and DOUBLE_HELPERS in PRELUDE  # one text, both preludes
    assert SEMANTIC_HELPERS.lstrip("\n") in OPENCL.prelude and DOUBLE_HELPERS.lstrip("\n") in OPENCL.prelude
    ints = np.array([-7, 7, -7, 7, 0, 5, -5, 9], np.int32)
    divs = np.array([2, -2, -2, 0, 3, -1, -1, 0], np.int32)  # by 0: 0 (numpy's value, its warning aside)
    x, y = Tensor(ints, device="CL"), Tensor(divs, device="CL")
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal((x // y).numpy(), np.floor_divide(ints, divs))
        np.testing.assert_array_equal((x % y).numpy(), np.remainder(ints, divs))
    for dtype in (np.float32, np.float64):  # the divisor's sign, a signed zero, nan by 0; nan-propagating max
        a = np.array([5.5, -5.5, 5.5, -5.5, 4.0, -4.0, 1.0, np.nan], dtype)
        b = np.array([2.0, 2.0, -2.0, -2.0, -2.0, 2.0, 0.0, 1.0], dtype)
        got_mod = (Tensor(a, device="CL") % Tensor(b, device="CL")).numpy()
        got_max = Tensor(a, device="CL").maximum(Tensor(b, device="CL")).numpy()
        with np.errstate(invalid="ignore"):
            want = np.remainder(a, b)
        np.testing.assert_array_equal(got_mod, want)
        signed = ~np.isnan(want)  # a zero's sign is the divisor's (a nan's sign means nothing)
        np.testing.assert_array_equal(np.signbit(got_mod[signed]), np.signbit(want[signed]))
        np.testing.assert_array_equal(got_max, np.maximum(a, b))


def test_tanh_saturates_to_one_on_cl_as_libm_does_and_gelus_gradient_is_one_far_out():
    x = np.array([0.5, -3.0, 10.0, 100.0, -1e4, np.inf, -np.inf, np.nan], np.float32)
    got = Tensor(x, device="CL").tanh().numpy()
    np.testing.assert_allclose(got[:2], np.tanh(x[:2]), rtol=1e-6)
    np.testing.assert_array_equal(got[2:], [1, 1, -1, 1, -1, np.nan])  # exactly +-1 far out; pocl's: 1 - 2^-24
    far = Tensor(np.full(8, 350.0, np.float32), device="CL", requires_grad=True)
    far.gelu().sum().backward()  # 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx ~ 1.3e4 here
    np.testing.assert_allclose(far.grad.numpy(), np.ones(8, np.float32))


def test_reductions_short_rows_long_rows_and_every_axis_match_cpu():
    a = f32(6, 5, 4)
    for axis in (1, (0, 2)):  # inner and outer axes
        both(lambda x: x.sum(axis=axis), a)
    for axis in (0, None):
        both(lambda x: x.max(axis=axis), a)
    long = f32(3, 40000)  # rows long and few: a work-group per row, combined in shared memory
    both(lambda x: x.sum(axis=1), long, rtol=1e-4, atol=1e-3)
    both(lambda x: x.max(axis=1), long)
    both(lambda x: (x * x).mean(), long, rtol=1e-4)
    ints = RNG.integers(-9, 9, (4, 3000)).astype(np.int32)
    both(lambda x: x.sum(axis=1), ints, atol=0)


def test_matmuls_small_tiled_batched_and_transposed_match_cpu():
    both(lambda x, y: x @ y, f32(3, 5), f32(5, 2))
    both(lambda x, y: x @ y, f32(70, 130), f32(130, 45), rtol=1e-4, atol=1e-4)  # tiled, ragged edges
    both(lambda x, y: x @ y.transpose(-1, -2), f32(2, 33, 40), f32(2, 17, 40), rtol=1e-4, atol=1e-4)
    both(lambda x, y: (x @ y).relu().sum(axis=0), f32(64, 64), f32(64, 64), rtol=1e-4, atol=1e-3)


def test_conv2d_forward_and_backward_and_pooling_match_cpu():
    img, w, b = f32(2, 3, 10, 10), f32(4, 3, 3, 3), f32(4)
    both(lambda x, k, c: x.conv2d(k, c, padding=1).relu(), img, w, b, rtol=1e-4, atol=1e-4, grads=True)
    # pooling forward only: max_pool2d's backward is 67 more kernels to compile cold (~1 min on pocl)
    both(lambda x: x.max_pool2d() + x.avg_pool2d(), img)


def test_indexing_gather_slices_and_flips_match_cpu():
    a = f32(8, 6)
    idx = np.array([[0, 5, 2], [1, 1, 0], [3, 4, 5], [2, 2, 2], [0, 0, 1], [5, 4, 3], [1, 2, 3], [4, 4, 4]],
                   dtype=np.int32)
    both(lambda x, i: x.gather(1, i), a, idx)
    both(lambda x: x[2:7:2, ::-1] * 2 + x[1:4, :].sum(), a)
    both(lambda x: x.pad(((1, 2), (0, 3))).flip(0), a)


def test_ops_the_renderer_does_not_lower_run_on_the_host_as_commands_of_the_cl_queue():
    draws = Tensor.rand(64, 32, device="CL").numpy()  # threefry: the CPU backend's kernel, on host copies
    assert draws.min() >= 0 and draws.max() < 1 and draws.std() > 0.2
    x = np.arange(10, dtype=np.float32)
    idx = np.array([1, 1, 3, 9], np.int32)
    both(lambda t, i: t[i] * t[i], x, idx, grads=True)  # the gather's gradient is a scatter-add
    both(lambda t: t.cast("float16").cast("float32") * 3, x)


def test_gradients_of_elementwise_reduce_and_matmul_match_cpu():
    both(lambda x, y: ((x @ y).tanh() * x.sum(axis=1, keepdim=True)).softmax(-1), f32(9, 12), f32(12, 9),
         rtol=1e-4, atol=1e-5, grads=True)


def test_a_small_training_step_on_cl_follows_the_cpu_one():
    from atensor import nn
    xs, ys = f32(32, 10), RNG.integers(0, 3, 32).astype(np.int32)
    w1, w2 = f32(10, 16) * 0.3, f32(16, 3) * 0.3
    losses = {}
    for device in ("CPU", "CL"):
        p1, p2 = Tensor(w1, device=device, requires_grad=True), Tensor(w2, device=device, requires_grad=True)
        opt = nn.optim.SGD([p1, p2], lr=0.5)
        x, y = Tensor(xs, device=device), Tensor(ys, device=device)
        seen = []
        for _ in range(3):
            opt.zero_grad()
            loss = (x @ p1).relu().__matmul__(p2).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            seen.append(loss.item())
        losses[device] = (seen, p1.numpy(), p2.numpy())
    np.testing.assert_allclose(losses["CL"][0], losses["CPU"][0], rtol=1e-4)
    assert losses["CL"][0][-1] < losses["CL"][0][0]
    for cpu, cl in zip(losses["CPU"][1:], losses["CL"][1:]):
        np.testing.assert_allclose(cl, cpu, rtol=1e-4, atol=1e-5)


def test_the_renderer_keeps_the_dialect_apart_and_uses_shared_memory_for_tiles_and_long_rows():
    from dataclasses import replace
    from atensor.engine import lower_cl
    lower_cl._rendered.clear()
    x = Tensor(f32(64, 64), device="CL")
    (x @ x).numpy()
    (ast, name, fp64), program = next(iter(lower_cl._rendered.items()))
    assert "__local" in program.source and "barrier(CLK_LOCAL_MEM_FENCE)" in program.source
    assert program.kernels[0].local_size == 256  # one 16 x 16 tile per work-group (then the store)
    assert all(k.global_size % k.local_size == 0 for k in program.kernels)
    cuda_like = replace(OPENCL, kernel='extern "C" __global__ void', global_space="", local_space="__shared__",
                        barrier="__syncthreads();", prelude="")
    other = render_gpu(ast, name, cuda_like, fp64)
    assert "__shared__" in other.source and "__syncthreads();" in other.source
    assert "__local " not in other.source and "__global " not in other.source
    # the same launches, spelled in another language
    assert [(k.global_size, k.local_size) for k in other.kernels] == \
        [(k.global_size, k.local_size) for k in program.kernels]
