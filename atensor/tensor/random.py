"""Counter-based random numbers: `rand` draws Threefry-2x32 of (counter, seed).

Every draw takes the next `numel` counters of a global counter in program order, so a value depends
only on the seed and on how many numbers were drawn before it in the program: not on the device, the
number of devices, the order concurrent realizes run in, or which tensors are realized together.

The seed and the draw's first counter come from a small buffer per draw (tensor/rng.py owns the
state and those buffers): the graph of a draw depends only on its shape and devices, so a jitted
function that draws replays with fresh numbers, the ones an eager run of the same calls draws.
"""
from __future__ import annotations

from typing import Union

from atensor.dtype import DType, dtypes
from atensor.tensor import rng
from atensor.graph.node import Node
from atensor.graph.ops import Ops

Devices = Union[str, tuple[str, ...]]


def manual_seed(seed: int) -> None:
    """Resets the generator to `seed` with the counter at 0."""
    rng.manual_seed(seed)


def _state_node(device: Devices, size: int) -> Node:
    """The [seed, first counter] buffer of a new draw of `size` numbers (replicated on a tuple of
    devices: every device draws the same values)."""
    devices = device if isinstance(device, tuple) else (device,)
    nodes = tuple(spec.node(0) for spec in rng.draw_buffers(devices, size))
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
