"""Sharded tensors: `shard`, `to(devices)`, explicit `allreduce`, and the per-shard storage helpers.

A sharded tensor is an ordinary Tensor whose node is a MULTI (graph/multi.py): every op method works
on it unchanged, because the graph rules push each op through MULTI when the node is built. This
mixin adds what the graph cannot do alone: choosing devices and bounds, realizing, assigning and
reading each shard's own storage, and reading the whole value back into one numpy array.

    >>> t = Tensor.arange(8).shard(("CPU:0", "CPU:1"), axis=0)
    >>> t.device, (t * 2).sum().item()
    (('CPU:0', 'CPU:1'), 56)
"""
from __future__ import annotations

from typing import Any, Optional, Self, Sequence

import numpy as np

from atensor.graph import multi
from atensor.graph.node import GraphError, Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.hcq.device import canonical


_REDUCE_OPS = {"sum": (ReduceOp.SUM, False), "max": (ReduceOp.MAX, False), "prod": (ReduceOp.PROD, False),
               "mean": (ReduceOp.SUM, True)}


def _devices(devices: Any) -> tuple[str, ...]:
    if isinstance(devices, str) or not isinstance(devices, (tuple, list)) or not devices:
        raise GraphError(f"devices must be a non-empty tuple or list of device names, got {devices!r}")
    return canonical(tuple(devices))  # type: ignore[return-value]


