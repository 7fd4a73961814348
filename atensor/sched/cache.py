"""The schedule cache: a graph with the same structure as one scheduled before reuses its TaskGraph.

Why: scheduling is Python work per node (simplification, realization points, fusion, ordering,
allreduce lowering), tens of microseconds per kernel; a training step or a server's forward pass
builds a graph of the same shape again and again, with only its buffers changed. So the scheduler's
output is kept as a *template* keyed by the graph's structure with its buffers abstracted:

- the key lists every node in topological order as (op, dtype, argument, positions of its sources),
  except that a BUFFER node is named by the slot its buffer takes (first appearance), with its device,
  size and dtype. Two graphs with equal keys differ only in which buffers fill the slots;
- the template holds the tasks with every buffer replaced by a slot (a buffer of the new graph) or a
  temporary (a fresh buffer per use), the dependency edges, and which assigns the graph realizes, so
  that versions and realized values are recorded exactly as a fresh schedule would.

Computing a key costs one pass over the graph (a few microseconds per node) against the whole
scheduler on a miss. For the common graph, none of whose nodes has a value the ledger holds,
`walk_key` makes that pass and the graph's topological order together, with no Python call per node
(an eager `x + 1` realize, 6 nodes: 10-11 us of CPU on the loaded 2-core CI machine, where the
toposort with its per-node stop test and `graph_key` after it took 14 plus 18 calls); a graph whose
realized values the scheduler substitutes is keyed after the substitution (`graph_key`). The walk runs in C
where the compiled core is built (atensor/core/walk.c: the same loop, 3x less CPU); this Python
`walk_key` stays its specification. A hit stamps
the template's `last_used` rather than reordering an ordered dict, so the key is hashed once. Kernel ASTs name buffers by parameter index, not identity, so a template's
kernels are the compiled ones already. A random draw reads its seed and first counter from a buffer
of its own (tensor/random.py), so two draws of one shape have equal keys and the second hits.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any, Callable, Optional

from atensor import core
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.taskgraph import Access, Task, TaskGraph

MAX_TEMPLATES = 512


@dataclasses.dataclass
class GraphKey:
    """A graph's structure with its buffers abstracted, plus what fills the slots this time."""
    key: tuple
    leaves: list[BufferSpec]     # slot -> buffer
    order: list[Node]            # the graph's nodes in topological order
    buffer_nodes: list[Node]     # the BUFFER nodes, for the version check


def graph_key(order: list[Node], settings: tuple = ()) -> GraphKey:
    """The key of the graph whose nodes are `order` (topological), under the scheduler `settings` that
    change what a graph schedules to (the allreduce bucket cap)."""
    position: dict[Node, int] = {}
    slots: dict[BufferSpec, int] = {}
    leaves: list[BufferSpec] = []
    buffer_nodes: list[Node] = []
    parts: list[tuple] = []
    for i, node in enumerate(order):
        position[node] = i
        if node.op is Ops.BUFFER:
            spec = node.arg[0]
            slot = slots.get(spec)
            if slot is None:
                slot = slots[spec] = len(leaves)
                leaves.append(spec)
            buffer_nodes.append(node)
            parts.append((Ops.BUFFER, node.dtype, slot, spec.device, spec.size))
        else:
            parts.append((node.op, node.dtype, node.arg, tuple([position[s] for s in node.src])))
    parts.append(settings)
    return GraphKey(tuple(parts), leaves, order, buffer_nodes)


def walk_key(roots: list[Node], settings: tuple, has_entry: Callable[[int], Any]) -> Optional[GraphKey]:
    """`graph_key(toposort(roots), settings)` in one pass over the graph: the key's part of a node is made
    when the node is emitted, after its sources. None as soon as the walk meets a node for which
    `has_entry(id(node))` is not None (the ledger may hold its value: the scheduler then stops there,
    substitutes, and keys the graph it gets, `graph_key`).

    Why: an eager realize of a graph structured like an earlier one (a cache hit) costs its key, and the
    order, the stop test per node and the key were three passes of Python calls. The order is
    toposort's exactly (the same push and emit rule), so both give one key for one graph."""
    position: dict[Node, int] = {}
    expanded: set[Node] = set()
    slots: dict[BufferSpec, int] = {}
    leaves: list[BufferSpec] = []
    buffer_nodes: list[Node] = []
    parts: list[tuple] = []
    order: list[Node] = []
    buffer = Ops.BUFFER
    for root in roots:
        if root in position:
            continue
        stack = [root]
        while stack:
            node = stack[-1]
            if node in expanded:
                stack.pop()
                if node in position:
                    continue
                position[node] = len(order)
                order.append(node)
                if node.op is buffer:
                    spec = node.arg[0]
                    slot = slots.get(spec)
                    if slot is None:
                        slot = slots[spec] = len(leaves)
                        leaves.append(spec)
                    buffer_nodes.append(node)
                    parts.append((buffer, node.dtype, slot, spec.device, spec.size))
                else:
                    src = node.src
                    if not src:
                        places: tuple = ()
                    elif len(src) == 1:
                        places = (position[src[0]],)
                    elif len(src) == 2:
                        places = (position[src[0]], position[src[1]])
                    else:
                        places = tuple([position[s] for s in src])
                    parts.append((node.op, node.dtype, node.arg, places))
                continue
            if has_entry(id(node)) is not None:
                return None
            expanded.add(node)
            src = node.src
            for i in range(len(src) - 1, -1, -1):
                child = src[i]
                if child not in expanded:
                    stack.append(child)
    parts.append(settings)
    return GraphKey(tuple(parts), leaves, order, buffer_nodes)


