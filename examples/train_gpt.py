"""Train a GPT-2 on the Python standard library's source, data parallel, fed by an async data pipeline.

    python examples/train_gpt.py                            # 4 layers, dim 256, context 128: loss falls in ~2 min
    python examples/train_gpt.py --devices 2 --profile trace.json --json run.json
    python examples/train_gpt.py --steps 600 --save ckpt/ --sample "def "
    python examples/train_gpt.py --resume ckpt/step-300 --steps 600
    python examples/train_gpt.py --init ckpt/ --steps 0 --eval some_file.py     # prints {"eval_loss": x}
    mpiexec -n 2 python examples/train_gpt.py --devices 1   # 2 processes x 1 device

The corpus is this interpreter's standard library (`sysconfig.get_paths()["stdlib"]`, ~1,800 .py
files, 30 MB; nothing is downloaded), split into training and held-out files by a hash of each path
(atensor/nn/text.py). A byte-level BPE tokenizer (4096 tokens by default) is trained on the training
files once and cached under ~/.cache/atensor/tokenizers.

The model is GPT-2's (atensor/models/gpt2.py): learned token and position embeddings, pre-LayerNorm
blocks of causal self-attention and a tanh-GELU MLP, a final LayerNorm, the LM head tied to the token
embedding. AdamW (weight decay on the matrices only) with linear warmup and cosine decay, gradient
clipping at norm 1.

The data pipeline (atensor/nn/data.py) is a producer task on the same event loop as the training
loop: it tokenizes files in a worker thread, cuts the token stream into windows, shuffles them and
sends batches through a bounded channel (`--prefetch`), so data is ready while the devices compute.
`--loop trio` (default) or `--loop asyncio` runs the same program on either library.

The step is one `atensor.jit` function (forward, backward, allreduces, clipped AdamW update): its task
graphs are captured in the first steps and replayed after. `--devices N` trains data parallel over
CPU:0..N-1 (the batch split on axis 0, the gradient allreduced by tasks that overlap the backward);
under `mpiexec -n P` each process takes its rows of every global batch and the gradients are summed
across processes too. `--device CL` runs on OpenCL devices (pocl).

Checkpoints (`--save DIR`, `--save-every K` writes DIR/step-K too) are transformers' format:
model.safetensors with GPT2LMHeadModel's names, config.json, tokenizer.json;
`transformers.GPT2LMHeadModel.from_pretrained(DIR)` loads them. The optimizer state, the step and the
random state go in training_state.safetensors: `--resume DIR` continues with the losses an
uninterrupted run has.

A larger run: the defaults fit 2 cores (about 2 minutes to a visibly falling loss; ~4.5M parameters).
GPT-2 small is `--layers 12 --heads 12 --dim 768 --context 1024 --vocab 50257` (124M parameters): it
needs ~2 GB for weights, gradients and Adam state at float32 plus a few GB of activations per sequence, and on
a 2-core CPU about a minute per sequence; give it many cores, `--devices N` (one per core group) or
`mpiexec` over machines, and hours.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

import atensor
from atensor import Tensor, dist
from atensor.dist import profile as dist_profile
from atensor.models.gpt2 import GPT2, GPT2Config
from atensor.nn import optim
from atensor.nn.data import Batch, BatchPipeline, LMDataSpec, PipelineStats, batches_of
from atensor.nn.text import EOT, Corpus, bpe_tokenizer, read_text, stdlib_corpus
from atensor.tensor import random as atensor_random

TOKENIZER_FILE, STATE_FILE = "tokenizer.json", "training_state.safetensors"


# ---- settings ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on. The model's shape comes from here unless --init/--resume give it."""
    layers: int = 4
    heads: int = 4
    dim: int = 256
    context: int = 128
    vocab: int = 4096
    batch: int = 16
    steps: int = 200
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 20
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    devices: int = 1
    device: str = "CPU"
    jit: bool = True
    fused: bool = False                    # one flat parameter buffer (see Trainer)
    eval_every: int = 50
    eval_batches: int = 4
    prefetch: int = 4
    train_files: Optional[int] = None      # the first N training files only (tests, quick runs)
    heldout_files: Optional[int] = None
    cache_dir: Optional[str] = None        # the tokenizer cache (default ~/.cache/atensor/tokenizers)
    save: Optional[str] = None
    save_every: int = 0
    resume: Optional[str] = None
    init: Optional[str] = None
    profile: Optional[str] = None
    progress: bool = True

    def model_config(self) -> GPT2Config:
        return GPT2Config(vocab_size=self.vocab, context=self.context, layers=self.layers, heads=self.heads,
                          dim=self.dim)


