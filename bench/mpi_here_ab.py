"""A/B of the awaited jitted allreduce at 256 KiB, 1, 4 and 16 MiB, against mpi4py in the same processes,
interleaved more finely than bench/mpi.py: per tree and round, fresh `mpiexec -n 2` processes time 5
inner rounds of mpi4py's `Allreduce` then the jitted `dist.allreduce` (awaited per call), each the min of
its rounds; the trees alternate round by round (baseline first in odd rounds).

    python bench/mpi_here_ab.py --baseline /work/main [--rounds 6]

Why a second A/B: on a loaded shared machine bench/mpi.py's rounds are minutes apart and its ratios
swing 2-5x; here each round is seconds long. "here" is the share of calls whose net command finished on
the calling thread (Queue.ran_here; 0 for a tree without it); "shared" the share of calls submitted while
the calling thread went on testing the collective until the worker took it over (or it completed there
first: "done there"; native_net.shared; 0 for a tree without it), and "tested there" the median time
from such a submission until the calling thread left the collective to the worker (the worker's
wake-up, overlapped with the collective). Writes bench/results/mpi_here_ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import table, write_results  # noqa: E402

SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)


def worker() -> dict:
    import numpy as np
    import trio
    from mpi4py import MPI
    import atensor
    from atensor import Tensor, dist
    from atensor.dist import native_net
    from atensor.hcq.device import Device
    world = dist.init(("CPU:0",))
    comm = MPI.COMM_WORLD
    net = Device.get("CPU:0").queue("net")

    async def reduce(x: Tensor) -> Tensor:
        return dist.allreduce(x)

    async def main() -> dict:
        out = {}
        for nbytes in SIZES:
            n = nbytes // 4
            xs = [Tensor(np.full(n, 1.0 + world.rank + 10 * k, dtype=np.float32), device="CPU:0")
                  for k in range(2)]
            await Tensor.realize(*xs)
            data, res = np.ones(n, np.float32), np.empty(n, np.float32)
            jitted = atensor.jit(reduce)
            for k in range(6):  # plain call, capture, verify, replays
                await jitted(xs[k % 2])
            reps = max(10, min(100, (64 << 20) // nbytes))
            t_mpi, t_at = [], []
            here = getattr(net, "ran_here", 0)
            shared = dict(getattr(native_net, "shared", {}))
            if hasattr(native_net, "shared_ns"):  # a tree with the hand-over
                native_net.shared_ns.clear()
            for _ in range(5):
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    comm.Allreduce(data, res)
                t_mpi.append((time.perf_counter() - start) / reps)
                comm.Barrier()
                start = time.perf_counter()
                for k in range(reps):
                    last = await jitted(xs[k % 2])
                t_at.append((time.perf_counter() - start) / reps)
            now = dict(getattr(native_net, "shared", {}))
            sums = [sum(v + 10 * k for v in range(1, world.size + 1)) for k in range(2)]
            assert float(last.numpy()[0]) == sums[(reps - 1) % 2], "a replay gave a wrong sum"
            out[str(nbytes)] = {"mpi4py_s": min(t_mpi), "atensor_s": min(t_at), "ratio": min(t_mpi) / min(t_at),
                                "here": (getattr(net, "ran_here", 0) - here) / (5 * reps),
                                "shared": (sum(now.values()) - sum(shared.values())) / (5 * reps),
                                "done_there": (now.get(0, 0) - shared.get(0, 0)) / (5 * reps),
                                "shared_s": statistics.median(native_net.shared_ns) * 1e-9
                                if getattr(native_net, "shared_ns", None) else 0.0}
        return out
    return trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="another atensor checkout (e.g. /work/main)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.worker:
        result = worker()
        if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
            print(json.dumps(result))
        return
    if args.baseline is None:
        sys.exit("bench/mpi_here_ab.py needs --baseline OTHER_CHECKOUT")
    mpiexec = os.environ.get("ATENSOR_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec")
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    got: dict = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, tree in (list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]):
            done = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "--worker"], capture_output=True,
                                  text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(tree),
                                                                   ATENSOR_BLAS_THREADS="1"))
            if done.returncode != 0:
                sys.exit(f"{name} round {round_ + 1} failed: {done.stderr.strip()[-500:]}")
            got[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = []
    for nbytes in SIZES:
        for name in trees:
            runs = [r[str(nbytes)] for r in got[name]]
            ratios = [r["ratio"] for r in runs]
            rows.append({"tree": name, "bytes": nbytes, "ratio_median": statistics.median(ratios),
                         "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "mpi4py_s_median": statistics.median([r["mpi4py_s"] for r in runs]),
                         "atensor_s_median": statistics.median([r["atensor_s"] for r in runs]),
                         "here_median": statistics.median([r["here"] for r in runs]),
                         "shared_median": statistics.median([r.get("shared", 0) for r in runs]),
                         "done_there_median": statistics.median([r.get("done_there", 0) for r in runs]),
                         "shared_s_median": statistics.median([r.get("shared_s", 0.0) for r in runs])})
    print(table(f"awaited jitted allreduce, {args.rounds} alternating rounds: mpi4py's time / atensor's, median "
                f"[min-max] over rounds", ["size", "tree", "ratio", "mpi4py us", "atensor us", "here", "shared",
                                            "done there", "tested there us"],
                [[f"{r['bytes'] >> 10} KiB", r["tree"], f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}-"
                  f"{r['ratio_max']:.2f}]", r["mpi4py_s_median"] * 1e6, r["atensor_s_median"] * 1e6,
                  f"{r['here_median']:.2f}", f"{r['shared_median']:.2f}", f"{r['done_there_median']:.2f}",
                  r["shared_s_median"] * 1e6]
                 for r in rows]))
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    path = write_results("mpi_here_ab", {"command": " ".join(sys.argv), "baseline_tree": str(trees["baseline"]),
                                         "rounds": args.rounds, "rows": rows, "per_round": got,
                                         "load_average_at_end": load})
    print(f"\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
