"""What the kernel bounds proofs cost: per kernel, with the cache cold and warm, median and p95.

    python bench/z3_cost.py

The kernels are those the scheduler makes for a set of ordinary programs (elementwise chains,
reductions, matmuls, padded and permuted views, strided and flipped getitem, a KV cache written at
a symbolic `start_pos`), plus the cases interval arithmetic cannot settle and z3 must: symbolic masks
not provably inside their axes, and guarded indexed loads (gathers) whose index comes from data.
Cold: the cache is cleared before each check. Warm: the same kernel checked again (a dictionary hit
on the interned AST). Each figure is the median of REPEAT runs of one kernel; the table gives the
median and 95th percentile over the kernels of each group. Also: the race check of a 10,000-task
graph, which the test suite runs on every graph it schedules.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

from atensor import Tensor  # noqa: E402
from atensor.dtype import dtypes  # noqa: E402
from atensor.graph.node import BufferSpec, Node  # noqa: E402
from atensor.graph.ops import Ops  # noqa: E402
from atensor.graph.symbolic import Variable  # noqa: E402
from atensor.graph.view import View  # noqa: E402
from atensor.sched import boundscheck, prove  # noqa: E402
from atensor.sched.boundscheck import IndexedLoad, check_indexed_load, check_kernel  # noqa: E402
from atensor.sched.racecheck import check_race_free  # noqa: E402
from atensor.sched.schedule import schedule  # noqa: E402
from atensor.graph.taskgraph import Access, Copy, Kernel, TaskGraph  # noqa: E402

REPEAT = 7
f32, i32 = dtypes.float32, dtypes.int32


def _roots(*tensors: Tensor) -> list[Node]:
    roots = []
    for t in tensors:
        n = t.node
        spec = BufferSpec(n.device, n.size, n.dtype)
        view = View.create((n.size,)).reshape(n.shape)
        roots.append(Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), view))
    return roots


def program_kernels() -> list[Node]:
    """Kernel ASTs the scheduler makes for ordinary programs, each once."""
    x = Tensor(np.random.default_rng(0).standard_normal((16, 32, 8)).astype(np.float32))
    w = Tensor(np.ones((8, 24), dtype=np.float32))
    programs = [
        [(x * 2 + 1).exp().sqrt().tanh()],
        [x.sum(1), x.max(2), x.mean((0, 2)), (x - x.max(2, keepdim=True)).exp().sum(2)],
        [x.reshape(512, 8) @ w, x.permute(2, 0, 1).reshape(8, 512) * 3],
        [x.pad(((1, 1), (2, 2), (0, 3))).sum(0), x[:, ::-2, 1::3].flip(0)],
        [x.permute(1, 0, 2).reshape(32, 128).T.contiguous() + 1, x.reshape(4, 4, 32, 8).permute(3, 1, 2, 0)],
        [x.argmax(1), (x > 0).where(x, 0.0).sum(),
         x.shrink(((2, 9), None, (1, 7))).pad(((0, 0), (3, 3), None))],
    ]
    start_pos = Variable("start_pos", 0, 63)
    for pos in (5, 6):
        cache = Tensor(np.zeros((64, 8), dtype=np.float32))
        sp = start_pos.bind(pos)
        cache.shrink(((sp, sp + 1), None)).assign(Tensor(np.ones((1, 8), dtype=np.float32)) * 2)
        row = cache.shrink(((sp, sp + 1), None))
        padded = Tensor(np.ones((1, 8), dtype=np.float32)).pad(((sp, 63 - sp), None))
        programs.append([cache.node.base(), row * 3, padded + 1])
    kernels: dict[Node, None] = {}
    for tensors in programs:
        roots = [t if isinstance(t, Node) else None for t in tensors]
        nodes = [r for r in roots if r is not None] + _roots(*[t for t in tensors if not isinstance(t, Node)])
        for task in schedule(nodes).graph.tasks:
            if isinstance(task.work, Kernel):
                kernels.setdefault(task.work.ast)
    return list(kernels)


def _param(k: int, size: int, dtype=f32) -> Node:
    return Node.make(Ops.PARAM, dtype, (), (k, size))


def _view(src: Node, shape, strides, offset=0, mask=None) -> Node:
    return Node.make(Ops.VIEW, src.dtype, (src,), View(tuple(shape), tuple(strides), offset, mask))


def z3_kernels() -> list[Node]:
    """Symbolic kernels whose masks are not provably inside their axes: interval arithmetic cannot
    decide them, z3 does."""
    kernels = []
    for k in range(8):
        s = Variable(f"s{k}", 0, 16 + k)
        load = _view(_param(1, 64 + k), (64 + k,), (1,), 4 - s, ((s - 4, s + 1 + k),))
        out = _view(_param(0, load.size), load.shape, (1,))
        value = load.alu(Ops.ADD, Node.const(1.0, f32, "kernel", load.shape))
        kernels.append(Node.make(Ops.STORE, f32, (out, value)))
    return kernels


def gathers() -> list[IndexedLoad]:
    """Guarded indexed loads whose index is data cast from float, or position math on views."""
    loads = []
    for n in (6, 10, 33, 100, 257):
        idx = _param(2, n, f32).cast(i32)
        guard = idx.alu(Ops.CMPLT, Node.const(n, i32, "kernel", (n,))).alu(
            Ops.AND, idx.alu(Ops.CMPLT, Node.const(0, i32, "kernel", (n,))).alu(Ops.NOT))
        loads.append(IndexedLoad(_param(1, n), idx, guard))
        pos = Node.make(Ops.ARANGE, i32, (), (0, 1, n * 4, "kernel"))
        grid = _view(_view(pos, (n, 4), (4, 1)), (4, n), (1, 4))
        flat = _view(grid, (n * 4,), (1,))
        index = flat.alu(Ops.ADD, Node.const(3, i32, "kernel", (n * 4,)))
        guard = flat.alu(Ops.CMPLT, Node.const(n * 4 - 3, i32, "kernel", (n * 4,)))
        loads.append(IndexedLoad(_param(1, n * 4), index, guard))
    return loads


def _median_us(fn, cold: bool) -> float:
    times = []
    for _ in range(REPEAT):
        if cold:
            boundscheck.clear_cache()
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def _summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def main() -> None:
    groups = {"scheduled programs": program_kernels(), "symbolic masks (z3)": z3_kernels()}
    rows, data = [], {}
    for name, kernels in groups.items():
        calls = prove.stats.z3_calls
        cold = [_median_us(lambda k=k: check_kernel(k), cold=True) for k in kernels]
        z3_per_kernel = (prove.stats.z3_calls - calls) / (REPEAT * len(kernels))
        warm = [_median_us(lambda k=k: check_kernel(k), cold=False) for k in kernels]
        (cm, cp), (wm, wp) = _summary(cold), _summary(warm)
        rows.append([name, len(kernels), f"{z3_per_kernel:.2f}", cm, cp, wm, wp])
        data[name] = {"kernels": len(kernels), "z3_calls_per_kernel": z3_per_kernel, "cold_median_us": cm,
                      "cold_p95_us": cp, "warm_median_us": wm, "warm_p95_us": wp}
    loads = gathers()
    calls = prove.stats.z3_calls
    cold = [_median_us(lambda g=g: check_indexed_load(g), cold=True) for g in loads]
    cm, cp = _summary(cold)
    per = (prove.stats.z3_calls - calls) / (REPEAT * len(loads))
    rows.append(["guarded gathers (z3)", len(loads), f"{per:.2f}", cm, cp, "-", "-"])
    data["guarded gathers (z3)"] = {"loads": len(loads), "z3_calls_per_load": per, "cold_median_us": cm,
                                    "cold_p95_us": cp, "note": "indexed loads are cached with their kernel"}
    print(table("kernel bounds check, per kernel (us)",
                ["group", "n", "z3 calls", "cold median", "cold p95", "warm median", "warm p95"], rows))

    bufs = [BufferSpec("CPU", 4096, dtypes.uint8) for _ in range(64)]
    graph = TaskGraph()
    for k in range(10_000):
        src, dst = bufs[k % 64], bufs[(k * 7 + 1) % 64]
        chunk = (k // 64) % 16 * 256
        graph.add(Copy(src, dst, chunk, chunk, 256),
                  [Access(src, "r", chunk, chunk + 256), Access(dst, "w", chunk, chunk + 256)])
    race = min(_timed(lambda: check_race_free(graph)) for _ in range(3))
    print(f"\nrace check of a 10,000-task graph ({len(graph.edges())} edges): {race * 1e3:.0f} ms "
          f"({race / 10_000 * 1e6:.1f} us per task)")
    data["race_check_10k_tasks_ms"] = race * 1e3
    print(f"wrote {write_results('z3_cost', {'repeat': REPEAT, 'groups': data})}")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
