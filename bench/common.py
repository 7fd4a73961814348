"""Shared helpers for benchmarks: timing, a printed table, and the JSON file of results."""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)  # when the bench imported this
# the CPU flags a result depends on (the kernels' paths, llama.cpp's build), recorded with every result
RELEVANT_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
                  "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx_vnni", "amx_tile", "amx_int8",
                  "amx_bf16", "hypervisor", "neon", "asimd")


def machine() -> dict:
    """The machine a result was measured on: CPU model, its relevant flags, cores, load average when the
    bench started (and now), Python and the OS."""
    from atensor.tune.machine import current
    here = current()
    return {"cpu": here.model, "flags": [f for f in RELEVANT_FLAGS if f in here.flags], "cpus": os.cpu_count(),
            "cores_usable": here.cores, "load_at_start": list(LOAD_AT_START),
            "load_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(), "platform": platform.platform()}


def best_of(fn: Callable[[], Any], repeat: int = 3) -> float:
    """The fastest of `repeat` runs of `fn`, in seconds (the least disturbed by a noisy machine)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def median_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

def memcpy_bandwidth(nbytes: int = 256 << 20, repeat: int = 5) -> float:
    """Bytes per second that one numpy copy between two warm buffers moves (the best of `repeat`): the
    memory-bandwidth limit the allreduce and LLM benchmarks report against."""
    import numpy as np
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def time_steps(run: Callable[..., Any], params: Sequence[Any], inputs: Callable[[], tuple], steps: int,
               warmup: int) -> list[float]:
    """Seconds per training step `await run(*inputs())` (the loss read each step, as a training loop
    does), after `warmup` steps; the parameters are realized first and the steps run in training mode,
    under trio. The inputs are made inside the timed region: a real loop makes each batch's tensors."""
    import trio
    from atensor import Tensor
    times: list[float] = []

    async def loop() -> None:
        await Tensor.realize(*params)
        with Tensor.train():
            for _ in range(warmup + steps):
                start = time.perf_counter()
                loss = await run(*inputs())
                loss.item()
                times.append(time.perf_counter() - start)
    trio.run(loop)
    return times[warmup:]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with right-aligned numbers."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    for row in cells:
        lines.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text.rstrip("x%"))
        return True
    except ValueError:
        return False


def write_results(name: str, data: dict) -> Path:
    """Writes `data` with the machine's description (`machine()`) to bench/results/<name>.json."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(),
               "time": time.strftime("%Y-%m-%d %H:%M:%S"), **data}
    path.write_text(json.dumps(_json_safe(payload), indent=2, allow_nan=False))
    return path


def _json_safe(value: Any) -> Any:
    """`value` with NaN and infinities as null: JSON has no such numbers (a latency percentile of no
    requests is NaN in the printed table, null in the file)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def install_stage_timers(stages: list[tuple[str, str, str]], times: dict) -> list[str]:
    """Wraps each stage's function, (module, attribute path, label), with a perf_counter_ns timer that
    appends to `times[label]`; returns the labels found (a stage this checkout lacks is left out, so the
    same bench runs on an older commit for before/after tables)."""
    import importlib
    found = []
    for module, path, label in stages:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, name):
            continue
        fn = getattr(owner, name)

        def timed(*args, _fn=fn, _label=label, **kwargs):
            start = time.perf_counter_ns()
            try:
                return _fn(*args, **kwargs)
            finally:
                times[_label].append(time.perf_counter_ns() - start)
        setattr(owner, name, timed)
        found.append(label)
    return found


FLAGS_OF_INTEREST = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                     "avx_vnni", "amx_tile")


def cpu_description() -> dict:
    """The CPU model, the SIMD flags benchmarks care about (present or not), the core count and the
    load average now (Linux's /proc/cpuinfo; the model is "unknown" elsewhere)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name", "unknown")
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    flags = set(fields.get("flags", "").split())
    return {"cpu": model, "flags": {f: f in flags for f in FLAGS_OF_INTEREST}, "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
