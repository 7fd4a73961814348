"""atensor's settings, read in one place.

Each setting has an environment variable (read once, at import) and can be changed at run time
through `Context`:

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
| net_wait | ATENSOR_NET_WAIT | poll | how a net queue waits for an MPI collective (atensor/dist/processes.py): `poll` tests it and yields the core between tests once it has spun for a while, `block` calls MPI's blocking collective (MPI implementations spin in it) |
| net_timeout_s | ATENSOR_NET_TIMEOUT | 0 | seconds a polling net command waits for an MPI collective before it fails (a rank stopped, or the ranks issued different collectives); the failure aborts the job. 0: no limit |
| max_devices | ATENSOR_MAX_DEVICES | 16 | devices per kind (CPU:0 ... CPU:15): a higher index is an error when the device is used, not a silently made one |
| native | ATENSOR_NATIVE | jit | which kernels are compiled to C (backend/native.py): `jit` those of `atensor.jit` replays, `all` every kernel, `0` none |
"""
from __future__ import annotations

import contextlib
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
    net_timeout_s: float = float(os.environ.get("ATENSOR_NET_TIMEOUT", "0"))
    max_devices: int = int(os.environ.get("ATENSOR_MAX_DEVICES", "16"))


settings = Settings()


@contextlib.contextmanager
def Context(**changes: object) -> Iterator[Settings]:
    """Changes settings for the duration of a `with` block: `with Context(racecheck=True): ...`."""
    known = {f.name for f in fields(Settings)}
    unknown = set(changes) - known
    if unknown:
        raise TypeError(f"unknown atensor setting(s) {sorted(unknown)}; known: {sorted(known)}")
    old = {name: getattr(settings, name) for name in changes}
    for name, value in changes.items():
        setattr(settings, name, value)
    try:
        yield settings
    finally:
        for name, value in old.items():
            setattr(settings, name, value)
