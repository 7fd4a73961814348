"""Convolution and pooling over any number of spatial dimensions: conv2d (1-D, 2-D and 3-D weights),
conv_transpose1d/2d/3d, max_pool2d/avg_pool2d (also 1-D and 3-D, ceil_mode, return_indices) and
max_unpool2d, on (N, C, *spatial) tensors.

Pooling reads its windows one kernel offset at a time: for a padded input and kernel offset k = (k1, ...,
kd), the inputs every output position reads form one strided slice x[:, :, k1*d1::s1, ...] (cut to the
output size), and each slice reads every element at most once.

Convolution reads them all at once: the padded input seen as one strided view (N, groups, 1, C / groups,
*kernel, *out) whose kernel and output axes overlap (im2col without the copy), and the convolution is
one contraction of that view with the weight over (input channels of the group, kernel offsets). The
numpy backend runs it as BLAS gemms: per sample, one copy that unfolds only the inner kernel axis and
one gemm per outer kernel offset (backend/gemm/window.py, for unit strides on the outer spatial axes
and one group), else copying the windows a sample (or a block of channels) at a time into cache first
(backend/gemm/contraction.py); the weight's gradient is the same kind of contraction; the
input's gradient is the column gradient (a contraction with the weight) added back window by window
(col2im: graph/gradient.py splits the overlapping view into one pad per kernel offset, and the backend
adds them in one pass, a sample at a time). A compiled (native) kernel runs the forward and the
weight's gradient in C instead (backend/gemm/conv_c.py: per sample, a gather 5x the input for a 5x5 kernel and
one gemm per kernel row, with the bias and activation fused after it). Measured against the earlier im2col, which stacked the K
slices into a contiguous copy (a concatenation: K adds over the whole copy), in process CPU time as a
ratio to PyTorch's in the same run (ATENSOR_BLAS_THREADS=1, one thread each, a loaded 2-core machine):
MNIST's 128x32x24x24 5x5 layer 15.8x -> 2.4x forward and 27x -> 1.4x with both gradients; ResNet's
8x64x56x56 3x3 layer 7.5x -> 1.6x and 4.6x -> 0.9x (bench/conv.py has the peers' table).

Padding: an int, one value per spatial axis (both sides), or 2 values per axis in PyTorch's F.pad
order (last axis first: left, right, top, bottom, ...); negative padding crops. ceil_mode adds the
extra right padding the last partial window needs (never counted by avg_pool's divisor).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Self, Sequence, Union

import numpy as np

from atensor.dtype import dtypes, least_upper_dtype, least_upper_float
from atensor.graph.view import View, strides_for



Ints = Union[int, Sequence[int]]


def _per_axis(v: Ints, dims: int, name: str) -> tuple[int, ...]:
    out = (int(v),) * dims if isinstance(v, int) else tuple(int(x) for x in v)
    if len(out) != dims:
        raise ValueError(f"{name} must be an int or {dims} values, got {v!r}")
    return out


def _pads(padding: Ints, dims: int) -> list[tuple[int, int]]:
    """(before, after) per spatial axis from an int, `dims` values, or 2*dims in F.pad order."""
    if isinstance(padding, int):
        return [(padding, padding)] * dims
    p = [int(x) for x in padding]
    if len(p) == dims:
        return [(x, x) for x in p]
    if len(p) == 2 * dims:
        return [(p[2 * (dims - 1 - a)], p[2 * (dims - 1 - a) + 1]) for a in range(dims)]
    raise ValueError(f"padding must be an int, {dims} values or {2 * dims} values, got {tuple(padding)}")


def _lowest(t: Any) -> Any:
    if t.dtype.kind == "f":
        return -math.inf
    return False if t.dtype.kind == "b" else int(np.iinfo(t.dtype.np).min)


def _ceil_extra(size: int, pads: tuple[int, int], k: int, s: int, d: int) -> int:
    """The right padding ceil_mode adds so the last partial window exists (PyTorch's rule: a window
    must start inside the input or its left padding)."""
    span = size + pads[0] + pads[1] - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + pads[0]:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + pads[0] + pads[1]))


class WindowOps:
    """Convolution and pooling methods of Tensor (a mixin)."""
    __slots__ = ()

    def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                 pads: list[tuple[int, int]], fill: Any) -> tuple[list[Self], tuple[int, ...]]:
        """One (N, C, *out) strided view of this tensor (padded with `fill`) per kernel offset, in
        row-major order of the offsets, and the output's spatial shape."""
        dims = len(kernel)
        if self.ndim != dims + 2:
            raise RuntimeError(f"expected a (N, C, {dims} spatial) tensor, got shape {self.shape}")
        if min(kernel + stride + dilation) < 1:
            raise RuntimeError(f"kernel {kernel}, stride {stride} and dilation {dilation} must be positive")
        x = self._pad_constant([(0, 0), (0, 0), *pads], fill) if any(p != (0, 0) for p in pads) else self
        sizes = x.shape[2:]
        out = tuple((n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(sizes, kernel, stride, dilation))
        if any(o <= 0 for o in out):
            raise RuntimeError(f"kernel {kernel} with dilation {dilation} does not fit the padded input {sizes}")
        terms = []
        for offset in np.ndindex(*kernel):
            index = [slice(None), slice(None)] + [slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s
                                                  in zip(offset, dilation, out, stride)]
            terms.append(x[tuple(index)])
        return terms, out

    def _window_view(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                     pads: list[tuple[int, int]], groups: int) -> tuple[Self, tuple[int, ...]]:
        """This (N, C, *spatial) tensor, zero-padded, as the one strided view (N, groups, 1, C / groups,
        *kernel, *out) of its sliding windows (the axes overlap: element [..., k, o] reads the padded
        input at k * dilation + o * stride), and the output's spatial shape."""
        dims = len(kernel)
        if self.ndim != dims + 2:
            raise RuntimeError(f"expected a (N, C, {dims} spatial) tensor, got shape {self.shape}")
        if min(kernel + stride + dilation) < 1:
            raise RuntimeError(f"kernel {kernel}, stride {stride} and dilation {dilation} must be positive")
        x = self._pad_constant([(0, 0), (0, 0), *pads], 0) if any(p != (0, 0) for p in pads) else self
        n, c, *sizes = x.shape
        out = tuple((size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(sizes, kernel, stride, dilation))
        if any(o <= 0 for o in out):
            raise RuntimeError(f"kernel {kernel} with dilation {dilation} does not fit the padded input "
                               f"{tuple(sizes)}")
        spatial = strides_for(tuple(sizes))
        plane = math.prod(sizes)
        shape = (n, groups, 1, c // groups, *kernel, *out)
        strides = (c * plane, c // groups * plane, 0, plane, *(d * st for d, st in zip(dilation, spatial)),
                   *(s * st for s, st in zip(stride, spatial)))
        size_one = tuple(0 if size == 1 else st for size, st in zip(shape, strides))  # View's convention
        return x._new(x.node.view(View(shape, size_one, 0, None))), out

    # ---- convolution ---------------------------------------------------------------------------------
    def conv2d(self, weight: Self, bias: Optional[Self] = None, groups: int = 1, stride: Ints = 1,
               dilation: Ints = 1, padding: Ints = 0, dtype: Any = None) -> Self:
        """Cross-correlation of this (N, Cin, *spatial) input with `weight` (Cout, Cin / groups, *kernel),
        PyTorch's conv1d/2d/3d by the weight's dimensions; see the module docstring for `padding`."""
        dims = weight.ndim - 2
        if dims < 1 or self.ndim != weight.ndim:
            raise RuntimeError(f"conv: input of shape {self.shape} and weight of shape {weight.shape} do not "
                               f"match (the weight is (out, in / groups, *kernel))")
        n, cin = self.shape[:2]
        cout, cin_g, *kernel = weight.shape
        if cin != cin_g * groups or cout % groups:
            raise RuntimeError(f"conv: input has {cin} channels, weight {weight.shape} with groups={groups}")
        dt = least_upper_dtype(self.dtype, weight.dtype)
        cols, out = self.cast(dt)._window_view(tuple(kernel), _per_axis(stride, dims, "stride"),
                                               _per_axis(dilation, dims, "dilation"), _pads(padding, dims), groups)
        og = cout // groups
        # cols (n, groups, 1, cin_g, *kernel, *out) against w (1, groups, og, cin_g, *kernel, 1...): a
        # contraction over (cin_g, *kernel), which the backends run as BLAS gemms (im2col chunk by chunk)
        w = weight.cast(dt).reshape(1, groups, og, cin_g, *kernel, *([1] * dims))
        result = (w * cols).sum(axis=tuple(range(3, 3 + 1 + dims))).reshape(n, cout, *out)
        if bias is not None:
            result = result + bias.cast(dt).reshape(1, cout, *([1] * dims))
        return result.cast(dtype) if dtype is not None else result

    def conv1d(self, weight: Self, bias: Optional[Self] = None, **kw: Any) -> Self:
        """conv2d with a 1-D kernel (N, C, L) input."""
        return self.conv2d(weight, bias, **kw)

    def conv3d(self, weight: Self, bias: Optional[Self] = None, **kw: Any) -> Self:
        """conv2d with a 3-D kernel (N, C, D, H, W) input."""
        return self.conv2d(weight, bias, **kw)

    def conv_transpose2d(self, weight: Self, bias: Optional[Self] = None, groups: int = 1, stride: Ints = 1,
                         dilation: Ints = 1, padding: Ints = 0, output_padding: Ints = 0) -> Self:
        """The transposed convolution (the gradient of conv2d with respect to its input) with `weight`
        (Cin, Cout / groups, *kernel), any number of spatial axes, as PyTorch's conv_transpose1d/2d/3d:
        the input is spread out by `stride` (zeros between), padded by dilation * (k - 1) - padding,
        and convolved with the flipped kernel."""
        dims = weight.ndim - 2
        cin, og, *kernel = weight.shape
        if self.ndim != weight.ndim or self.shape[1] != cin or cin % groups:
            raise RuntimeError(f"conv_transpose: input of shape {self.shape} and weight {weight.shape} "
                               f"(in, out / groups, *kernel) with groups={groups} do not match")
        s, d = _per_axis(stride, dims, "stride"), _per_axis(dilation, dims, "dilation")
        p, op = _per_axis(padding, dims, "padding"), _per_axis(output_padding, dims, "output_padding")
        x = self
        for a, step in enumerate(s):
            if step > 1:  # spread axis 2 + a: each element followed by step - 1 zeros, the last trimmed
                axis = 2 + a
                size = x.shape[axis]
                x = x.unsqueeze(axis + 1)
                pairs = [(0, 0)] * x.ndim
                pairs[axis + 1] = (0, step - 1)
                x = x._pad_constant(pairs).reshape(*x.shape[:axis], size * step, *x.shape[axis + 2:])
                bounds: list[Any] = [None] * x.ndim
                bounds[axis] = (0, (size - 1) * step + 1)
                x = x.shrink(bounds)
        w = weight.reshape(groups, cin // groups, og, *kernel).transpose(1, 2)
        w = w.reshape(groups * og, cin // groups, *kernel).flip(tuple(range(2, 2 + dims)))
        pads = [(di * (k - 1) - pi, di * (k - 1) - pi + o) for k, di, pi, o in zip(kernel, d, p, op)]
        flat = [v for a in reversed(range(dims)) for v in pads[a]]
        return x.conv2d(w, bias, groups=groups, dilation=d, padding=flat)

    conv_transpose1d = conv_transpose2d
    conv_transpose3d = conv_transpose2d

    # ---- pooling -------------------------------------------------------------------------------------
    def _pool_setup(self, kernel_size: Ints, stride: Optional[Ints], dilation: Ints, padding: Ints,
                    ceil_mode: bool) -> tuple[tuple[int, ...], ...]:
        dims = 1 if isinstance(kernel_size, int) and self.ndim == 3 else \
            (len(kernel_size) if not isinstance(kernel_size, int) else self.ndim - 2)
        k = _per_axis(kernel_size, dims, "kernel_size")
        s = k if stride is None or stride == () else _per_axis(stride, dims, "stride")
        d = _per_axis(dilation, dims, "dilation")
        pads = _pads(padding, dims)
        extra = tuple(_ceil_extra(n, pp, kk, ss, dd) if ceil_mode else 0
                      for n, pp, kk, ss, dd in zip(self.shape[-dims:], pads, k, s, d))
        return k, s, d, tuple(pads), extra

    def max_pool2d(self, kernel_size: Ints = (2, 2), stride: Optional[Ints] = None, dilation: Ints = 1,
                   padding: Ints = 0, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """The maximum of each window (padding never wins), for any number of spatial axes (the kernel's);
        with `return_indices` also the int32 position of each maximum in the flattened spatial input."""
        k, s, d, pads, extra = self._pool_setup(kernel_size, stride, dilation, padding, ceil_mode)
        full = [(b, a + e) for (b, a), e in zip(pads, extra)]
        if self.ndim - 2 != len(k):  # (C, *spatial): treat as a batch of one
            out = self.unsqueeze(0).max_pool2d(kernel_size, stride, dilation, padding, ceil_mode, return_indices)
            return (out[0][0], out[1][0]) if return_indices else out[0]
        terms, _ = self._windows(k, s, d, full, _lowest(self))
        out = terms[0]
        for term in terms[1:]:
            out = out.maximum(term)
        if not return_indices:
            return out
        spatial = self.shape[2:]
        grid = type(self).arange(math.prod(spatial), dtype=dtypes.int32, device=self.device)
        grid = grid.reshape(1, 1, *spatial)
        where, _ = grid._windows(k, s, d, full, -1)
        value = out.detach()
        index, found = None, None
        for term, position in zip(terms, where):
            hit = term.detach() == value
            if found is not None:
                hit = hit & found.logical_not()
            index = hit.where(position, 0 if index is None else index)
            found = hit if found is None else found | hit
        return out, index

    max_pool1d = max_pool3d = max_pool2d

    def avg_pool2d(self, kernel_size: Ints = (2, 2), stride: Optional[Ints] = None, dilation: Ints = 1,
                   padding: Ints = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Self:
        """The mean of each window, for any number of spatial axes; padding counts as 0 and, with
        count_include_pad=False, is left out of the count; ceil_mode's extra windows never count it."""
        k, s, d, pads, extra = self._pool_setup(kernel_size, stride, dilation, padding, ceil_mode)
        if self.ndim - 2 != len(k):
            return self.unsqueeze(0).avg_pool2d(kernel_size, stride, dilation, padding, ceil_mode,
                                                count_include_pad)[0]
        full = [(b, a + e) for (b, a), e in zip(pads, extra)]
        x = self.cast(least_upper_float(self.dtype))
        terms, _ = x._windows(k, s, d, full, 0)
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        if (count_include_pad or all(p == (0, 0) for p in pads)) and not any(extra):
            return total / math.prod(k)
        ones = type(self).ones(1, 1, *self.shape[2:], dtype=x.dtype, device=self.device)
        if count_include_pad:
            ones = ones._pad_constant([(0, 0), (0, 0), *pads], 1.0)
            counted = [(0, e) for e in extra]
        else:
            counted = full
        counts, _ = ones._windows(k, s, d, counted, 0)
        divisor = counts[0]
        for c in counts[1:]:
            divisor = divisor + c
        return total / divisor

    avg_pool1d = avg_pool3d = avg_pool2d

    def max_unpool2d(self, indices: Self, kernel_size: Ints = (2, 2), stride: Optional[Ints] = None,
                     dilation: Ints = 1, padding: Ints = 0, output_size: Optional[Sequence[int]] = None) -> Self:
        """The partial inverse of max_pool2d: zeros of the input's size with each value put back at the
        position `indices` (from max_pool2d(return_indices=True)) names."""
        dims = len(kernel_size) if not isinstance(kernel_size, int) else self.ndim - 2
        k = _per_axis(kernel_size, dims, "kernel_size")
        s = k if stride is None else _per_axis(stride, dims, "stride")
        d, p = _per_axis(dilation, dims, "dilation"), _per_axis(padding, dims, "padding")
        if output_size is None:
            size = tuple((i - 1) * ss - 2 * pp + dd * (kk - 1) + 1
                         for i, ss, pp, dd, kk in zip(self.shape[2:], s, p, d, k))
        else:
            size = tuple(output_size)[-dims:]
        n, c = self.shape[:2]
        base = type(self).zeros(n, c, math.prod(size), dtype=self.dtype, device=self.device)
        flat = base.scatter(2, indices.reshape(n, c, -1), self.reshape(n, c, -1))
        return flat.reshape(n, c, *size)

    max_unpool1d = max_unpool3d = max_unpool2d
