"""A device buffer: memory plus the work still pending on it.

Every buffer remembers, per queue signal, the newest value of a command that writes it and of one
that reads it. A later realize orders itself after that work by waiting on those values: reads wait
for pending writes (read after write), writes wait for pending reads and writes (write after read,
write after write). Entries whose value is reached are dropped, so the state stays as small as the
number of queues.

A buffer that every replay of a jit plan touches follows the plan's `Clock` instead of being told
each replay's values: its pending work also includes the clock's newest submission, not reached yet.

Invariant: `writes[sig]` and `reads[sig]` only grow for a given signal (a queue's values increase),
and are updated only by the plan (engine/plan.py), on the dispatching thread.
"""
from __future__ import annotations

import operator
import sys
import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np

from atensor import ledger
from atensor.graph.node import BufferSpec
from atensor.hcq.signal import Signal


_NOTHING: tuple[list, list] = ([], [])
_failure_of = operator.attrgetter("failure")
_writes_of = operator.attrgetter("writes")
# guards every Buffer's `inflight` count (one lock for all: a realize that holds 400 buffers takes it
# once, not once per buffer; the counts are only ever changed by `InFlight`, never read under a lock)
_inflight_lock = threading.Lock()


class Clock:
    """The values of a replay plan's newest submission: per queue its signal, the value its tasks
    count from and the value it ends at. A buffer the plan touches on every replay follows the clock
    once (`Buffer.follow`) instead of being told new values on every replay (engine/plan.py)."""
    __slots__ = ("signals", "state", "owner")

    def __init__(self, signals: list[Signal], owner: object):
        self.signals = signals
        self.state: Optional[tuple[list[int], list[int]]] = None  # (bases, ends) of the newest submission
        self.owner = weakref.ref(owner)  # the plan: once it is gone, no submission will come

    def advance(self, bases: list[int], ends: list[int]) -> None:
        """A new submission: its bases and ends (one assignment, so readers see one or the other)."""
        self.state = (bases, ends)

    def pending(self, entries: tuple[tuple[int, int], ...]) -> list[tuple[Signal, int]]:
        """The (signal, value) of `entries` ((queue, offset from the base) each) not reached yet."""
        state = self.state
        if state is None:
            return []
        bases, signals = state[0], self.signals
        found = []
        for qi, offset in entries:
            value = bases[qi] + offset
            if signals[qi].value < value:
                found.append((signals[qi], value))
        return found

    def finished(self) -> bool:
        """True when no work of the plan is pending and none will come: a buffer may forget it."""
        state = self.state
        return self.owner() is None and (state is None or
                                         all(s.value >= end for s, end in zip(self.signals, state[1])))


