"""The running CPU as the choice mechanism sees it: its model, its feature flags, its cores, whether it
is a virtual machine's.

Why a record of its own: a kernel choice is valid only on the kind of CPU it was measured on, so the
cache key holds the model and the flags (atensor/tune/cache.py), and an alternative may run only where
the CPU has every feature it needs (`Machine.lacks`). Flags are Linux's /proc/cpuinfo names (`avx2`,
`avx512f`, `avx512_vnni`, `avx_vnni`, `amx_tile`, `hypervisor`); elsewhere the model is
`platform.processor()` and the flags are empty, so only alternatives that need nothing run there.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    """One CPU: `model` (cpuinfo's "model name"), `flags` (its feature flags), `cores` (the CPUs this
    process may use)."""
    model: str
    flags: frozenset[str]
    cores: int

    @property
    def hypervisor(self) -> bool:
        """Whether the OS runs in a virtual machine (the `hypervisor` flag): AMX, for one, may then fault."""
        return "hypervisor" in self.flags

    def lacks(self, needs: tuple[str, ...]) -> list[str]:
        """The features of `needs` this CPU does not have (empty: it can run what needs them)."""
        return [feature for feature in needs if feature not in self.flags]

    def digest(self) -> str:
        """A short hash of the model and the flags: part of every cached choice's key."""
        text = self.model + "\0" + " ".join(sorted(self.flags))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_cpuinfo(text: str, cores: int) -> Machine:
    """The Machine described by the text of /proc/cpuinfo (its first processor's model and flags).

    >>> m = read_cpuinfo("model name\\t: Some CPU\\nflags\\t\\t: fpu avx2 fma\\n", 2)
    >>> (m.model, sorted(m.flags), m.lacks(("avx2", "avx512f")))
    ('Some CPU', ['avx2', 'fma', 'fpu'], ['avx512f'])
    """
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:  # x86's "flags", ARM's "Features"
            flags = frozenset(value.split())
    return Machine(model or platform.processor() or platform.machine(), flags, cores)


@functools.lru_cache(maxsize=1)
def current() -> Machine:
    """This process's CPU (read once)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return read_cpuinfo(text, cores)
