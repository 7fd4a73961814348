"""A tiny jit replay (engine/plan.py: a few small kernels, idle queues, nothing pending on its
buffers) runs on the calling thread, so its await finds it done. It must compute exactly what the
function computes on every call, whatever changed since the last call: the input values, state
updated in between, work still running on an input, an input of another shape. numpy is the
reference. Run as users run (race checks off)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor
from atensor.hcq.device import Device
from atensor.hcq.queue import Queue
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings


@pytest.fixture
def ran_here(monkeypatch) -> list[str]:
    """The names of the commands run on the planning thread (Queue.run_here, which a one-queue
    replay's one foreign call goes through too, engine/replay.py), in order."""
    names: list[str] = []
    original = Queue.run_here

    def counting(self: Queue, commands: list) -> None:
        names.extend(c.name for c in commands)
        original(self, commands)
    monkeypatch.setattr(Queue, "run_here", counting)
    return names


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_tiny_replay_runs_on_the_calling_thread_and_computes_each_new_input(library, ran_here):
    w_np = np.linspace(-1, 1, 16, dtype=np.float32)
    w = Tensor(w_np)

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x * w + 1).relu()

    async def main() -> None:
        rng = np.random.default_rng(1)
        for k in range(8):
            x_np = rng.standard_normal(16).astype(np.float32)
            before = len(ran_here)
            got = await f(Tensor(x_np))
            np.testing.assert_allclose(got.numpy(), np.maximum(x_np * w_np + 1, 0), rtol=1e-6)
            if k >= 3:  # a replay: its kernel ran here
                assert len(ran_here) > before
        assert f.stats["replays"] == 5
    run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_tiny_replay_chained_on_its_own_result_counts_every_call(library, ran_here):
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    async def main() -> None:
        y = Tensor.zeros(16).contiguous()
        await y.realize()
        replays_here = 0
        for k in range(40):
            before = len(ran_here)
            y = await step(y)
            if k >= 3:  # a replay (calls 1-3 run the function): counted only when its kernel ran here
                replays_here += len(ran_here) > before
        assert y.tolist() == [40.0] * 16
        assert step.stats["replays"] == 37
        assert replays_here == 37  # every replay ran on the calling thread
    run_on(library, main)


async def test_state_assigned_between_tiny_replays_is_read_by_the_next_one():
    acc = Tensor(np.zeros(8, np.float32)).contiguous()
    await acc.realize()

    @atensor.jit
    async def add(x: Tensor) -> Tensor:
        acc.assign(acc + x)
        return acc * 2

    total = np.zeros(8, np.float32)
    for k in range(8):
        x_np = np.full(8, k + 1, np.float32)
        total += x_np
        got = await add(Tensor(x_np))
        np.testing.assert_array_equal(got.numpy(), total * 2)
        if k % 3 == 0:  # a lazy assign of the state outside the function, pending at the next call
            acc.assign(acc - 1)
            total -= 1
    np.testing.assert_array_equal(acc.numpy(), total)
    assert add.stats["replays"] == 5


async def test_a_tiny_replay_waits_for_work_still_running_on_its_input():
    big = Tensor(np.ones((512, 512), np.float32))

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x[:4, :4] * 3

    for _ in range(3):
        await f(big)
    for k in range(4):
        # a matmul chain still running on the input's storage when the replay is issued
        target = Tensor(np.ones((512, 512), np.float32)).contiguous()
        await target.realize()
        target.assign(((target @ big) @ big) / (512.0 * 512.0) * (k + 2))
        target.realize()  # not awaited: pending when f is called
        got = await f(target)
        np.testing.assert_allclose(got.numpy(), np.full((4, 4), 3.0 * (k + 2)), rtol=1e-5)


