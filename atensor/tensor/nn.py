"""Functional neural-network ops as Tensor methods, with tinygrad's names: losses (cross_entropy,
nll_loss, sparse_categorical_crossentropy, binary_crossentropy, binary_crossentropy_logits),
normalization (layernorm, batchnorm, normalize), dropout, interpolate, and
scaled_dot_product_attention (softmax(q k^T / sqrt(d) + mask) v, tinygrad's and PyTorch's signature).

All are compositions of existing ops (so gradients come from their rules). The losses use the stable
forms: log_softmax around the row maximum, and logsigmoid (-softplus(-x)) for logits, so large logits
never overflow. `atensor.nn`'s layers and loss functions (PyTorch's signatures) are built on the same
ops. interpolate resamples one axis at a time with gathers: "nearest" picks floor(i * in / out),
"linear" (with "bilinear" and "trilinear" as PyTorch's names for 2 and 3 axes) blends the two
neighbours of (i + 0.5) * in / out - 0.5, or of i * (in - 1) / (out - 1) with `align_corners`.
Attention masks follow PyTorch: a bool mask keeps where True; a float mask is added to the scores;
`is_causal` keeps key j for query i when j <= i (top-left aligned). `enable_gqa` repeats each key/value
head for its group of query heads (grouped-query attention).
"""
from __future__ import annotations

import math
from typing import Optional, Self, Sequence, Union

from atensor.dtype import dtypes, least_upper_float
from atensor.graph.node import GraphError
from atensor.tensor.base import AnyTensor


_REDUCTIONS = ("mean", "sum", "none")


def _reduced(loss: AnyTensor, reduction: str) -> AnyTensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _one_hot_along(index: AnyTensor, num_classes: int, dim: int) -> AnyTensor:
    """index (..., 1 at `dim`, ...) compared with 0..num_classes-1 laid along `dim` (bool)."""
    if not dtypes.is_int(index.dtype):
        raise RuntimeError(f"class indices must be an integer tensor, got {index.dtype.name}")
    dim = dim + index.ndim if dim < 0 else dim
    shape = [1] * index.ndim
    shape[dim] = num_classes
    return index == type(index).arange(num_classes, device=index.device).reshape(*shape)


