"""A net command as one foreign call: MPI_Iallreduce and its wait, in C, without the GIL.

Why C and not mpi4py's calls from the net queue's Python worker: a polling wait written in Python
holds the GIL between its MPI_Test calls, so the host thread (planning the next step, waking the
awaiting task) queues for the GIL behind it, and every yield between tests is a `time.sleep(0)` of
at least the kernel's timer slack (~55 us). Measured on the 2-core machine, an awaited jitted 4 KiB
allreduce over 2 ranks spent ~650 us in such a net command whose collective takes ~8 us, and
the host's own syscalls (epoll, eventfd) waited ~100-300 us each for the GIL. A net runner that is
one C call (`Runner.native`) also lets a jit replay put the net queue's commands in a native
program like any kernel queue's (engine/plan.py): the net command waits on the producers' C
timelines and publishes its own, so a replayed step has no Python on its communication path.

How it reaches MPI without MPI's headers: mpi4py has loaded the MPI library; this module finds it
in the process's maps, takes the addresses of MPI_Iallreduce, MPI_Test and MPI_Abort, and passes the
handles mpi4py gives (`MPI._handleof`) as pointer-sized integers (an int handle of MPICH's ABI, or a
pointer of Open MPI's, is passed in the same register by the x86-64 and AArch64 calling conventions).
The two constants that differ between those ABIs (MPI_IN_PLACE and the size of a request) are
chosen by the MPI's family; an MPI of another family gets no native runner (the Python one runs).

The wait, in C (`atensor_net_allreduce`): MPI_Test in a tight loop for `spin_ns` (a small
collective finishes in it at MPI's own latency), then MPI_Test with a sched_yield between tests
(the core goes to any thread that can run on it, else the loop keeps testing at once) until
`yield_ns`, then with a sleep between tests (10 us, doubling up to 50 us, at a timer slack of 1 us:
a peer that is late by more than that, still computing or hung, costs no core). `Wait.blocking`
(`net_wait="block"`) calls MPI's blocking MPI_Allreduce instead (MPI's own wait; no timeout). Past
`timeout_ns` (0: never) it gives up: the Python call raises the caller's error; a native program's
call (`..._or_abort`) prints the same message and aborts the job (a program has nowhere to raise
to, and a rank that stopped leaves every other one waiting anyway), once the message has left the
process's stderr pipe (`drain_stderr` in processes.py says why).

Started on the caller's thread (`Runner.here`): a jit replay whose only task is the net command
starts the collective on the thread that submits it and tests it there (tight, then yielding, never
napping); so does a replay of native programs whose queue starts with a net command that waits for
nothing (the first of several allreduces), once every list is submitted. A short one alone
(`atensor_net_start`, for at most `here_ns`) is not submitted at all unless it is still in flight
then: done there, the command is published there, with no hand-off to the net queue's worker and no
wake-up of the awaiting task (each 50-300 us on a busy 2-core machine, more than a 1 MiB
collective's own time). A long one (`Wait.here_rings_first`) is submitted first. Either
way, once submitted, the caller goes on testing it (`atensor_net_share`) until the worker, woken by
the submission, takes it over (`at_take`), so the collective progresses while the worker wakes
instead of waiting for it (MPI progresses a collective only inside its calls on that rank): the
worker's wake-up leaves the critical path. The hand-over: before the submission the caller sets
SHARED; the worker sets TAKE and waits until SHARED is clear; the caller looks at TAKE before each
MPI_Test and clears SHARED as it leaves (taken, done, failed, or `here_ns` passed), so only one
thread at a time tests a request. Done or failed on the caller's thread after the submission, STATE
says so (2, 3) and the worker only publishes it. A blocking wait (`Wait.blocking`) alone and short is
MPI's blocking MPI_Allreduce on the caller's thread, as mpi4py's `Allreduce` calls it (MPI's own wait,
no bound: the caller chose it); a long one, or one leading several, is the worker's call.

Invariants: the argument block's slots 0 and 1 hold the send and receive addresses (`Runner.args`,
so a replay rewrites them in place, engine/patching.py); every other slot is fixed when the runner
is made, except STATE, START_NS, REQUEST, SHARED and TAKE, which only the threads running the
command touch, one at a time (the hand-over above). A block is used by one command at a time (a
queue runs its commands in order; a start on the caller's thread happens only while the queue is
idle, and the worker takes it over before it publishes it).
"""
from __future__ import annotations

