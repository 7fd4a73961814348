"""The numpy backend: renders each fused kernel once into a Python function over numpy.

A kernel AST (STORE of an expression over PARAM loads) becomes straight-line code, one numpy call per
node, compiled with `compile`/`exec` and cached by the AST itself (interned, so structurally equal
kernels share one function). Views are numpy strides, never copies, except a padded view, which needs
its zeros somewhere. A reduce of a product whose operands are broadcast along different axes is a
matmul in disguise and goes to one np.matmul (BLAS). Whatever depends only on shapes and strides (how
to read a view, how to lay out a matmul) is decided here, at render time, into the plan objects of
backend/numpy/plans.py that the generated code calls.

Generated code reads like this (E_add_exp_4096; K12 is a Window's read, K13 np.exp, K15 np.add):

    def E_add_exp_4096(b0, b1, var_vals=None):
        v1 = K12(b1)
        v2 = K13(v1)
        K15(v2, K14, out=K16(b0))
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Any, Callable

import numpy as np

from atensor.graph.node import Node, toposort
from atensor.config import settings
from atensor.dtype import dtypes
from atensor.graph.ops import ELEMENTWISE, Ops, ReduceOp
from atensor.graph.semantics import BINARY_FNS, UNARY_FNS, bitcast_fn, cast_fn, gather_fn, reduce_fn, scatter_fn
from atensor.graph import rewrite
from atensor.graph.view import View
from atensor.backend.numpy import plans as numpy_plans
from atensor.backend.quant import kernels as quant_kernels
from atensor.backend.quant import tuning as quant_tuning
from atensor.backend.numpy.plans import AddPads, Contraction, RowsThenAddPads, Window

_cache: dict[Node, Callable[..., None]] = {}
PER_VALUE_KEPT = 64  # concrete kernels kept per kernel of symbolic shape (`_per_value`)
_cache_lock = threading.Lock()
compile_count = 0
_malloc_tuned = False


_strided = numpy_plans.strided


_view, _target, _store = numpy_plans.view_of, numpy_plans.target_of, numpy_plans.store_into


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _sum_of_product(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """sum(a * b, axes) with keepdims, where broadcast (stride-0) axes of a and b are dropped first so
    the contraction is a (batched) matrix product that BLAS runs."""
    shape = a.shape

    def squeeze(x: np.ndarray) -> tuple[np.ndarray, list[int]]:
        real = [i for i in range(x.ndim) if x.strides[i] != 0 and x.shape[i] != 1]
        index = tuple(slice(None) if i in real else 0 for i in range(x.ndim))
        return x[index], real

    (sa, ra), (sb, rb) = squeeze(a), squeeze(b)
    result, out_axes = _contract(sa, ra, sb, rb, axes)
    present = set(ra) | set(rb)
    keep = tuple(1 if (i in axes or i not in present) else shape[i] for i in range(len(shape)))
    full = tuple(1 if i in axes else shape[i] for i in range(len(shape)))
    return np.broadcast_to(np.asarray(result, dtype=dtype).reshape(keep), full)


def _contract(sa: np.ndarray, ra: list[int], sb: np.ndarray, rb: list[int],
              axes: tuple[int, ...]) -> tuple[np.ndarray, list[int]]:
    """sum over `axes` of sa * sb, whose dims are the original axes `ra` and `rb`; the result's dims are
    the kept axes in increasing order. Axes in both operands that are kept are batch axes, those only in
    one are the rows (a) or columns (b) of a matmul, those in both that are reduced are its inner axis:
    one np.matmul (a BLAS gemm per batch element) with a C-contiguous result, instead of einsum, whose
    tensordot path can return a transposed result that the next view then copies."""
    in_a, in_b = set(ra), set(rb)
    inner = [i for i in ra if i in in_b and i in axes]
    batch = [i for i in ra if i in in_b and i not in axes]
    rows = [i for i in ra if i not in in_b]
    cols = [i for i in rb if i not in in_a]
    out_axes = sorted(i for i in batch + rows + cols if i not in axes)
    if any(i in axes for i in rows + cols) or len(ra) + len(rb) > 26:  # a one-sided sum: einsum does it
        letters = {i: _LETTERS[k] for k, i in enumerate(sorted(in_a | in_b))}
        spec = f"{''.join(letters[i] for i in ra)},{''.join(letters[i] for i in rb)}->" \
               f"{''.join(letters[i] for i in out_axes)}"
        return np.einsum(spec, sa, sb, optimize=True), out_axes
    size = dict(zip(ra, sa.shape)) | dict(zip(rb, sb.shape))
    batch_shape = tuple(size[i] for i in batch)
    m, k, n = (math.prod(size[i] for i in group) for group in (rows, inner, cols))
    left = _blasable(sa.transpose([ra.index(i) for i in batch + rows + inner]).reshape(*batch_shape, m, k))
    right = _blasable(sb.transpose([rb.index(i) for i in batch + inner + cols]).reshape(*batch_shape, k, n))
    result = np.matmul(left, right).reshape(batch_shape + tuple(size[i] for i in rows + cols))
    order = batch + rows + cols
    if order != out_axes:
        result = result.transpose([order.index(i) for i in out_axes])
    return result, out_axes


_blasable = numpy_plans.blasable


def _matmul_shaped(node: Node) -> bool:
    """A SUM over a product of two views that are each broadcast along some axis: a contraction."""
    if node.arg[0] is not ReduceOp.SUM or node.src[0].op is not Ops.MUL or len(node.src[0].shape) > 26:
        return False
    if node.dtype.kind not in "f":
        return False
    a, b = node.src[0].src
    broadcast = [x.op is Ops.VIEW and x.arg.mask is None and 0 in x.arg.strides for x in (a, b)]
    if not all(broadcast) or node.src[0].size < 64:
        return False
    # an axis summed over that both operands broadcast multiplies the sum: not a matrix product
    shape = a.shape
    return not any(shape[i] != 1 and a.arg.strides[i] == 0 and b.arg.strides[i] == 0 for i in node.arg[1])


def _quiet_cast(source: np.dtype, dest: np.dtype) -> bool:
    """True when numpy's astype from `source` to `dest` can raise no float warning (overflow, invalid
    value), so the kernel calls it without the errstate context _cast pays ~2 us for."""
    if source.kind == "b" or np.can_cast(source, dest, "safe"):
        return True
    if source.kind in "iu":  # integers wrap silently; any integer fits float32's range
        return dest.kind in "iub" or (dest.kind == "f" and dest.itemsize >= 4)
    return False


def _reduce_call(n: Node, src: str, const: Callable[[Any], str]) -> str:
    """The call for a reduce that is not a contraction: the ufunc's own reduce (np.sum and np.max add
    a layer of Python), and a max along a short last axis as numpy_plans.max_last."""
    op, axes = n.arg
    npdt, shape = n.dtype.np, n.src[0].shape
    plain = npdt.kind in "iuf" and n.dtype not in (dtypes.float16, dtypes.bfloat16)
    if plain and op is ReduceOp.MAX and math.prod(shape) > 0:
        last = len(shape) - 1
        if axes == (last,) and last > 0 and shape[last] <= 32 and math.prod(shape) >= 512:
            perm = (last,) + tuple(range(last))
            return f"_max_last({src}, {perm!r}, {n.shape!r})"
        return f"np.maximum.reduce({src}, axis={axes!r}, keepdims=True)"
    if plain and op is ReduceOp.SUM:
        return f"np.add.reduce({src}, axis={axes!r}, keepdims=True, dtype={const(npdt)})"
    return f"_reduce(ReduceOp.{op.name}, {src}, {axes!r}, {const(n.dtype)})"


ARANGE_CONST_MAX = 4096  # a smaller arange is computed at render time and kept with the kernel


def _arange(start: Any, step: Any, size: int, dtype: np.dtype) -> np.ndarray:
    return (start + step * np.arange(size, dtype=np.float64 if dtype.kind == "f" else np.int64)).astype(dtype)


# ---- elementwise regions run in cache-sized chunks ------------------------------------------------------
# A chain of elementwise ops over a large array (a transformer's GELU is ~20 of them on (B, L, 4H)) costs
# one pass over memory per op when each numpy call sees the whole array. Run over chunks of ~128 KiB
# instead, the chain's temporaries stay in L2: measured 2.6x faster on such a chain. A region is a set
# of same-shaped elementwise nodes rendered as one loop; its values read elsewhere are written into
# full-size outputs chunk by chunk.
CHUNK_ELEMENTS = 1 << 15
_REGION_MIN_OPS = 3


def _chunk_plan(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(axis, step): loop over the axes before `axis`, and over `axis` in steps of `step`, so a chunk
    holds about CHUNK_ELEMENTS elements; None when the array is too small to gain from chunks."""
    if len(shape) == 0 or math.prod(shape) < 4 * CHUNK_ELEMENTS:
        return None
    for axis in range(len(shape)):
        inner = math.prod(shape[axis + 1:])
        if inner <= 4 * CHUNK_ELEMENTS and shape[axis] > 1:
            return axis, max(1, CHUNK_ELEMENTS // max(inner, 1))
    return None


def _regionable(n: Node, skip: set[Node]) -> bool:
    if n in skip or n.op not in (UNARY_FNS.keys() | BINARY_FNS.keys() | {Ops.WHERE, Ops.CAST}):
        return False
    fn = UNARY_FNS.get(n.op) or BINARY_FNS.get(n.op)
    if fn is not None and not isinstance(fn, np.ufunc):
        return False
    return _chunk_plan(n.shape) is not None


def _hoistable(n: Node) -> bool:
    """Leaves and views of leaves: cheap, so they may be computed earlier than where they first appear."""
    while n.op is Ops.VIEW:
        n = n.src[0]
    return n.op in (Ops.CONST, Ops.PARAM)


def _elementwise_regions(order: list[Node], skip: set[Node]) -> list[list[Node]]:
    """Groups of same-shaped elementwise nodes, each rendered as one chunked loop at the place of its
    first node. A node joins a region of one of its sources only if each of its other inputs is already
    computed there (earlier in `order`) or hoistable, so no input is missing and no value leaves the
    region and comes back."""
    position = {n: i for i, n in enumerate(order)}
    region_of: dict[Node, int] = {}
    regions: list[list[Node]] = []
    for n in order:
        if not _regionable(n, skip):
            continue
        joined = False
        for s in n.src:
            r = region_of.get(s)
            if r is None or regions[r][0].shape != n.shape:
                continue
            first = position[regions[r][0]]
            if all(region_of.get(o) == r or position[o] < first or _hoistable(o) for o in n.src):
                regions[r].append(n)
                region_of[n] = r
                joined = True
                break
        if not joined:
            region_of[n] = len(regions)
            regions.append([n])
    return [r for r in regions if len(r) >= _REGION_MIN_OPS]


def render(ast: Node, name: str) -> tuple[str, dict[str, Any]]:
    """Python source for the kernel `ast` and the globals it needs."""
    env: dict[str, Any] = {"np": np, "_view": _view, "_store": _store, "_target": _target,
                           "_cast": cast_fn, "_bitcast": bitcast_fn,
                           "_reduce": reduce_fn, "_sum_of_product": _sum_of_product, "_arange": _arange,
                           "ReduceOp": ReduceOp, "_gather": gather_fn, "_scatter": scatter_fn,
                           "_where": numpy_plans.where, "_max_last": numpy_plans.max_last}
    names: dict[Node, str] = {}
    lines: list[str] = []
    params = sorted((n for n in toposort([ast]) if n.op is Ops.PARAM), key=lambda n: n.arg[0])
    args = ", ".join([f"b{p.arg[0]}" for p in params] + ["var_vals=None"])

    def const(value: Any) -> str:
        key = f"K{len(env)}"
        env[key] = value
        return key

    def view_arg(view: View) -> str:
        """A view constant; one at a symbolic offset is evaluated with the call's variable values."""
        return f"{const(view)}.evaluate(var_vals)" if view.variables() else const(view)

    def read(src: str, view: View) -> str:
        """`src` seen through `view`: a Window planned now for a concrete view."""
        return f"_view({src}, {view_arg(view)})" if view.variables() else f"{const(Window(view).read)}({src})"

    def window_target(buf: str, view: View) -> str:
        if view.variables():
            return f"_target({buf}, {view_arg(view)})"
        return f"{const(Window(view).target)}({buf})"

    order = toposort([ast])
    users: dict[Node, int] = {}
    non_elementwise_users: set[Node] = set()
    for n in order:
        for src in n.src:
            users[src] = users.get(src, 0) + 1
            if n.op not in ELEMENTWISE:
                non_elementwise_users.add(src)
    # the product under a matmul-shaped reduce is never materialized: einsum reads its operands
    skip = {n.src[0] for n in order if n.op is Ops.REDUCE and _matmul_shaped(n) and users[n.src[0]] == 1}
    # a broadcast constant, or a broadcast of any one-element value (a step count, a scale computed in
    # the kernel), read only by elementwise ops stays a 0-d array: numpy broadcasts it itself, and its
    # scalar fast paths are about twice as fast as reading a stride-0 array
    matmul_operands = {s for m in skip for s in m.src}
    scalars = {n for n in order if n.op is Ops.VIEW and n.arg.mask is None and n not in non_elementwise_users
               and (n.src[0].op is Ops.CONST or (math.prod(n.src[0].shape) == 1 and not n.arg.variables()
                                                 and n not in matmul_operands))}
    # plans that read a view's source directly, so the view itself is not rendered when nothing else
    # reads it: a matmul-shaped reduce (one np.matmul on the unbroadcast operands) and x + pad(y)
    # (an add into the padded region only; concatenations are sums of such pads)
    contractions: dict[Node, Contraction] = {}
    pad_adds: dict[Node, tuple[Node, Node]] = {}  # ADD -> (the other operand, the padded view)
    for n in order:
        if n.op is Ops.REDUCE and _matmul_shaped(n):
            a, b = n.src[0].src
            plan = Contraction(a.arg, b.arg, n.arg[1], n.dtype.np)
            if plan.usable:
                contractions[n] = plan
        elif n.op is Ops.ADD and n.shape:
            for pad, other in (n.src, n.src[::-1]):
                if pad.op is Ops.VIEW and pad.arg.mask is not None and not pad.arg.variables() and \
                        users[pad] == 1 and pad.shape == n.shape and pad.dtype == other.dtype == n.dtype:
                    pad_adds[n] = (other, pad)
                    break
    add_chains = _pad_add_chains(order, pad_adds, users)
    folded = {m for members in add_chains.values() for m in members[2]}
    # a chain whose pads all read one contraction, computed row by row, that nothing else reads: the
    # contraction is not rendered; the chain computes it a row at a time (numpy_plans.RowsThenAddPads)
    row_chains: dict[Node, RowsThenAddPads] = {}
    for end, (base, pads, _) in add_chains.items():
        source = pads[0].src[0]
        plan = contractions.get(source)
        windows = [Window(p.arg) for p in pads]
        if plan is not None and plan.rows() and all(p.src[0] is source for p in pads) and \
                users[source] == len(pads) and source.dtype == end.dtype and \
                source.size // source.shape[0] * source.dtype.itemsize >= ROW_CHAIN_MIN_BYTES and \
                RowsThenAddPads.fits(windows, source.shape, end.shape):
            row_chains[end] = RowsThenAddPads(plan, windows, source.shape, end.shape, end.dtype.np)
            folded.add(source)

    def reads(n: Node) -> tuple[Node, ...]:  # what rendering `n` reads (a skipped product: its reduce)
        if n in contractions:
            return tuple(s.src[0] for s in n.src[0].src)
        if n in pad_adds:
            return pad_adds[n][0], pad_adds[n][1].src[0]
        if n.op is Ops.STORE and n.src[0].op is Ops.VIEW:  # the target is written, not read
            return n.src[0].src[0], n.src[1]
        return n.src
    live: set[Node] = set()
    stack = [ast]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(reads(n))
    # arrays this kernel allocated (ufunc and where results) that nothing else refers to: a ufunc that
    # is their only reader writes its result into them (`out=`), saving an allocation and a pass over
    # cold memory per elementwise op
    fresh: set[Node] = set()

    def ufunc_call(fn: Any, n: Node) -> str:
        call = f"{const(fn)}({', '.join(names[s] for s in n.src)}"
        if all(s in scalars for s in n.src):
            return f"np.broadcast_to({call}), {n.shape!r})"
        if isinstance(fn, np.ufunc) and n.shape:
            fresh.add(n)
            reuse = next((s for s in n.src if s in fresh and users[s] == 1 and s.dtype == n.dtype
                          and s.shape == n.shape), None)
            if reuse is not None:
                return f"{call}, out={names[reuse]})"
        return call + ")"

    regions = _elementwise_regions(order, skip | pad_adds.keys())
    region_start = {r[0]: r for r in regions}
    in_region = {n for r in regions for n in r}
    if regions:  # hoistable inputs of a region's nodes move before the region's first node
        placed: set[Node] = set()
        reordered: list[Node] = []
        for n in order:
            if n in placed:
                continue
            if n in region_start:
                members = set(region_start[n])
                early = [o for m in region_start[n] for o in m.src if o not in members and o not in placed]
                for o in toposort(early):
                    if o not in placed:
                        placed.add(o)
                        reordered.append(o)
            placed.add(n)
            reordered.append(n)
        order = reordered

    def emit_region(members: list[Node]) -> None:
        shape = members[0].shape
        axis, step = _chunk_plan(shape)  # type: ignore[misc]
        inside = set(members)
        uses_inside: dict[Node, int] = {}
        for m in members:
            for s in m.src:
                uses_inside[s] = uses_inside.get(s, 0) + 1
        outputs = [m for m in members if users.get(m, 0) > uses_inside.get(m, 0)]
        for m in outputs:
            names[m] = f"v{len(names)}"
            lines.append(f"{names[m]} = np.empty({shape!r}, {const(m.dtype.np)})")
            fresh.add(m)
        loops, index = [], []
        for a in range(axis):
            loops.append(f"for _i{a} in range({shape[a]}):")
            index.append(f"_i{a}")
        loops.append(f"for _c in range(0, {shape[axis]}, {step}):")
        index.append(f"_c:_c + {step}")
        sl = f"[{', '.join(index)}]"

        def _unsliced(s: Node) -> bool:  # a 0-d value (a constant kept as a scalar) broadcasts by itself
            return not s.shape or s in scalars
        body: list[str] = []
        local: dict[Node, str] = {}
        temp: set[Node] = set()
        for m in members:
            args = [local[s] if s in inside else names[s] if _unsliced(s) else names[s] + sl for s in m.src]
            target = f"{names[m]}{sl}" if m in outputs else None
            local[m] = f"c{len(local)}"
            if m.op is Ops.WHERE or m.op is Ops.CAST:
                expr = f"_where({', '.join(args)})" if m.op is Ops.WHERE else \
                    f"_cast({args[0]}, {const(m.dtype)})"
                body.append(f"{target} = {expr}" if target else f"{local[m]} = {expr}")
                if target:
                    body.append(f"{local[m]} = {target}")
                else:
                    temp.add(m)
                continue
            fn = UNARY_FNS.get(m.op) or BINARY_FNS[m.op]
            out = target
            if out is None:
                reuse = next((s for s in m.src if s in temp and users[s] == 1 and s.dtype == m.dtype), None)
                out = local[reuse] if reuse is not None else None
                temp.add(m)
            call = f"{const(fn)}({', '.join(args)}{', out=' + out if out else ''})"
            body.append(f"{local[m]} = {call}")
        depth = 0
        for loop in loops:
            lines.append("    " * depth + loop)
            depth += 1
        lines.extend("    " * depth + b for b in body)

    for n in order:
        if n in in_region:
            if n in region_start:
                emit_region(region_start[n])
            continue
        if n.op is Ops.PARAM:
            names[n] = f"b{n.arg[0]}"
            continue
        if n in skip or n not in live or n in folded:
            continue
        if n.op is Ops.STORE:
            target = n.src[0]
            view = target.arg if target.op is Ops.VIEW else View.create(target.shape)
            buf, value = names[target.src[0] if target.op is Ops.VIEW else target], n.src[1]
            last = f"{names.get(value)} = "
            fn = UNARY_FNS.get(value.op) or BINARY_FNS.get(value.op)
            if isinstance(fn, np.ufunc) and value in fresh and users[value] == 1 and \
                    value.dtype == n.dtype and lines and value not in pad_adds and \
                    lines[-1].startswith(last) and lines[-1].endswith(")") and view.size:
                # the last ufunc writes straight into the target (`out=`): no temporary, no second pass
                call = lines[-1][len(last):-1].split(", out=")[0]
                lines[-1] = f"{call}, out={window_target(buf, view)})"
                continue
            if view.variables():
                lines.append(f"_store({buf}, {view_arg(view)}, {names[value]})")
            else:
                lines.append(f"{const(Window(view).store)}({buf}, {names[value]})")
            continue
        out = f"v{len(names)}"
        names[n] = out
        src = [names.get(s, "") for s in n.src]
        if n.op is Ops.CONST:
            expr = const(np.array(n.arg[0], dtype=n.dtype.np))
        elif n.op is Ops.ARANGE and n.arg[2] <= ARANGE_CONST_MAX:  # made once (no kernel writes it)
            made = _arange(n.arg[0], n.arg[1], n.arg[2], n.dtype.np)
            made.flags.writeable = False
            expr = const(made)
        elif n.op is Ops.ARANGE:
            expr = f"_arange({n.arg[0]!r}, {n.arg[1]!r}, {n.arg[2]}, {const(n.dtype.np)})"
        elif n.op is Ops.VIEW:
            if n in scalars and n.src[0].op is Ops.CONST:
                names[n] = src[0]
                continue
            if n in scalars:
                expr = f"{src[0]}.reshape(())"
            elif n.src[0].op is Ops.CONST and n.arg.mask is None:
                expr = f"np.broadcast_to({src[0]}, {n.shape!r})"
            else:
                expr = read(src[0], n.arg)
                fresh.add(n) if n.arg.mask is not None else None  # a padded view is a new array
        elif n.op in UNARY_FNS:
            expr = ufunc_call(UNARY_FNS[n.op], n)
        elif n.op is Ops.CAST:
            expr = f"{src[0]}.astype({const(n.dtype.np)})" if _quiet_cast(n.src[0].dtype.np, n.dtype.np) \
                else f"_cast({src[0]}, {const(n.dtype)})"
            if n.src[0] in scalars and n.shape:  # a 0-d value: back to the node's shape
                expr = f"np.broadcast_to({expr}, {n.shape!r})"
        elif n.op is Ops.BITCAST:
            expr = f"_bitcast({src[0]}, {const(n.dtype)})"
            if n.src[0] in scalars and n.shape:
                expr = f"np.broadcast_to({expr}, {n.shape!r})"
        elif n in row_chains:
            base = add_chains[n][0]
            in_place = base is not None and base in fresh and users[base] == 1 and base.shape == n.shape
            a, b = (names[s.src[0]] for s in add_chains[n][1][0].src[0].src[0].src)
            expr = f"{const(row_chains[n])}({a}, {b}, {names[base] if base is not None else None}, " \
                   f"{in_place}, {const(n.dtype.np)})"
            fresh.add(n)
        elif n in add_chains:  # x + pad_1(s_1) + ... + pad_K(s_K) in one pass (numpy_plans.AddPads)
            base, pads, _ = add_chains[n]
            plan = AddPads([Window(p.arg) for p in pads], n.shape, n.dtype.np)
            in_place = base is not None and base in fresh and users[base] == 1 and base.shape == n.shape
            sources = ", ".join(names[p.src[0]] for p in pads)
            expr = f"{const(plan)}({names[base] if base is not None else None}, {in_place}, " \
                   f"{const(n.dtype.np)}, {sources})"
            fresh.add(n)
        elif n in pad_adds:
            other, pad = pad_adds[n]
            in_place = other in fresh and users[other] == 1 and other.shape == n.shape
            expr = f"{const(Window(pad.arg).add_into)}({names[other]}, {names[pad.src[0]]}, {in_place})"
            fresh.add(n)
        elif n.op in BINARY_FNS:
            expr = ufunc_call(BINARY_FNS[n.op], n)
        elif n.op is Ops.WHERE:
            expr = f"_where({src[0]}, {src[1]}, {src[2]})"
            if all(s in scalars for s in n.src):  # a read-only broadcast: never an `out=` target
                expr = f"np.broadcast_to({expr}, {n.shape!r})"
            elif n.shape:
                fresh.add(n)
        elif n.op is Ops.REDUCE:
            if n in contractions:
                a, b = (names[s.src[0]] for s in n.src[0].src)
                expr = f"{const(contractions[n])}({a}, {b})"
            elif _matmul_shaped(n):
                a, b = (names[s] for s in n.src[0].src)
                expr = f"_sum_of_product({a}, {b}, {n.arg[1]!r}, {const(n.dtype.np)})"
            else:
                expr = _reduce_call(n, src[0], const)
        elif n.op is Ops.GATHER:
            expr = f"_gather({src[0]}, {src[1]})"
        elif n.op is Ops.SCATTER:
            expr = f"_scatter({src[0]}, {src[1]}, {src[2]}, {n.arg!r})"
        elif n.op is Ops.QMATMUL:
            expr = f"{const(quant_tuning.run_qmatmul)}({src[0]}, {src[1]}, {const(n.arg)})"
        elif n.op is Ops.DEQUANT:
            expr = f"{const(quant_kernels.run_dequant)}({src[0]}, {const(n.arg)})"
        else:
            raise NotImplementedError(f"numpy backend cannot render {n.op}")
        lines.append(f"{out} = {expr}")
    body = "\n    ".join(lines) or "pass"
    return f"def {name}({args}):\n    {body}\n", env


ADD_CHAIN_MIN = 3  # pads in a chain of adds worth one AddPads pass
ROW_CHAIN_MIN_BYTES = 256 << 10  # a contraction result with rows this large is computed row by row into its pads


def _pad_add_chains(order: list[Node], pad_adds: dict[Node, tuple[Node, Node]],
                    users: dict[Node, int]) -> dict[Node, tuple[Any, list[Node], list[Node]]]:
    """Chains of adds of padded views (col2im, a concatenation): chain end -> (the base operand or
    None, the padded views in order, the nodes folded into the end's one call). A link joins when the
    previous link is read only by it; a chain that starts from a padded view read only there starts
    from zeros."""
    chains: dict[Node, tuple[Any, list[Node], list[Node]]] = {}
    for n in order:
        if n not in pad_adds:
            continue
        other, pad = pad_adds[n]
        if other in chains and users[other] == 1:
            base, pads, members = chains.pop(other)
            chains[n] = (base, pads + [pad], members + [other])
        elif other.op is Ops.VIEW and other.arg.mask is not None and not other.arg.variables() and \
                users[other] == 1 and other.shape == n.shape and other.dtype == n.dtype:
            chains[n] = (None, [other, pad], [other])
        else:
            chains[n] = (other, [pad], [])
    return {n: c for n, c in chains.items() if len(c[1]) >= ADD_CHAIN_MIN}


def compile_kernel(ast: Node, name: str) -> Callable[..., None]:
    """The cached callable for `ast`; renders and compiles it on first use."""
    fn = _cache.get(ast)
    if fn is not None:
        return fn
    global compile_count, _malloc_tuned
    if not _malloc_tuned:  # once, before the first kernel allocates (numpy_plans.keep_freed_memory)
        _malloc_tuned = True
        numpy_plans.keep_freed_memory(settings.malloc_keep_bytes)
    if rewrite.has_symbolic_shape(ast):
        fn = _per_value(ast, name)
        with _cache_lock:
            _cache[ast] = fn
        return fn
    source, env = render(ast, _identifier(name))
    code = compile(source, f"<atensor kernel {name}>", "exec")
    exec(code, env)
    fn = env[_identifier(name)]
    fn.__atensor_source__ = source
    with _cache_lock:
        _cache[ast] = fn
        compile_count += 1
    return fn


def _per_value(ast: Node, name: str) -> Callable[..., None]:
    """A kernel whose shapes depend on variables: numpy needs concrete shapes, so each call binds the
    AST to its values (`var_vals`, which a jit replay rebinds in place) and runs that concrete kernel,
    rendered once per value. The buffers are laid out at the variables' maxima (graph/view.py), so the
    concrete views read them as they are."""
    concrete: collections.OrderedDict[Node, Callable[..., None]] = collections.OrderedDict()
    lock = threading.Lock()  # queue threads of two devices may run it at once

    def run(*buffers, var_vals=None):
        bound = rewrite.bind_ast(ast, var_vals or {})
        with lock:
            fn = concrete.get(bound)
            if fn is not None:
                concrete.move_to_end(bound)
        if fn is None:
            source, env = render(bound, _identifier(name))
            exec(compile(source, f"<atensor kernel {name}>", "exec"), env)
            fn = env[_identifier(name)]
            with lock:
                concrete[bound] = fn
                if len(concrete) > PER_VALUE_KEPT:  # an eager decode loop binds a new value every step
                    concrete.popitem(last=False)
        fn(*buffers, var_vals=var_vals)
    return run


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "kernel"
