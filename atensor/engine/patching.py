"""Rebinding a replay plan's native runners to new buffers by rewriting address slots in place.

Why: between two replays of a jit program only its inputs and results change buffers. A native
runner's argument block holds buffer addresses; rebinding it through a remapped work (executor.py's
`rebind(work)`) first remaps every such task's work in Python, then looks up each of its buffers.
Instead, the plan finds once, for each buffer a replay swaps, every (block, index, offset) where that
buffer's address sits, and each replay stores the new addresses there: a few ctypes stores per
swapped buffer, whatever the number of tasks that use it.

Invariant: the slots are only written while no command that uses their blocks is running (the plan
checks that its last submission is done), and the buffers written into them are kept alive by the
`AddressSlots` until the next `bind`.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from atensor.graph.node import BufferSpec
from atensor.graph.taskgraph import Copy, Kernel, Task
from atensor.hcq.device import Device


class AddressSlots:
    """Where the addresses of `swapped` (captured buffer specs, in a fixed order) sit in the argument
    blocks of a plan's native runners; `bind(specs)` writes the addresses of their replacements."""

    def __init__(self, swapped: Sequence[BufferSpec], slots: list[list[tuple[Any, int, int]]]):
        self.devices = [Device.get(spec.device) for spec in swapped]
        self.slots = slots
        self.bound: list[BufferSpec] = []  # what the blocks point into now: kept alive until the next bind

    @classmethod
    def find(cls, tasks: Sequence[Task], runners: Sequence[Any], swapped: Sequence[BufferSpec],
             touched: Sequence[bool]) -> Optional[AddressSlots]:
        """The slots of `swapped` in the runners of the `touched` tasks, or None when one of those
        runners has no native argument block (a numpy kernel: it must be rebuilt per replay)."""
        index = {spec: j for j, spec in enumerate(swapped)}
        slots: list[list[tuple[Any, int, int]]] = [[] for _ in swapped]
        for task, run, is_touched in zip(tasks, runners, touched):
            if not is_touched:
                continue
            native = getattr(run, "native", None)
            if native is None:
                return None
            block, work = native[1], task.work
            if isinstance(work, Kernel):
                for k, spec in enumerate(work.buffers):
                    j = index.get(spec)
                    if j is not None:
                        slots[j].append((block, k, 0))
            elif isinstance(work, Copy):
                for k, spec, offset in ((0, work.dst, work.dst_offset), (1, work.src, work.src_offset)):
                    j = index.get(spec)
                    if j is not None:
                        slots[j].append((block, k, offset))
            else:
                return None
            run.keep_alive = ()  # the buffers its block points into are this object's `bound` now
        return cls(swapped, slots)

    def bind(self, specs: list[BufferSpec]) -> None:
        """Points every slot at the buffer that replaces its captured one (`specs`, in `swapped`'s
        order), allocating the memory of new result buffers."""
        for spec, device, places in zip(specs, self.devices, self.slots):
            buf = spec.runtime
            if buf is None or buf.memory is None:
                buf = device.allocate(spec)
            address = buf.address()
            for block, k, offset in places:
                block[k] = address + offset
        self.bound = specs
