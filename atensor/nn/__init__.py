"""Layers for atensor models, with tinygrad's (and PyTorch's) names, shapes and initializations.

A layer is a plain object whose tensors are attributes and whose `__call__` builds graph; nothing
runs until a realize. Parameters are made with storage from the start (an empty buffer with a lazy
assign of the initial values), so an optimizer step can assign into them and a state dict can be
loaded into them before anything was realized. Randomness comes from the counter-based generator
(atensor/tensor/random.py): the same seed gives the same weights on any device and any number of devices.

Layers that behave differently in training (Dropout, BatchNorm) read `Tensor.training`, which
`with Tensor.train():` turns on, as in tinygrad.

    >>> from atensor import Tensor, nn
    >>> layer = nn.Linear(3, 2)
    >>> layer(Tensor.ones(4, 3)).shape
    (4, 2)
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

from atensor.dtype import dtypes
from atensor.nn.losses import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
                               log_softmax, mse_loss, sparse_categorical_crossentropy)
from atensor.nn import optim  # noqa: F401 - `nn.optim.SGD` works without importing the submodule first
from atensor.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from atensor.porting import missing_name
from atensor.tensor.tensor import Tensor

__all__ = ["Linear", "Conv2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding",
           "Dropout",
           "Sequential", "parameter", "uniform", "cross_entropy", "sparse_categorical_crossentropy",
           "mse_loss", "binary_cross_entropy_with_logits", "binary_cross_entropy", "log_softmax",
           "get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load", "optim"]

IntPair = Union[int, tuple[int, int]]


def parameter(init: Tensor) -> Tensor:
    """A tensor with its own storage that will hold `init` (assigned lazily, so nothing runs)."""
    return Tensor.empty(*init.shape, dtype=init.dtype, device=init.device).assign(init)


def uniform(*shape: int, bound: float, device: Optional[str] = None) -> Tensor:
    """Values uniform in [-bound, bound), from the counter-based generator."""
    return Tensor.rand(*shape, device=device) * (2 * bound) - bound


class Linear:
    """y = x @ weight.T + bias, with weight (out_features, in_features) initialized as PyTorch does
    (uniform in +-1/sqrt(in_features), kaiming uniform with a=sqrt(5)), bias alike."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Optional[str] = None):
        bound = 1 / math.sqrt(in_features)
        self.weight = parameter(uniform(out_features, in_features, bound=bound, device=device))
        self.bias = parameter(uniform(out_features, bound=bound, device=device)) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        out = x @ self.weight.T
        return out + self.bias if self.bias is not None else out


def _pair(v: IntPair) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class Conv2d:
    """A 2-D convolution (cross-correlation, as in PyTorch) over NCHW input; weight of shape
    (out_channels, in_channels / groups, kh, kw), PyTorch's initialization."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1, bias: bool = True,
                 device: Optional[str] = None):
        self.kernel_size, self.stride, self.padding = _pair(kernel_size), _pair(stride), _pair(padding)
        self.dilation, self.groups = _pair(dilation), groups
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1 / math.sqrt(fan_in)
        self.weight = parameter(uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound,
                                        device=device))
        self.bias = parameter(uniform(out_channels, bound=bound, device=device)) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        # Tensor.conv2d reads sliding windows through one raw view, which a sharded tensor does not
        # take; the composition of movement ops below works on any layout
        if not isinstance(x.device, tuple):
            return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                            dilation=self.dilation, padding=self.padding)
        return _conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: tuple[int, int],
            padding: tuple[int, int], dilation: tuple[int, int], groups: int) -> Tensor:
    """Convolution as a sum over kernel offsets of strided windows times the kernel's slice, built
    from movement ops only (used on sharded tensors)."""
    n, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    x = x.pad(((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xg = x.reshape(n, groups, 1, cin_g, h + 2 * ph, w + 2 * pw)
    wg = weight.reshape(1, groups, cout // groups, cin_g, kh, kw)
    out: Optional[Tensor] = None
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + (ho - 1) * sh + 1, sh)
            cols = slice(j * dw, j * dw + (wo - 1) * sw + 1, sw)
            window = xg[:, :, :, :, rows, cols]
            term = (window * wg[:, :, :, :, i:i + 1, j:j + 1]).sum(axis=3)
            out = term if out is None else out + term
    assert out is not None
    out = out.reshape(n, cout, ho, wo)
    return out + bias.reshape(1, cout, 1, 1) if bias is not None else out


class BatchNorm:
    """Batch normalization over every axis but axis 1 (BatchNorm1d and BatchNorm2d in one), with
    running statistics. In training mode it normalizes with the batch's mean and (biased) variance
    and updates the running ones (unbiased variance, PyTorch's rule); otherwise it uses the running
    ones. On a batch sharded over devices the batch statistics are allreduced: synchronized
    batchnorm, so data parallel training computes what one device would."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True,
                 track_running_stats: bool = True, momentum: float = 0.1, device: Optional[str] = None):
        self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
        self.weight = parameter(Tensor.ones(num_features, device=device)) if affine else None
        self.bias = parameter(Tensor.zeros(num_features, device=device)) if affine else None
        if track_running_stats:
            self.running_mean = parameter(Tensor.zeros(num_features, device=device)).requires_grad_(False)
            self.running_var = parameter(Tensor.ones(num_features, device=device)).requires_grad_(False)
            count = Tensor.zeros(1, dtype=dtypes.int32, device=device)
            self.num_batches_tracked = parameter(count).requires_grad_(False)

    def __call__(self, x: Tensor) -> Tensor:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        shape = tuple(s if i == 1 else 1 for i, s in enumerate(x.shape))
        if Tensor.training or not self.track_running_stats:
            mean = x.mean(axis=axes, keepdim=True)
            var = ((x - mean) * (x - mean)).mean(axis=axes, keepdim=True)
            if Tensor.training and self.track_running_stats:
                count = x.numel() // x.shape[1]
                m = self.momentum
                self.running_mean.assign(self.running_mean * (1 - m) + mean.detach().reshape(-1) * m)
                unbiased = var.detach().reshape(-1) * (count / max(count - 1, 1))
                self.running_var.assign(self.running_var * (1 - m) + unbiased * m)
                self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            mean, var = self.running_mean.reshape(shape), self.running_var.reshape(shape)
        out = (x - mean) * (var + self.eps).rsqrt()
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out


