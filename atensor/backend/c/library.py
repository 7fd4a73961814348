"""Compiled libraries on disk and in the process: the cache directory, its keys, and loading.

Why apart from the compiler (backend/c/compiler.py) and the registry (backend/c/registry.py): a library is
compiled once per machine, compiler, flags and source, and every later process loads it from the disk at
once; that rule is the same for the kernel libraries and for the standalone helpers (the MPI net
commands, the packed-weight kernels, convolution windows, the C replay), so it lives in one place.
`build` compiles what is missing (the calls at once, one per group) and loads all; `load_helper` is the
one-library form for a helper.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from atensor.backend.c import compiler
from atensor.backend.c import flags as c_flags


@dataclass
class Loaded:
    """The kernel libraries loaded by this process. They stay loaded: the registry's kernels call their
    functions, and a native program holds their addresses.

    Lock: `lock`, held to append (the registry's compiles run on the background compile thread and on
    callers' threads). Lifetime: the process; nothing is ever unloaded."""
    libraries: list[ctypes.CDLL] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, libraries: list[ctypes.CDLL]) -> None:
        """Keeps `libraries` loaded for the process's life."""
        with self.lock:
            self.libraries.extend(libraries)


LOADED = Loaded()


def cache_dir() -> Path:
    """Where compiled libraries are kept ($ATENSOR_CACHE, else $XDG_CACHE_HOME/atensor, else ~/.cache;
    a temporary directory when that cannot be written)."""
    root = os.environ.get("ATENSOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "atensor")
    path = Path(root) / "native"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"atensor-native-{os.getuid() if hasattr(os, 'getuid') else 0}"


@functools.lru_cache(maxsize=1)
def cpu_key() -> str:
    """-march=native code is only valid on this kind of CPU: the cache key includes its flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join((*parts, cpu_key())).encode()).hexdigest()[:32]


def build(cc: str, sources: list[tuple[tuple[str, ...], str]], defines: tuple[str, ...]) -> list[ctypes.CDLL]:
    """Each (flags, source) compiled (unless cached) and loaded, the compiler calls at once (one per
    group: the large kernels' call beside the others'). Raises OSError or SubprocessError."""
    paths = [cache_dir() / f"{_key(source, cc, *flags, *defines)}.so" for flags, source in sources]
    missing = [(flags, source, path) for (flags, source), path in zip(sources, paths) if not path.exists()]
    errors: list[BaseException] = []

    def build_one(flags: tuple[str, ...], source: str, path: Path) -> None:
        try:
            compiler.compile_source(cc, source, path, defines, flags)
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(exc)
    threads = [threading.Thread(target=build_one, args=job, name="atensor-cc") for job in missing[1:]]
    for t in threads:
        t.start()
    if missing:
        build_one(*missing[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [ctypes.CDLL(str(path)) for path in paths]


@functools.lru_cache(maxsize=None)
def kernel_defines(cc: str) -> tuple[str, ...]:
    """`c_flags.defines(cc)` (the vector math every kernel library is compiled with), its probe's answer
    kept in `cache_dir()` per machine, compiler and flags. Why kept: the probe is a compile and a link
    (145 ms measured with cProfile, 150-250 ms at load 7 on the 2-core machine) that every process paid
    before its first kernel library, even one loaded from this cache; a hot eager loop ran ~600 round
    trips on numpy kernels meanwhile (engine/program.py's twin waits for its kernels)."""
    key = _key(c_flags._PROBE, cc, *c_flags.FLAGS)
    answers = {found: cache_dir() / f"mvec-{key}.{found}" for found in ("yes", "no")}
    if answers["yes"].exists() or answers["no"].exists():
        return c_flags.MVEC_DEFINES if answers["yes"].exists() else ()
    defines = c_flags.defines(cc)
    try:
        answers["yes" if defines else "no"].touch()
    except OSError:
        pass  # (probed again by the next process)
    return defines


def load_helper(name: str, source: str) -> ctypes.CDLL:
    """A standalone C helper library (not a kernel: its own entry points, no prelude), compiled once per
    machine, compiler, flags and source into `cache_dir()` and loaded. Raises `RuntimeError` without a
    compiler and `subprocess.SubprocessError` when it does not compile; callers fall back to Python."""
    cc = compiler.path()
    if cc is None:
        raise RuntimeError("no C compiler ($CC, cc, gcc or clang) on PATH")
    flags = c_flags.FLAGS
    path = cache_dir() / f"{name}-{_key(source, cc, *flags)}.so"
    if not path.exists():
        compiler.compile_source(cc, source, path, (), flags)
    return ctypes.CDLL(str(path))
