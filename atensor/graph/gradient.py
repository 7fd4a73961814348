"""Reverse-mode gradients as a rewrite of the lazy graph: one rule per op, in a table.

Why on the graph and not on the Tensor: the graph already records every op with its operands, so
there is no tape to keep and nothing to free after `backward()`; a gradient is just more lazy graph,
built from the forward's nodes, and one realize runs the forward, the backward and the optimizer
step as one task graph (the scheduler fuses across all three). This is tinygrad's design: a table
`GRADIENT` maps each op to a function `(grad_of_output, node) -> one gradient per source` (None
where a source gets no gradient), and `compute_gradient` walks the graph from the root back.

Movement ops are all one `Ops.VIEW` with a `View` argument (reshape, permute, expand, pad, shrink,
flip and stride folded into strides, offset and mask), so there is one VIEW rule for the general
View: `view_backward` scatters the output gradient back onto the source's flat index space by
undoing the View's parts one at a time: the mask is a shrink of the gradient, stride-0 axes are
sums, negative strides are flips, the axis order is a permute, and the remaining positive strides
place each element with pads and reshapes. Common views give the expected graph: the backward of a
permute is a permute, of an expand a sum, of a shrink a pad, of a reshape a reshape. The
alternative (recording the movement ops on the Tensor) would need a second graph beside this one.

Only float nodes carry gradients; comparisons, integer and bool ops, and `DETACH` stop them.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Optional

from atensor.dtype import dtypes
from atensor.graph.node import GraphError, Node, toposort
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.rewrite import Pat, PatternMatcher
from atensor.graph.semantics import fold_constant
from atensor.graph.simplify import const_value
from atensor.graph.viewgrad import view_backward

Grads = tuple[Optional[Node], ...]


def _const(like: Node, value: float) -> Node:
    """A constant with `like`'s dtype, device and shape."""
    return Node.const(value, like.dtype, like.device, like.shape)


def _alu(op: Ops, *src: Node) -> Node:
    """An elementwise node, folded when every operand is a constant: gradients start from a constant
    seed, and a constant gradient can be made on another device instead of copied there."""
    values = [const_value(s) for s in src]
    if all(v is not None for v in values):
        value = fold_constant(op, src[0].dtype, [s.dtype for s in src], values)
        return Node.const(value, src[0].dtype, src[0].device, src[0].shape)
    if op is Ops.MUL and src[0].dtype == src[1].dtype:
        if _is_one(values[1]):
            return src[0]
        if _is_one(values[0]):
            return src[1]
    return src[0].alu(op, *src[1:])


def _is_one(value: object) -> bool:
    return value is not None and not isinstance(value, bool) and value == 1


def _mul(a: Node, b: Node) -> Node:
    return _alu(Ops.MUL, a, b)


def _neg(a: Node) -> Node:
    return _alu(Ops.NEG, a)


def _div(a: Node, b: Node) -> Node:
    return _alu(Ops.FDIV, a, b)


def to_device(node: Node, device: str) -> Node:
    """`node` on `device`: itself, a constant made there, or a COPY."""
    if node.device == device:
        return node
    value = const_value(node)
    if value is not None:
        return Node.const(value, node.dtype, device, node.shape)
    return Node.make(Ops.COPY, node.dtype, (node,), device)


def zeros_like(node: Node) -> Node:
    """A gradient of zeros for `node`."""
    return _const(node, 0.0)