class MultiOps:
    """The multi-device methods of Tensor."""
    __slots__ = ()

    def shard(self, devices: Sequence[str], axis: Optional[int] = None,
              splits: Optional[Sequence[int]] = None) -> Self:
        """This tensor split along `axis` over `devices` (`axis=None`: a full copy on each device).
        The split is as even as possible (the first `size % n` shards get one more row), or `splits`
        gives each device's size. Shapes and values stay those of the unsharded tensor; ops run per
        shard, and a reduction over `axis` becomes an allreduce.

        >>> Tensor.ones(5, 3).shard(("CPU:0", "CPU:1"), axis=0).sum(axis=0).tolist()
        [5.0, 5.0, 5.0]
        """
        devs = _devices(devices)
        if axis is not None:
            ndim = len(self.shape)
            if not -max(ndim, 1) <= axis < max(ndim, 1) or ndim == 0:
                raise IndexError(f"shard: axis {axis} is out of range for a tensor with {ndim} dimensions")
            axis = axis + ndim if axis < 0 else axis
        bounds = None
        if axis is not None and splits is not None:
            bounds = multi.even_bounds(self.shape[axis], len(devs), splits)
        if axis is None and splits is not None:
            raise GraphError("shard: splits need an axis")
        return self._new(self._own_storage(multi.reshard(self.node, devs, axis, bounds)))

    def _own_storage(self, node: Node) -> Node:
        """`node` with every shard that is a view of this tensor's own storage (the part that stays on
        its device) cloned: a sharded tensor never aliases its source, so assigning to it (an
        optimizer step on replicated weights) cannot change the tensor it was made from."""
        if node.op is not Ops.MULTI:
            return node
        cls = type(self)
        parts = tuple(cls(s).clone().node if s.base().op in (Ops.BUFFER, Ops.ASSIGN) else s  # type: ignore
                      for s in node.src)
        return Node.make(Ops.MULTI, node.dtype, parts, node.arg)

    def shard_(self, devices: Sequence[str], axis: Optional[int] = None,
               splits: Optional[Sequence[int]] = None) -> Self:
        """`shard` in place: this tensor becomes the sharded one."""
        self._node = self.shard(devices, axis, splits).node
        return self

    @property
    def shard_axis(self) -> Optional[int]:
        """The axis a sharded tensor is split on (None when replicated or on one device)."""
        return multi.layout(self.node)[0]

    @property
    def shard_bounds(self) -> Optional[tuple[tuple[int, int], ...]]:
        """Per device, the [start, end) rows of `shard_axis` it holds (None unless split)."""
        return multi.layout(self.node)[1]

    @property
    def shards(self) -> list[Self]:
        """Each device's part as a single-device tensor (the tensor itself when on one device)."""
        return [self._new(s) for s in multi.shards(self.node)]

    @classmethod
    def from_shards(cls, parts: Sequence[Self], axis: Optional[int] = None) -> Self:
        """One sharded tensor from one single-device tensor per device, without copying: the parts are
        its shards, concatenated along `axis` (`axis=None`: the parts are replicas of one value, so
        they must have one shape). What jax's `make_array_from_single_device_arrays` does; a batch
        whose parts are made on their devices (from numpy, say) needs no copies to be sharded.

        >>> a, b = Tensor([[1.0], [2.0]], device="CPU:0"), Tensor([[3.0]], device="CPU:1")
        >>> Tensor.from_shards([a, b], axis=0).sum(axis=0).tolist()
        [6.0]
        """
        nodes = [p.node for p in parts]
        if not nodes or any(n.op is Ops.MULTI for n in nodes):
            raise GraphError("from_shards takes one single-device tensor per device")
        devices = [n.device for n in nodes]
        if len(set(devices)) != len(devices):
            raise GraphError(f"from_shards needs the parts on distinct devices, got {tuple(devices)}")
        if len({n.dtype for n in nodes}) != 1:
            raise GraphError(f"from_shards: the parts have different dtypes "
                             f"{tuple(n.dtype.name for n in nodes)}")
        shape = nodes[0].shape
        if axis is None:
            if any(n.shape != shape for n in nodes):
                raise GraphError(f"from_shards: replicas must have one shape, got {[n.shape for n in nodes]}")
        else:
            if not 0 <= axis < len(shape):
                raise IndexError(f"from_shards: axis {axis} is out of range for parts of shape {shape}")
            rest = shape[:axis] + shape[axis + 1:]
            if any(len(n.shape) != len(shape) or n.shape[:axis] + n.shape[axis + 1:] != rest for n in nodes):
                raise GraphError(f"from_shards: parts must agree on every axis but {axis}, got "
                                 f"{[n.shape for n in nodes]}")
        return cls(multi.make(nodes, axis))  # type: ignore[call-arg]

    @classmethod
    def allreduce(cls, parts: Sequence[Self], op: str = "sum", algorithm: str = "auto") -> Self:
        """Combines one tensor per device (same shapes, distinct devices) with `op` ("sum", "max",
        "prod" or "mean") into a tensor replicated on all of them: one collective, lowered by the
        scheduler to naive or ring steps ("auto": chosen by the cost model in sched/allreduce.py).

        >>> a, b = Tensor([1.0, 2.0], device="CPU:0"), Tensor([3.0, 4.0], device="CPU:1")
        >>> Tensor.allreduce([a, b], "mean").tolist()
        [2.0, 3.0]
        """
        if op not in _REDUCE_OPS:
            raise ValueError(f"allreduce: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        if algorithm not in multi.ALGORITHMS:
            raise ValueError(f"allreduce: algorithm must be one of {multi.ALGORITHMS}, got {algorithm!r}")
        nodes = [p.node for p in parts]
        if not nodes or any(n.op is Ops.MULTI for n in nodes):
            raise GraphError("allreduce takes one single-device tensor per device")
        rop, mean = _REDUCE_OPS[op]
        return cls(multi.allreduce(nodes, rop, algorithm, mean))  # type: ignore[call-arg]

    # ---- helpers for Tensor.to / assign / clone / numpy on sharded tensors -----------------------------
    def _to_devices(self, device: Any) -> Self:
        """`to` for a tuple of devices (replicate) or from a sharded tensor to one device (gather)."""
        if isinstance(device, (tuple, list)):
            return self._new(self._own_storage(multi.reshard(self.node, _devices(device), None)))
        node = multi.gather(self.node, canonical(device))
        base = node.base()
        if base.op is Ops.ASSIGN:  # the parts are written into a new buffer: its newest version
            from atensor.ledger import versions
            versions.set_head(versions.storage_of(base), base)
        return self._new(node)

    def _assign_shards(self, value: Any) -> Self:
        """`assign` on a sharded tensor: each shard's storage gets its part of `value`, laid out like
        this tensor (a value sharded differently, or on one device, is moved first)."""
        cls = type(self)
        node = self.node
        if not isinstance(value, cls):
            value = cls.full(self.shape, value, dtype=self.dtype, device=self.device)
        if value.shape != self.shape:
            value = value._broadcast_to(self.shape)
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)
        axis, bounds = node.arg
        moved = multi.reshard(value.node, node.device, axis, bounds)
        out = []
        for target, part in zip(node.src, moved.src):
            out.append(cls(target).assign(cls(part)).node)  # type: ignore[call-arg]
        self._node = Node.make(Ops.MULTI, node.dtype, tuple(out), node.arg)
        return self

    def _clone_shards(self) -> Self:
        cls = type(self)
        node = self.node
        parts = tuple(cls(s).clone().node for s in node.src)  # type: ignore[call-arg]
        return self._new(Node.make(Ops.MULTI, node.dtype, parts, node.arg))

    def _is_ready(self) -> bool:
        """True when this single-device tensor is a view of a buffer with no pending writes."""
        from atensor.hcq.buffer import Buffer
        base = self.node.base()
        return base.op is Ops.BUFFER and Buffer.of(base.arg[0]).ready()

    def _multi_numpy(self) -> np.ndarray:
        """The whole value of a sharded tensor, read from each shard's buffer (replicated: the first)."""
        cls = type(self)
        node = self.node
        # a replica is read from the first device alone: only it has to be ready
        parts = [cls(s) for s in (node.src if node.arg[0] is not None else node.src[:1])]  # type: ignore[call-arg]
        if any(not p._is_ready() for p in parts):
            self._refuse_in_loop("numpy")  # type: ignore[attr-defined]
            self.realize().wait()
            node = self.node
            parts = [cls(s) for s in node.src]  # type: ignore[call-arg]
        axis, bounds = node.arg
        if axis is None:
            return parts[0].numpy()
        order = sorted(range(len(parts)), key=lambda i: bounds[i])
        return np.concatenate([parts[i].numpy() for i in order], axis=axis)
