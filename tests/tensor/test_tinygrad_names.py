"""tinygrad's names that ported programs use (issue 39, part 1), each against tinygrad's documented
behaviour, PyTorch, or a numpy transcription of tinygrad's formula; and the porting errors (part 2):
a tinygrad name atensor lacks says where docs/porting.md gives the atensor form."""
from __future__ import annotations

import gzip
import pathlib

import numpy as np
import pytest

import atensor
from atensor import Context, GlobalCounters, Tensor, dtypes, nn
from tests.torch_reference import needs_torch, torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- GlobalCounters ---------------------------------------------------------------------------------------
@pytest.mark.default_settings
def test_global_counters_total_the_kernels_flops_bytes_and_time_of_what_ran_as_the_profiler_stamps_them():
    a, b = Tensor.rand(96, 64).realize(), Tensor.rand(64, 80).realize()
    a.wait()
    b.wait()
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)
    (a @ b).relu().realize().wait()
    counted = (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem)
    assert counted[0] >= 1 and GlobalCounters.time_sum_s > 0
    assert 2 * 96 * 64 * 80 <= counted[1] <= 3 * 96 * 64 * 80  # a matmul's 2*M*K*N, plus the relu
    assert counted[2] >= 4 * (96 * 64 + 64 * 80 + 96 * 80)  # it read both inputs and wrote the output
    # the same realize under a profile: the counters are the sums over its kernel spans
    GlobalCounters.reset()
    with atensor.profile() as prof:
        (a @ b).relu().realize().wait()
    kernels = [s for s in prof.spans if s.kind == "kernel"]
    assert GlobalCounters.kernel_count == len(kernels) == counted[0]
    assert GlobalCounters.global_ops == sum(s.flops for s in kernels) == counted[1]
    assert GlobalCounters.global_mem == sum(s.bytes for s in prof.spans)
    GlobalCounters.reset()
    assert GlobalCounters.time_sum_s == 0.0 and GlobalCounters.kernel_count == 0


@pytest.mark.default_settings
def test_global_counters_count_every_replay_of_a_jitted_step():
    x = Tensor.rand(32, 32).realize()

    @atensor.jit
    def step(x):
        return ((x @ x).relu() + 1).sum(axis=1)
    for _ in range(3):
        step(x).wait()
    GlobalCounters.reset()
    step(x).wait()
    one = (GlobalCounters.kernel_count, GlobalCounters.global_ops)
    step(x).wait()
    assert one[0] >= 1 and (GlobalCounters.kernel_count, GlobalCounters.global_ops) == (2 * one[0], 2 * one[1])


def test_context_debug_2_prints_each_kernel_as_it_runs(capsys):
    x = Tensor.rand(16, 16).realize()
    x.wait()
    with Context(DEBUG=2) as inside:
        assert inside.debug == 2
        (x @ x).sum().realize().wait()
    (x @ x).sum().realize().wait()  # outside the block: quiet again
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("***")]
    assert lines and all("CPU" in line and "tm" in line and "GFLOPS" in line for line in lines)
    assert any("matmul" in line or "kernels from" in line for line in lines)


# ---- Context(TRAINING=1) ---------------------------------------------------------------------------------
def test_context_training_is_tinygrads_training_mode_as_block_and_decorator():
    assert not Tensor.training
    with Context(TRAINING=1):
        assert Tensor.training
        with Context(TRAINING=0):
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training

    @Context(TRAINING=1)
    def dropped() -> np.ndarray:
        return nn.Dropout(0.5)(Tensor.ones(1000)).numpy()
    out = dropped()
    assert not Tensor.training
    assert set(np.unique(out)) <= {0.0, 2.0} and 300 < (out == 0).sum() < 700  # dropout ran in training mode
    assert (nn.Dropout(0.5)(Tensor.ones(10)).numpy() == 1).all()


def test_context_refuses_a_tinygrad_flag_without_an_equivalent_naming_the_porting_page():
    with pytest.raises(TypeError, match="BEAM.*docs/porting.md"):
        with Context(BEAM=2):
            pass
    with pytest.raises(TypeError, match="unknown atensor setting"):
        with Context(NOT_A_FLAG=1):
            pass


# ---- function, helpers -----------------------------------------------------------------------------------
@needs_torch
def test_function_is_a_pass_through_for_values_gradients_and_methods():
    class Model:
        def __init__(self):
            self.w = Tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)

        @atensor.function
        def __call__(self, x: Tensor) -> Tensor:
            return (x @ self.w).relu()

    @atensor.function(precompile=True)
    def loss(y: Tensor) -> Tensor:
        return (y * y).sum()

    model, x0 = Model(), np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
    out = loss(model(Tensor(x0)))
    out.backward()
    tw = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    tout = ((torch.tensor(x0) @ tw).relu() ** 2).sum()
    tout.backward()
    np.testing.assert_allclose(out.item(), tout.item(), rtol=1e-6)
    np.testing.assert_allclose(model.w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)
    assert loss.__name__ == "loss"