import collections
import ctypes
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from atensor.backend.c import library
from atensor.backend.runner import Runner

# the argument block: one 64-bit slot each
(SEND, RECV, COUNT, DTYPE, OP, COMM, IALLREDUCE, TEST, ABORT, WORLD, IN_PLACE, FLAGS, SPIN_NS, YIELD_NS,
 TIMEOUT_NS, SCALE, KIND, TIMEOUT_MESSAGE, ERROR_MESSAGE, ERROR_CODE, NAP_NS, NAP_MAX_NS, ALLREDUCE, STATE,
 START_NS, HERE_NS, REQUEST, SHARED, TAKE, STATUS) = range(30)
SLOTS = STATUS + 8  # MPI_Status: 20 bytes in MPICH's ABI, 24 in Open MPI's
FLAG_IN_PLACE, FLAG_BLOCK = 1, 2
KIND_NONE, KIND_F32, KIND_F64 = 0, 1, 2

_SOURCE = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <sched.h>
#include <sys/ioctl.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
typedef int (*iallreduce_t)(const void *, void *, int, intptr_t, intptr_t, intptr_t, void *);
typedef int (*allreduce_t)(const void *, void *, int, intptr_t, intptr_t, intptr_t);
typedef int (*test_t)(void *, int *, void *);
typedef int (*abort_t)(intptr_t, int);
enum { SEND, RECV, COUNT, DTYPE, OP, COMM, IALLREDUCE, TEST, ABORT, WORLD, IN_PLACE, FLAGS, SPIN_NS,
       YIELD_NS, TIMEOUT_NS, SCALE, KIND, TIMEOUT_MESSAGE, ERROR_MESSAGE, ERROR_CODE, NAP_NS, NAP_MAX_NS,
       ALLREDUCE, STATE, START_NS, HERE_NS, REQUEST, SHARED, TAKE, STATUS };
/* b[STATE]: 0 not started; 1 in flight; 2 done (and scaled) on the caller's thread after its command
   was submitted; 3 failed there (b[ERROR_CODE]) */
static uint64_t at_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
/* the wait for the collective b[REQUEST] started at b[START_NS]; `here_until` (0: none) is where a
   wait on the caller's thread stops. 0: done; 1: timed out; 2: MPI returned an error (its code in
   b[ERROR_CODE]); 3: still in flight at `here_until` (b[STATE] stays 1: the next call goes on with it) */
