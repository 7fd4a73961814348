"""Device memory: accounting, release when nothing refers to a buffer, and reuse of freed memory."""
from __future__ import annotations

import gc

import numpy as np

from atensor import Device, Tensor


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
    assert dev.bytes_in_use == before
    pooled = dev._pooled_bytes
    assert pooled == 3 * (1 << 20)  # the two computed buffers and the one the numpy data was copied into
    # the next buffers of the same size take the pooled memory (the data's copy, then the product's
    # result), and compute correct values on it
    z = Tensor(np.arange(1 << 18, dtype=np.float32), device="CPU:3") * 3
    z.realize().wait()
    assert dev._pooled_bytes == pooled - 2 * (1 << 20)
    np.testing.assert_array_equal(z.numpy(), np.arange(1 << 18, dtype=np.float32) * 3)


def test_memory_of_a_buffer_in_use_by_queued_work_is_never_reused():
    outs = []
    for i in range(20):
        a = Tensor(np.full(1 << 17, i, dtype=np.float32))
        outs.append(((a * 2).contiguous() + 1).sum())  # the temporaries die as soon as the graph runs
    Tensor.realize(*outs).wait()
    assert [o.item() for o in outs] == [float((2 * i + 1) * (1 << 17)) for i in range(20)]
