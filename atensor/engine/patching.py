"""Pointing a plan's kept native runners at new buffers by rewriting address slots in place.

Why: between two replays of a jit program only its inputs and results change buffers. A native
runner's argument block holds buffer addresses, and its `Runner.args` says whose address sits in
each slot. The plan finds once, for each buffer a replay swaps, every (block, index, offset) where
that buffer's address sits, and each replay stores the new addresses there: a few ctypes stores per
swapped buffer, whatever the number of tasks that use it. This is the only way a runner is rebound
(a runner without slots, a numpy kernel, is made again from its work with the new buffers).

Invariant: the slots are only written while no command that uses their blocks is running (the plan
checks that its last submission is done), and the buffers written into them are kept alive by the
`AddressSlots` until the next `bind` (the runners found here keep nothing alive themselves).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from atensor.backend.runner import Runner
from atensor import ledger
from atensor.graph.node import BufferSpec
from atensor.hcq.device import Device


class AddressSlots:
    """Where the addresses of `swapped` (captured buffer specs, in a fixed order) sit in the argument
    blocks of a plan's native runners; `bind(specs)` writes the addresses of their replacements."""

    def __init__(self, swapped: Sequence[BufferSpec], slots: list[list[tuple[Any, int, int]]]):
        self.devices = [Device.get(spec.device) for spec in swapped]
        self.slots = slots
        self.bound: list[BufferSpec] = []  # what the blocks point into now: kept alive until the next bind

    @classmethod
    def find(cls, runners: Sequence[Optional[Runner]], swapped: Sequence[BufferSpec],
             patchable: Sequence[bool]) -> AddressSlots:
        """The slots of `swapped` in the `patchable` runners (native ones, made from the captured
        works, so their `args` name captured buffers)."""
        index = {spec: j for j, spec in enumerate(swapped)}
        slots: list[list[tuple[Any, int, int]]] = [[] for _ in swapped]
        for run, ok in zip(runners, patchable):
            if not ok:
                continue
            block = run.native[1]
            for k, (spec, offset) in enumerate(run.args):
                j = index.get(spec)
                if j is not None:
                    slots[j].append((block, k, offset))
            run.keep_alive = ()  # the buffers its block points into are this object's `bound` now
        return cls(swapped, slots)

    def bind(self, specs: list[BufferSpec]) -> None:
        """Points every slot at the buffer that replaces its captured one (`specs`, in `swapped`'s
        order), allocating the memory of new result buffers."""
        for spec, device, places in zip(specs, self.devices, self.slots):
            if not places:  # no native runner holds its address (a numpy kernel's, a NULL device's)
                continue
            buf = ledger.runtime(spec)
            if buf is None or buf.memory is None:
                buf = device.allocate(spec)
            address = buf.address()
            for block, k, offset in places:
                block[k] = address + offset
        self.bound = specs
