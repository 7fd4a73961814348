"""`ReplayRecord`: a kept-runner plan's light replay on one idle queue, submitted in one foreign call.

Why: the general `Plan.submit` makes runners, Command objects and per-buffer notes on every replay,
about 150 Python calls for a one-kernel jit replay whose kernel runs in a microsecond. For the common
case (one queue, every task a native kernel or copy of one BLAS thread, a light program: the bytes
and flops bounds of layout.py's INLINE_MAX_*, at most RECORD_MAX_TASKS tasks) everything but the buffers is the same on every replay, so the plan builds
this record once and a replay is:

1. the swapped buffers' addresses (fresh result buffers get memory from their device here: `command`),
2. the queue's next value reserved (by the plan, the one module that hands commands to queues),
3. the record's one command run on this thread (`Queue.run_here`): its runner is ONE call,
   `at_replay(record)` (backend/c/replay.py): the addresses are written into the kept argument blocks
   and the queue's native program runs with the GIL released; the buffers it wrote are told that they
   were overwritten, and the queue publishes the value with its stamps, as for any command.

The await then finds the replay done and returns without a wake-up (engine/handle.py).

What it keeps from the Python path (tests/engine/test_replay_record.py checks each against it):
- the queue's order: used only when every queue is idle (`all_idle`), so nothing runs before it;
- failures: a task reading a buffer whose contents come from a failed task is refused before
  anything runs (the plan's read-first check runs first); native kernels cannot fail;
- the slots' addresses: written before every run; as the program has run when `run` returns, the
  record keeps none of the buffers it bound alive (patching.py's `AddressSlots` does, for a run that
  goes on after the submission);
- counters (GlobalCounters) and the queue's `commands_run` count one command, as a batch's;
- a profile, DEBUG=2 echo, Variables, numpy kernels or kernels of more BLAS threads, a collective:
  not this record; `Plan.submit` takes its Python path for those.

Invariant: `command` and its run are called by the dispatching thread only (`Plan.run_record`), while
every queue is idle; the arrays the record points into live as long as the record (it holds them).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional, Sequence

from atensor import ledger
from atensor.backend.gemm import blas
from atensor.backend.c import programs
from atensor.backend.c import replay as replay_c
from atensor.backend.runner import Runner
from atensor.engine.patching import AddressSlots
from atensor.graph.node import BufferSpec
from atensor.hcq.buffer import Buffer
from atensor.hcq.device import Device
from atensor.hcq.queue import Command, Queue

# the most tasks of a replay run on the calling thread by one record: its bytes and flops are bounded
# (layout.py's `light`), so what the count adds is the calls themselves, ~50 ns a kernel in C; a 100-kernel
# chain of 16 elements runs in ~10 us here against a hand-off to the queue's worker and a wake-up back
RECORD_MAX_TASKS = 256

class ReplayRecord:
    """The fixed part of one queue's replay (see the module docstring): the program of `runs` (its
    native runners, in task order) and the slots of the swapped buffers in their blocks."""

    def __init__(self, call: Callable[[int], None], queue: Queue, runs: Sequence[Runner],
                 slots: Optional[AddressSlots], swapped: Sequence[BufferSpec], written: Sequence[Buffer],
                 written_swapped: Sequence[int], summary: tuple[str, int, int],
                 reads: Sequence[tuple[Buffer | int, str]] = ()):
        self.call, self.queue = call, queue
        self.signal = queue.signal
        self.count = len(runs)
        self.program = programs.Program([(programs.RUN, 0, 0, 0)] * len(runs), list(runs))
        places = slots.slots if slots is not None else [[] for _ in swapped]
        triples = [(ctypes.addressof(block) + 8 * k, j, offset)
                   for j, entries in enumerate(places) for block, k, offset in entries]
        self.slot_words = (ctypes.c_int64 * max(1, 3 * len(triples)))(*[x for t in triples for x in t])
        self.addresses = (ctypes.c_uint64 * max(1, len(swapped)))()
        self.bases = (ctypes.c_uint64 * 1)()
        self.slots = slots
        # (index, device) of each swapped buffer a native block holds: the ones whose memory it needs
        self.bound = [(j, Device.get(spec.device)) for j, (spec, entries) in enumerate(zip(swapped, places))
                      if entries]
        record = self.record = (ctypes.c_uint64 * replay_c.RECORD_WORDS)()
        program = self.program
        record[0], record[1] = len(triples), ctypes.addressof(self.slot_words)
        record[2], record[3] = ctypes.addressof(self.addresses), programs.program_runner_address()
        record[4], record[5] = program.count, ctypes.addressof(program.ops)
        record[6], record[7] = ctypes.addressof(program.fns), ctypes.addressof(program.blocks)
        record[8], record[9] = ctypes.addressof(self.bases), ctypes.addressof(programs.TIMELINES.values)
        self.address = ctypes.addressof(record)
        self.written = list(written)                  # fixed buffers the replay writes
        self.written_swapped = list(written_swapped)  # places in `swapped` of those it writes
        # ... as places in `self.bound` (where `run` has their Buffers already), or None when some
        # written swapped buffer is in no block (then `run` looks it up)
        in_bound = {j: k for k, (j, _) in enumerate(self.bound)}
        self.written_places: Optional[list[int]] = (
            [in_bound[j] for j in self.written_swapped] if self.written_swapped and
            all(j in in_bound for j in self.written_swapped) else None)
        self.name, self.nbytes, self.flops = summary
        # the buffers read before the program writes them, with the task that reads each: a fixed
        # Buffer, or the place in `swapped` of a swapped one (Plan.submit refuses a failed one's read)
        self.reads_fixed = [(buf, name) for buf, name in reads if not isinstance(buf, int)]
        self.reads_swapped = [(j, name) for j, name in reads if isinstance(j, int)]
        # the one command every replay runs (its value set per replay by `command`): one foreign call
        # with the GIL released, so the queue runs it without numpy's error state
        self._command = Command(0, (), Runner(self._run, gil_free=True), self.name, "kernel", 0, self.nbytes,
                                self.flops, (), self.count)
        self._bound: Sequence[Buffer] = ()
        self._specs: Sequence[BufferSpec] = ()

    def reads_of(self, new_specs: list[BufferSpec]) -> list[tuple[Buffer, str]]:
        """The buffers the replay with `new_specs` reads before writing them, each with its reader."""
        if not self.reads_swapped:
            return self.reads_fixed
        of = Buffer.of
        return self.reads_fixed + [(of(new_specs[j]), name) for j, name in self.reads_swapped]

    def command(self, base: int, new_specs: list[BufferSpec]) -> Command:
        """Binds `new_specs` (the swapped buffers' replacements) and returns the record's one command,
        its value the last of the block reserved from `base`, to run on this thread at once
        (`Queue.run_here`): one command object, reused by every replay."""
        addresses = self.addresses
        record_of = ledger.record_of
        bound = []  # the Buffers of `self.bound`, in its order
        for j, device in self.bound:
            spec = new_specs[j]
            record = record_of(spec.uid)
            buf = None if record is None else record.runtime
            if buf is None or buf.memory is None:
                buf = device.allocate(spec)
            addresses[j] = buf._address or buf.address()
            bound.append(buf)
        self._bound, self._specs = bound, new_specs
        command = self._command
        command.value = base + self.count
        return command

    def _run(self) -> None:
        """The command's work: the one foreign call, then the written buffers told they were overwritten."""
        blas.use(1)  # the program runs one-thread kernels only (the C runner sets the count to 1 too)
        self.call(self.address)
        if self.slots is not None:  # the program has run: nothing reads the blocks before the next
            self.slots.bound = []      # bind, so the plan keeps no realize's buffers alive (an eager
            # hit's outputs go with their tensors; the addresses left in the blocks are never used)
        bound, new_specs = self._bound, self._specs
        self._bound = self._specs = ()
        if self.written:
            Buffer.all_overwritten(self.written)
        if self.written_places is not None:  # every written swapped buffer was bound above
            for k in self.written_places:  # (a fresh result's has nothing to forget: no call for it)
                buf = bound[k]
                if buf.failure is not None or buf.writes:
                    buf.overwritten()
        elif self.written_swapped:
            of = Buffer.of
            Buffer.all_overwritten([of(new_specs[j]) for j in self.written_swapped])


def record_for(queue: Queue, runs: Sequence[Optional[Runner]], slots: Optional[AddressSlots],
               swapped: Sequence[BufferSpec], written: Sequence[Buffer], written_swapped: Sequence[int],
               summary: tuple[str, int, int], reads: Sequence[tuple[Buffer | int, str]] = ()
               ) -> Optional[ReplayRecord]:
    """The record of a one-queue plan whose `runs` are all native one-thread runners that start on no
    other thread, or None when some is not (or the helper did not load): that plan keeps the Python
    path."""
    if not runs or any(r is None or r.native is None or r.threads != 1 or r.choice is not None
                       or r.here is not None or r.rebind is not None for r in runs):
        return None
    call = replay_c.replay_function()
    if call is None:
        return None
    return ReplayRecord(call, queue, runs, slots, swapped, written, written_swapped, summary, reads)


__all__ = ["RECORD_MAX_TASKS", "ReplayRecord", "record_for"]
