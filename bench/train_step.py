"""Training step time of the flagship model (examples/train.py's MLP, Adam) at batch 256: atensor
on 1 and 2 devices against PyTorch CPU and tinygrad CPU, and weak scaling.

    python bench/train_step.py [--steps 30]
    python bench/train_step.py --split        # where the CPU goes in the step without the jit

Each configuration runs in its own process (BLAS thread limits and devices are per process):
- `atensor 1 dev` / `atensor 2 dev`: batch 256 (split 128 + 128 on 2 devices), BLAS threads as
  atensor sets them (the cores divided among the devices in use); the step is an `atensor.jit`
  function as in examples/train.py (captured, then replayed), and the `no jit` rows rebuild it;
- `torch`: the same model, batch and optimizer, `torch.set_num_threads(2)` (the machine's cores);
- `tinygrad`: the same, with TinyJit (how tinygrad trains), when tinygrad is installed and works;
- weak scaling, as PyTorch DDP reports it: every device keeps a batch of 256 and one BLAS thread;
  scaling = step time on 2 devices / step time on 1 device (target at most 1.1; DDP: 1/0.93);
  measured twice: with the replayed kernels compiled to C (the default) and on numpy (ATENSOR_NATIVE=0);
- the machine's floor for that ratio: two torch 1-thread processes running at once (no communication)
  against one alone; on a VM whose cores are shared, this is above 1 before any allreduce; and the
  floor for atensor's own kernels: each device's kernels of the replayed step run alone against both
  devices' at once on two threads, with no copies, waits or host work (`kernel_pair`). The ratio,
  its floor, and atensor 1 device against torch 2 threads are taken per round over `--rounds`
  alternating rounds (the machine's speed drifts between processes), and the medians reported.
Times are medians over the measured steps after warm-up steps; the machine is shared, so compare
the ratios measured in the same run, not absolute times across runs. Multi-threaded BLAS (torch with
2 threads, atensor on 1 device) suffers most when other processes load the cores: the 1-thread rows
are the steadier comparison.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import table, time_steps, write_results  # noqa: E402

WARMUP = 5
SIZES = (64, 256, 128, 10)


def _data(batch: int):
    import numpy as np
    rng = np.random.default_rng(0)
    return rng.random((batch, 64), dtype=np.float32), rng.integers(0, 10, size=batch).astype(np.int32)


def flagship_step(devices: int, batch: int, jit: bool = True) -> tuple:
    """The flagship's training step as examples/train.py makes it (MLP, fused Adam, the batch split
    inside the step on several devices): (step, params, device names, x, y) with x, y numpy arrays of
    `batch` rows; `step(x, y)` takes tensors on the first device and returns the loss."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import train
    import atensor
    from atensor import Tensor, nn
    from atensor.nn import optim
    names = tuple(f"CPU:{k}" for k in range(devices))
    x_np, y_np = _data(batch)
    Tensor.manual_seed(0)
    net = train.MLP()
    params = nn.get_parameters(net)
    if devices > 1:
        for p in params:
            p.shard_(names)
    opt = optim.Adam(params, lr=1e-3, fused=True)  # as examples/train.py
    train.quiet_collector()  # as examples/train.py: the collections the loop does not need, avoided

    async def step(x: Tensor, y: Tensor) -> Tensor:
        if devices > 1:  # as examples/train.py: the batch is split inside the step
            x, y = x.shard(names, axis=0), y.shard(names, axis=0)
        # the flagship's loss: a sum over the global batch with a constant divisor (a mean whose
        # divisor counts the labels would add an allreduce of the count on every step)
        loss = nn.cross_entropy(net(x), y, reduction="sum") / batch
        opt.zero_grad()
        loss.backward()
        await opt.step(loss)
        return loss
    return (atensor.jit(step) if jit else step), params, names, x_np, y_np


def run_atensor(devices: int, batch: int, steps: int, jit: bool = True) -> list[float]:
    from atensor import Tensor
    run, params, names, x_np, y_np = flagship_step(devices, batch, jit)
    return time_steps(run, params, lambda: (Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0])),
                      steps, WARMUP)


