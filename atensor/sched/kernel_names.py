"""Kernel names that say what a kernel computes, and the list of its ops (the profiler shows it on hover).

Why: a name is what a profile, a `debug` print and an error show of a kernel. Named by its last reduce
alone (`r_sum_1024x1024`), a matmul+relu+sum, the matmul itself on another device and a plain sum
looked alike. A name here is the kernel's main ops in the order they run, with the shape of its work:
`matmul_relu_sum 32x8x16` (a matmul's reduce runs over M x N x K), `mul_add_exp 512x64` (an elementwise
kernel's output shape), `max 32x16`. Patterns with a common name are named so: a sum of products of
two views is `matmul` (`dot` when 1-D), or `conv2d` (`conv1d`, `conv3d`, by the number of sliding axes)
when an operand's view slides a window along the output (an output axis and a reduced axis step
through the same memory: a convolution's input, or its weight gradient's), a sum of masked windows of
one value (`fold`, PyTorch's name: col2im, which ends a convolution's input gradient) is one word and
not a chain of `add`s, `where(x <= 0, 0, x)` is `relu`. Casts and views are not named.
At most MAX_WORDS ops are named; `ops` lists them all.

Invariant: the name is a function of the kernel's AST (the same kernel has the same name on every
device), and the backends make identifiers of it themselves (it holds a space).
"""
from __future__ import annotations

import math

from atensor.graph.node import Node, toposort
from atensor.graph.ops import ELEMENTWISE, PACKED, Ops, ReduceOp

MAX_WORDS = 4
_UNNAMED = frozenset({Ops.CAST, Ops.BITCAST})


def _const_zero(node: Node) -> bool:
    """A (view of a) constant 0."""
    while node.op is Ops.VIEW:
        node = node.src[0]
    return node.op is Ops.CONST and node.arg[0] == 0


def _is_relu(node: Node) -> bool:
    """where((x < 0) | (x == 0), 0, x), as Tensor.relu builds it (`x <= 0`, false for NaN), or
    where(0 < x, x, 0)."""
    cond = node.src[0]
    if cond.op is Ops.CMPLT:
        return _const_zero(cond.src[0]) and cond.src[1] is node.src[1] and _const_zero(node.src[2])
    if cond.op is not Ops.OR or not _const_zero(node.src[1]):
        return False
    less, equal = cond.src
    x = node.src[2]
    return less.op is Ops.CMPLT and equal.op is Ops.CMPEQ and less.src[0] is x and equal.src[0] is x \
        and _const_zero(less.src[1]) and _const_zero(equal.src[1])


def _is_matmul(node: Node) -> bool:
    """A sum of products of two non-constant operands."""
    src = node.src[0]
    while src.op is Ops.CAST:
        src = src.src[0]
    return node.arg[0] is ReduceOp.SUM and src.op is Ops.MUL \
        and not any(_const_zero(s) or s.op is Ops.CONST for s in src.src)


