"""Counter-based random numbers: `rand` draws Threefry-2x32 of (counter, seed), and the generator's
state (seed and counter) with the small buffer each draw reads it from.

Every draw takes the next `numel` counters of a global counter in program order, so a value depends
only on the seed and on how many numbers were drawn before it in the program: not on the device, the
number of devices, the order concurrent realizes run in, or which tensors are realized together.

Neither the seed nor the draw's first counter is baked into the graph: each draw reads both from a
buffer of its own, two uint64 values [seed, first counter], written when the draw is made. So every
draw of one shape builds the same graph (the schedule cache hits on the second), and a jit replay
(jit/jit.py) draws fresh numbers without building anything: it gives each captured draw a new buffer,
written from the counter at replay time, so a replay draws exactly what an eager run of the same calls
would. tinygrad keeps its counter in a device tensor that each draw assigns to; a buffer per draw,
written once, keeps atensor's values independent of devices and of the order realizes run in, and never
makes a held lazy draw a stale read.

Invariants: counters are taken under `_lock` in the order draws are made (program order on one
thread); a draw buffer is written once, when it is made, before any graph can read it, and never again.
"""
from __future__ import annotations

import threading
from typing import Sequence, Union

import numpy as np

from atensor.dtype import DType, dtypes
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.hcq.device import Device
from atensor.engine.dispatch import recording

Devices = Union[str, tuple[str, ...]]
_state = {"seed": 0, "counter": 0}
_lock = threading.Lock()

Draw = tuple[tuple[BufferSpec, ...], int]  # a draw's buffers (one per device) and how many counters it took


def manual_seed(seed: int) -> None:
    """Resets the generator to `seed` with the counter at 0."""
    with _lock:
        _state["seed"], _state["counter"] = int(seed) & (2**64 - 1), 0


def get_state() -> tuple[int, int]:
    """The generator's (seed, counter): what a checkpoint saves to continue the same stream."""
    with _lock:
        return _state["seed"], _state["counter"]


def set_state(seed: int, counter: int) -> None:
    """Puts the generator at `seed` and `counter` (a state `get_state` returned)."""
    with _lock:
        _state["seed"], _state["counter"] = int(seed) & (2**64 - 1), int(counter)


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


def _state_node(device: Devices, size: int) -> Node:
    """The [seed, first counter] buffer of a new draw of `size` numbers (replicated on a tuple of
    devices: every device draws the same values)."""
    devices = device if isinstance(device, tuple) else (device,)
    nodes = tuple(spec.node(0) for spec in draw_buffers(devices, size))
    if isinstance(device, tuple):
        return Node.make(Ops.MULTI, dtypes.uint64, nodes, (None, None))
    return nodes[0]


def bits_node(shape: tuple[int, ...], device: Devices) -> Node:
    """64 random bits per element (uint64)."""
    size = 1
    for s in shape:
        size *= s
    state = _state_node(device, size)
    key = state.shrink(((0, 1),)).expand((size,))
    start = state.shrink(((1, 2),)).expand((size,))
    counters = Node.make(Ops.ARANGE, dtypes.uint64, (), (0, 1, size, device)).alu(Ops.ADD, start)
    return counters.alu(Ops.THREEFRY, key).reshape(shape)


def uniform_node(shape: tuple[int, ...], dtype: DType, device: Devices) -> Node:
    """Uniform floats in [0, 1): the top 24 (float32/16) or 53 (float64) bits, scaled."""
    bits = bits_node(shape, device)
    mantissa = 53 if dtype == dtypes.float64 else 24
    shift = Node.const(2 ** (64 - mantissa), dtypes.uint64, device, shape)
    top = bits.alu(Ops.IDIV, shift)
    wide = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    scale = Node.const(2.0 ** -mantissa, wide, device, shape)
    return top.cast(wide).alu(Ops.MUL, scale).cast(dtype)
