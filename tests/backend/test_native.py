"""The native tier (backend/c/registry.py, backend/c/render.py): kernels compiled to C give numpy's values.

Each test runs with `native="all"`, so every kernel it realizes is rendered to C and compiled. The
autouse fixture holds each test to that: every kernel the executor looked up must have been a
compiled one (so it ran in C, not on numpy), except in the tests listed in `FALLS_BACK_TO_NUMPY`,
which are about the fallback; and each test must have run at least one C kernel. Without a C
compiler the module is skipped, saying so."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
import trio
from hypothesis import given, strategies as st

import atensor
from atensor import Tensor, dtypes, nn
from atensor.nn import optim
from atensor.backend.c import compiler, registry
from atensor.backend.gemm import openblas
from atensor.backend.c import flags as c_flags
from atensor.graph.node import Node
from atensor.graph.symbolic import Variable

from tests.tensor import test_ops

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler ($CC, cc, gcc or clang) "
                                "on PATH: the native tier is off and every kernel runs on numpy")

# tests about kernels that stay on numpy (refused by the renderer, or a compile error)
FALLS_BACK_TO_NUMPY = {"test_unsupported_kernels_fall_back_to_numpy",
                       "test_renderer_refuses_what_it_does_not_lower",
                       "test_a_compile_error_leaves_the_kernels_on_numpy"}
# tests that run some kernels on numpy on purpose (default mode "jit": eager kernels stay on numpy)
SOME_ON_NUMPY = {"test_jitted_training_step_runs_native_kernels_and_matches_numpy_kernels"}


@pytest.fixture(autouse=True)
def every_kernel_native(request, monkeypatch):
    """native="all", and afterwards: the kernels this test ran were compiled C kernels."""
    looked: dict[Node, bool] = {}   # kernel AST -> whether its latest lookup found a compiled kernel
    real = registry.lookup

    def lookup(ast: Node):
        found = real(ast)
        looked[ast] = found is not None
        return found
    monkeypatch.setattr(registry, "lookup", lookup)
    with atensor.Context(native="all"):
        yield looked
    name = request.node.originalname
    if name not in FALLS_BACK_TO_NUMPY:
        assert any(looked.values()), f"no C kernel ran in this test: {registry.status()}"
    if name not in FALLS_BACK_TO_NUMPY | SOME_ON_NUMPY:
        on_numpy = [registry.FAILURES.refused.get(ast, "not compiled") for ast, ok in looked.items() if not ok]
        assert not on_numpy, f"{len(on_numpy)} kernels ran on numpy, not in C: {on_numpy[:3]}"


def _native_count() -> int:
    return registry.status()["native"]  # type: ignore[return-value]


def test_property_op_chains_match_numpy():
    before = _native_count()
    test_ops.test_random_op_chains_match_numpy()
    assert _native_count() > before


def test_property_broadcasting_binary_ops_match_numpy():
    test_ops.test_random_broadcasting_binary_ops_match_numpy()


def test_property_matmuls_match_numpy():
    test_ops.test_random_matmuls_match_numpy()


@given(b=st.integers(1, 3), m=st.integers(1, 7), k=st.integers(1, 7), n=st.integers(1, 7),
       transpose_a=st.booleans(), transpose_b=st.booleans(), seed=st.integers(0, 2**16))
def test_property_batched_transposed_matmuls_are_gemms_matching_numpy(b, m, k, n, transpose_a, transpose_b, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((b, k, m) if transpose_a else (b, m, k)).astype(np.float32)
    w = rng.standard_normal((b, n, k) if transpose_b else (b, k, n)).astype(np.float32)
    ta, tw = Tensor(a), Tensor(w)
    ta = ta.transpose(1, 2) if transpose_a else ta
    tw = tw.transpose(1, 2) if transpose_b else tw
    ra = a.transpose(0, 2, 1) if transpose_a else a
    rw = w.transpose(0, 2, 1) if transpose_b else w
    np.testing.assert_allclose((ta @ tw).exp().numpy(), np.exp(ra @ rw), rtol=1e-4, atol=1e-5)


def test_integer_semantics_follow_numpy():
    a = np.array([-7, -6, -1, 0, 1, 5, 7, np.iinfo(np.int32).min], dtype=np.int32)
    b = np.array([2, -4, 3, 5, 0, -1, -3, -1], dtype=np.int32)
    ta, tb = Tensor(a), Tensor(b)
    with np.errstate(all="ignore"):
        assert (ta // tb).tolist() == np.floor_divide(a, b).tolist()
        assert (ta % tb).tolist() == np.remainder(a, b).tolist()
    assert (ta * tb + 3).tolist() == (a * b + 3).tolist()
    assert (-ta).tolist() == np.negative(a).tolist()
    assert ta.maximum(tb).tolist() == np.maximum(a, b).tolist()
    assert ((ta & 6) ^ (tb | 1)).tolist() == ((a & 6) ^ (b | 1)).tolist()
    assert ta.sum().item() == int(a.astype(np.int64).sum().astype(np.int32))
    u = np.array([0, 1, 200, 255], dtype=np.uint8)
    assert (Tensor(u) + 100).tolist() == (u + np.uint8(100)).tolist()


def test_float_semantics_nan_inf_and_modulo():
    a = np.array([np.nan, 1.0, -np.inf, 3.0, -2.5, 0.0], dtype=np.float32)
    b = np.array([1.0, np.nan, 2.0, -np.inf, 0.75, -1.0], dtype=np.float32)
    ta, tb = Tensor(a), Tensor(b)
    np.testing.assert_array_equal(ta.maximum(tb).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal(ta.max().numpy(), np.max(a))
    with np.errstate(all="ignore"):
        np.testing.assert_allclose((ta % tb).numpy(), np.remainder(a, b), equal_nan=True)
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal((ta != ta).numpy(), a != a)
    np.testing.assert_array_equal(ta.cast(dtypes.bool).numpy(), a.astype(bool))


def test_casts_reductions_and_bools():
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32) * 10
    t = Tensor(x)
    assert t.cast(dtypes.int32).tolist() == x.astype(np.int32).tolist()
    np.testing.assert_allclose(t.cast(dtypes.float64).sum(0).numpy(), x.astype(np.float64).sum(0), rtol=1e-12)
    assert (t > 0).any(1).tolist() == (x > 0).any(1).tolist()
    assert (t > -30).all(0).tolist() == (x > -30).all(0).tolist()
    np.testing.assert_allclose(t.max(0).numpy(), x.max(0))
    np.testing.assert_allclose(t.min(1).numpy(), x.min(1))
    np.testing.assert_allclose(t.prod(1).numpy(), x.prod(1), rtol=1e-5)
    assert t.argmax(1).tolist() == x.argmax(1).tolist()
    np.testing.assert_allclose(Tensor.arange(3, 40, 3).numpy(), np.arange(3, 40, 3))


def test_views_pads_flips_and_middle_axis_reductions():
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    t = Tensor(x)
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.flip(2).permute(2, 0, 1).numpy(), np.flip(x, 2).transpose(2, 0, 1))
    np.testing.assert_allclose(t.pad(((0, 0), (1, 2), (2, 0))).sum(2).numpy(),
                               np.pad(x, ((0, 0), (1, 2), (2, 0))).sum(2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose((t[:, ::2, 1:4] * 2).numpy(), x[:, ::2, 1:4] * 2)
    np.testing.assert_allclose(t.softmax(-1).numpy(), np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(Tensor.cat(t, t * 2, dim=1).numpy(), np.concatenate([x, x * 2], 1))


def test_zero_size_tensors():
    x = np.zeros((0, 3), dtype=np.float32)
    assert Tensor(x).sum(0).tolist() == [0.0, 0.0, 0.0]
    assert (Tensor(x) + 1).numpy().shape == (0, 3)


def test_gather_reads_in_range_indices_and_zero_outside():
    src = np.arange(10, dtype=np.float32)
    idx = np.array([3, 1, 9, 0], dtype=np.int32)
    assert Tensor(src).gather(0, Tensor(idx)).tolist() == src[idx].tolist()
    table = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    rows = np.array([[6, 0], [2, 2]], dtype=np.int32)
    np.testing.assert_allclose((Tensor(table)[Tensor(rows)] * 2).numpy(), table[rows] * 2)
    assert not any("GATHER" in why for why in registry.status()["refused"])


def test_unsupported_kernels_fall_back_to_numpy():
    base = Tensor(np.zeros(5, dtype=np.float32))
    got = base.scatter(0, Tensor(np.array([1, 3], dtype=np.int32)), Tensor(np.array([2.0, 4.0], dtype=np.float32)))
    assert got.tolist() == [0.0, 2.0, 0.0, 4.0, 0.0]
    refused = registry.status()["refused"]
    assert any("SCATTER" in why for why in refused), refused


def test_renderer_refuses_what_it_does_not_lower():
    t = Tensor(np.arange(4, dtype=np.float16)) + 1
    assert t.tolist() == [1.0, 2.0, 3.0, 4.0]  # on numpy
    assert any("float16" in why for why in registry.status()["refused"])


async def test_jitted_training_step_runs_native_kernels_and_matches_numpy_kernels():
    """The flagship's step, jitted, on native kernels (default mode) and on numpy kernels: the same
    losses within float32 tolerance."""
    rng = np.random.default_rng(0)
    x_np = rng.random((64, 16), dtype=np.float32)
    y_np = rng.integers(0, 4, size=64).astype(np.int32)

    async def train(mode: str) -> list[float]:
        with atensor.Context(native=mode):
            Tensor.manual_seed(3)
            net = [nn.Linear(16, 32), nn.Linear(32, 4)]
            params = nn.get_parameters(net)
            opt = optim.Adam(params, lr=1e-2, fused=True)

            @atensor.jit
            async def step(x: Tensor, y: Tensor) -> Tensor:
                loss = nn.cross_entropy(net[1](net[0](x).relu()), y)
                opt.zero_grad()
                loss.backward()
                await opt.step(loss)
                return loss
            losses = []
            with Tensor.train():
                for _ in range(8):
                    losses.append((await step(Tensor(x_np), Tensor(y_np))).item())
            return losses

    before = _native_count()
    native_losses = await train("jit")
    assert _native_count() > before
    numpy_losses = await train("0")
    np.testing.assert_allclose(native_losses, numpy_losses, rtol=1e-4)
    assert native_losses[-1] < native_losses[0]


async def test_native_kernels_leave_the_event_loop_free():
    """A long native kernel (one foreign call) runs without the GIL: the loop keeps ticking."""
    x = Tensor(np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32))
    y = ((x * 1.5).exp().sin() + x.cos()).sum(1)
    async with atensor.profiler.ticking() as lag:
        await y.realize()
    await trio.sleep(0)
    assert lag.worst < 0.25, lag


def test_a_compile_error_leaves_the_kernels_on_numpy(monkeypatch):
    monkeypatch.setattr(c_flags, "FLAGS", c_flags.FLAGS + ("-fno-such-flag-atensor",))
    x = np.arange(7, dtype=np.float32)
    got = (Tensor(x) * 3 - 1).exp2().tolist()  # a kernel no other test makes
    np.testing.assert_allclose(got, np.exp2(x * 3 - 1), rtol=1e-6)
    status = registry.status()
    assert "compile failed" in status["last_error"] and "no-such-flag" in status["last_error"]


def test_a_kernel_is_compiled_once_and_its_library_reused_from_the_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    compiles = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a: (compiles.append(a), real(*a)))
    x = Tensor(np.ones((3, 11), dtype=np.float32))
    for _ in range(3):
        assert ((x + 2) * x).sum(1).tolist() == [33.0] * 3
    assert len(compiles) == 1 and len(list((tmp_path / "native").glob("*.so"))) == 1
    # a new process (here: a cleared registry) finds the library on disk and does not compile again
    monkeypatch.setattr(registry.REGISTRY, "kernels", {})
    monkeypatch.setattr(registry.REGISTRY, "by_code", {})
    assert ((x + 2) * x).sum(1).tolist() == [33.0] * 3
    assert len(compiles) == 1


def test_the_same_kernel_on_another_device_is_bound_to_the_compiled_function(monkeypatch, tmp_path):
    """Each device's copy of a data-parallel step's kernels differs from the others only in its buffers'
    and constants' device: compiled together (a jit's capture), that code is compiled once, and every
    device's kernel calls the one function."""
    from atensor.graph.node import BufferSpec
    from atensor.graph.ops import Ops
    from atensor.graph.view import View
    from atensor.sched.schedule import schedule
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    sources = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a: (sources.append(a[1]), real(*a)))
    data = np.arange(19, dtype=np.float32)
    # constants no other test uses: a kernel compiled earlier in the run would be found, not compiled here
    kernels, results = [], []
    for device in ("CPU:0", "CPU:1"):
        x = Tensor(data, device=device)
        node = ((x - 7.0625) * x * 3.1875).node
        out = BufferSpec(node.device, node.size, node.dtype)
        root = Node.make(Ops.ASSIGN, node.dtype, (out.node(0), node), View.create((19,)))
        kernels += [(t.work.ast, t.work.name) for t in schedule([root]).graph.tasks if hasattr(t.work, "ast")]
        results.append((x - 7.0625) * x * 3.1875)
    assert len(kernels) == 2 and kernels[0][0] != kernels[1][0]  # two ASTs (their constants' devices)
    assert registry.prepare(kernels) == 2
    first, second = (registry.lookup(ast) for ast, _ in kernels)
    assert first.address == second.address
    assert len(sources) == 1 and len(re.findall(r"void k\d+_\w+\(void", sources[0])) == 1
    for got in results:
        np.testing.assert_array_equal(got.numpy(), (data - np.float32(7.0625)) * data * np.float32(3.1875))


