"""Queue doorbells (hcq/doorbell.py): a worker waits in C and starts a native program without the GIL;
the lists of a queue still run in the order they were submitted, whether a program came through the
ring, overflowed it, or is Python work."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.hcq import doorbell
from atensor.backend.c import compiler, programs
from atensor.backend.runner import Runner
from atensor.hcq.device import Device
from atensor.hcq.queue import Command, Queue

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler: no native programs")


def _load_library() -> None:
    with atensor.Context(native="all"):
        Tensor([2.0]).exp().tolist()  # a kernel compiled: the library with the doorbell is loaded


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_lists_run_in_order_through_the_ring_its_overflow_and_python():
    _load_library()
    if not doorbell.available():
        pytest.skip("doorbells need Linux")
    queue = Queue("TEST:0", "compute")
    queue.submit([Command(1, (), None, "first", "kernel", 0)])
    _wait_for(lambda: queue.signal.value >= 1 and queue._doorbell is not None)  # the worker rang in
    count = 150  # more than the ring holds while the worker is held at the gate: some overflow
    sources = [np.full(256, k, dtype=np.float32) for k in range(count)]
    dst = np.zeros(256, dtype=np.float32)
    seen: list[float] = []
    gate = threading.Event()

    def address(a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]

    value = 1
    value += 1
    queue.submit([Command(value, (), Runner(lambda: gate.wait(10)), "gate", "kernel", value)])
    for k in range(count):
        copy = programs.native_copy(address(dst), address(sources[k]), dst.nbytes)
        program = programs.Program([(programs.RUN, 0, 0, 0)], [copy]).bind()
        value += 1
        queue.submit([Command(value, (), program, f"copy {k}", "copy", value)])
        value += 1
        queue.submit([Command(value, (), Runner(lambda: seen.append(float(dst[0]))), f"read {k}", "kernel",
                              value)])
    ran_before = queue._doorbell.ran
    gate.set()
    queue.signal.wait_blocking(value, timeout=30)
    assert seen == [float(k) for k in range(count)]  # each read saw the copy just before it, and no later one
    ran = queue._doorbell.ran - ran_before
    assert 0 < ran < count, ran  # programs started from the ring, and others that overflowed it from Python


async def test_replayed_programs_start_from_the_doorbell_and_compute_the_same_values():
    rng = np.random.default_rng(4)
    # big enough not to be a tiny plan (those run on the caller's thread, engine/plan.py), small
    # enough to be one native program
    w_np = rng.standard_normal((256, 64)).astype(np.float32)
    w = Tensor(w_np)

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x @ w).relu().sum(axis=1)

    with atensor.Context(native="jit"):
        for _ in range(3):  # captured, verified, compiled
            await f(Tensor(np.ones((64, 256), np.float32)))
        if not doorbell.available():
            pytest.skip("doorbells need Linux")
        queue = Device.get("CPU:0").compute
        # a tiny eager realize runs on the caller's thread, so the worker may not have woken since the
        # library was loaded: one compiled replay is handed to it, and it rings in
        await f(Tensor(np.ones((64, 256), np.float32)))
        _wait_for(lambda: queue._doorbell is not None)
        before = queue._doorbell.ran
        for _ in range(5):
            x_np = rng.standard_normal((64, 256)).astype(np.float32)
            got = await f(Tensor(x_np))
            np.testing.assert_allclose(got.numpy(), np.maximum(x_np @ w_np, 0).sum(axis=1), rtol=1e-4, atol=1e-3)
        assert queue._doorbell.ran - before == 5


def test_a_finished_ring_program_is_published_by_the_host_that_polls_and_the_worker_publishes_it_again():
    _load_library()
    if not doorbell.available():
        pytest.skip("doorbells need Linux")
    queue = Queue("TEST:1", "compute")
    queue.submit([Command(queue.reserve() + 1, (), None, "first", "kernel", 0)])
    _wait_for(lambda: queue.signal.value >= 1 and queue._doorbell is not None)  # the worker rang in
    gate = threading.Event()
    queue.submit([Command(queue.reserve() + 1, (), Runner(lambda: gate.wait(10)), "gate", "kernel", 1)])
    src = np.arange(4096, dtype=np.float32)
    dst = np.zeros_like(src)
    copy = programs.native_copy(dst.__array_interface__["data"][0], src.__array_interface__["data"][0], src.nbytes)
    value = queue.reserve() + 1
    queue.submit([Command(value, (), programs.Program([(programs.RUN, 0, 0, 0)], [copy]).bind(), "copy", "copy", 2)])
    time.sleep(0.01)
    assert not queue.poll(value)  # held behind the gate: not run, not published
    assert queue.signal.value < value and not dst.any()
    commands_before = queue.commands_run
    gate.set()
    _wait_for(lambda: queue.poll(value))  # published by the poll or by the worker, once the copy ran
    np.testing.assert_array_equal(dst, src)
    _wait_for(lambda: queue.commands_run == commands_before + 2)  # the worker finished it too, stamped
    assert queue.signal.value == value and queue.signal.stamp(value) is not None


def test_reach_publishes_a_value_once_and_never_lowers_the_signal():
    from atensor.hcq.signal import Signal
    sig = Signal("test/reach")
    sig.reach(2)
    assert sig.value == 2 and sig.stamp(2) is None
    sig.set(2, (5, 6))  # the worker's own publish of the same value: allowed, and stamps it
    assert sig.stamp(2) == (5, 6)
    sig.set(4, (7, 8))
    sig.reach(3)  # a late poll of an older value changes nothing
    assert sig.value == 4


async def test_each_replayed_ring_program_is_counted_once_whether_the_host_or_the_worker_counts_it():
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    with atensor.Context(native="jit"):
        y = Tensor.zeros(1 << 16).contiguous()  # more than a tiny plan: its worker runs it
        await y.realize()
        for _ in range(4):
            y = await step(y)
        if not doorbell.available():
            pytest.skip("doorbells need Linux")
        queue = Device.get("CPU:0").compute
        _wait_for(lambda: queue._doorbell is not None and queue.idle())
        time.sleep(0.05)  # the worker's bookkeeping of the last of them is done
        run_before, rang_before = queue.commands_run, queue._doorbell.ran
        replays = 60
        for _ in range(replays):
            y = await step(y)
        assert y.numpy()[[0, -1]].tolist() == [replays + 4.0] * 2
        _wait_for(lambda: queue.commands_run - run_before >= replays)
        time.sleep(0.05)  # a worker that counted a program the host had counted would show now
        assert queue.commands_run - run_before == replays
        assert queue._doorbell.ran - rang_before == replays
