"""Data parallel over MPI processes, end to end: `mpiexec -n 2` runs compared with one-process runs of
the same global batch (losses, gradients, final weights), the flagship under mpiexec, and faults (a
killed rank, ranks that disagree at start-up) ending the job non-zero in bounded time.

Skipped, with the reason, when mpi4py or an `mpiexec` is missing (pip install 'atensor[mpi]')."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.dist import program

ROOT = Path(__file__).resolve().parents[2]
# the venv's (pip's MPICH) unless ATENSOR_MPIEXEC names another launcher: for Open MPI,
# ATENSOR_MPIEXEC=/usr/bin/mpiexec MPI4PY_LIBMPI=libmpi.so.40 (README, "More than one process or machine")
MPIEXEC = os.environ.get("ATENSOR_MPIEXEC") or shutil.which(
    "mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

pytestmark = pytest.mark.skipif(MPIEXEC is None or not HAVE_MPI4PY,
                                reason="needs mpi4py and mpiexec: pip install 'atensor[mpi]' (mpi4py, mpich)")
BOUND_S = 90  # generous: a job on a busy 2-core machine starts in a few seconds


def mpiexec(n: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python args...` from the repository root; its time is bounded."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    command = [MPIEXEC, "-n", str(n)]
    if "open-mpi.org" in subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout:
        command += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    # its own process group, so that a job over the bound is ended with every rank it started
    proc = subprocess.Popen(command + [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"mpiexec {' '.join(args)} did not end within {BOUND_S} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


async def one_process(devices: int, out: Path) -> dict:
    """The program run in this process (a world of one) on `devices` devices."""
    args = argparse.Namespace(devices=devices, steps=5, out=str(out), die_rank=-1, raise_rank=-1, die_step=-1,
                              wrong_shape_rank=-1, net_stats=None)
    await program.run(args)
    return dict(np.load(out))


def assert_same_run(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=2e-6, err_msg=key)


@pytest.mark.parametrize("ranks,devices", [(2, 1), (2, 2)])
async def test_two_ranks_match_one_process_with_all_the_devices(tmp_path, ranks, devices):
    """2 ranks x 1 device against 1 rank x 2 devices, and 2 x 2 against 1 x 4: the same losses,
    gradients (every step, replays included) and final weights within float32 rounding."""
    out = tmp_path / "mpi.npz"
    stats = tmp_path / "net"
    done = mpiexec(ranks, "tests/dist/program.py", "--devices", str(devices), "--steps", "5", "--out", str(out),
                   "--net-stats", str(stats))
    assert done.returncode == 0, done.stderr
    want = await one_process(ranks * devices, tmp_path / "one.npz")
    got = dict(np.load(out))
    for run, (n_ranks, n_devices) in ((got, (ranks, devices)), (want, (1, ranks * devices))):
        # every device of every rank: arange times the sum of 1 + k + devices * r over all partials
        factor = sum(1 + k + n_devices * r for r in range(n_ranks) for k in range(n_devices))
        for shard in run.pop("ring", []):
            np.testing.assert_array_equal(shard, np.arange(1 << 16, dtype=np.float32) * factor)
    assert_same_run(got, want)
    for rank in range(ranks):  # the replayed steps ran their net tasks too: one count per step at least
        seen = eval(Path(f"{stats}.{rank}").read_text())
        assert seen["jit"]["replays"] >= 1 and seen["counts"]["CPU:0/net"] >= 5
        # the net commands are C calls (MPICH's and Open MPI's ABIs), so replays run the net queue as
        # one native program, as they do the compute queues
        assert seen["native"] and "CPU:0/net" in seen["programs"] and "CPU:0/compute" in seen["programs"], seen
        if devices > 1:  # the ring's net tasks: one per device, each on its own net queue
            assert seen["counts"]["CPU:1/net"] >= 1


async def test_the_flagship_under_mpiexec_gives_the_one_process_losses_and_one_merged_trace(tmp_path):
    """2 ranks x 1 device against 1 rank x 2 devices: the same per-step losses; rank 0 alone prints,
    writes the losses and the weights, and one trace holds both ranks' tracks, net queues included."""
    from examples import train
    from atensor import nn
    from atensor.profiler.collector import Profile
    losses, trace, weights = tmp_path / "losses.json", tmp_path / "trace.json", tmp_path / "w.safetensors"
    done = mpiexec(2, "examples/train.py", "--devices", "1", "--epochs", "1", "--max-steps", "8",
                   "--losses", str(losses), "--profile", str(trace), "--save", str(weights))
    assert done.returncode == 0, done.stderr
    assert "x 2 processes" in done.stdout and done.stdout.count("held-out accuracy") == 1  # rank 0 prints
    one = tmp_path / "one.safetensors"
    want = await train.train(devices=2, epochs=1, max_steps=8, progress=False, save=str(one))
    np.testing.assert_allclose(json.loads(losses.read_text()), want.losses, rtol=1e-5)
    saved, reference = nn.safe_load(str(weights)), nn.safe_load(str(one))
    assert sorted(saved) == sorted(reference)
    for key in reference:
        np.testing.assert_allclose(saved[key].numpy(), reference[key].numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=key)
    tracks = {(s.device, s.queue) for s in Profile.load(trace).spans}
    assert {("rank0/CPU:0", "net"), ("rank1/CPU:0", "net"), ("rank1/CPU:0", "compute")} <= tracks


@pytest.mark.parametrize("fault,step", [("--die-rank", 4), ("--raise-rank", 4), ("--hang-rank", 4),
                                        ("--hang-rank", 0)])
