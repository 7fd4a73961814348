# The Chrome trace export against the rules Perfetto and chrome://tracing rely on.
from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter, defaultdict

import pytest

from atensor.profiler import HostSpan, MemoryEvent, Profile, Span, profile, record_host, record_span
from atensor.profiler.chrome import _us, from_chrome

from .sample_events import hand_built, simulate_step


def viewer_ns(us: float) -> int:
    """How Perfetto's JSON importer turns a float of microseconds into ns (it truncates)."""
    return int(us * 1000.0)


@pytest.fixture
def run():
    # Two devices, skewed queue clocks, overlapping host spans, memory counters, and one queue
    # whose clock jitter makes two spans overlap.
    run = simulate_step(seed=1, queue_clock_skew=True)
    first = next(s for s in run.spans if s.device == "CPU:1" and s.queue == "compute" and s.kind == "kernel")
    run.spans.append(Span("CPU:1", "compute", 999_999, "jittered", "kernel", first.end_ns - 700,
                          first.end_ns + 4_000))
    return run


@pytest.fixture
def trace(run):
    prof = Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)
    return prof.to_chrome()


def slices_by_track(trace):
    tracks = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            tracks[(event["pid"], event["tid"])].append(event)
    return tracks


def test_complete_events_never_overlap_and_are_monotonic_within_a_track(trace):
    tracks = slices_by_track(trace)
    assert len(tracks) == 4 + 2   # 2 devices x (compute, copy) + 2 host lanes
    for events in tracks.values():
        for a, b in itertools.pairwise(events):
            assert a["ts"] <= b["ts"]
            # In exact ns, and as a viewer truncating floats reads them.
            assert round(a["ts"] * 1000) + round(a["dur"] * 1000) <= round(b["ts"] * 1000)
            assert viewer_ns(a["ts"]) + viewer_ns(a["dur"]) <= viewer_ns(b["ts"])
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events)


def test_every_span_is_one_complete_event_with_its_facts_in_args(run, trace):
    meta = process_and_thread_names(trace)
    device_slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and meta[0][e["pid"]] != "host"]
    assert len(device_slices) == len(run.spans)
    by_task = {e["args"]["task_id"]: e for e in device_slices}
    for span in run.spans:
        event = by_task[span.task_id]
        assert event["name"] == span.name
        assert meta[0][event["pid"]] == span.device
        assert meta[1][(event["pid"], event["tid"])] == span.queue
        assert event["args"] == {"task_id": span.task_id, "kind": span.kind, "bytes": span.bytes,
                                 "flops": span.flops, "deps": list(span.deps)}
        assert round(event["dur"] * 1000) == span.end_ns - span.start_ns   # durations are kept
    host_slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and meta[0][e["pid"]] == "host"]
    assert sorted(e["name"] for e in host_slices) == sorted(h.name for h in run.host_spans)


def process_and_thread_names(trace):
    processes, threads = {}, {}
    for event in trace["traceEvents"]:
        if event["ph"] == "M" and event["name"] == "process_name":
            processes[event["pid"]] = event["args"]["name"]
        if event["ph"] == "M" and event["name"] == "thread_name":
            threads[(event["pid"], event["tid"])] = event["args"]["name"]
    return processes, threads


def test_metadata_names_every_process_and_thread(run, trace):
    processes, threads = process_and_thread_names(trace)
    assert sorted(processes.values()) == ["CPU:0", "CPU:1", "host"]
    assert len(set(processes)) == 3
    for key in slices_by_track(trace):
        assert key in threads and key[0] in processes
    device_queues = {(processes[p], name) for (p, _), name in threads.items() if processes[p] != "host"}
    assert device_queues == {(s.device, s.queue) for s in run.spans}
    host_lanes = sorted(name for (p, _), name in threads.items() if processes[p] == "host")
    assert host_lanes == ["host", "host (2)"]   # concurrent host spans go to a second lane
    tids = [key[1] for key in threads]
    assert len(tids) == len(set(tids))          # thread ids are unique across processes


