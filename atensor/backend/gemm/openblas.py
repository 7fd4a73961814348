"""The OpenBLAS that numpy uses, bound by address for C code: its gemm and gemv functions and its thread
count's setter and getter.

Why by address: the C kernels (backend/c/render.py), the packed-weight helper (backend/quant/kernels.py)
and the convolution windows (backend/gemm/window.py) call cblas_sgemm and friends from C, with no Python
between; threadpoolctl finds the library numpy loaded, and its symbols are handed to each library as
function pointers when it is loaded (`atensor_set_blas`, `atq_set_sgemm`). How many threads a product
gets is backend/gemm/blas.py's job; this module only finds the functions.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BlasFunctions:
    """Addresses of numpy's OpenBLAS functions. `ilp64`: it takes 64-bit integers (the kernels are
    compiled with ATENSOR_ILP64 then). `set_threads` / `get_threads`: openblas_set_num_threads and
    openblas_get_num_threads, 0 when not exported (a program then holds one-thread kernels only)."""
    sgemm: int
    dgemm: int
    ilp64: bool
    sgemv: int
    dgemv: int
    set_threads: int
    get_threads: int


@dataclass
class Binding:
    """The functions found, looked up once (`checked`) on the first `functions()` call.

    Lock: none; a race binds the same library twice and stores equal values. Lifetime: the process
    (tests reset `checked` to bind again)."""
    found: Optional[BlasFunctions] = None
    checked: bool = False


BINDING = Binding()


def functions() -> Optional[BlasFunctions]:
    """numpy's OpenBLAS functions, found through threadpoolctl; None when there is no such BLAS (no
    threadpoolctl, or another BLAS): kernels then have no gemm calls."""
    binding = BINDING
    if binding.checked:
        return binding.found
    binding.checked = True
    try:
        from threadpoolctl import ThreadpoolController
        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS it knows: kernels without gemm
        return None
    for lib in sorted(controllers, key=_numpy_first):
        getter = getattr(lib, "_get_symbol", None)
        if getter is None or getattr(lib, "internal_api", "") != "openblas":
            continue
        found = [getter(name) for name in ("cblas_sgemm", "cblas_dgemm", "cblas_sgemv", "cblas_dgemv")]
        if None in found:
            continue
        s, d, sv, dv = (_address(f) for f in found)
        ilp64 = "64_" in os.path.basename(str(getattr(lib, "filepath", "")))
        binding.found = BlasFunctions(s, d, ilp64, sv, dv, _address(getter("openblas_set_num_threads")),
                                      _address(getter("openblas_get_num_threads")))
        return binding.found
    return None


def _address(symbol: object) -> int:
    return ctypes.cast(symbol, ctypes.c_void_p).value if symbol else 0


def _numpy_first(lib: object) -> tuple[int, str]:
    """Orders threadpoolctl's BLAS libraries numpy's first, then by path. A process can hold two
    OpenBLAS builds (numpy's ILP64 one and scipy's, once scikit-learn is imported), which threadpoolctl
    lists in no fixed order: taking the first bound the kernels to one or the other from run to run,
    and the library's key (ATENSOR_ILP64 or not) with it, so a warm start of examples/train.py
    compiled its kernels again in about half the runs (measured: 0.6-0.8 s of compiler)."""
    path = str(getattr(lib, "filepath", ""))
    home = os.path.basename(os.path.dirname(path))
    return (0 if home.startswith("numpy") else 1, path)
