"""Counter-based random numbers: `rand` draws Threefry-2x32 of (counter, seed).

Every draw takes the next `numel` counters of a global counter in program order, so a value depends
only on the seed and on how many numbers were drawn before it in the program: not on the device, the
number of devices, the order concurrent realizes run in, or which tensors are realized together.
"""
from __future__ import annotations

import threading

from atensor.dtype import DType, dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops

_state = {"seed": 0, "counter": 0}
_lock = threading.Lock()


def manual_seed(seed: int) -> None:
    """Resets the generator to `seed` with the counter at 0."""
    with _lock:
        _state["seed"], _state["counter"] = int(seed) & (2**64 - 1), 0


def _take(count: int) -> tuple[int, int]:
    with _lock:
        start = _state["counter"]
        _state["counter"] += count
        return _state["seed"], start


def bits_node(shape: tuple[int, ...], device: str) -> Node:
    """64 random bits per element (uint64)."""
    size = 1
    for s in shape:
        size *= s
    seed, start = _take(size)
    counters = Node.make(Ops.ARANGE, dtypes.uint64, (), (start, 1, size, device))
    key = Node.const(seed, dtypes.uint64, device, (size,))
    return counters.alu(Ops.THREEFRY, key).reshape(shape)


def uniform_node(shape: tuple[int, ...], dtype: DType, device: str) -> Node:
    """Uniform floats in [0, 1): the top 24 (float32/16) or 53 (float64) bits, scaled."""
    bits = bits_node(shape, device)
    mantissa = 53 if dtype == dtypes.float64 else 24
    shift = Node.const(2 ** (64 - mantissa), dtypes.uint64, device, shape)
    top = bits.alu(Ops.IDIV, shift)
    wide = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    scale = Node.const(2.0 ** -mantissa, wide, device, shape)
    return top.cast(wide).alu(Ops.MUL, scale).cast(dtype)
