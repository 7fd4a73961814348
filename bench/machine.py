"""The machine a benchmark ran on, recorded beside its figures: a speed claim counts only on the machine
where it was measured (issue 47), so every bench/results/*.json carries this record (common.write_results).

What is recorded: the CPU model (its name, and vendor, family and model numbers) and the flags that choose kernel paths here (AVX2, AVX-512 F/BW/VL, the two
VNNI forms, AVX512-BF16, AMX; "hypervisor" where the kernel reports one, since AMX and timings differ under
KVM), the core count the process may use, the load average when the benchmark started, the git revision of
the tree (and whether it had uncommitted changes), and the versions of python, numpy and torch. The model,
flags and cores are atensor/tune/machine.py's (the record the kernel choice keys its cache by), so a
result and a cached choice name the same CPU the same way.

"At start": `START_LOAD` is read when this module is first imported, which is when a bench script starts
(it imports bench/common.py at its top); the record made at the end reports that, and the load at the end
beside it. Reading versions uses package metadata, so recording never imports torch.
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the CPU flags a result depends on (the kernels' paths, llama.cpp's build), recorded with every result
FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
         "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
         "hypervisor", "neon", "asimd")


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


START_LOAD = _load()


@dataclass(frozen=True)
class Machine:
    """One benchmark run's machine. `flags` is the subset of FLAGS the CPU reports; `cores` the CPUs this
    process may run on; `load_start`/`load_end` the 1, 5 and 15 minute load averages."""
    cpu: str
    cpu_id: str
    flags: tuple[str, ...]
    cores: int
    load_start: list[float] | None
    load_end: list[float] | None
    git: str
    python: str
    numpy: str | None
    torch: str | None
    platform: str


@functools.lru_cache(maxsize=1)
def cpu() -> tuple[str, str, tuple[str, ...]]:
    """(model name, "vendor family F model M", the FLAGS it has): the model and flags as the kernel choice
    sees them (atensor/tune/machine.py), the vendor, family and model numbers from /proc/cpuinfo's first CPU
    (empty elsewhere). The numbers tell CPUs apart whose name a hypervisor shortens (a KVM guest's "AMD
    EPYC" is Zen 3 at family 25 model 1, Zen 4 at model 17)."""
    from atensor.tune.machine import current
    here = current()
    ident: dict[str, str] = {}
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        first = ""
    for line in first.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part"):
            ident[key.strip()] = value.strip()
    cpu_id = " ".join(f"{k.replace('cpu ', '')} {v}" if k != "vendor_id" else v for k, v in ident.items())
    return here.model, cpu_id, tuple(f for f in FLAGS if f in here.flags)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_revision(root: Path = ROOT) -> str:
    """The tree's commit, short, with "+dirty" when tracked files differ from it; "unknown" outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev + ("+dirty" if dirty else "")) if rev else "unknown"


def record() -> Machine:
    """This machine now: the record a results file carries (the load at start is START_LOAD)."""
    from atensor.tune.machine import current
    model, cpu_id, flags = cpu()
    cores = current().cores
    return Machine(cpu=model, cpu_id=cpu_id, flags=flags, cores=cores, load_start=START_LOAD, load_end=_load(),
                   git=git_revision(), python=platform.python_version(), numpy=_version("numpy"),
                   torch=_version("torch"), platform=platform.platform())


def as_dict(machine: Machine) -> dict:
    """The record as JSON-ready data."""
    return {**asdict(machine), "flags": list(machine.flags)}


def describe(data: dict) -> str:
    """One line naming a results file's machine, e.g. "AMD EPYC 9R14 (avx2 avx512f ...), 2 cores, load 4.1
    at start"; says so when the file predates the record."""
    if not data.get("cpu"):
        return "machine not recorded (written before bench/machine.py; rerun the benchmark)"
    load = data.get("load_start")
    load_text = f", load {load[0]:.1f} at start" if load else ""
    ident = f", {data['cpu_id']}" if data.get("cpu_id") else ""
    return f"{data['cpu']}{ident} ({' '.join(data.get('flags') or []) or 'no listed flags'}), {data.get('cores')} " \
           f"cores{load_text}, git {data.get('git')}"
