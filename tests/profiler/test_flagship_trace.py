"""The flagship's trace (examples/train.py --profile, cold compiler cache): it follows the Trace
Event Format's rules, so Perfetto and chrome://tracing read it as written, and its named host
spans cover the host's wall time (the compile included)."""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from atensor.profiler import Profile

from .sample_events import simulate_step

pytest.importorskip("sklearn", reason="the flagship trains on scikit-learn's bundled digits")

_PATH = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def trace_event_format_violations(document: dict) -> list[str]:
    """What a Chrome JSON trace breaks of the Trace Event Format's rules (empty when none):
    complete events have numeric, non-negative ts and dur; complete events of one thread track
    (pid, tid) do not overlap, as a viewer reads them (ns = int(us * 1000)); every flow id has
    exactly one start ("s") and one end ("f"), each on a complete event of its track; counters
    ("C") carry numeric values only; every track with events is named by metadata."""
    problems: list[str] = []
    events = document["traceEvents"]
    named_processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for number, e in enumerate(events):
        if e["ph"] != "X":
            continue
        if not all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool) for k in ("ts", "dur")):
            problems.append(f"#{number} complete event without numeric ts/dur: {e}")
            continue
        if e["dur"] < 0 or e["ts"] < 0:
            problems.append(f"#{number} negative ts or dur: {e}")
        if not isinstance(e.get("name"), str):
            problems.append(f"#{number} complete event without a name")
        if (e["pid"], e["tid"]) not in named_threads or e["pid"] not in named_processes:
            problems.append(f"#{number} on an unnamed track {(e['pid'], e['tid'])}")
        start = int(e["ts"] * 1000.0)
        tracks[(e["pid"], e["tid"])].append((start, start + int(e["dur"] * 1000.0)))
    for key, slices in tracks.items():
        slices.sort()
        for (a_start, a_end), (b_start, _) in itertools.pairwise(slices):
            if b_start < a_end:
                problems.append(f"overlap on track {key}: [{a_start}, {a_end}) and one starting {b_start}")
    flows: dict[object, Counter] = defaultdict(Counter)
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows[e["id"]][e["ph"]] += 1
            starts_at = int(e["ts"] * 1000.0)
            if not any(s <= starts_at <= t for s, t in tracks.get((e["pid"], e["tid"]), ())):
                problems.append(f"flow {e['id']} ({e['ph']}) is not on a slice of its track")
            if e["ph"] == "f" and e.get("bp") != "e":
                problems.append(f"flow end {e['id']} does not bind to its enclosing slice (bp 'e')")
    for flow_id, phases in flows.items():
        if phases["s"] != 1 or phases["f"] != 1:
            problems.append(f"flow id {flow_id} has {dict(phases)} instead of one start and one end")
    for number, e in enumerate(events):
        if e["ph"] == "C":
            values = list((e.get("args") or {}).values())
            if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     and math.isfinite(v) for v in values):
                problems.append(f"#{number} counter with non-numeric values: {e}")
    return problems


def test_the_rules_checker_catches_each_kind_of_violation():
    good = Profile.from_events(*_sample()).to_chrome()
    assert trace_event_format_violations(good) == []
    x = next(e for e in good["traceEvents"] if e["ph"] == "X")
    bad = json.loads(json.dumps(good))
    bad["traceEvents"].append({**x, "dur": -1.0})
    bad["traceEvents"].append({**x, "ts": x["ts"] + x["dur"] / 2})          # overlaps x
    bad["traceEvents"].append({"ph": "s", "id": 10**9, "name": "dep", "cat": "atensor", "pid": x["pid"],
                               "tid": x["tid"], "ts": x["ts"]})               # no end
    bad["traceEvents"].append({"ph": "C", "name": "memory", "pid": 1, "ts": 0.0, "args": {"b": "12"}})
    problems = "\n".join(trace_event_format_violations(bad))
    assert "negative ts or dur" in problems and "overlap on track" in problems
    assert f"flow id {10**9}" in problems and "non-numeric" in problems


def _sample():
    run = simulate_step(seed=5, queue_clock_skew=True)
    return run.spans, run.host_spans, run.memory, run.clock_offsets


def test_the_flagships_cold_cache_trace_follows_the_format_and_its_host_time_is_accounted_for(tmp_path):
    from atensor.backend.c import compiler
    if compiler.path() is None:
        pytest.skip("no C compiler here: the jit's kernels stay on numpy, there is no compile to see")
    # the command a user runs, in a fresh process (kernels compiled by earlier tests in this one
    # would not be compiled again) with a cold compiler cache and the default native policy
    trace = tmp_path / "t.json"
    root = _PATH.parents[1]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "ATENSOR_NATIVE": "jit",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("ATENSOR_CACHE", None)
    run = subprocess.run([sys.executable, str(_PATH), "--epochs", "1", "--profile", str(trace)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "11 steps" in run.stdout
    document = json.loads(trace.read_text())
    assert trace_event_format_violations(document) == []

    prof = Profile.load(trace)
    stats = prof.stats()
    names = [h.name for h in prof.host_spans]
    compiles = [h for h in prof.host_spans if h.category == "compile" and h.detail]
    # the jit's C compile (the third step) is one span naming its kernels, the longest host span
    assert len(compiles) == 1 and compiles[0].name.startswith("compile ")
    kernels = compiles[0].detail.split(", ")
    count = sum(int(k.rsplit("(x", 1)[1][:-1]) if k.endswith(")") else 1 for k in kernels)
    assert count == int(compiles[0].name.split()[1]) and sum(k.startswith(("matmul", "relu", "sum", "max", "add", "mul", "sub", "where", "exp", "log"))
                                                            for k in kernels) > 5
    assert any(n.startswith("schedule") for n in names) and "await realize" in names
    assert names.count("jit train_step") == 11
    coverage = stats.host_coverage
    assert coverage.share >= 0.95, coverage
    assert coverage.own_share >= 0.8, coverage   # atensor's own spans, without the trio task steps
    # the same tracks and names in Perfetto's JSON as on the HTML page
    threads = {e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"host", "event loop", "dispatcher queue", "compute", "copy"} <= threads
    page = prof.export(tmp_path / "t.html").read_text()
    for name in ("event loop", "dispatcher queue", compiles[0].name):
        assert json.dumps(name) in page
