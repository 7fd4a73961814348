"""Multi-device values as graph nodes: MULTI holds one node per device, ALLREDUCE combines partials.

Why a graph op and not a second tensor class: a sharded tensor is then an ordinary `Tensor` whose
node is `MULTI(shard_0, ..., shard_{n-1})` with arg `(axis, bounds)`: shard i holds the logical
rows `bounds[i]` of `axis` (`axis=None`: every shard holds the whole value, replicated). The node's
shape is the logical (unsharded) shape and its device is the tuple of the shards' devices, as in
tinygrad. Every Tensor method works unchanged because the rules below push each op through MULTI
when the op's node is built (`Node.make` and `Node._movement` call into this module, through the rules
graph/__init__.py hands graph/node.py): elementwise
ops and reductions over other axes run per shard, movement ops move each shard and recompute the
bounds, a reduction over the sharded axis becomes per-device partials combined by ALLREDUCE, and a
copy to one device gathers.

Invariant (kept at construction, relied on by sched/ and the backends): MULTI is the only node whose
device is a tuple, and no node but MULTI has a MULTI source. So the scheduler never sees a sharded
op; it sees single-device kernels, copies, and ALLREDUCE collectives that it lowers to ring or naive
steps (sched/allreduce.py).

Bounds are intervals of the sharded axis, one per device, that tile [0, size) in *any* order, and
may be empty. That makes basic indexing communication-free: a shrink keeps each shard's
intersection (`t[3]` leaves one device with one row and the others with none), a flip reverses
each shard and mirrors the bounds, a stride keeps each shard's own multiples. Uneven splits are the
same thing: `shard(devices, axis, splits=(3, 1, 4))`.

Alternatives rejected: tinygrad's older MultiLazyBuffer (a parallel class every op must know about)
and lowering sharded ops at schedule time (views fold into one View at construction, so the
individual movement ops a per-shard rule needs would be lost by then).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from atensor.dtype import DType
from atensor.graph.node import GraphError, Node, ledger_hooks
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.semantics import reduce_identity
from atensor.graph.view import View

Bounds = tuple[tuple[int, int], ...]
Box = tuple[tuple[int, int], ...]
ALGORITHMS = ("auto", "naive", "ring")


@dataclass(frozen=True)
class AllReduceArg:
    """What an ALLREDUCE node computes: `op` over its sources (one partial per device), divided by
    their count when `mean`, as seen on device `src[index]`. `algorithm` is "auto" (the cost model
    in sched/allreduce.py decides), "naive" or "ring". `processes`: the sources are this process's
    partials and the value is `op` over the partials of every process of the world (atensor/dist/):
    reduced here first, then across processes by the devices' `net` queues."""
    op: ReduceOp
    index: int
    algorithm: str = "auto"
    mean: bool = False
    processes: bool = False


# ---- shape and device of MULTI and ALLREDUCE (called from node._infer) ------------------------------
# What `infer` found for a signature: it reads only the op, the arg and each source's shape, device and
# dtype, so a signature seen before (every op of a repeated step: each op on a sharded value makes one
# MULTI) skips the checks. Measured on the flagship's 2-device eager step (bench/train_step.py's, Zen 5,
# load 10): the checks were 15-20% of the forward's and the loss's graph building. Only valid signatures
# are kept (an invalid one raises each time); bounded, cleared when full.
_inferred: dict[tuple, tuple[tuple[int, ...], tuple[str, ...] | str]] = {}
_INFERRED_MAX = 4096


def infer(op: Ops, src: tuple[Node, ...], arg: Any) -> tuple[tuple[int, ...], tuple[str, ...] | str]:
    """Logical shape and device(s) of a MULTI or ALLREDUCE node; raises GraphError when invalid."""
    key = (op, arg, tuple([(s.shape, s.device, s.dtype) for s in src]))
    found = _inferred.get(key)
    if found is None:
        found = _checked(op, src, arg)
        if len(_inferred) >= _INFERRED_MAX:
            _inferred.clear()
        _inferred[key] = found
    return found


