"""The flagship (examples/train.py) on OpenCL: the same seed trains to the CPU backend's losses and
held-out accuracy on CL:0 (data parallel over CL:0 and CL:1, its allreduce, is docs/opencl.md's
measured run; the sharding tests here cover the mechanism). A few steps, not 12 epochs: each new
kernel is a pocl compile (about a second, once, then the disk cache), and the steps' arithmetic is
what differs between the backends, not their number."""
from __future__ import annotations

import numpy as np
import pytest

from tests.examples.test_train import DATA, train  # the example's module and digits (skips without sklearn)

STEPS, BATCH = 6, 64


async def _both(devices: int):
    cpu = await train.train(devices=devices, max_steps=STEPS, batch_size=BATCH, progress=False, data=DATA)
    cl = await train.train(devices=devices, max_steps=STEPS, batch_size=BATCH, progress=False, data=DATA,
                           device="CL")
    return cpu, cl


def _assert_same_training(cpu, cl) -> None:
    assert len(cl.losses) == len(cpu.losses) == STEPS
    # the same updates up to float summation order (OpenCL's work-group reductions sum in another order)
    np.testing.assert_allclose(cl.losses, cpu.losses, rtol=1e-4, atol=1e-5)
    assert cl.losses[-1] < cl.losses[0]  # and it learns
    assert cl.accuracy == pytest.approx(cpu.accuracy, abs=2 / len(DATA.y_test) + 1e-9)


async def test_the_flagship_trains_on_one_cl_device_as_on_the_cpu():
    _assert_same_training(*await _both(1))

