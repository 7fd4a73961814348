"""examples/train_gpt.py on a tiny configuration: its losses equal the PyTorch reference's (bench/torch_gpt.py)
from the same weights and batches on one and two devices and under mpiexec; a checkpoint loads into
transformers' GPT2LMHeadModel and gives atensor's held-out loss; a resumed run continues with the
uninterrupted run's losses; the command line trains under asyncio, writes its JSON, a profile with the
data pipeline's spans, and a sample."""
from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from atensor.nn.data import LMDataSpec, batches_of
from tests.torch_reference import needs_torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("atensor_example_train_gpt", ROOT / "examples" / "train_gpt.py")
train_gpt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = train_gpt
_spec.loader.exec_module(train_gpt)

pytest.importorskip("tokenizers", reason="the GPT example's tokenizer: pip install tokenizers")

TINY = dict(layers=2, heads=2, dim=32, context=16, vocab=300, batch=8, steps=20, warmup=5, lr=3e-3,
            train_files=20, heldout_files=3, eval_every=0, eval_batches=1, progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny run's settings (the tokenizer cached in a temporary folder), its data, and a
    checkpoint of its initial weights (a run of 0 steps)."""
    folder = tmp_path_factory.mktemp("gpt")
    cfg = train_gpt.RunConfig(**TINY, cache_dir=str(folder / "cache"))
    data = train_gpt.load_data(cfg)
    import trio
    trio.run(train_gpt.run, replace(cfg, steps=0, save=str(folder / "init")), data)
    return cfg, data, folder


def _torch_losses(cfg, data, init: Path) -> list[float]:
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    import torch_gpt
    torch.manual_seed(0)
    spec = LMDataSpec(cfg.batch, cfg.context, seed=cfg.seed, eot=0)
    batches = [(b.inputs, b.targets)
               for b in itertools.islice(batches_of(spec, data.documents(cfg.seed), data.encode), cfg.steps)]
    settings = torch_gpt.TrainSettings(cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps, cfg.weight_decay, cfg.clip)
    return torch_gpt.train(torch_gpt.load(init), batches, settings)


@pytest.fixture(scope="module")
def torch_losses(tiny) -> list[float]:
    """PyTorch's losses of the tiny run: one reference for every device count (it does not depend on it)."""
    cfg, data, folder = tiny
    return _torch_losses(cfg, data, folder / "init")


@needs_torch
@pytest.mark.parametrize("devices,rtol", [(1, 1e-4), (2, 1e-3)])
async def test_losses_over_20_steps_equal_the_pytorch_reference(tiny, torch_losses, devices, rtol):
    cfg, data, folder = tiny
    result = await train_gpt.run(replace(cfg, devices=devices, init=str(folder / "init")), data)
    want = torch_losses
    assert len(result.losses) == 20
    np.testing.assert_allclose(result.losses, want, rtol=rtol)
    assert result.losses[-1] < result.losses[0] - 0.3  # it learns


@needs_torch
async def test_a_checkpoint_loads_into_transformers_and_gives_atensors_held_out_loss(tiny):
    import torch
    import transformers
    cfg, data, folder = tiny
    out = folder / "trained"
    result = await train_gpt.run(replace(cfg, steps=4, eval_every=4, save=str(out)), data)
    assert {"model.safetensors", "config.json", "tokenizer.json", "training_state.safetensors"} <= \
        {p.name for p in out.iterdir()}
    model = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    batch = data.heldout[0]
    with torch.no_grad():
        logits = model(torch.from_numpy(batch.inputs.astype(np.int64))).logits
        hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                    torch.from_numpy(batch.targets.astype(np.int64)).reshape(-1))
    assert result.evals[-1]["loss"] == pytest.approx(float(hf_loss), rel=1e-5)
    # --eval FILE: the loss transformers computes with labels = the file's first `context` tokens
    source = data.corpus.heldout[0]
    eval_cfg, args = train_gpt.parse(["--init", str(out), "--steps", "0", "--eval", str(source)])
    got = await train_gpt.eval_file(eval_cfg, args.eval)
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(source.read_text()).ids[:cfg.context]
    with torch.no_grad():
        want = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert got == pytest.approx(float(want), rel=1e-5)