def _checked(op: Ops, src: tuple[Node, ...], arg: Any) -> tuple[tuple[int, ...], tuple[str, ...] | str]:
    """`infer`'s rules, checked in full."""
    if not src:
        raise GraphError(f"{op.name} needs at least one source")
    devices = tuple(s.device for s in src)
    if any(not isinstance(d, str) for d in devices) or len(set(devices)) != len(devices):
        raise GraphError(f"{op.name} needs one single-device source per distinct device, got {devices}")
    if any(s.dtype != src[0].dtype for s in src):
        raise GraphError(f"{op.name} sources differ in dtype: {[s.dtype.name for s in src]}")
    if op is Ops.ALLREDUCE:
        if any(s.shape != src[0].shape for s in src):
            raise GraphError(f"allreduce of partials with different shapes: {[s.shape for s in src]}")
        if not 0 <= arg.index < len(src) or arg.algorithm not in ALGORITHMS:
            raise GraphError(f"bad allreduce argument {arg} for {len(src)} devices")
        return src[0].shape, devices[arg.index]
    axis, bounds = arg
    first = src[0].shape
    if axis is None:
        if bounds is not None or any(s.shape != first for s in src):
            raise GraphError(f"replicated MULTI needs equal shapes, got {[s.shape for s in src]}")
        return first, devices
    if not 0 <= axis < len(first) or bounds is None or len(bounds) != len(src):
        raise GraphError(f"MULTI: axis {axis} and bounds {bounds} do not fit {len(src)} sources of shape "
                         f"{first}")
    for s, (b, e) in zip(src, bounds):
        others_differ = any(x != y for i, (x, y) in enumerate(zip(s.shape, first)) if i != axis)
        if len(s.shape) != len(first) or others_differ or e - b != s.shape[axis] or b < 0:
            raise GraphError(f"MULTI: shard of shape {s.shape} does not fit bounds {(b, e)} on axis {axis}")
    size = _tiled_size(bounds)
    return first[:axis] + (size,) + first[axis + 1:], devices


def _tiled_size(bounds: Bounds) -> int:
    """The size of the axis that `bounds` tile; raises when they overlap or leave a gap."""
    end = 0
    for b, e in sorted((b, e) for b, e in bounds if e > b):
        if b != end:
            raise GraphError(f"MULTI bounds {bounds} must tile the sharded axis without gaps or overlaps")
        end = e
    if any(not 0 <= b <= end for b, e in bounds if e == b):
        raise GraphError(f"MULTI bounds {bounds}: an empty shard lies outside the axis")
    return end


# ---- building MULTI nodes -------------------------------------------------------------------------
def make(shards: Sequence[Node], axis: Optional[int], bounds: Optional[Bounds] = None) -> Node:
    """MULTI of `shards`; bounds default to the shards' sizes along `axis`, in device order."""
    if axis is not None and bounds is None:
        starts = [0]
        for s in shards:
            starts.append(starts[-1] + s.shape[axis])
        bounds = tuple(zip(starts, starts[1:]))
    arg = (axis, None if axis is None else tuple(bounds))
    return Node.make(Ops.MULTI, shards[0].dtype, tuple(shards), arg)


def even_bounds(size: int, n: int, splits: Optional[Sequence[int]] = None) -> Bounds:
    """Bounds for `n` shards of an axis of `size`: as even as possible (the first `size % n` shards get
    one more, as numpy's array_split), or the given `splits` sizes."""
    if splits is None:
        base, extra = divmod(size, n)
        splits = [base + (1 if i < extra else 0) for i in range(n)]
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != size:
        raise GraphError(f"shard: splits {tuple(splits)} must be {n} non-negative sizes adding up to {size}")
    starts = [0]
    for s in splits:
        starts.append(starts[-1] + s)
    return tuple(zip(starts, starts[1:]))


def layout(node: Node) -> tuple[Optional[int], Optional[Bounds]]:
    """(axis, bounds) of a MULTI node; (None, None) for a single-device node."""
    return node.arg if node.op is Ops.MULTI else (None, None)


def shards(node: Node) -> tuple[Node, ...]:
    return node.src if node.op is Ops.MULTI else (node,)


