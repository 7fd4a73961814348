"""One captured jit call (`CallProgram`): what replaying its key needs, and how a replay is submitted.

Why a module of its own: jit/jit.py decides when a call runs, is captured, verified or replayed; this
module holds what a capture keeps (one engine/program.py `CapturedProgram` per recorded realize, the
inputs, the fresh result buffers, the results' graphs, the random draws, the kernels' variable
values) and the replay itself: the mapping captured -> this call's buffers (`CallProgram.replay`),
the result tensors on them, and the replayed commit and submission (`run_records`).

Invariant: a CallProgram's records are submitted by the dispatching thread only (engine/dispatch.py);
its `var_vals` dicts are rebound (`bind`) only when the previous replay that reads them is done.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field as dataclasses_field
from typing import Any, Optional

from atensor import ledger
from atensor.graph.node import BufferSpec, Node, toposort
from atensor.graph.ops import Ops
from atensor.graph.symbolic import Variable
from atensor.graph.taskgraph import Task
from atensor.hcq.buffer import Buffer
from atensor.engine.dispatch import Job, Recording
from atensor.engine.handle import RealizeHandle
from atensor.engine.submission import Submission
from atensor.engine.program import CapturedProgram
from atensor.jit.callkey import ProgramKey, _leaves, program_key
from atensor.ledger import versions
from atensor.profiler import collector
from atensor.profiler.events import HostSpan
from atensor.tensor import random as rng
from atensor.tensor.tensor import Tensor

@dataclass
class CallProgram:
    """What replaying one key needs."""
    records: list[CapturedProgram]    # one per captured realize, in order
    inputs: list[BufferSpec]          # the captured call's input buffers, in argument order
    fresh: list[BufferSpec]           # the result buffers the captured call made: new per replay
    results: list[Node]               # the returned tensors' nodes (views of their buffers)
    result_shape: Any                 # how to rebuild the return value from them
    written: frozenset[BufferSpec]    # every buffer a replay writes (captured names)
    tasks: int                        # tasks per replay, all records together
    accessed: frozenset[BufferSpec]   # every buffer a replay reads or writes (captured names)
    keys: ProgramKey                  # each realize's tasks and each draw: what a call repeats
    draws: list[rng.Draw]             # the random draws the call made, redrawn on every replay
    verified: bool = False
    result_order: Optional[list[Node]] = None  # the results' graphs, sources first (made once)
    var_vals: list[dict] = dataclasses_field(default_factory=list)  # the kernels' variable values
    var_index: Optional[dict[Variable, list[tuple[dict, Variable]]]] = None  # each variable's dicts (bind)
    last: Optional[RealizeHandle] = None      # the latest replay, while variables are rebound
    # its jit/direct.py DirectReplay; False when it cannot have one; a CapturedProgram `_current` tuple
    # when the plan of that tuple has no record (until it is re-lowered); None: not made yet
    direct: Any = None
    # the written buffers: (the program's own Buffers, the captured specs a replay's mapping replaces)
    written_split: Optional[tuple[list[Buffer], list[BufferSpec]]] = None

    def bind(self, values: dict[Variable, int]) -> None:
        """Sets the captured kernels' variable values in place (their runners read these dicts).
        Through an index from each variable to the dicts that hold it, made on the first bind (the
        dicts' keys never change): a decode step of 16 KV-cache slots has 16 variables over ~100
        kernels, and looking each kernel's variables up in `values` took ~1.6 ms of host per step."""
        index = self.var_index
        if index is None:
            index = self.var_index = {}
            for var_vals in self.var_vals:
                for var in var_vals:  # the dict's own key: set by identity, no Variable.__eq__
                    index.setdefault(var, []).append((var_vals, var))
        for var, new in values.items():
            for var_vals, key in index.get(var, ()):
                var_vals[key] = new

    def written_buffers(self, mapping: dict[BufferSpec, BufferSpec]) -> list[Buffer]:
        """The runtime Buffers a replay with `mapping` writes: the program's own ones (found once: they
        live as long as the program) and this replay's buffers for the mapped ones."""
        split = self.written_split
        if split is None:
            own = [Buffer.of(spec) for spec in self.written if spec not in mapping]
            split = self.written_split = (own, [spec for spec in self.written if spec in mapping])
        own, mapped = split
        of = Buffer.of
        return own + [of(mapping[spec]) for spec in mapped]

    def replay(self, inputs: list[BufferSpec], values: Optional[dict[Variable, int]] = None
               ) -> tuple[Job, list[Tensor], dict[BufferSpec, BufferSpec]]:
        """The job that runs the captured graphs with `inputs`, fresh result buffers and fresh random
        draws, the result tensors (realized once the job is done) and the mapping from captured to
        replayed buffers."""
        mapping = dict(zip(self.inputs, inputs))
        if self.draws:  # each captured draw's counter buffers, written anew from the counter as it is now
            captured = [spec for specs, _ in self.draws for spec in specs]
            mapping.update(zip(captured, rng.redraw(self.draws)))
        for spec in self.fresh:
            mapping[spec] = BufferSpec(spec.device, spec.size, spec.dtype)
        tensors = [Tensor(n) for n in self._results_on(mapping, values)]
        job = Job(None, [])
        records = self.records
        job.plan = lambda: run_records(records, mapping, inputs)
        return job, tensors, mapping


    def _results_on(self, mapping: dict[BufferSpec, BufferSpec], values: Optional[dict[Variable, int]] = None
                    ) -> list[Node]:
        """The result nodes with their buffers swapped by `mapping`: the captured graph of each result
        rebuilt source by source (the same shapes and devices: nothing to infer). A view bound to the
        capture's variable values is bound to this call's `values` instead (a result of symbolic shape,
        `cache[:, :start_pos+1]`, has this call's length), and what reads it is inferred anew."""
        order = self.result_order
        if order is None:
            order = self.result_order = toposort(self.results)
        done: dict[Node, Node] = {}
        for node in order:
            if node.op is Ops.BUFFER:
                new = mapping.get(node.arg[0])
                done[node] = node if new is None else Node.make_like(node, (), (new, node.arg[1]))
            elif values and node.op is Ops.VIEW and node.arg.variables():
                src = tuple([done[s] for s in node.src])
                done[node] = Node.make(Ops.VIEW, node.dtype, src, node.arg.rebind(values))
            else:
                src = tuple([done[s] for s in node.src])
                if src == node.src:
                    done[node] = node
                elif values and any(s.shape != o.shape for s, o in zip(src, node.src)):
                    done[node] = Node.make(node.op, node.dtype, src, node.arg)
                else:
                    done[node] = Node.make_like(node, src, node.arg)
        return [done[n] for n in self.results]



def run_records(records: list[CapturedProgram], mapping: dict[BufferSpec, BufferSpec],
                 inputs: list[BufferSpec]) -> Submission:
    """On the dispatcher thread: each captured graph's commit (version counts), then its submission;
    a lazy input's pending assign, computed by the replay, then counts as realized."""
    start = time.perf_counter_ns()
    total: Optional[Submission] = None
    count = 0
    for record in records:
        if record.assigned:
            versions.advance_versions([mapping.get(spec, spec) for spec in record.assigned])
        sub = record.submit(mapping)
        if total is None:
            total = sub
        else:
            total.final.update(sub.final)  # values only grow, so the later graph's value is the final one
            total.placed.extend(sub.placed)
        count += len(record.tasks)
    if total is None:
        total = Submission()
    for spec in inputs:
        if ledger.head(spec) is not None:
            versions.settle_head(spec)
    if collector.is_active():
        collector.record_host(HostSpan(f"replay {count} tasks", "schedule", start, time.perf_counter_ns()))
    return total


def _own_variables(task: Task) -> Task:
    """`task`, with a kernel that has variables given a `var_vals` dict of its own: a replay rebinds
    the program's dicts in place (`CallProgram.bind`), and the captured kernel may share its dict with a
    schedule-cache template (a graph instantiated from one copies works shallowly), whose eager hits
    would then run at the replay's values (issue 40)."""
    work = task.work
    if not getattr(work, "var_vals", None):
        return task
    own = object.__new__(type(work))
    own.__dict__.update(work.__dict__)
    own.var_vals = dict(work.var_vals)
    return Task(task.id, own, task.accesses, set(task.deps))


def program_of_call(records: Recording, inputs: list[BufferSpec], results: list[Node],
             result_shape: Any) -> CallProgram:
    """The program of a captured call: `records` are the schedules it ran (and its random draws); the
    buffers made during it (from `records.since_uid` on) that results live in are told from the state."""
    first_uid = records.since_uid
    input_set = set(inputs)
    fresh: list[BufferSpec] = []
    for node in results:
        for leaf in _leaves(node):
            spec = leaf.arg[0]
            if spec.uid >= first_uid and spec not in input_set and spec not in fresh:
                fresh.append(spec)
    substituted = input_set | set(fresh) | {spec for specs, _ in records.draws for spec in specs}
    slots = frozenset(substituted)  # what a replay's mapping replaces: the same set for every realize
    kept: list[CapturedProgram] = []
    written: set[BufferSpec] = set()
    accessed: set[BufferSpec] = set()
    for rec in records:
        tasks = [_own_variables(t) for t in rec.graph.tasks]
        written.update(a.buffer for t in tasks for a in t.accesses if a.mode == "w")
        accessed.update(a.buffer for t in tasks for a in t.accesses)
        kept.append(CapturedProgram(tasks, slots, keep_runners=True, assigned=tuple(rec.assigned)))
    var_vals = [t.work.var_vals for r in kept for t in r.tasks if getattr(t.work, "var_vals", None)]
    return CallProgram(kept, inputs, fresh, results, result_shape, frozenset(written),
                    sum(len(r.tasks) for r in kept), frozenset(accessed), program_key(records, inputs),
                    list(records.draws), var_vals=var_vals)


__all__ = ["CallProgram", "program_of_call", "run_records"]
