"""From output nodes to a TaskGraph: realization points, fusion into kernels, buffers and copies.

A realization point is a node whose value must sit in a buffer: every ASSIGN (outputs of a realize
are ASSIGNs into fresh buffers), every CONTIGUOUS, every COPY and the source of a copy, and any
computed node that two kernels would otherwise both compute. Everything between realization points
on one device fuses into one kernel: elementwise chains, the reduce they feed and the elementwise
work after it, with views folded into the kernel's loads.

Versions keep lazy reads honest. A BUFFER node names one version of its buffer; an ASSIGN makes the
next. A kernel reading version k must run before the ASSIGN that makes version k+1 (write after
read), and a graph that reads a version older than the buffer's newest realized one would see data
that was overwritten since it was built: that raises instead of silently differing from eager code.
The bookkeeping of versions, pending assigns and realized values is the storage ledger's
(atensor/ledger/, its rules in ledger/versions.py); this module reads it while scheduling, and a
`Schedule`'s commit writes it there.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from atensor.graph.node import BufferSpec, GraphError, Node, toposort
from atensor.graph.ops import ELEMENTWISE, LEAVES, PACKED, Ops
from atensor.graph.rewrite import substitute, unbind_ast
from atensor.graph.simplify import simplify
from atensor.graph.symbolic import hi_of, lo_of, sym_max, sym_min, unbind
from atensor.graph.view import View
from atensor.sched.allreduce import Planner
from atensor.config import current_settings, settings
from atensor.sched import cache
from atensor.sched.kernel_names import kernel_name
from atensor.graph.taskgraph import Access, Copy, Kernel, TaskGraph
from atensor.ledger import lock as _ledger_lock, value_entry as _value_entry
from atensor.ledger.versions import (AssignCycleError, _flush_along, _realized, check_versions, record_realized,
                                    storage_of)
from atensor.ledger.versions import StaleReadError  # noqa: F401 - imported from here (docs/semantics.md)


@dataclass
class Schedule:
    """The result of scheduling: the graph, per root the buffer that holds it afterwards, and the
    bookkeeping `commit()` applies once the graph is submitted (versions and realized values).

    On a schedule-cache hit the graph is not built unless asked for: `template` and `fill` (the
    buffers in its slots, sched/cache.py) say what it is, and engine/realize.py submits the Plan it
    keeps for the template (engine/realize.py `program_of`) with those buffers; reading `graph` instantiates it
    (with exactly these buffers: the same graph the plan runs)."""
    _graph: Optional[TaskGraph]
    outputs: list[BufferSpec]
    _commit: Optional[Callable[[], None]] = None
    assigned: tuple[BufferSpec, ...] = ()   # the buffers whose version the commit advances, in order
    key: Optional[tuple] = None             # the graph's structure (sched/cache.py), when computed
    template: Optional[cache.Template] = None  # on a cache hit: the template the graph comes from
    fill: Optional[list[BufferSpec]] = None    # and its slots' buffers (leaves, then temporaries)

    @property
    def graph(self) -> TaskGraph:
        """The TaskGraph (built from the template on first use, after a cache hit)."""
        graph = self._graph
        if graph is None:
            graph = self._graph = self.template.graph_of(self.fill)
        return graph

    @property
    def task_count(self) -> int:
        """How many tasks the graph has (without building it)."""
        return len(self._graph.tasks) if self._graph is not None else len(self.template.tasks)

    def commit(self) -> None:
        """Records what this graph realizes: each assigned buffer's next version, and which lazy
        values now live in which buffers. Called once, by the dispatcher, in submission order."""
        if self._commit is not None:
            self._commit()
            self._commit = None


def _cached_in(since_uid: Optional[int]) -> Callable[[Node], Optional[Node]]:
    """`_realized`, or with `since_uid` the same limited to realized values held in buffers made from
    that id on (realized assigns always map: they are buffer versions, not cached values)."""
    if since_uid is None:
        return _realized

    def found(node: Node) -> Optional[Node]:
        m = _realized(node)
        return m if m is None or node.op is Ops.ASSIGN or m.base().arg[0].uid >= since_uid else None
    return found


def schedule(roots: list[Node], pending: Optional[list[Node]] = None,
             since_uid: Optional[int] = None,
             found: Optional[tuple[Optional[cache.GraphKey], Optional[cache.Template]]] = None) -> Schedule:
    """Turns ASSIGN roots into a TaskGraph of kernels and copies; records what becomes realized.
    `pending` (from `pending_heads()`) are lazy assigns to realize along when this graph overwrites
    a version they read; `Schedule.outputs` has one entry per given root. With `since_uid` (a jit
    capture, jit/jit.py), a value realized into a buffer older than that id is computed again
    rather than read from there: the graph then depends only on what the capture was given.
    `found`: the `walk_key` of `roots` and its `cache.lookup` (None, None when the walk stopped at a
    realized value), which the caller made with no pending assign to take
    along, no `since_uid` and the cache on, and nothing committed since (engine/realize.py `_hot_hit`)."""
    requested = len(roots)
    if pending:
        roots = _flush_along(roots, pending)
    config = current_settings()
    # the common case in one pass: no node of the graph has a value the ledger may hold (nothing to
    # substitute), so the order and the key come from one walk (sched/cache.py `walk_key`)
    if found is not None:
        key = found[0]
    else:
        key = cache.walk_key(roots, (config.allreduce_bucket_bytes,), _value_entry) if config.schedule_cache \
            else None
    if key is not None:
        original, mapping = key.order, {}
    else:
        cached = _cached_in(since_uid)
        stopped: list[Node] = []

        def stop(n: Node) -> bool:
            # (without an entry in the ledger, `cached` is None: most nodes, tested without a call)
            if _value_entry(id(n)) is None or cached(n) is None:
                return False
            stopped.append(n)
            return True
        original = toposort(roots, stop=stop)
        with _ledger_lock:  # the realized values the graph uses, read together
            mapping = {n: m for n in stopped if (m := cached(n)) is not None}
    if mapping:
        # a value cached in a buffer this graph assigns to is computed again instead: read from
        # there, it would tie the assigns into a cycle (read version k, write k+1 and k+2 in one kernel)
        written = {storage_of(n) for n in original if n.op is Ops.ASSIGN and n not in mapping}
        if any(n.op is not Ops.ASSIGN and m.base().arg[0] in written for n, m in mapping.items()):
            def usable(n: Node) -> bool:
                m = cached(n)
                return m is not None and (n.op is Ops.ASSIGN or m.base().arg[0] not in written)
            original = toposort(roots, stop=usable)
            with _ledger_lock:
                mapping = {n: m for n in original if usable(n) and (m := cached(n)) is not None}
    subbed = substitute(roots, mapping) if mapping else {}
    new_roots = [subbed.get(r, r) for r in roots] if subbed else roots
    if key is None and config.schedule_cache:  # with nothing substituted, `original` is new_roots' order
        key = cache.graph_key(toposort(new_roots) if mapping else original, (config.allreduce_bucket_bytes,))
    template = found[1] if found is not None and found[0] is not None else \
        cache.lookup(key) if key is not None else None
    fill = None
    if template is not None:
        check_versions(key.buffer_nodes)
        graph = None  # built only when asked for (Schedule.graph)
        fill, realized, outputs = template.fill(key)
    else:
        simplified = simplify(new_roots)
        final_roots = [simplified[r] for r in new_roots]
        builder = _Builder([r for r in final_roots if r.op is Ops.ASSIGN])
        builder.run()
        graph = builder.graph
        # the assigns this graph realizes, named by their nodes before simplification (the ones that
        # the user's tensors and later graphs hold), in the order their versions are made
        before: dict[Node, Node] = {}
        for pre, post in simplified.items():
            if pre.op is Ops.ASSIGN:
                before.setdefault(post, pre)
        realized = [(before.get(p, p), spec) for p, spec in builder.buffers.items() if p.op is Ops.ASSIGN]
        outputs = [storage_of(r) for r in final_roots]
        if key is not None:
            template = cache.Template.capture(graph, key, realized, outputs)
            if template is not None:
                cache.store(key, template)

    def commit() -> None:
        record_realized(realized, original, subbed, roots, new_roots)
    assigned = tuple([spec for _, spec in realized])
    return Schedule(graph, outputs[:requested], commit, assigned,
                    key.key if key is not None else None, template if fill is not None else None, fill)


def _pads_col2im(node: Node) -> bool:
    """An elementwise node over a col2im (an ADD of masked views of a REDUCE: a convolution's input
    gradient), which a masked view pads again (max-pool's backward): a realization point. Fused, the
    kernel read the column gradient through both views at once; numpy's kernel padded whole arrays for
    each (examples/conv_digits.py's 32->64 3x3 layer at batch 128: 75-90 ms CPU), C's recomputed the col2im per
    pad (110 ms). Apart, the col2im is numpy's per-sample adds (RowsThenAddPads) and the rest C."""
    return node.op in ELEMENTWISE and any(
        s.op is Ops.ADD and any(x.op is Ops.VIEW and x.arg.mask is not None and x.src[0].op is Ops.REDUCE
                                for x in s.src) for s in node.src)


def _at(view: View, offset: int) -> View:
    """`view` (contiguous) shifted by `offset` elements."""
    return view if not offset else View(view.shape, view.strides, offset, None)


def _is_whole_buffer(node: Node) -> Optional[tuple[BufferSpec, int]]:
    """(buffer, element offset) when `node` reads a contiguous run of one realized buffer."""
    if node.op is Ops.BUFFER:
        return node.arg[0], 0
    if node.op is Ops.VIEW and node.src[0].op is Ops.BUFFER and node.arg.contiguous \
            and not node.arg.variables():
        return node.src[0].arg[0], node.arg.offset
    return None


class _Builder:
    """Builds the TaskGraph for one set of roots. One topological order of the whole graph drives
    everything: the points, each point's interior (the nodes its kernel computes, in order), the
    order of the points, and the kernels' bodies."""

    def __init__(self, roots: list[Node]):
        self.roots = roots
        self.graph = TaskGraph()
        self.order = toposort(roots)
        self.position = {n: i for i, n in enumerate(self.order)}
        self.buffers: dict[Node, BufferSpec] = {}
        self.offsets: dict[Node, int] = {}  # element offset of a point's value in its buffer, when not 0
        self.planner: Optional[Planner] = None  # the allreduce collectives, when the graph has any

    # ---- realization points ---------------------------------------------------------------------
    def _points(self) -> tuple[set[Node], dict[Node, list[Node]]]:
        """The realization points and, per point, its interior in topological order."""
        points: set[Node] = set(self.roots)
        users: dict[Node, list[Node]] = {}
        for node in self.order:
            if node.op is Ops.ASSIGN or node.op is Ops.CONTIGUOUS:
                points.add(node)
            elif node.op is Ops.COPY and _is_whole_buffer(node.src[0]) is None:
                points.add(node.src[0])
            elif node.op is Ops.ALLREDUCE:  # a collective reads its partials from buffers
                points.add(node)
                points.update(s for s in node.src if _is_whole_buffer(s) is None)
                self.planner = self.planner or Planner([], set(), {})
            elif node.op in PACKED:  # a kernel of its own, reading its operands from buffers (backend/c/render.py)
                points.add(node)
                points.update(s for s in node.src if _is_whole_buffer(s) is None)
            elif node.op is Ops.VIEW and node.arg.mask is not None and _pads_col2im(node.src[0]):
                points.add(node.src[0])
            for s in node.src:
                users.setdefault(s, []).append(node)
        self.users = users
        for node in self.order:
            # a copy straight into an assign's contiguous target needs no buffer of its own
            if node.op is Ops.COPY:
                into = users.get(node, [])
                if not (len(into) == 1 and into[0].op is Ops.ASSIGN and into[0].src[1] is node
                        and into[0].arg.contiguous and not into[0].arg.variables()):
                    points.add(node)
        # a computed node two kernels would both compute becomes a point of its own
        owners: dict[Node, tuple[Node, ...]] = {}
        for node in reversed(self.order):
            if node in points:
                owners[node] = (node,)
                continue
            node_users = users.get(node, ())
            if len(node_users) == 1:
                owned = owners[node_users[0]]
            else:
                owned = tuple(dict.fromkeys(o for u in node_users for o in owners[u]))
            if len(owned) > 1 and node.op not in LEAVES and node.op is not Ops.VIEW and \
                    not (node.op in ELEMENTWISE and node.size <= 1):
                points.add(node)
                owned = (node,)
            owners[node] = owned
        interiors: dict[Node, list[Node]] = {p: [] for p in points}
        for node in self.order:
            if node in points:
                interiors[node].append(node)
            else:
                for owner in owners[node]:
                    interiors[owner].append(node)
        return points, interiors

    def _ordered_points(self, points: set[Node], interiors: dict[Node, list[Node]]) -> list[Node]:
        """Points in an order where sources come first and readers of a version precede its overwrite."""
        deps: dict[Node, set[Node]] = {p: set() for p in points}
        readers_of: dict[Node, set[Node]] = {}  # version node -> points reading it
        for p in points:
            own_storage = p.src[0] if p.op is Ops.ASSIGN else None
            for n in interiors[p]:
                for s in n.src:
                    if s in points:
                        if s is not p:
                            deps[p].add(s)
                    if (s.op is Ops.BUFFER or s.op is Ops.ASSIGN) and not (n is p and s is own_storage):
                        readers_of.setdefault(s, set()).add(p)
        for p in points:
            if p.op is Ops.ASSIGN:
                for reader in readers_of.get(p.src[0], ()):
                    if reader is not p:
                        deps[p].add(reader)
        ordered: list[Node] = []
        state: dict[Node, int] = {}
        position = self.position
        for start in sorted(points, key=position.__getitem__):
            if start in state:
                continue
            stack = [(start, iter(sorted(deps[start], key=position.__getitem__)))]
            state[start] = 1
            while stack:
                node, it = stack[-1]
                for d in it:
                    if state.get(d) == 1:
                        raise AssignCycleError(
                            "cycle detected in graph: one kernel would read a buffer both before and after "
                            "an assign to it, so no order matches eager execution; realize (or "
                            ".contiguous()) the value that reads the old contents before the assign")
                    if d not in state:
                        state[d] = 1
                        stack.append((d, iter(sorted(deps[d], key=position.__getitem__))))
                        break
                else:
                    stack.pop()
                    state[node] = 2
                    ordered.append(node)
        self.deps = deps
        return ordered

    # ---- building tasks -------------------------------------------------------------------------
    def run(self) -> None:
        points, interiors = self._points()
        check_versions([n for n in self.order if n.op is Ops.BUFFER])
        buffers = self.buffers
        ordered = self._ordered_points(points, interiors)
        planner = None
        if self.planner is not None:
            ordered = Planner.reorder(ordered, self.deps)
            # collectives are found in emission order, so buckets fill in the order partials are ready
            planner = self.planner = Planner(ordered, points, self.users, settings.allreduce_bucket_bytes)
        for point in ordered:
            if planner is not None:  # allreduces: lowered late, so that ready ones share a bucket
                planner.flush_before(self.deps[point], self)
                if point.op is Ops.ALLREDUCE:
                    buffers[point], self.offsets[point] = planner.defer(point, self)
                    continue
                if planner.writes_directly(point):
                    buffers[point] = storage_of(point)
                    continue
                location = planner.location(point)
                if location is not None and point.op is not Ops.ASSIGN:
                    buffers[point], self.offsets[point] = location
                    self._emit(point, location[0], points, interiors[point])
                    continue
            if point.op is Ops.ASSIGN:
                spec = storage_of(point)
            else:
                spec = BufferSpec(point.device, point.size, point.dtype)
            buffers[point] = spec
            self._emit(point, spec, points, interiors[point])
        if planner is not None:
            planner.flush(self)

    def location_of(self, node: Node) -> tuple[BufferSpec, int]:
        """(buffer, element offset) holding an emitted point's value or a leaf's contiguous data."""
        if node in self.buffers:
            return self.buffers[node], self.offsets.get(node, 0)
        found = _is_whole_buffer(node)
        if found is None:
            raise GraphError(f"{node} is neither a realization point nor a contiguous buffer")
        return found

    def _emit(self, point: Node, out: BufferSpec, points: set[Node], interior: list[Node]) -> None:
        op = point.op
        value = point.src[1] if op is Ops.ASSIGN else (point.src[0] if op in (Ops.CONTIGUOUS, Ops.COPY) else point)
        target_view = point.arg if op is Ops.ASSIGN else _at(View.create(point.shape), self.offsets.get(point, 0))
        buffers = self.buffers
        if op is Ops.COPY or (op is Ops.ASSIGN and value.op is Ops.COPY and value not in points):
            copy_src = value.src[0] if value.op is Ops.COPY else value
            if op is Ops.COPY or target_view.contiguous:
                self._emit_copy(copy_src, out, target_view.offset,
                                point.size if op is Ops.COPY else target_view.size)
                return
        params: dict[BufferSpec, Node] = {}
        whole_reads: set[BufferSpec] = set()
        view_reads: dict[BufferSpec, list[View]] = {}

        def param(spec: BufferSpec) -> Node:
            found = params.get(spec)
            if found is None:
                found = params[spec] = Node.make(Ops.PARAM, spec.dtype, (), (len(params), spec.size))
            return found

        param(out)
        new: dict[Node, Node] = {}

        def mapped(node: Node) -> Node:
            found = new.get(node)
            if found is None:  # another point's output, read from its buffer
                spec = buffers[node]
                offset = self.offsets.get(node, 0) if self.offsets else 0
                if offset or (node.op is not Ops.ASSIGN and spec.size != node.size):  # an allreduce bucket's slice
                    window = _at(View.create(node.shape), offset)
                    found = new[node] = param(spec).view(window)
                    view_reads.setdefault(spec, []).append(window)
                else:
                    found = new[node] = param(spec) if node.op is Ops.ASSIGN else param(spec).reshape(node.shape)
                    whole_reads.add(spec)
            return found

        for n in interior:
            if n is point and value is not point:
                continue  # the assign/contiguous itself is the store, not a computed value
            if n.op is Ops.BUFFER:
                new[n] = param(n.arg[0])
            elif n.op is Ops.VIEW:
                src = n.src[0]
                if src.op is Ops.BUFFER:
                    view_reads.setdefault(src.arg[0], []).append(n.arg)
                new[n] = mapped(src).view(n.arg)
            elif n.src:
                new[n] = Node.make(n.op, n.dtype, tuple([mapped(x) for x in n.src]), n.arg)
                for x in n.src:
                    if x.op is Ops.BUFFER:
                        whole_reads.add(x.arg[0])
            else:
                new[n] = n
        body = mapped(value)
        if value.op is Ops.BUFFER:  # a plain copy of a buffer: no node in the kernel reads it but the store
            whole_reads.add(value.arg[0])
        store_target = param(out).view(target_view)
        ast = Node.make(Ops.STORE, point.dtype, (store_target, body))
        specs = tuple(sorted(params, key=lambda s: params[s].arg[0]))
        accesses = []
        for spec in specs:
            lo, hi = (0, spec.size - 1) if spec in whole_reads else (spec.size, -1)
            for v in view_reads.get(spec, ()):
                a, b = v.index_range()
                lo, hi = sym_min(lo, a), sym_max(hi, b)
            if hi_of(hi) >= lo_of(lo):
                accesses.append(Access(spec, "r", lo * spec.dtype.itemsize, (hi + 1) * spec.dtype.itemsize))
        lo, hi = target_view.index_range()
        if hi_of(hi) >= lo_of(lo):
            accesses.append(Access(out, "w", lo * out.dtype.itemsize, (hi + 1) * out.dtype.itemsize))
        # views at bound variables: the kernel and its byte ranges hold the variables, not their values
        ast, var_vals = unbind_ast(ast)
        if var_vals:
            accesses = [Access(a.buffer, a.mode, unbind(a.start, {}), unbind(a.end, {})) for a in accesses]
        name, flops, ops = kernel_meta(ast)
        self.graph.add(Kernel(ast, specs, point.device, name, flops=flops, var_vals=var_vals, ops=ops), accesses)

    def _emit_copy(self, src: Node, dst: BufferSpec, dst_offset: int, size: int) -> None:
        buffers = self.buffers
        if src in buffers:
            spec, offset = buffers[src], self.offsets.get(src, 0)
        else:
            found = _is_whole_buffer(src)
            if found is None and src.op is Ops.VIEW and src.src[0] in buffers and src.arg.contiguous \
                    and not src.arg.variables():
                found = (buffers[src.src[0]], src.arg.offset)
            if found is None:
                raise GraphError(f"copy source {src} is not a realized buffer")
            spec, offset = found
        itemsize = dst.dtype.itemsize
        nbytes = size * itemsize
        work = Copy(spec, dst, offset * itemsize, dst_offset * itemsize, nbytes,
                    name=f"copy_{spec.device}_to_{dst.device}_{nbytes}B")
        self.graph.add(work, [Access(spec, "r", offset * itemsize, offset * itemsize + nbytes),
                              Access(dst, "w", dst_offset * itemsize, dst_offset * itemsize + nbytes)])


_meta_cache: weakref.WeakKeyDictionary[Node, tuple[str, int, str]] = weakref.WeakKeyDictionary()


def kernel_meta(ast: Node) -> tuple[str, int, str]:
    """(name, flops, op list) of a kernel (sched/kernel_names.py), computed once per kernel structure."""
    meta = _meta_cache.get(ast)
    if meta is None:
        body = ast.src[1]
        name, ops = kernel_name(body)
        meta = _meta_cache[ast] = (name, estimate_flops(body), ops)
    return meta


def estimate_flops(body: Node) -> int:
    """One flop per elementwise op per element and one per reduced input element."""
    total = 0
    for n in toposort([body]):
        if n.op in ELEMENTWISE and n.op is not Ops.CAST:
            total += n.size
        elif n.op is Ops.REDUCE:
            total += n.src[0].size
        elif n.op is Ops.QMATMUL:  # a multiply and an add per weight per row of x
            total += 2 * n.size * n.arg.cols
        elif n.op is Ops.DEQUANT:
            total += n.size
    return total
