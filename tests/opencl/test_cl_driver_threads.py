"""The threads an OpenCL driver starts when the process first lists its platforms (pocl's CPU device:
its workers, which each launch wakes) get `worker_nice` as atensor's own workers do, so the event
loop's thread keeps its core on a busy machine; with the default 0 they run as the process does. In a
fresh process each time: a driver starts its threads once per process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import os, threading
before = set(os.listdir('/proc/self/task'))
from atensor.hcq import cl_runtime
import pyopencl  # its import may start a thread of its own: not the driver's
before |= set(os.listdir('/proc/self/task'))
devices = cl_runtime.listed_devices()
started = sorted(set(os.listdir('/proc/self/task')) - before)
main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
print(devices[0][0].name if devices else '', main, *[os.getpriority(os.PRIO_PROCESS, int(t)) for t in started], sep=';')
"""


def _probe(nice: int) -> tuple[str, int, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATENSOR_WORKER_NICE": str(nice)}
    env.setdefault("POCL_DEVICES", "pthread pthread")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip().splitlines()[-1].split(";")
    return out[0], int(out[1]), [int(x) for x in out[2:]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness is Linux's")
def test_the_threads_a_driver_starts_at_the_first_listing_get_worker_nice_and_the_caller_keeps_its_own():
    platform, main, started = _probe(7)
    if "Portable Computing Language" not in platform:
        pytest.skip(f"the platform {platform!r} is not pocl: which threads a driver starts is its own")
    assert started, "pocl's CPU device started no thread when listed"
    assert main == 0 and all(nice == 7 for nice in started), (main, started)
    platform, main, started = _probe(0)
    assert main == 0 and started and all(nice == 0 for nice in started), (main, started)
