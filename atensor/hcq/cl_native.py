"""The compiled launch of a short OpenCL command (atensor/core/cl.c), on the OpenCL library pyopencl
loaded: found here, opened once.

Why find the library in /proc/self/maps: pyopencl's wheel links its own copy of the ICD loader
(`pyopencl/.libs/libOpenCL-<hash>.so`), a system install links the system's `libOpenCL.so.1`; the
handles pyopencl hands out (`.int_ptr`) belong to whichever the process mapped, so the compiled core
opens that same file (RTLD_NOLOAD: never a second copy) rather than guessing a name. Where no such file
is mapped, the core is the Python one (ATENSOR_CORE=python), or the library lacks an entry point,
`native()` is None and every command takes pyopencl's path (hcq/cl_queue.py `submit`).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

from atensor.config import process_settings
from atensor.core import ccore

_lock = threading.Lock()
_opened: Optional[Any] = None   # the compiled core once it opened the library
_tried = False


def loaded_library() -> Optional[str]:
    """The path of the OpenCL ICD loader this process mapped (pyopencl's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                name = path.rsplit("/", 1)[-1]
                if name.startswith("libOpenCL") and ".so" in name:
                    return path
    except OSError:  # no /proc (not Linux): the Python path
        return None
    return None


def native() -> Optional[Any]:
    """The compiled core with its OpenCL entry points resolved (`cl_enqueue`, `cl_finish`), or None when
    it is not there (see the module docstring). Called after pyopencl is imported (a CL device is open)."""
    global _opened, _tried
    if _tried:
        return _opened
    with _lock:
        if not _tried:
            path = loaded_library() if ccore is not None and hasattr(ccore, "cl_open") else None
            _opened = ccore if path is not None and ccore.cl_open(path) else None
            if _opened is not None:  # how long `cl_finish` reads the status before it sleeps
                _opened.cl_spin(process_settings().cl_spin_us * 1000)
            _tried = True
    return _opened


__all__ = ["loaded_library", "native"]
