"""BLAS threads per kernel (backend/blas.py): a kernel below `blas_parallel_flops` runs its products on
one thread, a bigger one on `blas_threads`; OpenBLAS itself reports the count the kernel set."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Context, Tensor
from atensor.backend import blas, native

threadpoolctl = pytest.importorskip("threadpoolctl")


def _openblas_threads() -> int:
    libs = [lib for lib in threadpoolctl.threadpool_info() if lib.get("internal_api") == "openblas"]
    if not libs:
        pytest.skip("numpy is not linked against OpenBLAS here")
    return libs[0]["num_threads"]


@pytest.mark.parametrize("n,expected", [(32, 1), (512, 2)])
async def test_a_kernel_sets_the_blas_threads_its_size_calls_for(n, expected):
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    with Context(blas_threads=2, blas_parallel_flops=64 << 20):
        out = Tensor(a) @ Tensor(a)
        await out.realize()
    np.testing.assert_allclose(out.numpy(), a @ a, rtol=1e-4, atol=1e-3)
    assert blas._current == expected
    assert _openblas_threads() == expected


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler: no C kernels")
async def test_a_c_kernel_with_more_blas_threads_sets_one_again_when_done(monkeypatch):
    """The C kernel runs with the count its size calls for (OpenBLAS reports it while it is set), then
    sets one again: batches of one-thread C kernels call them without setting the count."""
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    real, seen = blas.use, []

    def use(threads: int) -> None:
        real(threads)
        seen.append((threads, _openblas_threads()))
    monkeypatch.setattr(blas, "use", use)
    with Context(blas_threads=2, blas_parallel_flops=64 << 20, native="all"):
        out = Tensor(a) @ Tensor(a) + 1
        await out.realize()
    np.testing.assert_allclose(out.numpy(), a @ a + 1, rtol=1e-4, atol=1e-3)
    assert (2, 2) in seen, seen
    assert blas._current == 1 and _openblas_threads() == 1


def test_threads_follow_the_settings():
    with Context(blas_threads=3, blas_parallel_flops=1000):
        assert blas.threads_for(999) == 1
        assert blas.threads_for(1000) == 3