# ---- results -----------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_second: float   # of the run so far
    seconds: float             # this step's wall time, waiting for its batch included


@dataclass
class Result:
    """What a run produced; `--json` writes it."""
    steps: list[StepRecord] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)         # {"step": k, "loss": x}
    seconds: float = 0.0
    tokens: int = 0
    tokens_per_second: float = 0.0
    stall_seconds: float = 0.0
    stall_fraction: float = 0.0
    tokenize_seconds: float = 0.0       # the pipeline's worker thread, tokenizing (hidden unless stalled)
    peak_rss_bytes: int = 0
    parameters: int = 0
    sample: Optional[str] = None
    config: dict = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]


class Progress:
    """A one-line progress bar on stderr: step, loss, held-out loss, tokens/s and the time left."""

    def __init__(self, first: int, total: int, enabled: bool):
        self.first, self.total, self.enabled = first, total, enabled and total > first
        self.start = time.perf_counter()
        self.heldout = ""

    def update(self, step: int, loss: float, tokens: int) -> None:
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        done = step - self.first
        eta = elapsed / done * (self.total - step) if done else 0.0
        width = 20
        bar = "#" * int(width * step / self.total) + "." * (width - int(width * step / self.total))
        sys.stderr.write(f"\r[{bar}] step {step}/{self.total} loss {loss:.4f}{self.heldout} "
                         f"{tokens / elapsed:,.0f} tokens/s ETA {_duration(eta)}  ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{s:02d}"


# ---- data --------------------------------------------------------------------------------------------
@dataclass
class Data:
    """The corpus, its tokenizer and the held-out batches."""
    corpus: Corpus
    tokenizer: Any
    heldout: list[Batch]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def documents(self, seed: int):
        """`documents(epoch)`: the training files' texts, in an order drawn for (seed, epoch)."""
        files = self.corpus.train

        def epoch_texts(epoch: int):
            for i in np.random.default_rng([seed, 1_000_003, epoch]).permutation(len(files)):
                yield read_text(files[i])
        return epoch_texts


def load_data(cfg: RunConfig, tokenizer: Any = None) -> Data:
    """The stdlib corpus (limited as the config says), the tokenizer (trained or cached, or the one
    given: a checkpoint's), and `eval_batches` held-out batches of `batch` windows."""
    corpus = stdlib_corpus().limited(cfg.train_files, cfg.heldout_files)
    if tokenizer is None:
        tokenizer = bpe_tokenizer(corpus, cfg.vocab, Path(cfg.cache_dir) if cfg.cache_dir else None)
    if tokenizer.get_vocab_size() != cfg.vocab:
        raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens, the model {cfg.vocab}")
    data = Data(corpus, tokenizer, [])
    spec = LMDataSpec(cfg.batch, cfg.context, seed=cfg.seed, eot=tokenizer.token_to_id(EOT), pool_batches=1)
    heldout_files = corpus.heldout

    def heldout_texts(epoch: int):  # in path order; repeated if the held-out files are short
        return (read_text(p) for p in heldout_files)
    stream = batches_of(spec, heldout_texts, data.encode)
    data.heldout = [next(stream) for _ in range(cfg.eval_batches)]
    return data


# ---- the run -----------------------------------------------------------------------------------------
class Trainer:
    """The model, the optimizer and the jitted step on this process's devices."""

    def __init__(self, cfg: RunConfig, model_cfg: GPT2Config, names: tuple[str, ...], world: dist.World):
        self.cfg, self.names, self.world = cfg, names, world
        made_on, atensor.settings.default_device = atensor.settings.default_device, names[0]
        try:  # the weights are made on the first device, then replicated on the rest
            Tensor.manual_seed(cfg.seed)
            self.model = GPT2(model_cfg)
        finally:
            atensor.settings.default_device = made_on
        state = self.model.state_dict()
        self.params = list(state.values())
        if len(names) > 1:
            for p in self.params:
                p.shard_(names)
        no_decay = [t for key, t in state.items() if t.ndim < 2 or ".ln_" in key]  # biases and norms
        # one gradient (and allreduce) per parameter by default: each parameter's allreduce starts as soon
        # as the backward has made its gradient, overlapping the rest of the backward. `fused` (one flat
        # buffer, one allreduce at the end) is measured 2.7x slower a step here: the scheduler fuses every
        # parameter's gradient into the one kernel that writes the flat gradient, matmuls as loop nests
        # (docs/training.md)
        self.opt = optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                               weight_decay=cfg.weight_decay, fused=cfg.fused, max_grad_norm=cfg.clip,
                               no_decay=no_decay)
        self.schedule = optim.WarmupCosineLR(self.opt, cfg.warmup, max(cfg.steps, 1), cfg.min_lr)
        self.global_tokens = cfg.batch * cfg.context  # the loss's divisor: a constant of the global batch
        self.step_fn = atensor.jit(self._step) if cfg.jit else self._step
        self.eval_fn = atensor.jit(self._eval) if cfg.jit else self._eval

    def _inputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if len(self.names) > 1:  # each device takes its rows (a copy per device inside the replay)
            x, y = x.shard(self.names, axis=0), y.shard(self.names, axis=0)
        return x, y

    async def _step(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        x, y = self._inputs(x, y)
        loss = self.model.loss(x, y, divisor=self.global_tokens)
        self.opt.zero_grad()
        loss.backward()
        dist.allreduce_gradients(self.opt)
        loss = dist.allreduce(loss.detach())
        update = self.opt.schedule_step()
        await loss.realize(self.opt.grad_norm, *update)  # forward, backward, allreduces, update: one graph
        return loss, self.opt.grad_norm

    async def _eval(self, x: Tensor, y: Tensor) -> Tensor:
        with Tensor.no_grad:
            x, y = self._inputs(x, y)
            loss = dist.allreduce(self.model.loss(x, y, divisor=self.global_tokens))
            await loss.realize()
        return loss

    def _on(self, batch: np.ndarray) -> Tensor:
        return Tensor(batch, device=self.names[0])

    async def train_step(self, batch: Batch) -> tuple[float, float]:
        loss, norm = await self.step_fn(self._on(batch.inputs), self._on(batch.targets))
        self.schedule.step()
        return float(loss.item()), float(norm.item())

    async def heldout_loss(self, batches: list[Batch]) -> float:
        rows = self.world.shard_rows(self.cfg.batch)
        total = 0.0
        for b in batches:
            loss = await self.eval_fn(self._on(b.inputs[rows.start:rows.stop]),
                                      self._on(b.targets[rows.start:rows.stop]))
            total += float(loss.item())
        return total / len(batches)

    # ---- checkpoints ---------------------------------------------------------------------------------
    async def save(self, directory: Path, step: int, tokenizer: Any) -> None:
        state = self.opt.state_dict()
        await Tensor.realize(*self.params, *state.values())
        if not self.world.is_root:
            return
        self.model.save_pretrained(directory)
        tokenizer.save(str(directory / TOKENIZER_FILE))
        seed, counter = atensor_random.get_state()
        meta = {"step": step, "rng_seed": seed, "rng_counter": counter, "run": asdict(self.cfg)}
        atensor.nn.safe_save({f"optimizer.{k}": v for k, v in state.items()}, str(directory / STATE_FILE),
                             metadata={"training": json.dumps(meta)})

    def load_state(self, directory: Path) -> dict:
        """Loads the optimizer state of `directory` (the weights come with `load_weights`); returns the
        saved metadata (step, random state, the run's settings)."""
        from safetensors import safe_open
        from safetensors.numpy import load_file
        path = directory / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: --resume takes a directory written by --save "
                                    f"(use --init for weights alone)")
        arrays = {k[len("optimizer."):]: v for k, v in load_file(str(path)).items()}
        self.opt.load_state_dict(arrays)
        with safe_open(str(path), "np") as f:
            meta = json.loads(f.metadata()["training"])
        return meta


