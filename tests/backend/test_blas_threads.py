"""BLAS threads per kernel (backend/gemm/blas.py): a kernel below `blas_parallel_flops` runs its products on
one thread, a bigger one on `blas_threads`; OpenBLAS itself reports the count the kernel set."""
from __future__ import annotations

import os

import numpy as np
import pytest

from atensor import Context, Tensor
from atensor.backend.gemm import blas
from atensor.backend.c import compiler, programs

threadpoolctl = pytest.importorskip("threadpoolctl")


def _openblas_threads() -> int:
    """numpy's OpenBLAS's thread count (the one the kernels call; with scikit-learn imported, scipy's
    is loaded too, and threadpoolctl lists the two in no fixed order)."""
    libs = [lib for lib in threadpoolctl.threadpool_info() if lib.get("internal_api") == "openblas"]
    if not libs:
        pytest.skip("numpy is not linked against OpenBLAS here")
    numpys = [lib for lib in libs if os.path.basename(os.path.dirname(lib["filepath"])).startswith("numpy")]
    return (numpys or libs)[0]["num_threads"]


@pytest.mark.parametrize("n,expected", [(32, 1), (512, 2)])
async def test_a_kernel_sets_the_blas_threads_its_size_calls_for(n, expected):
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    with Context(blas_threads=2, blas_parallel_flops=64 << 20):
        out = Tensor(a) @ Tensor(a)
        await out.realize()
    np.testing.assert_allclose(out.numpy(), a @ a, rtol=1e-4, atol=1e-3)
    assert blas._current == expected
    assert _openblas_threads() == expected


@pytest.mark.skipif(compiler.path() is None, reason="no C compiler: no C kernels")
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


def _drive(choice: blas.MeasuredThreads, cost: dict, runs: int) -> list[int]:
    """`runs` runs of a kernel whose run on t threads takes cost[t] ns: the counts it ran with."""
    counts = []
    for _ in range(runs):
        threads = choice.pick()
        counts.append(threads)
        choice.record(threads, cost[threads])
    return counts


def test_a_measured_choice_runs_with_the_faster_count_and_tries_the_other_less_and_less():
    choice = blas.MeasuredThreads(2)
    counts = _drive(choice, {1: 20_000, 2: 11_000}, 400)  # an idle machine: two threads win
    assert counts[:4] == [2, 1, 2, 1]  # both counts tried first
    tries = [i for i, t in enumerate(counts) if t == 1][2:]
    assert counts[4:].count(2) > 390 - 8 and 1 <= len(tries) <= 8
    assert all(b - a >= blas.MeasuredThreads.MIN_INTERVAL for a, b in zip(tries, tries[1:]))
    # the load changes: the second thread now waits for a core; the next tries find it out
    later = _drive(choice, {1: 20_000, 2: 60_000}, 300)
    assert choice.choice == 1 and later[-100:].count(1) >= 99
    assert later.index(1) <= blas.MeasuredThreads.MAX_INTERVAL + 1


@pytest.mark.skipif(compiler.path() is None, reason="no C kernels: no measured runs")
async def test_a_big_c_kernel_measures_its_threads_unless_the_count_is_fixed(monkeypatch):
    """With the count not fixed, a C kernel above the size for threads runs with both counts in its first
    runs (its choice keyed by its AST), and its results are right whichever count it runs with."""
    a = np.random.default_rng(1).standard_normal((384, 384)).astype(np.float32)
    real, seen = blas.use, []

    def use(threads: int) -> None:
        real(threads)
        seen.append(threads)
    monkeypatch.setattr(blas, "use", use)
    monkeypatch.setattr(blas, "_choices", {})
    with Context(blas_parallel_flops=1 << 20, native="all"):
        monkeypatch.setattr(blas.settings, "blas_threads", None)
        assert blas.measured()
        if blas.threads_for(1 << 30) == 1:
            pytest.skip("one core: no kernel runs on more than one BLAS thread")
        for _ in range(4):
            out = Tensor(a) @ Tensor(a) + 2
            await out.realize()
            np.testing.assert_allclose(out.numpy(), a @ a + 2, rtol=1e-4, atol=1e-3)
    choices = list(blas._choices.values())
    assert len(choices) == 1 and choices[0].runs == 4 and set(choices[0].times) == {1, choices[0].many}
    assert all(len(samples) == 2 for samples in choices[0].times.values())
    assert blas._current == 1
    with Context(blas_threads=2):
        assert not blas.measured()


@pytest.mark.skipif(compiler.path() is None, reason="no C kernels: no native programs")
async def test_a_replayed_program_runs_a_big_kernel_with_its_measured_threads(monkeypatch):
    """A jit replay whose kernels are all C is one native program: the C runner sets a big kernel's
    BLAS threads for its run and times it, and the plan hands the times to the kernel's choice
    (programs.Program.retune), so both counts are tried and the results are right with either."""
    import atensor
    a = np.random.default_rng(2).standard_normal((384, 384)).astype(np.float32)
    monkeypatch.setattr(blas, "_choices", {})
    retunes = []
    real_retune = programs.Program.retune

    def retune(self) -> None:
        retunes.append(len(self.measured))
        real_retune(self)
    monkeypatch.setattr(programs.Program, "retune", retune)
    with Context(blas_parallel_flops=1 << 20):
        monkeypatch.setattr(blas.settings, "blas_threads", None)
        if blas.threads_for(1 << 30) == 1:
            pytest.skip("one core: no kernel runs on more than one BLAS thread")

        @atensor.jit
        async def step(x: Tensor) -> Tensor:
            return (x @ x + 2).relu()
        for k in range(12):
            x = Tensor(a * (1 + k))
            out = await step(x)
            np.testing.assert_allclose(out.numpy(), np.maximum((a * (1 + k)) @ (a * (1 + k)) + 2, 0),
                                       rtol=1e-4, atol=1e-2 * (1 + k) ** 2)
    if not programs.program_threads():
        pytest.skip("the BLAS has no thread setter a program can call")
    assert any(retunes), "no replay ran as a native program holding the measured kernel"
    choices = [c for c in blas._choices.values() if c.runs >= blas.MeasuredThreads.PROBES]
    assert choices and all(set(c.times) == {1, c.many} and all(c.times.values()) for c in choices)
    assert _openblas_threads() == 1  # the one-thread invariant holds after a program