def run_torch(batch: int, steps: int, threads: int) -> list[float]:
    import torch
    torch.set_num_threads(threads)
    x_np, y_np = _data(batch)
    torch.manual_seed(0)
    layers = []
    for a, b in zip(SIZES, SIZES[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).long()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def run_tinygrad(batch: int, steps: int) -> list[float]:
    os.environ.setdefault("DEV", "CPU")
    from tinygrad import Tensor, TinyJit, nn
    x_np, y_np = _data(batch)
    Tensor.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])]
    params = nn.state.get_parameters(layers)
    opt = nn.optim.Adam(params, lr=1e-3)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        h = x
        for layer in layers[:-1]:
            h = layer(h).relu()
        loss = layers[-1](h).sparse_categorical_crossentropy(y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.realize()

    try:  # tinygrad >= 0.11: training mode is a context variable
        from tinygrad.helpers import Context
        training = Context(TRAINING=1)
    except (ImportError, TypeError):
        training = Tensor.train()
    times = []
    with training:
        for _ in range(WARMUP + steps):
            start = time.perf_counter()
            step(Tensor(x_np), Tensor(y_np)).item()
            times.append(time.perf_counter() - start)
    return times[WARMUP:]


def run_kernel_pair(steps: int) -> dict:
    """The machine's floor for the 2-device step's kernels: each device's kernels of the flagship's
    replayed step (one foreign call per device: no copies, no waits, no host work), one device's alone
    against both devices' at once on two threads, in alternating blocks of 20 runs. The ratio (the
    slower thread's median / alone) is what two devices lose to each other on this machine before any
    communication or host overhead."""
    import threading
    import trio
    from atensor import Tensor
    from atensor.backend.c import programs
    step, params, names, x_np, y_np = flagship_step(2, 512)

    async def warm() -> None:
        with Tensor.train():
            for _ in range(6):
                (await step(Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0]))).item()
    trio.run(warm)
    plan = next(r.plans[True] for prog in step._programs.values() for r in prog.records if True in r.plans)
    calls = [programs.batch([plan.kept[i] for i in members if plan.layout.static[i].kind == "kernel"])
             for members in plan.layout.by_queue]

    def block(call, out: list) -> None:
        times = []
        for _ in range(20):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times))
    alone, together, ratios = [], [], []
    for _ in range(max(1, steps // 20)):
        one: list = []
        block(calls[0], one)
        both: list = []
        threads = [threading.Thread(target=block, args=(call, both)) for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        alone.append(one[0])
        together.append(max(both))
        ratios.append(max(both) / one[0])
    return {"median_s": statistics.median(together), "min_s": min(together), "steps": len(together) * 20,
            "alone_s": statistics.median(alone), "ratio": statistics.median(ratios)}


def _thread_cpu_ns() -> dict[int, int]:
    """CPU time of each of this process's threads, by thread id (Linux's schedstat; empty elsewhere)."""
    found = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                found[int(tid)] = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
    return found


def run_split(devices: int, batch: int, steps: int) -> dict:
    """Where the CPU goes in the flagship's step without the jit: each thread's CPU time per step (the
    main thread, the dispatcher, each queue's worker, BLAS's own threads as "other"), and the cyclic
    garbage collector's collections and CPU time on the main thread, over `steps` steps after a warm-up
    (with the flagship's collector settings, examples/train.py's `quiet_collector`)."""
    import threading
    import trio
    from atensor import Tensor
    run, params, names, x_np, y_np = flagship_step(devices, batch, jit=False)
    started: list[float] = []
    collected = {"count": 0, "seconds": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            started.append(time.thread_time())
        elif started:
            collected["count"] += 1
            collected["seconds"] += time.thread_time() - started.pop()

    async def loop() -> tuple[dict, dict]:
        await Tensor.realize(*params)
        with Tensor.train():
            for _ in range(4 * WARMUP):  # past the compiles and the first schedules
                (await run(Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0]))).item()
            before = _thread_cpu_ns()
            gc.callbacks.append(on_gc)
            for _ in range(steps):
                (await run(Tensor(x_np, device=names[0]), Tensor(y_np, device=names[0]))).item()
            gc.callbacks.remove(on_gc)
            return before, _thread_cpu_ns()
    before, after = trio.run(loop)
    named = {t.native_id: t.name for t in threading.enumerate()}
    split: dict[str, float] = {}
    for tid, ns in after.items():
        name = "main" if tid == os.getpid() else named.get(tid, "other (BLAS)")
        split[name] = split.get(name, 0.0) + (ns - before.get(tid, 0)) / steps / 1e3
    return {"cpu_us": split, "gc_main_us": collected["seconds"] / steps * 1e6,
            "gc_main_per_step": collected["count"] / steps}


def worker(config: dict) -> dict:
    kind = config["kind"]
    if kind == "kernel_pair":
        return run_kernel_pair(config["steps"])
    if kind == "split":
        return run_split(config["devices"], config["batch"], config["steps"])
    if kind == "atensor":
        times = run_atensor(config["devices"], config["batch"], config["steps"], config.get("jit", True))
    elif kind == "torch":
        times = run_torch(config["batch"], config["steps"], config["threads"])
    else:
        times = run_tinygrad(config["batch"], config["steps"])
    return {"median_s": statistics.median(times), "min_s": min(times), "steps": len(times)}


def measure(config: dict, env: dict | None = None) -> dict:
    """Runs one configuration in a fresh process; returns its timings or the error it gave."""
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=900)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_together(config: dict, copies: int) -> dict:
    """`copies` processes of one configuration at once (as DDP runs one process per device, with no
    communication at all): the slowest one's timings, or the first error."""
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(config)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(copies)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            return {"error": (err.strip().splitlines() or ["failed"])[-1][:200]}
        results.append(json.loads(out.strip().splitlines()[-1]))
    return max(results, key=lambda r: r["median_s"])


def alternating_rounds(steps: int, rounds: int) -> dict:
    """The two target ratios, measured in `rounds` alternating rounds (the machine's speed drifts
    between processes, so each ratio is taken within a round, then the median of the rounds):
    weak scaling and its floor (atensor 1 device, atensor 2 devices, torch alone, two torch at once,
    1 BLAS thread each), and the flagship's step on 1 device against torch with the machine's 2
    threads."""
    one_env = {"ATENSOR_BLAS_THREADS": "1"}
    scaling, floor, vs_torch, kernel_floor = [], [], [], []
    for _ in range(rounds):
        pair = measure({"kind": "kernel_pair", "steps": steps}, one_env)
        one = measure({"kind": "atensor", "devices": 1, "batch": 256, "steps": steps}, one_env)
        two = measure({"kind": "atensor", "devices": 2, "batch": 512, "steps": steps}, one_env)
        alone = measure({"kind": "torch", "batch": 256, "steps": steps, "threads": 1})
        together = measure_together({"kind": "torch", "batch": 256, "steps": steps, "threads": 1}, 2)
        flagship = measure({"kind": "atensor", "devices": 1, "batch": 256, "steps": steps})
        torch2 = measure({"kind": "torch", "batch": 256, "steps": steps, "threads": 2})
        if "error" not in one and "error" not in two:
            scaling.append(two["median_s"] / one["median_s"])
        if "error" not in alone and "error" not in together:
            floor.append(together["median_s"] / alone["median_s"])
        if "error" not in flagship and "error" not in torch2:
            vs_torch.append(flagship["median_s"] / torch2["median_s"])
        if "error" not in pair:
            kernel_floor.append(pair["ratio"])
    return {"scaling": statistics.median(scaling) if scaling else None, "scaling_per_round": scaling,
            "floor": statistics.median(floor) if floor else None, "floor_per_round": floor,
            "vs_torch": statistics.median(vs_torch) if vs_torch else None, "vs_torch_per_round": vs_torch,
            "kernel_floor": statistics.median(kernel_floor) if kernel_floor else None,
            "kernel_floor_per_round": kernel_floor}


def print_split(steps: int) -> None:
    """`--split`: the per-thread CPU table of the step without the jit, 1 and 2 devices."""
    for devices in (1, 2):
        r = measure({"kind": "split", "devices": devices, "batch": 256, "steps": steps})
        if "error" in r:
            print(f"{devices} device(s): skipped: {r['error']}")
            continue
        rows = [[name, us] for name, us in sorted(r["cpu_us"].items(), key=lambda kv: -kv[1])]
        rows.append(["all threads", sum(r["cpu_us"].values())])
        print(table(f"\nno-jit step, {devices} device(s), batch 256: CPU per step (mean of {steps} steps); "
                    f"GC on the main thread: {r['gc_main_per_step']:.2f} collections, {r['gc_main_us']:.0f} us",
                    ["thread", "CPU us"], rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of the target ratios (weak scaling, its floor, atensor "
                             "against torch): the machine's speed drifts between processes, so each ratio "
                             "is taken per round, then the median")
    parser.add_argument("--split", action="store_true",
                        help="only the step without the jit on 1 and 2 devices: each thread's CPU time per "
                             "step and the garbage collector's share of the main thread")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.split:
        print_split(max(args.steps, 100))
        return
    steps = args.steps
    runs = {
        "atensor, 1 device": measure({"kind": "atensor", "devices": 1, "batch": 256, "steps": steps}),
        "atensor, 2 devices": measure({"kind": "atensor", "devices": 2, "batch": 256, "steps": steps}),
        "atensor, 1 device, no jit": measure({"kind": "atensor", "devices": 1, "batch": 256, "steps": steps,
                                              "jit": False}),
        "atensor, 2 devices, no jit": measure({"kind": "atensor", "devices": 2, "batch": 256, "steps": steps,
                                               "jit": False}),
        "torch CPU, 2 threads": measure({"kind": "torch", "batch": 256, "steps": steps, "threads": 2}),
        "tinygrad CPU (TinyJit)": measure({"kind": "tinygrad", "batch": 256, "steps": steps}),
        "weak: atensor 1 device x 256, 1 thread": measure(
            {"kind": "atensor", "devices": 1, "batch": 256, "steps": steps}, {"ATENSOR_BLAS_THREADS": "1"}),
        "weak: atensor 2 devices x 256, 1 thread each": measure(
            {"kind": "atensor", "devices": 2, "batch": 512, "steps": steps}, {"ATENSOR_BLAS_THREADS": "1"}),
        "torch CPU, 1 thread": measure({"kind": "torch", "batch": 256, "steps": steps, "threads": 1}),
        # the machine's floor for weak scaling: two torch processes at once that never talk to each other
        "floor: 2 torch processes at once, 1 thread each": measure_together(
            {"kind": "torch", "batch": 256, "steps": steps, "threads": 1}, 2),
        # the same jitted steps with the replayed kernels on numpy instead of compiled to C
        "weak: 1 device x 256, 1 thread, numpy kernels": measure(
            {"kind": "atensor", "devices": 1, "batch": 256, "steps": steps},
            {"ATENSOR_BLAS_THREADS": "1", "ATENSOR_NATIVE": "0"}),
        "weak: 2 devices x 256, 1 thread each, numpy kernels": measure(
            {"kind": "atensor", "devices": 2, "batch": 512, "steps": steps},
            {"ATENSOR_BLAS_THREADS": "1", "ATENSOR_NATIVE": "0"}),
    }
    torch_ms = runs["torch CPU, 2 threads"].get("median_s")
    torch1_ms = runs["torch CPU, 1 thread"].get("median_s")
    rows = []
    for name, r in runs.items():
        if "error" in r:
            rows.append([name, "-", "-", "-", f"skipped: {r['error']}"])
            continue
        ratio = f"{r['median_s'] / torch_ms:.2f}x" if torch_ms else "-"
        ratio1 = f"{r['median_s'] / torch1_ms:.2f}x" if torch1_ms else "-"
        rows.append([name, r["median_s"] * 1e3, r["min_s"] * 1e3, ratio, ratio1])
    title = f"training step, flagship MLP {'-'.join(map(str, SIZES))} + Adam, batch 256 (median of {steps})"
    print(table(title,
                ["configuration", "median ms", "min ms", "vs torch 2 threads", "vs torch 1 thread"], rows))
    rounds = alternating_rounds(steps, args.rounds)
    scaling, floor = rounds["scaling"], rounds["floor"]
    if scaling is not None:
        print(f"\nweak scaling (step time, 2 devices / 1 device, 256 per device, 1 BLAS thread each), median "
              f"of {args.rounds} alternating rounds: {scaling:.2f} (target <= 1.1; efficiency {100 / scaling:.0f}%); "
              f"per round: {', '.join(f'{r:.2f}' for r in rounds['scaling_per_round'])}")
    if floor is not None:
        print(f"this machine's floor: two independent 1-thread torch processes at once / one alone, same rounds: "
              f"{floor:.2f}; per round: {', '.join(f'{r:.2f}' for r in rounds['floor_per_round'])}")
    if rounds["kernel_floor"] is not None:
        print(f"the floor for this step's kernels: each device's kernels alone / both devices' at once on two "
              f"threads (no copies, no waits, no host), same rounds: {rounds['kernel_floor']:.2f}; per round: "
              f"{', '.join(f'{r:.2f}' for r in rounds['kernel_floor_per_round'])}")
    w2n = runs["weak: 2 devices x 256, 1 thread each, numpy kernels"]
    one_numpy = runs["weak: 1 device x 256, 1 thread, numpy kernels"]
    numpy_scaling = w2n["median_s"] / one_numpy["median_s"] if "error" not in w2n and "error" not in one_numpy \
        else None
    if numpy_scaling is not None:
        print(f"the same with the kernels on numpy (ATENSOR_NATIVE=0): {numpy_scaling:.2f}")
    one, two = runs["atensor, 1 device"], runs["atensor, 2 devices"]
    if "error" not in one and torch_ms:
        print(f"atensor 1 device / torch (2 threads), the table's single runs: {one['median_s'] / torch_ms:.2f}")
    if rounds["vs_torch"] is not None:
        print(f"atensor 1 device / torch (2 threads), median of {args.rounds} alternating rounds: "
              f"{rounds['vs_torch']:.2f} (target <= 1); per round: "
              f"{', '.join(f'{r:.2f}' for r in rounds['vs_torch_per_round'])}")
    path = write_results("train_step", {"steps": steps, "runs": runs, "weak_scaling": scaling,
                                        "weak_scaling_numpy_kernels": numpy_scaling,
                                        "weak_scaling_floor_independent_torch": floor, "weak_rounds": rounds,
                                        "atensor_1dev_over_torch": rounds["vs_torch"],
                                        "atensor_1dev_over_torch_single_runs": one.get("median_s", 0) / torch_ms
                                        if torch_ms and "error" not in one else None,
                                        "atensor_2dev_over_1dev": two.get("median_s", 0) / one["median_s"]
                                        if "error" not in one and "error" not in two else None})
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
