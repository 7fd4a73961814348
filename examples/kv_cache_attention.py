"""A llama-style attention layer decoding one token at a time from a KV cache: eagerly at int positions, then
under `TinyJit` with the position a bound `Variable`, so one captured program serves every position.

    python examples/kv_cache_attention.py

What it shows of the tinygrad-style API: a cache preallocated once and written in place with
`shrink(...).assign(...)`; the history read back as `cache.shrink(... (0, pos + 1) ...)`, whose length
depends on the Variable (a symbolic shape, graph/view.py: no bucket of lengths, no mask past the position);
grouped-query attention through `scaled_dot_product_attention(..., enable_gqa=True)`; and a rotary
embedding built from `Tensor.arange`. atensor/models/llama.py is the full model; this is the one layer,
small enough to read. tests/examples/test_kv_cache_attention.py checks it against numpy.
"""
from __future__ import annotations

import numpy as np

from atensor import Tensor, TinyJit, Variable, nn


def rotary_tables(head_dim: int, positions: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of position * base^(-2i/head_dim), each (positions, head_dim // 2)."""
    frequency = base ** (-Tensor.arange(0, head_dim, 2) / head_dim)
    angle = Tensor.arange(positions).unsqueeze(1) * frequency.unsqueeze(0)
    return angle.cos().contiguous().realize(), angle.sin().contiguous().realize()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (batch, seq, heads, head_dim) with each pair (x[2i], x[2i+1]) turned by its position's angle;
    cos and sin are the rows of the positions, (seq, head_dim // 2)."""
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    first, second = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.unsqueeze(0).unsqueeze(2), sin.unsqueeze(0).unsqueeze(2)
    return Tensor.stack(first * cos - second * sin, first * sin + second * cos, dim=-1).reshape(x.shape)


class CachedAttention:
    """Attention of `heads` query heads over `kv_heads` key/value heads (each key head serves
    heads // kv_heads query heads), with a cache of `context` positions for one batch of `batch` rows."""

    def __init__(self, dim: int, heads: int, kv_heads: int, context: int, batch: int = 1) -> None:
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.cos, self.sin = rotary_tables(self.head_dim, context)
        # keys at [0], values at [1]; written in place, position by position
        self.cache = Tensor.zeros(2, batch, context, kv_heads, self.head_dim).contiguous().realize()

    def __call__(self, x: Tensor, pos: int | Variable, mask: Tensor | None = None) -> Tensor:
        """x (batch, seq, dim) at positions [pos, pos + seq): writes their keys and values into the cache
        and attends over positions [0, pos + seq). `mask` (additive) is for a prompt's causal order."""
        batch, seq, _ = x.shape
        span = (pos, pos + seq)
        cos, sin = self.cos.shrink((span, None)), self.sin.shrink((span, None))
        q = rotate(self.wq(x).reshape(batch, seq, self.heads, self.head_dim), cos, sin)
        k = rotate(self.wk(x).reshape(batch, seq, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).reshape(batch, seq, self.kv_heads, self.head_dim)
        self.cache.shrink((None, None, span, None, None)).assign(Tensor.stack(k, v)).realize()
        seen = (None, (0, pos + seq), None, None)
        keys, values = (self.cache[i].shrink(seen).transpose(1, 2) for i in (0, 1))  # (batch, kv_heads, len, hd)
        out = q.transpose(1, 2).scaled_dot_product_attention(keys, values, mask, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


def main() -> None:
    dim, heads, kv_heads, context, prompt = 64, 8, 2, 32, 5
    Tensor.manual_seed(0)
    layer = CachedAttention(dim, heads, kv_heads, context)
    rng = np.random.default_rng(0)
    causal = Tensor.full((1, 1, prompt, prompt), float("-inf")).triu(1)
    out = layer(Tensor(rng.standard_normal((1, prompt, dim)).astype(np.float32)), 0, causal)
    print(f"prompt of {prompt} positions: output {out.shape}")
    position = Variable("pos", 1, context - 1)

    @TinyJit
    def step(x: Tensor, pos: Variable) -> Tensor:
        return layer(x, pos).realize()

    for pos in range(prompt, prompt + 6):
        out = step(Tensor(rng.standard_normal((1, 1, dim)).astype(np.float32)), position.bind(pos))
        print(f"decoded position {pos}: |out| = {float((out * out).sum().sqrt().item()):.4f}")
    print(f"jit: {step.stats}")


if __name__ == "__main__":
    main()
