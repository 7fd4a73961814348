"""Across processes through MPI: allreduce bandwidth as an atensor task against mpi4py's own call,
the data-parallel step of the flagship on 2 ranks x 1 device, 1 rank x 2 devices and torch DDP
(gloo) over 2 processes, and weak scaling beside the machine's floor.

    python bench/mpi.py [--quick] [--only allreduce,step,weak] [--sizes 1M,4M] [--baseline OTHER_CHECKOUT --rounds N]

`--sizes` measures the allreduce at those sizes only (K and M suffixes; default: all of SIZES).
`--baseline` alternates rounds of another checkout's atensor (e.g. /work/main) and this one's, for
A/B figures of a change: per round, each tree's ratios measured in the same processes.

Each configuration runs in fresh processes (`mpiexec -n 2` for the multi-process ones):
- allreduce, 4 KiB..64 MiB of float32 over 2 ranks: `dist.allreduce(x)` in an `atensor.jit`
  function (a replay of that one NetAllReduce task starts the collective in C on the calling thread:
  up to 4 MiB it waits there up to 2 ms, and only a collective still in flight then is submitted to
  CPU:0's net queue; a larger one is submitted first; a submitted one is tested on the calling thread
  until the queue's worker takes it over and finishes it, GIL released; the result buffer is new on
  every call, as a step's would be), and the same with 8 allreduces in one jitted call (a step's
  buckets: the replay's Python paid once for 8 collectives, as nccl-tests measures many in flight), against
  `comm.Allreduce(x, out)` on numpy arrays, the physical anchor here (the same MPI, no atensor):
  on one hot pair of arrays, and like for like, cycling through as many pairs as the jitted calls
  touch (2 for the single call, 8 for the bucketed one: the same bytes from the same cache state).
  Bus bandwidth = 2 (n - 1) / n * bytes / time (NCCL's convention; n = 2 ranks: bytes / time);
- step: examples/train.py's MLP and fused Adam at the flagship's global batch (128), the step an
  `atensor.jit` function as in the flagship; 2 ranks x 1 device (each 64 rows; gradient and loss
  allreduced across processes by net tasks), 1 rank x 2 devices (the allreduce within the process),
  torch DDP with gloo over 2 processes (64 rows each, 1 thread each). BLAS: one thread per kernel
  (the flagship's products are below atensor's threshold for more), torch set to 1 thread;
- weak scaling, as DDP reports it: every rank keeps 128 rows; ratio = step time on 2 ranks / on 1;
  the machine's floor for it: two 1-rank runs at once with no communication at all, against one
  alone. On 2 cores nothing can scale beyond what two cores allow.
The machine is shared and loaded by other work: absolute times drift, the ratios measured in the
same run are what to compare.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import table, time_steps, write_results  # noqa: E402

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
WARMUP = 5
BUCKETS = 8  # allreduces in one jitted call: a training step's gradient buckets
PAIRED_FROM, PAIRED_BLOCKS, MODE_GAP = 1 << 20, 24, 1.6  # the paired blocks (paired_blocks, split_modes)


# ---- workers (one per process; rank 0 prints the JSON line) --------------------------------------
def _reps(nbytes: int, quick: bool) -> int:
    reps = max(5, min(300, (256 << 20) // nbytes // 4))
    return max(3, reps // 4) if quick else reps


def split_modes(pairs: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """`pairs` of (mpi4py time, anything) per block, split into the anchor's modes: sorted by the
    mpi4py time, cut at the largest jump between neighbours when it is more than MODE_GAP times (the
    bimodal Allreduce of this VM: ~300 or ~880 us at 1 MiB, switching over seconds), else one mode."""
    ordered = sorted(pairs)
    if len(ordered) < 4:
        return [ordered]
    jumps = [(ordered[i + 1][0] / ordered[i][0], i) for i in range(len(ordered) - 1)]
    ratio, at = max(jumps)
    return [ordered[:at + 1], ordered[at + 1:]] if ratio >= MODE_GAP else [ordered]


def anchor(comm: Any, name: str, count: int, hot: tuple, rot: list, rot8: list) -> None:
    """`count` of mpi4py's own Allreduces: on one hot pair of arrays ("mpi4py"), cycling through the
    pairs of `rot` ("mpi4py_rot") or of `rot8` ("mpi4py_rot8")."""
    pairs = [hot] if name == "mpi4py" else rot if name == "mpi4py_rot" else rot8
    for k in range(count):
        comm.Allreduce(*pairs[k % len(pairs)])


def parse_sizes(text: str) -> list[int]:
    """"1M,4M" -> [1 << 20, 4 << 20] (K, M suffixes; a bare number is bytes)."""
    units = {"K": 1 << 10, "M": 1 << 20}
    return [int(p[:-1]) * units[p[-1].upper()] if p[-1].upper() in units else int(p) for p in text.split(",")]


def worker_allreduce(quick: bool, sizes: list[int]) -> dict:
    import numpy as np
    import trio
    from mpi4py import MPI
    import atensor
    from atensor import Tensor, dist
    from atensor.jit.jit import JitError
    from atensor.hcq.device import Device
    world = dist.init(("CPU:0",))
    comm = MPI.COMM_WORLD

    async def reduce(x: Tensor) -> Tensor:
        return dist.allreduce(x)

    async def reduce_buckets(*xs: Tensor) -> tuple:
        return tuple(dist.allreduce(x) for x in xs)
    rows = []
    net_queue = Device.get("CPU:0").queue("net")

    async def warm_jit(xs: list, wait: str = "poll", fn: Any = reduce) -> Any:
        """A jitted allreduce past its capture and verify calls. Two inputs alternate, so a replay
        must really reduce its input (a stale value would fail the checks); a verify call that sees
        different graphs (atensor.jit's capture depends on whether an equal value is still held in
        memory) is retried with a fresh jit."""
        for _ in range(5):
            jitted = atensor.jit(fn)
            try:
                with atensor.Context(net_wait=wait):  # read when the net command is lowered (capture)
                    for k in range(WARMUP):  # no result kept: a held equal value changes what is captured
                        await jitted(*xs[k % len(xs)])
                return jitted
            except JitError:
                continue
        raise RuntimeError("atensor.jit could not capture the allreduce in 5 tries")

    async def paired_blocks(comm: Any, data: Any, out: Any, rot: list, rot8: list, jitted: dict, xs: list,
                            rotations: list, reps: int) -> dict:
        """PAIRED_BLOCKS blocks, each of a few calls of every kind back to back (the order alternating)
        after a barrier: mpi4py's Allreduce on one hot pair of arrays, on the jitted call's two inputs'
        worth of arrays (rot) and on BUCKETS pairs (rot8), the awaited jitted call (poll) and the
        bucketed one (per allreduce). The kinds of a block run within milliseconds of each other, so
        they see the same mode of the anchor, and each block's ratios are taken within its mode
        (split_modes, on the hot anchor's time)."""
        calls = max(3, reps // 8)
        bucket_calls = max(1, calls // BUCKETS)
        kinds = ("mpi4py", "mpi4py_rot", "atensor", "mpi4py_rot8", "atensor_buckets")
        blocks = []
        with atensor.Context(net_wait="poll"):
            for block in range(PAIRED_BLOCKS):
                took = {}
                for name in (kinds if block % 2 == 0 else kinds[::-1]):
                    comm.Barrier()
                    start = time.perf_counter()
                    if name.startswith("mpi4py"):
                        anchor(comm, name, bucket_calls * BUCKETS if name == "mpi4py_rot8" else calls,
                               (data, out), rot, rot8)
                    elif name == "atensor":
                        for k in range(calls):
                            await jitted["poll"](xs[k % 2])
                    else:
                        for k in range(bucket_calls):
                            await jitted["buckets"](*rotations[k % BUCKETS])
                    count = bucket_calls * BUCKETS if name in ("mpi4py_rot8", "atensor_buckets") else calls
                    took[name] = (time.perf_counter() - start) / count
                blocks.append(took)
        modes = []
        for mode in split_modes([(b["mpi4py"], i) for i, b in enumerate(blocks)]):
            members = [blocks[i] for _, i in mode]
            med = {f"{name}_s": statistics.median(b[name] for b in members) for name in kinds}
            modes.append({"blocks": len(members), **med,
                          "ratio": statistics.median(b["mpi4py"] / b["atensor"] for b in members),
                          "rot_ratio": statistics.median(b["mpi4py_rot"] / b["atensor"] for b in members),
                          "buckets_rot8_ratio": statistics.median(b["mpi4py_rot8"] / b["atensor_buckets"]
                                                                  for b in members)})
        return {"calls_per_block": calls, "blocks": blocks, "modes": modes}

    async def main() -> None:
        for nbytes in sizes:
            n = nbytes // 4
            values = [1.0 + world.rank, 10.0 + world.rank]  # input k of rank r
            want = [sum(v + r for r in range(world.size)) for v in (1.0, 10.0)]
            data = np.full(n, values[0], dtype=np.float32)
            out = np.empty_like(data)
            # the like-for-like anchors: mpi4py over as many distinct buffers as the jitted calls touch
            # (their 2 inputs alternate, their results are fresh; a bucketed call has BUCKETS of each),
            # not one pair that stays in cache from call to call
            rot = [(np.full(n, v, dtype=np.float32), np.empty(n, np.float32)) for v in values]
            rot8 = [(np.full(n, float(j), dtype=np.float32), np.empty(n, np.float32)) for j in range(BUCKETS)]
            xs = [Tensor(np.full(n, v, dtype=np.float32), device="CPU:0") for v in values]
            await Tensor.realize(*xs)
            comm.Barrier()
            jitted = {"poll": await warm_jit([[x] for x in xs]),
                      "block": await warm_jit([[x] for x in xs], "block")}
            # BUCKETS inputs of nbytes each; call k passes them rotated by k, so every replay's result
            # k differs from the last one's (a stale value would fail the check)
            bucket_in = [Tensor(np.full(n, float(j + world.rank), dtype=np.float32), device="CPU:0")
                         for j in range(BUCKETS)]
            await Tensor.realize(*bucket_in)
            rotations = [bucket_in[k:] + bucket_in[:k] for k in range(BUCKETS)]
            jitted["buckets"] = await warm_jit(rotations, fn=reduce_buckets)
            for _ in range(WARMUP):
                comm.Allreduce(data, out)
            reps = _reps(nbytes, quick)
            target = Tensor.empty(n, device="CPU:0")
            await target.realize()

            async def in_flight() -> Tensor:  # every allreduce issued at once, one wait at the end
                for k in range(reps):
                    handle = target.assign(dist.allreduce(xs[k % 2])).realize()
                await handle
                return target
            await in_flight()
            names = ("atensor", "atensor_block", "atensor_stream", "atensor_buckets", "mpi4py", "mpi4py_rot",
                     "mpi4py_rot8")
            bucket_reps = max(3, reps // BUCKETS)
            times: dict = {name: [] for name in names}
            last: dict = {}
            for round_ in range(3 if quick else 5):  # alternating, so drift hits all alike
                for name in (names if round_ % 2 == 0 else names[::-1]):
                    comm.Barrier()
                    ran = net_queue.commands_run
                    start = time.perf_counter()
                    if name.startswith("mpi4py"):
                        anchor(comm, name, bucket_reps * BUCKETS if name == "mpi4py_rot8" else reps,
                               (data, out), rot, rot8)
                    elif name == "atensor_stream":
                        await in_flight()
                    elif name == "atensor_buckets":
                        got = None
                        with atensor.Context(net_wait="poll"):
                            for k in range(bucket_reps):
                                got = None  # the last call's results die first: the pool hands their memory on
                                got = await jitted["buckets"](*rotations[k % BUCKETS])
                        last_buckets = (k % BUCKETS, got)
                    else:
                        wait = "block" if name == "atensor_block" else "poll"
                        with atensor.Context(net_wait=wait):
                            for k in range(reps):
                                last[k % 2] = await jitted[wait](xs[k % 2])
                    calls = bucket_reps * BUCKETS if name in ("atensor_buckets", "mpi4py_rot8") else reps
                    times[name].append((time.perf_counter() - start) / calls)  # per allreduce
                    if name == "atensor_buckets":  # one native program per call: one command
                        assert net_queue.commands_run - ran == bucket_reps, (name, net_queue.commands_run - ran)
                    elif not name.startswith("mpi4py"):  # every call ran its net command (no stale value was copied)
                        assert net_queue.commands_run - ran == reps, (name, net_queue.commands_run - ran, reps)
            assert float(out[0]) == want[0] and float(target.numpy()[-1]) == want[(reps - 1) % 2]
            assert all(float(last[k].numpy()[-1]) == want[k] for k in last), "a replay gave a wrong sum"
            shift, got = last_buckets
            assert all(float(got[j].numpy()[-1]) == sum((j + shift) % BUCKETS + r for r in range(world.size))
                       for j in range(BUCKETS)), "a bucketed replay gave a wrong sum"
            comm.Barrier()
            # where an awaited jitted call's time goes (poll): host before the net command starts
            # (replay, hand-off), the command itself (the peer's lateness included), host after it (the
            # wake-up, the result), from the net queue's stamps on the host clock
            before, during, after = [], [], []
            with atensor.Context(net_wait="poll"):
                for k in range(reps):
                    called = time.perf_counter_ns()
                    last[k % 2] = await jitted["poll"](xs[k % 2])
                    returned = time.perf_counter_ns()
                    stamp = net_queue.signal.stamp(net_queue.signal.value)
                    before.append(stamp[0] - called)
                    during.append(stamp[1] - stamp[0])
                    after.append(returned - stamp[1])
            paired = (await paired_blocks(comm, data, out, rot, rot8, jitted, xs, rotations, reps)
                      if nbytes >= PAIRED_FROM else None)
            comm.Barrier()
            with atensor.profile() as prof:  # the net command's own time on its queue, per allreduce
                await in_flight()
            spans = [sp.duration_ns * 1e-9 for sp in prof.spans if sp.queue == "net"]
            t_span = statistics.median(spans)
            t_at, t_block, t_stream, t_buckets, t_mpi, t_rot, t_rot8 = (min(times[name]) for name in names)
            bus = 2 * (world.size - 1) / world.size * nbytes
            rows.append({"bytes": nbytes, "atensor_s": t_at, "atensor_block_s": t_block, "mpi4py_s": t_mpi,
                         "atensor_busbw_GBps": bus / t_at / 1e9,
                         "atensor_block_busbw_GBps": bus / t_block / 1e9,
                         "mpi4py_busbw_GBps": bus / t_mpi / 1e9, "ratio": t_mpi / t_at,
                         "block_ratio": t_mpi / t_block, "atensor_stream_s": t_stream,
                         "atensor_stream_busbw_GBps": bus / t_stream / 1e9, "stream_ratio": t_mpi / t_stream,
                         "atensor_buckets_s": t_buckets, "atensor_buckets_busbw_GBps": bus / t_buckets / 1e9,
                         "buckets_ratio": t_mpi / t_buckets, "buckets": BUCKETS,
                         "mpi4py_rot_s": t_rot, "rot_ratio": t_rot / t_at, "mpi4py_rot8_s": t_rot8,
                         "buckets_rot8_ratio": t_rot8 / t_buckets,
                         "atensor_span_s": t_span, "span_ratio": t_mpi / t_span, "reps": reps,
                         "poll_host_before_s": statistics.median(before) * 1e-9,
                         "poll_net_s": statistics.median(during) * 1e-9,
                         "poll_host_after_s": statistics.median(after) * 1e-9, "paired": paired})
    trio.run(main)
    return {"ranks": world.size, "rows": rows}


def worker_step(devices: int, batch: int, steps: int) -> dict:
    """examples/train.py's step: MLP, fused Adam, the rank's rows split over its devices inside the
    step, gradients and loss allreduced across processes (identity in one process)."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "examples"))
    import train
    import atensor
    from atensor import Tensor, dist, nn
    from atensor.nn import optim
    names = tuple(f"CPU:{k}" for k in range(devices))
    world = dist.init(names)
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, 64), dtype=np.float32)
    y_np = rng.integers(0, 10, size=batch).astype(np.int32)
    rows = world.shard_rows(batch)
    x_np, y_np = x_np[rows.start:rows.stop], y_np[rows.start:rows.stop]
    Tensor.manual_seed(0)
    net = train.MLP()
    params = nn.get_parameters(net)
    if devices > 1:
        for p in params:
            p.shard_(names)
    opt = optim.Adam(params, lr=1e-3, fused=True)

    async def step(x: Tensor, y: Tensor) -> Tensor:
        if devices > 1:
            x, y = x.shard(names, axis=0), y.shard(names, axis=0)
        loss = nn.cross_entropy(net(x), y, reduction="sum") / batch
        opt.zero_grad()
        loss.backward()
        dist.allreduce_gradients(opt)
        loss = dist.allreduce(loss.detach())
        await opt.step(loss)
        return loss
    run = atensor.jit(step)
    measured = time_steps(run, params, lambda: (Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0])),
                          steps, WARMUP)
    return {"median_s": statistics.median(measured), "min_s": min(measured), "steps": len(measured),
            "ranks": world.size, "devices": devices, "batch": batch}


def worker_ddp(batch: int, steps: int, port: int) -> dict:
    import numpy as np
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, 64), dtype=np.float32)
    y_np = rng.integers(0, 10, size=batch).astype(np.int64)
    part = np.array_split(np.arange(batch), size)[rank]
    x, y = torch.from_numpy(x_np[part]), torch.from_numpy(y_np[part])
    torch.manual_seed(0)
    sizes = (64, 256, 128, 10)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers[:-1]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        # a sum over the rank's rows / the global batch, as atensor's step (DDP averages gradients
        # over ranks; the sum keeps the same arithmetic per rank)
        loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    tdist.destroy_process_group()
    measured = times[WARMUP:]
    return {"median_s": statistics.median(measured), "min_s": min(measured), "steps": len(measured),
            "ranks": size, "threads": 1, "batch": batch}


def worker(config: dict) -> dict:
    kind = config["kind"]
    if kind == "allreduce":
        return worker_allreduce(config["quick"], config.get("sizes", SIZES))
    if kind == "step":
        return worker_step(config["devices"], config["batch"], config["steps"])
    return worker_ddp(config["batch"], config["steps"], config["port"])


# ---- the driver ----------------------------------------------------------------------------------
def _mpiexec() -> str | None:
    """The venv's mpiexec (pip's MPICH), or $ATENSOR_MPIEXEC (e.g. Open MPI's, with MPI4PY_LIBMPI set)."""
    if os.environ.get("ATENSOR_MPIEXEC"):
        return os.environ["ATENSOR_MPIEXEC"]
    search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return shutil.which("mpiexec", path=search)


def _command(config: dict, ranks: int) -> list[str]:
    command = [sys.executable, __file__, "--worker", json.dumps(config)]
    if ranks == 1:
        return command
    launcher = [_mpiexec(), "-n", str(ranks)]
    if "open-mpi.org" in subprocess.run([launcher[0], "--version"], capture_output=True, text=True).stdout:
        launcher += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return launcher + command


def _result(proc: subprocess.CompletedProcess | tuple) -> dict:
    code, out, err = (proc.returncode, proc.stdout, proc.stderr) if hasattr(proc, "returncode") else proc
    if code != 0:
        return {"error": (err.strip().splitlines() or ["failed"])[-1][:200]}
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), ATENSOR_BLAS_THREADS="1")


def run(config: dict, ranks: int = 1, tree: Path = ROOT) -> dict:
    """One configuration in fresh processes, measuring the atensor of checkout `tree`."""
    done = subprocess.run(_command(config, ranks), capture_output=True, text=True, env=_env(tree), timeout=1800)
    return _result(done)


def run_together(config: dict, copies: int, tree: Path = ROOT) -> dict:
    """`copies` one-process runs at once, with no communication: the slowest one's timings."""
    procs = [subprocess.Popen(_command(config, 1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(tree)) for _ in range(copies)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        results.append(_result((proc.returncode, out, err)))
    errors = [r for r in results if "error" in r]
    return errors[0] if errors else max(results, key=lambda r: r["median_s"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BATCH = 128
PER_RANK = 128


def measure_steps(steps: int, tree: Path = ROOT, torch: bool = True) -> dict:
    step = {"2 ranks x 1 device": run({"kind": "step", "devices": 1, "batch": BATCH, "steps": steps}, 2, tree),
            "1 rank x 2 devices": run({"kind": "step", "devices": 2, "batch": BATCH, "steps": steps}, 1, tree),
            "1 rank x 1 device": run({"kind": "step", "devices": 1, "batch": BATCH, "steps": steps}, 1, tree)}
    if torch and importlib.util.find_spec("torch") is not None:
        step["torch DDP gloo, 2 processes"] = run({"kind": "ddp", "batch": BATCH, "steps": steps,
                                                   "port": _free_port()}, ranks=2)
        step["torch, 1 process"] = run({"kind": "ddp", "batch": BATCH, "steps": steps, "port": _free_port()})
    return step


def measure_weak(steps: int) -> dict:
    alone = run({"kind": "step", "devices": 1, "batch": PER_RANK, "steps": steps})
    two = run({"kind": "step", "devices": 1, "batch": 2 * PER_RANK, "steps": steps}, ranks=2)
    floor = run_together({"kind": "step", "devices": 1, "batch": PER_RANK, "steps": steps}, 2)
    weak = {"1 rank": alone, "2 ranks": two, "2 one-rank runs at once (no communication)": floor}
    if all("median_s" in r for r in weak.values()):
        weak["scaling"] = two["median_s"] / alone["median_s"]
        weak["floor"] = floor["median_s"] / alone["median_s"]
    return weak


def print_allreduce(ar: dict, title: str = "allreduce across 2 processes, float32 (busbw = bytes / time for "
                                           "2 ranks)") -> None:
    if "error" in ar:
        print("allreduce:", ar["error"])
        return
    print(table(title,
                ["size", "mpi4py us", "jit poll us", "jit block us", "in flight us", f"{BUCKETS}/call us",
                 "net span us", "mpi4py GB/s", f"{BUCKETS}/call GB/s", "jit poll", "jit block", "in flight",
                 f"{BUCKETS}/call", "net span"],
                [[_size(r["bytes"]), r["mpi4py_s"] * 1e6, r["atensor_s"] * 1e6, r["atensor_block_s"] * 1e6,
                  r["atensor_stream_s"] * 1e6, r.get("atensor_buckets_s", float("nan")) * 1e6,
                  r["atensor_span_s"] * 1e6, r["mpi4py_busbw_GBps"],
                  r.get("atensor_buckets_busbw_GBps", float("nan")), f"{r['ratio']:.2f}x",
                  f"{r['block_ratio']:.2f}x", f"{r['stream_ratio']:.2f}x", f"{r.get('buckets_ratio', 0):.2f}x",
                  f"{r['span_ratio']:.2f}x"] for r in ar["rows"]]))
    if all("mpi4py_rot_s" in r for r in ar["rows"]):
        print(table("like for like: mpi4py's Allreduce over as many distinct arrays as the jitted calls touch",
                    ["size", "mpi4py 2 pairs us", "jit poll us", "jit poll", f"mpi4py {BUCKETS} pairs us",
                     f"{BUCKETS}/call us", f"{BUCKETS}/call"],
                    [[_size(r["bytes"]), r["mpi4py_rot_s"] * 1e6, r["atensor_s"] * 1e6, f"{r['rot_ratio']:.2f}x",
                      r["mpi4py_rot8_s"] * 1e6, r["atensor_buckets_s"] * 1e6,
                      f"{r['buckets_rot8_ratio']:.2f}x"] for r in ar["rows"]]))
    print(table("where an awaited jitted call (poll) spends its time: per-call medians (us)",
                ["size", "host before net", "net command", "host after net"],
                [[_size(r["bytes"]), r["poll_host_before_s"] * 1e6, r["poll_net_s"] * 1e6,
                  r["poll_host_after_s"] * 1e6] for r in ar["rows"]]))
    paired = [(r, m) for r in ar["rows"] if r.get("paired") for m in r["paired"]["modes"]]
    if paired:
        print(table("paired blocks: a few calls of each kind back to back, split by the hot anchor's mode "
                    "(median per mode, us per allreduce)",
                    ["size", "mode", "blocks", "mpi4py hot", "mpi4py 2 pairs", "jit poll", "jit poll / hot",
                     "jit poll / 2 pairs", f"mpi4py {BUCKETS} pairs", f"{BUCKETS}/call",
                     f"{BUCKETS}/call / {BUCKETS} pairs"],
                    [[_size(r["bytes"]), f"{i + 1} of {len(r['paired']['modes'])}", m["blocks"],
                      m["mpi4py_s"] * 1e6, m["mpi4py_rot_s"] * 1e6, m["atensor_s"] * 1e6, f"{m['ratio']:.2f}x",
                      f"{m['rot_ratio']:.2f}x", m["mpi4py_rot8_s"] * 1e6, m["atensor_buckets_s"] * 1e6,
                      f"{m['buckets_rot8_ratio']:.2f}x"]
                     for r in ar["rows"] if r.get("paired") for i, m in enumerate(r["paired"]["modes"])]))
    print("\n  ".join([
        "ratios: bandwidth against mpi4py's own Allreduce on numpy (its time / the task's); target >= 0.9x "
        "from 1 MiB up.",
        "jit poll/block: one jitted allreduce per call, awaited each time (the net command polling, or in "
        "MPI's blocking call: ATENSOR_NET_WAIT=block);",
        "in flight: all reps issued as eager realizes, one await at the end (as nccl-tests streams ops; "
        "each eager realize plans on the host, ~200+ us on these cores);",
        f"{BUCKETS}/call: one jitted call allreducing {BUCKETS} tensors of the size (a step's gradient "
        "buckets), awaited per call; time per allreduce = call time / "
        f"{BUCKETS} (the replay's Python is paid once per {BUCKETS}; the net queue runs them back to back "
        "in one native program);",
        "net span: the net command's own duration on its queue (profiler span), waiting for the peer "
        "included;",
        "like for like: mpi4py's Allreduce on one pair of arrays keeps them in cache from call to call, "
        "while a jitted call reads inputs and writes fresh results that are not (its 2 inputs alternate; "
        f"a bucketed call has {BUCKETS}); the same Allreduce cycling through as many pairs is the anchor "
        "for the same bytes from the same cache state (at 1 MiB on this VM, ~300 us on one pair, ~480-700 "
        f"us cycling through {BUCKETS});",
        "paired blocks: mpi4py's 1 MiB Allreduce on this VM takes ~300 or ~880 us and switches between the "
        "two over seconds whatever runs (see the closing notes of issue 20); the table above takes each "
        "tree's best block, which may come from different modes, so the paired blocks give the ratio "
        "within each mode (blocks split where mpi4py's sorted times jump by more than "
        f"{MODE_GAP}x);",
        "host before/after net: an awaited jitted call from its start to its net command's start (the "
        "replay, the hand-off to the net queue unless the command starts on the calling thread), and from "
        "the command's end to the call's return (the wake-up, the result)"]))
    print()


def print_steps(step: dict) -> None:
    base = step["1 rank x 1 device"].get("median_s")
    print(table(f"data-parallel step of the flagship (MLP, Adam), global batch {BATCH}",
                ["configuration", "median ms", "min ms", "vs 1 rank x 1 device"],
                [[name, r.get("median_s", float("nan")) * 1e3, r.get("min_s", float("nan")) * 1e3,
                  f"{r['median_s'] / base:.2f}x" if base and "median_s" in r else r.get("error", "")]
                 for name, r in step.items()]))


def print_weak(weak: dict) -> None:
    alone = weak["1 rank"]
    print(table(f"weak scaling: {PER_RANK} rows per rank (ratio: step time / 1 rank's; 1.0 is perfect)",
                ["configuration", "median ms", "ratio"],
                [[name, r.get("median_s", float("nan")) * 1e3,
                  f"{r['median_s'] / alone['median_s']:.2f}x" if "median_s" in r and "median_s" in alone
                  else r.get("error", "")] for name, r in weak.items() if isinstance(r, dict)]))


def expectation_of(ar: dict, step: dict) -> dict:
    """The multi-host expectation for the flagship from the measured allreduce and step."""
    grad_bytes = 4 * (64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
    rows_ar = ar.get("rows", [])
    near = min(rows_ar, key=lambda r: abs(r["bytes"] - grad_bytes), default=None)
    smallest = rows_ar[0] if rows_ar else None
    # what atensor adds per collective on top of MPI: the jitted 4 KiB allreduce's time less mpi4py's own
    overhead = max(0.0, smallest["atensor_s"] - smallest["mpi4py_s"]) if smallest else float("nan")
    compute = step.get("1 rank x 1 device", {}).get("median_s", float("nan"))
    expectation: dict = {"gradient_bytes": grad_bytes, "atensor_overhead_per_collective_s": overhead,
                         "one_rank_step_s": compute,
                         "model": "step on n hosts = one rank's step at its share of the batch (here: the "
                                  "1-rank step, an upper bound) + ring allreduce 2 (n-1)/n * bytes / link "
                                  "+ 2 (n-1) link latencies + atensor's per-collective overhead (measured)"}
    if near is not None:
        expectation["measured_allreduce_s_near_that_size"] = near["atensor_s"]
        expectation["measured_at_bytes"] = near["bytes"]
    for name, gbps, latency in (("10 GbE", 1.25e9, 50e-6), ("100 Gb InfiniBand", 12.5e9, 5e-6)):
        network = {n: 2 * (n - 1) / n * grad_bytes / gbps + 2 * (n - 1) * latency for n in (2, 4, 8)}
        expectation[name] = {f"{n} hosts": {"allreduce_s": t, "step_s": compute + t + overhead}
                             for n, t in network.items()}
    print(f"\nmulti-host expectation for the flagship ({grad_bytes / 1024:.0f} KiB of gradient per step, one "
          f"allreduce; 1-rank step {compute * 1e3:.2f} ms, atensor's overhead per collective "
          f"{overhead * 1e6:.0f} us as measured above); ring allreduce over n hosts = 2 (n-1)/n * bytes / "
          "link bandwidth + 2 (n-1) link latencies:")
    for name in ("10 GbE", "100 Gb InfiniBand"):
        print(f"  {name}: " + ", ".join(f"{k}: allreduce {v['allreduce_s'] * 1e6:.0f} us, step "
                                        f"{v['step_s'] * 1e3:.2f} ms" for k, v in expectation[name].items()))
    return expectation


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def ab(baseline: Path, rounds: int, parts: set[str], quick: bool, steps: int, sizes: list[int]) -> dict:
    """`rounds` alternating rounds (baseline then this tree, then this tree then baseline, ...) of the
    allreduce and step measurements; per-round figures and their medians and ranges."""
    trees = {"baseline": baseline, "this": ROOT}
    got: dict = {name: {"allreduce": [], "step": []} for name in trees}
    for round_ in range(rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for name, tree in order:
            if "allreduce" in parts:
                got[name]["allreduce"].append(run({"kind": "allreduce", "quick": quick, "sizes": sizes}, 2, tree))
            if "step" in parts:
                got[name]["step"].append(measure_steps(steps, tree, torch=False))
        print(f"round {round_ + 1}/{rounds} done", flush=True)
    summary: dict = {"baseline_tree": str(baseline), "rounds": rounds, "per_round": got}
    if "allreduce" in parts:
        rows = []
        for name in trees:
            runs = [r for r in got[name]["allreduce"] if "rows" in r]
            for i, nbytes in enumerate(sizes):
                pick = [r["rows"][i] for r in runs]
                if not pick:
                    continue
                entry = {"tree": name, "bytes": nbytes}
                for key in ("ratio", "block_ratio", "stream_ratio", "buckets_ratio", "span_ratio", "mpi4py_s",
                            "atensor_s",
                            "atensor_stream_s", "poll_host_before_s", "poll_net_s", "poll_host_after_s"):
                    if all(key in p for p in pick):
                        entry[key] = _spread([p[key] for p in pick])
                rows.append(entry)
        summary["allreduce"] = rows
        print(table(f"allreduce, {rounds} alternating rounds: median [min-max] over rounds of mpi4py's time / "
                    f"atensor's (each round's ratio measured in the same processes)",
                    ["tree", "size", "mpi4py us", "jit poll us", "jit poll", "jit block", "in flight",
                     f"{BUCKETS}/call", "net span"],
                    [[r["tree"], _size(r["bytes"]), r["mpi4py_s"]["median"] * 1e6, r["atensor_s"]["median"] * 1e6]
                     + [f"{r[k]['median']:.2f}x [{r[k]['min']:.2f}-{r[k]['max']:.2f}]" if k in r else "-"
                        for k in ("ratio", "block_ratio", "stream_ratio", "buckets_ratio", "span_ratio")]
                     for r in rows]))
        print(table(f"where an awaited jitted call (poll) spends its time, {rounds} alternating rounds: median "
                    f"per round of the per-call medians, median [min-max] over rounds (us)",
                    ["tree", "size", "host before net", "net command", "host after net"],
                    [[r["tree"], _size(r["bytes"])]
                     + [f"{r[k]['median'] * 1e6:.0f} [{r[k]['min'] * 1e6:.0f}-{r[k]['max'] * 1e6:.0f}]"
                        if k in r else "-" for k in ("poll_host_before_s", "poll_net_s", "poll_host_after_s")]
                     for r in rows]))
    if "step" in parts:
        rows = []
        for config in ("2 ranks x 1 device", "1 rank x 2 devices", "1 rank x 1 device"):
            for name in trees:
                values = [r[config]["median_s"] for r in got[name]["step"] if "median_s" in r.get(config, {})]
                if values:
                    rows.append({"tree": name, "configuration": config, "median_s": _spread(values)})
        summary["step"] = rows
        print(table(f"flagship step, {rounds} alternating rounds: median step time per round, median [min-max]",
                    ["configuration", "tree", "median ms", "range ms"],
                    [[r["configuration"], r["tree"], r["median_s"]["median"] * 1e3,
                      f"{r['median_s']['min'] * 1e3:.2f}-{r['median_s']['max'] * 1e3:.2f}"] for r in rows]))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and steps")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--only", default="allreduce,step,weak",
                        help="comma-separated parts to run: allreduce, step, weak (default: all)")
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES,
                        help="allreduce sizes, comma-separated with K/M suffixes (default: all)")
    parser.add_argument("--baseline", type=Path,
                        help="another atensor checkout: alternate rounds of it and this one (allreduce, step)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --baseline (default 3)")
    parser.add_argument("--out", default="mpi", help="bench/results/<OUT>.json (default mpi)")
    args = parser.parse_args()
    if args.worker:
        result = worker(json.loads(args.worker))
        if int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
            print(json.dumps(result))
        return
    if _mpiexec() is None:
        sys.exit("bench/mpi.py needs mpiexec and mpi4py: pip install 'atensor[mpi]'")
    parts = set(args.only.split(","))
    unknown = parts - {"allreduce", "step", "weak"}
    if unknown:
        sys.exit(f"--only: unknown parts {sorted(unknown)}; choose from allreduce, step, weak")
    steps = 10 if args.quick else args.steps
    lines = subprocess.run([_mpiexec(), "--version"], capture_output=True, text=True).stdout.splitlines()
    # hydra (MPICH) prints "Version: 5.0.2" among its build details; Open MPI "mpiexec (OpenRTE) 4.1.4"
    mpi = [" ".join(line.split()) for line in lines if "Version:" in line or "OpenRTE" in line]
    data: dict = {"threads": "1 BLAS thread per kernel (atensor), torch.set_num_threads(1) per process",
                  "note": "shared 2-core machine: absolute times drift, compare ratios within the run",
                  "mpiexec": mpi[0] if mpi else "", "command": " ".join(sys.argv)}
    print(f"threads: {data['threads']}; {data['note']}; {data['mpiexec']}\n")
    if args.baseline is not None:
        data["ab"] = ab(args.baseline.resolve(), args.rounds, parts, args.quick, steps, args.sizes)
        path = write_results(args.out, data)
        print(f"\nwritten: {path.relative_to(ROOT)}")
        return
    ar: dict = {}
    step: dict = {}
    if "allreduce" in parts:
        ar = data["allreduce"] = run({"kind": "allreduce", "quick": args.quick, "sizes": args.sizes}, ranks=2)
        print_allreduce(ar)
    if "step" in parts:
        step = data["step"] = measure_steps(steps)
        print_steps(step)
    if "weak" in parts:
        data["weak_scaling"] = measure_weak(steps)
        print()
        print_weak(data["weak_scaling"])
    if ar and step:
        data["multi_host_expectation"] = expectation_of(ar, step)
    path = write_results(args.out, data)
    print(f"\nwritten: {path.relative_to(ROOT)}")


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


if __name__ == "__main__":
    main()
