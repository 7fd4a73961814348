"""A hot eager graph waits for its kernels from the background compiler (engine/program.py's twin,
backend/c/registry.py's compile thread). A tight loop of awaited eager round trips holds the GIL on the
event loop's thread and lets go of it only for instants (the event loop's epoll): the compile thread,
woken for the GIL each time, did not get it, and the hot template stayed on its general path
("compiling") for thousands of calls. The waiting template now gives the compile thread turns
(`registry.give_turn`). Measured with loops of `await (x + 1).realize()` in fresh processes (the first
compile of a process makes the most GIL hand-overs: threadpoolctl's /proc/self/maps read, the library
cache's file calls), AMD EPYC Zen 5, 2 cores: with the turns, the twin's kernels were compiled after
9-68 round trips in every loop (52 loops, load 2-6); before, 11 of 22 loops of 3000 round trips
never saw them at load 1.6-2, and at load 5-6 they took 11-644 (the OS's preemptions under load give the
waiter its chances; on a quiet machine it waited longest). So this test fails on the old code only
sometimes, most often on a quiet 2-core machine. A loop here is a fresh process, under trio and under
asyncio."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atensor.backend.c import compiler

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler: no background compile")

ROOT = Path(__file__).resolve().parents[2]
CALLS = 3000  # round trips a loop runs at most
BOUND = 300   # the first eager replay must come by then (measured: by ~40; the template is hot at 8)

_LOOP = """
import asyncio, json, sys
import trio
from atensor import Tensor
from atensor.engine.replay import ReplayRecord
runs = []
command = ReplayRecord.command
def counting(self, base, new_specs):
    runs.append(1)
    return command(self, base, new_specs)
ReplayRecord.command = counting

async def main():
    x = Tensor.zeros(16, device="CPU:0").contiguous()
    await x.realize()
    for call in range(1, CALLS + 1):
        y = x + 1
        await y.realize()
        if runs:
            break
    assert y.tolist() == [1.0] * 16
    return call if runs else None
print(json.dumps(trio.run(main) if sys.argv[1] == "trio" else asyncio.run(main())))
"""


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_tight_loop_of_eager_round_trips_reaches_the_eager_replay_soon(library):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("ATENSOR_NATIVE", "ATENSOR_SUITE_PROOFS", "ATENSOR_DEBUG"):  # as users run
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", _LOOP.replace("CALLS", str(CALLS)), library], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    call = json.loads(done.stdout.strip().splitlines()[-1])
    assert call is not None and call <= BOUND, \
        f"{library}: {call or f'none of {CALLS}'} round trips before the first eager replay"