def _sliding_axes(reduce: Node) -> int:
    """How many output axes of the sum of products `reduce` slide a window over an operand: axes o
    (kept) and r (reduced) of an operand's view, both longer than 1, whose steps meet inside their
    ranges (a * stride[r] == b * stride[o] for some 0 < a < size[r], 0 < b < size[o]), as a
    convolution's input view has (output row o, kernel row r). A matmul's operands have none: a reduced
    axis and a kept one there never step onto the same element. Symbolic sizes or strides count no axis."""
    axes = set(reduce.arg[1])
    most = 0
    for operand in reduce.src[0].src if reduce.src[0].op is Ops.MUL else ():
        while operand.op is Ops.CAST:
            operand = operand.src[0]
        if operand.op is not Ops.VIEW:
            continue
        view = operand.arg
        dims = [(k, size, abs(stride)) for k, (size, stride) in enumerate(zip(view.shape, view.strides))
                if isinstance(size, int) and isinstance(stride, int) and size > 1 and stride != 0]
        sliding = {o for o, o_size, o_stride in dims if o not in axes
                   for r, r_size, r_stride in dims if r in axes
                   and o_stride // math.gcd(o_stride, r_stride) < r_size
                   and r_stride // math.gcd(o_stride, r_stride) < o_size}
        most = max(most, len(sliding))
    return most


def _matmul_word(reduce: Node) -> str:
    """`matmul`, `dot` (1-D) or `convNd` for a sum of products (see `_sliding_axes`)."""
    sliding = _sliding_axes(reduce)
    if sliding:
        return f"conv{sliding}d"
    return "matmul" if len(reduce.src[0].shape) >= 2 else "dot"


def _window_of(node: Node) -> Node | None:
    """The value `node` is a masked window of (a chain of views, one with a mask), else None."""
    masked = False
    while node.op is Ops.VIEW:
        masked = masked or node.arg.mask is not None
        node = node.src[0]
    return node if masked else None


def _folds(nodes: list[Node]) -> dict[Node, tuple[Node, int]]:
    """ADD node -> (the value it sums windows of, how many) for the ADDs whose operands are masked
    windows of one value or such ADDs of it: a fold, the sum of shifted windows back onto a grid."""
    found: dict[Node, tuple[Node, int]] = {}
    for n in nodes:  # in topological order: an ADD's operands are seen first
        if n.op is not Ops.ADD:
            continue
        parts = [found.get(src) or ((_window_of(src), 1) if _window_of(src) is not None else None) for src in n.src]
        if all(p is not None for p in parts) and parts[0][0] is parts[1][0]:
            found[n] = (parts[0][0], parts[0][1] + parts[1][1])
    return found


def _shape(shape: tuple) -> str:
    return "x".join(map(str, shape)) or "1"


def kernel_name(body: Node) -> tuple[str, str]:
    """(name, ops) of the kernel whose stored value is `body`: see the module docstring."""
    if body.op in PACKED:  # q_matmul_q4_1 7x576x1536: rows of x, columns, rows of the weight
        packed = body.arg
        lead = f"{math.prod(body.shape[:-1])}x" if body.op is Ops.QMATMUL else ""
        tail = "_q8act" if body.op is Ops.QMATMUL and packed.q8act else ""
        name = f"q_{body.op.name.lower()}_{packed.format.name}{tail} {lead}{packed.cols}x{packed.rows}"
        return name, f"{body.op.name.lower()} of {packed.format.name} weights {packed.rows}x{packed.cols}"
    nodes = toposort([body])
    named: set[Node] = set()  # nodes a pattern's name covers (the matmul's MUL, the relu's CMPLT)
    folds = _folds(nodes)
    named.update(src for n in folds for src in n.src if src in folds)  # a fold is named by its last ADD
    for n in nodes:
        if n.op is Ops.REDUCE and _is_matmul(n):
            named.add(n.src[0])
        elif n.op is Ops.WHERE and _is_relu(n):
            cond = n.src[0]
            named.update((cond, *cond.src) if cond.op is Ops.OR else (cond,))
    words: list[str] = []
    ops: list[str] = []
    work_shape: tuple = body.shape
    widest = -1
    for n in nodes:
        if n in named:
            continue
        if n.op is Ops.REDUCE:
            word = _matmul_word(n) if _is_matmul(n) else n.arg[0].name.lower()
            ops.append(f"{word} over {_shape(n.src[0].shape)} -> {_shape(n.shape)}")
            if n.src[0].size > widest:
                widest, work_shape = n.src[0].size, n.src[0].shape
        elif n.op is Ops.WHERE and _is_relu(n):
            word = "relu"
            ops.append(f"relu {_shape(n.shape)}")
        elif n in folds:
            word = "fold"
            ops.append(f"fold of {folds[n][1]} windows of {_shape(folds[n][0].shape)} -> {_shape(n.shape)}")
        elif n.op in ELEMENTWISE or n.op in (Ops.GATHER, Ops.SCATTER):
            word = n.op.name.lower()
            ops.append(f"{word} to {n.dtype.name} {_shape(n.shape)}" if n.op in _UNNAMED else f"{word} {_shape(n.shape)}")
            if n.op in _UNNAMED:
                continue
        else:
            continue
        if word not in words:
            words.append(word)
    if not words:
        words = ["cast"] if any(n.op in _UNNAMED for n in nodes) else ["copy"]
    name = "_".join(words[:MAX_WORDS]) + (f"+{len(words) - MAX_WORDS}" if len(words) > MAX_WORDS else "")
    return f"{name} {_shape(work_shape)}", "; ".join(ops) or words[0]


__all__ = ["kernel_name"]
