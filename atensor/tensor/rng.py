"""The random generator's state (seed and counter) and the small buffer each draw reads it from.

Why: `Tensor.rand` draws Threefry-2x32 of (counter, seed) for the next `numel` counters of one global
counter (atensor/tensor/random.py builds the nodes). Neither the seed nor the draw's first counter is baked
into the graph: each draw reads both from a buffer of its own, two uint64 values [seed, first counter],
written when the draw is made. So every draw of one shape builds the same graph (the schedule cache
hits on the second), and a jit replay (jit/jit.py) draws fresh numbers without building anything:
it gives each captured draw a new buffer, written from the counter at replay time, so a replay draws
exactly what an eager run of the same calls would. tinygrad keeps its counter in a device tensor that
each draw assigns to; a buffer per draw, written once, keeps atensor's values independent of devices
and of the order realizes run in, and never makes a held lazy draw a stale read.

Invariants: counters are taken under `_lock` in the order draws are made (program order on one
thread); a draw buffer is written once, when it is made, before any graph can read it, and never again.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from atensor.dtype import dtypes
from atensor.graph.node import BufferSpec
from atensor.hcq.device import Device
from atensor.engine.handle import recording

_state = {"seed": 0, "counter": 0}
_lock = threading.Lock()

Draw = tuple[tuple[BufferSpec, ...], int]  # a draw's buffers (one per device) and how many counters it took


def manual_seed(seed: int) -> None:
    """Resets the generator to `seed` with the counter at 0."""
    with _lock:
        _state["seed"], _state["counter"] = int(seed) & (2**64 - 1), 0


def take(count: int) -> tuple[int, int]:
    """(seed, first counter) of the next `count` counters, which no later draw gets."""
    with _lock:
        start = _state["counter"]
        _state["counter"] += count
        return _state["seed"], start


def _written(device: str, seed: int, start: int) -> BufferSpec:
    """A new [seed, start] uint64 buffer on `device` (a NULL device holds no values)."""
    spec = BufferSpec(device, 2, dtypes.uint64)
    Device.get(device).allocate(spec, np.array([seed, start], dtype=np.uint64))
    return spec


def draw_buffers(devices: Sequence[str], count: int) -> tuple[BufferSpec, ...]:
    """Takes the next `count` counters and returns one [seed, first counter] buffer per device; a jit
    capture (jit/jit.py) notes the draw, to redraw it on every replay."""
    seed, start = take(count)
    specs = tuple(_written(d, seed, start) for d in devices)
    capture = recording.get()
    if capture is not None:
        capture.draws.append((specs, count))
    return specs


def redraw(draws: Sequence[Draw]) -> list[BufferSpec]:
    """For a jit replay: each captured draw again, in order, from the counter as it is now: new
    buffers in place of the captured ones (flattened in the order of `draws` and their devices)."""
    fresh: list[BufferSpec] = []
    for specs, count in draws:
        seed, start = take(count)
        fresh.extend(_written(spec.device, seed, start) for spec in specs)
    return fresh
