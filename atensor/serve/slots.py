"""The KV-cache slots of a server, and what each free slot still holds (the prefix cache).

Why keep finished slots' cells: a chat resends its system prompt and history with every turn, and
requests of one application share long instructions. A slot whose request finished still holds the keys
and values of its prompt and generated tokens; a new request whose prompt starts with those tokens is
given that slot and prefilled only from where they differ (`LlamaEngine.prefill(slot, ids, start)`).

Which free slot a request gets: the one holding the longest prefix of its prompt, when that prefix is
at least `min_reuse` tokens (below that, a cold prefill batched with the other admitted requests is the
better deal), otherwise the least recently used free slot, so the slots most likely to be hit again
(the newest) are overwritten last. The cached prefix is capped at len(prompt) - 1: the prefill must
compute at least the last prompt token, whose logits give the first generated token.

Invariant: a slot is either in use or free; a free slot's `held` tokens are exactly those whose cells
[0, len(held)) were written by its last request (prompt, then every token fed to a decode step).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

MIN_REUSE = 16  # tokens a cached prefix must have to be used


@dataclass(frozen=True)
class Lease:
    """A slot given to a request: `reused` prompt tokens are already in its cells."""
    slot: int
    reused: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotCache:
    """Free and used KV-cache slots with the tokens each free slot's cells hold (see the module doc).

        cache = SlotCache(16)
        lease = cache.acquire(ids, fits=engine.extend_fits)  # Lease(slot, reused)
        ...
        cache.release(lease.slot, ids + fed_tokens)
    """

    def __init__(self, slots: int, min_reuse: int = MIN_REUSE, enabled: bool = True):
        self.slots = slots
        self.min_reuse = max(1, min_reuse)
        self.enabled = enabled
        self.free: OrderedDict[int, list[int]] = OrderedDict((s, []) for s in range(slots))  # LRU first
        self.hits = 0
        self.hit_tokens = 0

    @property
    def in_use(self) -> int:
        return self.slots - len(self.free)

    def acquire(self, ids: Sequence[int], fits: Callable[[int, int], bool] = lambda start, n: True) -> Lease:
        """A free slot for a prompt `ids`: the one with the longest usable cached prefix, else the least
        recently used. `fits(start, len(ids))` says whether a prefill from `start` is possible."""
        if not self.free:
            raise RuntimeError("no free slot: acquire only while SlotCache.free is not empty")
        best, reused = next(iter(self.free)), 0
        if self.enabled:
            for slot, held in self.free.items():
                shared = min(common_prefix(held, ids), len(ids) - 1)
                if shared > reused and shared >= self.min_reuse and fits(shared, len(ids)):
                    best, reused = slot, shared
        del self.free[best]
        if reused:
            self.hits += 1
            self.hit_tokens += reused
        return Lease(best, reused)

    def scratch(self, count: int) -> list[int]:
        """`count` free slots for work that writes cells of its own (a warm-up step), those holding the
        fewest cached tokens first (empty ones, then the least recently used): the slots whose prefixes
        it would cost least to lose. They stay free; the caller says what was written (`overwritten`)."""
        if count > len(self.free):
            raise RuntimeError(f"{count} scratch slots asked for, {len(self.free)} free: ask only for free ones")
        order = {slot: i for i, slot in enumerate(self.free)}
        return sorted(self.free, key=lambda slot: (len(self.free[slot]), order[slot]))[:count]

    def overwritten(self, slot: int, first_cell: int) -> None:
        """A free slot's cells from `first_cell` on were written by something else than its last request:
        it keeps at most the tokens of cells [0, first_cell) (the invariant above)."""
        if slot not in self.free:
            raise ValueError(f"slot {slot} is in use: only a free slot's cells may be overwritten")
        del self.free[slot][first_cell:]

    def release(self, slot: int, held: Sequence[int]) -> None:
        """Frees `slot`, whose cells [0, len(held)) hold `held` (empty: nothing reusable); it becomes the
        most recently used free slot."""
        if slot in self.free or not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not in use")
        self.free[slot] = list(held) if self.enabled else []
