"""Contractions: matmul, einsum and outer (convolution and pooling are in windows.py).

Everything here is a view plus a broadcast multiply and a sum, which the numpy backend recognizes as
a contraction and runs through `np.einsum` (BLAS); no new graph op. An index repeated within one
operand ('ii->i', a trace) takes that operand's diagonal first (a view).
"""
from __future__ import annotations

from typing import Any, Self


from atensor.dtype import least_upper_dtype
from atensor.graph.node import GraphError, Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.tensor.base import AnyTensor


class ContractOps:
    """Contraction methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- matmul --------------------------------------------------------------------------------
    def dot(self, w: Self) -> Self:
        """Matrix product with numpy's rules for 1-D and batched operands (a BLAS call in the kernel)."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise GraphError(f"matmul needs tensors with at least one dimension, got {x.shape} and {w.shape}")
        k = x.shape[-1]
        kw = w.shape[-2] if w.ndim > 1 else w.shape[0]
        if k != kw:
            raise GraphError(f"matmul: shapes {x.shape} and {w.shape} do not align ({k} != {kw})")
        a, b = x, w
        dt = least_upper_dtype(a.dtype, b.dtype)
        a, b = a.cast(dt), b.cast(dt)
        if b.ndim == 1:
            return (a * b).sum(-1)
        if a.ndim == 1:
            return (a.reshape(k, 1) * b).sum(-2)
        if a.ndim == 2 and b.ndim == 2 and dt.kind == "f":
            # a Linear layer's case: the nodes of the general lines below, made on the nodes (a third of
            # their Python calls; under no_grad only the result is detached, not each step). Why it
            # stays: an (8, 16) @ (16, 4) built 28-31 us a call against 56-80 by the general lines
            # (3 alternating rounds of 300 in fresh processes, load ~10, AMD EPYC Zen 4, at 4715a1c)
            n, m = a.shape[0], b.shape[1]
            full = (n, m, k)
            rows = a.node.reshape((n, 1, k)).expand(full)
            cols = b.node.permute((1, 0)).reshape((1, m, k)).expand(full)
            product = Node.make(Ops.MUL, dt, (rows, cols))
            return a._new(product.reduce(ReduceOp.SUM, (2,)).reshape((n, m)))
        a = a.reshape(*a.shape[:-1], 1, k)
        b = b.transpose(-1, -2).reshape(*b.shape[:-2], 1, b.shape[-1], k)
        return (a * b).sum(-1)

    matmul = dot


    def outer(self, other: Self) -> Self:
        """The outer product of two 1-D tensors: out[i, j] = self[i] * other[j]."""
        if self.ndim != 1 or other.ndim != 1:
            raise GraphError(f"outer needs two 1-D tensors, got {self.shape} and {other.shape}")
        return self.reshape(-1, 1) * other.reshape(1, -1)

    @staticmethod
    def einsum(formula: str, *operands: Any) -> AnyTensor:
        """Einstein summation, e.g. "ij,jk->ik", "bij,bjk->bik", "i,i->", "ij->ji", "...ij,...jk->...ik".
        Operands contract pairwise, left to right; an index repeated within one operand ("ii->i", a
        trace "ii->") takes that operand's diagonal first."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        formula = formula.replace(" ", "")
        lhs, _, rhs = formula.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(operands):
            raise GraphError(f"einsum: {len(terms)} terms in {formula!r} for {len(operands)} operands")
        terms = [_expand_ellipsis(t, op.ndim, formula) for t, op in zip(terms, operands)]
        if "->" not in formula:  # implicit output: the ellipsis axes, then the indices used once, sorted
            counts = {c: sum(t.count(c) for t in terms) for t in terms for c in t}
            rhs = _batch_letters(terms) + "".join(sorted(c for c, n in counts.items() if n == 1 and c.islower()))
        else:
            rhs = _expand_ellipsis(rhs, max((len(t) for t in terms), default=0), formula, output=True,
                                   batch=_batch_letters(terms))
        operands, terms = list(operands), list(terms)
        for k, (t, op) in enumerate(zip(terms, operands)):
            if len(t) != op.ndim:
                raise GraphError(f"einsum: term {t!r} has {len(t)} indices for an operand of shape "
                                 f"{op.shape}")
            while len(set(t)) != len(t):  # a repeated index: the diagonal of its two axes, moved last
                c = next(c for c in t if t.count(c) > 1)
                i, j = t.index(c), t.index(c, t.index(c) + 1)
                op = op.diagonal(0, i, j)
                t = "".join(x for n, x in enumerate(t) if n not in (i, j)) + c
            terms[k], operands[k] = t, op
        for t, op in zip(terms, operands):
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


def _contract(a: AnyTensor, ta: str, b: AnyTensor, tb: str, later: set, sizes: dict) -> tuple[AnyTensor, str]:
    """a and b multiplied over the union of their indices, summed over those no later term needs."""
    union = ta + "".join(c for c in tb if c not in ta)
    def aligned(x: AnyTensor, t: str) -> AnyTensor:
        order = [t.index(c) for c in union if c in t]
        x = x.permute(*order) if order != list(range(len(order))) else x
        shape = [x.shape[[c for c in union if c in t].index(c)] if c in t else 1 for c in union]
        x = x.reshape(*shape)
        return x.expand(*(sizes[c] for c in union))
    prod = aligned(a, ta) * aligned(b, tb)
    gone = tuple(i for i, c in enumerate(union) if c not in later)
    keep = "".join(c for c in union if c in later)
    return (prod.sum(axis=gone) if gone else prod), keep
