"""Tensor.scaled_dot_product_attention: softmax(q k^T / sqrt(d) + mask) v, tinygrad's (and PyTorch's) signature.

Why a mixin of its own: attention is the one op every transformer model calls (llama, BERT), and it is
made of existing ops (matmul, softmax, where), so it lives beside them without touching their files.
Masks follow PyTorch: a bool mask keeps where True; a float mask is added to the scores; `is_causal`
keeps key j for query i when j <= i (top-left aligned, as PyTorch). `enable_gqa` repeats each key/value
head for its group of query heads (grouped-query attention).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from atensor.dtype import dtypes


class AttentionOps:
    """The attention method of Tensor."""

    def scaled_dot_product_attention(self: Any, key: Any, value: Any, attn_mask: Optional[Any] = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     enable_gqa: bool = False, scale: Optional[float] = None) -> Any:
        """Attention of this (..., H, L, D) query over (..., Hkv, S, D) keys and (..., Hkv, S, Dv) values:
        (..., H, L, Dv). `attn_mask` broadcasts to (..., H, L, S).

        >>> q = k = v = Tensor.randn(1, 2, 4, 8)
        >>> q.scaled_dot_product_attention(k, v, is_causal=True).shape
        (1, 2, 4, 8)
        """
        if dropout_p:
            raise NotImplementedError("scaled_dot_product_attention: dropout_p > 0 is not supported; "
                                      "pass dropout_p=0.0")
        if is_causal and attn_mask is not None:
            raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both")
        heads, kv_heads = self.shape[-3], key.shape[-3]
        if heads != kv_heads and (not enable_gqa or heads % kv_heads):
            raise ValueError(f"scaled_dot_product_attention: {heads} query heads and {kv_heads} key/value "
                             f"heads; pass enable_gqa=True when query heads are a multiple of kv heads")
        group = heads // kv_heads
        lead, length, dim = self.shape[:-3], self.shape[-2], self.shape[-1]
        source = key.shape[-2]
        # query head h attends with kv head h // group (PyTorch's repeat_interleave): the group's queries
        # are stacked as rows of one matmul per kv head, a plain batched GEMM with no repeated keys
        q = self.reshape(*lead, kv_heads, group * length, dim)
        scores = (q @ key.transpose(-1, -2)).reshape(*lead, heads, length, source)
        scores = scores * (scale if scale is not None else 1 / math.sqrt(dim))
        if is_causal:
            attn_mask = type(self).ones(length, source, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is not None:
            if attn_mask.dtype == dtypes.bool:
                scores = attn_mask.where(scores, float("-inf"))
            else:
                scores = scores + attn_mask
        weights = scores.softmax(-1).reshape(*lead, kv_heads, group * length, source)
        return (weights @ value).reshape(*lead, heads, length, value.shape[-1])