python_walk_key = walk_key  # the specification, whichever runs (tests/core/ compares the two)


def _compiled_walk_key(walk: Callable[..., Optional[tuple]]) -> Callable[..., Optional[GraphKey]]:
    """`walk_key` run by atensor/core/walk.c's walk (the same push and emit rule, the same parts):
    the walk's own loop in C, the GraphKey made here."""
    def walk_key(roots: list[Node], settings: tuple, has_entry: Callable[[int], Any]) -> Optional[GraphKey]:
        found = walk(roots, settings, has_entry)
        return None if found is None else GraphKey(*found)
    walk_key.__doc__ = python_walk_key.__doc__
    return walk_key


if core.ccore is not None:
    walk_key = _compiled_walk_key(core.ccore.walk_key)


@dataclasses.dataclass(frozen=True, eq=False)
class Slot:
    """A buffer of a template: leaf `index` of the graph ("L") or temporary `index` ("T"), on
    `device` (what a copy's device is read from, when a Plan is lowered from the template's works).
    Compared and hashed by identity (C-level, no generated __hash__): a template makes one per slot."""
    kind: str
    index: int
    device: str = ""


@dataclasses.dataclass(eq=False)
class Template:
    """A scheduled TaskGraph with buffers as slots; see the module docstring. The engine keeps the Plan
    it lowers from a template's slots beside it (engine/realize.py `program_of`), not on it."""
    tasks: list[tuple[Any, tuple, frozenset[int]]]   # (work with slot refs, accesses with slot refs, deps)
    temps: list[tuple[str, int, Any]]                # (device, size, dtype) of each temporary buffer
    realized: list[tuple[int, int]]                  # (position of an ASSIGN in the key's order, its slot)
    outputs: list[int]                               # slot of each root's storage
    leaf_count: int = 0                              # how many slots the graph's own buffers fill
    last_used: int = 0                               # when it was last stored or hit (`lookup`), under _lock

    @staticmethod
    def capture(graph: TaskGraph, key: GraphKey, realized: list[tuple[Node, BufferSpec]],
                outputs: list[BufferSpec]) -> Optional[Template]:
        """The template of `graph`; None when it cannot be expressed in slots (nothing is lost)."""
        slot_of = {spec: Slot("L", i, spec.device) for i, spec in enumerate(key.leaves)}
        temps: list[tuple[str, int, Any]] = []

        def ref(spec: BufferSpec) -> Slot:
            found = slot_of.get(spec)
            if found is None:
                found = slot_of[spec] = Slot("T", len(temps), spec.device)
                temps.append((spec.device, spec.size, spec.dtype))
            return found

        tasks = []
        for task in graph.tasks:
            work = map_buffers(task.work, BufferSpec, ref)
            accesses = tuple((ref(a.buffer), a.mode, a.start, a.end) for a in task.accesses)
            tasks.append((work, accesses, frozenset(task.deps)))
        position = {n: i for i, n in enumerate(key.order)}
        realized_refs = []
        for node, spec in realized:
            if node not in position or spec not in slot_of or slot_of[spec].kind != "L":
                return None
            realized_refs.append((position[node], slot_of[spec].index))
        if any(s not in slot_of or slot_of[s].kind != "L" for s in outputs):
            return None
        return Template(tasks, temps, realized_refs, [slot_of[s].index for s in outputs], len(key.leaves))

    def fill(self, key: GraphKey, temps: Optional[list[BufferSpec]] = None
             ) -> tuple[list[BufferSpec], list[tuple[Node, BufferSpec]], list[BufferSpec]]:
        """What fills the slots for the graph `key` describes (its leaves, then the temporaries: `temps`
        when given, one per `self.temps` entry, which the caller knows no running command uses; else new
        ones), the assigns it realizes and each root's storage: everything but the tasks (`graph_of`)."""
        leaves = key.leaves
        if temps is not None:
            fill = leaves + temps
        else:
            fill = leaves + [BufferSpec(device, size, dtype) for device, size, dtype in self.temps] \
                if self.temps else leaves.copy()
        order = key.order
        realized = []
        for pos, slot in self.realized:  # (loops, not comprehensions: one or two entries, every cached realize)
            realized.append((order[pos], leaves[slot]))
        outputs = []
        for slot in self.outputs:
            outputs.append(leaves[slot])
        return fill, realized, outputs

    def graph_of(self, fill: list[BufferSpec]) -> TaskGraph:
        """The TaskGraph with the buffers `fill` (from `fill`) in the slots."""
        temps_at = self.leaf_count

        def resolve(ref: Slot) -> BufferSpec:
            return fill[ref.index] if ref.kind == "L" else fill[temps_at + ref.index]

        graph = TaskGraph()
        for i, (work, accesses, deps) in enumerate(self.tasks):
            real = map_buffers(work, Slot, resolve)
            graph.tasks.append(Task(i, real, tuple([Access(resolve(r), m, s, e) for r, m, s, e in accesses]),
                                    set(deps)))
        return graph

    def instantiate(self, key: GraphKey) -> tuple[TaskGraph, list[tuple[Node, BufferSpec]], list[BufferSpec]]:
        """A fresh TaskGraph for the graph `key` describes: its buffers in the slots, new temporaries."""
        fill, realized, outputs = self.fill(key)
        return self.graph_of(fill), realized, outputs

    def slot_tasks(self) -> list[Task]:
        """The tasks with their slots as buffers (what a Plan lowered from the template holds)."""
        return [Task(i, work, tuple([Access(r, m, s, e) for r, m, s, e in accesses]), set(deps))
                for i, (work, accesses, deps) in enumerate(self.tasks)]

    def slot_index(self, ref: Slot) -> int:
        """The place in a `fill` list of the buffer in slot `ref`."""
        return ref.index if ref.kind == "L" else self.leaf_count + ref.index


