"""The async behaviour itself, on every supported loop: a free event loop while realizing, concurrent
realizes, errors inside kernels, cancellation and timeouts, the jit, the profiler around awaits, and
sync accessors inside and outside a loop.

Each async test is a plain function taking `run`, which runs its body under trio, asyncio and uvloop
(when installed) natively; bodies use anyio's primitives (task groups, cancel scopes), which drive
the running loop's own. asyncio's own cancellation (`task.cancel`, `wait_for`, `asyncio.timeout`)
and `anyio.run` on both backends have tests of their own."""
from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable

import anyio
import numpy as np
import pytest
import trio

import atensor
from atensor import NotRealizedError, Tensor
from atensor.profiler import ticking

try:
    import uvloop
except ImportError:  # optional: the uvloop runs skip
    uvloop = None

LOOPS = ["trio", "asyncio", "uvloop"]
# seconds: the longest the loop may be held, on any loop, whatever runs meanwhile, with the cyclic
# collector on. bench/loop_lag.py measures the worst gap per loop. What made it 250 ms before: the first
# collection after a 3000-output realize traversed the ~200,000 objects it left alive, 160-540 ms here;
# hcq/gcpause.py now freezes them when the collector resumes. The `frozen_startup` fixture does what a
# server does once warmed up (gc.freeze() of its startup state: modules, numpy, trio), so that a full
# collection of the import-time heap (~140,000 objects, 80-100 ms here) does not land in the test.
GAP_BOUND = 0.1


@pytest.fixture
def frozen_startup():
    """The heap as it is now moved out of the collector's way for one test (see GAP_BOUND). Given back
    afterwards only where nothing was frozen before (as tests/conftest.py's `young_heap`): gc.unfreeze()
    gives back everything, what the suite's `settled_heap` and hcq/gcpause.py froze too, which every later
    full collection of the module would then traverse."""
    deadline = time.monotonic() + 60
    while not gc.isenabled() and time.monotonic() < deadline:  # an earlier test's work still running
        time.sleep(0.01)
    assert gc.isenabled(), "the gap tests run with the cyclic collector on"
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    yield
    if frozen_before == 0:
        gc.unfreeze()


