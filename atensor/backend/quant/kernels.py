"""The packed-weight kernels in C (backend/quant/source.py's source), compiled once per machine and bound,
and the run-time choice among their variants.

Why a helper library of their own rather than a kernel's rendered body: the block decodes and their
paths are a few hundred lines of intrinsics, the same for every QMATMUL; rendered into each kernel
library they would be compiled again with each jit capture. A QMATMUL kernel's C (backend/c/render.py)
is one call through the `at_packed_qmatmul` pointer its library's prelude holds, which backend/c/registry.py sets
to the helper's `atq_matmul` (`point`) when it loads a library; `library()` compiles and loads the helper.

The variants (backend/quant/variants_c.py's table), the interface atensor/tune/ chooses through:
- a *family* is one kind of call, fixed by its operands: `FAMILIES`, and `family_of(shape, rows_of_x)`
  says which family a product falls in ("gemv_f32", "gemv_q8": one row of x; "rows_f32", "rows_q8":
  two or more; "dequant": a whole decode);
- `variants(family)` lists its `Variant`s: name, the CPU features it needs, whether this CPU has them
  (checked at run time by the C library, `__builtin_cpu_supports`), and its `rank` as a default;
- `selected(family)` is the variant every call of that family runs now; `select(family, name)` switches
  it (for every compiled kernel at once: they all call `atq_matmul`), `select(family, None)` puts it back
  on the default. The default is the supported variant of highest rank: the one measured best (on Zen 3
  and Zen 4 EPYCs, bench/quant_dot.py, bench/quant_batched.py); an unmeasured variant has rank -1 and is
  never a default by its name;
- `time_variant(family, name, shape, rows_of_x, threads)` times one variant on one shape, in C (no
  ctypes call per repetition), on sample weights of the format (`sample_weights`) or given ones;
- `matmul(..., variant=name)` and `dequantize(..., variant=name)` run one variant for one call (the tests
  hold each against the portable one and numpy).
Every variant computes the values of the portable path up to the order of its float sums.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from atensor.backend.c.library import load_helper
from atensor.backend.c.programs import program_threads
from atensor.backend.gemm import openblas

from atensor.backend.quant import numpy_kernels as quant_numpy
from atensor.backend.quant.source import SOURCE
from atensor.config import settings
from atensor.graph.quant import F16, PackedShape, Q4_1

FAMILIES = ("gemv_f32", "gemv_q8", "rows_f32", "rows_q8", "dequant")  # backend/quant/variants_c.py's order


@dataclass(frozen=True)
class Variant:
    """One kernel of a family: `needs` the CPU features it runs on (names as `__builtin_cpu_supports`
    and /proc/cpuinfo spell them), `supported` whether this CPU has them all, `rank` its place as the
    family's default (the highest supported; -1 never), `index` its row in the C table."""
    family: str
    name: str
    needs: tuple[str, ...]
    supported: bool
    rank: int
    index: int


@dataclass
class Helper:
    """The helper library, compiled and loaded on the first `library()` call, its functions typed; or
    why it could not be (`failure`: no compiler, or a compile error; then QMATMUL stays on numpy).

    Lock: `lock`, held while loading (its own, not the registry's: backend/c/registry.py asks for the
    helper while holding that). Lifetime: the process; a failure is not retried."""
    lib: Optional[ctypes.CDLL] = None
    failure: Optional[str] = None
    lock: threading.Lock = field(default_factory=threading.Lock)


HELPER = Helper()


