"""Pointing a plan's kept native and device runners at new buffers by rewriting slots in place.

Why: between two replays of a jit program only its inputs and results change buffers. A native
runner's argument block holds buffer addresses, and its `Runner.args` says whose address sits in
each slot. The plan finds once, for each buffer a replay swaps, every (block, index, offset) where
that buffer's address sits, and each replay stores the new addresses there: a few ctypes stores per
swapped buffer, whatever the number of tasks that use it. A device runner (OpenCL) has a list of
memories, `Runner.device_args`, in the same role: its slots are (list, index) and take the new
buffer's memory (a CLMemory), which the runner's next enqueue passes to its kernel. This is the only
way a runner is rebound (a runner without slots, a numpy kernel, is made again from its work with
the new buffers).

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

    def __init__(self, swapped: Sequence[BufferSpec], slots: list[list[tuple[Any, int, int]]],
                 device_slots: Optional[list[list[tuple[list, int]]]] = None):
        self.devices = [Device.get(spec.device) for spec in swapped]
        self.slots = slots
        # per swapped buffer: (a device runner's `device_args`, index) where its memory sits
        self.device_slots = device_slots if device_slots is not None else [[] for _ in swapped]
        self.bound: list[BufferSpec] = []  # what the blocks point into now: kept alive until the next bind

    @classmethod
    def find(cls, runners: Sequence[Optional[Runner]], swapped: Sequence[BufferSpec],
             patchable: Sequence[bool]) -> AddressSlots:
        """The slots of `swapped` in the `patchable` runners (native or device ones, made from the
        captured works, so their `args` name captured buffers)."""
        index = {spec: j for j, spec in enumerate(swapped)}
        slots: list[list[tuple[Any, int, int]]] = [[] for _ in swapped]
        device_slots: list[list[tuple[list, int]]] = [[] for _ in swapped]
        for run, ok in zip(runners, patchable):
            if not ok:
                continue
            if run.native is None:  # a device runner: its memories' list (offsets are 0 there)
                for k, (spec, _) in enumerate(run.args):
                    j = index.get(spec)
                    if j is not None:
                        device_slots[j].append((run.device_args, k))
                # what its list holds is this object's `bound` now, the rest the plan's (its temporaries
                # are in the list itself)
                run.keep_alive = ()
                continue
            block = run.native[1]
            for k, (spec, offset) in enumerate(run.args):
                j = index.get(spec)
                if j is not None:
                    slots[j].append((block, k, offset))
            run.keep_alive = ()  # the buffers its block points into are this object's `bound` now
        return cls(swapped, slots, device_slots)

    def bind(self, specs: list[BufferSpec]) -> None:
        """Points every slot at the buffer that replaces its captured one (`specs`, in `swapped`'s
        order), allocating the memory of new result buffers. A buffer that is the one bound there
        already (an eager heavy replay's kept temporaries, engine/eager_replay.py) is skipped: its
        slots hold its address still (a record or lean replay that wrote other addresses empties `bound`)."""
        bound = self.bound if len(self.bound) == len(specs) else [None] * len(specs)
        for spec, before, device, places, device_places in zip(specs, bound, self.devices, self.slots,
                                                               self.device_slots):
            if spec is before or not places and not device_places:  # (no runner holds it: a numpy
                continue                                              # kernel's, a NULL device's)
            buf = ledger.runtime(spec)
            if buf is None or buf.memory is None:
                buf = device.allocate(spec)
            if device_places:
                memory = buf.memory
                for args, k in device_places:
                    args[k] = memory
                continue
            address = buf.address()
            for block, k, offset in places:
                block[k] = address + offset
        self.bound = specs
