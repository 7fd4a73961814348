"""A repeated eager training step leaves no reference cycles: everything it made is freed by reference
counting, so the cyclic collector has nothing to find (its collections were part of the eager step's
host time). Checked with the collector off: after the steps, `gc.collect()` finds no unreachable object
that atensor made."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import trio

from atensor import Tensor, nn
from atensor.backend.c import registry
from atensor.nn import optim


@pytest.mark.default_settings  # as users run it: race checks off, the paths a step takes in a loop
def test_an_eager_training_step_leaves_no_garbage_cycles():
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((32, 16)).astype(np.float32))
    y = Tensor(rng.integers(0, 4, size=32).astype(np.int32))
    Tensor.manual_seed(0)
    net = [nn.Linear(16, 24), nn.Linear(24, 4)]
    opt = optim.Adam(nn.get_parameters(net), lr=1e-3)

    async def step() -> None:
        loss = nn.cross_entropy(net[1](net[0](x).relu()), y, reduction="sum") / 32
        opt.zero_grad()
        loss.backward()
        await opt.step(loss)

    async def steps(n: int) -> None:
        for _ in range(n):
            await step()

    trio.run(steps, 12)  # warm: the schedule cache's templates, the hot twin, compiled kernels
    registry.wait_background()  # the hot step's kernels in C: its programs run through the doorbell ring
    trio.run(steps, 6)
    gc.collect()
    was, flags = gc.isenabled(), gc.get_debug()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        trio.run(steps, 10)
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith("atensor")]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert not ours, f"{len(ours)} objects of atensor's in reference cycles: {sorted({type(o).__name__ for o in ours})}"
