"""The packed-weight kernels' variants (backend/quant/variants_c.py, backend/quant/kernels.py): every
variant of every family, each run where this CPU has its features (and skipped, saying which it lacks,
where it does not), on one thread and on two, held to the portable variant and to numpy; the selection
switches what a compiled QMATMUL kernel runs; the default is the highest-ranked supported variant."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atensor import Context, Tensor
from atensor.backend.quant import kernels as quant_kernels
from atensor.backend.quant.numpy_kernels import qmatmul_q8act
from atensor.graph.quant import BF16, F16, PackedShape, Q4_0, Q4_1, Q8_0
from atensor.nn.packed import PackedWeight
from tests.nn.test_packed import _packed

if quant_kernels.library() is None:
    pytest.skip(f"the packed-weight kernels did not compile: {quant_kernels.failure()}", allow_module_level=True)

ALL = [(v.family, v.name) for v in quant_kernels.variants()]
# rows of x per family: batch 1, or a few / a decode of 16 streams / a prefill's 64 (blocked kernels'
# tiles of two leave one over at 5)
ROWS = {"gemv_f32": (1,), "gemv_q8": (1,), "rows_f32": (2, 5, 16, 64), "rows_q8": (2, 5, 16)}


def _runnable_or_skip(family: str, name: str) -> quant_kernels.Variant:
    v = quant_kernels.variant(family, name)
    if not v.supported:
        have = set(open("/proc/cpuinfo").read().split())
        pytest.skip(f"{family} {name} needs CPU features {' '.join(v.needs)}; this CPU lacks "
                    f"{' '.join(f for f in v.needs if f not in have)} (its code is compiled and checked, not run)")
    return v


@pytest.mark.parametrize("family, name", ALL, ids=[f"{f}-{n}" for f, n in ALL])
def test_each_variant_matches_the_portable_one_and_numpy_on_one_and_two_threads(family, name):
    from atensor.backend.gemm import blas
    _runnable_or_skip(family, name)
    blas.use(1)  # as a kernel's runner sets it: sgemm on one thread
    q8 = family.endswith("q8")
    formats = [Q4_0, Q4_1, Q8_0] if q8 else [Q4_0, Q4_1, Q8_0, F16, BF16]
    rng = np.random.default_rng(70)
    for fmt in formats:
        # 203 weight rows: two threads take at least 64 each, groups of 2/4/8 rows leave some over
        for cols in (96, 576):
            data, expected = _packed(fmt, 203, cols, seed=71)
            shape = PackedShape(fmt, 203, cols, "q8_0" if q8 else "float32")
            if family == "dequant":
                np.testing.assert_array_equal(quant_kernels.dequantize(data, shape, name), expected, err_msg=name)
                continue
            for m in ROWS[family]:
                x = rng.standard_normal((m, cols)).astype(np.float32)
                assert quant_kernels.family_of(shape, m) == family
                want = qmatmul_q8act(x, data, shape) if q8 else x.astype(np.float64) @ expected.T.astype(np.float64)
                before = quant_kernels.calls(family, name)
                one = quant_kernels.matmul(x, data, shape, name, threads=1)
                assert quant_kernels.calls(family, name) == before + 1, "the named variant ran"
                tol = 3e-5 * math.sqrt(cols / 96)
                where = f"{family} {name}, {fmt.name}, {m} rows, {cols} cols"
                np.testing.assert_allclose(one, want, atol=tol, rtol=0, err_msg=where)
                portable = quant_kernels.matmul(x, data, shape, "portable", threads=1)
                np.testing.assert_allclose(one, portable, atol=tol, rtol=0, err_msg=where)
                np.testing.assert_array_equal(quant_kernels.matmul(x, data, shape, name, threads=2), one,
                                              err_msg=f"{where}, 2 threads")


def test_the_default_is_the_highest_ranked_supported_variant_and_select_goes_back_to_it():
    for family in quant_kernels.FAMILIES:
        candidates = [v for v in quant_kernels.variants(family) if v.supported and v.rank >= 0]
        assert candidates[0].name == "portable" and candidates[0].rank == 0
        assert quant_kernels.select(family, None) == max(candidates, key=lambda v: v.rank)
    with pytest.raises(ValueError, match="its variants are"):
        quant_kernels.select("gemv_f32", "no-such")
    with pytest.raises(ValueError, match="the families are"):
        quant_kernels.selected("gemm")


def test_a_variant_this_cpu_lacks_cannot_be_selected():
    lacking = [v for v in quant_kernels.variants() if not v.supported]
    if not lacking:
        pytest.skip("this CPU runs every variant of the table")
    v = lacking[0]
    before = quant_kernels.selected(v.family)
    with pytest.raises(RuntimeError, match="needs CPU features"):
        quant_kernels.select(v.family, v.name)
    assert quant_kernels.selected(v.family) == before


@pytest.mark.parametrize("weights", ["float32", "q8_0"])
def test_select_switches_what_a_compiled_qmatmul_kernel_runs(weights):
    data, expected = _packed(Q4_1, 128, 96, seed=72)
    w = PackedWeight.from_bytes(data, Q4_1, 128, 96, activations=weights)
    family = "gemv_q8" if weights == "q8_0" else "gemv_f32"
    x = np.random.default_rng(73).standard_normal((1, 96)).astype(np.float32)
    want = qmatmul_q8act(x, data, w.shape) if weights == "q8_0" else x @ expected.T
    try:
        for name in quant_kernels.runnable(family):
            assert quant_kernels.select(family, name).name == name
            before = quant_kernels.calls(family, name)
            with Context(native="all"):
                got = w.linear(Tensor(x)).numpy()
            assert quant_kernels.calls(family, name) > before, f"{name} ran in the compiled kernel"
            np.testing.assert_allclose(got, want, atol=3e-5, rtol=0, err_msg=name)
    finally:
        quant_kernels.select(family, None)


def test_a_variant_is_timed_on_a_shape_of_its_family_only():
    shape = PackedShape(Q4_1, 256, 576)
    for name in quant_kernels.runnable("gemv_f32"):
        seconds = quant_kernels.time_variant("gemv_f32", name, shape, rows_of_x=1, threads=1, calls=3)
        assert 0 < seconds < 1
    assert 0 < quant_kernels.time_variant("rows_f32", "portable", shape, rows_of_x=4, calls=2) < 1
    with pytest.raises(ValueError, match="is a gemv_f32 call"):
        quant_kernels.time_variant("rows_f32", "portable", shape, rows_of_x=1)
    data = quant_kernels.sample_weights(shape)
    assert data.size == shape.nbytes
    assert np.isfinite(quant_kernels.dequantize(data, shape)).all()


def test_the_portable_only_build_of_a_cpu_without_x86_vectors_compiles_and_multiplies(tmp_path):
    # ATQ_PORTABLE_ONLY compiles what an ARM machine gets: the table holds the portable variants alone
    import ctypes
    import subprocess
    from atensor.backend.c import compiler
    from atensor.backend.c.flags import FLAGS
    from atensor.backend.quant.source import SOURCE
    (tmp_path / "q.c").write_text(SOURCE)
    subprocess.run([compiler.path(), *FLAGS, "-DATQ_PORTABLE_ONLY", "-o", str(tmp_path / "q.so"),
                    str(tmp_path / "q.c"), "-lm", "-lpthread"], check=True)
    lib = ctypes.CDLL(str(tmp_path / "q.so"))
    lib.atq_variant_name.restype = ctypes.c_char_p
    names = {lib.atq_variant_name(i).decode() for i in range(lib.atq_variant_count())}
    assert names == {"portable"} and lib.atq_variant_count() == len(quant_kernels.FAMILIES)
    data, expected = _packed(Q4_1, 64, 96, seed=74)
    x = np.random.default_rng(75).standard_normal((3, 96)).astype(np.float32)
    y = np.empty((3, 64), np.float32)
    lib.atq_matmul_run.restype = None
    lib.atq_matmul_run(ctypes.c_int(-1), ctypes.c_int(Q4_1.code), x.ctypes.data_as(ctypes.c_void_p),
                       data.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(3),
                       ctypes.c_int64(96), ctypes.c_int64(64), ctypes.c_int(1))
    np.testing.assert_allclose(y, x @ expected.T, atol=3e-5, rtol=0)


@pytest.mark.parametrize("fmt", [Q4_0, Q4_1, Q8_0], ids=lambda f: f.name)
def test_a_vnni_q8_rows_result_equals_its_batch_one_result_bit_for_bit(fmt):
    # backend/quant/avx512_c.py: the rows_q8 tile takes each row's products and sums in the gemv's order
    names = [n for n in quant_kernels.runnable("rows_q8") if "vnni" in n]
    if not names:
        pytest.skip("this CPU has neither AVX512-VNNI nor AVX-VNNI")
    data, _ = _packed(fmt, 203, 576, seed=76)
    shape = PackedShape(fmt, 203, 576, "q8_0")
    x = np.random.default_rng(77).standard_normal((6, 576)).astype(np.float32)
    for name in names:
        batched = quant_kernels.matmul(x, data, shape, name, threads=1)
        for i in range(6):
            np.testing.assert_array_equal(quant_kernels.matmul(x[i:i + 1], data, shape, name, threads=1), batched[i:i + 1],
                                          err_msg=f"{name}, row {i}")
