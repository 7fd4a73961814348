"""Device memory: accounting, release when nothing refers to a buffer, and reuse of freed memory."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from atensor import Device, Tensor, dtypes
from atensor.graph.node import BufferSpec

# every test here calls gc.collect(): it traverses only the test's own objects (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("young_heap")


def _released(dev: Device, expected: int, seconds: float = 5.0) -> bool:
    """True once `dev.bytes_in_use` is `expected`, within a generous time: the queue's worker drops its
    finished commands (and the buffers their runners name) just after it publishes their values, so the
    awaiting thread can be a step ahead of it."""
    deadline = time.monotonic() + seconds
    while dev.bytes_in_use != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_memory_is_accounted_released_and_reused():
    dev = Device.get("CPU:3")
    dev.empty_cache()
    before = dev.bytes_in_use
    x = Tensor(np.ones(1 << 18, dtype=np.float32), device="CPU:3")
    y = (x * 2).contiguous() + 1
    y.realize().wait()
    assert dev.bytes_in_use >= before + 2 * (1 << 20)
    np.testing.assert_array_equal(y.numpy(), np.full(1 << 18, 3, dtype=np.float32))
    del x, y
    gc.collect()
    assert _released(dev, before), (dev.bytes_in_use, before)
    pooled = dev._pooled_bytes
    assert pooled == 3 * (1 << 20)  # the two computed buffers and the one the numpy data was copied into
    # the next buffers of the same size take the pooled memory (the data's copy, then the product's
    # result), and compute correct values on it. `a` is held: a temporary input's buffer may die (and
    # go back to the pool) as soon as the product is realized, at a moment the test does not control
    a = Tensor(np.arange(1 << 18, dtype=np.float32), device="CPU:3")
    z = a * 3
    z.realize().wait()
    assert dev._pooled_bytes == pooled - 2 * (1 << 20)
    np.testing.assert_array_equal(z.numpy(), np.arange(1 << 18, dtype=np.float32) * 3)
    del a


def test_memory_of_a_buffer_in_use_by_queued_work_is_never_reused():
    outs = []
    for i in range(20):
        a = Tensor(np.full(1 << 17, i, dtype=np.float32))
        outs.append(((a * 2).contiguous() + 1).sum())  # the temporaries die as soon as the graph runs
    Tensor.realize(*outs).wait()
    assert [o.item() for o in outs] == [float((2 * i + 1) * (1 << 17)) for i in range(20)]


def test_a_full_pool_gives_up_sizes_unused_for_a_while_for_the_one_in_use(monkeypatch):
    """A pool at its maximum, full of an earlier phase's size, keeps the memory of the size in use now
    (it was turned away: every buffer of that size was then fresh memory) by giving up the least
    recently used memory unused for POOL_STALE_S; it never holds more than its maximum."""
    dev = Device.get("CPU:3")
    dev.empty_cache()
    mib = 1 << 20
    monkeypatch.setattr(type(dev), "POOL_MAX_BYTES", 4 * mib)
    monkeypatch.setattr(type(dev), "POOL_STALE_S", 0.0)  # all memory not used this instant is stale
    old = [Tensor.empty(mib // 4, device="CPU:3") for _ in range(3)]  # 1 MiB each: the earlier phase
    small = Tensor.empty(mib // 8, device="CPU:3")  # 512 KiB, given back below
    Tensor.realize(*old, small).wait()
    del old
    gc.collect()
    assert dev._pooled_bytes == 3 * mib
    big = Tensor.empty(mib // 2, device="CPU:3")  # 2 MiB: the phase now
    big.realize().wait()
    del big
    gc.collect()  # 3 + 2 MiB > 4: the oldest 1 MiB block makes room
    assert dev._pooled_bytes == 4 * mib and list(dev._pool) == [mib, 2 * mib]
    again = Tensor.empty(mib // 2, device="CPU:3")
    again.realize().wait()
    assert dev._pooled_bytes == 2 * mib and list(dev._pool) == [mib]  # it took the pooled 2 MiB
    del small
    gc.collect()  # 512 KiB more fits: nothing given up, the newest size last
    assert dev._pooled_bytes == 2 * mib + mib // 2 and list(dev._pool) == [mib, mib // 2]
    too_big = Tensor.empty(5 * mib // 4, device="CPU:3")  # 5 MiB: over the maximum, never pooled
    too_big.realize().wait()
    del too_big
    gc.collect()
    assert dev._pooled_bytes == 2 * mib + mib // 2
    dev.empty_cache()


def test_a_full_pool_keeps_memory_in_use_and_turns_the_new_memory_away(monkeypatch):
    """Memory used within POOL_STALE_S is never given up for other memory: a loop whose buffers
    outgrow the pool keeps a stable part of them pooled instead of evicting, at every step, what the
    next step takes again."""
    dev = Device.get("CPU:3")
    dev.empty_cache()
    mib = 1 << 20
    monkeypatch.setattr(type(dev), "POOL_MAX_BYTES", 4 * mib)
    monkeypatch.setattr(type(dev), "POOL_STALE_S", 3600.0)
    old = [Tensor.empty(mib // 4, device="CPU:3") for _ in range(4)]
    big = Tensor.empty(mib // 2, device="CPU:3")
    Tensor.realize(*old, big).wait()
    del old
    gc.collect()
    assert dev._pooled_bytes == 4 * mib
    del big
    gc.collect()  # no room, and the 1 MiB memory is in use: the 2 MiB goes back to the system
    assert dev._pooled_bytes == 4 * mib and list(dev._pool) == [mib]
    dev.empty_cache()




def test_pooled_memory_handed_on_keeps_its_address_whatever_the_dtype():
    """A buffer given a dead buffer's memory reports that memory's address (kept with it when it was made,
    hcq/device.py `HostMemory`), whatever dtype it views the memory as."""
    dev = Device.get("CPU:3")
    dev.empty_cache()
    spec = BufferSpec("CPU:3", 1 << 18, dtypes.float32)
    buf = dev.allocate(spec)
    address, read = buf.address(), buf.memory.__array_interface__["data"][0]
    del spec, buf  # the memory goes back to the pool with its spec
    assert address == read and dev._pooled_bytes == 1 << 20
    spec = BufferSpec("CPU:3", 1 << 18, dtypes.int32)  # the same bytes, another dtype
    buf = dev.allocate(spec)
    assert dev._pooled_bytes == 0 and buf.memory.dtype == np.int32 and buf.memory.size == 1 << 18
    assert buf.address() == address == buf.memory.__array_interface__["data"][0]


def test_a_fresh_pooled_buffer_is_what_allocate_and_a_version_advance_leave():
    """hcq/device.py's `fresh_pooled` (a one-net-command jit replay's fresh result of the caching
    allocator's sizes, one step) against the general path (`Device.allocate`, then
    `versions.advance_versions`): the same ledger record, memory and count, and the memory comes back to
    the pool when the spec dies, to be handed to the next buffer of its size."""
    from atensor import ledger
    from atensor.hcq import device as device_module
    from atensor.ledger import versions
    dev = Device.get("CPU:3")
    dev.empty_cache()
    n = 1 << 17  # 512 KiB of float32: above SmallPool.MAX_NBYTES
    found = {}
    for way in ("general", "fresh_pooled"):
        for version in (0, 1, 2):
            gc.collect()
            before = dev.bytes_in_use
            spec = BufferSpec("CPU:3", n, dtypes.float32)
            if way == "general":
                buf = dev.allocate(spec)
                versions.advance_versions([spec] * version)
            else:
                buf = device_module.fresh_pooled(dev, spec, version)
            assert ledger.runtime(spec) is buf and ledger.version(spec) == version and ledger.head(spec) is None
            assert buf.memory.shape == (n,) and buf.memory.dtype == np.float32
            assert buf.address() == buf.memory.__array_interface__["data"][0] and not buf.writes
            found[way, version] = (dev.bytes_in_use - before, buf.uid == spec.uid, buf.failure, buf.inflight)
            address = buf.address()
            del spec, buf
            gc.collect()
            assert dev.bytes_in_use == before and dev._pooled_bytes == 4 * n  # given back, pooled
            again = dev.allocate(BufferSpec("CPU:3", n, dtypes.int32))
            assert again.address() == address  # handed to the next buffer of its size
            del again
    assert found["general", 0] == found["fresh_pooled", 0] == (4 * n, True, None, 0)
    assert all(found["general", v] == found["fresh_pooled", v] for v in (1, 2))