@pytest.fixture(params=LOOPS)
def run(request) -> Callable[..., Any]:
    """Runs `fn(*args)` to completion on the loop of this parametrization and returns its result."""
    name = request.param
    if name == "uvloop" and uvloop is None:
        pytest.skip("uvloop is not installed")

    def go(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        if name == "trio":
            return trio.run(fn, *args)
        if name == "asyncio":
            return asyncio.run(fn(*args))
        return uvloop.run(fn(*args))
    go.name = name  # type: ignore[attr-defined]
    return go


def _long_matmuls(seconds: float) -> list[Tensor]:
    """Independent 1024x1024 matmul chains that take at least about `seconds` to realize here (timed
    on this machine first, so a faster or busier machine still gets a long realize)."""
    a = Tensor.rand(1024, 1024).realize().wait()
    times = []
    for k in range(4):  # the fastest of the timed runs (the first warms caches and compiles) is a lower
        start = time.perf_counter()  # bound per matmul: the realize below then runs at least `seconds`
        Tensor.realize(*[(a @ (a + j)).sum() for j in range(4)]).wait()
        times.append((time.perf_counter() - start) / 4)
    one = max(min(times[1:]), 1e-3)
    count = max(2, int(1.5 * seconds / one) + 1)
    return [(a @ (a + (i + 1))).exp().sum() for i in range(count)]  # distinct matmuls (no shared work)


async def _realize_with_ticker(*tensors: Tensor) -> tuple[float, list[float]]:
    """The realize's duration and the gaps between the wake-ups of a 1 ms ticker beside it, and for
    0.3 s after it: the first collection after a big realize comes then (hcq/gcpause.py)."""
    async with ticking() as lag:
        start = time.perf_counter()
        await Tensor.realize(*tensors)
        elapsed = time.perf_counter() - start
        await anyio.sleep(0.3)
    return elapsed, lag.gaps


# a gap test measures up to this many realizes and keeps the best (the one with the smallest worst
# gap): a stall atensor causes (a collection, a GIL held, a blocking call) is in every attempt, while a
# gap made by other processes on a loaded shared machine is not
ATTEMPTS = 3


def test_event_loop_keeps_ticking_during_a_long_realize_of_big_kernels(run, frozen_startup):
    best, short = None, []
    for _ in range(ATTEMPTS):
        outs = _long_matmuls(1.0)
        elapsed, gaps = run(_realize_with_ticker, *outs)
        assert len(gaps) > elapsed / 0.01
        if elapsed < 0.8:  # the timing of _long_matmuls missed on a loaded machine: not a measurement
            short.append(elapsed)
            continue
        if best is None or max(gaps) < best[0]:
            best = (max(gaps), elapsed)
        if best[0] <= GAP_BOUND:
            break
    assert best is not None, f"the realizes took only {short} s; the test wants one of about a second"
    assert best[0] <= GAP_BOUND, (run.name, best)


def test_event_loop_keeps_ticking_during_thousands_of_tiny_kernels(run, frozen_startup):
    best = None
    for attempt in range(ATTEMPTS):
        xs = [Tensor(np.full(8, i + attempt, dtype=np.float32)) for i in range(3000)]
        outs = [(x * 2 + 1).contiguous().sum() for x in xs]

        async def main() -> tuple[float, list[float], list[float]]:
            elapsed, gaps = await _realize_with_ticker(*outs)
            return elapsed, gaps, [o.item() for o in outs[:3]]
        elapsed, gaps, first = run(main)
        assert first == [8.0 * (1 + 2 * attempt), 8.0 * (3 + 2 * attempt), 8.0 * (5 + 2 * attempt)]
        if best is None or max(gaps) < best[0]:
            best = (max(gaps), elapsed)
        if best[0] <= GAP_BOUND:
            break
    assert best[0] <= GAP_BOUND, (run.name, best)


def test_fifty_concurrent_tasks_match_a_sequential_run(run):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(50)]
    expected = [np.tanh(x @ x.T).sum(0) + i for i, x in enumerate(inputs)]
    results: dict[int, np.ndarray] = {}

    async def work(i: int) -> None:
        x = Tensor(inputs[i])
        y = (x @ x.T).tanh().sum(0) + i
        await y.realize()
        results[i] = y.numpy()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(work, i)
    run(main)
    for i in range(50):
        np.testing.assert_allclose(results[i], expected[i], rtol=1e-4, atol=1e-5)


def test_gather_of_realizes_and_realize_of_several_tensors_return_the_tensors():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 8)).astype(np.float32)

    async def main() -> None:
        a, b = Tensor(x) @ Tensor(x), Tensor(x).exp()
        got = await asyncio.gather(a.realize(), b.realize(), (a + 1).realize())
        assert got[0] is a and got[1] is b
        np.testing.assert_allclose(got[2].numpy(), x @ x + 1, rtol=1e-5, atol=1e-5)
        c, d, e = a * 2, b * 2, a + b
        assert await Tensor.realize(c, d, e) is c  # waits for all three
        for t, ref in ((c, 2 * (x @ x)), (d, 2 * np.exp(x)), (e, x @ x + np.exp(x))):
            np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-5)
        f = a - 1
        assert await f is f  # a tensor never realized is realized by the await
        np.testing.assert_allclose(f.numpy(), x @ x - 1, rtol=1e-5, atol=1e-5)
    asyncio.run(main())


def test_assigns_from_many_tasks_to_one_buffer_apply_in_issue_order(run):
    counter = Tensor(np.zeros(4, dtype=np.float32))
    seen: list[float] = []

    async def bump(i: int) -> None:
        counter.assign(counter * 2 + i)
        await counter.realize()   # dispatched at once, in program order
        seen.append(counter.numpy()[0])

    async def main() -> None:
        for i in range(1, 21):  # issued one after the other, awaited concurrently
            async with anyio.create_task_group() as tg:
                tg.start_soon(bump, i)
    run(main)
    expected = 0.0
    for i in range(1, 21):
        expected = expected * 2 + i
    assert counter.numpy().tolist() == [expected] * 4
    assert seen[-1] == expected


