"""Runs the registry's benchmarks (bench/registry.py), each script in a fresh process, and, with a baseline,
the same benchmark in a git worktree of another revision in alternating rounds.

Why separate processes: each script sets its own threads, devices and environment, and several start
their own workers; one crashing or hanging benchmark must not take the others with it (a run stops at its
timeout and is reported as such). The run's output streams through as it comes, and is kept: the suite adds
to each results file a "suite" record (the command, seconds, quick or full, and the printed tables), from
which `--report` makes docs/benchmarks.md.
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .registry import Benchmark
from .common import RESULTS, table, write_results

ROOT = Path(__file__).resolve().parents[1]
PRINTED_LIMIT = 12_000  # characters of a run's printed output kept in its results file


@dataclass
class Outcome:
    """One benchmark's run: `status` is "ok", "failed (rc N)", "timed out", "skipped: why" or "absent";
    `cpu_seconds` the CPU time of its processes (user + system, every child the script waited for): on a
    loaded machine, what the run would take on a quiet one is about cpu_seconds / cores or more."""
    name: str
    status: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    written: list[str] = field(default_factory=list)


def missing_needs(bench: Benchmark) -> list[str]:
    """The modules of `bench.needs` this interpreter cannot import."""
    return [m for m in bench.needs if importlib.util.find_spec(m) is None]


def _stream(command: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[int | None, str]:
    """Runs `command`, echoing its output as it comes; (return code or None on timeout, its stdout+stderr)."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    lines: list[str] = []

    def echo() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        rc: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its whole session: a script's own workers and servers too
        proc.wait()
        rc = None
    reader.join(5)
    return rc, "".join(lines)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_script(bench: Benchmark, quick: bool, tree: Path = ROOT, timeout: float = 900.0,
               extra: tuple[str, ...] = ()) -> tuple[int | None, str, float]:
    """Runs `bench`'s script of `tree` with its quick or full options (and `extra`); (rc, output, seconds)."""
    command = [sys.executable, str(tree / "bench" / bench.script), *bench.options(quick), *extra]
    # the tree's own atensor, not an installed one (a script run as bench/x.py has only bench/ on its path)
    path = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    print(f"\n=== {bench.name}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    rc, output = _stream(command, tree, timeout, env)
    return rc, output, time.perf_counter() - start


def run(bench: Benchmark, quick: bool, timeout: float) -> Outcome:
    """Runs one benchmark of this tree and stamps its results files with the suite's record."""
    if not bench.path.exists():
        return Outcome(bench.name, "absent" if bench.optional else f"failed: {bench.script} is missing")
    missing = missing_needs(bench)
    if missing:
        return Outcome(bench.name, f"skipped: needs {', '.join(missing)}")
    started, cpu = time.time(), _children_cpu()
    rc, output, seconds = run_script(bench, quick, timeout=timeout)
    outcome = Outcome(bench.name, "ok" if rc == 0 else "timed out" if rc is None else f"failed (rc {rc})", seconds,
                      round(_children_cpu() - cpu, 1))
    for name in bench.results:
        path = RESULTS / f"{name}.json"
        if path.exists() and path.stat().st_mtime >= started - 1:
            data = json.loads(path.read_text())
            data["suite"] = {"quick": quick, "seconds": round(seconds, 1), "cpu_seconds": outcome.cpu_seconds,
                             "status": outcome.status,
                             "command": bench.command(quick),
                             "printed": output[-PRINTED_LIMIT:]}
            path.write_text(json.dumps(data, indent=2))
            outcome.written.append(path.name)
    if outcome.status == "ok" and not outcome.written:
        outcome.status = f"failed: wrote none of {', '.join(n + '.json' for n in bench.results)}"
    return outcome


def run_all(benches: list[Benchmark], quick: bool, timeout: float, record: bool = True) -> list[Outcome]:
    """Runs each benchmark in turn; prints what each did, and with `record` (a run of the whole suite, not
    of some benchmarks) writes it to bench/results/suite.json."""
    outcomes = [run(b, quick, timeout) for b in benches]
    print()
    print(table(f"bench suite ({'quick' if quick else 'full'})", ["benchmark", "status", "seconds", "CPU s", "wrote"],
                [[o.name, o.status, round(o.seconds, 1), o.cpu_seconds, " ".join(o.written)] for o in outcomes]))
    total, cpu = sum(o.seconds for o in outcomes), sum(o.cpu_seconds for o in outcomes)
    cores = os.cpu_count() or 1
    print(f"total {total:.0f} s; CPU {cpu:.0f} s, which on {cores} idle cores would take at least {cpu / cores:.0f} s; "
          f"load average now {os.getloadavg()[0]:.1f}")
    if record:
        write_results("suite", {"quick": quick, "total_seconds": round(total, 1), "total_cpu_seconds": round(cpu, 1),
                                "outcomes": [vars(o) for o in outcomes]})
    return outcomes


# ---- --baseline REV: the same benchmark in a worktree of another revision, alternating rounds

@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A detached git worktree of `rev` in a temporary directory, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix=f"atensor-baseline-{rev[:12].replace('/', '_')}-"))
    proc = subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        raise SystemExit(f"--baseline {rev}: git worktree add failed: {proc.stderr.strip()} (give a commit, "
                         "branch or tag of this repository)")
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def numbers(data: object, prefix: str = "") -> dict[str, float]:
    """Every number of a results file by its path ("rows.0.atensor_us"), the machine and suite records left
    out."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            if not prefix and key in ("machine", "suite", "time"):
                continue
            out.update(numbers(value, f"{prefix}{key}."))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.update(numbers(value, f"{prefix}{i}."))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix[:-1]] = float(data)
    return out


def headline(bench: Benchmark, values: dict[str, float]) -> dict[str, float]:
    """The numbers matching the benchmark's `figures` patterns (all of them when it names none)."""
    if not bench.figures:
        return values
    return {k: v for k, v in values.items() if any(fnmatch.fnmatchcase(k, p) for p in bench.figures)}


