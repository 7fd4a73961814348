"""A llama decoder (SmolLM2-135M) in atensor ops, with a KV cache written at Variable positions.

Why: an LLM streaming tokens is the most common async inference application, and it is where a blocked
event loop hurts most. This is the model of tinygrad's extra/models/llama.py, loaded from a GGUF file:

    x = embed[tokens]
    per layer : h = x + Wo . attention(rope(Wq n), rope(Wk n), Wv n),  n = rmsnorm(x)
                x = h + Wdown . (silu(Wgate m) * Wup m),                m = rmsnorm(h)
    logits    = rmsnorm(x) @ embed^T                                    (tied output)

Weights: by default each projection and the embedding stay as the file stores them (Q4_1, Q8_0, ...:
`PackedWeight`, nn/packed.py), memory-mapped, multiplied by C kernels that decode each block in
registers, so the model holds about the file's bytes (98 MB for SmolLM2, not 538 MB of float32);
`weights="float32"` dequantizes them at load instead. Both compute with the same weight values.

RoPE is applied in GGUF's interleaved layout (pairs (2i, 2i+1) rotate together), the layout the file
stores q and k in, so the weights are used without a permute. Grouped-query attention goes through
`Tensor.scaled_dot_product_attention(enable_gqa=True)`.

The KV cache: per layer, one persistent tensor of shape (slots, 2, kv_heads, context, head_dim), keys
and values side by side. A forward over L tokens of row b writes its keys and values with one `assign`
(one kernel) into a shrink of its slot at [start, start + L), where `start` is a bound `Variable`: the kernels and task graph are the same for
every position, so a jitted decode step is replayed with the next position bound, never recaptured.
Attention reads the first `window` cells of the row's slot (`window` is the mask's last axis) with an
additive mask (0 for the cells the row may see, -inf elsewhere), so shapes depend on the window, a
bucket the engine picks (generation.py), never on the position itself. Rows are independent: a batch of slots,
each at its own position, is one decode step (continuous batching, examples/serve_llm.py).

Invariant: a slot's cells [0, start + L) hold the keys and values of its tokens at those positions once
the step is realized; cells beyond are stale and always masked. A forward's window covers
[0, start + L) of every row (the caller's duty: a Variable start is not known when the step is traced).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from atensor.backend.quant import tuning as quant_tuning
from atensor.graph.quant import FORMATS
from atensor.graph.symbolic import Variable
from atensor.hcq.device import Device
from atensor.models.gguf import GGUFModel, LlamaConfig, load_gguf
from atensor.nn.packed import PackedWeight, wrap_array
from atensor.profiler import collector
from atensor.tensor.tensor import Tensor

Position = Union[int, Variable]
NEG_INF = float("-inf")


def rope_tables(config: LlamaConfig, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's rotation angles, (length, head_dim / 2) float32 (llama.cpp's
    theta_i = base^(-2i / head_dim))."""
    half = config.head_dim // 2
    inv = 1.0 / (config.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / config.head_dim))
    angles = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates interleaved pairs of the last axis: x is (B, L, H, D); cos and sin are (B, L, 1, D/2)."""
    b, length, heads, dim = x.shape
    pairs = x.reshape(b, length, heads, dim // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return (even * cos - odd * sin).stack(even * sin + odd * cos, dim=-1).reshape(b, length, heads, dim)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    return x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt() * weight


WEIGHTS = ("packed", "q8act", "float32")  # how a model holds its projections (Llama's `weights`)


class Projections:
    """Several projections of one input, (out_i, in) each as the file stores them: packed, one QMATMUL
    per projection straight from the file's blocks (nn/packed.py); float32, one matmul of their
    concatenated (in, sum out_i) weights, split after."""

    def __init__(self, parts: list[Union[PackedWeight, np.ndarray]], device: str):
        self.sizes = [p.rows if isinstance(p, PackedWeight) else p.shape[0] for p in parts]
        if all(isinstance(p, PackedWeight) for p in parts):
            self.packed: Optional[list[PackedWeight]] = parts  # type: ignore[assignment]
            self.dense: Optional[Tensor] = None
        else:
            dense = [p.dequantize().numpy() if isinstance(p, PackedWeight) else p for p in parts]
            self.packed = None
            self.dense = Tensor(np.ascontiguousarray(np.concatenate(dense, 0).T, dtype=np.float32), device=device)

    def __call__(self, x: Tensor) -> list[Tensor]:
        if self.packed is not None:
            return [w.linear(x) for w in self.packed]
        y = x @ self.dense
        if len(self.sizes) == 1:
            return [y]
        bounds = np.cumsum([0] + self.sizes)
        return [y[..., int(a):int(b)] for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class _Layer:
    attn_norm: Tensor
    qkv: Projections      # q, k, v projections of the normed input
    wo: Projections
    ffn_norm: Tensor
    gate_up: Projections  # gate and up
    down: Projections
    cache: Tensor    # (slots, 2, Hkv, context, D): keys at [:, 0], values at [:, 1]


class Llama:
    """A llama decoder with a KV cache of `slots` rows of `context` positions each.

        model = Llama.from_gguf(slots=1, context=512)
        ids = Tensor(np.array([[504, 3575]], np.int32))
        logits = model.forward(ids, Tensor(model.position_ids(2, [0])), model.causal_mask(2, [0]), [0])

    `weights="packed"` (the default) keeps the file's Q4_0 / Q4_1 / Q8_0 / F16 / BF16 tensors as they
    are stored, memory-mapped, and multiplies by them in C kernels that decode each block in registers
    (nn/packed.py); a tensor of another type is dequantized to float32. `weights="float32"`
    dequantizes everything to float32 (the previous model; 5.5x the file's bytes for SmolLM2).
    `weights="q8act"` keeps them packed and multiplies with llama.cpp's numerics: each row of
    activations quantized to Q8_0 per 32 values, integer block dot products (faster; the results
    change by the activations' rounding, so greedy ids may differ from transformers').
    """

    def __init__(self, gguf: GGUFModel, slots: int = 1, context: int = 512, device: str = "CPU",
                 weights: str = "packed"):
        cfg = gguf.config
        if context > cfg.context_length:
            raise ValueError(f"context {context} is longer than the model's {cfg.context_length}")
        if weights not in WEIGHTS:
            raise ValueError(f"weights={weights!r}: a model holds its weights as one of {WEIGHTS}")
        if weights == "packed" and Device.get(device).cl is not None:
            raise ValueError(f"{device}: packed weights do not render to OpenCL (their kernels are C calls); "
                             f"load the model with weights='float32' there (examples/generate.py --dtype float32)")
        self.config, self.slots, self.context, self.weights = cfg, slots, context, weights
        with collector.host_span(f"load {gguf.path.name} ({weights})", "load"):
            self._load(gguf, slots, context, device, weights)

    def _load(self, gguf: GGUFModel, slots: int, context: int, device: str, weights: str) -> None:
        cfg = gguf.config
        w = gguf.weights

        def t(array: np.ndarray) -> Tensor:
            return Tensor(np.ascontiguousarray(array, dtype=np.float32), device=device)

        def part(name: str) -> Union[PackedWeight, np.ndarray]:
            """A projection (out, in) as the file stores it when packed, else its float32 array."""
            if weights != "float32":
                stored = gguf.stored(name)
                fmt = FORMATS.get(stored.type_name.lower())
                if fmt is not None and len(stored.shape) == 2:
                    return PackedWeight.from_bytes(stored.data, fmt, *stored.shape, device=device,
                                                   activations="q8_0" if weights == "q8act" else "float32")
            return w[name]

        def vector(name: str) -> Tensor:  # a norm's weights: float32 in the file, used in place
            if weights != "float32":
                stored = gguf.stored(name)
                if stored.type_name == "F32":
                    return wrap_array(stored.data.reshape(stored.shape), device)
            return t(w[name])

        embed = part("token_embd.weight")  # (vocab, dim)
        self.embed = embed if isinstance(embed, PackedWeight) else t(embed)
        self.device = self.embed.device
        tied = "output.weight" not in w
        self.output = Projections([embed if tied else part("output.weight")], device)  # logits = x . output^T
        self.norm = vector("output_norm.weight")
        shape = (slots, 2, cfg.n_kv_heads, context, cfg.head_dim)
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            qkv = Projections([part(p + "attn_q.weight"), part(p + "attn_k.weight"), part(p + "attn_v.weight")],
                              device)
            gate_up = Projections([part(p + "ffn_gate.weight"), part(p + "ffn_up.weight")], device)
            self.layers.append(_Layer(vector(p + "attn_norm.weight"), qkv,
                                      Projections([part(p + "attn_output.weight")], device),
                                      vector(p + "ffn_norm.weight"), gate_up,
                                      Projections([part(p + "ffn_down.weight")], device),
                                      Tensor(np.zeros(shape, np.float32), device=device)))
        cos, sin = rope_tables(cfg, context)
        self.rope_cos, self.rope_sin = t(cos), t(sin)
        # the packed kernels' variants, chosen by a trial on this model's shapes (atensor/tune/): a layer's
        # projections (every layer's are the same) and the output's, which a prefill runs on its last rows only
        layer = [p.shape for proj in (self.layers[0].qkv, self.layers[0].wo, self.layers[0].gate_up,
                                      self.layers[0].down) for p in proj.packed or ()] if self.layers else []
        output = [p.shape for p in self.output.packed or ()]
        quant_tuning.prepare_model(layer, output, layers=cfg.n_layers)

    @staticmethod
    def from_gguf(path: Optional[str] = None, slots: int = 1, context: int = 512, device: str = "CPU",
                  gguf: Optional[GGUFModel] = None, weights: str = "packed") -> Llama:
        """The model of a GGUF file (default: the installed SmolLM2-135M-Instruct), its weights packed
        as stored (or `weights="float32"`)."""
        return Llama(gguf if gguf is not None else load_gguf(path), slots, context, device, weights)

    # ---- inputs a forward needs, made on the host -------------------------------------------------------
    def causal_mask(self, length: int, starts: Sequence[int], lengths: Optional[Sequence[int]] = None,
                    window: Optional[int] = None) -> Tensor:
        """The additive (B, 1, L, window) mask of rows whose L tokens start at `starts`: token i of row b
        sees cells [0, starts[b] + i] of the first `window` cells (default: the whole context).
        `lengths` (real tokens per row, the rest padding) changes nothing for the real tokens; it is
        accepted so callers state it."""
        return Tensor(self.mask_array(length, starts, window), device=self.device)

    def mask_array(self, length: int, starts: Sequence[int], window: Optional[int] = None) -> np.ndarray:
        """`causal_mask` as a numpy array."""
        window = self.context if window is None else window
        if not 0 < window <= self.context:
            raise ValueError(f"an attention window of {window} cells; it must be in [1, {self.context}]")
        need = max(starts) + length
        if need > window:
            raise ValueError(f"rows reaching position {need - 1} need a window of at least {need} cells, "
                             f"got {window}")
        cells = np.arange(window)[None, None, :]
        last = np.asarray(starts)[:, None, None] + np.arange(length)[None, :, None]
        return np.where(cells <= last, 0.0, NEG_INF).astype(np.float32)[:, None]

    def position_ids(self, length: int, starts: Sequence[int]) -> np.ndarray:
        """(B * L,) int32 positions of the rows' tokens (clipped into the RoPE table for padding)."""
        pos = np.asarray(starts)[:, None] + np.arange(length)[None, :]
        return np.minimum(pos, self.context - 1).astype(np.int32).reshape(-1)

    # ---- the forward pass ---------------------------------------------------------------------------------
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor, starts: Sequence[Position],
                first_slot: Position = 0, last: Optional[Tensor] = None,
                slots: Optional[Sequence[Position]] = None) -> Tensor:
        """Logits (B, L, vocab) of `tokens` (B, L) int32, or (B, vocab) of the token at index `last` (B,)
        int32 of each row. Row b's keys and values are written into cache slot `first_slot + b` at
        [starts[b], starts[b] + L); `positions` (B * L,) are the tokens' RoPE positions and `mask` the
        additive (B, 1, L, window) attention mask (see `causal_mask`): attention reads the first
        `window` cells of each slot, which must cover [0, start + L) of every row. `first_slot` and
        `starts` may be bound Variables (one program for every slot and position).

        With `slots`, row b is written into slot `slots[b]` instead (any slots, in any order; bound
        Variables too) and attends over the first `window` cells of that slot: a batch of any slots in
        use (a prefill's prompts, a decode step's streams) is as many rows as there are streams, wherever
        their slots are. Two rows with the same slot must carry the same tokens at the same starts (a
        padding row repeats a real one: the same writes)."""
        cfg = self.config
        b, length = tokens.shape
        if len(starts) != b:
            raise ValueError(f"forward: {b} rows need {b} starts, got {len(starts)}")
        window = mask.shape[-1]
        if mask.ndim != 4 or mask.shape[:3] != (b, 1, length) or not 0 < window <= self.context:
            raise ValueError(f"forward: the mask must be (B, 1, L, window) = ({b}, 1, {length}, <= "
                             f"{self.context}), got {mask.shape} (see causal_mask)")
        if slots is not None and len(slots) != b:
            raise ValueError(f"forward: {b} rows need {b} slots, got {len(slots)}")
        row_slots = list(slots) if slots is not None else [first_slot + row for row in range(b)]
        heads, kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        flat = tokens.reshape(b * length)
        rows = self.embed.rows_at(flat) if isinstance(self.embed, PackedWeight) else self.embed.index_select(0, flat)
        x = rows.reshape(b, length, cfg.dim)
        cos = self.rope_cos.index_select(0, positions).reshape(b, length, 1, hd // 2)
        sin = self.rope_sin.index_select(0, positions).reshape(b, length, 1, hd // 2)
        for layer in self.layers:
            # each matmul's input is its own realization point, so the matmul is a plain GEMM (BLAS)
            # rather than a reduce fused with the elementwise ops before it (measured 30x slower)
            n = rms_norm(x, layer.attn_norm, cfg.norm_eps).contiguous()
            q, k, v = layer.qkv(n)
            q = apply_rope(q.reshape(b, length, heads, hd), cos, sin)
            k = apply_rope(k.reshape(b, length, kv, hd), cos, sin)
            v = v.reshape(b, length, kv, hd)
            fresh = k.stack(v, dim=1).permute(0, 1, 3, 2, 4)  # (B, 2, Hkv, L, D): one write per row
            for row, (slot, start) in enumerate(zip(row_slots, starts)):
                cells = ((slot, slot + 1), None, None, (start, start + length), None)
                layer.cache.shrink(cells).assign(fresh[row:row + 1])
            if slots is not None:  # each row reads its own slot's window back (a prefill: its whole history)
                # (read back rather than used fresh: measured and tested this way; the jit bug that made
                # it necessary, replays dropping writes no result read, is fixed in jit/jit.py)
                history = [layer.cache.shrink(((s, s + 1), None, None, (0, window), None)) for s in row_slots]
                both = history[0].cat(*history[1:], dim=0) if b > 1 else history[0]  # (B, 2, Hkv, W, D)
                keys, values = both[:, 0], both[:, 1]
            else:
                rows = (first_slot, first_slot + b)
                seen = (0, window)  # attention reads only the window: a short history reads a short cache
                keys = layer.cache.shrink((rows, (0, 1), None, seen, None)).reshape(b, kv, window, hd)
                values = layer.cache.shrink((rows, (1, 2), None, seen, None)).reshape(b, kv, window, hd)
            attended = q.permute(0, 2, 1, 3).scaled_dot_product_attention(keys, values, attn_mask=mask,
                                                                          enable_gqa=True)
            h = x + layer.wo(attended.permute(0, 2, 1, 3).reshape(b, length, heads * hd).contiguous())[0]
            m = rms_norm(h, layer.ffn_norm, cfg.norm_eps).contiguous()
            gate, up = layer.gate_up(m)
            x = h + layer.down((gate.silu() * up).contiguous())[0]
        if last is not None:  # only the rows' last real tokens: (B, dim)
            x = x.reshape(b * length, cfg.dim).index_select(0, last + Tensor(
                np.arange(b, dtype=np.int32) * length, device=self.device))
        return self.output(rms_norm(x, self.norm, cfg.norm_eps).contiguous())[0]
