"""Host CPU of the eager path, per task, measured on the calling thread (time.thread_time).

    python bench/eager_host_cpu.py

Building the nodes of a chain of `(x + 1).contiguous()` (and of N independent `x_i + 1`), then
preparing, scheduling (cached), planning and submitting them: engine/realize.py's `_prepare`, called on
this thread instead of the dispatcher's, so that one thread's CPU time holds the whole host path.
Thread CPU time is not inflated when other processes take the cores, so on a shared machine it A/Bs
host-side changes (the storage ledger's bookkeeping, say) far more steadily than wall time; it does
not see waiting, waking or the queue workers (bench/overhead.py measures those). Minimum of 15 repeats
of 300 tasks after 3 warm-ups; NULL and CPU devices.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.engine import realize as engine_realize  # noqa: E402
from atensor.engine.dispatch import Job  # noqa: E402
from atensor.ledger import versions  # noqa: E402

clock = time.thread_time


def _prepare(captured: list) -> None:
    job = Job(None, [])
    job.record = None
    engine_realize._prepare(job, captured, versions.pending_heads())


def chain(device: str, n: int) -> tuple[float, float]:
    x = Tensor.empty(16, device=device)
    start = clock()
    for _ in range(n):
        x = (x + 1).contiguous()
    built = clock()
    _prepare([(x, x.node)])
    done = clock()
    x.wait()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def independent(device: str, n: int) -> tuple[float, float]:
    xs = [Tensor.empty(16, device=device) for _ in range(n)]
    start = clock()
    ys = [x + 1 for x in xs]
    built = clock()
    _prepare([(y, y.node) for y in ys])
    done = clock()
    for y in ys:
        y.wait()
    return (built - start) / n * 1e6, (done - built) / n * 1e6


def main() -> None:
    results, rows = {}, []
    for device in ("NULL", "CPU"):
        for name, case in (("chain", chain), ("independent", independent)):
            for _ in range(3):
                case(device, 300)
            runs = [case(device, 300) for _ in range(15)]
            build, prepare = min(r[0] for r in runs), min(r[1] for r in runs)
            results[f"{device}_{name}"] = {"build_us_per_task": build, "prepare_us_per_task": prepare}
            rows.append((f"atensor {device}", name, build, prepare))
    print(table("eager host CPU per task (us, thread time, min of 15 x 300 tasks; lower is better)",
                ["system", "workload", "build nodes", "prepare+schedule+plan+submit"], rows))
    print(f"wrote {write_results('eager_host_cpu', {'atensor': results})}")


if __name__ == "__main__":
    main()
