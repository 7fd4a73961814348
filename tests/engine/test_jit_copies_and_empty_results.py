"""jit replays of results that are plain copies of an input, or of size 0 (issue 17, defects 3 and 4).

Both failed on the native replay path only: the replay plan binds buffers through the tasks' accesses,
and (3) the kernel of `x.contiguous()` listed no read of `x`, so every replay after the first copied the
first replay's input (freed memory, once that input was gone); (4) a size-0 result has no access, so
from the second replay on its buffer was never allocated ("holds no data yet")."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.sched.schedule import schedule

COPIES = {"contiguous": lambda x: x.contiguous(), "clone": lambda x: x.clone(), "times one": lambda x: x * 1}


@pytest.mark.parametrize("native", ["jit", "0"])
@pytest.mark.parametrize("copy", sorted(COPIES))
async def test_a_result_that_copies_an_input_is_the_new_input_on_every_replay(copy: str, native: str):
    make = COPIES[copy]
    with atensor.Context(native=native):
        @atensor.jit
        async def f(x: Tensor) -> Tensor:
            return make(x)

        got = []
        for i in range(10):
            x = Tensor(np.full(3, float(i), np.float32))
            got.append((await f(x)).tolist())
            gone = weakref.ref(x)
            del x  # the input is freed: a replay that still read it would read reused memory
            gc.collect(1)  # young cycles only: a full collection of the suite's heap took ~0.7 s each
            assert gone() is None
            Tensor(np.full(3, -1.0, np.float32)).numpy()  # something else now takes that memory
        assert got == [[float(i)] * 3 for i in range(10)]
        assert f.stats["replays"] == 7


def test_the_kernel_that_copies_a_buffer_lists_the_read_of_that_buffer():
    x = Tensor(np.arange(4, dtype=np.float32))
    node = x.contiguous().node
    spec = BufferSpec(node.device, node.size, node.dtype)
    root = Node.make(Ops.ASSIGN, node.dtype, (spec.node(0), node), View.create((4,)))
    graph = schedule([root]).graph
    source = x.node.base().arg[0]
    reads = [a for t in graph.tasks for a in t.accesses if a.mode == "r" and a.buffer is source]
    assert reads and reads[0].start == 0 and reads[0].end == 16


@pytest.mark.parametrize("native", ["jit", "0"])
async def test_a_size_zero_result_is_realized_on_every_replay(native: str):
    with atensor.Context(native=native):
        @atensor.jit
        async def f(x: Tensor):
            return x[:0] * 2, x + 1

        for i in range(10):
            empty, plus = await f(Tensor(np.full(3, float(i), np.float32)))
            assert empty.numpy().shape == (0,) and empty.numpy().dtype == np.float32
            assert plus.tolist() == [i + 1.0] * 3
        assert f.stats["replays"] == 7
