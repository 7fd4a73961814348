"""Tokens per second of examples/train_gpt.py's default GPT-2 (4 layers, dim 256, context 128, vocab 4096,
batch 16, float32): atensor eager, jitted on 1 and 2 devices and under `mpiexec -n 2`, against PyTorch
eager (and `torch.compile` where it works) with the same threads, the same model and batches
(bench/torch_gpt.py); the step's breakdown and peak resident memory.

    python bench/train_gpt.py                 # ~5 minutes on a quiet 2-core machine
    python bench/train_gpt.py --quick         # fewer steps, no torch.compile, no eager atensor
    python bench/train_gpt.py --steps 20 --warmup 4

Each configuration runs in a process of its own (BLAS threads and devices are per process), on the
real batches of the example's pipeline (the cached tokenizer; the first run trains it), timing
`--steps` steps after `--warmup` (the jit captures in its first three). Every step reads its loss, as a
training loop does. tokens/s = batch * context / median step time; CPU s/step is the process's CPU
time per step (user + system, all threads), steadier than wall time when other jobs load the cores.

The breakdown (atensor jitted, 1 device): forward = a jitted forward and loss alone; backward =
a jitted forward + backward (gradients realized) minus the forward; optimizer = the full step minus
that (clipping and AdamW, and the allreduces on 2 devices, which overlap the backward when they can);
from the profiler over the full steps: kernel, copy and allreduce busy time per step, and host gaps
(the share of the step's wall time in which no device queue is busy: Python, waits, the loop). The
data pipeline's stall is measured on a run of the example itself (its `stall_fraction`).

The machine's limit: FLOPs per step / time; the matmul FLOPs are 6 * parameters * tokens plus the
attention's 12 * layers * context * dim * tokens (nanoGPT's estimate), printed as achieved GFLOPS.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import machine_facts, table, write_results  # noqa: E402

MPIEXEC = Path(sys.executable).parent / "mpiexec"


def _example():
    spec = importlib.util.spec_from_file_location("atensor_example_train_gpt", ROOT / "examples" / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _batches(example, cfg, count: int):
    from itertools import islice
    from atensor.nn.data import LMDataSpec, batches_of
    data = example.load_data(cfg)
    spec = LMDataSpec(cfg.batch, cfg.context, seed=cfg.seed, eot=0)
    return data, list(islice(batches_of(spec, data.documents(cfg.seed), data.encode), count))


def _timed(fn, count: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for i in range(count):
        w, c = time.perf_counter(), time.process_time()
        fn(i)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return walls, cpus


# ---- workers (one configuration each, in its own process) -----------------------------------------
def atensor_worker(args) -> dict:
    import trio
    from atensor import Tensor, dist
    example = _example()
    cfg = example.RunConfig(devices=args.devices, jit=not args.eager, steps=args.warmup + args.steps,
                            progress=False)
    data, batches = _batches(example, cfg, args.warmup + args.steps)
    out: dict = {}

    async def main() -> None:
        names = tuple(f"CPU:{k}" for k in range(cfg.devices))
        world = dist.init(names)
        trainer = example.Trainer(cfg, cfg.model_config(), names, world)
        await Tensor.realize(*trainer.params, *trainer.opt.state)
        rows = world.shard_rows(cfg.batch)
        walls, cpus = [], []
        for i, b in enumerate(batches):
            b = type(b)(b.step, b.inputs[rows.start:rows.stop], b.targets[rows.start:rows.stop])
            w, c = time.perf_counter(), time.process_time()
            await trainer.train_step(b)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        out["wall"], out["cpu"] = walls[args.warmup:], cpus[args.warmup:]
        if args.breakdown:
            out["breakdown"] = await _breakdown(trainer, batches[:args.warmup], rows)
    trio.run(main)
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


async def _breakdown(trainer, batches, rows) -> dict:
    """Forward alone, forward + backward, and the full step, each jitted, median wall seconds; the
    profiler's busy time per kind and the host gaps over the full steps."""
    import atensor
    from atensor import Tensor
    model, opt = trainer.model, trainer.opt

    async def forward(x, y):
        with Tensor.no_grad:
            x, y = trainer._inputs(x, y)
            loss = model.loss(x, y, divisor=trainer.global_tokens)
            await loss.realize()
        return loss

    async def forward_backward(x, y):
        x, y = trainer._inputs(x, y)
        loss = model.loss(x, y, divisor=trainer.global_tokens)
        opt.zero_grad()
        loss.backward()
        await loss.realize(*[t.grad for t in opt.targets])
        return loss

    def inputs(b):
        return (Tensor(b.inputs[rows.start:rows.stop], device=trainer.names[0]),
                Tensor(b.targets[rows.start:rows.stop], device=trainer.names[0]))

    times = {}
    for name, fn in (("forward", atensor.jit(forward)), ("forward+backward", atensor.jit(forward_backward))):
        walls = []
        for i in range(len(batches) + 3):
            w = time.perf_counter()
            (await fn(*inputs(batches[i % len(batches)]))).item()
            walls.append(time.perf_counter() - w)
        times[name] = statistics.median(walls[4:]) if len(walls) > 5 else min(walls)
    walls = []
    with atensor.profile() as prof:
        for b in batches[:3]:
            w = time.perf_counter()
            await trainer.train_step(b)
            walls.append(time.perf_counter() - w)
    times["step"] = statistics.median(walls)
    timeline = prof.timeline()
    busy: dict[str, int] = {}
    intervals = []
    for item in timeline.spans:
        if item.span.kind == "wait":
            continue
        busy[item.span.kind] = busy.get(item.span.kind, 0) + (item.end - item.start)
        intervals.append((item.start, item.end))
    intervals.sort()
    covered, reach = 0, None
    start_all = intervals[0][0] if intervals else 0
    end_all = max((e for _, e in intervals), default=0)
    for s, e in intervals:
        if reach is None or s > reach:
            covered += e - s
            reach = e
        elif e > reach:
            covered += e - reach
            reach = e
    window = max(end_all - start_all, 1)
    steps = len(walls)
    return {"forward_s": times["forward"], "backward_s": times["forward+backward"] - times["forward"],
            "optimizer_and_rest_s": times["step"] - times["forward+backward"], "step_s": times["step"],
            "busy_per_step_s": {k: v / 1e9 / steps for k, v in busy.items()},
            "host_gap_fraction": 1 - covered / window}