async def test_a_run_resumed_at_step_k_gives_the_uninterrupted_runs_losses(tiny):
    cfg, data, folder = tiny
    ckpt = folder / "resume"
    run = replace(cfg, steps=6, save=str(ckpt), save_every=3)
    whole = await train_gpt.run(run, data)
    resumed = await train_gpt.run(replace(run, save=None, save_every=0, resume=str(ckpt / "step-3")), data)
    assert [s.step for s in resumed.steps] == [3, 4, 5]
    np.testing.assert_allclose(resumed.losses, whole.losses[3:], rtol=1e-6)


def test_the_command_line_under_asyncio_writes_json_a_profile_with_data_spans_and_a_sample(tiny, tmp_path,
                                                                                          capsys):
    cfg, _, _ = tiny
    report, trace = tmp_path / "run.json", tmp_path / "trace.json"
    args = ["--layers", "2", "--heads", "2", "--dim", "32", "--context", "16", "--vocab", "300", "--batch", "4",
            "--steps", "6", "--train-files", "20", "--heldout-files", "3", "--eval-every", "3",
            "--eval-batches", "1", "--cache-dir", cfg.cache_dir, "--loop", "asyncio", "--json", str(report),
            "--profile", str(trace), "--sample", "def ", "--sample-tokens", "8"]
    train_gpt.main(args)
    out = capsys.readouterr()
    assert "tokens/s" in out.err and "ETA" in out.err and "held-out" in out.err
    assert "6 steps in" in out.out and "---- sample ----\ndef " in out.out
    record = json.loads(report.read_text())
    assert len(record["steps"]) == 6 and [e["step"] for e in record["evals"]] == [3, 6]
    assert record["peak_rss_bytes"] > 0 and record["tokens_per_second"] > 0
    assert all(s["tokens_per_second"] > 0 and s["grad_norm"] > 0 for s in record["steps"])
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    data_spans = [e for e in events if e.get("cat") == "data" and e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel" or e.get("args", {}).get("kind") == "kernel"]
    assert any(e["name"].startswith("tokenize") for e in data_spans) and kernels


def test_bad_settings_are_refused_with_what_to_do(tiny):
    with pytest.raises(SystemExit):
        train_gpt.parse(["--init", "a", "--resume", "b"])
    cfg, data, _ = tiny
    import trio
    with pytest.raises(ValueError, match="multiple of --devices"):
        trio.run(train_gpt.run, replace(cfg, batch=3, devices=2), data)
    with pytest.raises(FileNotFoundError, match="config.json"):
        trio.run(train_gpt.run, replace(cfg, init="/nonexistent"), data)


def test_under_mpiexec_two_ranks_give_the_one_process_losses(tiny, tmp_path):
    from tests.dist.test_mpi import HAVE_MPI4PY, MPIEXEC, mpiexec
    if MPIEXEC is None or not HAVE_MPI4PY:
        pytest.skip("needs mpi4py and mpiexec: pip install 'atensor[mpi]'")
    cfg, data, folder = tiny
    report = tmp_path / "mpi.json"
    done = mpiexec(2, "examples/train_gpt.py", "--layers", "2", "--heads", "2", "--dim", "32", "--context", "16",
                   "--vocab", "300", "--batch", "8", "--steps", "8", "--warmup", "5", "--lr", "3e-3",
                   "--train-files", "20", "--heldout-files", "3", "--eval-every", "0", "--cache-dir",
                   cfg.cache_dir, "--init", str(folder / "init"), "--json", str(report), "--quiet")
    assert done.returncode == 0, done.stderr
    got = [s["loss"] for s in json.loads(report.read_text())["steps"]]
    import trio
    want = trio.run(train_gpt.run, replace(cfg, steps=8, init=str(folder / "init")), data).losses
    np.testing.assert_allclose(got, want, rtol=1e-3)
