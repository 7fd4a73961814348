"""The system C compiler: which one this process uses, and one source compiled into a shared library.

Why apart: finding the compiler and running it is the one place the native tier meets the machine's
tools. Everything above it (the library cache, backend/c/library.py; the kernel registry,
backend/c/registry.py) asks `compiler()` whether there is one and calls `compile_source` to build.
$ATENSOR_CC=none hides every compiler, as on a machine without one: kernels stay on numpy and replays
keep their Python path (the test suite runs part of itself so, tests/engine/test_no_compiler.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from atensor.backend.c import flags as c_flags


@dataclass
class Discovery:
    """The compiler this process found, looked up once (`checked`) on the first `path()` call.

    Lock: none; two threads racing the first call both find the same path and store it. Lifetime: the
    process (a changed $CC after the first call is not seen)."""
    path: Optional[str] = None
    checked: bool = False


DISCOVERY = Discovery()


def path() -> Optional[str]:
    """The C compiler's path, or None: $ATENSOR_CC when set ("none" hides every compiler), else $CC,
    cc, gcc or clang, the first found on PATH."""
    found = DISCOVERY
    if not found.checked:
        chosen = os.environ.get("ATENSOR_CC")
        if chosen is not None:
            found.path = None if chosen.strip().lower() in ("", "none") else shutil.which(chosen)
        else:
            found.path = next((shutil.which(name) for name in (os.environ.get("CC"), "cc", "gcc", "clang")
                               if name and shutil.which(name)), None)
        found.checked = True
    return found.path


def compile_source(cc: str, source: str, target: Path, defines: tuple[str, ...], flags: tuple[str, ...]) -> None:
    """Compiles the C `source` with `cc`, `flags` and `defines` into the shared library `target`, written
    atomically (a concurrent process sees the whole library or none). A compiler that does not know
    -march=native (arm64 clang) is asked again without it. Raises `subprocess.SubprocessError` with
    the compiler's error when it fails, OSError when it cannot run."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="atensor-cc-") as tmp:
        c_file = Path(tmp) / "kernels.c"
        c_file.write_text(source)
        out = Path(tmp) / "kernels.so"
        libs = c_flags.libraries(defines)
        proc = subprocess.run([cc, *flags, *defines, "-o", str(out), str(c_file), *libs],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 and "-march=native" in flags:
            portable = tuple(f for f in flags if f != "-march=native")
            proc = subprocess.run([cc, *portable, *defines, "-o", str(out), str(c_file), *libs],
                                  capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise subprocess.SubprocessError(proc.stderr.strip()[-2000:])
        os.replace(out, target)  # atomic: a concurrent process sees the whole library or none
