"""What the loop nest of a C kernel reads: walks over the value graph a nest computes, for the renderer
(backend/c/render.py) to decide how to write the nest.

Why a module of its own: these walks answer questions about the graph (which masked views a nest reads
and where their masks start and end, whether it reads a buffer at other elements than it writes),
not about C text; the renderer asks them and writes the loops. Each walk is an explicit stack, not
recursion: a deep kernel (a 3-D pool's backward) outgrew Python's recursion limit.
"""
from __future__ import annotations

from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.view import View, strides_for


# at most this many cuts split one loop (`mask_cuts`): a concatenation of more pieces keeps its selects
MAX_MASK_CUTS = 16


def mask_cuts(value: Node, shape: tuple[int, ...], arrays: dict) -> list[int]:
    """Where a nest computing `value` over `shape` should split its innermost loop: the positions
    strictly inside that axis at which the mask of a view it reads (not through a materialized array)
    starts or ends, sorted; empty when there are none, more than MAX_MASK_CUTS, or the axis is symbolic.

    Why: a masked read is `cond ? a[i] : 0`, which GCC vectorizes as a masked load whose masked-off
    lanes still address memory outside the array; on AMD Zen a masked-off lane on a page that is not
    mapped costs a microcode assist. The flagship's packed gradient (five matmul results concatenated
    into one buffer of 50,826 floats) took 2.0-2.5 ms a call that way against 65 us unvectorized
    (the loop alone, gcc 12 -O3 -march=native, Zen 5). Split at the masks' bounds, every piece reads
    each view either always or never: plain loads, vectorized, and the same values."""
    if not shape or type(shape[-1]) is not int:
        return []
    last, size = len(shape) - 1, shape[-1]
    cuts: set[int] = set()
    seen: set[Node] = set()
    stack = [value]
    while stack:
        n = stack.pop()
        if n in seen or n in arrays:
            continue
        seen.add(n)
        if n.op is Ops.VIEW:
            mask = n.arg.mask
            if mask is not None and n.shape == shape:
                b, e = mask[last]
                if type(b) is int and type(e) is int:
                    cuts.update(x for x in (b, e) if 0 < x < size)
            continue  # (its source is a leaf or a materialized array)
        if n.op is Ops.GATHER:
            stack.append(n.src[1])  # (its source is read at a computed position, not this nest's)
            continue
        stack.extend(n.src)
    return sorted(cuts) if len(cuts) <= MAX_MASK_CUTS else []


def readable_anywhere(n: Node) -> bool:
    """A node whose value at any position is a load (a buffer, or a view of a leaf), not a computation."""
    return n.op is Ops.PARAM or (n.op is Ops.VIEW and n.src[0].op in (Ops.PARAM, Ops.CONST, Ops.ARANGE))


def reads_at(n: Node, param: Node, view: View, arrays: dict, seen: set) -> bool:
    """True when the nest computing `n` reads `param` other than at the element `view` writes. An
    explicit stack, not recursion: a deep kernel (a 3-D pool's backward) outgrew Python's recursion limit."""
    stack = [n]
    while stack:
        n = stack.pop()
        if n in seen or n in arrays:
            continue
        seen.add(n)
        if n is param:
            if view.strides != strides_for(view.shape) or view.offset != 0 or n.shape != view.shape:
                return True
        elif n.op is Ops.VIEW and n.src[0] is param:
            if n.arg != view:
                return True
        elif n.op is Ops.GATHER and n.src[0] not in arrays and any(x is param for x in toposort([n.src[0]])):
            return True  # a gather reads its source at any position
        else:
            stack.extend(n.src)
    return False


__all__ = ["MAX_MASK_CUTS", "mask_cuts", "readable_anywhere", "reads_at"]
