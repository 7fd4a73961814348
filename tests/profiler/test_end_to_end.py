"""The profiler fed by real realizes: spans from the queues' stamps, flows for every cross-queue
dependency, host spans, memory counters, and an export that follows the trace-format rules."""
from __future__ import annotations

import json

import numpy as np

import atensor
from atensor import Device, Tensor


def test_simplest_case_records_a_kernel_span_on_the_device():
    with atensor.profile() as prof:
        t = Tensor.empty(32) + 1
        t.realize().wait()
        Device.get("CPU").synchronize()
    kernels = [s for s in prof.spans if s.kind == "kernel" and s.device == "CPU:0"]
    assert kernels, prof.spans
    assert all(s.end_ns >= s.start_ns for s in kernels)
    assert kernels[0].name == "add 32"


async def test_two_device_pipeline_has_spans_on_every_queue_and_ordered_dependencies(tmp_path):
    data = np.linspace(0, 1, 4096, dtype=np.float32)
    x = Tensor(data)
    with atensor.profile() as prof:
        a = (x * 2).exp().contiguous()               # CPU:0 compute
        b = (a.to("CPU:1") + 1).sin().contiguous()   # copy to CPU:1, compute there
        c = (b.to("CPU:0") * 3).sum()                # copy back, reduce on CPU:0
        await c.realize()
    queues = {(s.device, s.queue) for s in prof.spans}
    assert {("CPU:0", "compute"), ("CPU:1", "copy"), ("CPU:1", "compute"), ("CPU:0", "copy")} <= queues
    by_id = {s.task_id: s for s in prof.spans}
    for span in prof.spans:
        for dep in span.deps:
            assert by_id[dep].end_ns <= span.start_ns, (by_id[dep], span)
    assert any(s.bytes > 0 for s in prof.spans if s.kind == "copy")
    assert any(s.flops > 0 for s in prof.spans if s.kind == "kernel")
    ref = (np.sin(np.exp(data * 2) + 1) * 3).sum()
    assert np.isfinite(ref)
    np.testing.assert_allclose(c.item(), ref, rtol=1e-4)

    trace = prof.to_chrome()
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    track_of = {}
    for e in events:
        if e.get("ph") == "X" and "task_id" in e.get("args", {}):
            track_of[e["args"]["task_id"]] = (e["pid"], e["tid"])
    cross = {(d, s.task_id) for s in prof.spans for d in s.deps if track_of[d] != track_of[s.task_id]}
    assert cross, "the pipeline has cross-queue edges"
    starts = {e["id"] for e in events if e.get("ph") == "s"}
    finishes = {e["id"] for e in events if e.get("ph") == "f"}
    assert len(starts) >= len(cross) and starts == finishes
    # no overlapping complete events within a track
    per_track: dict = {}
    for e in events:
        if e.get("ph") == "X":
            per_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_track.values():
        spans.sort()
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-3
    path = prof.export(tmp_path / "trace.json")
    assert json.loads(path.read_text())
    assert "CPU:1" in prof.summary()


async def test_host_spans_and_memory_counters_are_recorded():
    with atensor.profile() as prof:
        t = (Tensor.rand(256, 256) @ Tensor.rand(256, 256)).sum()
        await t.realize()
    categories = {h.category for h in prof.host_spans}
    assert {"schedule", "await"} <= categories
    assert prof.memory and all(m.bytes_in_use >= 0 for m in prof.memory)


def test_nothing_is_recorded_when_no_profile_is_active():
    from atensor.profiler import collector
    assert not collector.is_active()
    outside = atensor.profile()
    (Tensor([1.0, 2.0]) + 1).realize().wait()
    with outside:
        pass
    assert outside.spans == []