def test_a_rank_killed_raising_or_hanging_mid_training_ends_the_job_non_zero_in_bounded_time(fault, step):
    """Rank 1 is killed (SIGKILL), raises, or stops at a step while rank 0 waits for it in a collective:
    the launcher ends the job (a raise aborts it through atensor.dist's excepthook; a hang makes rank
    0's net command fail after ATENSOR_NET_TIMEOUT, which aborts it). At step 4 the step is a jit
    replay, whose net queue runs a native program (the C wait aborts the job itself); at step 0 it is
    the capture, whose net command is called from Python (it raises DistError, and the hook aborts)."""
    start = time.monotonic()
    done = mpiexec(2, "tests/dist/program.py", "--steps", "6", fault, "1", "--die-step", str(step),
                   env={"ATENSOR_NET_TIMEOUT": "3"})
    assert done.returncode != 0
    assert time.monotonic() - start < BOUND_S
    if fault == "--raise-rank":
        assert "rank 1 fails on purpose at step 4" in done.stderr and "aborting every process" in done.stderr
    if fault == "--hang-rank":
        assert "allreduce of 213 elements on CPU:0 (rank 0 of 2) did not complete in 3 s" in done.stderr, \
            done.stderr
        if step == 0:
            assert "DistError" in done.stderr and "aborting every process" in done.stderr, done.stderr


def test_ranks_that_disagree_at_start_up_fail_naming_the_difference():
    done = mpiexec(2, "tests/dist/program.py", "--wrong-shape-rank", "1")
    assert done.returncode != 0
    assert "rank 1 disagrees with rank 0 on parameters: entry 0 is ((24, 8)" in done.stderr, done.stderr


@pytest.mark.parametrize("wait,path", [("poll", "C"), ("block", "C"), ("poll", "python"), ("block", "python")])
def test_every_net_command_kind_matches_numpy_under_mpiexec(wait, path):
    """tests/dist/collectives.py: dtypes, ops, eager and jitted, hierarchical in place, each against
    numpy; the net commands in C (MPICH's or Open MPI's ABI) or through mpi4py, polling or blocking."""
    done = mpiexec(2, "tests/dist/collectives.py", *(["--python"] if path == "python" else []),
                   env={"ATENSOR_NET_WAIT": wait})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["checks"] == 176 and got["ranks"] == 2
    assert got["native"] == (path == "C")
    # a replay of one net task: finished on the calling thread when the peer is on time (the wait
    # there is long enough), else handed to the net queue (1 ns there, the peer 200 ms late) after
    # that thread's tests; a long one (all are, in the last two cases) is submitted first and tested
    # there until the worker takes it over; only a C net command starts there, and a blocking one
    # is MPI's blocking call there, whatever the peer's lateness (no bound, nothing shared)
    (on_time, replays, on_time_shared), (late, late_replays, late_shared) = got["here"][:2]
    assert replays >= 2 and late_replays >= 2, got
    c_poll, c_block = (wait, path) == ("poll", "C"), (wait, path) == ("block", "C")
    assert (on_time, late, on_time_shared) == ((replays, 0, 0) if c_poll else (replays, late_replays, 0)
                                               if c_block else (0, 0, 0)), got
    assert late_shared == (late_replays if c_poll else 0), got
    for here, replays, shared in got["here"][2:]:
        assert replays >= 2 and here == 0 and shared == (replays if c_poll else 0), got
    # from the third replay on (the first lowers the runners, the second makes the record), a C net
    # command alone is submitted by its plan's NetAlone record (engine/net_replay.py), with the same
    # outcomes as above; the Python one has none
    for (_, replays, _), lean in zip(got["here"], got["lean_net"]):
        assert lean == (replays - 2 if path == "C" else 0), got
    # 128 KiB results (made with their pooled memory in one step by the NetAlone replays) match numpy
    big_replays, big_lean, pooled = got["big_lean"]
    assert big_replays >= 5 and big_lean == (big_replays - 2 if path == "C" else 0), got
    assert pooled >= (big_lean - 1 if path == "C" else 0) and (pooled > 0) == (path == "C"), got
    # three allreduces in one replayed call: the first started on the calling thread, taken over
    replays, shared = got["lead"]
    assert replays >= 2 and shared == (replays if c_poll else 0), got


def test_a_gradient_buckets_allreduce_overlaps_a_later_buckets_backward_in_the_profile(tmp_path):
    """tests/dist/overlap.py: a profiled training step on 2 ranks, one weight's gradient a bucket. On
    every rank some bucket's net command overlaps in time a kernel of a later bucket's backward (one
    that another bucket waits for, this one not), and the merged trace holds both ranks' net and
    compute tracks; with one bucket for every gradient (its net command waits for the whole backward)
    no span overlaps one, so the check itself can fail."""
    from atensor.profiler.collector import Profile
    found = {}
    for name, extra in (("buckets", []), ("one bucket", ["--bucket-bytes", str(1 << 30)])):
        out, trace = tmp_path / f"{name}.json", tmp_path / f"{name}.trace.json"
        done = mpiexec(2, "tests/dist/overlap.py", "--out", str(out), "--trace", str(trace), *extra)
        assert done.returncode == 0, done.stderr
        found[name] = json.loads(out.read_text())["ranks"]
        tracks = {(s.device, s.queue) for s in Profile.load(trace).spans}
        assert {(f"rank{r}/CPU:0", q) for r in (0, 1) for q in ("net", "compute")} <= tracks
    for rank, got in enumerate(found["buckets"]):
        assert len(got["nets"]) == 8, got["nets"]  # 4 weights and 4 biases, each its own bucket
        assert got["overlaps"], f"rank {rank}: no bucket's allreduce overlapped a later bucket's backward"
    for rank, got in enumerate(found["one bucket"]):
        assert len(got["nets"]) == 1 and got["overlaps"] == [], got
