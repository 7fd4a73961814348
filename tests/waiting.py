"""Waiting in a test for what another thread finishes on its own time: a queue worker drops a command (and
the buffers its runner keeps alive) once it has run it and published its value, a reaper frees a graph.
A generous bound that only a real defect (something kept alive for good) runs into."""
from __future__ import annotations

import time
from typing import Callable


def soon(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """True once `condition()` holds, polled every 2 ms; False if it still does not after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True
