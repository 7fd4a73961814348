"""The packed-weight kernels in C (backend/quant/source.py's source), compiled once per machine and bound.

Why a helper library of their own rather than a kernel's rendered body: the block decodes and their
three paths are a few hundred lines of intrinsics, the same for every QMATMUL; rendered into each
kernel library they would be compiled again with each jit capture. A QMATMUL kernel's C (backend/c/render.py)
is one call through the `at_packed_qmatmul` pointer its library's prelude holds, which backend/c/registry.py sets
to the helper's `atq_matmul` (`point`) when it loads a library; `library()` compiles and loads the helper.

`matmul` and `dequantize` call a chosen path directly (`matmul` on a chosen number of threads too):
the tests hold each path the CPU has, on one thread and on two, to the portable one and to numpy.
"""
from __future__ import annotations

import ctypes
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
from atensor.graph.quant import PackedShape

PATHS = ("portable", "avx2", "avx512")


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
            for path in PATHS:
                fn = getattr(lib, f"atq_dequant_{path}", None)
                if fn is not None:
                    fn.restype = None
            lib.atq_matmul_run.restype = None
            for name in ("atq_has_avx2", "atq_has_avx512", "atq_threads"):
                getattr(lib, name).restype = ctypes.c_int
            lib.atq_best_path.restype = ctypes.c_char_p
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


def best_path() -> str:
    """The path the compiled library's kernels use (chosen at compile time from -march=native)."""
    lib = library()
    return lib.atq_best_path().decode() if lib is not None else "numpy"


def available_paths() -> list[str]:
    """The paths this CPU can run: portable always, avx2 and avx512 when it has their instructions."""
    lib = library()
    if lib is None:
        return []
    return ["portable"] + [p for p in ("avx2", "avx512") if getattr(lib, f"atq_has_{p}")()]


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
    best C path through this library unless `settings.native` is "0" or it did not compile, else
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


def matmul(x: np.ndarray, packed: np.ndarray, shape: PackedShape, path: str = "best",
           threads: Optional[int] = None) -> np.ndarray:
    """x (m, cols) float32 @ W^T through the C kernel of `path` ("best", or one of `available_paths`)
    on `threads` threads (default: the BLAS thread count now set, as a kernel's run reads it), with
    `shape.activations`' numerics."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the packed-weight kernels did not compile: {failure()}")
    if path != "best" and path not in PATHS:
        raise ValueError(f"no kernel path {path!r}; the paths are 'best' and {PATHS}")
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, shape.cols)
    w = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    if w.size != shape.nbytes:
        raise ValueError(f"{shape} needs {shape.nbytes} bytes, got {w.size}")
    out = np.empty((x.shape[0], shape.rows), np.float32)
    count = lib.atq_threads() if threads is None else threads
    lib.atq_matmul_run(ctypes.c_int(-1 if path == "best" else PATHS.index(path)), ctypes.c_int(shape.kernel_code),
                       _pointer(x), _pointer(w), _pointer(out), ctypes.c_int64(x.shape[0]),
                       ctypes.c_int64(shape.cols), ctypes.c_int64(shape.rows), ctypes.c_int(count))
    return out


def dequantize(packed: np.ndarray, shape: PackedShape, path: str = "best") -> np.ndarray:
    """The (rows, cols) float32 matrix, decoded by the C kernel of `path`."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the packed-weight kernels did not compile: {failure()}")
    w = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    out = np.empty((shape.rows, shape.cols), np.float32)
    fn = lib.atq_dequant if path == "best" else getattr(lib, f"atq_dequant_{path}")
    fn(ctypes.c_int(shape.format.code), _pointer(w), _pointer(out), ctypes.c_int64(shape.rows),
       ctypes.c_int64(shape.cols))
    return out