def _boxes(node: Node) -> list[tuple[Node, Box]]:
    """Each shard with the region of the logical value it holds."""
    axis, bounds = layout(node)
    full = tuple((0, s) for s in node.shape)
    if axis is None:
        return [(s, full) for s in shards(node)]
    return [(s, full[:axis] + (b,) + full[axis + 1:]) for s, b in zip(node.src, bounds)]


def _copy(node: Node, device: str) -> Node:
    """`node` on `device`: itself, a constant made there, or a COPY."""
    if node.device == device:
        return node
    rows = View.create(node.shape).strides
    if node.op is Ops.VIEW and not node.arg.contiguous and node.arg.mask is None and all(
            st == want or n == 1 for n, st, want in zip(node.shape, node.arg.strides, rows)):
        node = node.reshape((node.size,)).reshape(node.shape)  # a run of rows: contiguous, so a plain copy
    from atensor.graph.simplify import const_value
    value = const_value(node)
    if value is not None:
        return Node.const(value, node.dtype, device, node.shape)
    return Node.make(Ops.COPY, node.dtype, (node,), device)


def region(node: Node, device: str, box: Box) -> Node:
    """The part `box` of `node`'s logical value, on `device`. From a replicated value (or one device)
    it is one shrink and at most one copy; from a sharded one each shard that overlaps the box sends
    its part, and the parts are written into one new buffer on `device` (an ASSIGN per part, so a
    contiguous part is a plain copy into place)."""
    shape = tuple(e - b for b, e in box)
    parts: list[tuple[Node, Box]] = []
    boxes = _boxes(node)
    if layout(node)[0] is None:
        src = next((s for s, _ in boxes if s.device == device), boxes[0][0])
        return _copy(src.shrink(box), device)
    for shard, held in boxes:
        inter = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(held, box))
        if any(b >= e for b, e in inter):
            continue
        local = shard.shrink(tuple((b - h, e - h) for (b, e), (h, _) in zip(inter, held)))
        parts.append((_copy(local, device), tuple((b - o, e - o) for (b, e), (o, _) in zip(inter, box))))
    if len(parts) == 1 and parts[0][1] == tuple((0, s) for s in shape):
        return parts[0][0]
    return assemble(parts, shape, node.dtype, device)


def assemble(parts: list[tuple[Node, Box]], shape: tuple[int, ...], dtype: DType, device: str) -> Node:
    """A new buffer of `shape` on `device` with each part written into its box (the boxes tile it)."""
    from atensor.graph.node import BufferSpec
    if math.prod(shape) == 0 or not parts:
        return Node.const(0, dtype, device, shape)
    spec = BufferSpec(device, math.prod(shape), dtype)
    storage = spec.node(0)
    whole = View.create((spec.size,)).reshape(shape)
    for value, box in parts:
        storage = Node.make(Ops.ASSIGN, dtype, (storage, value), whole.shrink(box))
    ledger_hooks.set_head(spec, storage)  # the newest version is this lazy one (what a Tensor view follows)
    return storage.reshape(shape)


def reshard(node: Node, devices: Sequence[str], axis: Optional[int], bounds: Optional[Bounds] = None) -> Node:
    """`node` (single-device or MULTI) laid out on `devices`, split on `axis` (None: replicated)."""
    devices = tuple(devices)
    if len(devices) == 0 or len(set(devices)) != len(devices):
        raise GraphError(f"shard needs distinct devices, got {devices}")
    if axis is not None:
        if not 0 <= axis < len(node.shape):
            raise GraphError(f"shard: axis {axis} is out of range for shape {node.shape}")
        bounds = even_bounds(node.shape[axis], len(devices)) if bounds is None else tuple(bounds)
        _tiled_size(bounds)
    else:
        bounds = None
    if node.op is Ops.MULTI and node.device == devices and node.arg == (axis, bounds):
        return node
    return Node.make(Ops.MULTI, node.dtype, _resharded(node, devices, axis, bounds), (axis, bounds))