# ---- the rules ---------------------------------------------------------------------------------
def _reduce_rule(ctx: Node, ret: Node) -> Grads:
    op, axes = ret.arg
    src = ret.src[0]
    grad = ctx.expand(src.shape)
    if op is ReduceOp.SUM:
        return (grad,)
    if op is ReduceOp.MAX:
        # ties share the gradient equally (tinygrad's and PyTorch's amax rule)
        is_max = src.alu(Ops.CMPEQ, ret.expand(src.shape)).cast(src.dtype)
        count = is_max.reduce(ReduceOp.SUM, axes).expand(src.shape)
        return (_mul(_div(is_max, count), grad),)
    # PROD: the product of the other elements, exact when some are zero
    zero = src.alu(Ops.CMPEQ, zeros_like(src))
    zeros = zero.cast(src.dtype).reduce(ReduceOp.SUM, axes).expand(src.shape)
    nonzero = zero.alu(Ops.WHERE, _const(src, 1.0), src)
    prod_nonzero = nonzero.reduce(ReduceOp.PROD, axes).expand(src.shape)
    no_zero = zeros.alu(Ops.CMPEQ, _const(src, 0.0))
    one_zero = zeros.alu(Ops.CMPEQ, _const(src, 1.0))
    at_zero = one_zero.alu(Ops.WHERE, prod_nonzero, zeros_like(src))
    elsewhere = no_zero.alu(Ops.WHERE, _div(prod_nonzero, nonzero), zeros_like(src))
    return (_mul(zero.alu(Ops.WHERE, at_zero, elsewhere), grad),)


def _max_rule(ctx: Node, ret: Node) -> Grads:
    x, y = ret.src
    # ties split the gradient in half, as PyTorch's maximum does
    gt = x.alu(Ops.CMPLT, y).alu(Ops.WHERE, zeros_like(x), _const(x, 1.0))
    share = x.alu(Ops.CMPEQ, y).alu(Ops.WHERE, _const(x, 0.5), gt)
    return (_mul(ctx, share), _mul(ctx, share.alu(Ops.SUB, _const(x, 1.0)).alu(Ops.NEG)))


def _pow_rule(ctx: Node, ret: Node) -> Grads:
    x, y = ret.src
    one = _const(x, 1.0)
    # d/dx x^y = y * x^(y-1), taken as 0 where y == 0 (so 0^0 does not give 0 * inf)
    dx = _mul(y, x.alu(Ops.POW, y.alu(Ops.SUB, one)))
    dx = y.alu(Ops.CMPEQ, zeros_like(y)).alu(Ops.WHERE, zeros_like(x), dx)
    # d/dy x^y = x^y * log(x), taken as 0 where x == 0 and y >= 0 (PyTorch's convention)
    dy = _mul(ret, x.alu(Ops.LOG))
    x_zero = x.alu(Ops.CMPEQ, zeros_like(x)).alu(Ops.AND, y.alu(Ops.CMPLT, zeros_like(y)).alu(Ops.NOT))
    dy = x_zero.alu(Ops.WHERE, zeros_like(x), dy)
    return (_mul(ctx, dx), _mul(ctx, dy))


def _assign_rule(ctx: Node, ret: Node) -> Grads:
    view = ret.arg
    # the written region comes from the value; the rest of the storage keeps its old elements
    to_value = ctx.view(view)
    written = Node.const(True, dtypes.bool, ctx.device, view.shape)
    mask = view_backward(written.cast(ctx.dtype), view, ret.shape).alu(Ops.CMPNE, zeros_like(ctx))
    return (mask.alu(Ops.WHERE, zeros_like(ctx), ctx), to_value)


def _gather_rule(ctx: Node, ret: Node) -> Grads:
    source, index = ret.src
    # every position that read source[j] sends its gradient back to j (duplicates add up)
    return (Node.make(Ops.SCATTER, ctx.dtype, (zeros_like(source), index, ctx), "sum"), None)


def _scatter_rule(ctx: Node, ret: Node) -> Grads:
    base, index, values = ret.src
    at_index = Node.make(Ops.GATHER, ctx.dtype, (ctx, index))  # the output gradient where each value went
    if ret.arg == "sum":
        return (ctx, None, at_index)
    if ret.arg == "set":  # overwritten elements of the base get none
        written = Node.make(Ops.SCATTER, ctx.dtype, (zeros_like(base), index, _const(values, 1.0)), "set")
        return (written.alu(Ops.CMPNE, zeros_like(base)).alu(Ops.WHERE, zeros_like(ctx), ctx), None, at_index)
    if ret.arg == "prod":  # made only for integers and bools (tensor/indexing.py), which have no gradient
        raise GraphError("a SCATTER with reduce 'prod' has no gradient rule; floats scatter their products "
                         "through sums of logarithms, which do")
    # "max": whichever of the base element and the values written there equals the result gets it
    won = values.alu(Ops.CMPEQ, Node.make(Ops.GATHER, ret.dtype, (ret, index)))
    return (base.alu(Ops.CMPEQ, ret).alu(Ops.WHERE, ctx, zeros_like(ctx)), None,
            won.alu(Ops.WHERE, at_index, zeros_like(at_index)))