async def run(cfg: RunConfig, data: Optional[Data] = None, sample: Optional[str] = None,
              sample_tokens: int = 200) -> Result:
    """Trains as `cfg` says (inside a trio or asyncio loop); returns the per-step records."""
    import anyio
    names = tuple(f"{cfg.device}:{k}" for k in range(cfg.devices))
    world = dist.init(names)
    if cfg.batch % (cfg.devices * world.size):
        raise ValueError(f"--batch ({cfg.batch}) must be a multiple of --devices ({cfg.devices}) times the "
                         f"processes ({world.size})")
    source = cfg.resume or cfg.init
    tokenizer = None
    if source is not None:  # the checkpoint's shape and tokenizer
        shape = GPT2.config_of(source)
        cfg = replace(cfg, layers=shape.layers, heads=shape.heads, dim=shape.dim, context=shape.context,
                      vocab=shape.vocab_size)
        if (Path(source) / TOKENIZER_FILE).exists():
            from tokenizers import Tokenizer
            tokenizer = Tokenizer.from_file(str(Path(source) / TOKENIZER_FILE))
    data = data or load_data(cfg, tokenizer)
    trainer = Trainer(cfg, cfg.model_config(), names, world)
    start_step = 0
    if source is not None:
        trainer.model.load_weights(source)
    if cfg.resume:
        meta = trainer.load_state(Path(cfg.resume))
        start_step = int(meta["step"])
        atensor_random.set_state(meta["rng_seed"], meta["rng_counter"])
        for _ in range(start_step):  # the schedule where the saved run was
            trainer.schedule.step()
    await Tensor.realize(*trainer.params, *trainer.opt.state)
    world.check_same(parameters=[(tuple(p.shape), p.dtype.name) for p in trainer.params],
                     settings=(cfg.batch, cfg.steps, cfg.lr, cfg.seed, cfg.jit, start_step))
    result = Result(parameters=cfg.model_config().parameters(), config=asdict(cfg))
    rows = world.shard_rows(cfg.batch)
    spec = LMDataSpec(cfg.batch, cfg.context, seed=cfg.seed, eot=data.tokenizer.token_to_id(EOT))
    pipeline = BatchPipeline(spec, data.documents(cfg.seed), data.encode, prefetch=cfg.prefetch,
                             start_step=start_step, rows=slice(rows.start, rows.stop))
    bar = Progress(start_step, cfg.steps, cfg.progress and world.is_root)
    profiler = atensor.profile() if cfg.profile else None
    tokens = 0
    start = time.perf_counter()
    if profiler is not None:
        profiler.__enter__()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.run)
            for step in range(start_step, cfg.steps):
                began = time.perf_counter()
                batch = await pipeline.next()
                assert batch.step == step, (batch.step, step)
                lr = trainer.schedule.last_lr
                loss, norm = await trainer.train_step(batch)
                tokens += cfg.batch * cfg.context
                elapsed = time.perf_counter() - start
                result.steps.append(StepRecord(step, loss, lr, norm, tokens / max(elapsed, 1e-9),
                                               time.perf_counter() - began))
                bar.update(step + 1, loss, tokens)
                done = step + 1
                if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
                    heldout = await trainer.heldout_loss(data.heldout)
                    result.evals.append({"step": done, "loss": heldout})
                    bar.heldout = f" held-out {heldout:.4f}"
                if cfg.save and cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                    await trainer.save(Path(cfg.save) / f"step-{done}", done, data.tokenizer)
            pipeline.close()
            tg.cancel_scope.cancel()
    finally:
        if profiler is not None:
            profiler.__exit__(None, None, None)
        bar.close()
    result.seconds = time.perf_counter() - start
    result.tokens = tokens
    result.tokens_per_second = tokens / max(result.seconds, 1e-9)
    result.stall_seconds = pipeline.stats.wait_ns / 1e9
    result.stall_fraction = result.stall_seconds / max(result.seconds, 1e-9)
    result.tokenize_seconds = pipeline.stats.encode_ns / 1e9
    result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not result.evals and cfg.eval_every:  # --steps 0 (or no step): the held-out loss of the weights
        result.evals.append({"step": start_step, "loss": await trainer.heldout_loss(data.heldout)})
    if profiler is not None:
        merged = dist_profile.merged(world, profiler)
        if merged is not None:
            merged.export(Path(cfg.profile))
            merged.export(Path(cfg.profile).with_suffix(".html"))
    if cfg.save:
        await trainer.save(Path(cfg.save), max(cfg.steps, start_step), data.tokenizer)
    if sample is not None:
        result.sample = await generate(trainer, data.tokenizer, sample, sample_tokens, cfg.seed)
    return result


