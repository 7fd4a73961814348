"""The async behaviour itself: a free event loop while realizing, concurrent realizes, errors inside
kernels, cancellation, and sync accessors inside and outside a loop."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import trio

from atensor import NotRealizedError, Tensor
from atensor.profiler import ticking


async def _realize_with_ticker(*tensors: Tensor) -> tuple[float, list[float]]:
    async with ticking() as lag:
        start = time.perf_counter()
        await Tensor.realize(*tensors)
        elapsed = time.perf_counter() - start
    return elapsed, lag.gaps


async def test_event_loop_keeps_ticking_during_a_long_realize_of_big_kernels():
    a = Tensor.rand(768, 768)
    outs = [(a @ a.T * (i + 1)).exp().sum() for i in range(6)]
    elapsed, gaps = await _realize_with_ticker(*outs)
    assert elapsed > 0.05
    # a blocked loop would show one gap as long as the realize; allow generous noise
    assert max(gaps) < max(0.25, elapsed / 3), (max(gaps), elapsed)
    assert len(gaps) > elapsed / 0.01


async def test_event_loop_keeps_ticking_during_thousands_of_tiny_kernels():
    xs = [Tensor(np.full(8, i, dtype=np.float32)) for i in range(3000)]
    outs = [(x * 2 + 1).contiguous().sum() for x in xs]
    elapsed, gaps = await _realize_with_ticker(*outs)
    assert max(gaps) < max(0.25, elapsed / 3), (max(gaps), elapsed)
    assert [o.item() for o in outs[:3]] == [8.0, 24.0, 40.0]


async def test_fifty_concurrent_tasks_match_a_sequential_run():
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(50)]
    expected = [np.tanh(x @ x.T).sum(0) + i for i, x in enumerate(inputs)]
    results: dict[int, np.ndarray] = {}

    async def work(i: int) -> None:
        x = Tensor(inputs[i])
        y = (x @ x.T).tanh().sum(0) + i
        await y.realize()
        results[i] = y.numpy()

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(work, i)
    for i in range(50):
        np.testing.assert_allclose(results[i], expected[i], rtol=1e-4, atol=1e-5)


async def test_assigns_from_many_tasks_to_one_buffer_apply_in_issue_order():
    counter = Tensor(np.zeros(4, dtype=np.float32))
    seen: list[float] = []

    async def bump(i: int) -> None:
        counter.assign(counter * 2 + i)
        handle = counter.realize()   # dispatched now, in program order
        await handle
        seen.append(counter.numpy()[0])

    for i in range(1, 21):  # issued one after the other, awaited concurrently
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bump, i)
    expected = 0.0
    for i in range(1, 21):
        expected = expected * 2 + i
    assert counter.numpy().tolist() == [expected] * 4
    assert seen[-1] == expected


async def test_concurrent_readers_and_writers_of_a_shared_buffer_see_every_write():
    shared = Tensor(np.zeros(8, dtype=np.float32))
    snapshots: list[np.ndarray] = []
    handles = []
    for i in range(10):
        shared.assign(shared + 1)
        handles.append(shared.realize())
        snap = (shared * 1).contiguous()
        handles.append(snap.realize())
        snapshots.append(snap)
    for h in handles:
        await h
    assert [s.numpy()[0] for s in snapshots] == [float(i + 1) for i in range(10)]


async def test_exception_inside_a_kernel_surfaces_from_the_await_and_the_device_stays_usable():
    bad = Tensor([2, 3], dtype="int32") ** Tensor([-1, -2], dtype="int32")  # numpy refuses this
    with pytest.raises(RuntimeError, match=r"kernel E_pow.*failed.*Integers to negative integer powers"):
        await bad.realize()
    good = Tensor([1.0, 2.0]) * 3
    await good.realize()
    assert good.tolist() == [3.0, 6.0]
    with pytest.raises(RuntimeError, match="failed"):
        bad.numpy()
    with pytest.raises(RuntimeError, match="failed"):
        await (bad + 1).realize()


async def test_a_task_after_a_failed_one_does_not_run_and_reports_the_root_cause():
    bad = Tensor([2], dtype="int32") ** Tensor([-1], dtype="int32")
    downstream = (bad.to("CPU:1") + 1)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        await downstream.realize()


async def test_cancelling_an_await_then_awaiting_again_gives_the_right_values():
    ref = np.random.default_rng(3).random((600, 600), dtype=np.float32)
    a = Tensor(ref)
    out = (a @ a @ a).sum(axis=0)
    with trio.move_on_after(0.001) as scope:
        await out.realize()
    assert scope.cancelled_caught
    await out.realize()
    np.testing.assert_allclose(out.numpy(), (ref @ ref @ ref).sum(0), rtol=2e-3)


async def test_timeout_leaves_no_half_written_buffer_visible():
    t = Tensor(np.zeros((512, 512), dtype=np.float32))
    for _ in range(5):
        t.assign((t + 1) @ Tensor.eye(512))
    with trio.move_on_after(0.0005):
        await t.realize()
    with pytest.raises(NotRealizedError) if not _done(t) else _nothing():
        t.numpy()
    await t.realize()
    assert np.all(t.numpy() == 5)


def _done(t: Tensor) -> bool:
    try:
        t.numpy()
        return True
    except NotRealizedError:
        return False


class _nothing:
    def __enter__(self): return self
    def __exit__(self, *exc): return False


async def test_sync_accessors_inside_the_loop_name_the_await_to_use():
    t = Tensor([1.0, 2.0]) + 1
    with pytest.raises(NotRealizedError, match=r"await t.realize\(\)"):
        t.numpy()
    with pytest.raises(NotRealizedError):
        t.tolist()
    await t.realize()
    assert t.tolist() == [2.0, 3.0]


def test_plain_script_realizes_synchronously():
    code = "from atensor import Tensor; print((Tensor([1, 2, 3]) + 1).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 3, 4]"


def test_a_realize_that_is_never_awaited_still_runs():
    t = Tensor([1.0, 2.0]) * 5
    t.realize()  # not awaited, not waited
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if t.tolist() == [5.0, 10.0]:
                return
        except NotRealizedError:
            pass
        time.sleep(0.01)
    pytest.fail("the dispatched realize never ran")


async def test_two_devices_run_at_the_same_time():
    from atensor.profiler import profile
    a = Tensor.rand(400, 400)
    b = Tensor.rand(400, 400, device="CPU:1")
    x = a
    y = b
    for _ in range(4):
        x = (x @ a).tanh().contiguous()
        y = (y @ b).tanh().contiguous()
    with profile() as prof:
        await Tensor.realize(x, y)
    spans = {dev: [s for s in prof.spans if s.device == dev and s.kind == "kernel"] for dev in ("CPU:0", "CPU:1")}
    assert spans["CPU:0"] and spans["CPU:1"]
    first = (min(s.start_ns for s in spans["CPU:0"]), max(s.end_ns for s in spans["CPU:0"]))
    second = (min(s.start_ns for s in spans["CPU:1"]), max(s.end_ns for s in spans["CPU:1"]))
    assert first[0] < second[1] and second[0] < first[1], "the two devices' kernels never overlapped"


def test_using_another_devices_data_without_to_is_a_clear_error():
    a = Tensor([1.0, 2.0])
    b = Tensor([1.0, 2.0], device="CPU:1")
    with pytest.raises(ValueError, match=r"different devices.*\.to\("):
        a + b
    with pytest.raises(ValueError, match="unknown device"):
        Tensor([1.0], device="GPU")
    assert (a + b.to("CPU")).tolist() == [2.0, 4.0]


def test_null_device_schedules_and_runs_nothing():
    x = Tensor.empty(1024, device="NULL")
    y = (x * 2 + 1).sum()
    y.realize().wait()
    with pytest.raises(RuntimeError, match="NULL"):
        y.numpy()


def test_worker_threads_take_the_configured_niceness():
    """ATENSOR_WORKER_NICE lowers the OS priority of atensor's worker threads (not the caller's)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread priorities are Linux's")
    code = ("import os, threading; from atensor import Tensor\n"
            "assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]\n"
            "t = Tensor([1.0, 2.0])\n"  # a graph too big to plan on the caller's thread: the dispatcher's
            "for _ in range(100): t = t + 1\n"
            "assert t.tolist() == [101.0, 102.0]\n"
            "nice = {t.name: os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()}\n"
            "print(nice['atensor-CPU:0-compute'], nice['atensor-dispatch'], nice['MainThread'])\n")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ATENSOR_WORKER_NICE": "7"})
    assert out.returncode == 0, out.stderr
    compute, dispatch, main = map(int, out.stdout.split())
    assert compute == dispatch == min(19, base + 7) and main == base