def test_a_large_kernel_is_compiled_with_the_large_flags_beside_the_others(monkeypatch, tmp_path):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    monkeypatch.setattr(c_flags, "LARGE_SOURCE", 1500)  # the prelude-less source of one small kernel is ~600
    flags = []
    real = compiler.compile_source
    monkeypatch.setattr(compiler, "compile_source", lambda *a: (flags.append(a[4]), real(*a)))
    data = np.linspace(-2, 2, 17, dtype=np.float32)
    x = Tensor(data)
    y = x
    for k in range(12):  # one long fused kernel
        y = (y * 0.5 + k).sin()
    want = data
    for k in range(12):
        want = np.sin(want * np.float32(0.5) + np.float32(k))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
    assert c_flags.LARGE_FLAGS in flags and c_flags.LARGE_FLAGS[0] == "-O2"


# ---- adversarial semantics: each test holds the C kernels to numpy itself ------------------------------
# (every distinct kernel costs one compile of ~0.1 s, so related checks share a kernel where they can)

def _same(t: Tensor, ref: np.ndarray) -> None:
    """Exact equality, dtype included (integers and bools; floats where the kernel does no arithmetic)."""
    got = t.numpy()
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
    np.testing.assert_array_equal(got, ref)


def _near(t: Tensor, ref: np.ndarray) -> None:
    got = t.numpy()
    assert got.shape == np.shape(ref), (got.shape, np.shape(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_float_to_integer_casts_truncate_and_wrap_negative_values_into_unsigned_types():
    """C leaves a negative float cast to an unsigned type undefined (AVX-512 saturates -129.0 to
    4294967295); numpy goes through a signed integer and wraps (4294967167): the C kernels must too."""
    x = np.array([-129.0, -2.5, -1.0, -0.5, -0.0, 0.7, 1.9, 127.9, 200.5, 300.0, 65535.0], dtype=np.float32)
    for dt in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
               dtypes.int64, dtypes.uint64, dtypes.bool):
        _same(Tensor(x).cast(dt), x.astype(dt.np))
    wide = np.array([-1e10, -3.0, 3e9, 1.8e19, np.nan], dtype=np.float64)
    _same(Tensor(wide).cast(dtypes.uint64)[:4], wide[:4].astype(np.uint64))
    _same(Tensor(wide).cast(dtypes.bool), wide.astype(bool))


def test_integer_and_bool_casts_narrow_widen_and_convert_exactly():
    ints = np.array([-2**31, -300, -129, -1, 0, 1, 127, 128, 255, 256, 70000, 2**31 - 1], dtype=np.int64)
    for dt in (dtypes.int8, dtypes.uint8, dtypes.uint32, dtypes.float32, dtypes.bool):
        _same(Tensor(ints).cast(dt), ints.astype(dt.np))
    flags = np.array([True, False, True])
    _same(Tensor(flags).cast(dtypes.float32) * 3 - 1, flags.astype(np.float32) * 3 - 1)
    big = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint32)
    _same(Tensor(big).cast(dtypes.float64), big.astype(np.float64))
    huge = np.array([0, 2**63, 2**64 - 1, 12345678901234567890], dtype=np.uint64)
    _same(Tensor(huge) + 2**63, huge + np.uint64(2**63))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.uint32, np.int64])