def test_every_cross_track_dependency_is_one_bound_flow(run, trace):
    events = trace["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len([e for e in events if e["ph"] == "s"])    # ids are unique
    assert starts.keys() == finishes.keys()                             # every start finishes
    assert all(f["bp"] == "e" for f in finishes.values())

    # Expected edges, straight from the recorded events: deps on another (device, queue).
    where = {s.task_id: (s.device, s.queue) for s in run.spans}
    expected = Counter(
        (dep, s.task_id) for s in run.spans for dep in set(s.deps) if where[dep] != (s.device, s.queue)
    )
    # Each flow event binds to the slice with exactly its pid, tid, ts and category.
    slice_at = {(e["pid"], e["tid"], e["ts"], e["cat"]): e for e in events if e["ph"] == "X"}
    found = Counter()
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        source = slice_at[(start["pid"], start["tid"], start["ts"], start["cat"])]
        target = slice_at[(finish["pid"], finish["tid"], finish["ts"], finish["cat"])]
        assert (start["pid"], start["tid"]) != (finish["pid"], finish["tid"])
        assert source["args"]["task_id"] in target["args"]["deps"]
        assert (start["name"], start["cat"]) == (finish["name"], finish["cat"])
        found[(source["args"]["task_id"], target["args"]["task_id"])] += 1
    assert found == expected
    assert sum(expected.values()) > 10


def test_flow_events_come_after_the_slices_they_bind_to(trace):
    phases = [e["ph"] for e in trace["traceEvents"]]
    last_slice = max(i for i, p in enumerate(phases) if p == "X")
    assert all(i > last_slice for i, p in enumerate(phases) if p in "sf")


def test_memory_is_a_counter_per_device(run, trace):
    processes, _ = process_and_thread_names(trace)
    counters = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "C":
            assert event["name"] == "memory"
            counters[processes[event["pid"]]].append(event)
    assert sorted(counters) == ["CPU:0", "CPU:1"]
    for device, events in counters.items():
        assert [e["args"]["bytes_in_use"] for e in events] == [m.bytes_in_use for m in run.memory
                                                             if m.device == device]
        assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_queue_clock_offsets_are_applied_in_the_export():
    spans = [Span("CPU:0", "compute", 1, "k", "kernel", 5_000, 6_000),
             Span("CPU:0", "copy", 2, "c", "copy", 1_000, 2_000, deps=(1,))]   # copy clock is 6 us behind
    prof = Profile.from_events(spans, clock_offsets={("CPU:0", "copy"): 6_000})
    ts = {e["name"]: e["ts"] for e in prof.to_chrome()["traceEvents"] if e["ph"] == "X"}
    assert ts == {"k": 0.0, "c": 2.0}


def test_the_trace_is_plain_json_that_round_trips_through_a_file(tmp_path, run):
    prof = Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)
    for name in ("trace.json", "trace.json.gz"):
        path = prof.export(tmp_path / name)
        loaded = Profile.load(path)
        assert loaded.stats() == prof.stats()
        assert len(loaded.spans) == len(run.spans)
        assert sorted(s.task_id for s in loaded.spans) == sorted(s.task_id for s in run.spans)
        assert len(loaded.host_spans) == len(run.host_spans)
        assert len(loaded.memory) == len(run.memory)
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_a_live_profile_round_trips_with_its_window(tmp_path):
    with profile() as prof:
        time.sleep(0.001)
        now = time.perf_counter_ns()
        assert prof.start_ns is not None
        record_span(Span("CPU:0", "compute", 1, "k", "kernel", prof.start_ns + 100, now - 100))
        record_host(HostSpan("await", "await", prof.start_ns + 50, now))
    loaded = Profile.load(prof.export(tmp_path / "live.json"))
    assert loaded.stats() == prof.stats()
    assert loaded.stats().window_ns == prof.end_ns - prof.start_ns
    assert loaded.summary() == prof.summary()


def test_export_rejects_an_unknown_suffix_naming_the_ones_that_work(tmp_path):
    prof = Profile.from_events(hand_built())
    with pytest.raises(ValueError) as error:
        prof.export(tmp_path / "trace.txt")
    assert ".json" in str(error.value) and ".html" in str(error.value)
    assert not (tmp_path / "trace.txt").exists()


def test_microsecond_floats_read_back_as_the_exact_nanoseconds():
    rng = random.Random(0)
    for ns in [0, 1, 999, 1000, 1001, 1_000_579] + [rng.randrange(10**13) for _ in range(20_000)]:
        us = _us(ns)
        assert int(us * 1000.0) == ns          # Perfetto's conversion
        assert round(us * 1000) == ns          # exact rounding
        assert json.loads(json.dumps(us)) == us


def test_loading_rejects_what_is_not_a_trace():
    with pytest.raises(ValueError, match="not a Chrome trace"):
        from_chrome({"hello": 1})
    with pytest.raises(ValueError, match="no complete"):
        from_chrome({"traceEvents": []})
    with pytest.raises(ValueError, match="malformed"):
        from_chrome({"traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1}]})


def test_traces_from_other_tools_are_read_leniently():
    saved = from_chrome([
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "GPU"}},
        {"ph": "X", "name": "gemm", "pid": 7, "tid": 3, "ts": 1.5, "dur": 2.0},
    ])
    assert [(s.device, s.queue, s.name, s.start_ns, s.end_ns) for s in saved.spans] == [
        ("GPU", "tid 3", "gemm", 1500, 3500)]
    assert saved.host_spans == [] and saved.memory == [] and saved.window == (None, None)


def test_an_empty_profile_exports_a_valid_trace(tmp_path):
    prof = Profile.from_events(host_spans=[HostSpan("s", "schedule", 0, 10)],
                               memory=[MemoryEvent("CPU:0", 5, 64)])
    loaded = Profile.load(prof.export(tmp_path / "empty.json"))
    assert loaded.spans == [] and len(loaded.host_spans) == 1 and len(loaded.memory) == 1