static int at_wait(uint64_t *b, uint64_t here_until) {
  test_t test = (test_t)(uintptr_t)b[TEST];
  uint64_t start = b[START_NS], spin_until = start + b[SPIN_NS], yield_until = start + b[YIELD_NS];
  uint64_t timeout = b[TIMEOUT_NS], nap = b[NAP_NS];
  int rc;
  for (;;) {
    int done = 0;
    rc = test(&b[REQUEST], &done, &b[STATUS]);
    if (rc) { b[STATE] = 0; b[ERROR_CODE] = (uint64_t)rc; return 2; }
    if (done) break;
    uint64_t now = at_now_ns();
    if (timeout && now - start > timeout) { b[STATE] = 0; return 1; }
    if (here_until && now >= here_until) return 3;
    if (now < spin_until) continue;
    if (here_until || now < yield_until) { sched_yield(); continue; }  /* no naps on the caller's thread */
#ifdef __linux__
    static _Thread_local int slack_set = 0;  /* naps of a few us need a timer slack below the 50 us default */
    if (!slack_set) { prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); slack_set = 1; }
#endif
    struct timespec t = {0, (long)nap};
    nanosleep(&t, NULL);
    if (nap < b[NAP_MAX_NS]) nap *= 2;
  }
  b[STATE] = 0;
  return 0;
}
static int at_start(uint64_t *b) {
  const void *send = (b[FLAGS] & 1) ? (const void *)(uintptr_t)b[IN_PLACE] : (const void *)(uintptr_t)b[SEND];
  b[REQUEST] = 0;
  int rc = ((iallreduce_t)(uintptr_t)b[IALLREDUCE])(send, (void *)(uintptr_t)b[RECV], (int)b[COUNT],
                                                    (intptr_t)b[DTYPE], (intptr_t)b[OP], (intptr_t)b[COMM],
                                                    &b[REQUEST]);
  if (rc) { b[ERROR_CODE] = (uint64_t)rc; return 2; }
  b[START_NS] = at_now_ns();
  b[STATE] = 1;
  return 0;
}
/* the mean's scaling of the result */
static void at_scale(uint64_t *b) {
  void *recv = (void *)(uintptr_t)b[RECV];
  long long count = (long long)b[COUNT];
  if (b[KIND] == 1) {
    union { uint64_t u; double d; } s = { b[SCALE] };
    float f = (float)s.d, *x = (float *)recv;
    for (long long i = 0; i < count; i++) x[i] *= f;
  } else if (b[KIND] == 2) {
    union { uint64_t u; double d; } s = { b[SCALE] };
    double *x = (double *)recv;
    for (long long i = 0; i < count; i++) x[i] *= s.d;
  }
}
/* the caller's thread may still be testing this command's collective (atensor_net_share, b[SHARED]
   set before the command was submitted): ask it to leave (b[TAKE]) and wait until it has; it looks
   before each MPI_Test, so it is at most one test away. From then on only this thread touches b. */
static void at_take(uint64_t *b) {
  if (!__atomic_load_n(&b[SHARED], __ATOMIC_SEQ_CST)) return;
  __atomic_store_n(&b[TAKE], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&b[SHARED], __ATOMIC_SEQ_CST)) sched_yield();
  __atomic_store_n(&b[TAKE], 0, __ATOMIC_SEQ_CST);
}
/* 0: done; 1: timed out; 2: MPI returned an error (its code in b[ERROR_CODE]). A collective that
   the caller's thread started (b[STATE] 1) is waited for, not started again; one it finished or saw
   fail there after the submission (2, 3) only reports that. */
int atensor_net_allreduce(uint64_t *b) {
  int rc;
  if (b[FLAGS] & 2) {  /* MPI's own blocking collective (its own wait; no timeout) */
    const void *send = (b[FLAGS] & 1) ? (const void *)(uintptr_t)b[IN_PLACE] : (const void *)(uintptr_t)b[SEND];
    rc = ((allreduce_t)(uintptr_t)b[ALLREDUCE])(send, (void *)(uintptr_t)b[RECV], (int)b[COUNT],
                                                (intptr_t)b[DTYPE], (intptr_t)b[OP], (intptr_t)b[COMM]);
    if (rc) { b[ERROR_CODE] = (uint64_t)rc; return 2; }
    at_scale(b);
    return 0;
  }
  at_take(b);
  if (b[STATE] == 2) { b[STATE] = 0; return 0; }
  if (b[STATE] == 3) { b[STATE] = 0; return 2; }
  if (b[STATE] == 0 && (rc = at_start(b))) return rc;
  if ((rc = at_wait(b, 0))) return rc;
  at_scale(b);
  return 0;
}
/* on the caller's thread, before its command is submitted: starts the collective and tests it (tight,
   then with sched_yield) for at most b[HERE_NS]; 0: done; 3: in flight (b[STATE] 1); 1, 2: as there */
int atensor_net_start(uint64_t *b) {
  int rc = at_start(b);
  if (rc) return rc;
  if ((rc = at_wait(b, b[START_NS] + b[HERE_NS]))) return rc;
  at_scale(b);
  return 0;
}
/* on the caller's thread, once its command is submitted (b[SHARED] was set to 1 before): starts the
   collective unless it is started (b[STATE] 1) or the worker has asked for it already, and tests it
   until the worker asks for it (b[TAKE]), it completes (b[STATE] 2: scaled; the worker only publishes
   it), MPI fails (3), or b[HERE_NS] has passed since this call. Clears b[SHARED] as it leaves, and
   never touches b after that. 0: completed here; 2: failed here; 3: taken over by the worker; 4: left
   in flight at the bound (the worker goes on with it when it comes). */
