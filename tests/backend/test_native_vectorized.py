"""The C renderer's vectorized loops (backend/c/render.py, backend/c/flags.py): an inner reduce loop is marked
`omp simd reduction(...)`, transcendental calls go to libmvec's vector versions, and a few rows against
a matrix in cache are the prelude's at_sgemm_rows / at_sgemm_rows_nn. Each against numpy, at sizes that
leave a vector tail, with NaN and infinities where a reduction could lose them."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.backend.c import flags as c_flags
from atensor.backend.c import compiler, registry
from atensor.graph.node import Node

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler ($CC, cc, gcc or clang) "
                                "on PATH: the native tier is off and every kernel runs on numpy")


class Compiled:
    """The kernels a test looked up, by AST, with whether the latest lookup found a compiled one."""

    def __init__(self) -> None:
        self.looked: dict[Node, bool] = {}

    def sources(self) -> list[str]:
        """The C source of every kernel looked up so far; each must have run in C."""
        missing = [registry.FAILURES.refused.get(ast, "not compiled") for ast, ok in self.looked.items() if not ok]
        assert not missing, missing[:3]
        return [registry.REGISTRY.kernels[ast].source for ast in self.looked]


@pytest.fixture
def compiled(monkeypatch):
    """native="all", with the kernels looked up recorded (a kernel is looked up before and after it is
    compiled: the latest lookup counts)."""
    record = Compiled()
    real = registry.lookup

    def lookup(ast: Node):
        found = real(ast)
        record.looked[ast] = found is not None
        return found
    monkeypatch.setattr(registry, "lookup", lookup)
    with atensor.Context(native="all"):
        yield record


def test_inner_reductions_are_simd_loops_that_keep_nan_inf_and_integer_sums(compiled):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 133)).astype(np.float32)  # 133: no multiple of any vector width
    x[1, 5] = np.nan
    x[2, 132] = np.nan  # in the loop's scalar tail
    x[3, :] = -np.inf
    x[4, 7] = np.inf
    np.testing.assert_array_equal(Tensor(x).max(-1).numpy(), x.max(-1))
    np.testing.assert_array_equal(Tensor(x).min(-1).numpy(), x.min(-1))
    finite = np.nan_to_num(x, nan=0.5, posinf=2.0, neginf=-2.0)
    np.testing.assert_allclose(Tensor(finite).sum(-1).numpy(), finite.sum(-1, dtype=np.float64), rtol=1e-6)
    np.testing.assert_allclose(Tensor(finite * 0.1 + 1).prod(-1).numpy(),
                               np.prod((finite * 0.1 + 1).astype(np.float64), -1), rtol=1e-5)
    ints = rng.integers(-2**31, 2**31 - 1, (5, 77)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).sum(-1).numpy(), ints.sum(-1, dtype=np.int32))  # wraps
    np.testing.assert_array_equal(Tensor(ints).max(-1).numpy(), ints.max(-1))
    flags = rng.random((6, 41)) < 0.02
    np.testing.assert_array_equal(Tensor(flags).any(-1).numpy(), flags.any(-1))
    np.testing.assert_array_equal(Tensor(~flags).all(-1).numpy(), (~flags).all(-1))
    sources = compiled.sources()
    assert sum("#pragma omp simd reduction(max:" in s for s in sources) >= 3
    assert any("#pragma omp simd reduction(+:" in s for s in sources)


def test_a_softmax_over_a_row_with_a_vector_tail_matches_numpy(compiled):
    x = np.random.default_rng(1).standard_normal((9, 131)).astype(np.float32) * 4
    want = np.exp(x - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), want, rtol=2e-6, atol=1e-8)


@pytest.mark.skipif(not c_flags.vector_math(compiler.path() or ""), reason="no libmvec here")
def test_transcendentals_in_vectorized_loops_stay_within_a_few_ulp_of_numpy(compiled):
    x = np.linspace(-80, 80, 4099, dtype=np.float32)
    pos = np.linspace(1e-30, 1e6, 4099, dtype=np.float32)
    small = np.linspace(-50, 50, 4099, dtype=np.float32)
    for got, want in ((Tensor(x).exp(), np.exp(x)), (Tensor(pos).log(), np.log(pos)),
                      (Tensor(small).sin(), np.sin(small)), (Tensor(small).cos(), np.cos(small))):
        # 4 ulp of float32: libmvec's bound (backend/c/flags.py measured 3 for expf); the sin/cos atol is for
        # results near 0, whose ulp is tiny
        np.testing.assert_allclose(got.numpy(), want, rtol=5e-7, atol=3e-7)
    assert any("expf(" in s for s in compiled.sources())


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_a_few_rows_against_a_small_matrix_in_either_layout_are_the_preludes_row_kernels(compiled, rows):
    """q . K^T (K stored positions x dim) is at_sgemm_rows, p . V (V stored positions x dim) is
    at_sgemm_rows_nn; 37 columns leave both the 16-column strips' tail and the 8-lane tail."""
    rng = np.random.default_rng(rows)
    q = rng.standard_normal((3, rows, 24)).astype(np.float32)
    keys = rng.standard_normal((3, 37, 24)).astype(np.float32)
    values = rng.standard_normal((3, 37, 40)).astype(np.float32)
    scores = (Tensor(q) @ Tensor(keys).transpose(1, 2)).numpy()
    np.testing.assert_allclose(scores, q @ keys.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
    p = rng.random((3, rows, 37)).astype(np.float32)
    np.testing.assert_allclose((Tensor(p) @ Tensor(values)).numpy(), p @ values, rtol=1e-5, atol=1e-5)
    calls = [s for s in compiled.sources() if "at_sgemm_rows" in s]
    assert any(f"at_sgemm_rows({rows}, 37, 24," in s for s in calls), calls
    assert any(f"at_sgemm_rows_nn({rows}, 40, 37," in s for s in calls), calls


def test_a_matrix_too_big_for_cache_stays_a_blas_call(compiled):
    w = np.random.default_rng(2).standard_normal((300, 240)).astype(np.float32)  # 288 KB
    x = np.random.default_rng(3).standard_normal((2, 300)).astype(np.float32)
    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, rtol=1e-4, atol=1e-4)
    sources = compiled.sources()
    assert not any("at_sgemm_rows" in s for s in sources) and any("at_sgemv(" in s for s in sources)


def test_a_row_dot_a_contiguous_column_is_the_lane_wise_row_kernel(compiled):
    """RMSNorm's sum of squares at decode, x (1 x k) . x^T: the dot form (8 lanes, then their sum), not
    the column form's one scalar chain."""
    x = np.random.default_rng(4).standard_normal((1, 579)).astype(np.float32)
    t = Tensor(x)
    np.testing.assert_allclose((t @ t.T).numpy(), x @ x.T, rtol=1e-5)
    assert any("at_sgemm_rows(1, 1, 579," in s for s in compiled.sources())
