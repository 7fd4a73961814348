"""A few rows through nn.Linear-style weights (x @ W.T, W (out, in)): what serving a handful of
requests at once asks of every layer, where reading the weights is the whole cost.

    python bench/few_rows.py

48 weights of 1536x576 float32 (170 MB, several times the cache), one product each per call, for 1,
2, 4 and 8 rows: atensor in one `atensor.jit` call (C kernels: a gemv for one row, c_prelude's
at_sgemm_rows for 2..4, OpenBLAS's gemm beyond), numpy (OpenBLAS's gemv / gemm) and PyTorch CPU when
installed, on the same arrays, rounds alternating, best of 5 per round. The physical limit: every
call reads every weight once, so time >= weight bytes / memory bandwidth (memcpy's, measured here).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import memcpy_bandwidth, table, write_results  # noqa: E402

OUT, IN, WEIGHTS, ROWS, ROUNDS = 1536, 576, 48, (1, 2, 4, 8), 3


def _best(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    import atensor
    from atensor import Tensor
    try:
        import torch
        torch.set_num_threads(2)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((OUT, IN)).astype(np.float32) for _ in range(WEIGHTS)]
    at_weights = [Tensor(w) for w in weights]
    Tensor.realize(*at_weights).wait()
    torch_weights = [torch.from_numpy(w) for w in weights] if torch is not None else None

    @atensor.jit
    def layers(x: Tensor) -> Tensor:
        return Tensor.stack(*[x @ w.T for w in at_weights])

    bandwidth = memcpy_bandwidth()
    nbytes = sum(w.nbytes for w in weights)
    rows = []
    for m in ROWS:
        x_np = rng.standard_normal((m, IN)).astype(np.float32)
        x = Tensor(x_np)
        want = np.stack([x_np @ w.T for w in weights])
        for _ in range(3):  # capture, verify, first replay
            got = layers(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        peers = {"atensor": lambda: layers(x).numpy(), "numpy": lambda: [x_np @ w.T for w in weights]}
        if torch is not None:
            x_t = torch.from_numpy(x_np)
            peers["torch"] = lambda: [x_t @ w.T for w in torch_weights]
        times: dict[str, float] = {name: float("inf") for name in peers}
        for round_ in range(ROUNDS):
            for name in (list(peers) if round_ % 2 == 0 else list(peers)[::-1]):
                times[name] = min(times[name], _best(peers[name]))
        row = {"rows": m, **{f"{name}_us": 1e6 * t / WEIGHTS for name, t in times.items()},
               "limit_us": 1e6 * nbytes / bandwidth / WEIGHTS}
        row["vs_numpy"] = times["numpy"] / times["atensor"]
        if torch is not None:
            row["vs_torch"] = times["torch"] / times["atensor"]
        row["of_limit"] = row["limit_us"] / row["atensor_us"]
        rows.append(row)
    print(table(f"x @ W.T per {OUT}x{IN} float32 weight ({nbytes / 1e6:.0f} MB in all; memcpy "
                f"{bandwidth / 1e9:.1f} GB/s)",
                ["rows", "atensor us", "numpy us", "torch us", "limit us", "vs numpy", "vs torch", "of limit"],
                [[r["rows"], r["atensor_us"], r["numpy_us"], r.get("torch_us", float("nan")), r["limit_us"],
                  f"{r['vs_numpy']:.2f}x", f"{r.get('vs_torch', float('nan')):.2f}x", f"{r['of_limit']:.2f}"]
                 for r in rows]))
    print("vs numpy / torch: their time / atensor's; of limit: the memory-bandwidth bound / atensor's time")
    path = write_results("few_rows", {"benchmark": "few_rows", "shape": [OUT, IN], "weights": WEIGHTS,
                                      "memcpy_GBps": bandwidth / 1e9, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