int atensor_net_share(uint64_t *b) {
  test_t test = (test_t)(uintptr_t)b[TEST];
  uint64_t until = at_now_ns() + b[HERE_NS];
  int rc = 3;
  if (b[STATE] == 0) {
    if (__atomic_load_n(&b[TAKE], __ATOMIC_SEQ_CST)) goto leave;
    if (at_start(b)) { b[STATE] = 3; rc = 2; goto leave; }
  }
  uint64_t spin_until = b[START_NS] + b[SPIN_NS];
  for (;;) {
    if (__atomic_load_n(&b[TAKE], __ATOMIC_SEQ_CST)) break;
    int done = 0, err = test(&b[REQUEST], &done, &b[STATUS]);
    if (err) { b[ERROR_CODE] = (uint64_t)err; b[STATE] = 3; rc = 2; break; }
    if (done) { at_scale(b); b[STATE] = 2; rc = 0; break; }
    uint64_t now = at_now_ns();
    if (now >= until) { rc = 4; break; }
    if (now >= spin_until) sched_yield();
  }
leave:
  __atomic_store_n(&b[SHARED], 0, __ATOMIC_SEQ_CST);
  return rc;
}
/* MPICH's mpiexec exits as soon as an abort reaches it, and what a rank wrote to stderr just before,
   still unread in the pipe to its proxy, is lost (the job ended with an empty stderr): wait, at most
   2 s, until the reader has taken all of it (FIONREAD: the bytes not yet read from the pipe) */
static void at_drain_stderr(void) {
#ifdef FIONREAD
  struct timespec t = {0, 1000000};
  for (int i = 0; i < 2000; i++) {
    int unread = 0;
    if (ioctl(2, FIONREAD, &unread) != 0 || unread <= 0) return;
    nanosleep(&t, NULL);
  }
#endif
}
/* what a native program runs: a failure ends the job, with the message of the failure */
void atensor_net_allreduce_or_abort(uint64_t *b) {
  int rc = atensor_net_allreduce(b);
  if (!rc) return;
  if (rc == 1) fprintf(stderr, "%s\n", (const char *)(uintptr_t)b[TIMEOUT_MESSAGE]);
  else fprintf(stderr, "%s (MPI error code %llu)\n", (const char *)(uintptr_t)b[ERROR_MESSAGE],
               (unsigned long long)b[ERROR_CODE]);
  fflush(stderr);
  at_drain_stderr();
  ((abort_t)(uintptr_t)b[ABORT])((intptr_t)b[WORLD], 1);
}
"""

_lock = threading.Lock()
# (the Python entry, the program entry's address, the entries that start and share a collective on the
# caller's thread)
_library: Optional[tuple[ctypes._CFuncPtr, int, ctypes._CFuncPtr, ctypes._CFuncPtr]] = None
_tried = False
why_not = ""  # why there is no native net runner, when there is none
# how the caller's tests of submitted collectives ended (atensor_net_share's codes: 0 completed there,
# 2 failed there, 3 taken over by the worker, 4 left in flight at the bound); for tests and bench/
shared: collections.Counter = collections.Counter()
# the latest of those tests' durations (ns, from the submission to the caller's leaving): with the
# worker taking over, how long its wake-up took, which the collective spent progressing here instead
shared_ns: collections.deque = collections.deque(maxlen=4096)


def _build() -> Optional[tuple[ctypes._CFuncPtr, int, ctypes._CFuncPtr, ctypes._CFuncPtr]]:
    """The compiled helper (compiled once per machine into library.cache_dir()), or None."""
    global _library, _tried, why_not
    with _lock:
        if _tried:
            return _library
        _tried = True
        try:
            lib = library.load_helper("net", _SOURCE)
        except Exception as exc:  # noqa: BLE001 - no native runner: the Python one runs instead
            why_not = f"the net helper did not compile: {exc}"
            return None
        entry, start, share = lib.atensor_net_allreduce, lib.atensor_net_start, lib.atensor_net_share
        for fn in (entry, start, share):
            fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
        _library = (entry, ctypes.cast(lib.atensor_net_allreduce_or_abort, ctypes.c_void_p).value, start, share)
        return _library


def _mpi_library(MPI: Any) -> Optional[str]:
    """The path of the MPI library mpi4py loaded (from the process's maps: the loaded `libmpi*`
    that exports MPI_Iallreduce; not a libmpi_abi, the standard ABI's), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = sorted({line.split()[-1] for line in maps.splitlines()
                    if "/" in line and os.path.basename(line.split()[-1]).startswith("libmpi")})
    for path in found:
        if "_abi" in os.path.basename(path):
            continue
        try:
            if hasattr(ctypes.CDLL(path), "MPI_Iallreduce"):
                return path
        except OSError:
            continue
    return None


