"""`CapturedProgram`: a scheduled graph whose slot buffers are replaced on every submission.

Why one type: a schedule-cache hit (an eager realize shaped like an earlier one) and a jit replay do
the same thing: they run tasks that were scheduled once, with some of their buffers replaced by the
call's own. The cache's template names every buffer by a slot (sched/cache.py `Slot`: the graph's
leaves and temporaries); the jit names the buffers a replay replaces by the captured call's own (its
inputs, its results' fresh buffers, its random draws' counter buffers), and keeps the others (the
parameters, the optimizer's state). Both are a `CapturedProgram`: its `tasks`, the `slots` a
submission's mapping fills, and what lowering made of them (`plans`, one `Plan` per layout). Both
submit through `submit(mapping)`, which goes through `Plan.submit`, the one place commands reach the
queues.

What differs is a lowering choice, recorded in `keep_runners`:
- a jit program keeps its runners: each submission rebinds the slots' addresses in the kept native
  argument blocks (engine/patching.py), and its plans are lowered again when newer kernels are compiled
  (`native.epoch`), in the layout the native programs want (`_producer_layout`);
- a template's program makes its runners per submission from the works with the mapped buffers
  (its slots are placeholders, not buffers, so nothing can be bound ahead), and its one plan is never
  lowered again: no kept runner can be stale.

Invariant: a program's plans are lowered and submitted by the dispatching thread only (the dispatcher,
or a caller planning inline while it holds it, engine/dispatch.py), so `plans` needs no lock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

from atensor.backend import native
from atensor.graph.node import BufferSpec
from atensor.graph.taskgraph import Task
from atensor.engine.plan import Plan, Submission
from atensor.profiler import collector
from atensor.sched.cache import Template


def _producer_layout() -> bool:
    """Whether kept-runner programs use the producer layout now: native programs can run and no
    profile is taken (a profile shows each copy on the queue the scheduler chose)."""
    return native.programs_available() and not collector.is_active()


@dataclass(eq=False)
class CapturedProgram:
    """Tasks scheduled once, submitted again with the buffers in `slots` replaced; see the module
    docstring. `assigned` are the buffers whose versions each submission advances (a jit replay writes
    the ledger itself; an eager realize's commit does). `slot_fill`, for a program made from a
    schedule-cache template: each slot and its place in `Template.fill`."""
    tasks: list[Task]
    slots: frozenset[Hashable]
    keep_runners: bool
    assigned: tuple[BufferSpec, ...] = ()
    slot_fill: list[tuple[Hashable, int]] = field(default_factory=list)
    plans: dict[bool, Plan] = field(default_factory=dict)  # per layout: True for the producer layout

    @staticmethod
    def of_template(template: Template) -> CapturedProgram:
        """The program of a schedule-cache template: every buffer is a slot, runners are made per
        submission."""
        tasks = template.slot_tasks()
        seen: dict[Hashable, int] = {}
        for task in tasks:
            for acc in task.accesses:
                seen.setdefault(acc.buffer, template.slot_index(acc.buffer))
            for ref in getattr(task.work, "buffers", ()):  # one without an access (size 0) is a slot too
                seen.setdefault(ref, template.slot_index(ref))
        return CapturedProgram(tasks, frozenset(seen), keep_runners=False, slot_fill=list(seen.items()))

    def _layout(self) -> bool:
        return self.keep_runners and _producer_layout()

    def lowered(self) -> bool:
        """True when `plan()` has its plan already (nothing to lower)."""
        plan = self.plans.get(self._layout())
        return plan is not None and (not self.keep_runners or plan.epoch == native.epoch)

    def plan(self) -> Plan:
        """The plan to submit with now: lowered on first use, and for kept runners again once newer
        kernels are compiled, in the layout `_producer_layout` picks. Each layout keeps its own."""
        layout = self._layout()
        plan = self.plans.get(layout)
        if plan is None or (self.keep_runners and plan.epoch != native.epoch):
            plan = self.plans[layout] = Plan(self.tasks, self.slots, copies_on_producer=layout,
                                             keep_runners=self.keep_runners)
        return plan

    def submit(self, mapping: dict[Any, BufferSpec]) -> Submission:
        """Puts the tasks on their queues with `mapping` (slot -> this submission's buffer, for every
        slot); returns what to await."""
        return self.plan().submit(mapping)

    def mapping_of_fill(self, fill: Sequence[BufferSpec]) -> dict[Any, BufferSpec]:
        """For a template's program: the mapping that puts `fill` (`Template.fill`'s list) in the slots."""
        return {ref: fill[index] for ref, index in self.slot_fill}

    def written(self, mapping: dict[Any, BufferSpec]) -> list[BufferSpec]:
        """The buffers a submission with `mapping` writes."""
        plan = self.plan()
        return [mapping.get(spec, spec) for spec in (plan.layout.buffers[bi] for bi in plan.layout.written_index)]


__all__ = ["CapturedProgram"]