def _allreduce_rule(ctx: Node, ret: Node) -> Grads:
    arg = ret.arg
    if arg.processes:
        raise GraphError("no gradient through an allreduce across processes: reduce the gradients after "
                         "the backward instead (atensor.dist.allreduce_gradients)")
    if arg.op is ReduceOp.SUM:
        scale = 1.0 / len(ret.src) if arg.mean else 1.0
        return tuple(_mul(to_device(ctx, s.device), _const(s, scale)) for s in ret.src)
    if arg.op is ReduceOp.MAX:
        # the partials equal to the result share the gradient; the collective's output on device j
        # is its sibling ALLREDUCE node with index j (no copy)
        on = [Node.make(Ops.ALLREDUCE, ret.dtype, ret.src, replace(arg, index=j))
              for j in range(len(ret.src))]
        masks = tuple(s.alu(Ops.CMPEQ, r).cast(s.dtype) for s, r in zip(ret.src, on))
        grads = []
        for j, s in enumerate(ret.src):
            counting = replace(arg, op=ReduceOp.SUM, index=j, mean=False)
            count = Node.make(Ops.ALLREDUCE, s.dtype, masks, counting)
            grads.append(_mul(_div(masks[j], count), to_device(ctx, s.device)))
        return tuple(grads)
    raise GraphError(f"no gradient rule for a {arg.op.name} allreduce")


def _qmatmul_rule(ctx: Node, ret: Node) -> Grads:
    """x @ W^T with W packed (rows, cols): x's gradient is ctx @ W, W decoded by a DEQUANT of the same
    bytes (a LoRA on a quantized base model trains through it); the packed bytes get none."""
    x, packed = ret.src
    w = Node.make(Ops.DEQUANT, dtypes.float32, (packed,), ret.arg)  # (rows, cols)
    lead, (rows, cols) = ctx.shape[:-1], w.shape
    a = ctx.reshape(lead + (rows, 1)).expand(lead + (rows, cols))
    b = w.reshape((1,) * len(lead) + (rows, cols)).expand(lead + (rows, cols))
    dx = _mul(a, b).reduce(ReduceOp.SUM, (len(lead),)).reshape(x.shape)
    return (dx, None)


def _no_grad(*_: Node, **__: Node) -> Grads:
    return (None, None, None)


_LN2 = math.log(2)
r = Pat(name="ret")


def _rule(op: Ops | frozenset[Ops], fn: Callable[..., Grads]) -> tuple[Pat, Callable[..., Grads]]:
    return Pat(op, name="ret"), fn