def test_helpers_getenv_colored_and_trange_behave_as_tinygrads(monkeypatch, capsys):
    from atensor.helpers import colored, getenv, trange
    monkeypatch.setenv("ATENSOR_TEST_STEPS", "12")
    assert getenv("ATENSOR_TEST_STEPS", 70) == 12 and getenv("ATENSOR_TEST_UNSET", 70) == 70
    assert getenv("ATENSOR_TEST_STEPS", 0.0) == 12.0 and getenv("ATENSOR_TEST_STEPS", "") == "12"
    assert getenv("ATENSOR_TEST_UNSET") == 0
    # tinygrad: lower case the normal color (30 + index), upper case the bright one (+60), background +10
    assert colored("x", "red") == "\x1b[31mx\x1b[0m" and colored("x", "GREEN") == "\x1b[92mx\x1b[0m"
    assert colored("x", "blue", background=True) == "\x1b[44mx\x1b[0m" and colored("x", None) == "x"
    seen = []
    for i in (t := trange(5)):
        seen.append(i)
        t.set_description(f"step {i}")
    assert seen == list(range(5)) and "step 4 5/5" in capsys.readouterr().err


# ---- contiguous_backward, RMSNorm --------------------------------------------------------------------------
@needs_torch
def test_contiguous_backward_keeps_values_and_gradients_as_the_identity():
    x0 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x = Tensor(x0, requires_grad=True)
    y = x.permute(1, 0).contiguous_backward()
    (y * y.exp()).sum().backward()
    tx = torch.tensor(x0, requires_grad=True)
    ty = tx.permute(1, 0)
    (ty * ty.exp()).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_matches_pytorch_values_and_gradients(affine):
    x0 = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    norm = nn.RMSNorm(8, eps=1e-6, elementwise_affine=affine)
    tnorm = torch.nn.RMSNorm(8, eps=1e-6, elementwise_affine=affine)
    if affine:
        w0 = np.linspace(0.5, 2.0, 8, dtype=np.float32)
        norm.weight.assign(Tensor(w0))
        with torch.no_grad():
            tnorm.weight.copy_(torch.tensor(w0))
    x, tx = Tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
    out, tout = norm(x), tnorm(tx)
    (out * out).sum().backward()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    if not affine:  # with a float32 weight the product is float32, as in tinygrad
        assert norm(Tensor(x0).cast(dtypes.float16)).dtype == dtypes.float16


# ---- LAMB and Muon against numpy transcriptions of tinygrad's formulas ------------------------------------
def _numpy_lamb(p, grads, lr, b1, b2, eps, wd):
    m, v, out = np.zeros_like(p), np.zeros_like(p), p.copy()
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        up = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * out
        r1, r2 = np.linalg.norm(out), np.linalg.norm(up)
        out = out - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * up
    return out


def _numpy_newton_schulz(g, steps, coefficients, eps=1e-7):
    if g.shape[0] > g.shape[1]:
        return _numpy_newton_schulz(g.T, steps, coefficients, eps).T
    x = g / (np.sqrt((g * g).sum()) + eps)
    for _ in range(steps):
        x = sum(c * np.linalg.matrix_power(x @ x.T, i) @ x for i, c in enumerate(coefficients))
    return x


def _numpy_muon(p, grads, lr, momentum, wd, steps, coefficients, nesterov):
    b, out = np.zeros_like(p), p.copy()
    for g in grads:
        b = momentum * b + g
        d = g + momentum * b if nesterov else b
        d = _numpy_newton_schulz(d.reshape(d.shape[0], -1), steps, coefficients).reshape(d.shape)
        out = out - lr * d - lr * wd * out
    return out


def _run(opt_cls, p0, grads, **kwargs):
    p = Tensor(p0, requires_grad=True)
    opt = opt_cls([p], **kwargs)
    for g in grads:
        (p * Tensor(g)).sum().backward()  # the gradient of sum(p * g) is g
        opt.step().wait()
        opt.zero_grad()
    return p.numpy()


