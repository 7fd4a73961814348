"""The packed-weight kernels chosen through atensor/tune/ (backend/quant/tuning.py): a trial on the
caller's shapes selects a variant that every QMATMUL then runs, eager and compiled, with the values of
the portable variant and numpy; forced, held and untrialled selections; `python -m atensor.tune`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from atensor import Context, Tensor, jit
from atensor.backend.quant import kernels, tuning
from atensor.graph.quant import PackedShape, Q4_0, Q8_0
from atensor.nn.packed import PackedWeight
from atensor.tune import cache, family as tune, machine as machines
from tests.nn.test_packed import _packed

if kernels.library() is None:
    pytest.skip(f"the packed-weight kernels did not compile: {kernels.failure()}", allow_module_level=True)

SHAPES = [PackedShape(Q8_0, 128, 96), PackedShape(Q8_0, 64, 128)]  # tiny: a trial of milliseconds


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test measures afresh into its own cache file; selections go back to the defaults after."""
    monkeypatch.setenv("ATENSOR_TUNE_CACHE", str(tmp_path / "choices.json"))
    tune.reset_for_tests()
    tuning.forget_for_tests()
    yield
    tuning.forget_for_tests()
    tune.reset_for_tests()


def test_a_model_load_chooses_decode_and_prefill_kernels_that_every_qmatmul_then_runs():
    choices = {c.family: c for c in tuning.prepare_model(SHAPES)}
    assert set(choices) == {"quant.gemv_f32", "quant.rows_f32"}
    for name, choice in choices.items():
        assert choice.reason in ("measured", "only")
        assert kernels.selected(name.split(".")[1]).name == choice.alternative
        runs = {n for n in kernels.runnable(name.split(".")[1])}
        assert set(choice.times_s) <= runs and choice.alternative in runs
    data, expected = _packed(Q8_0, 128, 96, seed=3)
    w = PackedWeight.from_bytes(data, Q8_0, 128, 96)
    x = np.random.default_rng(4).standard_normal((1, 96)).astype(np.float32)
    chosen = choices["quant.gemv_f32"].alternative
    for native in ("0", "all"):  # eager (numpy backend: the C call) and a compiled kernel
        before = kernels.calls("gemv_f32", chosen)
        with Context(native=native if native == "all" else "jit"):
            got = w.linear(Tensor(x)).numpy()
        assert kernels.calls("gemv_f32", chosen) > before, f"the chosen {chosen} ran ({native})"
        np.testing.assert_allclose(got, x @ expected.T, atol=3e-5, rtol=0)
        np.testing.assert_allclose(got, kernels.matmul(x, data, w.shape, "portable", threads=1), atol=3e-5, rtol=0)


def test_a_jitted_step_chooses_on_the_shapes_of_its_compiled_kernels():
    data, expected = _packed(Q4_0, 64, 96, seed=5)
    w = PackedWeight.from_bytes(data, Q4_0, 64, 96)

    @jit
    def step(x):
        return w.linear(x).relu()
    x = np.random.default_rng(6).standard_normal((1, 96)).astype(np.float32)
    with Context(native="all"):
        for _ in range(3):
            out = step(Tensor(x)).numpy()
    made = {c.family: c for c in tune.made()}
    assert made["quant.gemv_f32"].shape_class == "q4_0 m1"
    np.testing.assert_allclose(out, np.maximum(x @ expected.T, 0), atol=3e-5, rtol=0)


def test_without_trials_every_family_runs_its_portable_variant():
    with Context(tune=False):
        choices = tuning.prepare_model(SHAPES)
    assert {(c.alternative, c.reason) for c in choices} == {("portable", "safe")}
    assert kernels.selected("gemv_f32").name == kernels.selected("rows_f32").name == "portable"


def test_the_override_forces_a_variant_and_an_unknown_one_is_refused():
    runs = kernels.runnable("gemv_f32")
    forced = runs[-1]
    with Context(kernels={"quant.gemv_f32": forced}):
        choice = tuning.prepare_model(SHAPES)[0]
    assert (choice.alternative, choice.reason) == (forced, "forced") and kernels.selected("gemv_f32").name == forced
    tuning.forget_for_tests()
    tune.reset_for_tests()
    with Context(kernels={"quant.gemv_f32": "avx9000"}):
        with pytest.raises(ValueError, match="quant.gemv_f32 has no alternative 'avx9000'"):
            tuning.prepare_model(SHAPES)


def test_a_callers_own_selection_is_left_as_it_is():
    try:
        kernels.select("gemv_f32", "portable")
        made = tuning.prepare_model(SHAPES)
        assert "quant.gemv_f32" not in {c.family for c in made}
        assert kernels.selected("gemv_f32").name == "portable"
    finally:
        kernels.select("gemv_f32", None)


def test_a_cached_choice_is_selected_without_a_trial():
    fam = tuning.family("gemv_f32")
    runs = kernels.runnable("gemv_f32")
    pick = runs[0] if len(runs) == 1 else runs[1]  # not the C default (the last, highest rank), where there is one
    cache.store(tune.key_for(fam, tuning.shape_class([tuning.Call(s, 1) for s in SHAPES])),
                cache.Record(pick, {pick: 1e-6}, "test", 0.0))
    choice = tuning.prepare([tuning.Call(s, 1) for s in SHAPES])[0]
    assert choice.reason in ("cached", "only") and kernels.selected("gemv_f32").name == pick


def test_the_command_lists_the_families_and_prints_the_cached_choices(tmp_path):
    fam = tuning.family("gemv_f32")
    file = tmp_path / "choices.json"
    cache.store(tune.key_for(fam, "q8_0 m1"), cache.Record("portable", {"portable": 2e-3, "avx2": 3e-3}, "x", 0.0))
    done = subprocess.run([sys.executable, "-m", "atensor.tune"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATENSOR_TUNE_CACHE": str(file)})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert machines.current().model in out and str(file) in out
    for name in ("quant.gemv_f32", "quant.gemv_q8", "quant.rows_f32", "quant.rows_q8"):
        assert f"\n{name}: " in out, out
    assert "cached [q8_0 m1]: portable; measured: portable 2000.0 us (1.00x), avx2 3000.0 us (1.50x)" in out
    assert "portable: rank 0 in the C table [safe path]" in out
    json.loads(file.read_text())  # still a whole file


def test_the_command_refuses_an_unknown_family_in_the_override():
    done = subprocess.run([sys.executable, "-m", "atensor.tune"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATENSOR_KERNELS": "quant.gemm=avx2"})
    assert done.returncode != 0 and "unknown kernel families ['quant.gemm']" in done.stderr


def test_a_trial_runs_each_shape_as_often_as_a_step_does():
    layer, output = PackedShape(Q8_0, 128, 96), PackedShape(Q8_0, 64, 128)
    calls = tuning._distinct([tuning.Call(layer, 1, 3), tuning.Call(output, 1), tuning.Call(layer, 1, 3)])
    assert calls == [tuning.Call(layer, 1, 6), tuning.Call(output, 1, 1)]
    run = tuning._alternative(kernels.variant("gemv_f32", "portable")).prepare(calls)
    before = kernels.calls("gemv_f32", "portable")
    run()
    assert kernels.calls("gemv_f32", "portable") == before + 7
