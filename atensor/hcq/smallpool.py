"""Recycled memory of small CPU buffers: a result buffer of a jit replay or an eager cache hit is
handed the memory of a dead buffer of the same size and dtype instead of fresh memory.

Why: every replayed jit call and every eager cache hit makes fresh result buffers (a result must not
share memory with a tensor the caller still holds). For a 16-element result, fresh memory cost ~5 us
of the ~12 us a fresh buffer took (bench/jit_replay_breakdown.py "allocate the result's memory"): the
numpy array and its typed view, then its address read through `__array_interface__` (a dict made per
read), where the kernel it feeds runs in a microsecond. A dead buffer's memory already has both: the
pool keeps each memory as one `Entry` made once (key, typed view, address) and hands the same tuple
out again, so a recycled buffer costs a list pop and two slot stores.

Why not hcq/device.py's size pool: that one keeps raw bytes of large buffers (>= POOL_MIN_BYTES) to
save page faults, evicting stale sizes by time; small buffers fault nothing, and what they cost is the
Python around the memory, so this pool keeps the typed view and address and has no clock.

Invariant (where the reuse is safe): memory comes back here only from `Buffer.spec_died`, run when the
storage ledger drops the spec's record (atensor/ledger/), i.e. when nothing refers to the spec any
more: no tensor or node (each BUFFER node holds its spec), no ledger version or pending head (a head is
an ASSIGN node into the spec), no task and no queued or running command (commands keep their specs
alive until they have run). So no one can still read or write the memory when it is handed out again;
tests/hcq/test_smallpool.py checks that a live result's memory is never handed out twice. Memory
handed to the user is always a copy (`Tensor.numpy`), never a view of this memory.

Bounded: at most KEEP_BYTES are kept over all sizes; memory given back beyond that is freed.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional, Protocol

import numpy as np

from atensor.profiler import collector
from atensor.profiler.events import MemoryEvent

# (key, typed view, address of its first byte); the key is (nbytes, numpy dtype). Made once per memory
Entry = tuple[tuple[int, Any], np.ndarray, int]


class Accounts(Protocol):
    """What keeps a device's memory figures (hcq/device.py `Device`): the bytes its live buffers hold,
    their peak, and the lock that guards both."""
    name: str
    bytes_in_use: int
    peak_bytes: int
    _mem_lock: threading.Lock


class SmallPool:
    """Per (nbytes, dtype), the dead small buffers' memory, newest last. One per CPU device.

    With an `owner` (its device), memory handed out counts in the owner's `bytes_in_use` until it comes
    back, and the pool's lists are guarded by the owner's `_mem_lock`: a fresh result's memory and its
    count are one locked step (measured: a separate device lock and pool lock cost ~0.3 us a call of a
    one-kernel jit replay, its result's take and the previous result's give)."""
    MAX_NBYTES = 1 << 16       # sizes below this are pooled here (hcq/device.py pools the larger ones)
    KEEP_BYTES = 16 << 20      # at most this much memory kept, over all sizes
    __slots__ = ("_free", "kept_bytes", "keep_bytes", "_lock", "owner")

    def __init__(self, keep_bytes: int = KEEP_BYTES, owner: Optional[Accounts] = None) -> None:
        self.keep_bytes = keep_bytes  # the bound on `kept_bytes`
        self._free: dict[tuple[int, Any], list[Entry]] = {}
        self.kept_bytes = 0  # invariant: the nbytes of every entry in `_free`, at most keep_bytes
        self.owner = owner
        # `give` runs on whatever thread drops a spec's last reference
        self._lock = owner._mem_lock if owner is not None else threading.Lock()

    def take(self, nbytes: int, dtype: Any) -> Entry:
        """Memory for `nbytes` bytes of numpy `dtype`: a dead buffer's if one is kept, else fresh; counted
        in the owner's `bytes_in_use` (and its peak) until it is given back."""
        key = (nbytes, dtype)
        free = self._free.get(key)
        owner = self.owner
        entry = None
        with self._lock:
            if free:
                self.kept_bytes -= nbytes
                entry = free.pop()
            if owner is not None:
                owner.bytes_in_use = in_use = owner.bytes_in_use + nbytes
                if in_use > owner.peak_bytes:
                    owner.peak_bytes = in_use
        if owner is not None and collector._active:
            collector.record_memory(MemoryEvent(owner.name, time.perf_counter_ns(), in_use))
        if entry is not None:
            return entry
        view = np.empty(nbytes, dtype=np.uint8).view(dtype)
        return (key, view, view.__array_interface__["data"][0])

    def give(self, entry: Entry) -> None:
        """Keeps `entry` for the next `take` of its size and dtype (call only once nothing can read it:
        see the module docstring), uncounted from the owner's `bytes_in_use`; frees it when `keep_bytes`
        are kept already."""
        nbytes = entry[0][0]
        owner = self.owner
        with self._lock:
            if owner is not None:
                owner.bytes_in_use = in_use = owner.bytes_in_use - nbytes
            if self.kept_bytes + nbytes <= self.keep_bytes:
                self.kept_bytes += nbytes
                free = self._free.get(entry[0])
                if free is None:
                    free = self._free[entry[0]] = []
                free.append(entry)
        if owner is not None and collector._active:
            collector.record_memory(MemoryEvent(owner.name, time.perf_counter_ns(), in_use))

    def clear(self) -> None:
        """Frees every kept memory."""
        with self._lock:
            for free in self._free.values():  # emptied in place: a `take` that looked one up meanwhile
                free.clear()                  # finds it empty under the lock and makes fresh memory
            self._free.clear()
            self.kept_bytes = 0

    def statistics(self) -> dict[str, int]:
        """How many memories and bytes are kept, for debugging."""
        with self._lock:
            return {"entries": sum(map(len, self._free.values())), "kept_bytes": self.kept_bytes}


__all__ = ["Accounts", "Entry", "SmallPool"]
