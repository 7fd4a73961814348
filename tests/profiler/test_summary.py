# The summary's numbers against event lists whose answers are worked out by hand.
from __future__ import annotations

import itertools

import pytest

from atensor.profiler import HostSpan, MemoryEvent, Profile, Span
from atensor.profiler.summary import format_bytes, format_ns

from .sample_events import hand_built, simulate_step


def stats_of(spans, host=(), memory=(), offsets=None):
    return Profile.from_events(spans, host, memory, offsets).stats()


def test_wall_work_overlap_and_utilization_of_the_hand_built_run():
    # CPU:0 compute busy 0-100 and 150-250, CPU:0 copy 100-140, CPU:1 compute 0-50 and 260-300.
    stats = stats_of(hand_built())
    assert stats.wall_ns == 300
    assert stats.work_ns == 200 + 40 + 90
    assert stats.overlap == pytest.approx(330 / 300)
    assert stats.queue("CPU:0", "compute").busy_ns == 200
    assert stats.queue("CPU:0", "compute").utilization == pytest.approx(200 / 300)
    assert stats.queue("CPU:0", "copy").utilization == pytest.approx(40 / 300)
    assert stats.queue("CPU:1", "compute").utilization == pytest.approx(90 / 300)
    assert [(q.device, q.queue) for q in stats.queues] == [
        ("CPU:0", "compute"), ("CPU:0", "copy"), ("CPU:1", "compute")]
    assert stats.devices == ("CPU:0", "CPU:1")


def test_per_kernel_table_of_the_hand_built_run():
    stats = stats_of(hand_built())
    assert [k.name for k in stats.kernels] == ["matmul", "add", "copy"]   # by total time
    matmul = stats.kernel("matmul")
    assert (matmul.kind, matmul.count, matmul.total_ns, matmul.mean_ns, matmul.max_ns) == (
        "kernel", 2, 200, 100, 100)
    assert matmul.share == pytest.approx(200 / 300)
    assert (matmul.bytes, matmul.flops) == (600, 2000)
    add = stats.kernel("add")
    assert (add.count, add.total_ns, add.mean_ns, add.max_ns) == (2, 90, 45, 50)
    assert stats.kernel("copy").kind == "copy"


def test_critical_path_follows_deps_and_counts_the_waits_between():
    # 1 (0-100) -> 2 (100-140) -> 3 (150-250) -> 5 (260-300): 280 ns of work, 10 + 10 ns idle.
    # The other chain 4 (0-50) -> 5 has only 90 ns of work.
    path = stats_of(hand_built()).critical_path
    assert path.task_ids == (1, 2, 3, 5)
    assert path.work_ns == 280
    assert path.wait_ns == 20
    assert path.length_ns == 300
    assert path.share_of_wall == pytest.approx(1.0)
    assert [s.wait_before_ns for s in path.steps] == [0, 0, 10, 10]


def test_critical_path_is_the_chain_with_most_work_not_the_last_to_finish():
    spans = [
        Span("CPU:0", "compute", 1, "big", "kernel", 0, 200),
        Span("CPU:0", "copy", 2, "small copy", "copy", 210, 220, deps=(1,)),
        Span("CPU:1", "compute", 3, "early", "kernel", 0, 50),
        Span("CPU:1", "compute", 4, "late", "kernel", 300, 320, deps=(3,)),
    ]
    stats = stats_of(spans)
    assert stats.wall_ns == 320
    path = stats.critical_path
    assert path.task_ids == (1, 2)
    assert (path.work_ns, path.wait_ns, path.length_ns) == (210, 10, 220)
    assert path.share_of_wall == pytest.approx(220 / 320)


def test_wait_spans_count_as_waiting_not_as_busy_time():
    # CPU:1's compute queue blocks on task 1 of CPU:0 (a wait span), then runs task 3.
    spans = [
        Span("CPU:0", "compute", 1, "producer", "kernel", 0, 100),
        Span("CPU:1", "compute", 2, "wait", "wait", 0, 100, deps=(1,)),
        Span("CPU:1", "compute", 3, "consumer", "kernel", 100, 130, deps=(2,)),
    ]
    stats = stats_of(spans)
    consumer_queue = stats.queue("CPU:1", "compute")
    assert (consumer_queue.busy_ns, consumer_queue.wait_ns) == (30, 100)
    assert consumer_queue.utilization == pytest.approx(30 / 130)
    assert stats.work_ns == 130
    assert [k.name for k in stats.kernels] == ["producer", "consumer"]   # waits are not kernels
    path = stats.critical_path
    assert path.task_ids == (1, 2, 3)
    # The wait overlaps the producer entirely, so it adds nothing: 100 + 0 + 30.
    assert (path.work_ns, path.wait_ns, path.length_ns) == (130, 0, 130)


def test_queue_clock_offsets_map_spans_onto_the_host_clock():
    # The copy queue's clock runs 1 ms behind the host: its spans are stamped 1_000_000 ns early.
    on_host = hand_built()
    skewed = [
        Span(s.device, s.queue, s.task_id, s.name, s.kind, s.start_ns - 1_000_000, s.end_ns - 1_000_000,
             s.bytes, s.flops, s.deps) if s.queue == "copy" else s
        for s in on_host
    ]
    assert stats_of(skewed, offsets={("CPU:0", "copy"): 1_000_000}) == stats_of(on_host)
    assert stats_of(skewed).wall_ns > 1_000_000   # without the offset the picture is wrong


