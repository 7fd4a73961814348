"""Native programs (backend/c/programs.py `Program`, engine/plan.py): a jit replay whose tasks are all native
runs as one command per queue, the queues handing work to each other through C timelines; runners of
swapped buffers are rewritten in place between replays."""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor, ledger, nn
from atensor.backend.c import compiler, programs
from atensor.hcq.device import Device
from atensor.nn import optim

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler on this machine: the "
                                "native tier is off and replays run numpy kernels one command each")

DEVICES = ("CPU:0", "CPU:1")


def _commands_run() -> dict[str, int]:
    counts = {}
    for name in DEVICES:
        device = Device.get(name)
        for queue in (device.compute, device.copy):
            counts[repr(queue)] = queue.commands_run
    return counts


def _rows(x: np.ndarray) -> Tensor:
    parts = np.array_split(x, len(DEVICES))
    return Tensor.from_shards([Tensor(p, device=d) for p, d in zip(parts, DEVICES)], axis=0)


async def _train(mode: str, steps: int, split_inside: bool = False
                 ) -> tuple[list[float], list[np.ndarray], list[dict[str, int]]]:
    """A data-parallel MLP step on two devices (the flagship's shape, smaller), jitted; the losses, the
    final weights, and how many commands each queue ran in each replay. The batch comes sharded, or
    (`split_inside`) on CPU:0 and the step shards it (copies from an input, made by no task)."""
    rng = np.random.default_rng(1)
    x_np = rng.random((64, 16), dtype=np.float32)
    y_np = rng.integers(0, 4, size=64).astype(np.int32)
    with atensor.Context(native=mode):
        Tensor.manual_seed(5)
        net = [nn.Linear(16, 32), nn.Linear(32, 4)]
        params = nn.get_parameters(net)
        for p in params:
            p.shard_(DEVICES)
        opt = optim.Adam(params, lr=1e-2, fused=True)

        @atensor.jit
        async def step(x: Tensor, y: Tensor) -> Tensor:
            if split_inside:
                x, y = x.shard(DEVICES, axis=0), y.shard(DEVICES, axis=0)
            loss = nn.cross_entropy(net[1](net[0](x).relu()), y, reduction="sum") / 64
            opt.zero_grad()
            loss.backward()
            await opt.step(loss)
            return loss

        losses, per_replay = [], []
        with Tensor.train():
            for i in range(steps):
                before = _commands_run()
                x, y = (Tensor(x_np, device=DEVICES[0]), Tensor(y_np, device=DEVICES[0])) if split_inside \
                    else (_rows(x_np), _rows(y_np))
                losses.append((await step(x, y)).item())
                await Tensor.realize(*params)
                after = _commands_run()
                per_replay.append({q: after[q] - before[q] for q in after})
        return losses, [p.numpy() for p in params], per_replay


@pytest.mark.parametrize("split_inside", [False, True])
async def test_a_two_device_jitted_step_is_one_program_per_compute_queue_and_matches_numpy_kernels(split_inside):
    losses, weights, per_replay = await _train("jit", 8, split_inside)
    ref_losses, ref_weights, ref_per_replay = await _train("0", 8, split_inside)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for w, r in zip(weights, ref_weights):
        np.testing.assert_allclose(w, r, rtol=1e-4, atol=1e-6)
    assert losses[-1] < losses[0]
    # replays (calls 4 on): each compute queue runs one command, the copies included (the allreduce's
    # run on the queue that produced their data, the batch's on the destination's); copy queues idle
    for counts in per_replay[3:]:
        assert counts == {"Queue(CPU:0/compute)": 1, "Queue(CPU:1/compute)": 1,
                          "Queue(CPU:0/copy)": 0, "Queue(CPU:1/copy)": 0}, counts
    # on numpy kernels each task is a command of its own
    assert all(sum(c.values()) > 8 for c in ref_per_replay[3:])