def compare(bench: Benchmark, rev: str, rounds: int, quick: bool, timeout: float) -> Path:
    """Runs `bench` on this tree and on a worktree of `rev`; writes and returns bench/results/ab_<name>.json.

    A benchmark that alternates trees itself (`own_baseline`) is run once with `--baseline WORKTREE`.
    Otherwise the suite alternates: round i runs the baseline first when i is even, this tree first when odd,
    each a fresh process, and compares the headline figures' medians over the rounds."""
    with worktree(rev) as base:
        if bench.own_baseline:
            rc, output, seconds = run_script(bench, quick, timeout=timeout, extra=("--baseline", str(base)))
            if rc != 0:
                raise SystemExit(f"{bench.name} --baseline {rev}: failed (rc {rc})")
            return write_results(f"ab_{bench.name}", {"baseline_rev": rev, "by_the_script": True,
                                                      "seconds": seconds, "printed": output[-PRINTED_LIMIT:]})
        if not (base / "bench" / bench.script).exists():
            raise SystemExit(f"--baseline {rev}: bench/{bench.script} does not exist at that revision")
        seen: dict[str, dict[str, list[float]]] = {"baseline": {}, "this": {}}
        for r in range(rounds):
            for which in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
                tree = base if which == "baseline" else ROOT
                rc, _, _ = run_script(bench, quick, tree=tree, timeout=timeout)
                if rc != 0:
                    raise SystemExit(f"{bench.name} on {which} ({tree}): failed (rc {rc})")
                for name in bench.results:
                    path = tree / "bench" / "results" / f"{name}.json"
                    if path.exists():
                        for key, value in headline(bench, numbers(json.loads(path.read_text()))).items():
                            seen[which].setdefault(f"{name}:{key}", []).append(value)
    common_keys = [k for k in seen["this"] if k in seen["baseline"]]
    rows = [[k, statistics.median(seen["baseline"][k]), statistics.median(seen["this"][k]),
             f"{statistics.median(seen['this'][k]) / statistics.median(seen['baseline'][k]):.3f}"
             if statistics.median(seen["baseline"][k]) else "-"] for k in common_keys]
    print(table(f"{bench.name}: {rev} against this tree, medians of {rounds} alternating rounds",
                ["figure", rev, "this tree", "this / baseline"], rows[:200]))
    return write_results(f"ab_{bench.name}", {"baseline_rev": rev, "rounds": rounds, "quick": quick,
                                              "figures": {k: {"baseline": seen["baseline"][k], "this": seen["this"][k]}
                                                          for k in common_keys}})
