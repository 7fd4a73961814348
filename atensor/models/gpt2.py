"""GPT-2 (Radford et al. 2019) in atensor ops, trainable, with transformers' names and layouts.

Why this module: the training flagship (examples/train_gpt.py) trains a GPT-2 and its checkpoints must
be read by other tools. The attribute tree of `GPT2` *is* the checkpoint's key space: `get_state_dict`
of a model gives exactly transformers' `GPT2LMHeadModel` names (transformer.wte.weight,
transformer.h.0.attn.c_attn.weight, ...), and the projections are transformers' `Conv1D`, whose weight
is (in, out) and computes x @ W + b. So saving is writing the state dict, and loading a checkpoint
that transformers wrote is loading it back; no renaming table to keep in step.

The model, as GPT-2 and nanoGPT have it:

    x = wte[idx] + wpe[0:T]
    per block: x = x + c_proj(attention(c_attn(ln_1(x))))     (causal, `heads` heads)
               x = x + c_proj(gelu_tanh(c_fc(ln_2(x))))
    logits   = ln_f(x) @ wte^T                                 (the LM head tied to the token embedding)

The embeddings are gathers (`weight[idx]`), whose gradient is a scatter-add: cheaper than the one-hot
matmul of `nn.Embedding` when the vocabulary is in the thousands. Initialization is GPT-2's: normal
with std 0.02, the residual projections' std scaled by 1/sqrt(2 * layers), biases zero, LayerNorms one
and zero; drawn from atensor's counter-based generator, so a seed gives the same weights on any number
of devices.

A checkpoint directory (`save_pretrained`, `from_pretrained`) holds `model.safetensors` (float32,
without lm_head.weight: it is tied, as transformers' save_pretrained writes it) and `config.json`,
which `transformers.GPT2LMHeadModel.from_pretrained(dir)` accepts.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from atensor.nn import LayerNorm, parameter
from atensor.nn.losses import sparse_categorical_crossentropy
from atensor.nn.state import get_state_dict, load_state_dict, safe_save
from atensor.tensor.tensor import Tensor

WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"


@dataclass(frozen=True)
class GPT2Config:
    """The shape of a GPT-2: vocabulary, context length, layers, heads and width."""
    vocab_size: int = 4096
    context: int = 128
    layers: int = 4
    heads: int = 4
    dim: int = 256
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"--dim ({self.dim}) must be a multiple of --heads ({self.heads})")
        for name in ("vocab_size", "context", "layers", "heads", "dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPT2Config.{name} must be positive, got {getattr(self, name)}")

    def parameters(self) -> int:
        """The number of trained values (the tied head counted once)."""
        d = self.dim
        block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return self.vocab_size * d + self.context * d + self.layers * block + 2 * d

    def hf_config(self) -> dict:
        """The config.json transformers' GPT2LMHeadModel.from_pretrained reads for this shape."""
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": self.vocab_size,
                "n_positions": self.context, "n_ctx": self.context, "n_embd": self.dim,
                "n_layer": self.layers, "n_head": self.heads, "n_inner": None,
                "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "layer_norm_epsilon": self.layer_norm_epsilon, "initializer_range": 0.02,
                "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0,
                "torch_dtype": "float32"}

    @classmethod
    def from_hf_config(cls, config: dict) -> GPT2Config:
        """The shape a transformers GPT-2 config.json describes; raises on what this model cannot run."""
        if config.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"config.json describes a {config.get('model_type')!r} model, not gpt2")
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"activation_function {config['activation_function']!r}: this GPT-2 computes "
                             f"the tanh GELU (gelu_new) only")
        if config.get("n_inner") not in (None, 4 * config["n_embd"]):
            raise ValueError(f"n_inner {config['n_inner']}: this GPT-2's MLP is 4 * n_embd wide")
        return cls(vocab_size=config["vocab_size"], context=config["n_positions"], layers=config["n_layer"],
                   heads=config["n_head"], dim=config["n_embd"],
                   layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5))


def _normal(*shape: int, std: float) -> Tensor:
    return parameter(Tensor.normal(*shape, std=std))