BatchNorm1d = BatchNorm2d = BatchNorm


class LayerNorm:
    """Normalizes over the last axes (`normalized_shape`), then scales and shifts elementwise."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, device: Optional[str] = None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = parameter(Tensor.ones(*shape, device=device)) if elementwise_affine else None
        self.bias = parameter(Tensor.zeros(*shape, device=device)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-len(self.normalized_shape):]) != self.normalized_shape:
            raise ValueError(f"LayerNorm over {self.normalized_shape} got input of shape {x.shape}")
        axes = tuple(range(x.ndim - len(self.normalized_shape), x.ndim))
        mean = x.mean(axis=axes, keepdim=True)
        centered = x - mean
        out = centered * ((centered * centered).mean(axis=axes, keepdim=True) + self.eps).rsqrt()
        return out * self.weight + self.bias if self.weight is not None else out


class RMSNorm:
    """Root mean square normalization over the last axis (Zhang and Sennrich), tinygrad's and PyTorch's:
    x / sqrt(mean(x^2) + eps) computed in float32 and cast back, times `weight` (ones at first) unless
    `elementwise_affine` is False."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True, device: Optional[str] = None):
        self.eps = eps
        self.weight = parameter(Tensor.ones(dim, device=device)) if elementwise_affine else None

    def _norm(self, x: Tensor) -> Tensor:
        return x * ((x * x).mean(axis=-1, keepdim=True) + self.eps).rsqrt()

    def __call__(self, x: Tensor) -> Tensor:
        out = self._norm(x.cast(dtypes.float32)).cast(x.dtype)
        return out if self.weight is None else out * self.weight


class Embedding:
    """A lookup table: row `i` of `weight` (vocab_size, embed_size) for each index `i`. Computed as a
    one-hot matmul, so its gradient is a matmul too (no scatter needed)."""

    def __init__(self, vocab_size: int, embed_size: int, device: Optional[str] = None):
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = parameter(Tensor.randn(vocab_size, embed_size, device=device))

    def __call__(self, idx: Tensor) -> Tensor:
        classes = Tensor.arange(self.vocab_size, device=idx.device)
        classes = classes.reshape(*((1,) * idx.ndim), self.vocab_size)
        one_hot = (idx.unsqueeze(-1) == classes).cast(self.weight.dtype)
        return one_hot @ self.weight


class Dropout:
    """Zeroes each element with probability `p` in training mode and scales the rest by 1/(1-p);
    the identity otherwise. The mask comes from the counter-based generator, so a seed gives the
    same mask on one device and on several."""

    def __init__(self, p: float = 0.5):
        if not 0 <= p < 1:
            raise ValueError(f"Dropout probability must be in [0, 1), got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        if not Tensor.training or self.p == 0:
            return x
        keep = Tensor.rand(*x.shape, device=x.device) >= self.p
        return keep.where(x * (1 / (1 - self.p)), 0.0).cast(x.dtype)


class Sequential:
    """Calls its layers (any callables) in order."""

    def __init__(self, *layers):
        self.layers = list(layers)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def __getattr__(name: str) -> object:
    """`nn.datasets` without importing it first, as tinygrad's; tinygrad's layers atensor lacks raise an
    error naming docs/porting.md."""
    if name == "datasets":
        import importlib
        return importlib.import_module("atensor.nn.datasets")
    raise missing_name("atensor.nn", name)