class Buffer:
    """The runtime side of a `BufferSpec`: memory (allocated on first use) and pending work."""
    __slots__ = ("uid", "size", "device", "memory", "writes", "reads", "clocks", "inflight", "failure", "_lock",
                 "_address", "release", "__weakref__")

    def __init__(self, spec: BufferSpec):
        # the spec's ledger record owns this Buffer (ledger.runtime(spec)); a reference back would make
        # a cycle that only the cyclic collector frees, so the Buffer keeps the spec's description only
        self.uid, self.size, self.device = spec.uid, spec.size, spec.device
        self.memory: Any = None
        self.writes: dict[Signal, int] = {}
        self.reads: dict[Signal, int] = {}
        # the replay plans this buffer follows: (clock, its writes, its reads), (queue, offset) each
        self.clocks: tuple[tuple[Clock, tuple, tuple], ...] = ()
        self.inflight = 0  # realizes dispatched that will write this buffer but are not yet planned
        self.failure: Optional[BaseException] = None  # the error of the write its contents came from
        self._lock = threading.Lock()
        self._address = 0
        # (fn, arg): what gives the memory back to its device (Device.allocate sets it), called by
        # `spec_died` when the storage ledger drops the spec's record: exactly when the spec dies, as a
        # weakref.finalize on the spec would, without making one per buffer (3 us each)
        self.release: Optional[tuple[Callable[[Any], None], Any]] = None

    def spec_died(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        """The spec died (atensor/ledger/ calls it from the spec's weak reference): no node, task or
        command refers to this memory any more, so it goes back to its device."""
        release = self.release
        if release is not None and not _finalizing():  # at exit the process gives everything back
            self.release = None
            release[0](release[1])

    @property
    def name(self) -> str:
        """The spec's name, `buf<uid>@<device>[<size>]` (made when asked: buffers are made per task)."""
        return f"buf{self.uid}@{self.device}[{self.size}]"

    def __repr__(self) -> str:
        return f"Buffer({self.name}, writes={self.writes}, reads={self.reads})"

    # `Buffer.of(spec)`: the Buffer of `spec`, made on first use and kept by the storage ledger for as
    # long as the spec lives (set below the class: `ledger.attach_runtime` with `make=Buffer`, one call)
    of: Callable[[BufferSpec], Buffer]

    def pending_writes(self) -> list[tuple[Signal, int]]:
        found: list[tuple[Signal, int]] = []
        if self.writes:
            with self._lock:
                for s, v in self.writes.items():
                    if s.reached(v) and s.failure(v) is not None:
                        self.failure = s.failure(v)
                self.writes = {s: v for s, v in self.writes.items() if not s.reached(v)}
                found = list(self.writes.items())
        for clock, writes, _ in self.clocks:
            found += clock.pending(writes)
        return found

    def pending_reads(self) -> list[tuple[Signal, int]]:
        found: list[tuple[Signal, int]] = []
        if self.reads:
            with self._lock:
                self.reads = {s: v for s, v in self.reads.items() if not s.reached(v)}
                found = list(self.reads.items())
        for clock, _, reads in self.clocks:
            found += clock.pending(reads)
        return found

    def pending(self) -> tuple[list[tuple[Signal, int]], list[tuple[Signal, int]]]:
        """(pending_writes(), pending_reads()) in one pass: what a plan snapshots per buffer."""
        if not self.writes and not self.reads and not self.clocks:
            return _NOTHING
        return self.pending_writes(), self.pending_reads()

    def follow(self, clock: Clock, writes: tuple[tuple[int, int], ...], reads: tuple[tuple[int, int], ...]) -> None:
        """From now on this buffer's pending work includes the `writes` and `reads` ((queue, offset)
        each) of the newest submission of `clock`'s plan. Clocks of plans that are gone and done
        are forgotten here."""
        with self._lock:
            self.clocks = tuple(c for c in self.clocks if not c[0].finished()) + ((clock, writes, reads),)

    def overwritten(self) -> None:
        """A write that cannot fail (a native program's, told through a clock) is submitted: the
        errors of earlier writes no longer describe the contents."""
        self.failure = None
        if self.writes:
            with self._lock:
                self.writes = {s: v for s, v in self.writes.items() if not s.reached(v)}

    @staticmethod
    def all_overwritten(buffers: list[Buffer]) -> None:
        """`overwritten()` of each of `buffers`, called only on those with something to forget: the
        scan is two C-level passes (a replay of a 100-kernel chain writes 100 buffers, each with
        nothing to forget, on every replay)."""
        if any(map(_failure_of, buffers)) or any(map(_writes_of, buffers)):
            for buf in buffers:
                if buf.failure is not None or buf.writes:
                    buf.overwritten()

    def note(self, signal: Signal, value: int, write: bool) -> None:
        with self._lock:
            table = self.writes if write else self.reads
            if write:
                self.failure = None
            if table.get(signal, 0) < value:
                table[signal] = value

    def note_all(self, notes: list[tuple[Signal, int, bool]]) -> None:
        """`note` of each (signal, value, write), under one acquisition of the lock."""
        with self._lock:
            writes, reads = self.writes, self.reads
            for signal, value, write in notes:
                if write:
                    self.failure = None
                    if writes.get(signal, 0) < value:
                        writes[signal] = value
                elif reads.get(signal, 0) < value:
                    reads[signal] = value

    def hold(self, delta: int) -> None:
        """Counts realizes that will write this buffer: +1 when one is dispatched (or planned), -1 once
        its writes are noted. Under `_inflight_lock`: the trio thread and the dispatcher both change it.
        Called only through `InFlight`, which pairs every +1 with its -1."""
        with _inflight_lock:
            self.inflight += delta

    def ready(self) -> bool:
        """True when no dispatched work will still write this buffer."""
        return self.inflight == 0 and not self.pending_writes()

    def write_failure(self) -> Optional[BaseException]:
        """The error of a failed write that this buffer's current contents came from, if any."""
        if not self.writes:
            return self.failure
        for signal, value in list(self.writes.items()):
            err = signal.failure(value)
            if err is not None:
                return err
        return self.failure

    def address(self) -> int:
        """The address of the memory's first element (what a native kernel is passed); the memory of a
        buffer never moves once allocated, so it is read once."""
        address = self._address
        if not address:
            address = self._address = self.memory.__array_interface__["data"][0]
        return address

    def numpy(self) -> np.ndarray:
        """The memory as a flat numpy array: a CPU device's memory itself, a copy of an OpenCL device's
        (read when called: call it once the buffer's writers are done)."""
        memory = self.memory
        if memory is None:
            raise RuntimeError(f"{self.name} holds no data yet")
        if type(memory) is not np.ndarray and hasattr(memory, "read"):  # hcq/cl_runtime.CLMemory
            return memory.read()
        return memory


def _buffer_of(spec: BufferSpec, record_of: Callable[[int], Any] = ledger.record_of,
               attach: Callable[..., Any] = ledger.attach_runtime) -> Buffer:
    """`Buffer.of`: one Python call when the spec has its Buffer already (every task of every plan
    looks its buffers up), else `ledger.attach_runtime`, which makes it once."""
    record = record_of(spec.uid)
    if record is not None:
        found = record.runtime
        if found is not None:
            return found
    return attach(spec, Buffer)


Buffer.of = staticmethod(_buffer_of)  # type: ignore[assignment]


class InFlight:
    """The buffers a dispatched realize will write, each counted in flight (`Buffer.hold`) until its
    writes are noted, so a sync accessor never reads one between the realize's commit and its
    submission. The one owner of those counts: `hold` adds one, `release` gives every one back, once
    (a job releases when it is planned, engine/dispatch.py; `with InFlight() as held:` releases on
    leaving the block)."""
    __slots__ = ("buffers",)

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []

    def hold(self, buf: Buffer) -> None:
        buf.hold(1)
        self.buffers.append(buf)

    def hold_all(self, buffers: list[Buffer]) -> None:
        """`hold` of each of `buffers`, under one acquisition of the lock: a jit replay handed to the
        dispatcher holds every buffer it writes (an LLM decode step: ~430 of them, once per step)."""
        with _inflight_lock:
            for buf in buffers:
                buf.inflight += 1
        self.buffers.extend(buffers)

    def release(self) -> None:
        held, self.buffers = self.buffers, []
        if held:
            with _inflight_lock:
                for buf in held:
                    buf.inflight -= 1

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
