"""A jit replay on one OpenCL queue enqueued as one command (engine/cl_replay.py's lean path): it computes
what the function computes (numpy is the reference) whatever buffers a call brings, as ONE command
of its queue however many kernels the step has, fails as the general path does (an enqueue that
raises fails the call, a later call that reads that failed result is refused, and the next good call
works), leaves the profile's per-kernel spans to the general path, and a cancelled await leaves the
replay running to completion. Each test checks that the lean path ran, under trio and asyncio."""
from __future__ import annotations

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor
from atensor.engine.cl_replay import CLReplay
from atensor.hcq.cl_queue import CLQueue
from atensor.hcq.device import Device
from atensor.hcq.queue import KernelError
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings  # as users run: replays planned inline
RNG = np.random.default_rng(5)


@pytest.fixture
def lean(monkeypatch) -> list[CLReplay]:
    """One entry per replay that went through the lean path (the record it used)."""
    calls: list[CLReplay] = []
    original = CLReplay.bind  # once per lean replay, before its one command is submitted

    def counting(self: CLReplay, new_specs: list):
        calls.append(self)
        return original(self, new_specs)
    monkeypatch.setattr(CLReplay, "bind", counting)
    return calls


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_replay_of_several_kernels_is_one_command_with_each_calls_values(library, lean):
    w_np = RNG.standard_normal((16, 8)).astype(np.float32)
    w = Tensor(w_np, device="CL")
    compute = Device.get("CL").compute

    @atensor.jit
    async def step(x: Tensor) -> tuple[Tensor, Tensor]:
        h = (x @ w).relu()
        return h * 2, h.sum(axis=1) + x.max()  # several kernels, one of them reading another's result

    async def main() -> None:
        for k in range(8):
            a = RNG.standard_normal((4, 16)).astype(np.float32)
            before = compute.commands_run
            out, total = await step(Tensor(a, device="CL"))
            h = np.maximum(a @ w_np, 0)
            np.testing.assert_allclose(out.numpy(), h * 2, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(total.numpy(), h.sum(axis=1) + a.max(), rtol=1e-5, atol=1e-5)
            if lean and lean[-1].count > 1 and k >= 4:
                assert compute.commands_run - before == 1  # its kernels were one command
        assert len(lean) >= 3 and lean[-1].count >= 3, [r.count for r in lean]
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_chain_on_its_own_result_and_a_bound_variable(library, lean):
    from atensor.graph.symbolic import Variable
    scale = Variable("row", 0, 15)

    counts = Tensor(np.zeros(16, np.float32), device="CL")

    @atensor.jit
    async def step(y: Tensor, s) -> Tensor:
        row = counts.shrink(((s, s + 1),))  # a row at a Variable offset: a kernel argument per call
        row.assign(row + 1)
        return y + 1

    async def main() -> None:
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        want = np.zeros(16, np.float32)
        for k in range(12):
            s = (5 * k) % 16
            y = await step(y, scale.bind(s))
            want[s] += 1
        np.testing.assert_array_equal(y.numpy(), np.full(16, 12, np.float32))
        np.testing.assert_array_equal(counts.numpy(), want)
        assert len(lean) >= 5
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_failed_enqueue_fails_the_call_its_result_is_refused_and_the_next_call_works(library, lean):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x * 3 + 1

    async def main() -> None:
        for k in range(6):
            got = await step(Tensor(np.arange(4, dtype=np.float32) + k, device="CL"))
            np.testing.assert_array_equal(got.numpy(), 3 * (np.arange(4) + k) + 1)
        assert lean
        record = lean[-1]
        good = record.runner.enqueue, record.runner.launch  # its launches: pyopencl's, the compiled one

        def refuse(*_):
            raise RuntimeError("out of resources (injected)")
        record.runner.enqueue = refuse
        if record.runner.launch is not None:
            record.runner.launch = refuse
        try:  # the jit's own replay entry, to keep the failed call's result tensor
            handle, _, results = step._replay_now((Tensor(np.arange(4, dtype=np.float32), device="CL"),))
            with pytest.raises(KernelError, match="injected"):
                await handle
        finally:
            record.runner.enqueue, record.runner.launch = good
        assert lean[-1] is record
        with pytest.raises(RuntimeError, match="failed"):  # its result is refused as an input
            await step(results[0])
        got = await step(Tensor(np.arange(4, dtype=np.float32), device="CL"))
        np.testing.assert_array_equal(got.numpy(), 3 * np.arange(4) + 1)
        assert lean[-1] is record
    run_on(library, main)


def test_a_profiled_replay_takes_the_general_path_with_a_span_per_kernel(lean):
    w_np = RNG.standard_normal((16, 8)).astype(np.float32)
    w = Tensor(w_np, device="CL")

    @atensor.jit
    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        h = (x @ w).relu()
        return h * 2, h.sum(axis=1) + x.max()

    for _ in range(6):  # run, capture, verify, a replay that makes the lean record, then lean replays
        step(Tensor(RNG.standard_normal((4, 16)).astype(np.float32), device="CL"))[1].numpy()
    used = len(lean)
    assert used >= 1 and lean[-1].count >= 2
    with atensor.profile() as prof:
        a = RNG.standard_normal((4, 16)).astype(np.float32)
        out, total = step(Tensor(a, device="CL"))
        got = total.numpy()
    h = np.maximum(a @ w_np, 0)
    np.testing.assert_allclose(got, h.sum(axis=1) + a.max(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), h * 2, rtol=1e-5, atol=1e-5)
    assert len(lean) == used  # not the lean path: its one command would be one span
    spans = [s for s in prof.spans if s.kind == "kernel" and s.device == "CL:0"]
    assert len(spans) == lean[-1].count and all(s.start_ns <= s.end_ns for s in spans)


async def test_a_cancelled_await_of_a_replay_leaves_it_running_to_completion(lean):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    y = Tensor.zeros(16, device="CL").contiguous()
    await y.realize()
    for _ in range(6):
        y = await step(y)
    used = len(lean)
    with trio.CancelScope() as scope:
        scope.cancel()
        await step(y)  # submitted, then the await is cancelled
    assert scope.cancelled_caught and len(lean) == used + 1
    y = await step(y)  # the next call's command runs after the cancelled one's, on the same queue
    np.testing.assert_array_equal(y.numpy(), np.full(16, 7, np.float32))
    assert Device.get("CL").compute.statistics()["pending_commands"] == 0


async def _cancelled_call_under_asyncio(step, y: Tensor) -> None:
    """Starts `step(y)` as a task, lets it run to its first suspension (it is submitted by then), and
    cancels it: its await ends, cancelled or done."""
    import asyncio
    import contextlib
    task = asyncio.get_running_loop().create_task(step(y))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_cancelled_asyncio_task_of_a_replay_leaves_it_running_to_completion(lean):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def main() -> None:
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        for _ in range(6):
            y = await step(y)
        used = len(lean)
        await _cancelled_call_under_asyncio(step, y)
        assert len(lean) == used + 1
        y = await step(y)
        np.testing.assert_array_equal(y.numpy(), np.full(16, 7, np.float32))
        assert Device.get("CL").compute.statistics()["pending_commands"] == 0
    run_on("asyncio", main)


def _to_thread(library: str):
    """The running loop's way to run a blocking function on a worker thread."""
    if library == "trio":
        return trio.to_thread.run_sync
    import asyncio
    return asyncio.to_thread


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_deferred_replay_is_published_for_a_thread_that_waits_for_it(library, lean, monkeypatch):
    """A replay submitted on the loop's thread is deferred (its awaiting task publishes it); a thread
    that waits for its value instead (a CPU queue's worker would) gets it published all the same,
    whether it started waiting after the replay was submitted or before. (The direct replay's own poll
    right after it submits, engine/handle.py `finished_here`, is turned off: the replay stays deferred.)"""
    import threading
    from atensor.jit import direct
    monkeypatch.setattr(direct, "finished_here", lambda submission: False)
    # nor is it launched and published by the calling thread (CLQueue.run_here's compiled path)
    monkeypatch.setattr(CLQueue, "_known_short", lambda self, run: False)
    compute = Device.get("CL").compute

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x * 2

    async def main() -> None:
        to_thread = _to_thread(library)
        for k in range(6):
            got = await step(Tensor(np.full(4, k, np.float32), device="CL"))
        np.testing.assert_array_equal(got.numpy(), np.full(4, 10, np.float32))
        assert lean
        # after: the replay is submitted and deferred; the thread's wait hands it over
        handle, _, results = step._replay_now((Tensor(np.full(4, 3, np.float32), device="CL"),))
        value = handle.job.submission.final[compute]
        assert compute.statistics()["deferred"] == 1
        await to_thread(lambda: compute.signal.wait_blocking(value, timeout=20))
        await handle
        np.testing.assert_array_equal(results[0].numpy(), np.full(4, 6, np.float32))
        # before: a thread blocks on the next value first; the replay sees it waiting as it defers
        waited = threading.Event()
        target = compute._reserved + 1

        def wait_next() -> None:
            compute.signal.wait_blocking(target, timeout=20)
            waited.set()
        thread = threading.Thread(target=wait_next)
        thread.start()
        while not compute.signal.has_waiters():
            await to_thread(lambda: waited.wait(0.01))
        handle, _, results = step._replay_now((Tensor(np.full(4, 4, np.float32), device="CL"),))
        await to_thread(lambda: waited.wait(20))
        assert waited.is_set() and compute.statistics()["deferred"] == 0
        thread.join()
        await handle
        np.testing.assert_array_equal(results[0].numpy(), np.full(4, 8, np.float32))
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_awaited_replays_leave_at_most_one_deferred_record_and_none_once_awaited(library, lean):
    compute = Device.get("CL").compute

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def main() -> None:
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        for _ in range(30):
            y = await step(y)
            assert compute.statistics()["deferred"] <= 1
        np.testing.assert_array_equal(y.numpy(), np.full(16, 30, np.float32))
        stats = compute.statistics()
        assert stats["pending_commands"] == 0 and stats["signal"] == stats["reserved"], stats
        assert len(lean) >= 20
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_eager_cl_loop_replays_its_twin_through_the_lean_path(library, lean, monkeypatch):
    """An eager graph on one OpenCL device realized again and again (a schedule-cache template's hits)
    gets a kept-runner twin (engine/program.py), whose plan takes the lean CL replay: each hit binds its
    own input and result buffers, and earlier results keep their values."""
    from atensor.engine import program as program_module
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    compute = Device.get("CL").compute

    async def main() -> None:
        kept = []
        for k in range(12):
            a_np = RNG.standard_normal(24).astype(np.float32)
            before = compute.commands_run
            y = (Tensor(a_np, device="CL") * 3 - 1).relu()  # one kernel
            await y.realize()
            np.testing.assert_allclose(y.numpy(), np.maximum(a_np * 3 - 1, 0), rtol=1e-6)
            kept.append((y, a_np))
            if k >= 8:
                assert compute.commands_run - before <= 2  # the upload and the one replay command
        assert len(lean) >= 4, len(lean)
        for y, a_np in kept:  # each hit wrote its own buffer
            np.testing.assert_allclose(y.numpy(), np.maximum(a_np * 3 - 1, 0), rtol=1e-6)
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_short_replay_is_published_on_the_calling_thread_without_a_handle(library, lean):
    """The direct replay of a CL plan (jit/direct.py) polls its queue as it submits: a short kernel is
    waited for on the calling thread and published there, with its device stamps, so the call returns
    no handle (its await is one checkpoint) and nothing is left deferred; a first launch, whose device
    time the queue does not know yet, still leaves a handle."""
    compute = Device.get("CL").compute

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x * 3 - 1

    async def main() -> None:
        handles = []
        for k in range(14):
            value = compute._reserved + 1
            published = compute.statistics()["host_published"]
            found = step._replay_now((Tensor(np.full(4, k, np.float32), device="CL"),))
            if found is None:  # not a replay yet: the general path
                got = await step(Tensor(np.full(4, k, np.float32), device="CL"))
            else:
                handle, _, results = found
                handles.append(handle)
                if handle is not None:
                    await handle
                else:
                    assert compute.signal.value >= value and compute.signal.stamp(value) is not None
                    assert compute.statistics()["host_published"] == published + 1
                    assert compute.statistics()["deferred"] <= 1
                got = results[0]
            np.testing.assert_array_equal(got.numpy(), np.full(4, 3 * k - 1, np.float32))
        # short once its device time is known (a kernel preempted past SHORT_NS on a loaded machine
        # makes the next call's a handle again): most of the last calls need none
        assert handles[-6:].count(None) >= 4, handles
        stats = compute.statistics()
        assert stats["pending_commands"] == 0 and stats["signal"] == stats["reserved"], stats
    run_on(library, main)