def test_integer_arithmetic_wraps_at_every_width(dtype):
    """uint16 * uint16 promotes to (signed) int in C, where 65535 * 65535 overflows: undefined."""
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, info.max, info.max // 2 + 3, 7, 0], dtype=dtype)
    b = np.array([info.max, info.max, info.min, 3, info.max, info.max], dtype=dtype)
    with np.errstate(over="ignore"):
        want = (a * b + (a - b) * np.array(3, dtype)) - (np.array(0, dtype) - a)
    _same(Tensor(a) * Tensor(b) + (Tensor(a) - Tensor(b)) * 3 - (-Tensor(a)), want)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int64, np.uint8, np.uint32])
def test_integer_floor_division_and_modulo_with_negative_and_zero_divisors(dtype):
    info = np.iinfo(dtype)
    a = np.array([-7, 7, -7, 7, 0, -1, 5, info.min, info.max, info.min], dtype=np.int64)
    b = np.array([2, -2, -2, 2, 0, 0, 3, -1, -1, 7], dtype=np.int64)
    a, b = a.astype(dtype), b.astype(dtype)  # unsigned: the negative ones wrap
    with np.errstate(all="ignore"):
        want = np.stack([np.floor_divide(a, b), np.remainder(a, b)])
    _same(Tensor.stack(Tensor(a) // Tensor(b), Tensor(a) % Tensor(b)), want)


def test_min_max_sum_reductions_over_non_adjacent_axes_with_nan_and_integer_extremes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[1, 2, 3] = np.nan
    x[0, 0, :] = np.nan
    _same(Tensor(x).max((0, 2)), x.max((0, 2)))
    _same(Tensor(x).min((0, 2), keepdim=True), x.min((0, 2), keepdims=True))
    i = rng.integers(-100, 100, (2, 3, 4, 5)).astype(np.int32)
    i[1, 1, 1, 1], i[0, 2, 3, 4] = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    _same(Tensor(i).max((1, 3)), i.max((1, 3)))
    _same(Tensor(i).min((0, 3), keepdim=True), i.min((0, 3), keepdims=True))
    big = (i.astype(np.int64) * 2**56).transpose(3, 1, 0, 2)
    _same(Tensor(i).cast(dtypes.int64).mul(2**56).permute(3, 1, 0, 2).sum((0, 3)), big.sum((0, 3)))
    u = rng.integers(0, 255, (4, 6)).astype(np.uint8)
    _same(Tensor(u).min(0), u.min(0))
    _near(Tensor(x).flip(1).sum((0, 2), keepdim=True), np.flip(x, 1).sum((0, 2), keepdims=True))


def test_prod_any_all_and_reductions_of_empty_axes():
    rng = np.random.default_rng(4)
    x = (rng.random((3, 4, 2)) + 0.5).astype(np.float32)
    _near(Tensor(x).prod((0, 2)), x.prod((0, 2)))
    flags = rng.random((3, 4, 5)) > 0.7
    _same(Tensor(flags).any((0, 2), keepdim=True), flags.any((0, 2), keepdims=True))
    _same(Tensor(flags).all(1), flags.all(1))
    empty = np.zeros((0, 3), dtype=np.float32)
    _same(Tensor(empty).max(0), np.full(3, -np.inf, dtype=np.float32))
    _same(Tensor(empty).prod(0), np.ones(3, dtype=np.float32))
    _same(Tensor(np.zeros((2, 0), bool)).any(1), np.zeros(2, bool))
    _same(Tensor(np.zeros((2, 0), bool)).all(1), np.ones(2, bool))
    _same(Tensor(np.zeros((2, 0), np.int32)).max(1), np.full(2, np.iinfo(np.int32).min, np.int32))
    _same((Tensor(x)[:, 2:2] * 2).sum(1), np.zeros((3, 2), np.float32))


def test_a_reduced_axis_that_both_gemm_operands_broadcast_multiplies_the_sum():
    """sum over (r, k) of a[i, k] * b[k] broadcast along r is r * (a @ b): not one gemm over k."""
    a = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(6).standard_normal((4, 2)).astype(np.float32)
    left = Tensor(a).reshape(3, 1, 4, 1).expand(3, 5, 4, 2)
    right = Tensor(b).reshape(1, 1, 4, 2).expand(3, 5, 4, 2)
    _near((left * right).sum((1, 2)), 5 * (a @ b))


def test_matmuls_of_flipped_padded_strided_broadcast_and_float64_operands():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = rng.standard_normal((6, 5)).astype(np.float32)
    _near(Tensor(x).flip((0, 1)) @ Tensor(y).flip(0), x[::-1, ::-1] @ y[::-1])
    _near(Tensor(x[:, :4]).pad(((1, 0), (1, 1))) @ Tensor(y), np.pad(x[:, :4], ((1, 0), (1, 1))) @ y)
    _near(Tensor(x)[::2, ::2] @ Tensor(y)[::2, 1::2], x[::2, ::2] @ y[::2, 1::2])
    _near(Tensor(x.astype(np.float64)) @ Tensor(y.astype(np.float64)), x.astype(np.float64) @ y)
    a = rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    b = rng.standard_normal((1, 3, 4, 2)).astype(np.float32)
    _near(Tensor(a).flip(0) @ Tensor(b).flip(1), a[::-1] @ b[:, ::-1])
    z = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w = np.arange(16, dtype=np.float32).reshape(8, 2)
    _near(Tensor(z).permute(1, 0, 2).reshape(3, 8) @ Tensor(w), z.transpose(1, 0, 2).reshape(3, 8) @ w)
    _near(((Tensor(x) * 2 + 1) @ Tensor(y).exp())[1:3, ::-1] + 1, ((x * 2 + 1) @ np.exp(y))[1:3, ::-1] + 1)
    ints = (x * 5).astype(np.int32), (y * 5).astype(np.int32)
    _same(Tensor(ints[0]) @ Tensor(ints[1]), ints[0] @ ints[1])


def test_in_place_writes_through_overlapping_views_read_every_value_first():
    def written(data: np.ndarray, write) -> np.ndarray:
        t = Tensor(data.copy())
        write(t)
        return t.numpy()
    a = np.arange(8, dtype=np.float32)
    perm = np.array([2, 0, 1, 7, 3, 6, 5, 4], dtype=np.int32)

    def shift(t): t[1:] = t[:-1]
    def steps(t): t[::2] = t[1::2]
    def reverse(t): t[::-1] = t
    def permute(t): t.assign(t[Tensor(perm)])  # a gather reads its source anywhere
    def permute_add(t): t.assign(t.gather(0, Tensor(perm)) + t)
    np.testing.assert_array_equal(written(a, shift), np.concatenate([a[:1], a[:-1]]))
    np.testing.assert_array_equal(written(a, steps), np.where(np.arange(8) % 2 == 0, a + 1, a))
    np.testing.assert_array_equal(written(a, reverse), a[::-1])
    np.testing.assert_array_equal(written(a, permute), a[perm])
    np.testing.assert_array_equal(written(a, permute_add), a[perm] + a)
    m = np.arange(9, dtype=np.int32).reshape(3, 3)

    def transpose(t): t.assign(t.T)
    def diagonal(t): t[1:, 1:] = t[:-1, :-1] * 10
    np.testing.assert_array_equal(written(m, transpose), m.T)
    want = m.copy()
    want[1:, 1:] = m[:-1, :-1] * 10
    np.testing.assert_array_equal(written(m, diagonal), want)


def test_gathers_give_zero_out_of_range_and_read_flipped_padded_and_computed_sources():
    src = np.arange(5, dtype=np.float32) + 1
    idx = np.array([-1, 5, 2, 100, -100, 4], dtype=np.int64)
    valid = (idx >= 0) & (idx < 5)
    _same(Tensor(src).gather(0, Tensor(idx)), np.where(valid, src[np.clip(idx, 0, 4)], 0).astype(np.float32))
    _same(Tensor(src).flip(0).gather(0, Tensor(np.array([0, 4, 2], np.int32))), src[::-1][[0, 4, 2]])
    padded = np.pad(src, (2, 1))
    at = np.array([0, 2, 7, 6], np.int32)
    _same(Tensor(src).pad(((2, 1),)).gather(0, Tensor(at)), padded[at])
    t2 = np.arange(12, dtype=np.float32).reshape(3, 4)
    _same(Tensor(t2).sum(0).gather(0, Tensor(np.array([3, 0, 9], np.int32))),
          np.array([t2.sum(0)[3], t2.sum(0)[0], 0], np.float32))


def test_integer_arange_with_a_float_start_or_step_truncates_each_value():
    """arange(0.5, 5, 1.5, dtype=int32) is 0, 2, 3 (each float value truncated, as PyTorch), not
    start and step truncated first (0, 1, 2; a step of 0.7 would become 0)."""
    _same(Tensor.arange(0.5, 5, 1.5, dtype=dtypes.int32) + 0, np.array([0, 2, 3], np.int32))
    values = np.trunc(-2.5 + 0.7 * np.arange(8)).astype(np.int32)
    _same(Tensor.arange(-2.5, 3, 0.7, dtype=dtypes.int32).flip(0) * 1, values[::-1])
    _near(Tensor.arange(1.0, -1.0, -0.3) * 1, np.arange(1.0, -1.0, -0.3).astype(np.float32))


def test_scalars_and_extreme_constants():
    _same(Tensor(np.float32(3.5)) * 2 + 1, np.array(8.0, np.float32))
    _same(Tensor(np.int32(-7)) // 2, np.array(-4, np.int32))
    i64 = np.array([-2**63, 2**63 - 1, 0, -1], dtype=np.int64)
    with np.errstate(over="ignore"):
        _same((Tensor(i64) + (-2**63)) - (2**63 - 1), (i64 + np.int64(-2**63)) - np.int64(2**63 - 1))
    ones = np.ones(4, np.float32)
    with np.errstate(over="ignore"):
        want = np.stack([ones * np.float32(1e38) * np.float32(10), ones * np.float32(1e-45),
                         np.maximum(ones, -np.inf), ones + np.nan])
    got = Tensor.stack(Tensor(ones) * 1e38 * 10, Tensor(ones) * 1e-45, Tensor(ones).maximum(float("-inf")),
                       Tensor(ones) + float("nan"))
    _same(got, want)


def test_softmax_logsumexp_and_layernorm_chains():
    x = np.random.default_rng(8).standard_normal((3, 4, 5)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    _near(Tensor(x).softmax(1), e / e.sum(1, keepdims=True))
    _near(Tensor(x).logsumexp((0, 2)), np.log(np.exp(x).sum((0, 2))))
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    t = Tensor(x)
    _near((t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True, correction=0) + 1e-5).sqrt(),
          (x - mu) / np.sqrt(var + 1e-5))


# ---- a compiler bug: flipped reductions ------------------------------------------------------------------
def test_a_sum_over_a_flipped_axis_is_compiled_without_the_miscompiling_loop_vectorizer(every_kernel_native):
    """GCC 12.2 at -O3 (and -O2) vectorized this kernel into one that adds an element twice (44, not
    42); the C has no undefined behaviour. Kernels with a negative stride get AT_NEGATIVE_STEPS."""
    a = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    assert (Tensor(a).flip(1) * 2).sum().item() == 42.0
    sources = [registry.REGISTRY.kernels[ast].source for ast in every_kernel_native]
    assert any("AT_NEGATIVE_STEPS void" in src and "* -1]" in src for src in sources), sources
    assert (Tensor(a) * 2).sum().item() == 42.0  # without a flip: loop vectorization stays on
    plain = [registry.REGISTRY.kernels[ast].source for ast in every_kernel_native]
    assert any("AT_NEGATIVE_STEPS" not in src for src in plain), plain


@pytest.mark.parametrize("shape", [(3, 2), (4, 2), (5, 2), (3, 4), (7, 5), (17, 3), (9, 8)])
def test_flipped_strided_and_padded_reductions_in_c_match_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(-8, 9, shape).astype(np.float32)  # small integers: every sum is exact
    t = Tensor(x)
    _same((t.flip(1) * 2).sum(), np.array((x[:, ::-1] * 2).sum(), np.float32))
    _same(t.flip((0, 1)).sum(1), x[::-1, ::-1].sum(1))
    _same(t.flip(0).sum(0) + 0, x[::-1].sum(0))
    _same(t[::2, ::-1].sum(1), x[::2, ::-1].sum(1))
    _same(t.pad(((1, 2), (2, 1))).flip(1).sum(1), np.pad(x, ((1, 2), (2, 1)))[:, ::-1].sum(1))
    ints = x.astype(np.int32)
    _same(Tensor(ints).flip(1).sum(1) * 3, ints[:, ::-1].sum(1).astype(np.int32) * 3)
    _same(Tensor(ints).flip(1).max(1), ints[:, ::-1].max(1))


def test_bool_min_and_max_over_small_nests_are_0_or_1():
    """GCC 12.2's SLP vectorizer turned the max over `!x` of a 2x2 bool nest into the mask byte 0xFF,
    so min() of [[1, 0], [1, 1]] stored 254 (read back as True): found by tests/fuzz."""
    for shape in [(2, 2), (2, 8), (2, 3), (1, 4)]:
        x = np.ones(shape, bool)
        x[0, -1] = False
        for got, want in ((Tensor(x).min(), x.min()), (Tensor(x).max(), x.max()),
                          ((~Tensor(x)).max(), (~x).max()), (Tensor(x).min(1), x.min(1))):
            raw = got.numpy()
            assert raw.view(np.uint8).max() <= 1, (shape, raw.view(np.uint8))  # a bool is stored as 0 or 1
            _same(got, np.asarray(want))


# ---- kernels whose views use bound Variables ----------------------------------------------------------
def _variable_kernels(looked: dict) -> list:
    return [registry.REGISTRY.kernels[ast] for ast, ok in looked.items() if ok and registry.REGISTRY.kernels[ast].variables]


def test_a_jitted_kernel_with_a_variable_runs_in_c_and_matches_numpy_at_each_bound_value(every_kernel_native):
    """A KV-cache-like step: a write at a Variable row, a gemm reading a Variable-offset window and a
    padded (masked) read of that window. One compiled function per kernel serves every value: the
    value sits in the kernel's argument block, rebound per replay."""
    pos = Variable("pos", 0, 12)
    rng = np.random.default_rng(5)
    w_np = rng.standard_normal((4, 4)).astype(np.float32)
    cache, w = Tensor(np.zeros((16, 4), np.float32)), Tensor(w_np)
    ref = np.zeros((16, 4), np.float32)

    @atensor.jit
    def step(x, p):
        cache.shrink(((p, p + 1), None)).assign(x @ w)               # a store at a symbolic offset
        window = cache.shrink(((p, p + 4), None))                    # a gemm operand at one
        padded = window.pad(((1, 1), None))                          # a mask over a symbolic offset
        return window @ w + padded[1:5].sum(1, keepdim=True) + padded[:4]
    for p in [0, 1, 2, 5, 3, 12, 7, 0, 9]:
        x_np = rng.standard_normal((1, 4)).astype(np.float32)
        out = step(Tensor(x_np), pos.bind(p)).numpy()
        ref[p] = x_np @ w_np
        padded = np.pad(ref[p:p + 4], ((1, 1), (0, 0)))
        want = ref[p:p + 4] @ w_np + padded[1:5].sum(1, keepdims=True) + padded[:4]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cache.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert step.stats["replays"] >= 5
    kernels = _variable_kernels(every_kernel_native)
    assert kernels, "no kernel with a Variable was compiled"
    # the 4-row window is a BLAS call (gemvs per row: a few rows, backend/gemm/c_blas.py) at the Variable offset
    assert any(("at_sgemm" in k.source or "at_sgemv" in k.source) and "var0" in k.source
               for k in kernels), [k.source for k in kernels]
    assert all(k.variables == (Variable("pos", 0, 12),) for k in kernels)


def test_jit_mode_compiles_the_variable_kernels_of_a_replayed_step():
    """In the default mode ("jit") the kernels of a captured step are compiled, those with Variables
    too: the replays of a decode-like step run in C, not on numpy."""
    pos = Variable("slot", 0, 7)
    table = Tensor(np.arange(32, dtype=np.float32).reshape(8, 4))

    @atensor.jit
    def pick(scale, p):
        return table.shrink(((p, p + 1), None)) * scale + 1
    with atensor.Context(native="jit"):
        for i in [0, 3, 5, 7, 2, 6]:
            out = pick(Tensor(np.full((1, 4), 2.0, np.float32)), pos.bind(i)).numpy()
            np.testing.assert_allclose(out, np.arange(32, dtype=np.float32).reshape(8, 4)[i:i + 1] * 2 + 1)
    compiled = [k for k in registry.REGISTRY.kernels.values() if Variable("slot", 0, 7) in k.variables]
    assert compiled, registry.status()
    assert pick.stats["replays"] == 3


def test_a_negative_variable_value_reaches_the_kernel_as_a_signed_int():
    v = Variable("shift", -3, 3)
    src = np.arange(12, dtype=np.float32)
    base = Tensor(src)

    @atensor.jit
    def window(x, s):
        return base.shrink(((s + 4, s + 8),)) + x
    for s in [-3, 2, -1, 0, 3, -2]:
        out = window(Tensor(np.zeros(4, np.float32)), v.bind(s)).numpy()
        np.testing.assert_allclose(out, src[s + 4:s + 8])


def test_matrix_vector_products_are_gemv_calls_matching_numpy(every_kernel_native):
    """A product with one row or one column (batch-1 decode's every matmul) is a BLAS gemv, for each
    layout of the matrix and a strided vector, in float32 and float64 (the float32 matrix above
    c_blas.SMALL_MATRIX_BYTES: a smaller one is the prelude's row kernels, test_native_vectorized.py)."""
    rng = np.random.default_rng(11)
    for dtype in (np.float32, np.float64):
        k, n = 373, 229
        x, w = rng.standard_normal((1, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        wt = np.ascontiguousarray(w.T)
        col = rng.standard_normal((k, 1)).astype(dtype)
        wide = rng.standard_normal((1, 2 * k)).astype(dtype)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12)
        np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, **tol)            # B^T x
        np.testing.assert_allclose((Tensor(x) @ Tensor(wt).T).numpy(), x @ w, **tol)          # B x
        np.testing.assert_allclose((Tensor(wt) @ Tensor(col)).numpy(), wt @ col, **tol)       # A b
        np.testing.assert_allclose((Tensor(w).T @ Tensor(col)).numpy(), wt @ col, **tol)      # A^T b
        np.testing.assert_allclose((Tensor(wide)[:, ::2] @ Tensor(w)).numpy(), wide[:, ::2] @ w, **tol)
        batched = rng.standard_normal((3, 1, k)).astype(dtype)
        np.testing.assert_allclose((Tensor(batched) @ Tensor(w)).numpy(), batched @ w, **tol)
    sources = [registry.REGISTRY.kernels[ast].source for ast in every_kernel_native]
    assert sum("at_sgemv(" in src for src in sources) >= 5 and any("at_dgemv(" in src for src in sources)


def test_a_few_rows_times_a_big_weight_read_it_once_matching_numpy(every_kernel_native):
    """2..4 rows through an nn.Linear-style weight (x @ W.T) too big for cache are at_sgemm_rows, which
    streams the weight once (c_blas.rows_plan), at a k that is no multiple of the 8 lanes; 5 rows, or
    rows too long for L1, stay a BLAS gemm."""
    rng = np.random.default_rng(5)
    n, k = 1100, 300  # 1.3 MB of float32: above GEMV_MATRIX_BYTES
    w = rng.standard_normal((n, k)).astype(np.float32)
    for m in (2, 3, 4, 5):
        x = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_allclose((Tensor(x) @ Tensor(w).T).numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
    long_rows = rng.standard_normal((4, 4100)).astype(np.float32)  # 64 KiB of rows
    wide = rng.standard_normal((80, 4100)).astype(np.float32)
    np.testing.assert_allclose((Tensor(long_rows) @ Tensor(wide).T).numpy(), long_rows @ wide.T, rtol=1e-4,
                               atol=1e-3)
    sources = [registry.REGISTRY.kernels[ast].source for ast, ok in every_kernel_native.items() if ok]
    rows = [src for src in sources if "at_sgemm_rows(" in src.split("void atensor_set_blas")[-1]]
    assert sorted(src.split("at_sgemm_rows(")[-1].split(",")[0] for src in rows) == ["2", "3", "4"], rows
    assert sum("at_sgemm(" in src for src in sources) >= 2  # the 5 rows and the long ones


def test_a_decode_steps_attention_contractions_are_row_kernels_matching_numpy(every_kernel_native):
    """Grouped-query attention of a decode step (one token per row, a group of 3 query heads per kv
    head, keys and values read from a KV cache behind an additive mask): both contractions, q . K^T and
    weights . V, are a few rows against a small key block, run by the prelude's row kernels (no BLAS
    call per query row, and no gemm, which would pack the block first: backend/gemm/c_blas.py), and the result is
    numpy's."""
    rng = np.random.default_rng(3)
    b, heads, kv, source, dim = 2, 6, 2, 32, 16
    cache_np = rng.standard_normal((b, 2, kv, source, dim)).astype(np.float32)
    q_np = rng.standard_normal((b, heads, 1, dim)).astype(np.float32)
    seen = np.arange(source)[None, :] <= np.array([5, 20])[:, None]            # row b sees cells 0..pos
    mask_np = np.where(seen, 0, -np.inf).astype(np.float32)[:, None, None, :]  # (b, 1, 1, S)
    cache = Tensor(cache_np)
    keys = cache.shrink((None, (0, 1), None, None, None)).reshape(b, kv, source, dim)
    values = cache.shrink((None, (1, 2), None, None, None)).reshape(b, kv, source, dim)
    got = Tensor(q_np).scaled_dot_product_attention(keys, values, attn_mask=Tensor(mask_np),
                                                     enable_gqa=True).numpy()
    k_np = np.repeat(cache_np[:, 0], heads // kv, axis=1)  # query head h reads kv head h // 3
    v_np = np.repeat(cache_np[:, 1], heads // kv, axis=1)
    scores = q_np @ k_np.transpose(0, 1, 3, 2) / np.sqrt(dim) + mask_np
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True)) @ v_np
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    sources = [registry.REGISTRY.kernels[ast].source for ast, ok in every_kernel_native.items() if ok]
    attention = [src for src in sources if "at_sgemm_rows(3, 32, 16," in src]
    assert attention and "at_sgemm(" not in attention[0] and "at_sgemv(" not in attention[0], sources
    assert "at_sgemm_rows_nn(3, 16, 32," in attention[0], attention[0]  # the group of 3 rows at once


def test_the_kernels_call_numpys_blas_whatever_order_threadpoolctl_lists_the_libraries(monkeypatch):
    """With scikit-learn imported the process holds scipy's OpenBLAS beside numpy's; threadpoolctl
    lists them in no fixed order, and the kernels must bind numpy's either way (the library's key and
    its integer width follow from it)."""
    pytest.importorskip("sklearn")
    import scipy.linalg  # noqa: F401 - loads scipy's OpenBLAS
    import threadpoolctl
    listed = threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers
    homes = [Path(str(lib.filepath)).parent.name for lib in listed]
    if not any(h.startswith("numpy") for h in homes) or len(listed) < 2:
        pytest.skip(f"one BLAS library only: {homes}")
    chosen = []
    for order in (listed, listed[::-1]):
        class Controller:
            def select(self, **_):
                return type("Selected", (), {"lib_controllers": list(order)})()
        monkeypatch.setattr(threadpoolctl, "ThreadpoolController", Controller)
        monkeypatch.setattr(openblas.BINDING, "checked", False)
        monkeypatch.setattr(openblas.BINDING, "found", None)
        chosen.append(openblas.functions())
    numpy_lib = next(lib for lib in listed if Path(str(lib.filepath)).parent.name.startswith("numpy"))
    sgemm = ctypes.cast(numpy_lib._get_symbol("cblas_sgemm"), ctypes.c_void_p).value
    assert chosen[0] == chosen[1] and chosen[0].sgemm == sgemm
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-6)


def test_a_chain_longer_than_the_recursion_limit_renders_and_matches_numpy():
    """The renderer names a long elementwise chain's values deepest first, not by recursing once per node
    (a 3-D pool's backward outgrew Python's recursion limit): 1400 fused ops in one kernel, a chain deeper
    than the limit (1000) by itself, before any frames a renderer would spend per value."""
    import sys
    data = np.linspace(-1, 1, 64, dtype=np.float32)
    x, want = Tensor(data), data.copy()
    steps = 700  # two ops each (it was 1500 steps: 3000 ops, most of the test's 5-14 s, and no deeper a check)
    for i in range(steps):
        c = np.float32(1 + (i % 7) / 1024)
        x, want = x * float(c) - 0.001, want * c - np.float32(0.001)
    assert 2 * steps > sys.getrecursionlimit()
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-4, atol=1e-5)
