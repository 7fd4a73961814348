"""llama.cpp (llama-cpp-python) as the LLM benchmarks' peer: found if installed, built for this CPU on request
(not named llama_cpp.py: bench/ is on sys.path when a bench runs, and that name would hide the package).

    python bench/llama_peer.py            # what is installed, and the build command this CPU would get
    python bench/llama_peer.py --build    # builds and installs it into this Python (~15-20 min on 2 cores)
    python bench/llm.py --build-llama-cpp --single-only   # the same, then the benchmark

An optional bench dependency (pyproject's `llama-cpp` extra), never installed in CI. Why built here
rather than a wheel: a wheel compiled for another CPU holds that CPU's instruction set (GGML_NATIVE) or
only the baseline's, so its speed is not this CPU's; pip's cache may hand back a wheel built elsewhere,
hence `--no-cache-dir`. The CMake flags come from /proc/cpuinfo (`cmake_flags`): each ISA extension
llama.cpp can use is on exactly when this CPU has it, GGML_NATIVE off (the flags say it explicitly, so
the build log records what was built). AMX is off under a hypervisor: llama.cpp's AMX path crashed in a
KVM guest on a Sapphire Rapids Xeon (issue 47), and it runs once built without it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERSION = "0.3.36"  # the llama-cpp-python release the figures were measured with
# ggml's CMake option -> the /proc/cpuinfo flags that must all be present for it
GGML_OPTIONS = (
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_AVX512", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AMX_TILE", ("amx_tile",)),
    ("GGML_AMX_INT8", ("amx_int8",)),
    ("GGML_AMX_BF16", ("amx_bf16",)),
)
AMX = {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"}


def cmake_flags(flags: frozenset[str]) -> list[str]:
    """The CMake arguments that build llama.cpp for a CPU of these /proc/cpuinfo `flags`.

    >>> zen4 = frozenset("avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512cd avx512_vnni hypervisor".split())
    >>> [f for f in cmake_flags(zen4) if f.endswith("=ON")][:3], "-DGGML_AMX_TILE=OFF" in cmake_flags(zen4)
    (['-DGGML_AVX=ON', '-DGGML_AVX2=ON', '-DGGML_FMA=ON'], True)
    """
    hypervisor = "hypervisor" in flags
    out = ["-DGGML_NATIVE=OFF"]
    for option, needs in GGML_OPTIONS:
        on = all(f in flags for f in needs) and not (option in AMX and hypervisor)
        out.append(f"-D{option}={'ON' if on else 'OFF'}")
    return out + ["-DGGML_BLAS=OFF", "-DLLAMA_CURL=OFF"]


def pip_command(flags: frozenset[str], python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The pip command (and its environment) that builds llama-cpp-python VERSION for this CPU from source."""
    env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_flags(flags)), "FORCE_CMAKE": "1"}
    return [python, "-m", "pip", "install", "--no-cache-dir", "--no-binary", "llama-cpp-python",
            f"llama-cpp-python=={VERSION}"], env


def installed() -> Optional[str]:
    """The installed llama-cpp-python's version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def build_info() -> Optional[str]:
    """The installed llama.cpp's own account of what it was built with (its system info line), or None."""
    try:
        import llama_cpp
        return llama_cpp.llama_print_system_info().decode().strip()
    except Exception:  # noqa: BLE001 - not installed, or an old binding
        return None


def ensure(build: bool) -> Optional[str]:
    """llama-cpp-python's version: the installed one, else (with `build`) built for this CPU now; None
    when it is not there and not to be built."""
    found = installed()
    if found is not None or not build:
        return found
    from atensor.tune.machine import current
    command, env = pip_command(current().flags)
    print(f"building llama-cpp-python {VERSION} for this CPU (~15-20 min on 2 cores):\n  "
          f"CMAKE_ARGS={env['CMAKE_ARGS']!r} {' '.join(command)}", flush=True)
    subprocess.run(command, env=env, check=True)
    return installed()


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="build and install it for this CPU if it is not installed")
    args = parser.parse_args()
    from atensor.tune.machine import current
    command, env = pip_command(current().flags)
    print(f"CPU: {current().model}; build command for it:\n  CMAKE_ARGS={env['CMAKE_ARGS']!r} {' '.join(command)}")
    version = ensure(args.build)
    print(f"installed: llama-cpp-python {version}" if version else "llama-cpp-python is not installed")
    if version:
        print(f"built with: {build_info()}")


if __name__ == "__main__":
    main()