def test_concurrent_readers_and_writers_of_a_shared_buffer_see_every_write(run):
    async def main() -> list[float]:
        shared = Tensor(np.zeros(8, dtype=np.float32))
        snapshots: list[Tensor] = []
        for _ in range(10):
            shared.assign(shared + 1)
            shared.realize()
            snap = (shared * 1).contiguous().realize()
            snapshots.append(snap)
        for s in snapshots:
            await s
        await shared
        return [s.numpy()[0] for s in snapshots]
    assert run(main) == [float(i + 1) for i in range(10)]


def test_exception_inside_a_kernel_surfaces_from_the_await_and_the_device_stays_usable(run):
    async def main() -> None:
        bad = Tensor([2, 3], dtype="int32") ** Tensor([-1, -2], dtype="int32")  # numpy refuses this
        with pytest.raises(RuntimeError, match=r"kernel pow.*failed.*Integers to negative integer powers"):
            await bad.realize()
        with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
            await bad  # a failed realize raises again on every await
        good = Tensor([1.0, 2.0]) * 3
        await good.realize()
        assert good.tolist() == [3.0, 6.0]
        with pytest.raises(RuntimeError, match="failed"):
            bad.numpy()
        with pytest.raises(RuntimeError, match="failed"):
            await (bad + 1).realize()
        downstream = (Tensor([2], dtype="int32") ** Tensor([-1], dtype="int32")).to("CPU:1") + 1
        with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
            await downstream.realize()
    run(main)


def _cube_sum() -> tuple[Tensor, np.ndarray]:
    ref = np.random.default_rng(3).random((1000, 1000), dtype=np.float32)  # > 1 ms even on 2 fast cores
    a = Tensor(ref)
    return (a @ a @ a).sum(axis=0), (ref @ ref @ ref).sum(0)


def _assigned_five_times() -> Tensor:
    t = Tensor(np.zeros((512, 512), dtype=np.float32))
    for _ in range(5):
        t.assign((t + 1) @ Tensor.eye(512))
    return t


def _read_now(t: Tensor) -> np.ndarray | None:
    """The values when they are ready, None when the accessor refuses (never a partial write)."""
    try:
        return t.numpy()
    except NotRealizedError:
        return None


def test_a_cancel_scope_around_an_await_leaves_the_work_running_and_a_later_await_finds_it(run):
    async def main() -> None:
        out, ref = _cube_sum()
        with anyio.move_on_after(0.001) as scope:
            await out.realize()
        assert scope.cancelled_caught
        await out
        np.testing.assert_allclose(out.numpy(), ref, rtol=2e-3)
        t = _assigned_five_times()
        with anyio.move_on_after(0.0005):
            await t.realize()
        seen = _read_now(t)
        assert seen is None or np.all(seen == 5)  # no half-written buffer is ever visible
        await t
        assert np.all(t.numpy() == 5)
    run(main)


def test_asyncio_cancel_wait_for_and_timeout_behave_as_trio_cancel_scopes():
    async def main() -> None:
        out, ref = _cube_sum()
        task = asyncio.ensure_future(out.realize())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await out is out  # the work went on; the later await finds it done
        np.testing.assert_allclose(out.numpy(), ref, rtol=2e-3)

        t = _assigned_five_times()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(t.realize(), 0.0005)
        seen = _read_now(t)
        assert seen is None or np.all(seen == 5)
        await t
        assert np.all(t.numpy() == 5)

        u = _assigned_five_times()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.0005):
                await u.realize()
        seen = _read_now(u)
        assert seen is None or np.all(seen == 5)
        await asyncio.wait_for(u, 60)
        assert np.all(u.numpy() == 5)
    asyncio.run(main())


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_anyio_run_on_either_backend(backend):
    async def main() -> list[float]:
        t = Tensor([1.0, 2.0]) * 4
        with pytest.raises(NotRealizedError, match=r"await t.realize\(\)"):
            t.tolist()
        t.realize()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_await, t)
        with anyio.fail_after(60):
            await Tensor.realize(t + 1)
        return t.tolist()
    assert anyio.run(main, backend=backend) == [4.0, 8.0]


async def _await(t: Tensor) -> None:
    await t


