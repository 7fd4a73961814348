"""The queue and signal model on OpenCL queues: waits between CL queues are event wait lists, waits
on CPU queues are user events the host sets, values are published by each queue's completion thread
and wake awaiting tasks under trio and asyncio (or by the awaiting host, for a short command); task
graphs that mix CPU and CL devices, copies both ways, sharding and allreduce over CL:0 and CL:1, the
profiler's device stamps, jit replays."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor
from atensor.backend.runner import Runner
from atensor.hcq.device import Device
from atensor.hcq.queue import Command, DependencyFailed, KernelError, Queue
from atensor.hcq.signal import SignalFailed
from tests.opencl.conftest import two_devices

RNG = np.random.default_rng(1)
needs_two = pytest.mark.skipif(not two_devices(), reason="needs CL:1 (pocl: POCL_DEVICES='pthread pthread')")


def _marker_runner(log: list, name: str) -> Runner:
    """A device command that only marks its place (its completion is its value)."""
    import pyopencl as cl

    def enqueue(queue, wait_for):
        log.append((name, len(wait_for)))
        event = cl.enqueue_marker(queue, wait_for=wait_for or None)
        return event, event
    return Runner(lambda: None, enqueue=enqueue)


def test_a_wait_on_another_cl_queue_is_an_event_and_a_wait_on_a_cpu_queue_a_user_event_the_host_sets():
    dev = Device.get("CL")
    cpu = Queue("CPU:0", "test")  # a CPU queue of our own, so its values are ours to publish
    compute, copy = dev.compute, dev.copy
    log: list = []
    gate = threading.Event()
    base_cpu, base_copy, base_compute = cpu.reserve(1), copy.reserve(1), compute.reserve(1)
    cpu.submit([Command(base_cpu + 1, (), Runner(gate.wait), "gate", "kernel", 0)])
    copy.submit([Command(base_copy + 1, ((cpu.signal, base_cpu + 1, True),), _marker_runner(log, "copy"),
                         "after cpu", "copy", 1)])
    compute.submit([Command(base_compute + 1, ((copy.signal, base_copy + 1, True),),
                            _marker_runner(log, "compute"), "after copy", "kernel", 2)])
    assert compute._record(base_compute + 1).deps == [copy._record(base_copy + 1)]  # an event, no host hop
    assert len(copy._record(base_copy + 1).user_events) == 1
    time.sleep(0.05)
    assert compute.signal.value < base_compute + 1 and copy.signal.value < base_copy + 1  # held by the gate
    gate.set()
    compute.signal.wait_blocking(base_compute + 1, timeout=30)
    copy.signal.wait_blocking(base_copy + 1, timeout=30)  # its callback may come after the compute's
    assert log == [("copy", 1), ("compute", 1)]
    start, end = compute.signal.stamp(base_compute + 1)
    assert 0 < start <= end <= time.perf_counter_ns()


def test_a_failed_cpu_input_fails_the_cl_commands_after_it_and_every_value_is_published():
    dev = Device.get("CL")
    cpu = Queue("CPU:0", "test-fail")

    def boom():
        raise ValueError("the input broke")
    base_cpu, base_copy, base_compute = cpu.reserve(1), dev.copy.reserve(1), dev.compute.reserve(1)
    copy_value, compute_value = base_copy + 1, base_compute + 1
    dev.copy.submit([Command(copy_value, ((cpu.signal, base_cpu + 1, True),), _marker_runner([], "c"),
                             "copy in", "copy", 1)])
    dev.compute.submit([Command(compute_value, ((dev.copy.signal, copy_value, True),),
                                _marker_runner([], "k"), "use it", "kernel", 2)])
    cpu.submit([Command(base_cpu + 1, (), Runner(boom), "input", "kernel", 0)])
    with pytest.raises(SignalFailed) as failed:
        dev.compute.signal.wait_blocking(compute_value, timeout=30)
    assert isinstance(failed.value.cause, DependencyFailed)
    assert "the input broke" in str(failed.value)
    dev.copy.signal.wait_blocking(copy_value, check=False, timeout=30)  # its callback may come second
    assert isinstance(dev.copy.signal.failure(copy_value), DependencyFailed)


def test_a_command_that_cannot_be_enqueued_publishes_its_value_failed():
    dev = Device.get("CL")

    def enqueue(queue, wait_for):
        raise RuntimeError("no such kernel")
    value = dev.compute.reserve(1) + 1
    dev.compute.submit([Command(value, (), Runner(lambda: None, enqueue=enqueue), "bad", "kernel", 0)])
    with pytest.raises(SignalFailed, match="could not be enqueued.*no such kernel") as failed:
        dev.compute.signal.wait_blocking(value, timeout=30)
    assert isinstance(failed.value.cause, KernelError)


async def _mixed_graph():
    a, b = RNG.standard_normal((32, 48)).astype(np.float32), RNG.standard_normal((48, 16)).astype(np.float32)
    x = Tensor(a, device="CL")
    y = Tensor(b, device="CPU")
    z = (x * 2).to("CPU") @ y + 1                  # CL kernel -> copy to CPU -> CPU kernel
    w = (z.to("CL") - x[:, :16]).relu().sum(axis=0)  # CPU -> copy to CL -> CL kernels
    await w.realize()
    return w.numpy(), np.maximum((a * 2) @ b + 1 - a[:, :16], 0).sum(axis=0)


def test_a_graph_mixing_cpu_and_cl_devices_awaited_under_trio():
    got, want = trio.run(_mixed_graph)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_graph_mixing_cpu_and_cl_devices_awaited_under_asyncio():
    got, want = asyncio.run(_mixed_graph())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_awaiting_task_is_woken_by_the_completion_thread_while_the_loop_runs_other_tasks(monkeypatch):
    import pyopencl as cl
    from atensor.hcq.cl_queue import CLQueue
    # the awaiting host never publishes a value itself (`poll`): it parks, and the completion thread wakes it
    monkeypatch.setattr(CLQueue, "poll", lambda self, value: self.signal.value >= value)
    dev = Device.get("CL")

    async def main(lib):
        x = Tensor(RNG.standard_normal((64, 64)).astype(np.float32) * 0.1, device="CL")
        await x.realize()
        ticks = 0
        done = False
        # a command ahead of the matmul on the in-order queue that the ticker lets go, once it has run
        gate = cl.UserEvent(dev.cl.context)

        def enqueue(queue, wait_for):
            event = cl.enqueue_marker(queue, wait_for=[gate] + list(wait_for))
            return event, event
        dev.compute.submit([Command(dev.compute.reserve(1) + 1, (), Runner(lambda: None, enqueue=enqueue),
                                    "gate", "kernel", 0)])

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                if ticks == 1:
                    gate.set_status(cl.command_execution_status.COMPLETE)
                await (trio.sleep(0.001) if lib == "trio" else asyncio.sleep(0.001))
        y = x @ x  # the 64 x 64 tiled matmul test_cl_ops compiles too
        if lib == "trio":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                await y.realize()
                done = True
        else:
            task = asyncio.create_task(ticker())
            await y.realize()
            done = True
            await task
        return ticks, x, y
    for lib, run in (("trio", trio.run), ("asyncio", lambda f, lib: asyncio.run(f(lib)))):
        ticks, x, y = run(main, lib)
        assert ticks >= 1  # the loop ran another task while the device waited
        np.testing.assert_allclose(y.numpy(), x.numpy() @ x.numpy(), rtol=1e-5, atol=1e-6)
        assert dev.compute.signal.value == dev.compute._reserved
        assert dev.compute.statistics()["pending_commands"] == 0


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_host_memory_of_a_non_blocking_upload_stays_alive_until_the_copy_is_done():
    import gc
    for _ in range(3):
        a = RNG.standard_normal(1 << 18).astype(np.float32)
        t = Tensor(a).to("CL") * 1
        del a
        gc.collect()
        back = t.numpy()
        assert back.shape == (1 << 18,) and np.isfinite(back).all()
    src = np.arange(1 << 16, dtype=np.float32)
    np.testing.assert_array_equal((Tensor(src).to("CL") + 0).numpy(), src)


@needs_two
def test_copies_between_cl_devices_and_a_sharded_allreduce_over_cl0_and_cl1():
    a = RNG.standard_normal((8, 6)).astype(np.float32)
    on0 = Tensor(a, device="CL:0")
    np.testing.assert_array_equal(on0.to("CL:1").numpy(), a)
    parts = [Tensor(a * (k + 1), device=f"CL:{k}") for k in range(2)]
    total = Tensor.allreduce(parts, "sum")
    np.testing.assert_allclose(total.shards[1].numpy(), a * 3, rtol=1e-6)
    sharded = Tensor(a).shard(("CL:0", "CL:1"), axis=0)
    np.testing.assert_allclose((sharded * 2).sum(axis=1).numpy(), (a * 2).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_cl_commands_appear_on_their_device_tracks_with_device_stamps_on_the_host_clock():
    x = Tensor(RNG.standard_normal((64, 64)).astype(np.float32), device="CL")
    x.numpy()
    before = time.perf_counter_ns()
    with atensor.profile() as prof:
        y = ((x @ x).relu() + 1).to("CPU") * 2
        y.numpy()
    after = time.perf_counter_ns()
    spans = [s for s in prof.spans if s.device == "CL:0"]
    assert {s.queue for s in spans} == {"compute"} and any(s.kind == "kernel" for s in spans)
    offset = prof.clock_offsets[("CL:0", "compute")]
    assert offset == Device.get("CL").cl.clock_offset
    for s in spans:  # device stamps, put on the host clock by the queue's offset, inside the block
        assert before - 5_000_000 <= s.start_ns + offset <= s.end_ns + offset <= after + 5_000_000
    cpu = [s for s in prof.spans if s.device == "CPU:0"]
    assert any(set(s.deps) & {c.task_id for c in spans} for s in cpu)  # the arrow from CL to CPU work


def test_a_convolution_on_cl_is_named_as_on_cpu():
    img = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    names = {}
    for device in ("CPU", "CL"):
        x, k = Tensor(img, device=device), Tensor(w, device=device)
        Tensor.realize(x, k).wait()
        with atensor.profile() as prof:
            x.conv2d(k, padding=1).realize().wait()
        names[device] = [s.name for s in prof.spans if s.kind == "kernel"]
    assert names["CL"] == names["CPU"] == ["conv2d 1x1x3x2x3x3x6x6"]


def test_a_jit_replay_on_cl_rebinds_its_inputs_and_gives_each_calls_values():
    w = Tensor(RNG.standard_normal((16, 8)).astype(np.float32), device="CL")

    @atensor.jit
    def step(x):
        return ((x @ w).relu() * 2).sum(axis=1)
    for k in range(5):
        a = RNG.standard_normal((4, 16)).astype(np.float32)
        np.testing.assert_allclose(step(Tensor(a, device="CL")).numpy(),
                                   (np.maximum(a @ w.numpy(), 0) * 2).sum(axis=1), rtol=1e-5, atol=1e-5)
    assert step.stats["replays"] >= 2  # the last calls replayed the captured CL kernels


def test_a_host_kernel_that_raises_fails_its_value_and_the_queue_goes_on():
    from atensor.graph.node import BufferSpec
    from atensor.dtype import dtypes
    from atensor.engine import lower_cl
    dev = Device.get("CL")
    spec = BufferSpec("CL:0", 4, dtypes.float32)
    dev.allocate(spec)

    class Work:  # the fields host_kernel_runner reads, with a kernel that raises
        ast, name, var_vals, buffers = None, "broken", {}, (spec,)
    import atensor.engine.lower_cl as module
    original = module.compile_kernel, module._stored_param
    module.compile_kernel = lambda ast, name: (lambda *arrays: 1 / 0)
    module._stored_param = lambda ast: 0
    try:
        runner = lower_cl.host_kernel_runner(Work, dev, [dev.allocate(spec)])
    finally:
        module.compile_kernel, module._stored_param = original
    value = dev.compute.reserve(2) + 1
    dev.compute.submit([Command(value, (), runner, "broken", "kernel", 0),
                        Command(value + 1, (), _marker_runner([], "after"), "after", "kernel", 1)])
    with pytest.raises(SignalFailed, match="ZeroDivisionError"):
        dev.compute.signal.wait_blocking(value, timeout=30)
    dev.compute.signal.wait_blocking(value + 1, timeout=30)  # the next command still runs


def test_a_jit_replay_on_cl_rebinds_a_bound_variable_each_call():
    from atensor.graph.symbolic import Variable
    pos_var = Variable("start_pos", 0, 15)
    cache = Tensor(np.zeros((16, 4), np.float32), device="CL")
    w_np = np.arange(16, dtype=np.float32).reshape(4, 4)
    w = Tensor(w_np, device="CL")

    @atensor.jit
    def step(x, mask, pos):
        cache.shrink(((pos, pos + 1), None)).assign(x @ w)  # a write at a variable row: a kernel argument
        return (cache * mask.reshape(16, 1)).sum(0)
    ref = np.zeros((16, 4), np.float32)
    for p in [0, 1, 2, 3, 7, 5]:
        x = np.full((1, 4), p + 1, np.float32)
        mask = (np.arange(16) <= p).astype(np.float32)
        out = step(Tensor(x, device="CL"), Tensor(mask, device="CL"), pos_var.bind(p)).numpy()
        ref[p] = x @ w_np
        np.testing.assert_allclose(out, (ref * mask[:, None]).sum(0))
    np.testing.assert_allclose(cache.numpy(), ref)
    assert step.stats["replays"] == 3


def test_an_awaited_replay_of_a_short_kernel_is_published_by_the_awaiting_host_in_order_with_stamps():
    @atensor.jit
    async def step(x):
        return x + 1

    async def main():
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        for _ in range(20):
            y = await step(y)
        return y
    compute = Device.get("CL").compute
    for run in (trio.run, asyncio.run):
        before = compute.host_published
        y = run(main) if run is trio.run else run(main())
        np.testing.assert_array_equal(y.numpy(), np.full(16, 20, np.float32))
        # the warm replays' kernel was done, or short (its last device time), when the host looked:
        # the host published it, no thread hop or loop wake-up
        assert compute.host_published > before, compute.statistics()
        start, end = compute.signal.stamp(compute.signal.value)  # published with the device's stamps
        assert 0 < start <= end <= time.perf_counter_ns()
        assert compute.statistics()["pending_commands"] == 0


@pytest.mark.default_settings  # as users run: small realizes planned inline, not proved by the race check
def test_an_awaited_eager_realize_on_cl_is_published_by_the_awaiting_host():
    async def main():
        y = Tensor.zeros(16, device="CL").contiguous()
        await y.realize()
        for _ in range(20):
            y = y + 1
            await y.realize()  # its output's pending write is the queue's own value: the host polls it
        return y
    compute = Device.get("CL").compute
    for run in (trio.run, asyncio.run):
        before = compute.host_published
        y = run(main) if run is trio.run else run(main())
        np.testing.assert_array_equal(y.numpy(), np.full(16, 20, np.float32))
        assert compute.host_published >= before + 10, compute.statistics()


def test_the_host_waits_for_a_short_command_on_its_own_thread_and_not_for_a_long_or_cold_one():
    import pyopencl as cl
    from atensor.hcq import cl_queue
    dev = Device.get("CL")
    compute = dev.compute
    gate = cl.UserEvent(dev.cl.context)  # inside the runner: the queue cannot tell it from device work

    def enqueue(queue, wait_for):
        event = cl.enqueue_marker(queue, wait_for=[gate] + list(wait_for))
        return event, event
    runner = Runner(lambda: None, enqueue=enqueue, device_key=("test", "gated marker"))
    value = compute.reserve(1) + 1
    compute.submit([Command(value, (), runner, "gated", "kernel", 0)])
    assert not compute.poll(value)  # never ran: it may be long (a first launch compiles), not waited for
    compute._last_ns[runner.device_key] = cl_queue.SHORT_NS + 1
    assert not compute.poll(value)  # long at its last run: not waited for
    compute._last_ns[runner.device_key] = 1_000
    threading.Timer(0.05, lambda: gate.set_status(cl.command_execution_status.COMPLETE)).start()
    waited, start = compute.host_waited, time.perf_counter()
    assert compute.poll(value)  # short: this thread waited for its event, then published it
    assert time.perf_counter() - start >= 0.04 and compute.host_waited == waited + 1
    assert compute.signal.value == value and compute.signal.stamp(value) is not None


def test_a_jit_replay_on_cl_sets_only_the_kernel_arguments_whose_buffers_changed():
    from atensor.engine import lower_cl
    w_np = np.arange(16, dtype=np.float32)
    w = Tensor(w_np, device="CL")
    acc = Tensor(np.zeros(16, np.float32), device="CL")

    @atensor.jit
    def accumulate(x):  # every buffer the same on each call: the kept runner's arguments are set once
        acc.assign(acc + x * w)
        return acc

    @atensor.jit
    def scale(x):  # a new result buffer per call, the input changed or not (its memory may be a dead
        return x * w + 1  # result's, from the device's pool, which a kernel set holds already)
    x_np = RNG.standard_normal(16).astype(np.float32)
    x = Tensor(x_np, device="CL")
    for k in range(5):
        before = lower_cl.args_set
        np.testing.assert_allclose(accumulate(x).numpy(), (k + 1) * x_np * w_np, rtol=1e-6)
        if accumulate.stats["replays"]:
            assert lower_cl.args_set == before, "a replay with unchanged buffers set kernel arguments"
    assert accumulate.stats["replays"] >= 2
    for k in range(6):
        before = lower_cl.args_set
        new = k >= 4  # the last calls pass another input: its argument is set, with the new result's
        a = RNG.standard_normal(16).astype(np.float32) if new else x_np
        np.testing.assert_allclose(scale(Tensor(a, device="CL") if new else x).numpy(), a * w_np + 1, rtol=1e-6)
        if scale.stats["replays"]:  # w is never set again; a new input always is; the result may be
            assert (1 if new else 0) <= lower_cl.args_set - before <= (2 if new else 1)
    assert scale.stats["replays"] >= 2


def test_a_cl_replay_submitted_while_the_last_one_is_in_flight_gets_its_own_arguments(monkeypatch):
    import pyopencl as cl
    from atensor.engine import lower_cl
    dev = Device.get("CL")
    made = []
    original = lower_cl.kernel_runner
    monkeypatch.setattr(lower_cl, "kernel_runner", lambda *args: made.append(1) or original(*args))
    w_np = RNG.standard_normal(16).astype(np.float32)
    w = Tensor(w_np, device="CL")

    @atensor.jit
    async def scale(x):
        return x * w + 1

    async def main():
        for _ in range(5):  # captured, verified, replayed twice: the kept runner is made and rebound
            await scale(Tensor(w_np, device="CL"))
        gate = cl.UserEvent(dev.cl.context)  # holds the compute queue: both replays queue behind it

        def enqueue(queue, wait_for):
            event = cl.enqueue_marker(queue, wait_for=[gate] + list(wait_for))
            return event, event
        value = dev.compute.reserve(1) + 1
        dev.compute.submit([Command(value, (), Runner(lambda: None, enqueue=enqueue), "gate", "kernel", 0)])
        inputs = [RNG.standard_normal(16).astype(np.float32) for _ in range(2)]
        results = [None, None]
        replays = scale.stats["replays"]
        made.clear()

        async def call(k):
            results[k] = await scale(Tensor(inputs[k], device="CL"))
        async with trio.open_nursery() as nursery:
            for k in range(2):
                nursery.start_soon(call, k)
            await trio.sleep(0.05)  # both submitted, neither can run
            assert all(r is None for r in results)
            gate.set_status(cl.command_execution_status.COMPLETE)
        # (each replay's arguments may be held by a kernel set already: pooled memories recur)
        assert scale.stats["replays"] == replays + 2
        assert len(made) == 1  # the first replay rebound the kept runner; the second got a fresh one
        for k in range(2):  # the second replay's runner was made afresh, the first's arguments untouched
            np.testing.assert_allclose(results[k].numpy(), inputs[k] * w_np + 1, rtol=1e-6)
    trio.run(main)


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_the_shared_kernel_objects_keep_no_buffer_alive_and_set_a_new_buffer_again():
    import gc
    import weakref
    from atensor.engine import lower_cl
    x_np = RNG.standard_normal(16).astype(np.float32)
    Device.get("CL").empty_cache()  # x's memory made for it, not a dead buffer's that a kept runner names
    x = Tensor(x_np, device="CL")
    np.testing.assert_allclose((x * 3).numpy(), x_np * 3, rtol=1e-6)
    memory = weakref.ref(x._stored_buffer().memory)
    del x
    deadline = time.monotonic() + 10  # the completion thread lets go of its last command as it takes it
    while memory() is not None and time.monotonic() < deadline:
        gc.collect()
        Device.get("CL").empty_cache()  # the device's pool keeps a dead buffer's memory for reuse
        time.sleep(0.01)
    assert memory() is None  # the kernel objects held its argument by a weak reference only
    before = lower_cl.args_set
    y = Tensor(x_np + 1, device="CL")  # the same program with a new input: its arguments are set again
    np.testing.assert_allclose((y * 3).numpy(), (x_np + 1) * 3, rtol=1e-6)
    assert lower_cl.args_set - before >= 2
