"""The C of a replay submitted in one foreign call (engine/replay.py builds its records).

Why C: a jit replay of a tiny program on an idle queue used to cost ~150 Python calls inside
`Plan.submit` (runners, Command objects, the queue's execute/finish), against a few microseconds of
kernels. The parts that are the same on every replay are fixed once, in a record of machine words;
the one call `at_replay(record)` then writes the replay's buffer addresses into the kept argument
blocks (engine/patching.py's slots) and runs the queue's native program (the kernel library's
`atensor_run_program`, backend/c/prelude.py) on the calling thread, with the GIL released (a CDLL call),
and stamps it. Python keeps what must change per call: the fresh result buffers (their memory comes
from the device's allocator), the reserved signal value, publishing it.

Why a helper compiled at first use (library.load_helper) and not a CPython extension: the kernels and
the program runner are already loaded through ctypes, the helper is 40 lines that need no Python API,
and a ctypes call of one pointer argument costs ~1 us (measured with bench/jit_replay.py), a small
part of what is left (see the module docstring of engine/replay.py). Without a compiler it does not
load and `Plan.submit` keeps its Python path, with the same semantics.

The record (uint64 words; RECORD_WORDS of them), written by Python once except `addresses`:
  [0] slot count S            [1] -> slots: S triples (word address, address index, byte offset)
  [2] -> addresses (uint64, one per swapped buffer, written by Python before each call)
  [3] the program runner      [4] op count  [5] -> ops  [6] -> fns  [7] -> blocks
  [8] -> bases                [9] -> timelines
  [10], [11] the run's start and end stamps (CLOCK_MONOTONIC ns: Python's perf_counter clock on Linux)

Invariant: the caller holds every block, op and buffer the record points into alive, and calls it only
while no command that runs those blocks is in flight (the plan checks the queues are idle).
"""
from __future__ import annotations

import ctypes
import subprocess
import threading
from typing import Optional

from atensor.backend.c import library, programs

RECORD_WORDS = 12

SOURCE = r"""
/* atensor replay helper: see atensor/backend/c/replay.py for the record's layout and invariants */
#define _POSIX_C_SOURCE 199309L  /* clock_gettime under -std=c11 */
#include <stdint.h>
#include <time.h>

typedef void (*at_program_fn)(long long, int64_t *, void **, void **, const uint64_t *, void *);

static inline uint64_t at_replay_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* binds the swapped buffers' addresses into the kept blocks, then runs the program and stamps it */
void at_replay(uint64_t *rec) {
  long long nslots = (long long)rec[0];
  const int64_t *slots = (const int64_t *)(uintptr_t)rec[1];
  const uint64_t *addresses = (const uint64_t *)(uintptr_t)rec[2];
  for (long long i = 0; i < nslots; i++) {
    const int64_t *s = slots + 3 * i;
    *(uint64_t *)(uintptr_t)s[0] = addresses[s[1]] + (uint64_t)s[2];
  }
  at_program_fn run = (at_program_fn)(uintptr_t)rec[3];
  rec[10] = at_replay_now();
  run((long long)rec[4], (int64_t *)(uintptr_t)rec[5], (void **)(uintptr_t)rec[6],
      (void **)(uintptr_t)rec[7], (const uint64_t *)(uintptr_t)rec[8], (void *)(uintptr_t)rec[9]);
  rec[11] = at_replay_now();
}

/* only the binding (a replay whose program a queue's worker runs) */
void at_replay_bind(uint64_t *rec) {
  long long nslots = (long long)rec[0];
  const int64_t *slots = (const int64_t *)(uintptr_t)rec[1];
  const uint64_t *addresses = (const uint64_t *)(uintptr_t)rec[2];
  for (long long i = 0; i < nslots; i++) {
    const int64_t *s = slots + 3 * i;
    *(uint64_t *)(uintptr_t)s[0] = addresses[s[1]] + (uint64_t)s[2];
  }
}
"""

failure: Optional[str] = None  # why the helper did not load, if it did not
_replay: Optional[ctypes._CFuncPtr] = None
_lock = threading.Lock()


def replay_function() -> Optional[ctypes._CFuncPtr]:
    """`at_replay(record)`, compiled on first use (once per machine, library.load_helper); None when it
    cannot be compiled (`failure` says why) or no kernel library is loaded yet (the program runner it
    calls lives there): replays then take the Python path."""
    global _replay, failure
    if _replay is None and failure is None and programs.program_runner_address():
        with _lock:
            if _replay is None and failure is None:
                try:
                    lib = library.load_helper("atensor-replay", SOURCE)
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                    return None
                fn = lib.at_replay
                fn.argtypes, fn.restype = [ctypes.c_void_p], None
                _replay = fn  # the library stays loaded: the function holds it
    return _replay


__all__ = ["RECORD_WORDS", "SOURCE", "failure", "replay_function"]