def test_jittered_overlap_on_one_queue_is_shifted_apart_keeping_durations():
    spans = [
        Span("CPU:0", "compute", 1, "a", "kernel", 0, 100),
        Span("CPU:0", "compute", 2, "b", "kernel", 95, 145),   # 5 ns of clock jitter
    ]
    prof = Profile.from_events(spans)
    placed = prof.timeline().tracks[0].items
    assert [(p.start, p.end) for p in placed] == [(0, 100), (100, 150)]
    stats = prof.stats()
    assert stats.queue("CPU:0", "compute").busy_ns == 150
    assert stats.kernel("b").total_ns == 50


def test_host_spans_and_memory_appear_in_the_summary():
    host = [HostSpan("schedule", "schedule", 0, 40), HostSpan("compile k", "compile", 10, 30),
            HostSpan("await", "await", 40, 300)]
    memory = [MemoryEvent("CPU:0", 0, 1024), MemoryEvent("CPU:0", 50, 3 << 20), MemoryEvent("CPU:0", 90, 0)]
    stats = stats_of(hand_built(), host, memory)
    assert {h.category: (h.count, h.total_ns) for h in stats.host} == {
        "schedule": (1, 40), "compile": (1, 20), "await": (1, 260)}
    assert stats.peak_memory == {"CPU:0": 3 << 20}
    text = Profile.from_events(hand_built(), host, memory).summary()
    assert "schedule" in text and "compile" in text and "3.0 MiB" in text


def test_summary_text_shows_every_table():
    text = Profile.from_events(hand_built()).summary()
    assert "5 spans on 3 queues of 2 devices" in text
    assert "wall time" in text and "300 ns" in text
    assert "overlap" in text and "1.10x" in text
    assert "critical path" in text and "100.0% of wall" in text and "280 ns work + 20 ns waiting" in text
    lines = text.splitlines()
    matmul_row = next(line for line in lines if line.startswith("matmul "))
    assert matmul_row.split()[:3] == ["matmul", "kernel", "2"]
    assert "66.7%" in matmul_row
    queue_row = next(line for line in lines if line.startswith("CPU:0 compute"))
    assert queue_row.split()[-1] == "66.7%"


def test_an_empty_profile_says_so_instead_of_dividing_by_zero():
    prof = Profile.from_events()
    stats = prof.stats()
    assert (stats.wall_ns, stats.work_ns, stats.overlap, stats.critical_path.length_ns) == (0, 0, 0.0, 0)
    assert "no device work was recorded" in prof.summary()


def test_simulated_step_keeps_the_summary_invariants():
    run = simulate_step(seed=3, queue_clock_skew=True)
    stats = stats_of(run.spans, run.host_spans, run.memory, run.clock_offsets)
    assert sum(q.busy_ns for q in stats.queues) == stats.work_ns
    assert all(0 <= q.utilization <= 1 for q in stats.queues)
    assert 1 <= stats.overlap <= len(stats.queues)
    path = stats.critical_path
    assert path.length_ns == path.work_ns + path.wait_ns <= stats.wall_ns
    assert sum(k.total_ns for k in stats.kernels) == stats.work_ns
    # Consecutive critical steps are real dependency edges.
    by_id = {s.task_id: s for s in run.spans}
    for before, after in itertools.pairwise(path.steps):
        assert before.task_id in by_id[after.task_id].deps


@pytest.mark.parametrize("ns, text", [(0, "0 ns"), (999, "999 ns"), (1_500, "1.50 us"),
                                      (2_345_000, "2.35 ms"), (1_250_000_000, "1.250 s")])
def test_durations_are_printed_with_a_readable_unit(ns, text):
    assert format_ns(ns) == text


def test_byte_counts_are_printed_with_a_binary_unit():
    assert [format_bytes(b) for b in (512, 4096, 3 << 20, 5 << 30)] == [
        "512 B", "4.0 KiB", "3.0 MiB", "5.0 GiB"]


def test_reused_task_ids_resolve_to_the_latest_run_of_that_task():
    # Two realizes whose task graphs both number their tasks from 1.
    spans = [
        Span("CPU:0", "compute", 1, "first k", "kernel", 0, 100),
        Span("CPU:0", "copy", 2, "first c", "copy", 100, 120, deps=(1,)),
        Span("CPU:0", "compute", 1, "second k", "kernel", 1_000, 1_300),
        Span("CPU:0", "copy", 2, "second c", "copy", 1_300, 1_320, deps=(1,)),
    ]
    prof = Profile.from_events(spans)
    timeline = prof.timeline()
    names = {(timeline.spans[a].span.name, timeline.spans[b].span.name) for a, b in timeline.edges}
    assert names == {("first k", "first c"), ("second k", "second c")}
    assert prof.stats().critical_path.length_ns == 320


def test_contradictory_deps_do_not_make_a_cycle():
    spans = [Span("CPU:0", "compute", 1, "a", "kernel", 0, 10, deps=(2,)),
             Span("CPU:1", "compute", 2, "b", "kernel", 0, 10, deps=(1,))]
    timeline = Profile.from_events(spans).timeline()
    assert len(timeline.edges) == 1
    assert sorted(timeline.order) == [0, 1]
    assert Profile.from_events(spans).stats().critical_path.length_ns == 10
