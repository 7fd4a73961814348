"""Collectives across processes on tensors: what a data-parallel training step adds to its graph.

Why graph nodes and not a call after the step: an allreduce across processes is an ALLREDUCE node
whose arg says `processes`, so it is scheduled with the rest of the step: the scheduler reduces the
process's partials among its devices, puts one NetAllReduce task per segment on the devices' `net`
queues and broadcasts back (sched/allreduce.py), the buckets of a model's gradients overlap the
backward of earlier layers, and a jit replay submits the net tasks with every other task.

`allreduce` of a tensor whose value is already an allreduce over this process's devices (the
gradient of a replicated weight) becomes one hierarchical collective over the same partials; of any
other tensor, a collective over its one value (from the first device, replicated back).

Autograd does not pass through a collective across processes (its gradient rule raises): data
parallel training reduces the gradients after the backward, as DDP does.
"""
from __future__ import annotations

from typing import Any, Sequence

from atensor.dist.processes import world
from atensor.graph import multi
from atensor.graph.node import GraphError, Node
from atensor.graph.ops import Ops
from atensor.tensor import Tensor
from atensor.tensor.multi import _REDUCE_OPS


def allreduce(t: Tensor, op: str = "sum") -> Tensor:
    """`t` combined with `op` ("sum", "mean", "max", "prod") over every process of the world, laid
    out as `t` is (on its device, or replicated on its devices). In a world of one process: `t`.

    >>> allreduce(Tensor([1.0, 2.0])).tolist()  # one process: the value itself
    [1.0, 2.0]
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"allreduce: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    if world().size == 1:
        return t
    rop, mean = _REDUCE_OPS[op]
    node = _undetached(t.node)
    if node.op is not Ops.MULTI:  # one device: one net task from the value to the result
        return Tensor(_across((node,), rop, mean)[0])
    axis, _ = node.arg
    if axis is not None:
        raise GraphError(f"allreduce across processes of a tensor split on axis {axis} over {node.device}: "
                         f"reduce it or replicate it (.to(devices)) first")
    members = tuple(_undetached(m) for m in node.src)
    first = members[0]
    local = first.arg if first.op is Ops.ALLREDUCE else None
    siblings = all(m.op is Ops.ALLREDUCE and m.src == first.src and m.arg.index == i
                   for i, m in enumerate(members))
    if local is not None and not local.processes and local.op is rop and local.mean == mean and siblings:
        # the process's allreduce, extended over every process: hierarchical, on the same partials
        return Tensor(multi.allreduce(first.src, rop, local.algorithm, mean, processes=True))
    # a replicated value: one collective on the first device's replica, then replicated again
    reduced = _across((first,), rop, mean)[0]
    return Tensor(multi.reshard(reduced, node.device, None))


def _undetached(node: Node) -> Node:
    """`node` without a DETACH on top: the collective's value has no gradient anyway."""
    return node.src[0] if node.op is Ops.DETACH else node


def _across(partials: Sequence[Node], rop: Any, mean: bool) -> tuple[Node, ...]:
    return multi.allreduce(partials, rop, mean=mean, processes=True).src


def allreduce_gradients(tensors: Any, op: str = "sum") -> None:
    """Replaces each tensor's `.grad` by its `op` over every process (lazily, into the step's graph).
    `tensors`: an optimizer (its `targets`: the flat buffer when fused) or a sequence of tensors; call
    it after `backward()` and before the optimizer's step."""
    if world().size == 1:
        return
    for t in getattr(tensors, "targets", tensors):
        if t.grad is not None:
            t.grad = allreduce(t.grad, op)
