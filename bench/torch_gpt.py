"""The reference for examples/train_gpt.py: the same GPT-2 and training step in PyTorch.

Why a model of our own and not transformers' GPT2LMHeadModel: the reference must be the same
computation as atensor's, written plainly (tests compare losses at relative 1e-4), and the benchmark
must time PyTorch's own kernels, eager and under `torch.compile`, without transformers' dispatch
around them. transformers is the *independent* check of the checkpoint format instead
(tests/examples/test_train_gpt.py loads a checkpoint into GPT2LMHeadModel).

Same model (atensor/models/gpt2.py): GPT-2 with Conv1D projections, weight (in, out); tied head;
tanh GELU; LayerNorm eps from config.json. Same training: AdamW, betas (0.9, 0.95), eps 1e-8,
weight decay on every tensor of two or more axes except LayerNorms' (biases and norms in a group
without decay), linear warmup then cosine to min_lr, gradients clipped at `clip` by
`torch.nn.utils.clip_grad_norm_`, loss the mean next-token cross entropy of the batch.

torch is a bench and test dependency only; atensor never imports this module.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    vocab: int
    context: int
    layers: int
    heads: int
    dim: int
    eps: float = 1e-5

    @classmethod
    def of(cls, directory: Path) -> Shape:
        c = json.loads((Path(directory) / "config.json").read_text())
        return cls(c["vocab_size"], c["n_positions"], c["n_layer"], c["n_head"], c["n_embd"],
                   c.get("layer_norm_epsilon", 1e-5))


class Conv1D(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads = s.heads
        self.c_attn, self.c_proj = Conv1D(s.dim, 3 * s.dim), Conv1D(s.dim, s.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(s.dim, 4 * s.dim), Conv1D(4 * s.dim, s.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(s.dim, eps=s.eps), Attention(s)
        self.ln_2, self.mlp = nn.LayerNorm(s.dim, eps=s.eps), MLP(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT2(nn.Module):
    """GPT-2 with transformers' parameter names; `model(idx)` gives the logits."""

    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(s.vocab, s.dim), wpe=nn.Embedding(s.context, s.dim),
            h=nn.ModuleList(Block(s) for _ in range(s.layers)), ln_f=nn.LayerNorm(s.dim, eps=s.eps)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe.weight[:idx.shape[1]]
        for block in tr.h:
            x = block(x)
        return F.linear(tr.ln_f(x), tr.wte.weight)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load(directory: Path) -> TorchGPT2:
    """The model of a checkpoint directory (config.json and model.safetensors)."""
    from safetensors.torch import load_file
    model = TorchGPT2(Shape.of(directory))
    state = load_file(str(Path(directory) / "model.safetensors"))
    state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KeyError(f"checkpoint {directory}: missing {missing}, unexpected {unexpected}")
    return model


def lr_at(step: int, lr: float, warmup: int, total: int, min_lr: float) -> float:
    """Linear warmup to `lr` over `warmup` steps, then a half cosine to `min_lr` at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


@dataclass(frozen=True)
class TrainSettings:
    lr: float
    min_lr: float
    warmup: int
    steps: int
    weight_decay: float
    clip: float


def optimizer(model: TorchGPT2, t: TrainSettings) -> torch.optim.AdamW:
    decay = [p for name, p in model.named_parameters() if p.ndim >= 2 and ".ln_" not in name]
    rest = [p for name, p in model.named_parameters() if not (p.ndim >= 2 and ".ln_" not in name)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=t.lr, betas=(0.9, 0.95), eps=1e-8)


def train(model: TorchGPT2, batches: Iterable[tuple[np.ndarray, np.ndarray]], t: TrainSettings,
          step_fn: Optional[object] = None) -> list[float]:
    """Trains on `batches` ((inputs, targets) int arrays); returns each step's loss."""
    opt = optimizer(model, t)
    losses = []
    model.train()
    for step, (x, y) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t.lr, t.warmup, t.steps, t.min_lr)
        loss = train_step(model, opt, torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)),
                          t.clip, step_fn)
        losses.append(loss)
    return losses


def train_step(model: TorchGPT2, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, clip: float,
               loss_fn: Optional[object] = None) -> float:
    """One step: forward, backward, clip, AdamW; the loss as a float (read each step, as a loop does)."""
    loss = (loss_fn or model.loss)(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return float(loss.item())
