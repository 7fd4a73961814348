"""The `net` queue's commands: a NetAllReduce task turned into a call that crosses processes.

Why a seam here and not MPI in hcq/: the runtime runs commands on queues and knows nothing of how
processes find each other; atensor/dist/ reads the world from MPI and installs a `Transport` here
(`install`). A net command is then an ordinary queue command: the worker of a device's `net` queue
waits on the producers' timeline signals, calls the transport (which blocks in MPI with the GIL
released, so compute queues keep running), and publishes its own signal. A transport that can make
the command one C call (`native_runner`, a Runner with `native` set and its send and receive
addresses in slots 0 and 1) makes it a native runner like a compiled kernel's: a jit replay then
puts the net queue's commands in a native program too (engine/plan.py), waiting on and publishing C
timelines, and patches the addresses of swapped buffers as it does a kernel's. With no transport
installed the process is a world of one, and the command is what an allreduce over one process is:
a copy (and the mean's division by the local partials).

Invariant the transport relies on: a device's net commands run in the order of its queue, and every
process builds the same task graphs in the same order (one SPMD program), so the collectives on a
device's communicator match across processes. Each device has its own communicator, so collectives
of different devices' net queues never interleave on one.
"""
from __future__ import annotations

from typing import Optional, Protocol

import numpy as np

from atensor.backend.runner import Runner
from atensor.graph.ops import ReduceOp
from atensor.graph.taskgraph import NetAllReduce
from atensor.hcq.buffer import Buffer
from atensor.hcq.device import Device


class Transport(Protocol):
    """What dist/ provides: an allreduce across every process, on `device`'s own communicator."""
    size: int

    def allreduce(self, device: str, send: Optional[np.ndarray], recv: np.ndarray, op: ReduceOp) -> None:
        """Reduces `send` (None: in place, `recv` holds the input) of every process into `recv`;
        blocks until done, with the GIL released."""
        ...

    def native_runner(self, device: str, send: int, recv: int, count: int, dtype: str, op: ReduceOp,
                      in_place: bool, scale: Optional[float]) -> Optional[Runner]:
        """The same allreduce from address `send` into `recv` (`count` elements of numpy dtype name
        `dtype`), then `recv` times `scale` (None: no scaling), as one foreign call (`Runner.native`);
        None when it cannot be (then `allreduce` runs)."""
        ...


_transport: Optional[Transport] = None


def install(transport: Optional[Transport]) -> None:
    """Makes `transport` carry this process's net commands (None: a world of one process)."""
    global _transport
    _transport = transport


def installed() -> Optional[Transport]:
    return _transport


def runner(work: NetAllReduce) -> Optional[Runner]:
    """The runner a `net` queue runs for `work`; None on NULL devices (they hold no data). A replay
    gets a runner made again from its work with the replay's buffers (engine/lower.py)."""
    src_dev, dst_dev = Device.get(work.src.device), Device.get(work.dst.device)
    if dst_dev.kind == "NULL":
        return None
    src = src_dev.allocate(work.src).memory[work.src_offset:work.src_offset + work.count]
    recv = dst_dev.allocate(work.dst).memory[work.dst_offset:work.dst_offset + work.count]
    in_place = work.src is work.dst and work.src_offset == work.dst_offset
    send = None if in_place else src
    transport = _transport
    processes = 1 if transport is None else transport.size
    scale = 1.0 / (work.local_parts * processes) if work.mean else None
    device, op = work.device, work.op
    make_native = getattr(transport, "native_runner", None)  # a transport may have no C path
    if make_native is not None:
        size = recv.dtype.itemsize
        src_at, dst_at = work.src_offset * size, work.dst_offset * size
        native = make_native(device, Buffer.of(work.src).address() + src_at,
                             Buffer.of(work.dst).address() + dst_at, work.count, recv.dtype.name, op,
                             in_place, scale)
        if native is not None:
            native.args = ((work.src, src_at), (work.dst, dst_at))  # slots 0 and 1: send, recv
            native.keep_alive = (work.src, work.dst)
            return native

    def run() -> None:
        if transport is None:
            if send is not None:
                np.copyto(recv, send)
        else:
            transport.allreduce(device, send, recv, op)
        if scale is not None:
            np.multiply(recv, recv.dtype.type(scale), out=recv)

    return Runner(run, keep_alive=(work.src, work.dst))