async def test_replays_with_new_inputs_read_them_and_leave_earlier_results_alone():
    """Runners of swapped buffers are rewritten in place: each replay reads its own inputs and writes
    fresh results, so results kept from earlier calls keep their values."""
    rng = np.random.default_rng(2)
    w_np = rng.standard_normal((8, 5)).astype(np.float32)
    w = Tensor(w_np).shard(DEVICES)

    @atensor.jit
    async def f(x: Tensor) -> tuple[Tensor, Tensor]:
        h = (x @ w).relu()
        return h.sum(axis=0), h * 2 + x.sum(axis=1, keepdim=True)

    inputs = [rng.standard_normal((6, 8)).astype(np.float32) for _ in range(7)]
    results = []
    with atensor.Context(native="jit"):
        for x_np in inputs:
            results.append(await f(_rows(x_np)))
    for x_np, (total, rows) in zip(inputs, results):
        h = np.maximum(x_np @ w_np, 0)
        np.testing.assert_allclose(total.numpy(), h.sum(axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rows.numpy(), h * 2 + x_np.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


async def test_concurrent_replays_of_one_function_each_get_their_own_values():
    """Replays submitted while an earlier one still runs get runners of their own (the earlier one's
    argument blocks are not rewritten under it)."""
    rng = np.random.default_rng(3)

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return ((x * 3).exp() + x.sum(axis=0)).sum(axis=1)

    for _ in range(3):  # captured and compiled
        await f(_rows(np.ones((4, 4), np.float32)))
    got: dict[int, list] = {}

    async def caller(k: int) -> None:
        got[k] = []
        for i in range(6):
            x_np = (rng.standard_normal((4, 4)) * 0.3).astype(np.float32)
            got[k].append((x_np, await f(_rows(x_np))))

    with atensor.Context(native="jit"):
        async with trio.open_nursery() as nursery:
            for k in range(4):
                nursery.start_soon(caller, k)
    for pairs in got.values():
        for x_np, y in pairs:
            np.testing.assert_allclose(y.numpy(), (np.exp(x_np * 3) + x_np.sum(axis=0)).sum(axis=1), rtol=1e-5)


def test_a_program_waits_on_a_c_timeline_until_another_program_publishes():
    """The primitive: program A waits for timeline value 1 of a queue, then copies; program B copies
    and publishes 1. A, started first on a thread, sleeps until B runs, then sees B's data."""
    with atensor.Context(native="all"):
        Tensor([1.0]).exp().tolist()  # a kernel compiled: the library with the program runner is loaded
    assert programs.programs_available()
    src = np.arange(1000, dtype=np.float64)
    mid, dst = np.zeros_like(src), np.zeros_like(src)

    def addr(a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]
    slot = programs.timeline_slot(object())
    assert slot is not None
    first = programs.native_copy(addr(mid), addr(src), src.nbytes)
    second = programs.native_copy(addr(dst), addr(mid), src.nbytes)
    bases = (ctypes.c_uint64 * 1)(0)
    a = programs.Program([(programs.WAIT, slot, 0, 1), (programs.RUN, 0, 0, 0)], [None, second]).bind(bases)
    b = programs.Program([(programs.RUN, 0, 0, 0), (programs.PUBLISH, slot, 0, 1)], [first, None]).bind(bases)
    waiter = threading.Thread(target=a.fn)
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive() and not dst.any()  # still waiting: B has not published
    b.fn()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    np.testing.assert_array_equal(dst, src)


async def test_a_buffer_every_replay_writes_counts_as_pending_until_the_replay_is_done():
    """Buffers a replay touches every time follow the plan's clock (hcq/buffer.py) instead of being
    told each replay's values: a reader on another thread must still see the replay in flight, wait
    for it, and read the value it wrote."""
    from atensor.hcq.buffer import Buffer
    from atensor.tensor.tensor import _storage_base
    rng = np.random.default_rng(6)
    a = Tensor((rng.standard_normal((256, 256)) * 0.02).astype(np.float32))
    w = Tensor(np.zeros((256, 256), np.float32))

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        h = x
        for _ in range(24):  # milliseconds of products: the replay is in flight for a while
            h = (h @ x).relu() + x
        w.assign(w + h)
        await w.realize()  # captured with the step (a lazy assign left pending would not be)
        return h.sum()

    def read_in_flight(before: np.ndarray) -> tuple[bool, np.ndarray]:
        buf = Buffer.of(_storage_base(w.node).arg[0])
        deadline = time.monotonic() + 5
        while not buf.pending_writes():
            if time.monotonic() > deadline:
                return False, before
            time.sleep(0.0001)
        return True, w.numpy()  # not ready: realizes, which waits for the replay's write

    # one BLAS thread: the replay's kernels run as native programs
    with atensor.Context(native="jit", blas_threads=1):
        await Tensor.realize(a, w)
        for _ in range(3):  # captured, verified, compiled
            await step(a)
        caught = 0
        for _ in range(5):
            await w.realize()
            before = w.numpy()
            seen: dict = {}
            # a plain thread: Tensor.numpy() there is a blocking read, as in a script's other thread
            reader = threading.Thread(target=lambda: seen.update(value=read_in_flight(before)))
            reader.start()
            await step(a)
            await trio.to_thread.run_sync(reader.join)
            in_flight, value = seen["value"]
            await w.realize()
            after = w.numpy()
            assert not np.array_equal(after, before)
            if in_flight:
                caught += 1
                np.testing.assert_array_equal(value, after)  # it waited for the replay's write
        assert caught > 0, "no replay was ever seen in flight"
        plans = [p for prog in step._programs.values() for r in prog.records for p in (r.plans.get(True),) if p]
        assert any(p.clock is not None for p in plans)  # w's update ran as native programs: w followed a clock


async def test_every_address_a_replayed_program_uses_belongs_to_a_buffer_the_plan_keeps_alive():
    """Runners rebound by address slots (engine/patching.py) no longer keep their buffers alive; the plan
    does (`AddressSlots.bound`), so a replay whose caller is cancelled, and drops its result, cannot
    have that memory handed to another tensor while its programs still write it. Checked after fast
    replays and after replays planned while another ran (runners of their own: the slow path)."""
    rng = np.random.default_rng(7)
    a = Tensor((rng.standard_normal((256, 256)) * 0.02).astype(np.float32))

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        h = x
        for _ in range(24):  # milliseconds of products: the next replay is planned while this one runs
            h = (h @ a).relu() + x
        return h.sum(axis=0)

    def check(plan) -> None:
        kept = {}
        for spec in plan.slots.bound:
            buf = ledger.runtime(spec)
            kept[buf.address()] = spec
        for swapped, places in zip(plan.swapped, plan.slots.slots):
            for block, k, offset in places:
                assert block[k] - offset in kept, f"a block points at a buffer nobody keeps ({swapped})"

    with atensor.Context(native="jit", blas_threads=1):
        await a.realize()
        for _ in range(4):  # captured, verified, compiled, lowered
            await f(Tensor(rng.standard_normal((64, 256)).astype(np.float32)))
        plan = next(iter(f._programs.values())).records[0].plans.get(True)
        for _ in range(3):
            await f(Tensor(rng.standard_normal((64, 256)).astype(np.float32)))  # fast path
            check(plan)
        async with trio.open_nursery() as nursery:  # overlapping replays: runners of their own
            for _ in range(4):
                nursery.start_soon(f, Tensor(rng.standard_normal((64, 256)).astype(np.float32)))
        check(plan)