def _resharded(node: Node, devices: tuple[str, ...], axis: Optional[int],
               bounds: Optional[Bounds]) -> tuple[Node, ...]:
    """The shards `reshard` wraps in MULTI (checked arguments): the part of `node` each device holds.
    `_per_shard` takes them as they are (its operands' parts), without the MULTI it would drop."""
    full = tuple((0, s) for s in node.shape)
    if node.op is Ops.MULTI and node.arg[0] is None and node.device == devices:
        # replicated on these very devices (a bias or weight beside sharded activations): each device
        # slices its own replica, what `region` finds for it, without searching the boxes for a source
        if axis is None:
            return node.src
        return tuple(s.shrink(full[:axis] + (b,) + full[axis + 1:]) for s, b in zip(node.src, bounds))
    if axis is None:
        return tuple(region(node, dev, full) for dev in devices)
    return tuple(region(node, dev, full[:axis] + (b,) + full[axis + 1:]) for dev, b in zip(devices, bounds))


def gather(node: Node, device: str) -> Node:
    """The whole value of a MULTI node on one device."""
    return region(node, device, tuple((0, s) for s in node.shape))


def allreduce(partials: Sequence[Node], op: ReduceOp, algorithm: str = "auto", mean: bool = False,
              processes: bool = False) -> Node:
    """A replicated MULTI whose shard i is `op` over all `partials` (one per device; with `processes`,
    also over every process's), computed by one collective (the ALLREDUCE nodes share their sources,
    so the scheduler lowers them together)."""
    src = tuple(partials)
    members = tuple(Node.make(Ops.ALLREDUCE, src[0].dtype, src,
                              AllReduceArg(op, i, algorithm, mean, processes)) for i in range(len(src)))
    return Node.make(Ops.MULTI, src[0].dtype, members, (None, None))


# ---- the rules: ops built on MULTI sources --------------------------------------------------------
def push(op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any) -> Node:
    """The node for `op` applied to sources of which some are MULTI (or a leaf made on a tuple of
    devices): the same op per shard, wrapped in MULTI."""
    if op is Ops.CONST or op is Ops.ARANGE:
        devices = arg[-1]
        return Node.make(Ops.MULTI, dtype, tuple(Node.make(op, dtype, (), arg[:-1] + (d,)) for d in devices),
                         (None, None))
    if op is Ops.REDUCE:
        return _reduce(src[0], arg)
    if op is Ops.COPY:
        if isinstance(arg, tuple):
            return reshard(src[0], arg, None)
        return gather(src[0], arg)
    if op is Ops.VIEW:
        return view(src[0], arg)
    if op in (Ops.ASSIGN, Ops.STORE, Ops.PARAM):
        raise GraphError(f"{op.name} on a multi-device value: assign per shard (Tensor.assign does)")
    if op is Ops.GATHER:
        return _gather(dtype, src, arg)
    if op is Ops.SCATTER:
        return _scatter(dtype, src, arg)
    return _per_shard(op, dtype, src, arg)


def _all_multi(op: Ops, src: tuple[Node, ...]) -> tuple[str, ...]:
    """The devices of `src`, all MULTI on the same ones (else the error _per_shard gives)."""
    if any(s.op is not Ops.MULTI for s in src):
        raise GraphError(f"{op.name} on tensors of different devices ({[s.device for s in src]}): move one "
                         f"with .to(devices) or .shard(devices, axis) first")
    devices = src[0].device
    if any(s.device != devices for s in src):
        raise GraphError(f"{op.name} on tensors sharded over different devices: {[s.device for s in src]}")
    return devices


def _gather(dtype: DType, src: tuple[Node, ...], arg: Any) -> Node:
    """GATHER(source (N,), index): the positions index the whole source, so every device gathers from
    its whole copy of a replicated source with its own part of the index; the result is laid out like
    the index. (The elementwise rule would split the source like the index, and each device would
    read the wrong values.) A sharded source is refused: gathering it here would be copies the
    gradient does not flow through."""
    devices = _all_multi(Ops.GATHER, src)
    source, index = src
    if source.arg[0] is not None:
        raise GraphError("indexing a tensor sharded over devices with a tensor index: replicate it first "
                         "(t.to(devices)), or index each shard")
    out = tuple(Node.make(Ops.GATHER, dtype, (s, i), arg) for s, i in zip(source.src, index.src))
    return Node.make(Ops.MULTI, dtype, out, index.arg)


