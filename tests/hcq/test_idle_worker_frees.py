"""An idle thread keeps nothing of the work it finished: once the dispatcher has planned a realize and
a queue's worker has run its commands, neither thread's frames hold a Job, a Command or a Buffer while
it waits for the next one (they held the last ones until then: tests/test_ledger.py nudged them with a
second realize). A finished realize's buffer then dies with its tensor (weakref, no cyclic collection)."""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np
import pytest

import atensor
from atensor import Context, Tensor, ledger
from atensor.engine.dispatch import Job
from atensor.hcq.buffer import Buffer
from atensor.hcq.queue import Command
from atensor.ledger import versions
from tests.waiting import soon

pytestmark = pytest.mark.default_settings  # as users run: race checks off


def _held_by_atensor_threads() -> list[tuple[str, str, str]]:
    """(thread, function, local name) of each Job, Command or Buffer in the frames of atensor's threads."""
    frames = sys._current_frames()
    held = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.name.startswith("atensor-") else None
        while frame is not None:
            held += [(thread.name, frame.f_code.co_name, name) for name, value in frame.f_locals.items()
                     if isinstance(value, (Job, Command, Buffer))]
            frame = frame.f_back
    return held


@pytest.mark.parametrize("native", ["jit", "all"])
def test_a_finished_realize_leaves_nothing_in_the_idle_dispatcher_or_worker(native):
    with Context(native=native):  # "all": the worker runs the kernel as a native program (its doorbell)
        t = Tensor(np.arange(1 << 20, dtype=np.float32))  # 4 MiB: past the inline bounds, a worker runs it
        t.assign(t * 3).realize()
        np.testing.assert_array_equal(t.numpy(), np.arange(1 << 20, dtype=np.float32) * 3)
        spec = versions.storage_of(t.node)
    buffer_ref = weakref.ref(ledger.runtime(spec))
    del t, spec
    assert soon(lambda: buffer_ref() is None), _held_by_atensor_threads()
    assert soon(lambda: not _held_by_atensor_threads()), _held_by_atensor_threads()


def test_a_jitted_call_run_by_the_worker_leaves_nothing_in_its_idle_frames():
    @atensor.jit
    def step(x: Tensor) -> Tensor:
        return x + 1

    y = Tensor.zeros(1 << 16, device="CPU:0").contiguous()  # 256 KiB: handed to the queue's worker
    y.realize().wait()
    for _ in range(20):  # captured, verified, then replayed (a native program on the worker's doorbell)
        y = step(y)
    assert y.numpy()[0] == 20
    assert soon(lambda: not _held_by_atensor_threads()), _held_by_atensor_threads()
