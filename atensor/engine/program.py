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
  (`registry.REGISTRY.epoch`), in the layout the native programs want (`_producer_layout`);
- a template's program makes its runners per submission from the works with the mapped buffers
  (its slots are placeholders, not buffers, so nothing can be bound ahead), and its one plan is never
  lowered again: no kept runner can be stale.

A hot template (an eager graph realized `HOT_HITS` times with one structure: a loop's) gets a *twin*,
a kept-runner program of the same tasks, so its later hits cost what a jit replay does (`for_fill`):
- at the `HOT_HITS`-th hit, its CPU kernels are compiled to C in the background (backend/c/registry.py; with
  ATENSOR_NATIVE=0 or no compiler, never), whatever follows: the template's own program makes its
  runners per hit, so its later hits run them compiled (a training step too heavy for a twin too);
- a twin follows only when every task is a kernel or copy on a CPU device without Variables and the
  plan is light (layout.py); otherwise the template keeps its runners-per-submission program;
- once they are all compiled, the twin is made: the template's tasks with a placeholder buffer of
  its own in each slot (allocated once: at most layout.py's INLINE_MAX_BYTES for a light plan, so it
  keeps no buffer of any realize alive), lowered with kept runners; a hit maps each placeholder to
  its own buffer;
- a hit submits the twin only when every queue is idle, no profile is taken and DEBUG < 2: then, from
  its third submission on, its plan's `ReplayRecord` (engine/replay.py) binds and runs it in one
  foreign call. Otherwise the hit submits the template's own program, one command per task, as
  before. A light twin whose plan does not get a record (several queues, a runner not one-thread
  native) is dropped and the template's program kept;
- a light plan of kernels on ONE OpenCL device gets a twin too (no compiler needed: its kernels are
  built as the plan is lowered), whose plan takes the lean CL replay (engine/cl_replay.py): one command
  of the device's queue per hit, its runners kept, their argument lists pointed at the hit's buffers;
  a twin whose plan gets neither a record nor a lean replay is dropped;
- a plan too heavy for a record (a training step: matmuls past layout.py's flops bound) still gets a
  twin when its placeholders hold at most HEAVY_TWIN_MAX_BYTES (`twin_heavy`): every hit submits it,
  idle queues or not, and `Plan.submit` points its kept runners at the hit's buffers (engine/patching.py,
  as a jit replay does; fresh runners while the previous submission still runs) and may run each
  queue's kernels as one native program. The last hit's buffers stay bound (alive) until the next
  hit, as a jit program's last call's do (engine/patching.py). Measured on the flagship's eager step
  (18 tasks, 3 alternating rounds of 60 steps at load 6.5, best blocks of 10): the dispatcher's CPU
  per step 1.46-1.51 ms without the twin, 0.82-1.44 with it; the process's 9.5-9.9 ms, 7.4-9.1.
What the hit commits (versions, realized values) is the realize's own (engine/realize.py), whichever
program runs it; native kernels cannot fail, and a failed input is refused before anything runs.
Measured on the loaded 2-core machine (`x = x + 1; await x.realize()` on 16 elements, main thread CPU
per round trip, 6 alternating rounds of 2000): 265 us median against 315 before; in
bench/round_trip_breakdown.py, Plan.submit of a hit 37 us against 98-102 (runners made per hit).
Why the twin stays a program of its own (it is the eager path's fast case: the same entry,
`for_fill` then `submit`, and the same commit), measured again on the same loop (3 alternating
rounds of 500 in fresh processes, load ~10, AMD EPYC Zen 4, 2 cores): at 4715a1c, 92-104 us of the
calling thread's CPU per round trip with it, 126-142 us with HOT_HITS out of reach (runners made per
hit); on one CL device (pocl), with its lean replay, 148-160 us against 199-228 without the twin.

Invariant: a program's plans are lowered and submitted by the dispatching thread only (the dispatcher,
or a caller planning inline while it holds it, engine/dispatch.py), so `plans` and the twin's state
need no lock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Optional, Sequence

from atensor.config import current_settings, settings
from atensor.backend.c import compiler, programs, registry
from atensor.graph.node import BufferSpec
from atensor.graph.taskgraph import Access, Copy, Kernel, Task
from atensor.engine.lower import fill_slots
from atensor.engine.plan import Plan
from atensor.engine.submission import Submission
from atensor.hcq.device import Device, all_idle
from atensor.profiler import collector
from atensor.sched.cache import Template

