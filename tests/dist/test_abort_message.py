"""processes.drain_stderr: before MPI_Abort a rank waits until its stderr pipe has been read, since
MPICH's mpiexec exits as soon as the abort reaches it and loses what its proxy had not read yet (a
timed-out rank's job once ended with an empty stderr). Checked with a plain pipe, no MPI needed."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
from atensor.dist.processes import drain_stderr
sys.stderr.write("x" * 20000 + "\\n"); sys.stderr.flush()
print("written", flush=True)
start = time.monotonic()
drain_stderr(timeout_s=float(sys.argv[1]))
print(f"{time.monotonic() - start:.3f}", flush=True)
"""


def child(timeout_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(timeout_s)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_drain_waits_while_nobody_reads_the_pipe_and_gives_up_at_its_bound():
    proc = child(0.5)
    assert proc.stdout.readline() == "written\n"
    # nobody reads stderr until the child has given up: it prints how long it waited once drain returns
    # (reading that line blocks for as long as the child waits: no fixed sleep needed)
    waited = proc.stdout.readline()
    err = proc.stderr.read()
    rest, _ = proc.communicate(timeout=60)
    assert len(err) == 20001 and rest == ""
    assert 0.5 <= float(waited) < 30  # generous: a busy machine delays the child, never shortens the wait


def test_drain_returns_once_the_reader_has_taken_everything():
    proc = child(60.0)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stderr.read()))
    reader.start()
    out = proc.stdout.read()  # the stdout pipe closes when the child ends
    proc.wait(timeout=60)
    reader.join(timeout=60)
    assert len(got[0]) == 20001
    assert float(out.split()[-1]) < 30  # far below its 60 s bound: it returned once the pipe was empty
