"""What a jit call must repeat to be replayed (jit/jit.py): the key of its arguments' plain values,
and the key of the graphs it ran.

Why a module of its own: the jit compares the graphs of its capturing and its verifying call, and
tells a user why calls whose plain arguments change are never replayed. Both are comparisons of
keys, with bound Variables described by the variable alone (a KV cache written at another
`start_pos` is the same program), apart from how calls are captured and replayed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from atensor.engine.dispatch import Recording
from atensor.graph.node import BufferSpec, Node, toposort
from atensor.graph.ops import Ops
from atensor.sched import cache
from atensor.graph.taskgraph import Task


# ---- the arguments' graphs ----------------------------------------------------------------------------
def _is_stored(node: Node) -> bool:
    """True when `node` only views realized buffers (no computation, no pending assign)."""
    return all(n.op in (Ops.BUFFER, Ops.VIEW, Ops.MULTI) for n in toposort([node]))


def _graph_of(node: Node) -> list[Node]:
    """toposort([node]), at once for the common argument: a view of one buffer."""
    if node.op is Ops.VIEW and node.src[0].op is Ops.BUFFER:
        return [node.src[0], node]
    return [node] if node.op is Ops.BUFFER else toposort([node])


def _input_key(graph: list[Node]) -> tuple:
    """`cache.graph_key(graph).key`, at once for the common argument: a buffer, or one node (a view)
    of one buffer (the same tuple: tests/engine/test_jit_tiny_replay.py checks it)."""
    first = graph[0]
    if first.op is Ops.BUFFER and len(graph) <= 2:
        spec = first.arg[0]
        leaf = (Ops.BUFFER, first.dtype, 0, spec.device, spec.size)
        if len(graph) == 1:
            return (leaf, ())
        node = graph[1]
        if node.src == (first,):
            return (leaf, (node.op, node.dtype, node.arg, (0,)), ())
    return cache.graph_key(graph).key


def _leaves(node: Node) -> list[Node]:
    return [n for n in toposort([node]) if n.op is Ops.BUFFER]


def _plain_values(shape: Any) -> list[Any]:
    """The non-tensor values in a flattened argument description, in order."""
    kind, body = shape
    if kind in ("V", "Var"):  # a plain value, or a bound Variable (described unbound)
        return [body]
    if kind == "T":
        return []
    items = [v for _, v in body] if kind == "dict" else list(body)
    return [x for item in items for x in _plain_values(item)]


def only_plain_values_differ(old: tuple, new: tuple) -> Optional[tuple[Any, Any]]:
    """(old values, new values) when two call keys differ only in their non-tensor arguments."""
    if old[1:] != new[1:]:
        return None
    a, b = _plain_values(old[0]), _plain_values(new[0])
    return (a, b) if len(a) == len(b) and a != b else None


@dataclass(frozen=True)
class TaskKey:
    """One captured task, as the verifying call must repeat it: its name, the role of each buffer it
    touches (`_Roles`) and everything else about it (the kernel, offsets, sizes, byte ranges, which
    earlier tasks it waits for), with bound Variables by the variable alone."""
    name: str
    buffers: tuple[tuple, ...]
    body: tuple


@dataclass(frozen=True)
class DrawKey:
    """One random draw: how many counters it took and its counter buffers' roles."""
    count: int
    buffers: tuple[tuple, ...]


@dataclass(frozen=True)
class ProgramKey:
    """What a captured call ran: per realize its tasks, in issue order, then its random draws. Two
    calls replay alike exactly when their keys are equal: it is computed from the tasks themselves,
    whatever the settings (the schedule cache's key is None when the cache is off)."""
    realizes: tuple[tuple[TaskKey, ...], ...]
    draws: tuple[DrawKey, ...]