def library() -> Optional[ctypes.CDLL]:
    """The packed-weight kernels (backend/quant/source.py) as a helper library, compiled on first use
    (once per machine), its functions typed and numpy's sgemm and BLAS thread functions handed to it;
    None (and `failure()` says why) without a compiler or when it does not compile."""
    helper = HELPER
    if helper.lib is not None or helper.failure is not None:
        return helper.lib
    with helper.lock:
        if helper.lib is None and helper.failure is None:
            try:
                lib = load_helper("atensor-quant", SOURCE)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                helper.failure = f"{type(exc).__name__}: {exc}"
                return None
            blas = openblas.functions()
            if blas is not None:  # many rows of x: decoded panels through sgemm (backend/quant/source.py)
                lib.atq_set_sgemm(ctypes.c_void_p(blas.sgemm), ctypes.c_int(int(blas.ilp64)))
                if blas.set_threads and blas.get_threads:  # threads: the kernel's BLAS count (pool_c.py)
                    lib.atq_set_blas_threads(ctypes.c_void_p(blas.get_threads), ctypes.c_void_p(blas.set_threads))
            lib.atq_matmul_run.restype = lib.atq_dequant_run.restype = None
            lib.atq_time_variant.restype = ctypes.c_double
            lib.atq_variant_calls.restype = ctypes.c_uint64
            for name in ("atq_threads", "atq_variant_count", "atq_variant_supported", "atq_variant_rank",
                         "atq_selection", "atq_select", "atq_call_family"):
                getattr(lib, name).restype = ctypes.c_int
            for name in ("atq_variant_family", "atq_variant_name", "atq_variant_needs"):
                getattr(lib, name).restype = ctypes.c_char_p
            helper.lib = lib
    return helper.lib


def point(libraries: list[ctypes.CDLL]) -> None:
    """Points each kernel library's `at_packed_qmatmul` / `at_packed_dequant` (backend/c/prelude.py) at
    the helper's kernels (called by backend/c/registry.py when it loads libraries with packed kernels)."""
    helper = library()
    if helper is None:
        return
    address = lambda fn: ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)  # noqa: E731
    for lib in libraries:
        lib.atensor_set_quant(address(helper.atq_matmul), address(helper.atq_dequant))


def failure() -> Optional[str]:
    """Why the helper library could not be loaded, if it could not."""
    return HELPER.failure


def _library_or_raise() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(f"the packed-weight kernels did not compile: {failure()}")
    return lib


def variants(family: Optional[str] = None) -> list[Variant]:
    """The variants of `family` (every family's, by default) in the library's table order; [] when the
    library did not compile."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"no kernel family {family!r}; the families are {FAMILIES}")
    lib = library()
    if lib is None:
        return []
    found = []
    for i in range(lib.atq_variant_count()):
        fam = lib.atq_variant_family(i).decode()
        if family is None or fam == family:
            found.append(Variant(fam, lib.atq_variant_name(i).decode(), tuple(lib.atq_variant_needs(i).decode().split()),
                                 bool(lib.atq_variant_supported(i)), lib.atq_variant_rank(i), i))
    return found


def runnable(family: str) -> list[str]:
    """The names of `family`'s variants this CPU can run (the portable one always, first)."""
    return [v.name for v in variants(family) if v.supported]


def variant(family: str, name: str) -> Variant:
    """`family`'s variant called `name`; ValueError naming the variants there are for an unknown one."""
    found = [v for v in variants(family) if v.name == name]
    if not found:
        raise ValueError(f"no variant {name!r} of {family}; its variants are {[v.name for v in variants(family)]}")
    return found[0]


def selected(family: str) -> Variant:
    """The variant `family`'s calls run now (its default until `select`)."""
    index = _library_or_raise().atq_selection(ctypes.c_int(_family_index(family)))
    return next(v for v in variants(family) if v.index == index)


def select(family: str, name: Optional[str], held: bool = True) -> Variant:
    """Makes `name` the variant every call of `family` runs from now on (None: back to the default), in
    every compiled kernel; returns the selection. RuntimeError for a variant this CPU cannot run.
    A caller's selection is `held`: atensor/tune/ (backend/quant/tuning.py, which selects with
    held=False) leaves it as it is, until `select(family, None)`."""
    lib = _library_or_raise()
    if name is None:
        lib.atq_select(ctypes.c_int(-1 - _family_index(family)))
        _held.discard(family)
    elif not lib.atq_select(ctypes.c_int(_supported(family, name).index)):
        raise RuntimeError(f"the library refused {family} variant {name!r}")
    elif held:
        _held.add(family)
    return selected(family)


_held: set[str] = set()  # families a caller selected by name: the tuning does not change them


