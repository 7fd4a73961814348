"""A queue's doorbell: its worker waits for work in C, and starts a native program without the GIL.

Why: a worker that waits on a Python condition must take the GIL to leave the wait and reach its
native program's foreign call; the event loop's thread holds the GIL until it parks, so every
replay's kernels started only once the host had finished its bookkeeping and gone to sleep
(measured: 150-250 us after the submission). A GPU queue is rung instead: the host writes the
command into memory the queue reads and rings a doorbell. Here the memory is a ring in C
(backend/c/prelude.py): `post` counts each command list the host hands over and, for a list that is one
native program, stores the program's arguments; the worker's `next` sleeps on a futex until a list
is posted, runs a stored program at once, stamps it, and only then returns to Python.

The Python deque of the queue still holds every list in order; the ring only says, for each, whether
it already ran. The ring also counts the lists the worker is done with, so the host can see that a
program it posted has finished without waiting for the worker to take the GIL and publish it
(`finished`): an awaiting task then publishes the value itself (`Queue.poll`) instead of parking
until a wake-up that follows the worker's Python. A program that finds the ring full (more than 62 lists outstanding) runs from Python
as before. Linux only (futex); elsewhere queues wait on their condition.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

from atensor.backend.c import programs


def available() -> bool:
    """Whether a native library with the doorbell functions is loaded (Linux)."""
    return programs.RUNTIME.doorbell is not None


class Doorbell:
    """The ring of one queue; `post` from the submitting thread, `next` from the queue's worker."""

    def __init__(self) -> None:
        size, self._post, self._next, self._done = programs.RUNTIME.doorbell  # type: ignore[misc]
        self.ring = (ctypes.c_uint8 * size)()  # zeroed: nothing posted, nothing taken
        self.stamps = (ctypes.c_uint64 * 2)()
        self.ran = 0  # programs started from the ring, counted by the queue (tests and statistics)
        self.posted = 0  # lists posted so far (only the submitting thread posts)

    def post(self, program: Optional[tuple[Any, ...]]) -> int:
        """Counts one command list; `program` is the `ring_args` of a list that is one native program
        without waits (programs.Program.bind), None for any other list. Returns the list's number (from
        1) when the ring holds its program (`finished` can tell when it ran), else 0."""
        self.posted += 1
        if program is None:
            self._post(self.ring, -1, None, None, None, None, None)
            return 0
        return self.posted if self._post(self.ring, *program) else 0

    def finished(self, number: int) -> bool:
        """True once the worker is done with list `number` (what `post` returned) and every list before
        it: for a program the ring held, its kernels have run and their writes are visible here."""
        return bool(self._done(self.ring, number))

    def next(self) -> Optional[tuple[int, int]]:
        """Blocks (the GIL released) until the next list is posted; runs it when it is a program in the
        ring and returns its (start, end) stamps on the perf_counter clock, else None."""
        if self._next(self.ring, self.stamps):  # `ran` is counted by the queue (Queue._count_ring_program)
            return self.stamps[0], self.stamps[1]
        return None
