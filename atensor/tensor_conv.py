"""Contractions and windows: einsum, outer, conv2d, max_pool2d and avg_pool2d.

Everything here is a view plus a broadcast multiply and a sum, which the numpy backend recognizes as
a contraction and runs through `np.einsum` (BLAS); no new graph op.

Windows, one kernel offset at a time: for a padded NCHW input and kernel offset (i, j), the inputs
every output position reads form one strided slice x[:, :, i*dh::sh, j*dw::sw] (cut to Ho x Wo).
conv2d adds kh*kw contractions (slice times weight[:, :, i, j], summed over the input channels of
the group; each a BLAS call), pooling takes the max or mean of the kh*kw slices. Unlike one View of
overlapping windows (im2col as strides), each slice touches every element at most once, so the
gradient rules for views apply unchanged and no im2col copy is ever made.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from atensor.dtype import least_upper_dtype, least_upper_float
from atensor.graph.node import GraphError
from atensor.tensor_ops import TensorOps

if TYPE_CHECKING:
    from atensor.tensor import Tensor

IntPair = Union[int, Sequence[int]]


def _pair(v: IntPair, name: str) -> tuple[int, int]:
    out = (int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v)
    if len(out) != 2:
        raise GraphError(f"{name} must be an int or a pair, got {v!r}")
    return out  # type: ignore[return-value]


class ConvOps:
    """Contraction and window methods of Tensor (a mixin)."""
    __slots__ = ()

    def outer(self, other: Tensor) -> Tensor:
        """The outer product of two 1-D tensors: out[i, j] = self[i] * other[j]."""
        if self.ndim != 1 or other.ndim != 1:
            raise GraphError(f"outer needs two 1-D tensors, got {self.shape} and {other.shape}")
        return self.reshape(-1, 1) * other.reshape(1, -1)

    @staticmethod
    def einsum(formula: str, *operands: Any) -> Tensor:
        """Einstein summation, e.g. "ij,jk->ik", "bij,bjk->bik", "i,i->", "ij->ji", "...ij,...jk->...ik".
        Operands contract pairwise, left to right; an index repeated within one operand (a diagonal) is
        not supported."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        formula = formula.replace(" ", "")
        lhs, _, rhs = formula.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(operands):
            raise GraphError(f"einsum: {len(terms)} terms in {formula!r} for {len(operands)} operands")
        terms = [_expand_ellipsis(t, op.ndim, formula) for t, op in zip(terms, operands)]
        if "->" not in formula:
            counts = {c: sum(t.count(c) for t in terms) for t in terms for c in t}
            rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
        else:
            rhs = _expand_ellipsis(rhs, max((len(t) for t in terms), default=0), formula, output=True,
                                   batch=_batch_letters(terms))
        for t, op in zip(terms, operands):
            if len(set(t)) != len(t):
                raise NotImplementedError(f"einsum: repeated index in one operand ({t!r}) is not supported")
            if len(t) != op.ndim:
                raise GraphError(f"einsum: term {t!r} has {len(t)} indices for an operand of shape "
                                 f"{op.shape}")
        sizes: dict[str, int] = {}
        for t, op in zip(terms, operands):
            for c, s in zip(t, op.shape):
                if sizes.setdefault(c, s) != s and 1 not in (s, sizes[c]):
                    raise GraphError(f"einsum: index {c!r} has sizes {sizes[c]} and {s}")
                sizes[c] = max(sizes[c], s)
        dt = least_upper_dtype(*(op.dtype for op in operands))
        acc, acc_terms = operands[0].cast(dt), terms[0]
        for k in range(1, len(operands) + 1):
            later = set(rhs).union(*terms[k + 1:]) if k < len(operands) else set(rhs)
            if k < len(operands):
                acc, acc_terms = _contract(acc, acc_terms, operands[k].cast(dt), terms[k], later, sizes)
            else:
                keep = "".join(c for c in acc_terms if c in later)
                if keep != acc_terms:
                    acc = acc.sum(axis=tuple(i for i, c in enumerate(acc_terms) if c not in later))
                    acc_terms = keep
        missing = [c for c in rhs if c not in acc_terms]
        if missing:
            raise GraphError(f"einsum: output index {missing} does not appear in the inputs")
        return acc.permute(*(acc_terms.index(c) for c in rhs)) if acc_terms else acc

    # ---- convolution and pooling -----------------------------------------------------------------
    def _window_terms(self, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
                      padding: tuple[int, int], fill: Any) -> tuple[list[Tensor], tuple[int, int]]:
        """One (N, C, Ho, Wo) strided view of this NCHW tensor (padded by `padding` with `fill`) per
        kernel offset (i, j), row-major, and (Ho, Wo)."""
        if self.ndim != 4:
            raise GraphError(f"expected an NCHW tensor (4 dimensions), got shape {self.shape}")
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel, stride, dilation, padding
        if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
            raise GraphError(f"kernel {kernel}, stride {stride} and dilation {dilation} must be positive, "
                             f"padding {padding} non-negative")
        x = TensorOps.pad(self, ((0, 0), (0, 0), (ph, ph), (pw, pw)), fill) if ph or pw else self
        h, w = x.shape[2:]
        ho = (h - dh * (kh - 1) - 1) // sh + 1
        wo = (w - dw * (kw - 1) - 1) // sw + 1
        if ho <= 0 or wo <= 0:
            raise GraphError(f"kernel {kernel} with dilation {dilation} does not fit the padded input "
                             f"{h}x{w}")
        terms = [x[:, :, i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw]
                 for i in range(kh) for j in range(kw)]
        return terms, (ho, wo)

    def conv2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride: IntPair = 1,
               dilation: IntPair = 1, padding: IntPair = 0) -> Tensor:
        """2-D cross-correlation of this NCHW input with `weight` (out_channels, in_channels / groups,
        kh, kw), as PyTorch's conv2d: `padding` may be an int, a pair, or PyTorch's flat (left, right,
        top, bottom)."""
        if weight.ndim != 4:
            raise GraphError(f"conv2d weight must have 4 dimensions, got {weight.shape}")
        n, cin = self.shape[:2]
        cout, cin_g, kh, kw = weight.shape
        if cin != cin_g * groups or cout % groups:
            raise GraphError(f"conv2d: input has {cin} channels, weight {weight.shape} with groups={groups}")
        if not isinstance(padding, int) and len(padding) == 4:
            left, right, top, bottom = (int(p) for p in padding)
            x = TensorOps.pad(self, ((0, 0), (0, 0), (top, bottom), (left, right)))
            pad = (0, 0)
        else:
            x, pad = self, _pair(padding, "padding")
        dt = least_upper_dtype(self.dtype, weight.dtype)
        terms, (ho, wo) = x.cast(dt)._window_terms((kh, kw), _pair(stride, "stride"),
                                                   _pair(dilation, "dilation"), pad, 0)
        og = cout // groups
        w = weight.cast(dt).reshape(1, groups, og, cin_g, kh * kw)
        out: Optional[Tensor] = None
        for k, term in enumerate(terms):  # each offset is one contraction over the input channels
            a = term.reshape(n, groups, 1, cin_g, ho, wo)
            b = w[:, :, :, :, k].reshape(1, groups, og, cin_g, 1, 1)
            part = (a * b).sum(axis=3)
            out = part if out is None else out + part
        assert out is not None
        out = out.reshape(n, cout, ho, wo)
        return out if bias is None else out + bias.cast(dt).reshape(1, cout, 1, 1)

    def max_pool2d(self, kernel_size: IntPair = (2, 2), stride: Optional[IntPair] = None,
                   dilation: IntPair = 1, padding: IntPair = 0, ceil_mode: bool = False) -> Tensor:
        """The maximum of each window (padding counts as -inf), NCHW; stride defaults to the kernel size."""
        if ceil_mode:
            raise NotImplementedError("max_pool2d ceil_mode=True is not supported")
        k = _pair(kernel_size, "kernel_size")
        s = k if stride is None else _pair(stride, "stride")
        fill = -math.inf if self.dtype.kind == "f" else _lowest_int(self)
        terms, _ = self._window_terms(k, s, _pair(dilation, "dilation"), _pair(padding, "padding"), fill)
        out = terms[0]
        for term in terms[1:]:
            out = out.maximum(term)
        return out

    def avg_pool2d(self, kernel_size: IntPair = (2, 2), stride: Optional[IntPair] = None,
                   dilation: IntPair = 1, padding: IntPair = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """The mean of each window, NCHW; padding counts as 0 and, with count_include_pad=False, is left
        out of the count."""
        if ceil_mode:
            raise NotImplementedError("avg_pool2d ceil_mode=True is not supported")
        k = _pair(kernel_size, "kernel_size")
        s = k if stride is None else _pair(stride, "stride")
        d, p = _pair(dilation, "dilation"), _pair(padding, "padding")
        x = self.cast(least_upper_float(self.dtype))
        terms, _ = x._window_terms(k, s, d, p, 0)
        total = _sum_terms(terms)
        if count_include_pad or p == (0, 0):
            return total / (k[0] * k[1])
        ones = type(self).ones(1, 1, *self.shape[2:], dtype=x.dtype, device=self.device)
        return total / _sum_terms(ones._window_terms(k, s, d, p, 0)[0])


def _sum_terms(terms: list) -> Any:
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


def _lowest_int(t: Any) -> Any:
    import numpy as np
    return False if t.dtype.kind == "b" else int(np.iinfo(t.dtype.np).min)


def _batch_letters(terms: list[str]) -> str:
    longest = max(terms, key=lambda t: sum(c.isupper() for c in t), default="")
    return "".join(c for c in longest if c.isupper())


def _expand_ellipsis(term: str, ndim: int, formula: str, output: bool = False, batch: str = "") -> str:
    """'...' replaced by upper-case letters for the batch axes (aligned on the right, as numpy)."""
    if "..." not in term:
        return term
    if output:
        return term.replace("...", batch)
    named = len(term) - 3
    count = ndim - named
    if count < 0:
        raise GraphError(f"einsum: {formula!r} names more axes than an operand of {ndim} dimensions has")
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[26 - count:] if count else ""
    return term.replace("...", letters)


def _contract(a: Tensor, ta: str, b: Tensor, tb: str, later: set, sizes: dict) -> tuple[Tensor, str]:
    """a and b multiplied over the union of their indices, summed over those no later term needs."""
    union = ta + "".join(c for c in tb if c not in ta)
    def aligned(x: Tensor, t: str) -> Tensor:
        order = [t.index(c) for c in union if c in t]
        x = x.permute(*order) if order != list(range(len(order))) else x
        shape = [x.shape[[c for c in union if c in t].index(c)] if c in t else 1 for c in union]
        x = x.reshape(*shape)
        return x.expand(*(sizes[c] for c in union))
    prod = aligned(a, ta) * aligned(b, tb)
    gone = tuple(i for i, c in enumerate(union) if c not in later)
    keep = "".join(c for c in union if c in later)
    return (prod.sum(axis=gone) if gone else prod), keep