async def generate(trainer: Trainer, tokenizer: Any, prompt: str, count: int, seed: int,
                   temperature: float = 0.8, top_k: int = 40) -> str:
    """`prompt` continued by `count` tokens sampled with `temperature` and `top_k` (numpy's generator
    seeded with `seed`). Every forward is over a full window of `context` tokens (the text right-padded
    with <|endoftext|>): the causal mask makes the padding invisible to the position read, and one
    shape means one compiled graph, replayed for every token."""
    context = trainer.model.config.context
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids or [tokenizer.token_to_id(EOT)]
    pad = tokenizer.token_to_id(EOT)
    rng = np.random.default_rng(seed)

    async def logits_of(window: Tensor) -> Tensor:
        with Tensor.no_grad:
            out = trainer.model(window)
            await out.realize()
        return out
    forward = atensor.jit(logits_of) if trainer.cfg.jit else logits_of
    for _ in range(count):
        window = ids[-context:]
        row = np.full((1, context), pad, np.int32)
        row[0, :len(window)] = window
        logits = (await forward(Tensor(row, device=trainer.names[0]))).numpy()[0, len(window) - 1]
        logits = logits.astype(np.float64) / temperature
        keep = np.argsort(logits)[-top_k:]
        p = np.exp(logits[keep] - logits[keep].max())
        ids.append(int(keep[rng.choice(len(keep), p=p / p.sum())]))
    return tokenizer.decode(ids)