class _Roles:
    """Names each buffer by what it is to the call, the same way on every call that replays alike: an
    argument's ("input", argument position), one the call made ("made", order of first use in the
    call's tasks: results, temporaries, random counters), or state that existed before the call
    (weights, optimizer moments: "state" and the buffer itself, which a replay updates in place)."""

    def __init__(self, since_uid: int, inputs: list[BufferSpec]):
        self.since_uid = since_uid
        self.inputs: dict[BufferSpec, int] = {}
        for i, spec in enumerate(inputs):
            self.inputs.setdefault(spec, i)
        self.made: dict[BufferSpec, int] = {}

    def of(self, spec: BufferSpec) -> tuple:
        shape = (spec.dtype.name, spec.size, spec.device)
        if spec in self.inputs:
            return ("input", self.inputs[spec]) + shape
        if spec.uid >= self.since_uid:
            return ("made", self.made.setdefault(spec, len(self.made))) + shape
        return ("state", spec.uid) + shape


def _frozen(value: Any) -> Any:
    """A hashable form of a work's field (Variables by themselves, their values left out)."""
    if isinstance(value, dict):
        return tuple(value)  # var_vals: the variables, not this call's values
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _task_key(task: Task, roles: _Roles) -> TaskKey:
    work = task.work
    fields = tuple(sorted((k, _frozen(v)) for k, v in vars(work).items() if not isinstance(v, BufferSpec)
                          and not (isinstance(v, tuple) and v and isinstance(v[0], BufferSpec))))
    touched = [v for v in vars(work).values() if isinstance(v, BufferSpec)]
    touched += [s for v in vars(work).values() if isinstance(v, tuple) for s in v if isinstance(s, BufferSpec)]
    accesses = tuple((roles.of(a.buffer), a.mode, a.start, a.end) for a in task.accesses)
    return TaskKey(getattr(work, "name", type(work).__name__), tuple(roles.of(s) for s in touched),
                   (type(work).__name__, fields, accesses, tuple(sorted(task.deps))))


def program_key(records: Recording, inputs: list[BufferSpec]) -> ProgramKey:
    """The key of the call `records` captured (its realizes' tasks and its draws), given the call's
    input buffers in argument order."""
    roles = _Roles(records.since_uid, inputs)
    realizes = tuple(tuple(_task_key(t, roles) for t in r.graph.tasks) for r in records)
    draws = tuple(DrawKey(count, tuple(roles.of(s) for s in specs)) for specs, count in records.draws)
    return ProgramKey(realizes, draws)


def _role_text(role: tuple) -> str:
    kind, which, dtype, size, device = role
    place = {"input": f"argument buffer {which}", "made": f"buffer {which} made by the call",
             "state": f"existing buffer #{which}"}[kind]
    return f"{place} ({dtype}[{size}] on {device})"


def difference(old: ProgramKey, new: ProgramKey) -> str:
    """What differs between the capturing call's key and the verifying call's, in words: which
    realize, which task and what about it (its buffers, or its computation), or which draw."""
    if len(old.realizes) != len(new.realizes):
        return f"the first call ran {len(old.realizes)} realizes, the second {len(new.realizes)}"
    for i, (a, b) in enumerate(zip(old.realizes, new.realizes)):
        where = f"realize {i + 1} of {len(old.realizes)}"
        if len(a) != len(b):
            names = [t.name for t in a[:4]], [t.name for t in b[:4]]
            return f"{where} ran {len(a)} tasks, then {len(b)} (first ones: {names[0]}, then {names[1]})"
        for j, (x, y) in enumerate(zip(a, b)):
            if x == y:
                continue
            task = f"{where}, task {j + 1} ({x.name}" + (f", then {y.name})" if x.name != y.name else ")")
            if x.buffers != y.buffers:
                k = next(k for k, (p, q) in enumerate(zip(x.buffers, y.buffers)) if p != q) \
                    if len(x.buffers) == len(y.buffers) else 0
                return (f"{task}: its buffer {k} was {_role_text(x.buffers[k])}, then "
                        f"{_role_text(y.buffers[k])}")
            if x.body[2] != y.body[2]:
                return f"{task}: it touches other byte ranges or buffers ({x.body[2]} then {y.body[2]})"
            return f"{task}: it computes something else (another kernel, size or offset)"
    if len(old.draws) != len(new.draws):
        return f"the first call made {len(old.draws)} random draws, the second {len(new.draws)}"
    for i, (a, b) in enumerate(zip(old.draws, new.draws)):
        if a != b:
            return f"random draw {i + 1}: {a.count} counters, then {b.count}"
    return "nothing (the keys are equal)"
