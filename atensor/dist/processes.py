"""The world: this process's rank among the processes MPI started, and its local devices.

Why MPI (through mpi4py) and not our own sockets: launching processes on many hosts, finding peers,
and moving bytes between them fast is what MPI implementations have tuned for decades, and every
cluster has one. atensor only adds what it needs on top: one communicator per local device (so each
device's `net` queue issues its collectives on its own communicator, in its queue's order), a check
at start-up that every process runs the same program on the same kind of world, and an abort that
ends the whole job when one process fails, instead of leaving the others blocked in a collective.

Thread level: the net queues' workers call MPI from their own threads while the main thread may call
it too (a barrier, the start-up check), so atensor requires MPI_THREAD_MULTIPLE and checks it at
`init` (MPICH, Open MPI and Intel MPI all provide it).

How a net command waits: MPI implementations wait in a collective by spinning on a core. On a
machine with more runnable threads than cores (the host's event loop, the compute queues, other
processes) a spinning waiter takes the core from the very work it waits for, so by default
(`net_wait="poll"`) a net command starts `Iallreduce` and tests it: in a tight loop for SPIN_NS
(a small collective completes in it), then with a sched_yield between tests for YIELD_NS and a few
ns per byte (the core goes to whoever else can run on it, else the loop goes on testing at once),
then with a short sleep between tests (a peer late by milliseconds, or hung, costs no core).
`net_wait="block"` calls MPI's blocking collective, whose wait is MPI's own (the better choice when
every rank has cores to spare; it has no timeout); a jit replay of one such collective of at most
HERE_MAX_BYTES makes that call on the calling thread, as mpi4py does (no hand-off to the worker). The wait runs in C without the GIL when this
MPI's ABI is known (native_net.py: MPICH's family and Open MPI), else in Python through mpi4py
(the same policy, with os.sched_yield and time.sleep(0)).

Faults: a rank that dies is ended with the job by the launcher; a rank that raises aborts the job
(`init` installs the hook); a rank that stops issuing collectives (a deadlock, a hang, ranks that
took different branches) leaves the others waiting, which a net command bounds with
`net_timeout_s` (ATENSOR_NET_TIMEOUT, default 300 s, 0: no limit): it fails naming the rank, the
device and the collective, and the failure aborts the job. The default is far above any one
collective of a legitimate step (a 1 GiB allreduce over 10 GbE takes ~2 s); a step that makes some
rank wait longer than that for another (a long evaluation on rank 0 only) sets a larger one.

Without mpi4py, or when the process was not started by an MPI launcher (no launcher variables in
the environment), the world is this one process: size 1, rank 0, and every collective across
processes is the identity, so the same program trains in one process unchanged.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from atensor.config import settings
from atensor.backend.runner import Runner
from atensor.graph.ops import ReduceOp
from atensor.dist import native_net
from atensor.hcq import net

REQUIRED_THREAD_LEVEL = "MPI_THREAD_MULTIPLE"
SPIN_NS = 50_000  # a polling net command tests in a tight loop this long, then yields between tests
# ... then yields the core between tests for YIELD_NS plus YIELD_NS_PER_BYTE per byte (longer than
# the transfer itself at shared memory's speed: a late peer, not the data, makes the wait longer) ...
YIELD_NS, YIELD_NS_PER_BYTE = 2_000_000, 4
NAP_NS = (10_000, 50_000)  # ... then sleeps between tests: 10 us, doubling up to 50 us (native_net.py)
# a jit replay whose only task is a net command starts it on the calling thread (the event loop's) and
# tests it there (tight, then yielding the core) while the net queue's worker is not involved: a
# collective of at most HERE_MAX_BYTES (~0.6 ms idle at 4 MiB: 3x headroom for load) for at most HERE_NS, and
# done by then it is published there (no hand-off, no wake-up). Still in flight then, its command is
# submitted and the caller goes on testing it until the worker takes the collective over (at most
# HERE_NS more; native_net.py `atensor_net_share`): no gap in the collective's progress while the
# worker wakes. A larger collective rings the worker first and is started and tested here meanwhile:
# the worker's wake-up (~200 us on an idle VM) overlaps the collective instead of preceding it.
# (Before the take-over, a start here that did not finish left a gap mid-collective: measured at 4 MiB
# the ratio to mpi4py fell from 0.91-0.97 to 0.79-0.84, so only <= 2 MiB started here. With the take-over
# there is no gap, and ringing the worker first cost a 4 MiB call ~110 us before the collective and
# ~110 after it (the worker's wake-up on a busy core, the awaiting task's wake-up): 4 MiB starts here.)
HERE_NS, HERE_MAX_BYTES = 2_000_000, 4 << 20
# set by the launchers of MPICH (hydra), Open MPI and PMIx-based ones (slurm's srun --mpi=pmix)
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class DistError(RuntimeError):
    """The processes of the world disagree, or MPI cannot give what atensor needs."""


@dataclass
class World:
    """This process's place among `size` processes (`rank` 0..size-1) and its local `devices`.

    >>> w = World(0, 1, ("CPU:0",))
    >>> w.shard_rows(10), w.is_root
    (range(0, 10), True)
    """
    rank: int
    size: int
    devices: tuple[str, ...]
    comm: Any = None  # mpi4py's COMM_WORLD when size > 1 (or when launched by mpiexec -n 1)
    device_comms: dict[str, Any] = field(default_factory=dict)
    native: Optional[native_net.Helper] = None  # net commands in C (None: through mpi4py, in Python)

    @property
    def is_root(self) -> bool:
        """True on rank 0: the process that prints, evaluates and saves."""
        return self.rank == 0

    @property
    def all_devices(self) -> tuple[str, ...]:
        """Every device of the world, as "rank{r}/{device}" (each process has the same local ones)."""
        return tuple(f"rank{r}/{d}" for r in range(self.size) for d in self.devices)

    def shard_rows(self, rows: int) -> range:
        """The rows of a global batch of `rows` this process takes: as even as possible, the first
        `rows % size` ranks one more (as numpy's array_split)."""
        base, extra = divmod(rows, self.size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (1 if self.rank < extra else 0))

    def shard_batch(self, batch: np.ndarray, axis: int = 0) -> np.ndarray:
        """This process's part of a global `batch` (every process passes the same one)."""
        rows = self.shard_rows(batch.shape[axis])
        return np.take(batch, np.arange(rows.start, rows.stop), axis=axis)

    def barrier(self) -> None:
        """Waits until every process got here."""
        if self.comm is not None:
            self.comm.Barrier()

    def host_sum(self, value: Any) -> Any:
        """`value` (a number) summed over every process, on the host (not a task: for metrics)."""
        return value if self.comm is None else self.comm.allreduce(value)

    def gather(self, value: Any) -> Optional[list]:
        """Every process's `value` on rank 0 (a list in rank order), None on the others."""
        return [value] if self.comm is None else self.comm.gather(value, root=0)

    def check_same(self, **facts: Any) -> None:
        """Raises DistError on every process when some process's `facts` differ from rank 0's,
        naming the fact, the rank and both values; one collective (an allgather)."""
        from atensor import __version__
        mine = {"atensor version": __version__, "process count": self.size,
                "local device count": len(self.devices), **facts}
        every = [mine] if self.comm is None else self.comm.allgather(mine)
        first = every[0]
        for rank, theirs in enumerate(every[1:], start=1):
            for key in sorted(set(first) | set(theirs)):
                a, b = first.get(key), theirs.get(key)
                if a != b:
                    raise DistError(f"rank {rank} disagrees with rank 0 on {key}: {_describe(b, a)}; every "
                                    f"process must run the same program with the same arguments and "
                                    f"the same atensor")

    # ---- the Transport hcq/net.py calls (from the net queues' workers) -------------------------
    def _comm(self, device: str) -> Any:
        comm = self.device_comms.get(device)
        if comm is None:
            raise DistError(f"{device} has no communicator: pass it to atensor.dist.init(devices=...) "
                            f"(this process was given {self.devices})")
        return comm

    def _timeout_message(self, device: str, count: int, timeout: float) -> str:
        return (f"atensor.dist: an allreduce of {count} elements on {device} (rank {self.rank} of "
                f"{self.size}) did not complete in {timeout:g} s (ATENSOR_NET_TIMEOUT): another rank stopped "
                f"or hangs, or the ranks issued different collectives")

    def native_runner(self, device: str, send: int, recv: int, count: int, dtype: str, op: ReduceOp,
                      in_place: bool, scale: Optional[float]) -> Optional[Runner]:
        """The net command as one C call (native_net.py) allreducing `count` elements of `dtype` from
        address `send` into `recv` on `device`'s communicator and multiplying by `scale`; None when
        there is no native helper or it does not take this collective (then `allreduce` runs)."""
        if self.native is None:
            return None
        comm = self._comm(device)
        from mpi4py import MPI
        timeout = settings.net_timeout_s
        wait = native_net.Wait(settings.net_wait == "block", SPIN_NS,
                               YIELD_NS + YIELD_NS_PER_BYTE * count * np.dtype(dtype).itemsize, NAP_NS,
                               int(timeout * 1e9) if timeout > 0 else 0, HERE_NS,
                               count * np.dtype(dtype).itemsize > HERE_MAX_BYTES)
        failed = (f"atensor.dist: an MPI allreduce of {count} elements on {device} (rank {self.rank} of "
                  f"{self.size}) failed")
        return self.native.runner(comm, send, recv, count, dtype, _MPI_OPS[op](MPI), in_place, scale, wait,
                                  (self._timeout_message(device, count, timeout), failed), DistError)

    def allreduce(self, device: str, send: Optional[np.ndarray], recv: np.ndarray, op: ReduceOp) -> None:
        """MPI allreduce of `send` (None: in place) into `recv` on `device`'s own communicator, through
        mpi4py (the Python wait; `native_runner` is the C one)."""
        comm = self._comm(device)
        from mpi4py import MPI
        sendbuf, mpi_op = MPI.IN_PLACE if send is None else send, _MPI_OPS[op](MPI)
        if settings.net_wait == "block":
            comm.Allreduce(sendbuf, recv, op=mpi_op)  # mpi4py releases the GIL in it
            return
        request = comm.Iallreduce(sendbuf, recv, op=mpi_op)
        start = time.perf_counter_ns()
        spin_until = start + SPIN_NS
        yield_until = start + YIELD_NS + YIELD_NS_PER_BYTE * recv.nbytes
        timeout = settings.net_timeout_s
        while not request.Test():
            now = time.perf_counter_ns()
            if timeout > 0 and now - start > timeout * 1e9:
                raise DistError(self._timeout_message(device, recv.size, timeout))
            if now < spin_until:
                continue
            if now < yield_until:  # the core and the GIL to whoever needs them; MPI progresses in Test
                os.sched_yield()
            else:
                time.sleep(0)


_MPI_OPS = {ReduceOp.SUM: lambda MPI: MPI.SUM, ReduceOp.MAX: lambda MPI: MPI.MAX,
            ReduceOp.PROD: lambda MPI: MPI.PROD}


def _describe(theirs: Any, ours: Any) -> str:
    if isinstance(theirs, (list, tuple)) and isinstance(ours, (list, tuple)):
        if len(theirs) != len(ours):
            return f"{len(theirs)} entries, rank 0 has {len(ours)}"
        for i, (a, b) in enumerate(zip(theirs, ours)):
            if a != b:
                return f"entry {i} is {a}, rank 0 has {b}"
    return f"{theirs!r}, rank 0 has {ours!r}"


_world: Optional[World] = None
_lock = threading.Lock()


def launched_by_mpi() -> bool:
    """True when an MPI launcher (mpiexec, mpirun, srun) started this process."""
    return any(v in os.environ for v in _LAUNCHER_VARIABLES)


def init(devices: Sequence[str] = ("CPU:0",), abort_on_error: bool = True) -> World:
    """The world, made once: rank and size from MPI when an MPI launcher started this process and
    mpi4py is installed, else one process (then each call makes a new one-process world). Each of
    `devices` (the same list on every process) gets a communicator of its own for its net queue.
    `abort_on_error`: an uncaught exception on any process ends the whole job (MPI_Abort) after
    printing, so no process waits forever in a collective."""
    global _world
    devices = tuple(devices)
    with _lock:
        if _world is not None and _world.comm is not None:  # communicators are made once per process
            if _world.devices != devices:
                raise DistError(f"atensor.dist.init was called with {_world.devices} already; "
                                f"call it once per process, with every device the program uses")
            return _world
        if not launched_by_mpi():
            _world = World(0, 1, devices)
            return _world
        try:
            import mpi4py
        except ImportError:
            print("atensor.dist: started by an MPI launcher but mpi4py is not installed "
                  "(pip install 'atensor[mpi]'); running as one process", file=sys.stderr)
            _world = World(0, 1, devices)
            return _world
        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise DistError(f"atensor needs {REQUIRED_THREAD_LEVEL} (net queues call MPI from their own "
                            f"threads); this MPI ({MPI.Get_library_version().splitlines()[0]}) gave level "
                            f"{MPI.Query_thread()}")
        comm = MPI.COMM_WORLD
        world = World(comm.Get_rank(), comm.Get_size(), devices, comm)
        world.device_comms = {d: comm.Dup() for d in devices}  # collective: same order on every rank
        if world.size > 1:
            world.native = native_net.helper(MPI)
        if abort_on_error:
            _abort_on_uncaught(comm)
        net.install(world if world.size > 1 else None)
        _world = world
        return world


def world() -> World:
    """The world `init` made; before `init`, a one-process world on CPU:0 (or, under an MPI launcher,
    an error: the devices must be given to `init`, collectively, before the first collective)."""
    if _world is not None:
        return _world
    if launched_by_mpi():
        raise DistError("call atensor.dist.init(devices=...) first: under an MPI launcher every process "
                        "makes its communicators there, before any collective")
    return World(0, 1, ("CPU:0",))


def drain_stderr(timeout_s: float = 2.0) -> None:
    """Waits, at most `timeout_s`, until what this process wrote to stderr has been read from its pipe.
    Call it before MPI_Abort: MPICH's mpiexec exits as soon as the abort reaches it (hydra's server,
    fn_abort), and bytes its proxy had not yet read from the rank's pipe are lost (a test of a timed-out
    rank saw the job end with an empty stderr). FIONREAD gives the unread bytes of a pipe from either
    end; on a file or a terminal it gives 0 at once."""
    try:
        import fcntl
        import termios
    except ImportError:  # not a POSIX system: nothing to wait for
        return
    deadline = time.monotonic() + timeout_s
    unread = bytearray(4)
    while time.monotonic() < deadline:
        try:
            fcntl.ioctl(2, termios.FIONREAD, unread)
        except OSError:
            return
        if int.from_bytes(unread, sys.byteorder, signed=True) <= 0:
            return
        time.sleep(0.001)


def _abort_on_uncaught(comm: Any) -> None:
    """Makes an uncaught exception print its traceback and then abort every process of the job."""
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:  # type: ignore[no-untyped-def]
        previous(kind, value, tb)
        sys.stderr.write(f"atensor.dist: rank {comm.Get_rank()} failed; aborting every process\n")
        sys.stderr.flush()
        drain_stderr()
        comm.Abort(1)
    sys.excepthook = hook
