"""The native tier (hcq/native.py, hcq/c_render.py): kernels compiled to C give numpy's values.

Each test runs with `native="all"`, so every kernel it realizes is rendered to C and compiled (or
refused, and then it runs on numpy: the tests check which happened where it matters)."""
from __future__ import annotations

import numpy as np
import pytest
import trio
from hypothesis import given, strategies as st

import atensor
from atensor import Tensor, dtypes, nn
from atensor.nn import optim
from atensor.hcq import native

import test_ops

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine: the "
                                "native tier is off and every kernel runs on numpy")


@pytest.fixture(autouse=True)
def every_kernel_native():
    with atensor.Context(native="all"):
        yield


def _native_count() -> int:
    return native.status()["native"]  # type: ignore[return-value]


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
    assert not any("GATHER" in why for why in native.status()["refused"])


def test_unsupported_kernels_fall_back_to_numpy():
    base = Tensor(np.zeros(5, dtype=np.float32))
    got = base.scatter(0, Tensor(np.array([1, 3], dtype=np.int32)), Tensor(np.array([2.0, 4.0], dtype=np.float32)))
    assert got.tolist() == [0.0, 2.0, 0.0, 4.0, 0.0]
    refused = native.status()["refused"]
    assert any("SCATTER" in why for why in refused), refused


def test_renderer_refuses_what_it_does_not_lower():
    t = Tensor(np.arange(4, dtype=np.float16)) + 1
    assert t.tolist() == [1.0, 2.0, 3.0, 4.0]  # on numpy
    assert any("float16" in why for why in native.status()["refused"])


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
    monkeypatch.setattr(native, "FLAGS", native.FLAGS + ("-fno-such-flag-atensor",))
    x = np.arange(7, dtype=np.float32)
    got = (Tensor(x) * 3 - 1).exp2().tolist()  # a kernel no other test makes
    np.testing.assert_allclose(got, np.exp2(x * 3 - 1), rtol=1e-6)
    status = native.status()
    assert "compile failed" in status["last_error"] and "no-such-flag" in status["last_error"]


def test_a_kernel_is_compiled_once_and_its_library_reused_from_the_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    compiles = []
    real = native._compile
    monkeypatch.setattr(native, "_compile", lambda *a: (compiles.append(a), real(*a)))
    x = Tensor(np.ones((3, 11), dtype=np.float32))
    for _ in range(3):
        assert ((x + 2) * x).sum(1).tolist() == [33.0] * 3
    assert len(compiles) == 1 and len(list((tmp_path / "native").glob("*.so"))) == 1
    # a new process (here: a cleared registry) finds the library on disk and does not compile again
    monkeypatch.setattr(native, "_kernels", {})
    assert ((x + 2) * x).sum(1).tolist() == [33.0] * 3
    assert len(compiles) == 1