def test_sync_accessors_inside_the_loop_name_the_await_to_use(run):
    async def main() -> None:
        t = Tensor([1.0, 2.0]) + 1
        with pytest.raises(NotRealizedError, match=rf"running {run.name if run.name == 'trio' else 'asyncio'} "
                                                   r"event loop.*`await t.realize\(\)`"):
            t.numpy()
        with pytest.raises(NotRealizedError):
            t.tolist()
        with pytest.raises(NotRealizedError):
            t.realize().wait()  # the blocking wait refuses too
        await t
        assert t.tolist() == [2.0, 3.0]
        assert t.wait() is t  # done: nothing to block on
    run(main)


def test_an_unsupported_async_library_gets_an_error_naming_the_supported_ones():
    import sniffio
    t = Tensor([1.0]) + 1
    token = sniffio.current_async_library_cvar.set("curio")
    try:
        gen = t.realize().__await__()
        with pytest.raises(RuntimeError, match=r"trio and asyncio.*not 'curio'"):
            gen.send(None)
    finally:
        sniffio.current_async_library_cvar.reset(token)
    assert t.tolist() == [2.0]  # the realize was dispatched all the same


def test_a_jitted_async_function_replays_on_every_loop(run):
    rng = np.random.default_rng(4)
    data = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(6)]

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x * 2 + 1).relu().sum(axis=1)

    async def main() -> list[np.ndarray]:
        outs = []
        for x in data:
            outs.append((await f(Tensor(x))).numpy())
        return outs
    outs = run(main)
    for x, out in zip(data, outs):
        np.testing.assert_allclose(out, np.maximum(x * 2 + 1, 0).sum(1), rtol=1e-6)
    assert f.stats["replays"] == 3 and f.stats["captures"] == 1

    @atensor.jit
    def plain(x: Tensor) -> Tensor:
        return x + 1

    async def calls_plain() -> None:
        with pytest.raises(RuntimeError, match="plain function.*would block"):
            plain(Tensor([1.0]))
    run(calls_plain)


def test_the_profiler_records_around_awaits_on_every_loop(run):
    async def main() -> Any:
        # data of its own (a new buffer): a structurally equal graph realized by an earlier test (same
        # seed, same rand) would be a cached value here, and run no kernel
        a = Tensor(np.random.default_rng().random((64, 64), dtype=np.float32))
        with atensor.profile() as prof:
            await ((a @ a).exp().sum()).realize()
            await anyio.sleep(0.001)
            await (a + 1).realize()
        return prof
    prof = run(main)
    assert len({s.task_id for s in prof.spans}) >= 2, [(s.name, s.kind) for s in prof.spans]
    awaits = [h for h in prof.host_spans if h.name == "await realize"]
    assert len(awaits) == 2 and awaits[1].start_ns >= awaits[0].end_ns


def test_plain_script_realizes_synchronously():
    code = ("from atensor import Tensor\n"
            "t = Tensor.arange(4).realize()\n"
            "print((Tensor([1, 2, 3]) + 1).tolist(), t.shape, t.realize().numpy().tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2, 3, 4] (4,) [0, 1, 2, 3]"


def test_a_realize_that_is_never_awaited_still_runs():
    t = Tensor([1.0, 2.0]) * 5
    assert t.realize() is t  # not awaited, not waited
    deadline = time.time() + 30
    while time.time() < deadline:
        if t._is_ready_single():  # finished on its own, without any accessor asking
            assert t.tolist() == [5.0, 10.0]
            return
        time.sleep(0.01)
    pytest.fail("the dispatched realize never ran")


def test_two_devices_run_at_the_same_time(run):
    from atensor.profiler import profile
    # long enough that each device's kernels span more than the skew between their starts on a busy machine
    a = Tensor.rand(600, 600)
    b = Tensor.rand(600, 600, device="CPU:1")
    x = a
    y = b
    for _ in range(8):
        x = (x @ a).tanh().contiguous()
        y = (y @ b).tanh().contiguous()

    async def main() -> Any:
        with profile() as prof:
            await Tensor.realize(x, y)
        return prof
    prof = run(main)
    spans = {dev: [s for s in prof.spans if s.device == dev and s.kind == "kernel"]
             for dev in ("CPU:0", "CPU:1")}
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
            "assert (Tensor([1.0] * 40000) * 2).sum().item() == 80000.0\n"  # too big to run on the caller's thread
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
