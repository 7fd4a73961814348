"""Loss functions, with PyTorch's definitions and reductions ("mean", "sum", "none").

Written with the numerically stable forms: log-softmax subtracts the row maximum (detached: it
cancels in the value and in the gradient, so no gradient needs to flow through it), and the
logistic losses use max(x, 0) - x*y + log(1 + exp(-|x|)) so large logits never overflow.
"""
from __future__ import annotations

from typing import Optional

from atensor.tensor.tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """log(softmax(x)) along `axis`, computed stably."""
    shifted = x - x.max(axis=axis, keepdim=True).detach()
    return shifted - shifted.exp().sum(axis=axis, keepdim=True).log()


def _one_hot(target: Tensor, num_classes: int) -> Tensor:
    classes = Tensor.arange(num_classes, device=target.device).reshape(*((1,) * target.ndim), num_classes)
    return target.unsqueeze(-1) == classes


def sparse_categorical_crossentropy(logits: Tensor, target: Tensor, ignore_index: int = -1,
                                    label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """Cross entropy of `logits` (..., classes) against integer class indices `target` (...), as
    tinygrad's method of the same name; entries equal to `ignore_index` count for nothing (and a
    "mean" averages over the others)."""
    num_classes = logits.shape[-1]
    logp = log_softmax(logits, -1)
    chosen = -(logp * _one_hot(target, num_classes)).sum(axis=-1)
    if label_smoothing:
        chosen = chosen * (1 - label_smoothing) - logp.mean(axis=-1) * label_smoothing
    keep = target != ignore_index
    chosen = keep.where(chosen, 0.0)
    if reduction == "mean":
        return chosen.sum() / keep.sum().maximum(1).cast(chosen.dtype)
    return _reduce(chosen, reduction)


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100, axis: int = 1) -> Tensor:
    """PyTorch's `F.cross_entropy`: `logits` of shape (N, C, ...) (or (C,)) with `target` either class
    indices of shape (N, ...) or class probabilities shaped like `logits`."""
    if logits.ndim == 1:
        axis = 0
    if axis != logits.ndim - 1:
        order = [i for i in range(logits.ndim) if i != axis] + [axis]
        logits = logits.permute(*order)
        if target.ndim == logits.ndim:
            target = target.permute(*order)
    if target.ndim == logits.ndim and target.shape == logits.shape and target.dtype.kind == "f":
        num_classes = logits.shape[-1]
        probs = target * (1 - label_smoothing) + label_smoothing / num_classes if label_smoothing else target
        return _reduce(-(log_softmax(logits, -1) * probs).sum(axis=-1), reduction)
    return sparse_categorical_crossentropy(logits, target, ignore_index=ignore_index,
                                           label_smoothing=label_smoothing, reduction=reduction)


def mse_loss(prediction: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """The squared error, averaged (or summed)."""
    diff = prediction - target
    return _reduce(diff * diff, reduction)


mse = mse_loss


def binary_cross_entropy_with_logits(logits: Tensor, target: Tensor, reduction: str = "mean",
                                     pos_weight: Optional[Tensor] = None) -> Tensor:
    """-[w_pos * y * log(sigmoid(x)) + (1 - y) * log(1 - sigmoid(x))], computed from logits stably."""
    softplus_neg = (1 + (-logits.abs()).exp()).log() + (-logits).maximum(0)  # log(1 + exp(-x))
    if pos_weight is None:
        loss = logits * (1 - target) + softplus_neg
    else:
        loss = logits * (1 - target) + softplus_neg * (1 + (pos_weight - 1) * target)
    return _reduce(loss, reduction)


def binary_cross_entropy(probabilities: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-[y * log(p) + (1 - y) * log(1 - p)], with each log clamped at -100 as PyTorch does."""
    log_p = probabilities.log().maximum(-100)
    log_q = (1 - probabilities).log().maximum(-100)
    return _reduce(-(target * log_p + (1 - target) * log_q), reduction)