async def eval_file(cfg: RunConfig, path: str) -> float:
    """The mean next-token loss over the first `context` tokens of the file (the loss transformers
    computes with `labels=input_ids` on them), with the weights of --init or --resume."""
    source = cfg.init or cfg.resume
    if source is None:
        raise ValueError("--eval needs weights: pass --init DIR (or --resume DIR)")
    from tokenizers import Tokenizer
    tokenizer_path = Path(source) / TOKENIZER_FILE
    if not tokenizer_path.exists():
        raise FileNotFoundError(f"{tokenizer_path} does not exist: --eval reads the checkpoint's tokenizer")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    model_cfg = GPT2.config_of(source)
    ids = tokenizer.encode(read_text(Path(path)), add_special_tokens=False).ids[:model_cfg.context]
    if len(ids) < 2:
        raise ValueError(f"{path} has {len(ids)} token(s); the loss needs at least 2")
    Tensor.manual_seed(cfg.seed)
    made_on, atensor.settings.default_device = atensor.settings.default_device, f"{cfg.device}:0"
    try:
        model = GPT2(model_cfg)
    finally:
        atensor.settings.default_device = made_on
    model.load_weights(source)
    tokens = np.array(ids, np.int32)[None]
    with Tensor.no_grad:
        loss = model.loss(Tensor(tokens[:, :-1], device=f"{cfg.device}:0"),
                          Tensor(tokens[:, 1:], device=f"{cfg.device}:0"))
        await loss.realize()
    return float(loss.item())


