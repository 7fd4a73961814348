"""atensor's settings, read in one place.

Each setting has an environment variable (read once, at import) and can be changed at run time
through `Context` (per context: concurrent trio tasks keep their own):

| setting | env var | default | meaning |
|---|---|---|---|
| racecheck | ATENSOR_RACECHECK | 0 | prove every TaskGraph race-free and its kernels in bounds before it runs (tests turn it on) |
| z3_timeout_ms | ATENSOR_Z3_TIMEOUT_MS | 2000 | per z3 query of those proofs; a query that times out is a rejection |
| blas_threads | ATENSOR_BLAS_THREADS | cores / CPU devices in use | BLAS threads of a big kernel (backend/gemm/blas.py) |
| blas_parallel_flops | ATENSOR_BLAS_PARALLEL_FLOPS | 1 Mi | (sizes such as `8Mi` or `64M` are accepted here and for the byte settings) estimated flops from which a kernel's products use `blas_threads` threads; below, one |
| default_device | ATENSOR_DEVICE | CPU | where tensors are made when no device is given |
| schedule_cache | ATENSOR_SCHEDULE_CACHE | 1 | reuse the TaskGraph of a structurally equal graph (sched/cache.py) |
| allreduce_bucket_bytes | ATENSOR_BUCKET_BYTES | 25 MiB | cap of an allreduce bucket; a full bucket starts while later gradients compute |
| malloc_keep_bytes | ATENSOR_MALLOC_KEEP | 128 MiB | freed memory glibc malloc keeps for reuse instead of returning it (backend/numpy/plans.py); 0: malloc's defaults |
| worker_nice | ATENSOR_WORKER_NICE | 0 | OS niceness of atensor's worker threads (queues, dispatcher) on Linux, read when they start, and of the threads an OpenCL driver starts when first listed (pocl's CPU workers, hcq/cl_runtime.py): > 0 lets the event loop's thread win a core on a busy machine |
| loop_switch_us | ATENSOR_LOOP_SWITCH_US | 500 | the interpreter's switch interval (µs) at most while the dispatcher thread plans a realize (hcq/gilshare.py): the event loop's thread waits that long at most for the GIL, not the default 5 ms; process-wide (a `Context` does not change it: `process_settings()`), restored after; 0: the interval is left alone |
| loop_pump_us | ATENSOR_LOOP_PUMP_US | 0 | while the dispatcher plans under `loop_switch_us`, a pump thread takes the GIL every this many µs (hcq/gilshare.py), so a planner preempted by other processes is rarely holding the GIL; helps the loop's longest gap on a loaded machine (300: 3,000 outputs 22 -> 16 ms at load ~4), costs the loop's typical tick on a quiet one (its 75th-percentile GIL wait 0.3-0.6 -> 1.3-2.5 ms, Zen 5): off by default; process-wide |
| cl_spin_us | ATENSOR_CL_SPIN_US | 20 | how long (µs) a short OpenCL command launched from the calling thread (hcq/cl_queue.py `run_here`, atensor/core/cl.c) has its status read in a loop before the thread sleeps in the driver's wait: pocl's wake-up from that sleep took 20-40 µs against a tiny kernel's few (Zen 5, quiet); process-wide, read when the compiled core opens the OpenCL library; 0: sleep at once |
| net_wait | ATENSOR_NET_WAIT | poll | how a net queue waits for an MPI collective (atensor/dist/processes.py): `poll` tests it and yields the core between tests once it has spun for a while, `block` calls MPI's blocking collective (MPI's own wait, no timeout); read when a net command is lowered |
| net_timeout_s | ATENSOR_NET_TIMEOUT | 300 | seconds a net command waits for an MPI collective before it fails naming the rank and the collective (a rank stopped or hangs, or the ranks issued different collectives); the failure aborts the job. 0: no limit; read when a net command is lowered |
| max_devices | ATENSOR_MAX_DEVICES | 16 | devices per kind (CPU:0 ... CPU:15): a higher index is an error when the device is used, not a silently made one |
| native | ATENSOR_NATIVE | jit | which kernels are compiled to C (backend/c/registry.py): `jit` those of `atensor.jit` replays and of hot eager graphs (engine/program.py's twin), `all` every kernel, `0` none |
| core | ATENSOR_CORE | c | the host path's core objects (node interning, BufferSpec, the schedule key walk, the ledger's commit): `c` the compiled extension (atensor/core/*.c) when it is built, `python` the pure-Python modules it mirrors; read once at import (atensor/core/), a change at run time has no effect |
| debug | ATENSOR_DEBUG | 0 | 2 or more: print each command (kernel, copy) as it finishes, with its time, bytes and flops (profiler/counters.py); read when a realize is submitted |
| tune | ATENSOR_TUNE | 1 | kernel families with alternatives (atensor/tune/) are chosen by a short timed trial at their first use on this CPU, cached on disk; `0`: no trials (a choice cached by an earlier run is still used, else each family's safe path) |
| tune_budget_s | ATENSOR_TUNE_BUDGET | 2 | seconds of trials a process spends in all; a family met after that takes its safe path (not cached) |
| (cache file) | ATENSOR_TUNE_CACHE | ~/.cache/atensor/tune/choices.json | where the measured kernel choices are kept (`tune_cache_file()`, read at each use); under `$ATENSOR_CACHE` or `$XDG_CACHE_HOME/atensor` when those are set |
| kernels | ATENSOR_KERNELS | (unset) | forces alternatives, `family=alternative[,family=alternative...]` (e.g. `quant.gemv_f32=avx2,dense.matmul=blas`); `python -m atensor.tune` lists the families and their alternatives; an unknown name is an error when its family is first used |
| mnist_dir | ATENSOR_MNIST_DIR | (unset) | a folder holding MNIST's four idx files (`train-images-idx3-ubyte[.gz]`...), which `nn.datasets.mnist()` then loads instead of its local digits |

Besides the settings, `Context` takes tinygrad's flags that atensor has an equivalent for
(`TINYGRAD_FLAGS`): `Context(TRAINING=1)` is training mode (`Tensor.train()`, whose state lives here,
`training_mode`), `Context(DEBUG=2)` the `debug` setting. A tinygrad flag with no equivalent is an error
that names docs/porting.md.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Optional


_SUFFIXES = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def env_number(name: str, default: str, kind: type = int, sizes: bool = False) -> "int | float":
    """The number in environment variable `name` (else `default`), as `kind`. With `sizes`, a suffix
    K, M, G (powers of 1000) or Ki, Mi, Gi (powers of 1024) may follow it: `8Mi`, `64M`. A value that
    is not such a number is a ValueError naming the variable, its value and the accepted forms, raised
    at import, before anything runs with a wrong setting.

    >>> env_number("ATENSOR_DOCTEST_UNSET", "2Ki", sizes=True)
    2048
    """
    text = os.environ.get(name, default).strip()
    scale, digits = 1, text
    if sizes:
        for suffix in sorted(_SUFFIXES, key=len, reverse=True):
            if text.lower().endswith(suffix):
                scale, digits = _SUFFIXES[suffix], text[: -len(suffix)].strip()
                break
    try:
        value = float(digits) * scale if scale != 1 or kind is float else kind(digits)
    except ValueError:
        forms = "an integer" if kind is int else "a number"
        if sizes:
            forms += ", optionally followed by K, M, G (x1000) or Ki, Mi, Gi (x1024), e.g. 64Mi"
        raise ValueError(f"environment variable {name}={os.environ.get(name)!r} is not {forms}; "
                         f"set it to such a value or unset it (default {default})") from None
    if kind is int:
        if value != int(value):
            raise ValueError(f"environment variable {name}={os.environ.get(name)!r} is not a whole number; "
                             f"set it to an integer or unset it (default {default})")
        return int(value)
    return value


def cache_root() -> Path:
    """atensor's cache folder: `$ATENSOR_CACHE`, else `$XDG_CACHE_HOME/atensor`, else ~/.cache/atensor
    (compiled libraries live in its `native/`, measured kernel choices in its `tune/`)."""
    return Path(os.environ.get("ATENSOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "atensor"))


def tune_cache_file() -> Path:
    """The file of measured kernel choices (atensor/tune/cache.py): `$ATENSOR_TUNE_CACHE` (read at each
    call: the test suite points it at a file of its own run), else `tune/choices.json` in `cache_root()`."""
    forced = os.environ.get("ATENSOR_TUNE_CACHE")
    return Path(forced) if forced else cache_root() / "tune" / "choices.json"


def parse_kernels(text: str, name: str = "ATENSOR_KERNELS") -> dict[str, str]:
    """The forced alternatives of `text` (`family=alternative,...`) by family; a malformed entry is a
    ValueError naming the variable and the form.

    >>> parse_kernels("quant.gemv_f32=avx2, dense.matmul=blas")
    {'quant.gemv_f32': 'avx2', 'dense.matmul': 'blas'}
    """
    forced: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        family, sep, alternative = (s.strip() for s in part.partition("="))
        if not sep or not family or not alternative:
            raise ValueError(f"{name}={text!r}: {part!r} is not family=alternative; write e.g. "
                             f"{name}=quant.gemv_f32=avx2,dense.matmul=blas (python -m atensor.tune lists them)")
        forced[family] = alternative
    return forced


@dataclass
class Settings:
    racecheck: bool = bool(env_number("ATENSOR_RACECHECK", "0"))
    z3_timeout_ms: int = env_number("ATENSOR_Z3_TIMEOUT_MS", "2000")
    blas_threads: Optional[int] = env_number("ATENSOR_BLAS_THREADS", "0") if "ATENSOR_BLAS_THREADS" in os.environ else None
    blas_parallel_flops: int = env_number("ATENSOR_BLAS_PARALLEL_FLOPS", str(1 << 20), sizes=True)
    default_device: str = os.environ.get("ATENSOR_DEVICE", "CPU")
    schedule_cache: bool = bool(env_number("ATENSOR_SCHEDULE_CACHE", "1"))
    allreduce_bucket_bytes: int = env_number("ATENSOR_BUCKET_BYTES", str(25 << 20), sizes=True)
    malloc_keep_bytes: int = env_number("ATENSOR_MALLOC_KEEP", str(128 << 20), sizes=True)
    native: str = os.environ.get("ATENSOR_NATIVE", "jit")
    core: str = os.environ.get("ATENSOR_CORE", "c").strip().lower()
    worker_nice: int = env_number("ATENSOR_WORKER_NICE", "0")
    loop_switch_us: int = env_number("ATENSOR_LOOP_SWITCH_US", "500")
    loop_pump_us: int = env_number("ATENSOR_LOOP_PUMP_US", "0")
    cl_spin_us: int = env_number("ATENSOR_CL_SPIN_US", "20")
    net_wait: str = os.environ.get("ATENSOR_NET_WAIT", "poll")
    net_timeout_s: float = env_number("ATENSOR_NET_TIMEOUT", "300", kind=float)
    max_devices: int = env_number("ATENSOR_MAX_DEVICES", "16")
    debug: int = env_number("ATENSOR_DEBUG", "0")
    mnist_dir: Optional[str] = os.environ.get("ATENSOR_MNIST_DIR") or None
    tune: bool = bool(env_number("ATENSOR_TUNE", "1"))
    tune_budget_s: float = env_number("ATENSOR_TUNE_BUDGET", "2", kind=float)
    kernels: dict[str, str] = dataclasses.field(
        default_factory=lambda: parse_kernels(os.environ.get("ATENSOR_KERNELS", "")))


# The settings in effect, per context: a `Context` block changes them for the code inside it (its trio
# task and the tasks and realizes it starts), not for concurrent tasks. A realize runs in the context
# it was issued in, whichever thread plans it (engine/dispatch.py's Job keeps that context).
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
# the Settings in effect in this context, read once by a hot path that reads several (`settings.x` is a
# Python call per read)
current_settings = _current.get


def process_settings() -> Settings:
    """The process-wide settings (those outside any `Context` block), for a setting that acts on the
    whole process whichever context reads it (`loop_switch_us`: the interpreter's switch interval)."""
    return _defaults

# Training mode (`Tensor.training`, `Tensor.train()`, tinygrad's TRAINING), per context like the settings:
# two trio tasks, one training and one evaluating, each see their own. It lives here, beside the settings,
# so that `Context(TRAINING=1)` sets it without config importing the Tensor.
training_mode: contextvars.ContextVar[bool] = contextvars.ContextVar("atensor_training", default=False)

# tinygrad's Context flags that atensor has an equivalent for: flag -> the setting it sets (None: training
# mode). Its other flags (BEAM, JIT, NOOPT, ...) are refused naming docs/porting.md.
TINYGRAD_FLAGS: dict[str, Optional[str]] = {"TRAINING": None, "DEBUG": "debug"}
_TINYGRAD_ONLY = {"BEAM", "JIT", "NOOPT", "IMAGE", "FUSE_OPTIM", "SPLIT_REDUCEOP", "WINO", "CAPTURING",
                  "ALLOW_DEVICE_USAGE", "TC", "OPT", "PROFILE", "VIZ", "CACHELEVEL", "RANGEIFY", "FUSE_ARANGE",
                  "USE_TC", "TRANSCENDENTAL", "NOLOCALS", "LRU", "NO_MEMORY_PLANNER", "CPU_LLVM", "DEV"}


def getenv(key: str, default: object = 0) -> object:
    """tinygrad's `getenv`: environment variable `key` converted to the type of `default` (a program's own
    knob, such as `getenv("STEPS", 70)`; atensor's settings are the table above).

    >>> getenv("ATENSOR_DOCTEST_UNSET", 70), getenv("ATENSOR_DOCTEST_UNSET", 0.5)
    (70, 0.5)
    """
    return type(default)(os.environ.get(key, default))


@contextlib.contextmanager
def Context(**changes: object) -> Iterator[Settings]:
    """Changes settings for the duration of a `with` block, in this context only (this trio task and
    what it starts; concurrent tasks keep theirs): `with Context(racecheck=True): ...`. Also a decorator
    (`@Context(TRAINING=1)`), and takes tinygrad's flags in TINYGRAD_FLAGS.

    >>> with Context(schedule_cache=False) as inside:
    ...     (inside.schedule_cache, settings.schedule_cache)
    (False, False)
    >>> settings.schedule_cache == _defaults.schedule_cache
    True
    """
    known = {f.name for f in fields(Settings)}
    training = None
    for flag in [name for name in changes if name in TINYGRAD_FLAGS]:
        value = changes.pop(flag)
        if TINYGRAD_FLAGS[flag] is None:
            training = bool(value)
        else:
            changes[TINYGRAD_FLAGS[flag]] = value
    tinygrad_only = set(changes) & _TINYGRAD_ONLY
    if tinygrad_only:
        raise TypeError(f"tinygrad's Context flag(s) {sorted(tinygrad_only)} have no atensor equivalent; "
                        f"docs/porting.md says what to do instead (tinygrad flags taken: {sorted(TINYGRAD_FLAGS)})")
    unknown = set(changes) - known
    if unknown:
        raise TypeError(f"unknown atensor setting(s) {sorted(unknown)}; known: {sorted(known)} "
                        f"and tinygrad's {sorted(TINYGRAD_FLAGS)}")
    new = dataclasses.replace(_current.get(), **changes)
    token = _current.set(new)
    mode = training_mode.set(training) if training is not None else None
    try:
        yield new
    finally:
        if mode is not None:
            training_mode.reset(mode)
        _current.reset(token)