GRADIENT = PatternMatcher([
    # elementwise, unary: the derivative times the output gradient
    _rule(Ops.NEG, lambda ctx, ret: (_neg(ctx),)),
    _rule(Ops.RECIP, lambda ctx, ret: (_neg(_mul(ctx, _mul(ret, ret))),)),
    _rule(Ops.SQRT, lambda ctx, ret: (_div(ctx, _mul(ret, _const(ret, 2.0))),)),
    _rule(Ops.EXP, lambda ctx, ret: (_mul(ctx, ret),)),
    _rule(Ops.EXP2, lambda ctx, ret: (_mul(ctx, _mul(ret, _const(ret, _LN2))),)),
    _rule(Ops.LOG, lambda ctx, ret: (_div(ctx, ret.src[0]),)),
    _rule(Ops.LOG2, lambda ctx, ret: (_div(ctx, _mul(ret.src[0], _const(ret, _LN2))),)),
    _rule(Ops.SIN, lambda ctx, ret: (_mul(ctx, ret.src[0].alu(Ops.COS)),)),
    _rule(Ops.COS, lambda ctx, ret: (_neg(_mul(ctx, ret.src[0].alu(Ops.SIN))),)),
    _rule(Ops.TANH, lambda ctx, ret: (_mul(ctx, _const(ret, 1.0).alu(Ops.SUB, _mul(ret, ret))),)),
    _rule(Ops.CAST, lambda ctx, ret: (ctx.cast(ret.src[0].dtype),)),
    _rule(frozenset({Ops.TRUNC, Ops.NOT, Ops.BITCAST}), lambda ctx, ret: (None,)),
    # binary
    _rule(Ops.ADD, lambda ctx, ret: (ctx, ctx)),
    _rule(Ops.SUB, lambda ctx, ret: (ctx, _neg(ctx))),
    _rule(Ops.MUL, lambda ctx, ret: (_mul(ctx, ret.src[1]), _mul(ctx, ret.src[0]))),
    _rule(Ops.FDIV, lambda ctx, ret: (_div(ctx, ret.src[1]), _neg(_div(_mul(ctx, ret), ret.src[1])))),
    _rule(Ops.MOD, lambda ctx, ret: (ctx, _neg(_mul(ctx, ret.src[0].alu(Ops.IDIV, ret.src[1]))))),
    _rule(Ops.IDIV, lambda ctx, ret: (None, None)),
    _rule(Ops.MAX, _max_rule),
    _rule(Ops.POW, _pow_rule),
    _rule(frozenset({Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.THREEFRY}), _no_grad),
    # ternary: the condition gets none; each branch gets the gradient where it was chosen
    _rule(Ops.WHERE, lambda ctx, ret: (None, ret.src[0].alu(Ops.WHERE, ctx, zeros_like(ctx)),
                                       ret.src[0].alu(Ops.WHERE, zeros_like(ctx), ctx))),
    _rule(Ops.REDUCE, _reduce_rule),
    # packed weights: the weights (bytes) are constants of the model; x's gradient goes through them
    _rule(Ops.QMATMUL, _qmatmul_rule),
    _rule(Ops.DEQUANT, lambda ctx, ret: (None,)),
    # indexing: a gather's gradient is a scatter-add, a scatter's a gather
    _rule(Ops.GATHER, _gather_rule),
    _rule(Ops.SCATTER, _scatter_rule),
    _rule(Ops.VIEW, lambda ctx, ret: (view_backward(ctx, ret.arg, ret.src[0].shape),)),
    # realization and devices: the value passes through; a copy's gradient goes back by copy
    _rule(Ops.CONTIGUOUS, lambda ctx, ret: (ctx,)),
    _rule(Ops.DETACH, lambda ctx, ret: (None,)),
    _rule(Ops.COPY, lambda ctx, ret: (Node.make(Ops.COPY, ctx.dtype, (ctx,), ret.src[0].device),)),
    _rule(Ops.ASSIGN, _assign_rule),
    # multi-device: a collective's gradient goes back to every partial's device
    _rule(Ops.ALLREDUCE, _allreduce_rule),
])


def rule_for(node: Node, grad: Node) -> Grads:
    """The gradients of `node`'s sources given the gradient of `node`, from the `GRADIENT` table."""
    for pat, fn in GRADIENT.by_op.get(node.op, ()):
        bound: dict[str, Node] = {}
        if pat.match(node, bound):
            return fn(grad, **bound)
    raise GraphError(f"no gradient rule for {node.op.name}; add one to atensor/graph/gradient.py")


def _carries_gradient(node: Node) -> bool:
    return dtypes.is_float(node.dtype) and node.op is not Ops.DETACH