def _scatter(dtype: DType, src: tuple[Node, ...], arg: Any) -> Node:
    """SCATTER(base (N,), index, values): the whole (N,) value, replicated like the base. With the index
    sharded (an embedding's gradient in data-parallel training) and reduce "sum", each device scatters
    its part into zeros and one ALLREDUCE sums the partials, as a reduction over a sharded axis does;
    the base is added after. Another reduce ("set", "max", "prod") with a sharded index is refused:
    every device would need all of the index and values (replicate them first)."""
    devices = _all_multi(Ops.SCATTER, src)
    base, index, values = src
    if base.arg[0] is not None:
        raise GraphError("scatter into a tensor sharded over devices: replicate it first (t.to(devices))")
    if index.arg[0] is None and values.arg[0] is None:
        out = tuple(Node.make(Ops.SCATTER, dtype, parts, arg) for parts in zip(base.src, index.src, values.src))
        return Node.make(Ops.MULTI, dtype, out, (None, None))
    if arg != "sum" or index.arg != values.arg:
        raise GraphError(f"scatter (reduce {arg!r}) with the index or values sharded over devices: only a "
                         f"sum of values laid out like the index is; replicate them first (t.to(devices))")
    partials = [Node.make(Ops.SCATTER, dtype, (Node.const(0, dtype, b.device, b.shape), i, v), arg)
                for b, i, v in zip(base.src, index.src, values.src)]
    summed = allreduce(partials, ReduceOp.SUM)
    return Node.make(Ops.MULTI, dtype, tuple(b.alu(Ops.ADD, t) for b, t in zip(base.src, summed.src)),
                     (None, None))


def _per_shard(op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any) -> Node:
    """An op that keeps its operands' shape (elementwise, contiguous, detach, ...), run on each device
    with its operands laid out alike: the first sharded operand's layout wins, replicated operands
    are sliced (a view, no copy), and an operand split differently is resharded."""
    devices = _all_multi(op, src)
    axis, bounds = next((s.arg for s in src if s.arg[0] is not None), (None, None))
    aligned = [s.src if s.arg == (axis, bounds) else _resharded(s, devices, axis, bounds) for s in src]
    out = tuple(Node.make(op, dtype, tuple(parts), arg) for parts in zip(*aligned))
    return Node.make(Ops.MULTI, dtype, out, (axis, bounds))


def _reduce(m: Node, arg: tuple[ReduceOp, tuple[int, ...]]) -> Node:
    rop, axes = arg
    axis, bounds = m.arg
    if axis is None or axis not in axes:
        return Node.make(Ops.MULTI, m.dtype, tuple(s.reduce(rop, axes) for s in m.src), m.arg)
    partials = []
    for s in m.src:
        shape = tuple(1 if i in axes else n for i, n in enumerate(s.shape))
        if s.shape[axis] == 0:  # an empty shard contributes the identity
            partials.append(Node.const(reduce_identity(rop, m.dtype), m.dtype, s.device, shape))
        elif all(s.shape[a] == 1 for a in axes):  # nothing to reduce locally: a view
            partials.append(s.reshape(shape))
        else:
            partials.append(s.reduce(rop, axes))
    return allreduce(partials, rop)


def view(m: Node, v: View) -> Node:
    """A raw View on a MULTI node: only replicated values (every shard has the logical shape)."""
    if v.is_identity(m.size) and v.shape == m.shape:
        return m
    if m.arg[0] is not None:
        raise GraphError("a raw view of a sharded value; use the movement ops (reshape, shrink, ...)")
    return Node.make(Ops.MULTI, m.dtype, tuple(s.view(v) for s in m.src), (None, None))


