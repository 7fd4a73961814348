"""Dense float32 matmuls through atensor against numpy and PyTorch CPU, in one run.

    python bench/dense.py [--rounds 5] [--quick]      # writes bench/results/dense.json

Two workloads, each an `atensor.jit` function replayed (as an inference loop runs it), checked equal to
numpy first (bench/mlp_forward.py times MLP forwards at batch 256, issue 47's dense target):
- rows: x @ W.T for 1 and 8 rows of x over 48 nn.Linear-style weights of 1536x576 (SmolLM2-135M's MLP
  shape, 170 MB, 16 of them with --quick: several times the last-level cache). Every call reads every
  weight once, so its time is at least weight bytes / read bandwidth (a numpy sum's over 256 MiB, measured
  in the run): that bound is the "limit" column.
- gemm: a square 1024^3 product; numpy's BLAS (OpenBLAS) is the anchor: the same library at the same
  threads is what a dense GEMM of ours competes with.
Rounds alternate the peers (atensor, numpy, torch, then reversed), each figure the best of 5 calls per
round, the median over rounds reported; "vs numpy" and "vs torch" are their time / atensor's (above 1:
atensor is faster). torch runs with as many threads as atensor's BLAS (`ATENSOR_BLAS_THREADS`, else the
cores); numpy's BLAS threads are its library's default. Timing on a shared machine is noisy: read the
ratios of one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import read_bandwidth, table, write_results  # noqa: E402

ROWS_SHAPE, ROWS_WEIGHTS = (1536, 576), 48


@dataclass(frozen=True)
class Row:
    """One workload's medians (microseconds per call) and ratios; `limit_us` where a physical bound applies."""
    workload: str
    atensor_us: float
    numpy_us: float
    torch_us: float | None
    limit_us: float | None
    gflops: float

    @property
    def vs_numpy(self) -> float:
        return self.numpy_us / self.atensor_us

    @property
    def vs_torch(self) -> float | None:
        return None if self.torch_us is None else self.torch_us / self.atensor_us


@dataclass(frozen=True)
class Workload:
    """A workload: its callables per peer (each returns its result as numpy or torch), its FLOPs per call,
    the bytes it must read from memory per call (0 where the data fits in cache)."""
    name: str
    peers: dict[str, Callable[[], object]]
    flops: float
    must_read: int


def _best(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _torch(threads: int):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def workloads(quick: bool, torch) -> list[Workload]:
    """The workloads, built and checked against numpy (atensor captured and replaying)."""
    import atensor
    from atensor import Tensor
    rng = np.random.default_rng(0)
    out: list[Workload] = []

    def check(name: str, step: Callable[[], object], want: np.ndarray) -> None:
        for _ in range(3):  # run, capture, verify: then it replays
            got = step()
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3, err_msg=name)

    weights = [rng.standard_normal(ROWS_SHAPE).astype(np.float32) for _ in range(ROWS_WEIGHTS // (3 if quick else 1))]
    at_w = [Tensor(w) for w in weights]
    Tensor.realize(*at_w).wait()
    t_w = [torch.from_numpy(w) for w in weights] if torch else []

    @atensor.jit
    def rows_step(x: Tensor) -> Tensor:
        return Tensor.stack(*[x @ w.T for w in at_w])

    for m in (1, 8):
        x_np = rng.standard_normal((m, ROWS_SHAPE[1])).astype(np.float32)
        x = Tensor(x_np)
        check(f"rows {m}", lambda: rows_step(x).numpy(), np.stack([x_np @ w.T for w in weights]))
        peers = {"atensor": lambda x=x: rows_step(x).numpy(), "numpy": lambda x_np=x_np: [x_np @ w.T for w in weights]}
        if torch:
            x_t = torch.from_numpy(x_np)
            peers["torch"] = lambda x_t=x_t: [x_t @ w.T for w in t_w]
        out.append(Workload(f"rows {m} x {len(weights)} weights {ROWS_SHAPE[0]}x{ROWS_SHAPE[1]}", peers,
                            2.0 * m * ROWS_SHAPE[0] * ROWS_SHAPE[1] * len(weights), sum(w.nbytes for w in weights)))

    n = 512 if quick else 1024
    a_np, b_np = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a, b = Tensor(a_np), Tensor(b_np)

    @atensor.jit
    def gemm(a: Tensor, b: Tensor) -> Tensor:
        return a @ b

    check("gemm", lambda: gemm(a, b).numpy(), a_np @ b_np)
    peers = {"atensor": lambda: gemm(a, b).numpy(), "numpy": lambda: a_np @ b_np}
    if torch:
        a_t, b_t = torch.from_numpy(a_np), torch.from_numpy(b_np)
        peers["torch"] = lambda: a_t @ b_t
    out.append(Workload(f"gemm {n}^3", peers, 2.0 * n ** 3, 0))

    return out


def measure(work: Workload, rounds: int, bandwidth: float) -> Row:
    """Medians over `rounds` alternating rounds of each peer's best of 5 calls."""
    times: dict[str, list[float]] = {name: [] for name in work.peers}
    for r in range(rounds):
        for name in (list(work.peers) if r % 2 == 0 else list(work.peers)[::-1]):
            times[name].append(_best(work.peers[name]))
    med = {name: statistics.median(ts) * 1e6 for name, ts in times.items()}
    return Row(work.name, med["atensor"], med["numpy"], med.get("torch"),
               work.must_read / bandwidth * 1e6 if work.must_read else None, work.flops / med["atensor"] / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median reported)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 16 weights, a 512^3 gemm")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    threads = int(os.environ.get("ATENSOR_BLAS_THREADS", 0)) or os.cpu_count() or 1
    torch = _torch(threads)
    bandwidth = read_bandwidth()
    rows = [measure(w, rounds, bandwidth) for w in workloads(args.quick, torch)]
    print(table(f"dense float32, us per call, median of {rounds} alternating rounds (read bandwidth {bandwidth / 1e9:.1f} "
                f"GB/s; torch {threads} threads)",
                ["workload", "atensor us", "numpy us", "torch us", "limit us", "atensor GFLOP/s", "vs numpy",
                 "vs torch"],
                [[r.workload, r.atensor_us, r.numpy_us, r.torch_us if r.torch_us is not None else "-",
                  r.limit_us if r.limit_us is not None else "-", r.gflops, f"{r.vs_numpy:.2f}x",
                  f"{r.vs_torch:.2f}x" if r.vs_torch is not None else "-"] for r in rows]))
    print("vs numpy / vs torch: their time / atensor's (above 1: atensor faster); limit: weight bytes / read "
          "bandwidth, the least time a call that reads every weight can take")
    path = write_results("dense", {"rounds": rounds, "quick": args.quick, "torch_threads": threads,
                                   "read_GBps": bandwidth / 1e9,
                                   "rows": [asdict(r) | {"vs_numpy": r.vs_numpy, "vs_torch": r.vs_torch}
                                            for r in rows]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
