"""The flagship, examples/train.py: data parallel training gives the same losses on 1 and 2 devices,
learns the digits, and writes a profile and a safetensors file PyTorch can open."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the flagship trains on scikit-learn's bundled digits: "
                                      "pip install scikit-learn")

_PATH = Path(__file__).resolve().parents[2] / "examples" / "train.py"
_spec = importlib.util.spec_from_file_location("atensor_example_train", _PATH)
train = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = train
_spec.loader.exec_module(train)

DATA = train.load_digits(0)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
async def test_same_seed_gives_the_same_losses_on_one_and_two_devices(model):
    one = await train.train(devices=1, max_steps=4, batch_size=64, model=model, progress=False, data=DATA)
    two = await train.train(devices=2, max_steps=4, batch_size=64, model=model, progress=False, data=DATA)
    assert len(one.losses) == len(two.losses) == 4
    np.testing.assert_allclose(two.losses, one.losses, rtol=2e-5, atol=1e-6)
    assert one.accuracy == pytest.approx(two.accuracy, abs=1 / len(DATA.y_test) + 1e-9)


async def test_training_learns_the_digits():
    result = await train.train(devices=1, epochs=3, progress=False, data=DATA)
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert result.accuracy > 0.85


async def test_profile_and_save_write_a_perfetto_trace_and_weights_pytorch_opens(tmp_path):
    trace, weights = tmp_path / "trace.json", tmp_path / "model.safetensors"
    await train.train(devices=2, max_steps=2, batch_size=64, progress=False, data=DATA, profile=str(trace),
                      save=str(weights))
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e.get("name", "") for e in events}
    assert any("allreduce" in n.lower() or "copy" in n.lower() for n in names)  # the gradients' collective
    assert trace.with_suffix(".html").read_text().lower().startswith("<!doctype html")
    from safetensors.numpy import load_file
    state = load_file(str(weights))
    assert state["layers.0.weight"].shape == (256, 64) and state["layers.2.bias"].shape == (10,)
    try:  # and PyTorch opens it, when installed
        from safetensors.torch import load_file as torch_load_file
    except ImportError:
        return
    assert tuple(torch_load_file(str(weights))["layers.0.weight"].shape) == (256, 64)


def test_main_prints_a_summary(capsys):
    result = train.main(["--devices", "1", "--epochs", "1", "--batch", "256"])
    out = capsys.readouterr()
    assert "held-out accuracy" in out.out and "samples/s" in out.err
    assert len(result.losses) == len(DATA.x_train) // 256


async def test_training_quiets_the_collector_and_puts_its_settings_back():
    import gc
    before, was_frozen = gc.get_threshold(), gc.get_freeze_count()
    quiet = train.quiet_collector()
    try:
        assert gc.get_threshold()[0] >= 10_000 and gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > was_frozen  # the heap made so far is out of full collections
    finally:
        quiet.restore()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    await train.train(devices=1, max_steps=2, batch_size=64, progress=False, data=DATA, jit=False)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
