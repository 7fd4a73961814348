"""atensor's settings, read in one place.

Each setting has an environment variable (read once, at import) and can be changed at run time
through `Context` (per context: concurrent trio tasks keep their own):

| setting | env var | default | meaning |
|---|---|---|---|
| racecheck | ATENSOR_RACECHECK | 0 | prove every TaskGraph race-free and its kernels in bounds before it runs (tests turn it on) |
| z3_timeout_ms | ATENSOR_Z3_TIMEOUT_MS | 2000 | per z3 query of those proofs; a query that times out is a rejection |
| blas_threads | ATENSOR_BLAS_THREADS | cores / CPU devices in use | BLAS threads of a big kernel (backend/blas.py) |
| blas_parallel_flops | ATENSOR_BLAS_PARALLEL_FLOPS | 64 Mi | estimated flops from which a kernel's products use `blas_threads` threads; below, one |
| default_device | ATENSOR_DEVICE | CPU | where tensors are made when no device is given |
| schedule_cache | ATENSOR_SCHEDULE_CACHE | 1 | reuse the TaskGraph of a structurally equal graph (sched/cache.py) |
| allreduce_bucket_bytes | ATENSOR_BUCKET_BYTES | 25 MiB | cap of an allreduce bucket; a full bucket starts while later gradients compute |
| malloc_keep_bytes | ATENSOR_MALLOC_KEEP | 128 MiB | freed memory glibc malloc keeps for reuse instead of returning it (backend/numpy_plans.py); 0: malloc's defaults |
| worker_nice | ATENSOR_WORKER_NICE | 0 | OS niceness of atensor's worker threads (queues, dispatcher) on Linux, read when they start: > 0 lets the event loop's thread win a core on a busy machine |
| net_wait | ATENSOR_NET_WAIT | poll | how a net queue waits for an MPI collective (atensor/dist/processes.py): `poll` tests it and yields the core between tests once it has spun for a while, `block` calls MPI's blocking collective (MPI's own wait, no timeout); read when a net command is lowered |
| net_timeout_s | ATENSOR_NET_TIMEOUT | 300 | seconds a net command waits for an MPI collective before it fails naming the rank and the collective (a rank stopped or hangs, or the ranks issued different collectives); the failure aborts the job. 0: no limit; read when a net command is lowered |
| max_devices | ATENSOR_MAX_DEVICES | 16 | devices per kind (CPU:0 ... CPU:15): a higher index is an error when the device is used, not a silently made one |
| native | ATENSOR_NATIVE | jit | which kernels are compiled to C (backend/native.py): `jit` those of `atensor.jit` replays, `all` every kernel, `0` none |
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Iterator, Optional


@dataclass
class Settings:
    racecheck: bool = bool(int(os.environ.get("ATENSOR_RACECHECK", "0")))
    z3_timeout_ms: int = int(os.environ.get("ATENSOR_Z3_TIMEOUT_MS", "2000"))
    blas_threads: Optional[int] = int(os.environ["ATENSOR_BLAS_THREADS"]) if "ATENSOR_BLAS_THREADS" in os.environ else None
    blas_parallel_flops: int = int(os.environ.get("ATENSOR_BLAS_PARALLEL_FLOPS", str(64 << 20)))
    default_device: str = os.environ.get("ATENSOR_DEVICE", "CPU")
    schedule_cache: bool = bool(int(os.environ.get("ATENSOR_SCHEDULE_CACHE", "1")))
    allreduce_bucket_bytes: int = int(os.environ.get("ATENSOR_BUCKET_BYTES", str(25 << 20)))
    malloc_keep_bytes: int = int(os.environ.get("ATENSOR_MALLOC_KEEP", str(128 << 20)))
    native: str = os.environ.get("ATENSOR_NATIVE", "jit")
    worker_nice: int = int(os.environ.get("ATENSOR_WORKER_NICE", "0"))
    net_wait: str = os.environ.get("ATENSOR_NET_WAIT", "poll")
    net_timeout_s: float = float(os.environ.get("ATENSOR_NET_TIMEOUT", "300"))
    max_devices: int = int(os.environ.get("ATENSOR_MAX_DEVICES", "16"))


# The settings in effect, per context: a `Context` block changes them for the code inside it (its trio
# task and the tasks and realizes it starts), not for concurrent tasks. A realize runs in the context
# it was issued in, whichever thread plans it (hcq/host.py's Job keeps that context).
_defaults = Settings()
_current: contextvars.ContextVar[Settings] = contextvars.ContextVar("atensor_settings", default=_defaults)


class _CurrentSettings:
    """`atensor.settings`: reads (and assignments) go to the settings of the current context; outside
    any `Context` block those are the process-wide ones."""
    __slots__ = ()

    def __getattr__(self, name: str) -> object:
        return getattr(_current.get(), name)

    def __setattr__(self, name: str, value: object) -> None:
        current = _current.get()
        if not hasattr(current, name):
            raise AttributeError(f"unknown atensor setting {name!r}; known: {sorted(f.name for f in fields(Settings))}")
        setattr(current, name, value)

    def __repr__(self) -> str:
        return repr(_current.get())


settings = _CurrentSettings()


@contextlib.contextmanager
def Context(**changes: object) -> Iterator[Settings]:
    """Changes settings for the duration of a `with` block, in this context only (this trio task and
    what it starts; concurrent tasks keep theirs): `with Context(racecheck=True): ...`.

    >>> with Context(schedule_cache=False) as inside:
    ...     (inside.schedule_cache, settings.schedule_cache)
    (False, False)
    >>> settings.schedule_cache == _defaults.schedule_cache
    True
    """
    known = {f.name for f in fields(Settings)}
    unknown = set(changes) - known
    if unknown:
        raise TypeError(f"unknown atensor setting(s) {sorted(unknown)}; known: {sorted(known)}")
    new = dataclasses.replace(_current.get(), **changes)
    token = _current.set(new)
    try:
        yield new
    finally:
        _current.reset(token)