# ---- command line --------------------------------------------------------------------------------
def parse(argv: Optional[list[str]] = None) -> tuple[RunConfig, argparse.Namespace]:
    d = RunConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("A larger run"):])
    model = p.add_argument_group("model")
    model.add_argument("--layers", type=int, default=d.layers)
    model.add_argument("--heads", type=int, default=d.heads)
    model.add_argument("--dim", type=int, default=d.dim, help="the embedding width")
    model.add_argument("--context", type=int, default=d.context, help="tokens per sequence")
    model.add_argument("--vocab", type=int, default=d.vocab, help="BPE vocabulary size")
    train = p.add_argument_group("training")
    train.add_argument("--batch", type=int, default=d.batch, help="sequences per step (global, split over "
                                                                  "devices and processes)")
    train.add_argument("--steps", type=int, default=d.steps)
    train.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    train.add_argument("--min-lr", type=float, default=d.min_lr, help="learning rate at the end of the cosine")
    train.add_argument("--warmup", type=int, default=d.warmup, help="linear warmup steps")
    train.add_argument("--weight-decay", type=float, default=d.weight_decay)
    train.add_argument("--clip", type=float, default=d.clip, help="gradient norm clipping")
    train.add_argument("--seed", type=int, default=d.seed)
    train.add_argument("--devices", type=int, default=d.devices, help="devices of this process (data parallel)")
    train.add_argument("--device", choices=("CPU", "CL"), default=d.device,
                       help="the kind of the devices: CPU, or CL for OpenCL (pip install 'atensor[opencl]')")
    train.add_argument("--no-jit", action="store_true", help="build every step's graph (no capture/replay)")
    train.add_argument("--fused", action="store_true", help="one flat buffer for all parameters (one allreduce)")
    train.add_argument("--loop", choices=("trio", "asyncio"), default="trio", help="the event loop library")
    train.add_argument("--prefetch", type=int, default=d.prefetch, help="batches the pipeline may run ahead")
    data = p.add_argument_group("data and evaluation")
    data.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out loss every K steps (0: never)")
    data.add_argument("--eval-batches", type=int, default=d.eval_batches, help="held-out batches per evaluation")
    data.add_argument("--train-files", type=int, help="train on the first N training files only")
    data.add_argument("--heldout-files", type=int, help="evaluate on the first N held-out files only")
    data.add_argument("--cache-dir", help="where the tokenizer is cached (default ~/.cache/atensor/tokenizers)")
    data.add_argument("--eval", metavar="FILE", help="with --init DIR --steps 0: print {\"eval_loss\": x}, the "
                                                    "mean next-token loss over FILE's first --context tokens")
    out = p.add_argument_group("checkpoints and output")
    out.add_argument("--save", metavar="DIR", help="write a transformers checkpoint (and the optimizer state)")
    out.add_argument("--save-every", type=int, default=0, metavar="K", help="also write DIR/step-K every K steps")
    out.add_argument("--resume", metavar="DIR", help="continue the run saved in DIR")
    out.add_argument("--init", metavar="DIR", help="start from the weights in DIR")
    out.add_argument("--profile", metavar="TRACE.json", help="write a Perfetto trace and an HTML timeline")
    out.add_argument("--json", metavar="FILE", help="write per-step loss, held-out loss, tokens/s, peak memory")
    out.add_argument("--sample", metavar="PROMPT", help="print generated text after training")
    out.add_argument("--sample-tokens", type=int, default=200)
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if a.resume and a.init:
        p.error("pass --resume DIR (weights and optimizer state) or --init DIR (weights), not both")
    if a.eval and not (a.init or a.resume):
        p.error("--eval FILE needs --init DIR (the weights to evaluate)")
    cfg = RunConfig(layers=a.layers, heads=a.heads, dim=a.dim, context=a.context, vocab=a.vocab, batch=a.batch,
                    steps=a.steps, lr=a.lr, min_lr=a.min_lr, warmup=a.warmup, weight_decay=a.weight_decay,
                    clip=a.clip, seed=a.seed, devices=a.devices, device=a.device, jit=not a.no_jit, fused=a.fused,
                    eval_every=a.eval_every, eval_batches=a.eval_batches, prefetch=a.prefetch,
                    train_files=a.train_files, heldout_files=a.heldout_files, cache_dir=a.cache_dir,
                    save=a.save, save_every=a.save_every, resume=a.resume, init=a.init, profile=a.profile,
                    progress=not a.quiet)
    return cfg, a


def write_json(result: Result, path: str) -> None:
    record = asdict(result)
    Path(path).write_text(json.dumps(record, indent=1) + "\n")


def main(argv: Optional[list[str]] = None) -> Optional[Result]:
    # the tokenizer's encode calls run in the pipeline's worker thread beside the training: one thread
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg, a = parse(argv)
    import anyio
    if a.eval and cfg.steps == 0:
        loss = anyio.run(eval_file, cfg, a.eval, backend=a.loop)
        print(json.dumps({"eval_loss": loss}))
        return None
    result = anyio.run(lambda: run(cfg, sample=a.sample, sample_tokens=a.sample_tokens), backend=a.loop)
    world = dist.world()
    if not world.is_root:
        return result
    if a.json:
        write_json(result, a.json)
    processes = f" x {world.size} processes" if world.size > 1 else ""
    if result.steps:
        first, last = result.steps[0].loss, result.steps[-1].loss
        print(f"{len(result.steps)} steps in {result.seconds:.1f} s ({result.tokens_per_second:,.0f} tokens/s) "
              f"on {cfg.devices} device(s){processes}; loss {first:.3f} -> {last:.3f}; data: "
              f"{result.tokenize_seconds:.1f} s tokenizing, stalled {100 * result.stall_fraction:.2f}% of the time; "
              f"peak RSS {result.peak_rss_bytes / 2**20:,.0f} MiB")
    if result.evals:
        print(f"held-out loss {result.evals[-1]['loss']:.4f} at step {result.evals[-1]['step']}")
    if cfg.profile:
        print(f"profile: {cfg.profile} (Perfetto) and {Path(cfg.profile).with_suffix('.html')} (timeline)")
    if cfg.save:
        print(f"checkpoint: {cfg.save} (transformers.GPT2LMHeadModel.from_pretrained reads it)")
    if result.sample is not None:
        print("---- sample ----")
        print(result.sample)
    return result


if __name__ == "__main__":
    main()