class NNOps:
    """Loss, normalization, dropout and resampling methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- losses ------------------------------------------------------------------------------------
    def cross_entropy(self, Y: Self, reduction: str = "mean", label_smoothing: float = 0.0) -> Self:
        """Cross entropy of logits (N, C, ...) or (C,) against class indices (N, ...) or probabilities
        shaped like the logits (PyTorch's F.cross_entropy, tinygrad's method)."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        classes_dim = 0 if self.ndim == 1 else 1
        if self.shape != Y.shape:
            if self.max(classes_dim).shape != Y.shape:
                raise RuntimeError(f"cross_entropy: target of shape {Y.shape} for logits of shape {self.shape}")
            Y = _one_hot_along(Y.unsqueeze(classes_dim), self.shape[classes_dim], classes_dim)
        Y = Y.cast(least_upper_float(self.dtype))
        Y = Y * (1 - label_smoothing) + label_smoothing / self.shape[classes_dim]
        return _reduced(-(self.log_softmax(classes_dim) * Y).sum(classes_dim), reduction)

    def nll_loss(self, Y: Self, weight: Optional[Self] = None, ignore_index: Optional[int] = None,
                 reduction: str = "mean") -> Self:
        """The negative log likelihood of log-probabilities (N, C, ...) at class indices Y (N, ...), with
        optional class `weight` and `ignore_index`; "mean" divides by the total weight (PyTorch's)."""
        w = Y._const_like(1.0, least_upper_float(self.dtype)) if weight is None else \
            weight.gather(0, Y.reshape(-1)).reshape(*Y.shape)
        if ignore_index is not None:
            w = w * (Y != ignore_index)
        picked = self.gather(1, Y.unsqueeze(1).maximum(0)).squeeze(1) if self.ndim > 1 else \
            self.gather(0, Y.reshape(1).maximum(0)).reshape(())
        nll = -picked * w
        return nll.sum() / w.sum() if reduction == "mean" else _reduced(nll, reduction)

    def sparse_categorical_crossentropy(self, Y: Self, ignore_index: int = -1, label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Self:
        """Cross entropy of logits (..., C) against class indices Y (...) over the last axis, tinygrad's;
        entries equal to `ignore_index` count for nothing."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        log_probs = self.log_softmax()
        keep = Y != ignore_index if ignore_index != -1 else Y._const_like(True, dtypes.bool)
        y = _one_hot_along(Y.unsqueeze(-1), self.shape[-1], -1) & keep.unsqueeze(-1)
        smoothing = label_smoothing * (log_probs.mean(-1) * keep)
        unreduced = (1 - label_smoothing) * (log_probs * y).sum(-1) + smoothing
        if reduction == "mean":
            return -unreduced.sum() / keep.sum().cast(unreduced.dtype)
        return -_reduced(unreduced, reduction)

    def binary_crossentropy(self, Y: Self, reduction: str = "mean") -> Self:
        """-[y log p + (1 - y) log(1 - p)] of probabilities p (this tensor)."""
        return _reduced(-Y * self.log() - (1 - Y) * (1 - self).log(), reduction)

    def binary_crossentropy_logits(self, Y: Self, reduction: str = "mean",
                                   pos_weight: Optional[Self] = None) -> Self:
        """binary_crossentropy of sigmoid(this tensor), computed from the logits stably."""
        log_p, log_q = self.logsigmoid(), (-self).logsigmoid()
        weight = 1 if pos_weight is None else pos_weight
        return _reduced(-(weight * Y * log_p + (1 - Y) * log_q), reduction)

    # ---- normalization -----------------------------------------------------------------------------
    def layernorm(self, axis: Union[int, Sequence[int]] = -1, eps: float = 1e-5) -> Self:
        """(x - mean) / sqrt(var + eps) over `axis` (biased variance), without scale and shift."""
        y = self - self.mean(axis, keepdim=True)
        return y * ((y * y).mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(self, weight: Optional[Self], bias: Optional[Self], mean: Self, invstd: Self,
                  axis: Union[int, Sequence[int]] = 1) -> Self:
        """(x - mean) * invstd * weight + bias with the statistics laid along `axis` (tinygrad's)."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a + self.ndim if a < 0 else a for a in axes)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(*shape)
        if weight is not None:
            x = x * weight.reshape(*shape)
        out = x * (invstd.reshape(*shape) if invstd.ndim == len(axes) else invstd)
        return out + bias.reshape(*shape) if bias is not None else out

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Self:
        """x / max(||x||_p, eps) along `dim` (PyTorch's F.normalize; p=0 counts the nonzeros)."""
        if p == 0:
            den = (self != 0).cast(least_upper_float(self.dtype)).sum(dim, keepdim=True)
        else:
            den = self.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
        return self / den.maximum(eps)

    def dropout(self, p: float = 0.5) -> Self:
        """In training mode (`Tensor.train()`), zeroes each element with probability `p` and scales the
        rest by 1 / (1 - p); otherwise the identity. The mask comes from the counter-based generator."""
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not type(self).training or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1.0 / (1.0 - p))

    # ---- resampling --------------------------------------------------------------------------------
    def interpolate(self, size: Optional[Sequence[int]] = None, mode: str = "linear", align_corners: bool = False,
                    scale_factor: Optional[Union[float, Sequence[float]]] = None) -> Self:
        """Resamples the last len(size) axes to `size` (or by `scale_factor`): mode "nearest",
        "nearest-exact", or "linear" (also "bilinear", "trilinear"); `align_corners` as PyTorch's."""
        if size is None:
            if scale_factor is None:
                raise ValueError("interpolate needs size or scale_factor")
            spatial = self.ndim - 2 if self.ndim > 2 else self.ndim
            factors = [scale_factor] * spatial if isinstance(scale_factor, (int, float)) else list(scale_factor)
            size = [int(math.floor(s * f)) for s, f in zip(self.shape[self.ndim - len(factors):], factors)]
        size = [int(size)] if isinstance(size, int) else [int(s) for s in size]
        if not 0 < len(size) <= self.ndim:
            raise ValueError(f"interpolate: size {size} for a tensor of shape {self.shape}")
        if mode in ("bilinear", "trilinear", "bicubic") and mode != "bicubic":
            mode = "linear"
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise ValueError(f"interpolate mode {mode!r}; use nearest, nearest-exact, linear, bilinear or trilinear")
        if align_corners and mode != "linear":
            raise ValueError("interpolate: align_corners only applies to the linear modes")
        cls = type(self)
        x = self.cast(least_upper_float(self.dtype)) if mode == "linear" else self
        expand = list(self.shape)
        for i in range(-1, -len(size) - 1, -1):
            in_size, out_size = self.shape[i], size[i]
            reshape = [1] * self.ndim
            reshape[i] = expand[i] = out_size
            if mode == "linear":
                arr = cls.arange(out_size, device=self.device)
                if align_corners:
                    num, den = arr * (in_size - 1), max(out_size - 1, 1)
                else:
                    num, den = (arr * 2 + 1) * in_size - out_size, out_size * 2
                num = num.clip(0, (in_size - 1) * den)
                low, high = num // den, (num + den - 1) // den
                frac = (num % den).cast(dtypes.float32) / den
                low, high, frac = (t.reshape(*reshape).expand(*expand) for t in (low, high, frac))
                x = x.gather(i, low).lerp(x.gather(i, high), frac.cast(x.dtype))
                if not dtypes.is_float(self.dtype):  # integers round back after each axis, as PyTorch's
                    x = x.round()                   # separable uint8 passes do (their results match exactly)
            else:
                arr = cls.arange(out_size, dtype=dtypes.float32, device=self.device)
                scale = in_size / out_size
                pos = (arr + 0.5) * scale if mode == "nearest-exact" else arr * scale
                index = pos.cast(dtypes.int32).minimum(in_size - 1).reshape(*reshape).expand(*expand)
                x = x.gather(i, index)
        if mode == "linear" and not dtypes.is_float(self.dtype):  # integers round back (PyTorch's uint8 images)
            return x.round().cast(self.dtype)
        return x.cast(self.dtype)

    # ---- attention ---------------------------------------------------------------------------------
    def scaled_dot_product_attention(self, key: Self, value: Self, attn_mask: Optional[Self] = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     enable_gqa: bool = False, scale: Optional[float] = None) -> Self:
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
            raise GraphError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both")
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