def map_buffers(work: Any, kind: type, fn: Callable[[Any], Any]) -> Any:
    """A copy of a work dataclass with every field that is a `kind` (or a tuple holding some) mapped
    through `fn`: buffers to slots when capturing, slots to buffers when instantiating, captured
    buffers to a replay's (engine/lower.py). The one place a work is copied with other buffers. The
    fields are found once per (work class, kind); the copy skips the dataclass __init__ (this runs
    once per task of every cached realize)."""
    cls = type(work)
    names = _buffer_fields.get((cls, kind))
    if names is None:
        names = _buffer_fields[(cls, kind)] = tuple(f.name for f in dataclasses.fields(work)
                                                    if _holds(getattr(work, f.name), kind))
    real = object.__new__(cls)
    state = real.__dict__
    state.update(work.__dict__)
    for name in names:
        value = state[name]
        state[name] = fn(value) if isinstance(value, kind) else \
            tuple([fn(v) if isinstance(v, kind) else v for v in value])
    return real


def _holds(value: Any, kind: type) -> bool:
    return isinstance(value, kind) or (isinstance(value, tuple) and any(isinstance(v, kind) for v in value))


_buffer_fields: dict[tuple[type, type], tuple[str, ...]] = {}
_templates: dict[tuple, Template] = {}
_uses = itertools.count(1)  # stamps of `Template.last_used`: larger is more recent
_lock = threading.Lock()
stats = {"hits": 0, "misses": 0}


def lookup(key: GraphKey) -> Optional[Template]:
    """The template stored under `key`, or None. A hit stamps the template's `last_used` (the key is
    hashed once: hashing it again to reorder an OrderedDict cost a Python call per view in it)."""
    with _lock:
        found = _templates.get(key.key)
        if found is not None:
            found.last_used = next(_uses)
            stats["hits"] += 1
        else:
            stats["misses"] += 1
        return found


def store(key: GraphKey, template: Template) -> None:
    """Keeps `template` under `key`; past MAX_TEMPLATES, the least recently used eighth goes."""
    with _lock:
        template.last_used = next(_uses)
        _templates[key.key] = template
        if len(_templates) > MAX_TEMPLATES:
            ranked = sorted(_templates, key=lambda k: _templates[k].last_used)
            for old in ranked[:len(_templates) - MAX_TEMPLATES + MAX_TEMPLATES // 8]:
                del _templates[old]


def clear() -> None:
    """Forgets every template (tests use it to compare fresh and cached schedules)."""
    with _lock:
        _templates.clear()