class Conv1D:
    """transformers' Conv1D: y = x @ weight + bias with weight (in_features, out_features)."""

    def __init__(self, in_features: int, out_features: int, std: float = 0.02):
        self.weight = _normal(in_features, out_features, std=std)
        self.bias = parameter(Tensor.zeros(out_features))

    def __call__(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class EmbeddingTable:
    """A lookup table (rows, dim) read by a gather; its gradient is a scatter-add into the rows read."""

    def __init__(self, rows: int, dim: int, std: float = 0.02):
        self.weight = _normal(rows, dim, std=std)

    def __call__(self, idx: Tensor) -> Tensor:
        return self.weight[idx]


class Attention:
    """Causal multi-head self-attention: one projection to queries, keys and values, one out."""

    def __init__(self, config: GPT2Config):
        self.heads = config.heads
        self.c_attn = Conv1D(config.dim, 3 * config.dim)
        self.c_proj = Conv1D(config.dim, config.dim, std=0.02 / math.sqrt(2 * config.layers))

    def __call__(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        qkv = self.c_attn(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                    # (b, heads, t, head_dim)
        y = q.scaled_dot_product_attention(k, v, is_causal=True)
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(b, t, d))


class MLP:
    """dim -> 4 dim, GELU (tanh), -> dim."""

    def __init__(self, config: GPT2Config):
        self.c_fc = Conv1D(config.dim, 4 * config.dim)
        self.c_proj = Conv1D(4 * config.dim, config.dim, std=0.02 / math.sqrt(2 * config.layers))

    def __call__(self, x: Tensor) -> Tensor:
        return self.c_proj(self.c_fc(x).gelu(approximate="tanh"))


class Block:
    """A pre-LayerNorm transformer block."""

    def __init__(self, config: GPT2Config):
        eps = config.layer_norm_epsilon
        self.ln_1, self.attn = LayerNorm(config.dim, eps=eps), Attention(config)
        self.ln_2, self.mlp = LayerNorm(config.dim, eps=eps), MLP(config)

    def __call__(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer:
    """Embeddings, blocks and the final LayerNorm (transformers' GPT2Model, named `transformer`)."""

    def __init__(self, config: GPT2Config):
        self.wte = EmbeddingTable(config.vocab_size, config.dim)
        self.wpe = EmbeddingTable(config.context, config.dim)
        self.h = [Block(config) for _ in range(config.layers)]
        self.ln_f = LayerNorm(config.dim, eps=config.layer_norm_epsilon)


class GPT2:
    """GPT-2 with the LM head tied to the token embedding; `model(idx)` gives logits (b, t, vocab).

        >>> model = GPT2(GPT2Config(vocab_size=64, context=8, layers=1, heads=2, dim=16))
        >>> model(Tensor(np.zeros((2, 8), np.int32))).shape
        (2, 8, 64)
        >>> sorted(model.state_dict())[:2]
        ['transformer.h.0.attn.c_attn.bias', 'transformer.h.0.attn.c_attn.weight']
    """

    def __init__(self, config: GPT2Config):
        self.config = config
        self.transformer = Transformer(config)

    def __call__(self, idx: Tensor) -> Tensor:
        t = idx.shape[-1]
        if t > self.config.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the context ({self.config.context})")
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe.weight[:t]
        for block in tr.h:
            x = block(x)
        return tr.ln_f(x) @ tr.wte.weight.T

    def loss(self, idx: Tensor, targets: Tensor, divisor: Optional[int] = None) -> Tensor:
        """The next-token cross entropy of `targets` (b, t) given `idx` (b, t): summed and divided by
        `divisor` (default: the number of tokens). Data-parallel training passes the global batch's
        token count, a constant, so every device computes its gradient's scale for itself."""
        logits = self(idx)
        total = sparse_categorical_crossentropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                reduction="sum")
        return total / (divisor if divisor is not None else targets.numel())

    def state_dict(self) -> dict[str, Tensor]:
        """The weights under transformers' GPT2LMHeadModel names (lm_head.weight omitted: tied)."""
        return {key: value for key, value in get_state_dict(self.transformer, "transformer.").items()}

    # ---- checkpoints -----------------------------------------------------------------------------
    def save_pretrained(self, directory: Union[str, Path]) -> Path:
        """Writes model.safetensors and config.json into `directory` (made if missing). Realize the
        weights first when called inside an event loop."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        safe_save(self.state_dict(), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
        (directory / CONFIG_FILE).write_text(json.dumps(self.config.hf_config(), indent=2) + "\n")
        return directory

    def load_weights(self, directory: Union[str, Path]) -> list[Tensor]:
        """Assigns the weights of `directory`'s model.safetensors (lazily; the returned tensors realize
        them). Checks the shapes; a lm_head.weight, when present, must equal the token embedding."""
        from safetensors.numpy import load_file
        path = Path(directory) / WEIGHTS_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: --init and --resume take a directory "
                                    f"written by --save (or transformers' save_pretrained)")
        arrays = load_file(str(path))
        head = arrays.pop("lm_head.weight", None)
        if head is not None and not np.array_equal(head, arrays.get("transformer.wte.weight")):
            raise ValueError(f"{path}: lm_head.weight differs from transformer.wte.weight; this GPT-2 ties them")
        stray = sorted(k for k in arrays if not k.startswith("transformer."))
        if stray:
            raise KeyError(f"{path}: keys outside transformer.*: {stray}; expected GPT2LMHeadModel names")
        prefix = len("transformer.")
        weights = {key[prefix:]: value for key, value in arrays.items()
                   if not key.endswith((".attn.bias", ".attn.masked_bias"))}  # old transformers' mask buffers
        return load_state_dict(self.transformer, weights)

    @classmethod
    def config_of(cls, directory: Union[str, Path]) -> GPT2Config:
        """The shape of the model in `directory` (its config.json)."""
        path = Path(directory) / CONFIG_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: a checkpoint directory holds config.json "
                                    f"and {WEIGHTS_FILE}")
        return GPT2Config.from_hf_config(json.loads(path.read_text()))