async def test_an_input_of_another_shape_or_dtype_after_tiny_replays_is_captured_not_replayed():
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x * 2 + 1

    for _ in range(5):
        out = await f(Tensor(np.arange(4, dtype=np.float32)))
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0]
    replays = f.stats["replays"]
    out = await f(Tensor(np.arange(6, dtype=np.float32)))  # a new key: runs the function
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    out = await f(Tensor(np.arange(4, dtype=np.int32)))
    assert out.dtype.name.startswith("int") and out.tolist() == [1, 3, 5, 7]
    out = await f(Tensor(np.arange(4, dtype=np.float32), device="CPU:1"))
    assert out.device == "CPU:1" and out.tolist() == [1.0, 3.0, 5.0, 7.0]
    assert f.stats["replays"] == replays


async def test_a_tiny_replay_on_two_devices_runs_here_in_task_order(ran_here):
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x + 1).to("CPU:1") * 2

    rng = np.random.default_rng(3)
    for k in range(6):
        x_np = rng.standard_normal(8).astype(np.float32)
        got = await f(Tensor(x_np))
        assert got.device == "CPU:1"
        np.testing.assert_allclose(got.numpy(), (x_np + 1) * 2, rtol=1e-6)
    assert Device.get("CPU:1").compute.idle()


def test_the_quick_input_key_is_the_schedule_cache_key_of_the_argument_graph():
    from atensor.jit.jit import _graph_of, _input_key
    from atensor.sched import cache
    base = Tensor(np.arange(24, dtype=np.float32)).contiguous()
    base.realize().wait()
    for t in (base, base.reshape(4, 6), base.reshape(4, 6).permute(1, 0), base[3:9], base.cast("float16"),
              base.reshape(2, 12) + 1):
        graph = _graph_of(t.node)
        assert _input_key(graph) == cache.graph_key(graph).key
    assert _input_key(_graph_of(base.reshape(4, 6).node)) != _input_key(_graph_of(base.reshape(6, 4).node))


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_tiny_replays_right_after_a_worker_ran_replay_keep_the_queue_order_and_values(library):
    """A replay the queue's worker runs from its doorbell ring, seen finished by the awaiting host
    (which publishes its value, Queue.poll), then tiny replays on the same queue run on the calling
    thread before the worker has stamped the first: the worker's late publish must not lower the
    signal or fail, and every value is what numpy gives."""
    @atensor.jit
    async def big(x: Tensor) -> Tensor:
        return x + 1

    @atensor.jit
    async def tiny(x: Tensor) -> Tensor:
        return x * 2

    async def main() -> None:
        b = Tensor.zeros(1 << 16).contiguous()
        t = Tensor.ones(4).contiguous()
        await b.realize()
        await t.realize()
        rounds = 150
        for k in range(rounds):
            b = await big(b)
            t = await tiny(t) if k % 20 else Tensor.ones(4).contiguous()  # restart before it overflows
            if k % 20 == 0:
                await t.realize()
        assert b.numpy()[[0, -1]].tolist() == [float(rounds)] * 2
        assert t.tolist() == [2.0 ** ((rounds - 1) % 20)] * 4
        queue = Device.get("CPU:0").compute
        assert queue.signal.value == queue._reserved and queue._thread.is_alive()

    if library == "trio":
        async def bounded() -> None:
            with trio.fail_after(60):
                await main()
        trio.run(bounded)
    else:
        async def bounded_asyncio() -> None:
            await asyncio.wait_for(main(), 60)
        asyncio.run(bounded_asyncio())


async def test_a_replay_of_one_task_on_a_null_device_runs_whether_tiny_or_not():
    """A NULL device's task has no runner: neither a tiny replay run here nor a one-task replay that
    could start a net command here may ask the missing runner anything (it raised AttributeError)."""
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x + 1

    for size in (16, 1 << 16):  # a tiny plan, and one over INLINE_MAX_BYTES
        y = Tensor.zeros(size, device="NULL").contiguous()
        await y.realize()
        for _ in range(6):
            y = await step(y)
        assert y.shape == (size,) and y.device.startswith("NULL")
    assert step.stats["replays"] == 6