def seed_roots(root: Node, root_grad: Node) -> list[tuple[Node, Node]]:
    """The single-device roots to start from, each with its gradient. A sharded root starts from
    every shard; a replicated one from its first replica only (all replicas hold the same value,
    so one of them is the function being differentiated; seeding all would count it n times)."""
    if root.op is not Ops.MULTI:
        return [(root, root_grad)]
    from atensor.graph import multi
    axis, bounds = root.arg
    if not (root_grad.op is Ops.MULTI and root_grad.arg == root.arg and root_grad.device == root.device):
        root_grad = multi.reshard(root_grad, root.device, axis, bounds)
    if axis is None:
        return [(root.src[0], root_grad.src[0])]
    return list(zip(root.src, root_grad.src))


def combine_shards(target: Node, grads: list[Optional[Node]]) -> Node:
    """The gradient of a multi-device `target` from the gradients of its shards: a sharded target's
    gradient is sharded alike; a replicated target is one value used on every device, so its
    gradient is the sum of its replicas' gradients, an allreduce (data parallel training). For
    that sum to count each use once, the replicas must be differentiated as independent leaves
    (`compute_gradient`'s `leaves`), also when a replica is a lazy copy of another."""
    from atensor.graph import multi
    parts = [g if g is not None else zeros_like(s) for s, g in zip(target.src, grads)]
    if target.arg[0] is None:
        return multi.allreduce(parts, ReduceOp.SUM)
    return Node.make(Ops.MULTI, target.dtype, tuple(parts), target.arg)


def compute_gradient(root: Node, root_grad: Node, targets: set[Node],
                     leaves: frozenset[Node] = frozenset()) -> dict[Node, Node]:
    """The gradient of `root` (seeded with `root_grad`) with respect to each of `targets` (single-
    device nodes) that `root` depends on through float ops; targets it does not reach are left out.
    Gradients do not flow past `leaves` into their sources (the replicas of a replicated target are
    independent copies even when one was made from another: see `combine_shards`).

    Walks the nodes between `root` and the targets from the root back, applying one rule per node
    and adding up the gradients of nodes with several users. Nothing runs: the result is lazy graph.
    """
    if root_grad.shape != root.shape:
        raise GraphError(f"gradient of shape {root_grad.shape} for a root of shape {root.shape}")
    seeds = seed_roots(root, root_grad)
    order = toposort([r for r, _ in seeds])
    on_path: set[Node] = set()
    for node in order:  # sources first: a node is on a path when a source is, or it is a target
        if node in targets or (_carries_gradient(node) and any(s in on_path for s in node.src)):
            on_path.add(node)
    grads: dict[Node, Node] = dict(seeds)
    for node in reversed(order):  # users first: a node's gradient is complete when it is reached
        grad = grads.get(node)
        if grad is None or node not in on_path or not node.src or node in leaves:
            continue
        for src, src_grad in zip(node.src, rule_for(node, grad)):
            if src_grad is None or src not in on_path or not dtypes.is_float(src.dtype):
                continue
            if src_grad.shape != src.shape:
                raise GraphError(f"gradient rule for {node.op.name} gave shape {src_grad.shape} for a "
                                 f"source of shape {src.shape}")
            if src_grad.dtype != src.dtype:
                src_grad = src_grad.cast(src.dtype)
            old = grads.get(src)
            grads[src] = src_grad if old is None else _accumulate(old, src_grad)
    return {t: grads[t] for t in targets if t in grads}


def _accumulate(old: Node, new: Node) -> Node:
    """old + new. Two reshapes of same-shaped values add before the reshape: the contributions of a
    convolution's kernel offsets to a flat buffer's gradient then stay pads of one N-d shape, which the
    backend adds in place into each padded region, instead of a reshaped copy per offset."""
    if old.op is Ops.VIEW and new.op is Ops.VIEW and old.src[0].shape == new.src[0].shape \
            and old.arg.is_identity(old.src[0].size) and new.arg.is_identity(new.src[0].size) \
            and old.src[0].dtype == new.src[0].dtype:
        return old.src[0].alu(Ops.ADD, new.src[0]).reshape(old.shape)
    return old.alu(Ops.ADD, new)