def movement(m: Node, name: str, arg: Any) -> Node:
    """A movement op on a MULTI node: each shard moves, the bounds follow (no communication), except
    for a reshape or expand that would move elements between devices: that replicates first."""
    axis, bounds = m.arg
    if axis is None:
        return Node.make(Ops.MULTI, m.dtype, tuple(getattr(s, name)(arg) for s in m.src), m.arg)
    size = m.shape[axis]
    if name == "permute":
        return _apply(m, [arg] * len(m.src), arg.index(axis), bounds, name)
    if name == "expand":
        if arg[axis] != size:
            return movement(reshard(m, m.device, None), name, arg)
        return _apply(m, [arg[:axis] + (s.shape[axis],) + arg[axis + 1:] for s in m.src], axis, bounds, name)
    if name == "reshape":
        return _reshape(m, arg)
    per, new = [], []
    for s, (b, e) in zip(m.src, bounds):
        if name == "shrink":
            lo, hi = arg[axis]
            start, stop = max(lo, b), min(hi, e)
            if stop > start:
                per.append(arg[:axis] + ((start - b, stop - b),) + arg[axis + 1:])
                new.append((start - lo, stop - lo))
            else:  # nothing of this shard is kept: it stays, empty, where it was
                per.append(arg[:axis] + ((0, 0),) + arg[axis + 1:])
                at = min(max(b, lo), hi) - lo
                new.append((at, at))
        elif name == "flip":
            per.append(arg)
            new.append((size - e, size - b) if arg[axis] else (b, e))
        elif name == "stride":
            k = arg[axis]
            first, last = -(-b // k), max(-(-b // k), -(-e // k))
            local = min(first * k, e) - b
            per.append(tuple((0, n) if i != axis else (local, e - b) for i, n in enumerate(s.shape)))
            new.append((first, last))
        elif name == "pad":
            before, after = arg[axis]
            gets_before, gets_after = _edge_shards(bounds, size)
            i = len(new)
            pb, pa = (before if i == gets_before else 0), (after if i == gets_after else 0)
            per.append(arg[:axis] + ((pb, pa),) + arg[axis + 1:])
            new.append((b + before - pb, e + before + pa))
        else:
            raise GraphError(f"movement {name} is not supported on a sharded value")
    if name == "stride":  # each shard first drops its leading elements that are not multiples of the step
        return Node.make(Ops.MULTI, m.dtype, tuple(s.shrink(p).stride(arg) for s, p in zip(m.src, per)),
                         (axis, tuple(new)))
    return _apply(m, per, axis, tuple(new), name)


def _apply(m: Node, per: list, axis: int, bounds: Bounds, name: str) -> Node:
    moved = tuple(getattr(s, name)(p) for s, p in zip(m.src, per))
    return Node.make(Ops.MULTI, m.dtype, moved, (axis, bounds))


def _edge_shards(bounds: Bounds, size: int) -> tuple[int, int]:
    """Which shard holds the first and which the last element (for padding before and after)."""
    nonempty = [i for i, (b, e) in enumerate(bounds) if e > b]
    first = next((i for i in nonempty if bounds[i][0] == 0), 0)
    last = next((i for i in nonempty if bounds[i][1] == size), len(bounds) - 1)
    return first, last


def _reshape(m: Node, shape: tuple[int, ...]) -> Node:
    """Reshape each shard when the sharded axis maps onto one new axis with whole rows per shard:
    the elements before the axis keep their grouping, and every shard's block is a whole number
    of new rows. Otherwise (say, flattening a tensor split on its second axis) replicate first."""
    axis, bounds = m.arg
    before = math.prod(m.shape[:axis])
    inner_old = math.prod(m.shape[axis + 1:])
    prefix = 1
    new_axis = None
    for k, s in enumerate(shape):
        if prefix == before:
            new_axis = k
        prefix *= s
    if new_axis is not None:
        inner_new = math.prod(shape[new_axis + 1:])
        if inner_new and all((b * inner_old) % inner_new == 0 and (e * inner_old) % inner_new == 0
                             for b, e in bounds):
            new = tuple((b * inner_old // inner_new, e * inner_old // inner_new) for b, e in bounds)
            per = [shape[:new_axis] + (e - b,) + shape[new_axis + 1:] for b, e in new]
            return Node.make(Ops.MULTI, m.dtype, tuple(s.reshape(p) for s, p in zip(m.src, per)),
                             (new_axis, new))
    return movement(reshard(m, m.device, None), "reshape", shape)

