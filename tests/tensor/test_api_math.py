"""Math against numpy (PyTorch where numpy has no such function): cumulative ops, softmax family,
statistics, norms, rounding, nan/inf handling, erf and the activations; matmul and einsum."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atensor import Tensor, dtypes

try:
    import torch
except ImportError:  # PyTorch is a test-only dependency: the tests that compare against it skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (test-only dependency) is not installed")
F = torch.nn.functional if torch is not None else None

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 5, 4)).astype(np.float32) * 2
SPECIAL = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, 3.7, -3.7, np.nan, np.inf, -np.inf],
                   dtype=np.float32)


def close(t: Tensor, ref, rtol=1e-5, atol=1e-6):
    got = t.numpy()
    assert got.shape == np.shape(ref), (got.shape, np.shape(ref))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumulative_ops_match_numpy(axis):
    close(Tensor(X).cumsum(axis), np.cumsum(X, axis), rtol=1e-5, atol=1e-5)
    close(Tensor(X).cumprod(axis), np.cumprod(X, axis), rtol=1e-4, atol=1e-5)
    close(Tensor(X).cummax(axis)[0], np.maximum.accumulate(X, axis))


def test_cumulative_ops_on_long_axes_and_ints():
    long = RNG.integers(-3, 4, size=(2, 1000)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(long).cumsum(1).numpy(), np.cumsum(long, 1))
    np.testing.assert_array_equal(Tensor(long).cummax(1)[0].numpy(), np.maximum.accumulate(long, 1))
    small = (RNG.random(600) + 0.5).astype(np.float64)
    close(Tensor(small).cumprod(0), np.cumprod(small), rtol=1e-9)
    assert Tensor([True, False, True]).cumsum().tolist() == [1, 1, 2]


def test_softmax_family_and_statistics():
    close(Tensor(X).logsumexp(1), np.log(np.exp(X).sum(1)))
    close(Tensor(X).logsumexp((0, 2), keepdim=True), np.log(np.exp(X).sum((0, 2), keepdims=True)))
    e = np.exp(X - X.max(-1, keepdims=True))
    close(Tensor(X).softmax(), e / e.sum(-1, keepdims=True))
    close(Tensor(X).log_softmax(0), X - np.log(np.exp(X).sum(0, keepdims=True)), atol=1e-5)
    big = np.array([1000.0, 1000.0, -np.inf], dtype=np.float32)
    close(Tensor(big).logsumexp(0), np.float32(1000 + math.log(2)))
    close(Tensor(X).var(1), X.var(1, ddof=1), rtol=1e-5)
    close(Tensor(X).std(correction=0), X.std(), rtol=1e-5)
    close(Tensor(X).var((0, 2), keepdim=True), X.var((0, 2), ddof=1, keepdims=True), rtol=1e-5)
    close(Tensor(X).prod(2), X.prod(2), rtol=1e-5)
    b = X > 0
    np.testing.assert_array_equal(Tensor(b).any(1).numpy(), b.any(1))
    np.testing.assert_array_equal(Tensor(b).all(0).numpy(), b.all(0))


@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3])
def test_norm_matches_numpy(ord):
    flat = X.reshape(-1)
    close(Tensor(X).norm(ord), np.linalg.norm(flat, ord), rtol=1e-5)
    close(Tensor(X).norm(ord, axis=1), np.linalg.norm(X, ord, axis=1), rtol=1e-5)


def test_elementwise_rounding_and_special_values():
    close(Tensor(SPECIAL).floor(), np.floor(SPECIAL))
    close(Tensor(SPECIAL).ceil(), np.ceil(SPECIAL))
    close(Tensor(SPECIAL).round(), np.round(SPECIAL))
    close(Tensor(SPECIAL).trunc(), np.trunc(SPECIAL))
    close(Tensor(SPECIAL).sign(), np.sign(SPECIAL))
    np.testing.assert_array_equal(Tensor(SPECIAL).isnan().numpy(), np.isnan(SPECIAL))
    np.testing.assert_array_equal(Tensor(SPECIAL).isinf().numpy(), np.isinf(SPECIAL))
    close(Tensor(SPECIAL).nan_to_num(), np.nan_to_num(SPECIAL))
    close(Tensor(SPECIAL).nan_to_num(1.0, 2.0, -3.0),
          np.nan_to_num(SPECIAL, nan=1.0, posinf=2.0, neginf=-3.0))
    ints = np.array([-3, 0, 4], dtype=np.int32)
    assert Tensor(ints).sign().tolist() == [-1, 0, 1] and Tensor(ints).round().dtype == dtypes.int32
    close(Tensor(X).clamp(-1, 0.5), np.clip(X, -1, 0.5))
    close(Tensor(X).clamp(min=Tensor(X * 0)), np.maximum(X, 0))
    close(Tensor(X).lerp(Tensor(X * 3), 0.25), X + (X * 3 - X) * 0.25)


@needs_torch
@pytest.mark.parametrize("name, ours, theirs", [
    ("erf", lambda t: t.erf(), lambda t: torch.erf(t)),
    ("gelu", lambda t: t.gelu(), lambda t: F.gelu(t, approximate="tanh")),
    ("gelu_exact", lambda t: t.gelu(approximate="none"), lambda t: F.gelu(t)),
    ("silu", lambda t: t.silu(), lambda t: F.silu(t)),
    ("softplus", lambda t: t.softplus(), lambda t: F.softplus(t)),
    ("softplus_beta", lambda t: t.softplus(beta=2.0), lambda t: F.softplus(t, beta=2.0)),
    ("mish", lambda t: t.mish(), lambda t: F.mish(t)),
    ("hardtanh", lambda t: t.hardtanh(-0.5, 2.0), lambda t: F.hardtanh(t, -0.5, 2.0)),
    ("leaky_relu", lambda t: t.leaky_relu(0.1), lambda t: F.leaky_relu(t, 0.1)),
    ("elu", lambda t: t.elu(0.7), lambda t: F.elu(t, 0.7)),
])
def test_activations_match_pytorch(name, ours, theirs):
    wide = np.concatenate([X.reshape(-1), np.array([-30.0, -8.0, 8.0, 30.0], dtype=np.float32)])
    close(ours(Tensor(wide)), theirs(torch.tensor(wide)).numpy(), rtol=2e-5, atol=2e-6)


def test_matmul_broadcasts_batches_like_pytorch():
    a = RNG.standard_normal((2, 1, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((5, 4, 6)).astype(np.float32)
    close(Tensor(a) @ Tensor(b), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    close(Tensor(a[0, 0]) @ Tensor(b), np.matmul(a[0, 0], b), rtol=1e-5, atol=1e-5)
    v = RNG.standard_normal(4).astype(np.float32)
    close(Tensor(a) @ Tensor(v), np.matmul(a, v), rtol=1e-5, atol=1e-5)
    close(Tensor(v) @ Tensor(b), np.matmul(v, b), rtol=1e-5, atol=1e-5)
    ia, ib = RNG.integers(-3, 3, (3, 4)).astype(np.int32), RNG.integers(-3, 3, (4, 2)).astype(np.int32)
    np.testing.assert_array_equal((Tensor(ia) @ Tensor(ib)).numpy(), ia @ ib)


@pytest.mark.parametrize("formula, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i->", [(4,), (4,)]),
    ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("i,j->ij", [(3,), (4,)]), ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("ij,jk", [(3, 4), (4, 5)]),
])
def test_einsum_matches_numpy(formula, shapes):
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    close(Tensor.einsum(formula, *(Tensor(a) for a in arrays)), np.einsum(formula, *arrays),
          rtol=1e-4, atol=1e-5)


def test_outer_matches_numpy():
    a, b = np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32)
    close(Tensor(a).outer(Tensor(b)), np.outer(a, b))