# a template hit this many times is a loop's: its kernels are compiled to C in the background and its
# later hits replay a kept-runner twin (module docstring); fewer hits are not worth a compiler call
HOT_HITS = 8
# the most placeholder memory a twin of a plan too heavy for a record may hold (one per hot template):
# the flagship's eager training step needs about 2 MiB
HEAVY_TWIN_MAX_BYTES = 16 << 20


def _producer_layout() -> bool:
    """Whether kept-runner programs use the producer layout now: native programs can run and no
    profile is taken (a profile shows each copy on the queue the scheduler chose)."""
    return programs.programs_available() and not collector.is_active()


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
    _current: tuple = (-1, False, None)  # (registry.REGISTRY.epoch, profiling, the plan `plan()` gave for them)
    # a template's program only: the hits so far, the twin's state ("cold", "compiling", "ready" or
    # "off"), the kernels it waits for, and the twin with its placeholders (in `slot_fill`'s order)
    hits: int = 0
    twin_state: str = "cold"
    twin_kernels: list = field(default_factory=list)
    twin: Optional[CapturedProgram] = None
    twin_heavy: bool = False  # the twin is of a plan too heavy for a record (module docstring)
    placeholders: list[BufferSpec] = field(default_factory=list)
    eager: Any = None  # its twin's EagerReplay (engine/eager_replay.py), made by engine/realize.py

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
        if self._current[:2] == (registry.REGISTRY.epoch, collector.is_active()):
            return True
        plan = self.plans.get(self._layout())
        return plan is not None and (not self.keep_runners or plan.epoch == registry.REGISTRY.epoch)

    def plan(self) -> Plan:
        """The plan to submit with now: lowered on first use, and for kept runners again once newer
        kernels are compiled, in the layout `_producer_layout` picks. Each layout keeps its own. The
        one found last is kept with what picked it (the kernels' epoch, whether a profile is taken:
        a library loaded, which makes native programs available, is a new epoch), so a replay asks
        two questions, not six."""
        current = self._current
        state = (registry.REGISTRY.epoch, collector.is_active())
        if current[:2] == state:
            return current[2]
        layout = self._layout()
        plan = self.plans.get(layout)
        if plan is None or (self.keep_runners and plan.epoch != registry.REGISTRY.epoch):
            plan = self.plans[layout] = Plan(self.tasks, self.slots, copies_on_producer=layout,
                                             keep_runners=self.keep_runners)
        self._current = (*state, plan)
        return plan

    def submit(self, mapping: dict[Any, BufferSpec]) -> Submission:
        """Puts the tasks on their queues with `mapping` (slot -> this submission's buffer, for every
        slot); returns what to await."""
        return self.plan().submit(mapping)

    def mapping_of_fill(self, fill: Sequence[BufferSpec]) -> dict[Any, BufferSpec]:
        """For a template's program: the mapping that puts `fill` (`Template.fill`'s list) in the slots."""
        return {ref: fill[index] for ref, index in self.slot_fill}

    def for_fill(self, fill: Sequence[BufferSpec]) -> tuple[CapturedProgram, dict[Any, BufferSpec]]:
        """For a template's program, on a hit whose buffers are `fill`: the program to submit and its
        mapping: the twin (module docstring) when it is ready and may run its record now, else this
        program. Counts the hit and moves the twin's state on."""
        twin = self.twin
        if twin is not None and not collector.is_active() and current_settings().debug < 2:
            if self.twin_heavy:  # kept runners, pointed at this hit's buffers (no record: any time)
                return twin, dict(zip(self.placeholders, [fill[index] for _, index in self.slot_fill]))
            if all_idle():
                plan = twin.plan()
                if plan.record is not False or plan.lean is not None:  # a record, or the lean CL replay
                    return twin, dict(zip(self.placeholders, [fill[index] for _, index in self.slot_fill]))
                self.twin, self.twin_state = None, "off"  # no fast case for it: the template's program stays
        elif self.twin_state != "ready" and self.twin_state != "off":
            self._warm(fill)
        return self, self.mapping_of_fill(fill)

    def _warm(self, fill: Sequence[BufferSpec]) -> None:
        """One more hit of a template's program before its twin is ready (module docstring)."""
        if self.twin_state == "cold":
            self.hits += 1
            if self.hits < HOT_HITS:
                return
            self._compile_hot_kernels()
            if not self._twin_may_run(fill):
                self.twin_state = "off"
                return
            # the CPU kernels it waits for (an OpenCL plan's kernels are built as it is lowered)
            self.twin_kernels = [task.work.ast for task in self.tasks if isinstance(task.work, Kernel)
                                 and Device.get(task.work.device).kind == "CPU"]
            self.twin_state = "compiling"
        # compiling: a kernel the compiler refuses stays None here, and the template keeps its
        # program (a dictionary lookup per kernel and hit is all that costs); while they compile, a
        # hit gives the compile thread its turn at the GIL (a tight loop of hits starved it)
        if all(registry.lookup(ast) is not None for ast in self.twin_kernels):
            self._make_twin(fill)
        else:
            registry.give_turn()

    def _compile_hot_kernels(self) -> None:
        """Hands the hot template's CPU kernels not compiled yet to the background compiler, whether
        or not a twin will follow: its per-hit runners (engine/lower.py `runner_for`) take a compiled
        kernel as soon as it is there. Without it, a hot graph too heavy for a twin (the flagship's
        eager training step: 18 kernels, matmuls over the layout's flops bound) ran numpy kernels
        forever: 66 ms a step against 13 with C kernels (bench/train_step.py's eager row)."""
        if settings.native == "0" or compiler.path() is None:
            return
        missing = [(task.work.ast, task.work.name) for task in self.tasks
                   if isinstance(task.work, Kernel) and registry.lookup(task.work.ast) is None
                   and Device.get(task.work.device).kind == "CPU"]
        if missing:
            registry.prepare_in_background(missing)

    def _twin_may_run(self, fill: Sequence[BufferSpec]) -> bool:
        """Whether a twin may be made: kernels and copies on CPU devices, no Variables, native kernels
        allowed and a compiler present, and a light plan (its twin replays by record) or placeholders
        of at most HEAVY_TWIN_MAX_BYTES (`twin_heavy`: its twin keeps its runners only); or a light
        plan of kernels on one OpenCL device (its twin replays by the lean CL replay)."""
        layout = self.plan().layout
        if self._on_one_cl_device():
            self.twin_heavy = False
            return layout.light
        if settings.native == "0" or compiler.path() is None:
            return False
        heavy = not layout.light
        if heavy and sum(fill[index].nbytes for _, index in self.slot_fill) > HEAVY_TWIN_MAX_BYTES:
            return False
        for task in self.tasks:
            work = task.work  # (an allreduce's steps are Copy and Kernel subclasses)
            if isinstance(work, Copy):
                devices = (work.src.device, work.dst.device)
            elif isinstance(work, Kernel) and not work.var_vals:
                devices = (work.device,)
            else:
                return False
            if any(Device.get(device).kind != "CPU" for device in devices):
                return False
        self.twin_heavy = heavy
        return True

    def _on_one_cl_device(self) -> bool:
        """Whether every task is a kernel without Variables on one OpenCL device (a plan the lean CL
        replay may take: engine/cl_replay.py)."""
        devices = set()
        for task in self.tasks:
            work = task.work
            if type(work) is not Kernel or work.var_vals:
                return False
            devices.add(work.device)
        return len(devices) == 1 and Device.get(devices.pop()).cl is not None

    def _make_twin(self, fill: Sequence[BufferSpec]) -> None:
        """The twin: this program's tasks with a placeholder buffer (shaped like `fill`'s) in each
        slot, with kept runners."""
        placeholder = {ref: BufferSpec(fill[index].device, fill[index].size, fill[index].dtype)
                       for ref, index in self.slot_fill}
        get = placeholder.__getitem__
        tasks = [Task(task.id, fill_slots(task.work, get),
                      tuple([Access(get(a.buffer), a.mode, a.start, a.end) for a in task.accesses]),
                      set(task.deps)) for task in self.tasks]
        self.placeholders = list(placeholder.values())
        self.twin = CapturedProgram(tasks, frozenset(self.placeholders), keep_runners=True)
        self.twin_state = "ready"

    def written(self, mapping: dict[Any, BufferSpec]) -> list[BufferSpec]:
        """The buffers a submission with `mapping` writes."""
        layout = self.plan().layout
        get, buffers = mapping.get, layout.buffers
        return [get(buffers[bi], buffers[bi]) for bi in layout.written_index]


__all__ = ["CapturedProgram"]