def torch_worker(args) -> dict:
    import numpy as np
    import torch
    import torch_gpt
    torch.set_num_threads(args.threads)
    example = _example()
    cfg = example.RunConfig(steps=args.warmup + args.steps, progress=False)
    data, batches = _batches(example, cfg, args.warmup + args.steps)
    shape = torch_gpt.Shape(cfg.vocab, cfg.context, cfg.layers, cfg.heads, cfg.dim)
    torch.manual_seed(0)
    model = torch_gpt.TorchGPT2(shape)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    settings = torch_gpt.TrainSettings(cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps, cfg.weight_decay, cfg.clip)
    opt = torch_gpt.optimizer(model, settings)
    loss_fn = torch.compile(model.loss) if args.compile else model.loss
    tensors = [(torch.from_numpy(b.inputs.astype(np.int64)), torch.from_numpy(b.targets.astype(np.int64)))
               for b in batches]
    walls, cpus = _timed(lambda i: torch_gpt.train_step(model, opt, *tensors[i], cfg.clip, loss_fn), len(tensors))
    return {"wall": walls[args.warmup:], "cpu": cpus[args.warmup:],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---- the driver ----------------------------------------------------------------------------------
def _run(command: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=12, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (the jit captures in 3)")
    p.add_argument("--quick", action="store_true", help="6 steps, no eager atensor, no torch.compile")
    p.add_argument("--worker", choices=("atensor", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--breakdown", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help=argparse.SUPPRESS)
    p.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        result = atensor_worker(args) if args.worker == "atensor" else torch_worker(args)
        from atensor import dist
        if dist.world().is_root if args.worker == "atensor" else True:
            print("RESULT " + json.dumps(result), flush=True)
        return
    if args.quick:
        args.steps, args.warmup = 6, 4
    machine = machine_facts()
    print(f"{machine['cpu']}, {machine['cores']} cores, load {machine['load']}")
    me = [sys.executable, str(Path(__file__).resolve()), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cores = os.cpu_count() or 1
    configs: list[tuple[str, list[str]]] = [
        ("torch eager", me + ["--worker", "torch", "--threads", str(cores)]),
        ("atensor jit, 1 device", me + ["--worker", "atensor", "--devices", "1", "--breakdown"]),
        # no breakdown on 2 devices: its forward+backward jit, whose replicated gradients nothing consumes,
        # grew past 14 GB resident (OOM-killed; the training step itself peaks at ~1.7 GB)
        ("atensor jit, 2 devices", me + ["--worker", "atensor", "--devices", "2"]),
        ("atensor jit, mpiexec -n 2", [str(MPIEXEC), "-n", "2"] + me + ["--worker", "atensor", "--devices", "1"]),
        ("torch eager, 1 thread", me + ["--worker", "torch", "--threads", "1"]),
    ]
    if not args.quick:
        configs.insert(1, ("atensor eager (no jit), 1 device", me + ["--worker", "atensor", "--devices", "1",
                                                                     "--eager"]))
        configs.append(("torch.compile", me + ["--worker", "torch", "--threads", str(cores), "--compile"]))
    results = {}
    for name, command in configs:
        print(f"running {name} ...", flush=True)
        results[name] = _run(command, timeout=900)
        results[name]["load_after"] = os.getloadavg()[0]
    # the example itself, with its pipeline: the data stall
    report = HERE / "results" / "train_gpt_run.json"
    example_steps = args.warmup + args.steps
    done = subprocess.run([sys.executable, "examples/train_gpt.py", "--steps", str(example_steps), "--eval-every", "0",
                           "--quiet", "--json", str(report)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    run = json.loads(report.read_text()) if done.returncode == 0 else {"error": done.stderr[-500:]}
    report.unlink(missing_ok=True)

    example = _example()
    cfg = example.RunConfig()
    tokens = cfg.batch * cfg.context
    flops = 6 * cfg.model_config().parameters() * tokens + 12 * cfg.layers * cfg.context * cfg.dim * tokens
    base = results["torch eager"]
    base_tps = tokens / statistics.median(base["wall"]) if "wall" in base else None
    rows = []
    for name, r in results.items():
        if "wall" not in r:
            rows.append([name, "-", "-", "-", "-", "-", str(r.get("error"))[:60]])
            continue
        wall = statistics.median(r["wall"])
        tps = tokens / wall
        rows.append([name, round(tps), f"{tps / base_tps:.2f}x" if base_tps else "-", round(wall * 1000),
                     round(statistics.median(r["cpu"]), 2), round(flops / wall / 1e9, 1),
                     f"{r['peak_rss_bytes'] / 2**20:.0f} MiB"])
        r["tokens_per_second"] = tps
    print(table(f"GPT-2 {cfg.layers}x{cfg.dim}, context {cfg.context}, batch {cfg.batch}: "
                f"{flops / 1e9:.1f} GFLOP a step ({machine['cpu']}, load at start {machine['load'][0]:.1f})",
                ["configuration", "tokens/s", "vs torch", "ms/step", "CPU s/step", "GFLOPS", "peak RSS"], rows))
    for name in ("atensor jit, 1 device",):
        b = results.get(name, {}).get("breakdown")
        if b:
            print(f"{name}: forward {b['forward_s'] * 1000:.0f} ms, backward {b['backward_s'] * 1000:.0f} ms, "
                  f"optimizer and the rest {b['optimizer_and_rest_s'] * 1000:.0f} ms (step {b['step_s'] * 1000:.0f}"
                  f" ms); busy per step " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in b["busy_per_step_s"].items())
                  + f"; host gaps {100 * b['host_gap_fraction']:.1f}% of the step")
    if "stall_fraction" in run:
        print(f"example run ({example_steps} steps with its pipeline): {run['tokenize_seconds']:.2f} s tokenizing in "
              f"the worker thread, data stall {100 * run['stall_fraction']:.2f}% of wall time, "
              f"{run['tokens_per_second']:.0f} tokens/s including the jit's first steps")
    path = write_results("train_gpt", {"machine_detail": machine, "load_at_end": os.getloadavg(),
                                       "flops_per_step": flops, "steps": args.steps, "warmup": args.warmup,
                                       "results": results,
                                       "example_run": {k: run.get(k) for k in ("stall_fraction", "tokenize_seconds", "tokens_per_second",
                                                                               "peak_rss_bytes", "error")}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
