"""Kernel bounds: every load and store of a kernel, under its valid mask, stays inside its buffer.

Why check at all: the numpy backend reads views with `as_strided`, which trusts its offset and
strides; an index past the end of a buffer reads or writes whatever memory lies there. So before a
TaskGraph runs (when `settings.racecheck` is on, as in every test), each kernel's accesses are proved
in bounds, and a violation raises `BoundsError` with a counterexample (the element, the index, the
variables' values) before anything runs.

What is checked, per kernel AST (STORE(view of PARAM 0, value)):
- every VIEW node against the element count of what it views, under its mask. The backend
  materializes each view of a view in turn, so each level is an access of its own. A concrete view
  is decided exactly by interval arithmetic (an affine index over a box takes its extremes at
  corners); a view at a symbolic offset or of a symbolic length (graph/view.py) first by the same
  arithmetic on the linear expressions (exact when the masks are boxes inside the shape), then by z3
  over the variables' whole bounds: a length `n+1` over a buffer of 8 is rejected when n may be 8;
- the store target *without* its mask (the backend writes every element of it) and with the
  value's shape;
- indexed loads (gathers), listed in `INDEXED_LOADS` (one table, here, whatever else is imported):
  a flat index computed by the kernel and the guard under which the load happens. Interval
  arithmetic on the index first; z3 when it cannot decide, with the index and guard as exact
  integer terms (sched/indexexpr.py), where data and floats are unconstrained: a guard that relies
  only on a float cast to bool proves nothing and is rejected, the same access guarded by
  `i < size` passes.

Results are cached by the kernel AST (interned: structurally equal kernels are the same object, so
the AST is a perfect key, and a kernel at a symbolic offset is one entry for every value). z3
queries have a timeout (`settings.z3_timeout_ms`); one that times out is a rejection, not cached.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.symbolic import SymbolicError, hi_of, lo_of
from atensor.graph.view import View
from atensor.sched.prove import ProofTimeout, Symbols, find_counterexample, z3mod
from atensor.graph.taskgraph import Copy, Kernel, NetAllReduce, TaskGraph


class BoundsError(AssertionError):
    """A kernel would read or write outside a buffer (or this could not be proved)."""


@dataclass(frozen=True)
class IndexedLoad:
    """An access whose position the kernel computes. At each position `p` of `index.shape`, where
    `valid[p]` holds (everywhere when None), it reads (or, for a scatter, writes) element `index[p]`
    of `source` (a PARAM, or a view of one, indexed flat in row-major order)."""
    source: Node
    index: Node
    valid: Optional[Node] = None


def _gather_loads(node: Node) -> list[IndexedLoad]:
    """GATHER(source, index) reads `source` at `index`, guarded by 0 <= index < len(source) (the guard
    tensor/indexing.py builds into every gather)."""
    source, index = node.src
    zero = Node.const(0, index.dtype, index.device, index.shape)
    size = Node.const(source.shape[0], index.dtype, index.device, index.shape)
    valid = index.alu(Ops.CMPLT, zero).alu(Ops.NOT).alu(Ops.AND, index.alu(Ops.CMPLT, size))
    return [IndexedLoad(source, index, valid)]


# the ops whose nodes access memory at computed positions: `loads(node)` lists them, and each is proved
# in bounds under its guard. Built here, not registered by the op's module when it is imported, so that
# the checker's rules do not depend on which modules a process imported (tests/test_registrations.py)
INDEXED_LOADS: dict[Ops, Callable[[Node], Sequence[IndexedLoad]]] = {Ops.GATHER: _gather_loads}


class CacheStats:
    __slots__ = ("hits", "misses")

    def __init__(self) -> None:
        self.hits = self.misses = 0

    def __repr__(self) -> str:
        return f"CacheStats(hits={self.hits}, misses={self.misses})"


cache_stats = CacheStats()
_cache: weakref.WeakKeyDictionary[Node, Optional[str]] = weakref.WeakKeyDictionary()


def clear_cache() -> None:
    """Forgets every kernel proved so far (for the benchmark's cold runs)."""
    _cache.clear()


def check_graph(graph: TaskGraph) -> None:
    """Proves every kernel and copy of `graph` in bounds; raises BoundsError naming the task."""
    for task in graph.tasks:
        work = task.work
        if isinstance(work, Kernel):
            try:
                check_kernel(work.ast, work.name)
            except BoundsError as err:
                raise BoundsError(f"task {task.id}: {err}") from None
        elif isinstance(work, Copy):
            for spec, offset in ((work.src, work.src_offset), (work.dst, work.dst_offset)):
                if not (0 <= offset and offset + work.nbytes <= spec.nbytes):
                    raise BoundsError(f"task {task.id}: {work.name} copies bytes [{offset}, "
                                      f"{offset + work.nbytes}) of {spec}, which has {spec.nbytes} bytes")
        elif isinstance(work, NetAllReduce):
            for spec, offset in ((work.src, work.src_offset), (work.dst, work.dst_offset)):
                if not (0 <= offset and offset + work.count <= spec.size):
                    raise BoundsError(f"task {task.id}: {work.name} reduces elements [{offset}, "
                                      f"{offset + work.count}) of {spec}, which has {spec.size}")


def check_kernel(ast: Node, name: str = "kernel") -> None:
    """Proves every load and store of the kernel `ast` inside its buffer; raises BoundsError with a
    counterexample otherwise. Cached by `ast`."""
    try:
        verdict = _cache[ast]
        cache_stats.hits += 1
    except KeyError:
        cache_stats.misses += 1
        try:
            verdict = _violation(ast)
        except ProofTimeout as err:
            raise BoundsError(f"{name}: cannot prove its accesses in bounds: {err}") from None
        _cache[ast] = verdict
    if verdict is not None:
        raise BoundsError(f"{name}: {verdict}")


def _violation(ast: Node) -> Optional[str]:
    """The first access of `ast` that can leave its buffer, described, or None."""
    target = ast.src[0] if ast.op is Ops.STORE else None
    if target is not None:
        found = _check_store(target, ast.src[1])
        if found:
            return found
    for node in toposort([ast]):
        if node.op is Ops.VIEW and node is not target:
            found = check_view(node.arg, node.src[0].size, "load", _describe(node.src[0]))
            if found:
                return found
        rule = INDEXED_LOADS.get(node.op)
        if rule is not None:
            for load in rule(node):
                found = check_indexed_load(load)
                if found:
                    return found
    return None


def _describe(source: Node) -> str:
    if source.op is Ops.PARAM:
        return f"buffer parameter {source.arg[0]} ({source.arg[1]} elements)"
    return f"a {source.op.name} of {source.size} elements"


def _check_store(target: Node, value: Node) -> Optional[str]:
    if target.shape != value.shape:
        return f"stores a value of shape {value.shape} through a target of shape {target.shape}"
    if target.op is Ops.VIEW:
        unmasked = View(target.arg.shape, target.arg.strides, target.arg.offset, None)
        return check_view(unmasked, target.src[0].size, "store", _describe(target.src[0]))
    return None


# ---- views -------------------------------------------------------------------------------------------
def check_view(view: View, size: int, what: str = "load", source: str = "its source") -> Optional[str]:
    """None when every valid element of `view` indexes inside [0, size), for every value of its
    variables; else a description of an element that does not."""
    if view.size == 0:
        return None
    if not view.variables():
        lo, hi = view.index_range()
        if hi < lo or (lo >= 0 and hi < size):
            return None
        element = _extreme(view, low=lo < 0)
        index = lo if lo < 0 else hi
        return (f"{what} of element {element} of {view} reads index {index} of {source}, outside "
                f"[0, {size})")
    if _mask_inside(view):
        lo, hi = view.index_range()
        if lo_of(lo) >= 0 and hi_of(hi) < size:
            return None
    return _view_z3(view, size, what, source)


def _mask_inside(view: View) -> bool:
    """True when every mask range lies inside its axis for every value (index_range is then exact)."""
    try:
        return view.mask is None or all(0 <= b and e <= s for (b, e), s in zip(view.mask, view.shape))
    except SymbolicError:
        return False


def _extreme(view: View, low: bool) -> tuple[int, ...]:
    """The element of a concrete view with the lowest (or highest) source index."""
    bounds = view.mask or tuple((0, s) for s in view.shape)
    return tuple((b if (st >= 0) == low else e - 1) for (b, e), st in zip(bounds, view.strides))


def _view_z3(view: View, size: int, what: str, source: str) -> Optional[str]:
    z3 = z3mod()
    sym = Symbols()
    coords = [sym.fresh(f"i{d}") for d in range(len(view.shape))]
    conditions = [z3.And(c >= 0, c < sym.expr(s)) for c, s in zip(coords, view.shape)]  # a dim may be symbolic
    for c, (b, e) in zip(coords, view.mask or ()):
        conditions += [c >= sym.expr(b), c < sym.expr(e)]
    index = sym.expr(view.offset) + z3.Sum([st * c for c, st in zip(coords, view.strides)] or [z3.IntVal(0)])
    conditions.append(z3.Or(index < 0, index >= size))
    found = find_counterexample(sym, conditions, [(f"i{d}", c) for d, c in enumerate(coords)] +
                                [("index", index)])
    if found is None:
        return None
    element = tuple(found.pop(f"i{d}") for d in range(len(view.shape)))
    index = found.pop("index")
    where = ", ".join(f"{k}={v}" for k, v in found.items())
    return (f"{what} of element {element} of {view} reads index {index} of {source}, outside [0, {size})"
            + (f" when {where}" if where else ""))


# ---- indexed loads -----------------------------------------------------------------------------------
def check_indexed_load(load: IndexedLoad) -> Optional[str]:
    """None when `load` reads inside its source wherever its guard holds; else a counterexample."""
    size = load.source.size
    if load.index.size == 0:
        return None
    interval = index_interval(load.index)
    if interval is not None and interval[0] >= 0 and interval[1] < size:
        return None
    from atensor.sched.indexexpr import Translator, position_width
    z3 = z3mod()
    sym = Symbols()
    nodes = [load.index] + ([load.valid] if load.valid is not None else [])
    tr = Translator(sym, position_width(nodes, [size]))
    coords, domain = tr.positions(load.index.shape, "p")
    index = tr.value(load.index, coords)
    kind, width = load.index.dtype.kind, load.index.dtype.itemsize * 8
    if kind == "b":
        index, width, kind = z3.If(index, z3.BitVecVal(1, 2), z3.BitVecVal(0, 2)), 2, "u"
    compare = max(width, size.bit_length()) + 1  # the index and the size, both fit signed
    wide = (z3.ZeroExt if kind == "u" else z3.SignExt)(compare - width, index)
    conditions = [*domain, z3.Or(wide < 0, wide >= size)]
    if load.valid is not None:
        conditions.append(tr.value(load.valid, coords))
    shown = [(f"p{d}", c) for d, c in enumerate(coords)] + [("index", wide)]
    found = find_counterexample(sym, conditions, shown)
    if found is None:
        return None
    position = tuple(found.pop(f"p{d}") for d in range(len(coords)))
    index_value = found.pop("index")
    others = {k: v for k, v in found.items() if "value" not in k and not k.startswith("data")}
    where = ", ".join(f"{k}={v}" for k, v in others.items())
    guard = "unguarded" if load.valid is None else "although its guard holds there"
    return (f"indexed load at position {position} reads index {index_value} of {_describe(load.source)}, "
            f"outside [0, {size}), {guard}" + (f" (when {where})" if where else ""))


def index_interval(node: Node) -> Optional[tuple[int, int]]:
    """Bounds of an integer node's values by interval arithmetic, or None when unknown (data)."""
    return _interval(node, {})


def _interval(node: Node, memo: dict) -> Optional[tuple[int, int]]:
    if node in memo:
        return memo[node]
    memo[node] = result = _interval_of(node, memo)
    return result


def _interval_of(node: Node, memo: dict) -> Optional[tuple[int, int]]:
    op = node.op
    if node.dtype.kind == "f":
        return None
    if op is Ops.CONST:
        return int(node.arg[0]), int(node.arg[0])
    if op is Ops.ARANGE:
        start, step, size = int(node.arg[0]), int(node.arg[1]), node.arg[2]
        last = start + step * (size - 1)
        return (min(start, last), max(start, last)) if size else (0, 0)
    if op is Ops.VIEW:
        inner = _interval(node.src[0], memo)
        if inner is None or node.arg.mask is None:
            return inner
        return min(inner[0], 0), max(inner[1], 0)
    parts = [_interval(s, memo) for s in node.src]
    if any(p is None for p in parts):
        return None
    lo_hi = _interval_rule(op, parts)
    if lo_hi is None:
        return None
    info_lo, info_hi = _dtype_range(node)
    # numpy wraps on overflow: an interval that leaves the dtype's range says nothing
    return lo_hi if info_lo <= lo_hi[0] and lo_hi[1] <= info_hi else None


def _interval_rule(op: Ops, parts: list) -> Optional[tuple[int, int]]:
    if op is Ops.ADD:
        return parts[0][0] + parts[1][0], parts[0][1] + parts[1][1]
    if op is Ops.SUB:
        return parts[0][0] - parts[1][1], parts[0][1] - parts[1][0]
    if op is Ops.NEG:
        return -parts[0][1], -parts[0][0]
    if op is Ops.MUL:
        products = [a * b for a in parts[0] for b in parts[1]]
        return min(products), max(products)
    if op is Ops.MAX:
        return max(parts[0][0], parts[1][0]), max(parts[0][1], parts[1][1])
    if op is Ops.CAST:
        return parts[0]
    if op is Ops.WHERE:
        return min(parts[1][0], parts[2][0]), max(parts[1][1], parts[2][1])
    if op is Ops.MOD and parts[1][0] > 0:
        return 0, parts[1][1] - 1
    if op is Ops.IDIV and parts[1][0] > 0 and parts[0][0] >= 0:
        return parts[0][0] // parts[1][1], parts[0][1] // parts[1][0]
    return None


def _dtype_range(node: Node) -> tuple[int, int]:
    dt = node.dtype
    if dt.kind == "b":
        return 0, 1
    bits = 8 * dt.itemsize
    return (0, 2 ** bits - 1) if dt.kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def kernels_of(graph: TaskGraph) -> Iterable[Node]:
    """The distinct kernel ASTs of a graph (for benchmarks and tests)."""
    seen: dict[Node, None] = {}
    for task in graph.tasks:
        if isinstance(task.work, Kernel):
            seen.setdefault(task.work.ast)
    return list(seen)

