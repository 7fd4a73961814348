"""Every kind of net command against numpy, under mpiexec: dtypes, ops, in place or not, eager and jitted.

    mpiexec -n 2 python tests/dist/collectives.py [--python]

`--python` runs the net commands through mpi4py (the wait an MPI of unknown ABI gets) instead of C.

Partial k of rank r (of R ranks, K devices each) holds `values(r * K + k)`, so every rank can compute
the world's result with numpy alone. Checked:
- `dist.allreduce` of a one-device tensor: float32, float64, int32, int64 and a dtype the C net
  command does not take (int16, through mpi4py); ops sum, max, prod and mean (floats); eagerly and
  in an `atensor.jit` function (whose replays run the net queue in a native program);
- the hierarchical allreduce of 2 devices per rank (the local partials reduced first, then the net
  command in place on the reduced buffer), sum and mean;
- a replay of one net task started on the calling thread (processes.HERE_NS): with the peer on time
  and a wait there long enough, it finishes there; with the peer late (rank 1 sleeps) and a wait
  there of 1 ns, the collective left in flight is finished by the net queue, with the right sums;
- the same with every collective counted long (processes.HERE_MAX_BYTES 0): its command is submitted
  first and the calling thread tests it until the net queue's worker takes it over, with the peer on
  time and with the peer late, with the right sums;
- three allreduces in one jitted call (one native program on the net queue): the calling thread
  starts the first one once the program is submitted, and the worker takes it over ("lead").
Prints one line: the number of checks, whether the net commands ran in C ("native": true/false), and
for each of the four last cases how many calls finished on the calling thread, how many replays
there were, and how many calls were submitted and tested there meanwhile ("here"), and how many replays
the plan's lean record of its one net command submitted ("lean_net", engine/net_replay.py).
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import trio

import atensor
from atensor import Tensor, dist
from atensor.dist import native_net, processes
from atensor.engine.net_replay import NetAlone
from atensor.jit import direct
from atensor.hcq.device import Device

N = 1000


def values(partial: int, dtype: str) -> np.ndarray:
    """Small values whose sums and products are exact in every dtype checked (prod: 1, 2 or 3)."""
    base = np.arange(N) % 5 + partial
    return (base % 3 + 1).astype(dtype)


def reference(op: str, parts: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(parts)
    if op == "sum":
        return stack.sum(0, dtype=stack.dtype)
    if op == "max":
        return stack.max(0)
    if op == "prod":
        return stack.prod(0, dtype=stack.dtype)
    return (stack.sum(0, dtype=stack.dtype) / len(parts)).astype(stack.dtype)


async def main() -> None:
    world = dist.init(("CPU:0", "CPU:1"))
    if "--python" in sys.argv:
        world.native = None  # net runners are made when first lowered: none is made yet
    checks = 0

    def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
        nonlocal checks
        assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=what)
        checks += 1

    cases = [(d, op) for d in ("float32", "float64", "int32", "int64", "int16") for op in ("sum", "max", "prod")]
    cases += [("float32", "mean"), ("float64", "mean")]
    for dtype, op in cases:
        mine = values(world.rank, dtype)
        want = reference(op, [values(r, dtype) for r in range(world.size)])
        got = await dist.allreduce(Tensor(mine, device="CPU:0"), op).realize()
        check(got.numpy(), want, f"eager {op} {dtype}")

        async def reduce(x: Tensor) -> Tensor:
            return dist.allreduce(x, op)
        jitted = atensor.jit(reduce)
        for call in range(5):  # capture, verify, replays; each call's input differs
            shifted = values(world.rank + call, dtype)
            want = reference(op, [values(r + call, dtype) for r in range(world.size)])
            got = await jitted(Tensor(shifted, device="CPU:0"))
            check(got.numpy(), want, f"jit call {call} {op} {dtype}")
    devices = ("CPU:0", "CPU:1")
    for op in ("sum", "mean"):
        parts = [values(r * 2 + k, "float32") for r in range(world.size) for k in range(2)]
        want = reference(op, parts)

        async def hierarchical(a: Tensor, b: Tensor) -> Tensor:
            return dist.allreduce(Tensor.allreduce([a, b], op), op)
        jitted = atensor.jit(hierarchical)
        for call in range(5):
            a, b = (Tensor(parts[world.rank * 2 + k], device=d) for k, d in enumerate(devices))
            got = await jitted(a, b)
            for shard in got.shards:
                check(shard.numpy(), want, f"hierarchical {op} call {call}")
    net = Device.get("CPU:0").queue("net")
    here, lean_net = [], []  # per case: ...; the replays submitted by the plan's NetAlone record
    lean_calls = [0]
    original_command = NetAlone.command

    def counting_command(self: NetAlone, base: int, task_id: int):
        lean_calls[0] += 1
        return original_command(self, base, task_id)
    NetAlone.command = counting_command
    cases = ((60_000_000_000, 0.0, 2 << 20), (1, 0.2, 2 << 20), (2_000_000, 0.0, 0), (2_000_000, 0.2, 0))
    defaults = processes.HERE_NS, processes.HERE_MAX_BYTES
    for here_ns, late_s, here_max_bytes in cases:
        # read when the net runner is made (the capture lowers it)
        processes.HERE_NS, processes.HERE_MAX_BYTES = here_ns, here_max_bytes
        shared = sum(native_net.shared.values())

        async def plain(x: Tensor) -> Tensor:
            return dist.allreduce(x)
        jitted = atensor.jit(plain)
        ran_here, lean_before = net.ran_here, lean_calls[0]
        for call in range(7):  # a plain call, the capture, the verify, then replays
            if call >= 2 and world.rank == 1:
                time.sleep(late_s)
            want = reference("sum", [values(r + call, "float32") for r in range(world.size)])
            got = await jitted(Tensor(values(world.rank + call, "float32"), device="CPU:0"))
            check(got.numpy(), want, f"replay here (wait there {here_ns} ns, peer late {late_s} s) call {call}")
        here.append((net.ran_here - ran_here, jitted.stats["replays"],
                     sum(native_net.shared.values()) - shared))
        lean_net.append(lean_calls[0] - lean_before)
    processes.HERE_NS, processes.HERE_MAX_BYTES = defaults

    async def three(a: Tensor, b: Tensor, c: Tensor) -> tuple:
        return dist.allreduce(a), dist.allreduce(b, "max"), dist.allreduce(c)
    jitted = atensor.jit(three)
    shared = sum(native_net.shared.values())
    for call in range(6):
        ins = [Tensor(values(world.rank + call + k, "float32"), device="CPU:0") for k in range(3)]
        got = await jitted(*ins)
        for k, (op, out) in enumerate(zip(("sum", "max", "sum"), got)):
            check(out.numpy(), reference(op, [values(r + call + k, "float32") for r in range(world.size)]),
                  f"three allreduces in one call, call {call}, output {k}")
    lead = (jitted.stats["replays"], sum(native_net.shared.values()) - shared)

    # results of the caching allocator's sizes (128 KiB: a one-net-command replay makes them in one step,
    # hcq/device.py `fresh_pooled`), two kept alive at a time, so the pool hands a dead one's memory on
    async def big(x: Tensor) -> Tensor:
        return dist.allreduce(x)
    jitted, kept, lean_before = atensor.jit(big), {}, lean_calls[0]
    pooled, original_pooled = [0], direct.fresh_pooled

    def counting_pooled(*args):
        pooled[0] += 1
        return original_pooled(*args)
    direct.fresh_pooled = counting_pooled
    for call in range(8):
        mine = np.full(1 << 15, float(world.rank + call), dtype=np.float32)
        kept[call % 2] = await jitted(Tensor(mine, device="CPU:0"))
        want = np.full(1 << 15, float(sum(r + call for r in range(world.size))), dtype=np.float32)
        check(kept[call % 2].numpy(), want, f"a 128 KiB jitted allreduce, call {call}")
    direct.fresh_pooled = original_pooled
    big_lean = (jitted.stats["replays"], lean_calls[0] - lean_before, pooled[0])
    if world.is_root:
        print(json.dumps({"checks": checks, "native": world.native is not None, "ranks": world.size,
                          "here": here, "lead": lead, "lean_net": lean_net, "big_lean": big_lean}))


if __name__ == "__main__":
    trio.run(main)