@pytest.mark.parametrize("shape", [(4, 6), (5,)])
def test_lamb_follows_tinygrads_rule_over_three_steps(shape):
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    kw = dict(lr=0.01, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.05)
    got = _run(nn.optim.LAMB, p0, grads, **kw)
    want = _numpy_lamb(p0.astype(np.float64), grads, kw["lr"], kw["b1"], kw["b2"], kw["eps"], kw["weight_decay"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape, nesterov", [((6, 4), True), ((3, 2, 2, 2), False), ((7,), True)])
def test_muon_follows_tinygrads_rule_over_three_steps(shape, nesterov):
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    coefficients = (3.4445, -4.775, 2.0315)
    got = _run(nn.optim.Muon, p0, grads, lr=0.02, momentum=0.95, weight_decay=0.1, nesterov=nesterov)
    want = _numpy_muon(p0.astype(np.float64), grads, 0.02, 0.95, 0.1, 5, coefficients, nesterov)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---- nn.datasets.mnist ---------------------------------------------------------------------------------------
def test_mnist_gives_tinygrads_shapes_and_dtypes_from_local_digits():
    from atensor.nn.datasets import mnist
    x_train, y_train, x_test, y_test = mnist()
    assert x_train.shape[1:] == (1, 28, 28) and x_test.shape[1:] == (1, 28, 28)
    assert y_train.shape == (x_train.shape[0],) and y_test.shape == (x_test.shape[0],)
    assert {t.dtype for t in (x_train, y_train, x_test, y_test)} == {dtypes.uint8}
    images, labels = x_train.numpy(), y_train.numpy()
    assert images.max() == 255 and (images[:, :, :2] == 0).all() and set(labels) == set(range(10))
    from sklearn.datasets import load_digits
    digits = load_digits()
    first = images[0, 0, 2:26:3, 2:26:3]  # every third pixel of the enlarged digit: the 8x8 original
    matches = [k for k in range(len(digits.images)) if (np.round(digits.images[k] * 255 / 16) == first).all()]
    assert matches and digits.target[matches[0]] == labels[0]


def test_mnist_loads_idx_files_from_a_folder_and_says_how_to_provide_them(tmp_path):
    from atensor.nn.datasets import mnist
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 5, dtype=np.uint8)
    for prefix in ("train", "t10k"):
        (tmp_path / f"{prefix}-images-idx3-ubyte").write_bytes(
            b"\x00\x00\x08\x03" + b"".join(int(d).to_bytes(4, "big") for d in images.shape) + images.tobytes())
        with gzip.open(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + labels.tobytes())
    x_train, y_train, x_test, y_test = mnist(path=str(tmp_path))
    assert x_train.shape == (5, 1, 28, 28) and (x_test.numpy()[:, 0] == images).all()
    assert (y_train.numpy() == labels).all()
    with pytest.raises(FileNotFoundError, match="ATENSOR_MNIST_DIR"):
        mnist(fashion=True)
    with pytest.raises(FileNotFoundError, match="t10k|train"):
        mnist(path=str(tmp_path / "nothing"))


# ---- porting errors and docs/porting.md ----------------------------------------------------------------------
def test_a_tinygrad_name_atensor_lacks_raises_an_error_naming_the_porting_page():
    from atensor.porting import MissingImportError, PortingError
    with pytest.raises(PortingError, match=r"Tensor\.svd.*docs/porting\.md"):
        Tensor([1.0]).svd()
    assert not hasattr(Tensor([1.0]), "keccak")  # still an AttributeError for hasattr
    with pytest.raises(AttributeError) as plain:
        Tensor([1.0]).not_a_method_anywhere
    assert not isinstance(plain.value, PortingError)
    with pytest.raises(MissingImportError, match=r"atensor\.UOp.*docs/porting\.md"):
        from atensor import UOp  # noqa: F401
    with pytest.raises(ImportError, match="porting.md"):
        from atensor.helpers import Timing  # noqa: F401
    with pytest.raises(ImportError, match="porting.md"):
        from atensor.nn import Conv1d  # noqa: F401
    with pytest.raises(ImportError, match="porting.md"):
        from atensor.nn.optim import LARS  # noqa: F401


def test_the_porting_page_lists_every_missing_name_and_each_is_really_missing():
    import importlib
    from atensor.porting import MISSING
    page = (ROOT / "docs" / "porting.md").read_text()
    not_listed = [key for key in MISSING if f"`{key.split('.')[-1]}`" not in page]
    assert not not_listed, f"docs/porting.md does not list {not_listed}"
    present = []
    for key in MISSING:
        where, name = key.rsplit(".", 1)
        owner = Tensor if where == "Tensor" else importlib.import_module(where)
        try:
            getattr(owner, name)
            present.append(key)
        except (AttributeError, ImportError):
            pass
    assert not present, f"atensor has these now: remove them from atensor/porting.py's MISSING: {present}"
