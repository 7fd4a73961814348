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


def test_an_owned_pool_counts_its_memory_in_the_owners_bytes_until_it_comes_back():
    class Owner:  # a device's memory figures (hcq/smallpool.py `Accounts`)
        name, bytes_in_use, peak_bytes = "CPU:9", 1000, 1000

        def __init__(self):
            import threading
            self._mem_lock = threading.Lock()
    owner = Owner()
    pool = SmallPool(owner=owner)
    a, b = pool.take(64, np.dtype(np.float32)), pool.take(32, np.dtype(np.float32))
    assert (owner.bytes_in_use, owner.peak_bytes) == (1096, 1096)
    pool.give(a)
    assert (owner.bytes_in_use, owner.peak_bytes) == (1032, 1096)
    assert pool.take(64, np.dtype(np.float32)) is a and owner.bytes_in_use == 1096  # recycled: counted again
    pool.give(a)
    pool.give(b)
    assert (owner.bytes_in_use, owner.peak_bytes) == (1000, 1096)
    full = SmallPool(keep_bytes=0, owner=owner)
    full.give(full.take(64, np.dtype(np.float32)))  # freed, not kept: uncounted all the same
    assert owner.bytes_in_use == 1000 and full.statistics()["entries"] == 0


def test_a_fresh_small_buffer_is_what_allocate_and_a_version_advance_leave():
    """hcq/device.py's `fresh_small` (a jit replay's fresh result, one step; the running one, C or
    Python) against the general path (`Device.allocate`, then `versions.advance_versions`): the same
    ledger record, memory and count, and the memory comes back to the pool when the spec dies."""
    from atensor import ledger
    from atensor.dtype import dtypes
    from atensor.graph.node import BufferSpec
    from atensor.hcq import device as device_module
    from atensor.ledger import versions
    dev = Device.get("CPU:0")
    dev._small.clear()
    found = {}
    for way in ("general", "fresh_small"):
        for version in (0, 1, 2):
            gc.collect()  # (earlier tests' dead buffers give their memory back now, not below)
            before = dev.bytes_in_use
            spec = BufferSpec("CPU:0", 16, dtypes.float32)
            if way == "general":
                buf = dev.allocate(spec)
                versions.advance_versions([spec] * version)
            else:
                buf = device_module.fresh_small(dev, spec, version, (64, np.dtype(np.float32)))
            assert ledger.runtime(spec) is buf and ledger.version(spec) == version
            assert ledger.head(spec) is None
            assert buf.memory.shape == (16,) and buf.memory.dtype == np.float32
            assert buf.address() == buf.memory.__array_interface__["data"][0] and not buf.writes
            found[way, version] = (dev.bytes_in_use - before, buf.uid == spec.uid, buf.failure, buf.inflight)
            address = buf.address()
            del spec, buf
            gc.collect()
            assert dev.bytes_in_use == before  # given back with the spec
            assert dev._small.take(64, np.dtype(np.float32))[2] == address  # to the pool, taken next
    assert found["general", 0] == found["fresh_small", 0] == (64, True, None, 0)
    assert all(found["general", v] == found["fresh_small", v] for v in (1, 2))
