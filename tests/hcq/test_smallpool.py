"""Recycled small-buffer memory (hcq/smallpool.py): a dead buffer's memory is handed to the next
buffer of its size and dtype, and never while anything can still read it."""
from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest
import trio

import atensor
from atensor import Device, Tensor
from atensor.hcq.smallpool import SmallPool


def _address(t: Tensor) -> int:
    return t._ensure_ready("test").address()


def test_a_given_entry_is_taken_again_and_the_pool_keeps_at_most_its_bound():
    pool = SmallPool()
    first = pool.take(64, np.dtype(np.float32))
    assert first[1].shape == (16,) and first[1].dtype == np.float32
    assert first[2] == first[1].__array_interface__["data"][0]
    pool.give(first)
    assert pool.take(64, np.dtype(np.int32))[2] != first[2]  # another dtype: other memory
    assert pool.take(64, np.dtype(np.float32)) is first
    assert pool.take(64, np.dtype(np.float32)) is not first  # taken once: fresh memory now
    small = SmallPool(keep_bytes=128)
    for _ in range(5):
        small.give(small.take(64, np.dtype(np.float32)))  # one memory, given and taken again
    entries = [small.take(64, np.dtype(np.float32)) for _ in range(3)]
    for entry in entries:
        small.give(entry)
    assert small.statistics() == {"entries": 2, "kept_bytes": 128}  # the third was freed


@pytest.mark.parametrize("library", ["trio", "asyncio"])
@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_live_results_of_jit_calls_never_share_memory_and_dead_ones_are_recycled(library):
    """Every live result of a replayed jit call has memory of its own and the value numpy computes;
    once the results die, later results take their memory (so the check above is of recycled memory)."""
    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return x * 2 + 1

    async def main():
        base = np.arange(16, dtype=np.float32)
        x = Tensor(base).contiguous()
        await x.realize()
        for _ in range(6):  # captured, verified, compiled: replays from here on
            await step(x)
        dead = set()
        for _ in range(12):
            y = await step(x)
            dead.add(_address(y))
            del y
        gc.collect()
        kept = []
        for k in range(24):
            y = await step(x)
            kept.append(y)
            if k % 3 == 0:  # a result read as the next call's input, then dropped later
                z = await step(y)
                kept.append(z)
        addresses = [_address(t) for t in kept]
        assert len(set(addresses)) == len(addresses), "a live result's memory was handed out again"
        assert dead & set(addresses), "no result took a dead result's memory"
        once, twice = base * 2 + 1, (base * 2 + 1) * 2 + 1
        for t in kept:
            values = t.numpy()
            assert np.array_equal(values, once) or np.array_equal(values, twice)
        assert sum(np.array_equal(t.numpy(), twice) for t in kept) == 8
    trio.run(main) if library == "trio" else asyncio.run(main())


def test_eager_results_kept_alive_keep_their_values_while_dropped_ones_are_recycled():
    dev = Device.get("CPU:0")
    x = Tensor(np.linspace(0, 1, 16, dtype=np.float32)).contiguous()
    x.realize().wait()
    kept = []
    for k in range(40):
        y = x + float(k)
        y.realize().wait()
        if k % 2:
            kept.append((k, y))
        del y
    assert dev._small.statistics()["entries"] >= 1  # the dropped results' memory waits for reuse
    addresses = [_address(t) for _, t in kept]
    assert len(set(addresses)) == len(addresses)
    for k, t in kept:
        np.testing.assert_allclose(t.numpy(), np.linspace(0, 1, 16, dtype=np.float32) + k, rtol=1e-6)
