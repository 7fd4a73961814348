"""Shared helpers for benchmarks: timing, a printed table, and the JSON file of results."""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

try:  # imported as bench.common, or as common by a script run as `python bench/x.py`
    from . import machine as _machine
except ImportError:
    import machine as _machine  # type: ignore[no-redef]

RESULTS = Path(__file__).resolve().parent / "results"
# the load average when the bench started (imported this module): bench/machine.py's, recorded in every result
LOAD_AT_START = tuple(_machine.START_LOAD or (0.0, 0.0, 0.0))


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


def read_bandwidth(nbytes: int = 256 << 20, repeat: int = 5) -> float:
    """Bytes per second of summing a warm float32 array of `nbytes` (a read-only stream, as a batch-1 matmul
    reads its weights), the best of `repeat`: the bound for a call that must read every weight once."""
    import numpy as np
    a = np.ones(nbytes // 4, np.float32)
    a.sum()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        a.sum()
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
    """Writes `data` with the machine's record (bench/machine.py: CPU model, flags, cores, load average at
    the script's start, git revision, versions) and the command line to bench/results/<name>.json."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": _machine.as_dict(_machine.record()),
               "command": _command(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **data}
    path.write_text(json.dumps(_json_safe(payload), indent=2, allow_nan=False))
    return path


def _command() -> str:
    """This process's command line, its script named relative to the repository when it is inside it."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    root = RESULTS.parents[1]
    shown = str(script.relative_to(root)) if script and script.is_relative_to(root) else (sys.argv[0] if sys.argv else "")
    return " ".join(["python", shown, *sys.argv[1:]])


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


def machine_facts() -> dict:
    """The CPU model, its flags that matter to these kernels, the core count and the load average now: a
    short view of bench/machine.py's record (which write_results puts in every results file in full)."""
    record = _machine.record()
    return {"cpu": record.cpu, "flags": list(record.flags), "cores": record.cores, "load": record.load_end}