def is_held(family: str) -> bool:
    """Whether a caller's `select` fixed `family`'s variant (the tuning then leaves it)."""
    return family in _held


def calls(family: str, name: str) -> int:
    """How many products variant `name` of `family` has run in this process (counted in C, racy but
    never lost on one thread): which kernel a compiled QMATMUL really ran."""
    return int(_library_or_raise().atq_variant_calls(ctypes.c_int(variant(family, name).index)))


def family_of(shape: PackedShape, rows_of_x: int) -> str:
    """The family a product with `rows_of_x` rows of x through a weight of `shape` falls in (the C
    library's rule: Q8 activations only for the block formats)."""
    return FAMILIES[_library_or_raise().atq_call_family(ctypes.c_int(shape.kernel_code), ctypes.c_int64(rows_of_x))]


def sample_weights(shape: PackedShape, seed: int = 0) -> np.ndarray:
    """Random packed bytes of `shape` whose scales are finite halves of moderate size (d, m in
    [2^-7, 2^-6); F16 and BF16 values in about [-2, 2]): for timing a variant where real weights are not
    at hand (random scale bytes would hold infinities and NaNs)."""
    rng = np.random.default_rng(seed)
    fmt = shape.format
    if fmt.block == 1:  # F16, BF16: one 2-byte value each
        values = rng.uniform(-2, 2, (shape.rows, shape.cols)).astype(np.float32)
        halves = values.astype("<f2").view(np.uint8) if fmt is F16 else (
            values.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
        return np.ascontiguousarray(halves).reshape(-1)
    blocks = rng.integers(0, 256, (shape.rows * shape.cols // fmt.block, fmt.block_bytes), dtype=np.uint8)
    scales = 2 ** -7 * (1 + rng.random((len(blocks), 2)))
    blocks[:, 0:2] = scales[:, :1].astype("<f2").view(np.uint8)
    if fmt is Q4_1:
        blocks[:, 2:4] = scales[:, 1:].astype("<f2").view(np.uint8)
    return blocks.reshape(-1)


def time_variant(family: str, name: str, shape: PackedShape, rows_of_x: int = 1, threads: int = 1,
                 calls: int = 10, weights: Optional[np.ndarray] = None) -> float:
    """Seconds of wall time one call of `family`'s variant `name` takes on average over `calls` calls
    (timed in C, back to back), y = x W^T with `rows_of_x` random rows of x, on `threads` threads;
    `weights` the packed bytes (default `sample_weights(shape)`). The caller repeats it and takes the
    median where the machine is shared. ValueError if the product is not of that family."""
    lib = _library_or_raise()
    chosen = _supported(family, name)
    if family == "dequant" or family_of(shape, rows_of_x) != family:
        raise ValueError(f"a {shape} product with {rows_of_x} rows of x is a "
                         f"{family_of(shape, rows_of_x)} call, not {family}")
    w = np.ascontiguousarray(sample_weights(shape) if weights is None else weights).reshape(-1).view(np.uint8)
    if w.size != shape.nbytes:
        raise ValueError(f"{shape} needs {shape.nbytes} bytes, got {w.size}")
    x = np.random.default_rng(1).standard_normal((rows_of_x, shape.cols)).astype(np.float32)
    y = np.empty((rows_of_x, shape.rows), np.float32)
    ns = lib.atq_time_variant(ctypes.c_int(chosen.index), ctypes.c_int(shape.kernel_code), _pointer(x), _pointer(w),
                              _pointer(y), ctypes.c_int64(rows_of_x), ctypes.c_int64(shape.cols),
                              ctypes.c_int64(shape.rows), ctypes.c_int(threads), ctypes.c_int(calls))
    return ns / 1e9 / calls


def threads_follow_blas() -> bool:
    """Whether a kernel's run reads its thread count from BLAS (OpenBLAS's get and set functions were
    found, backend/quant/pool_c.py); else every packed kernel runs on one thread."""
    blas = openblas.BINDING.found
    return library() is not None and blas is not None and bool(blas.get_threads) and program_threads()


@dataclass(frozen=True)
class PoolStatistics:
    """How the packed kernels' thread pool has shared its work since the process started
    (backend/quant/pool_c.py): `jobs` run on more than one thread, and the chunks of their rows the calling
    thread ran and the workers ran. A worker that never gets a core leaves every chunk to the caller."""
    jobs: int
    caller_chunks: int
    worker_chunks: int


def pool_statistics() -> PoolStatistics:
    """The pool's counts so far (zeros when the kernels did not compile)."""
    lib = library()
    counts = (ctypes.c_uint64 * 3)()
    if lib is not None:
        lib.atq_pool_stats(counts)
    return PoolStatistics(*[int(c) for c in counts])


def run_qmatmul(x: np.ndarray, packed: np.ndarray, shape: PackedShape) -> np.ndarray:
    """A QMATMUL kernel of the numpy backend (an eager realize's; a jit replay's is compiled C): the
    C kernels (each family's selected variant) unless `settings.native` is "0" or it did not compile, else
    numpy's decode (backend/quant/numpy_kernels.py). Decoding the whole matrix in numpy would make a 113 MB float32
    temporary of SmolLM2's embedding for each prefill's logits."""
    if settings.native != "0" and library() is not None:
        return matmul(x, packed, shape).reshape(x.shape[:-1] + (shape.rows,))
    return quant_numpy.qmatmul(x, packed, shape)


def run_dequant(packed: np.ndarray, shape: PackedShape) -> np.ndarray:
    """A DEQUANT kernel of the numpy backend: the C decode unless native is "0" (see `run_qmatmul`)."""
    if settings.native != "0" and library() is not None:
        return dequantize(packed, shape)
    return quant_numpy.dequantize(packed, shape)


def _pointer(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.__array_interface__["data"][0])


def matmul(x: np.ndarray, packed: np.ndarray, shape: PackedShape, variant: Optional[str] = None,
           threads: Optional[int] = None) -> np.ndarray:
    """x (m, cols) float32 @ W^T through the C kernels, with `shape.activations`' numerics: the family's
    selected variant, or the one named `variant` (of the family `family_of(shape, m)` says), on
    `threads` threads (default: the BLAS thread count now set, as a kernel's run reads it)."""
    lib = _library_or_raise()
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, shape.cols)
    index = -1 if variant is None else _supported(family_of(shape, x.shape[0]), variant).index
    w = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    if w.size != shape.nbytes:
        raise ValueError(f"{shape} needs {shape.nbytes} bytes, got {w.size}")
    out = np.empty((x.shape[0], shape.rows), np.float32)
    count = lib.atq_threads() if threads is None else threads
    lib.atq_matmul_run(ctypes.c_int(index), ctypes.c_int(shape.kernel_code), _pointer(x), _pointer(w), _pointer(out),
                       ctypes.c_int64(x.shape[0]), ctypes.c_int64(shape.cols), ctypes.c_int64(shape.rows),
                       ctypes.c_int(count))
    return out


def dequantize(packed: np.ndarray, shape: PackedShape, variant: Optional[str] = None) -> np.ndarray:
    """The (rows, cols) float32 matrix, decoded by the dequant family's selected variant or `variant`."""
    lib = _library_or_raise()
    index = -1 if variant is None else _supported("dequant", variant).index
    w = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    out = np.empty((shape.rows, shape.cols), np.float32)
    lib.atq_dequant_run(ctypes.c_int(index), ctypes.c_int(shape.format.code), _pointer(w), _pointer(out),
                        ctypes.c_int64(shape.rows), ctypes.c_int64(shape.cols))
    return out


def _family_index(family: str) -> int:
    if family not in FAMILIES:
        raise ValueError(f"no kernel family {family!r}; the families are {FAMILIES}")
    return FAMILIES.index(family)


def _supported(family: str, name: str) -> Variant:
    """`family`'s variant `name`, which this CPU must be able to run (RuntimeError saying what it lacks)."""
    chosen = variant(family, name)
    if not chosen.supported:
        have = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
        raise RuntimeError(f"{family} variant {name!r} needs CPU features {chosen.needs}; this CPU lacks "
                           f"{[f for f in chosen.needs if f not in have] or 'some'}; it runs {runnable(family)}")
    return chosen
