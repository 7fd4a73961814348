"""The hand-over of a net command's collective from the calling thread to the net queue's worker
(dist/native_net.py: `atensor_net_share` on the caller's side, `at_take` in `atensor_net_allreduce`
on the worker's), against a fake MPI whose MPI_Iallreduce and MPI_Test are Python callbacks: only one
thread at a time may test a request, the collective is started once and scaled once, whichever thread
gets there first and whatever the order of their arrival. No MPI is needed."""
from __future__ import annotations

import ctypes
import struct
import threading
import time

import numpy as np
import pytest

from atensor.dist import native_net as nn

ISEND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t,
                         ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p)
TEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_void_p)


class FakeMPI:
    """An allreduce over 2 ranks of identical partials (recv = 2 * send), completing at the
    `done_after`-th MPI_Test; records who tested and whether two threads ever tested at once."""

    def __init__(self, done_after: int, start_error: int = 0):
        self.done_after, self.start_error = done_after, start_error
        self.starts, self.tests, self.inside, self.overlaps = 0, [], 0, 0
        self.lock = threading.Lock()
        self.send = self.recv = None
        self.iallreduce, self.test = ISEND(self._iallreduce), TEST(self._test)

    def _iallreduce(self, send, recv, count, dtype, op, comm, request) -> int:
        self.starts += 1
        if self.start_error:
            return self.start_error
        ctypes.c_uint64.from_address(request).value = 7  # a live request
        return 0

    def _test(self, request, flag, status) -> int:
        with self.lock:
            self.inside += 1
            self.overlaps += self.inside > 1
        self.tests.append(threading.get_ident())
        time.sleep(20e-6)  # gives the GIL away: a second tester would get in here
        done = len(self.tests) >= self.done_after
        if done:
            np.multiply(self.send, 2, out=self.recv)
            ctypes.c_uint64.from_address(request).value = 0
        flag[0] = int(done)
        with self.lock:
            self.inside -= 1
        return 0


def block_for(mpi: FakeMPI, n: int = 64, here_ns: int = 5_000_000_000):
    built = nn._build()
    if built is None:
        pytest.skip(f"no native net helper: {nn.why_not}")
    entry, _, _, share = built
    mpi.send = np.arange(n, dtype=np.float32)
    mpi.recv = np.zeros(n, dtype=np.float32)
    block = (ctypes.c_uint64 * nn.SLOTS)()
    values = {nn.SEND: mpi.send.ctypes.data, nn.RECV: mpi.recv.ctypes.data, nn.COUNT: n,
              nn.IALLREDUCE: ctypes.cast(mpi.iallreduce, ctypes.c_void_p).value,
              nn.TEST: ctypes.cast(mpi.test, ctypes.c_void_p).value, nn.SPIN_NS: 0,
              nn.YIELD_NS: 10_000_000_000, nn.NAP_NS: 10_000, nn.NAP_MAX_NS: 50_000,
              nn.TIMEOUT_NS: 20_000_000_000, nn.HERE_NS: here_ns, nn.KIND: nn.KIND_F32,
              nn.SCALE: struct.unpack("<Q", struct.pack("<d", 0.5))[0]}
    for slot, value in values.items():
        block[slot] = value
    return block, entry, share


def run_both(block, entry, share, worker_delay_s: float, caller_delay_s: float = 0.0,
             worker_after=None) -> tuple[int, int]:
    """The caller's side (SHARED set, then `share` after `caller_delay_s`) and a worker that calls
    the entry after `worker_delay_s` (and, with `worker_after`, once that returns true: an order
    the test needs whatever the machine's load); returns (share's code, the entry's code)."""
    codes = {}
    block[nn.SHARED] = 1  # set before the submission, as Runner.here does

    def worker() -> None:
        time.sleep(worker_delay_s)
        deadline = time.monotonic() + 20
        while worker_after is not None and not worker_after() and time.monotonic() < deadline:
            time.sleep(1e-3)
        codes["worker"] = entry(block)
    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(caller_delay_s)
    codes["caller"] = share(block)
    thread.join(30)
    assert not thread.is_alive(), "the worker did not finish: the hand-over hangs"
    return codes["caller"], codes["worker"]


def test_a_worker_that_arrives_mid_collective_takes_it_over_and_one_thread_tests_at_a_time():
    mpi = FakeMPI(done_after=400)
    block, entry, share = block_for(mpi)
    caller, worker = run_both(block, entry, share, worker_delay_s=0.01)
    assert (caller, worker) == (3, 0)  # taken over by the worker, finished there
    assert mpi.starts == 1 and mpi.overlaps == 0
    callers = {mpi.tests[0]}
    assert mpi.tests[-1] not in callers  # the last tests were the worker's
    np.testing.assert_array_equal(mpi.recv, np.arange(64, dtype=np.float32))  # 2 * x * 0.5: scaled once
    assert block[nn.STATE] == 0 and block[nn.SHARED] == 0 and block[nn.TAKE] == 0  # ready for the next


def test_a_collective_done_on_the_calling_thread_first_is_only_published_by_the_worker():
    mpi = FakeMPI(done_after=3)
    block, entry, share = block_for(mpi)
    caller, worker = run_both(block, entry, share, worker_delay_s=0.2)
    assert (caller, worker) == (0, 0)
    assert mpi.starts == 1 and len(mpi.tests) == 3 and mpi.overlaps == 0  # the worker tested nothing
    np.testing.assert_array_equal(mpi.recv, np.arange(64, dtype=np.float32))
    assert block[nn.STATE] == 0 and block[nn.TAKE] == 0


def test_a_worker_that_arrives_before_the_start_starts_it_itself_and_the_caller_leaves_it():
    mpi = FakeMPI(done_after=5)
    block, entry, share = block_for(mpi)
    caller, worker = run_both(block, entry, share, worker_delay_s=0.0, caller_delay_s=0.1)
    assert (caller, worker) == (3, 0)
    assert mpi.starts == 1 and mpi.overlaps == 0
    np.testing.assert_array_equal(mpi.recv, np.arange(64, dtype=np.float32))


def test_a_caller_past_its_bound_leaves_the_collective_in_flight_for_the_worker():
    mpi = FakeMPI(done_after=200)
    block, entry, share = block_for(mpi, here_ns=1_000_000)
    caller, worker = run_both(block, entry, share, worker_delay_s=0.1)
    assert (caller, worker) == (4, 0)
    assert mpi.starts == 1 and mpi.overlaps == 0
    np.testing.assert_array_equal(mpi.recv, np.arange(64, dtype=np.float32))


def test_a_start_that_fails_on_the_calling_thread_is_reported_by_the_worker():
    mpi = FakeMPI(done_after=1, start_error=13)
    block, entry, share = block_for(mpi)
    # the worker comes once the caller's start has failed (on a loaded machine 50 ms may not be enough)
    caller, worker = run_both(block, entry, share, worker_delay_s=0.05, worker_after=lambda: mpi.starts >= 1)
    assert (caller, worker) == (2, 2) and block[nn.ERROR_CODE] == 13
    assert mpi.starts == 1 and not mpi.tests and block[nn.STATE] == 0