def _family(MPI: Any) -> Optional[str]:
    """'mpich' (MPICH, Intel MPI, MVAPICH: int handles) or 'openmpi' (pointer handles), else None."""
    module = os.path.basename(getattr(MPI, "__file__", ""))  # MPI.<abi>.cpython-...so in mpi4py 4's wheels
    version = MPI.Get_library_version()
    if module.split(".")[1:2] == ["mpiabi"]:  # the MPI-5 standard ABI: other handles and constants
        return None
    if "Open MPI" in version:
        return "openmpi"
    if any(name in version for name in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        return "mpich"
    return None


@dataclass(frozen=True)
class Wait:
    """How a net command waits (see the module docstring): MPI's blocking call, or tests in a tight
    loop for `spin_ns`, with a sched_yield between them until `yield_ns`, then with naps growing
    from `nap_ns[0]` to `nap_ns[1]`; it gives up after `timeout_ns` (0: never). Times from its start.
    `here_ns`: how long a start on the caller's thread (`Runner.here`) may wait before it hands the
    rest of the wait to the queue, and then how long it may go on testing until the queue's worker
    takes over (0: never started there). A blocking wait started there is MPI's own, unbounded: the
    collective alone is one blocking call on the caller's thread, as mpi4py's `Allreduce`. `here_rings_first`: the worker is
    rung before the start there (a collective too long to finish within `here_ns`), not after it."""
    blocking: bool
    spin_ns: int
    yield_ns: int
    nap_ns: tuple[int, int]
    timeout_ns: int
    here_ns: int = 0
    here_rings_first: bool = False


class Helper:
    """What a native net runner needs of this process's MPI: the functions' addresses and handles."""

    def __init__(self, MPI: Any, entry: ctypes._CFuncPtr, program_entry: int, start: ctypes._CFuncPtr,
                 share: ctypes._CFuncPtr, path: str, family: str):
        lib = ctypes.CDLL(path)
        address = (lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
        self.MPI, self.entry, self.program_entry, self.start = MPI, entry, program_entry, start
        self.share = share
        self.iallreduce, self.allreduce = address("MPI_Iallreduce"), address("MPI_Allreduce")
        self.test, self.abort = address("MPI_Test"), address("MPI_Abort")
        self.world = _handle(MPI, MPI.COMM_WORLD)
        self.in_place = (1 << 64) - 1 if family == "mpich" else 1  # (void *)-1 in MPICH's ABI; Open MPI's: 1
        self.dtypes = {"float32": (MPI.FLOAT, KIND_F32), "float64": (MPI.DOUBLE, KIND_F64),
                       "int32": (MPI.INT32_T, KIND_NONE), "int64": (MPI.INT64_T, KIND_NONE)}

    def runner(self, comm: Any, send: int, recv: int, count: int, dtype: str, op: Any, in_place: bool,
               scale: Optional[float], wait: Wait, messages: tuple[str, str],
               error: type = RuntimeError) -> Optional[Runner]:
        """A runner whose `fn` (and `native`, for a program) allreduces `count` elements of `dtype`
        from address `send` into `recv` on `comm`, waiting as `wait` says; None for a dtype or count it
        does not take (the Python runner then runs). `fn` raises `error` with `messages` (a timeout's,
        an MPI error's). `args` is left to the caller (slots 0 and 1 are send and recv)."""
        found = self.dtypes.get(dtype)
        if found is None or count >= 1 << 31 or (scale is not None and found[1] == KIND_NONE):
            return None
        mpi_dtype, kind = found
        timeout_message, error_message = messages
        texts = (ctypes.create_string_buffer(timeout_message.encode()),
                 ctypes.create_string_buffer(error_message.encode()))
        block = (ctypes.c_uint64 * SLOTS)()
        values = {SEND: send, RECV: recv, COUNT: count, DTYPE: _handle(self.MPI, mpi_dtype),
                  OP: _handle(self.MPI, op), COMM: _handle(self.MPI, comm), IALLREDUCE: self.iallreduce,
                  ALLREDUCE: self.allreduce, TEST: self.test, ABORT: self.abort, WORLD: self.world,
                  IN_PLACE: self.in_place,
                  FLAGS: (FLAG_IN_PLACE if in_place else 0) | (FLAG_BLOCK if wait.blocking else 0),
                  SPIN_NS: wait.spin_ns, YIELD_NS: wait.yield_ns, NAP_NS: max(1, wait.nap_ns[0]),
                  NAP_MAX_NS: wait.nap_ns[1], TIMEOUT_NS: wait.timeout_ns, HERE_NS: wait.here_ns,
                  SCALE: struct.unpack("<Q", struct.pack("<d", scale))[0] if scale is not None else 0,
                  KIND: kind if scale is not None else KIND_NONE,
                  TIMEOUT_MESSAGE: ctypes.addressof(texts[0]), ERROR_MESSAGE: ctypes.addressof(texts[1])}
        for slot, value in values.items():
            block[slot] = value
        entry, start, share = self.entry, self.start, self.share
        ring_first, blocking = wait.here_rings_first, wait.blocking

        def check(rc: int) -> None:
            if rc == 1:
                raise error(timeout_message)
            if rc:
                raise error(f"{error_message} (MPI error code {block[ERROR_CODE]})")

        def run() -> None:  # the GIL is released for the whole call (ctypes)
            check(entry(block))

        def here(submit: Callable[[], None], alone: bool) -> bool:
            # starts it on the caller's thread; False: it was submitted (`submit`), and `run` or the
            # program takes it over from this thread and publishes it
            if alone and not ring_first:
                if blocking:  # MPI's blocking call, here, as mpi4py's Allreduce makes it
                    check(entry(block))
                    return True
                rc = start(block)
                if rc != 3:
                    check(rc)
                    return True
            if blocking:  # the worker makes the blocking call (one thread in it: nothing to share)
                submit()
                return False
            block[SHARED] = 1  # before the submission: the worker then asks this thread for it
            submitted = time.perf_counter_ns()
            submit()
            shared[share(block)] += 1  # its failure, if any, is the worker's to report
            shared_ns.append(time.perf_counter_ns() - submitted)
            return False
        run.texts = texts  # type: ignore[attr-defined]  # the messages live as long as the runner's fn
        return Runner(run, native=(self.program_entry, block), gil_free=True,
                      here=here if wait.here_ns > 0 else None)


def _handle(MPI: Any, obj: Any) -> int:
    """The MPI handle of an mpi4py object as an unsigned 64-bit value (an int handle sign-extended)."""
    return MPI._handleof(obj) & ((1 << 64) - 1)


def helper(MPI: Any) -> Optional[Helper]:
    """The native net helper for this process's MPI, or None (then `why_not` says why)."""
    global why_not
    family = _family(MPI)
    if family is None:
        why_not = f"an MPI of unknown ABI ({MPI.Get_library_version().splitlines()[0]})"
        return None
    path = _mpi_library(MPI)
    if path is None:
        why_not = "the MPI library mpi4py loaded was not found in /proc/self/maps"
        return None
    built = _build()
    if built is None:
        return None
    try:
        return Helper(MPI, *built, path, family)
    except (OSError, AttributeError) as exc:
        why_not = f"the MPI library's functions were not found: {exc}"
        return None
