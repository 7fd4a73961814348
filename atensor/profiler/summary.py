# The numbers people ask of a concurrent run, and the tables that print them.
#
# Questions, in the order the summary answers them: how long did the run take (wall time, from
# the first queue command to the last), how much work was done (busy time summed over queues),
# how well did queues overlap (work / wall: 1.0 means one queue at a time, 2.0 two on average),
# what bounded it (the critical path), which kernels cost most, which queues idled.
#
# Definitions, so the numbers can be checked by hand (tests/profiler/test_summary.py does):
# - busy time of a queue: the summed duration of its spans except "wait" spans (a queue blocked
#   on another queue's signal is not doing work); spans of one track never overlap, so the sum
#   is the union. utilization = busy / wall.
# - critical path: the path through the task graph's dependency edges with the most work, where
#   a span's work along an edge is the part of it after its dep ended (so a "wait" span that
#   overlaps the task it waits for adds nothing) and a "wait" span's own time counts as waiting.
#   Its length adds the waits between consecutive steps (the idle gap from a dep's end to the
#   dependent's start), so length = work + waiting, never more than the wall time. Ties go to
#   the longer path. Only explicit deps are followed: queue order is not an edge.
# - share of a kernel: its total time over the wall time (can pass 100% when it runs on many
#   queues at once).
# - host coverage: the share of the host's wall time (the profiled window, entering the block to
#   leaving it; the span of all events when the window is unknown) inside at least one named host
#   span, on any host track: the union of the spans, not their sum. It is printed twice, with all
#   host spans and without the "task" spans (the loop's tasks' own code, tasks.py), so a reader sees how
#   much atensor's own spans explain. The largest uncovered gaps are listed: that is where a
#   missing span would go.
#
# All numbers come from timeline.py's normalized timeline, the same one the exports draw, so
# the summary of a saved trace equals the summary of the live profile.
from __future__ import annotations

from dataclasses import dataclass

from .timeline import Timeline


@dataclass(frozen=True, slots=True)
class KernelStats:
    """Totals for every span with one name and kind (kernels, copies, allreduce steps)."""

    name: str
    kind: str
    count: int
    total_ns: int
    mean_ns: float
    max_ns: int
    share: float          # total_ns / wall time
    bytes: int
    flops: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """How busy one (device, queue) track was."""

    device: str
    queue: str
    spans: int
    busy_ns: int
    wait_ns: int
    utilization: float    # busy_ns / wall time


@dataclass(frozen=True, slots=True)
class HostStats:
    """Host time spent in one category (schedule, compile, submit, await)."""

    category: str
    count: int
    total_ns: int


@dataclass(frozen=True, slots=True)
class HostCoverage:
    """How much of the host's wall time named host spans cover (see the module comment)."""

    window_ns: int
    covered_ns: int            # union of every host span, within the window
    covered_own_ns: int        # the same without "task" spans: atensor's own spans
    gaps: tuple[tuple[int, int], ...]   # the largest uncovered (start, duration), longest first

    @property
    def share(self) -> float:
        """covered_ns / window_ns (0.0 for an empty window)."""
        return _ratio(self.covered_ns, self.window_ns)

    @property
    def own_share(self) -> float:
        """covered_own_ns / window_ns."""
        return _ratio(self.covered_own_ns, self.window_ns)


@dataclass(frozen=True, slots=True)
class CriticalStep:
    """One task on the critical path, with the idle gap before it started."""

    device: str
    queue: str
    task_id: int
    name: str
    kind: str
    start_ns: int
    end_ns: int
    wait_before_ns: int


@dataclass(frozen=True, slots=True)
class CriticalPath:
    """The most-work dependency chain: its steps, length, and how that splits."""

    steps: tuple[CriticalStep, ...]
    length_ns: int
    work_ns: int
    wait_ns: int
    share_of_wall: float

    @property
    def task_ids(self) -> tuple[int, ...]:
        """The task ids along the path, first to last."""
        return tuple(step.task_id for step in self.steps)


@dataclass(frozen=True, slots=True)
class ProfileStats:
    """Every number the summary prints. Times in ns on the profile's host clock."""

    wall_ns: int
    window_ns: int
    work_ns: int
    overlap: float
    span_count: int
    host_span_count: int
    devices: tuple[str, ...]
    kernels: tuple[KernelStats, ...]
    queues: tuple[QueueStats, ...]
    host: tuple[HostStats, ...]
    critical_path: CriticalPath
    peak_memory: dict[str, int]
    host_coverage: HostCoverage

    def queue(self, device: str, queue: str) -> QueueStats:
        """The stats of one queue; KeyError if it recorded nothing."""
        for stats in self.queues:
            if (stats.device, stats.queue) == (device, queue):
                return stats
        raise KeyError((device, queue))

    def kernel(self, name: str) -> KernelStats:
        """The stats of the spans called `name` (the first kind found); KeyError if none."""
        for stats in self.kernels:
            if stats.name == name:
                return stats
        raise KeyError(name)


def compute_stats(timeline: Timeline) -> ProfileStats:
    """Compute every summary number from a normalized timeline."""
    spans = timeline.spans
    wall = (max(p.end for p in spans) - min(p.start for p in spans)) if spans else 0

    groups: dict[tuple[str, str], list] = {}
    for item in spans:
        if item.span.kind != "wait":
            groups.setdefault((item.span.name, item.span.kind), []).append(item)
    kernels = []
    for (name, kind), items in groups.items():
        durations = [p.duration for p in items]
        total = sum(durations)
        kernels.append(KernelStats(
            name, kind, len(items), total, total / len(items), max(durations), _ratio(total, wall),
            sum(p.span.bytes for p in items), sum(p.span.flops for p in items),
        ))
    kernels.sort(key=lambda k: (-k.total_ns, k.name))

    queues = []
    for track in timeline.tracks:
        if track.is_host:
            continue
        busy = sum(p.duration for p in track.items if p.span.kind != "wait")
        waited = sum(p.duration for p in track.items if p.span.kind == "wait")
        queues.append(QueueStats(track.process, track.name, len(track.items), busy, waited,
                                 _ratio(busy, wall)))
    work = sum(q.busy_ns for q in queues)

    host: dict[str, list[int]] = {}
    for item in timeline.host_spans:
        host.setdefault(item.span.category, []).append(item.end - item.start)
    host_stats = tuple(sorted(
        (HostStats(category, len(d), sum(d)) for category, d in host.items()), key=lambda h: -h.total_ns
    ))

    return ProfileStats(
        wall_ns=wall,
        window_ns=timeline.window[1] - timeline.window[0],
        work_ns=work,
        overlap=_ratio(work, wall),
        span_count=len(spans),
        host_span_count=len(timeline.host_spans),
        devices=tuple(p for p in timeline.processes() if p != "host"),
        kernels=tuple(kernels),
        queues=tuple(queues),
        host=host_stats,
        critical_path=critical_path(timeline, wall),
        peak_memory={d: max(b for _, b in samples) for d, samples in timeline.memory.items()},
        host_coverage=host_coverage(timeline),
    )


def host_coverage(timeline: Timeline, max_gaps: int = 5) -> HostCoverage:
    """The union of the host spans over the host's wall time, and the largest gaps left."""
    entered, left = timeline.profile_window
    lo = entered if entered is not None else timeline.window[0]
    hi = left if left is not None else timeline.window[1]
    intervals = sorted((max(lo, h.start), min(hi, h.end), h.span.category) for h in timeline.host_spans)
    covered, gaps = _union(intervals, lo, hi)
    covered_own, _ = _union([i for i in intervals if i[2] != "task"], lo, hi)
    gaps.sort(key=lambda gap: (-gap[1], gap[0]))
    return HostCoverage(max(0, hi - lo), covered, covered_own, tuple(gaps[:max_gaps]))


def _union(intervals: list[tuple[int, int, str]], lo: int, hi: int) -> tuple[int, list[tuple[int, int]]]:
    """Covered ns of sorted intervals within [lo, hi], and the uncovered (start, duration) gaps."""
    covered, reached, gaps = 0, lo, []
    for start, end, _ in intervals:
        if end <= start:
            continue
        if start > reached:
            gaps.append((reached, start - reached))
        if end > reached:
            covered += end - max(start, reached)
            reached = end
    if hi > reached:
        gaps.append((reached, hi - reached))
    return covered, gaps


def critical_path(timeline: Timeline, wall_ns: int) -> CriticalPath:
    """The dependency chain with the most work (see the module comment for the exact rule)."""
    chain, best = _longest_chain(timeline)
    if not chain:
        return CriticalPath((), 0, 0, 0, 0.0)
    steps = []
    for n in chain:
        item = timeline.spans[n]
        span = item.span
        steps.append(CriticalStep(span.device, span.queue, span.task_id, span.name, span.kind,
                                  item.start, item.end, best[n][3]))
    work, length = best[chain[-1]][0], best[chain[-1]][1]
    return CriticalPath(tuple(steps), length, work, length - work, _ratio(length, wall_ns))


def critical_chain(timeline: Timeline) -> list[int]:
    """Positions in `timeline.spans` of the critical path's spans, first to last."""
    return _longest_chain(timeline)[0]


def _longest_chain(timeline: Timeline) -> tuple[list[int], list[tuple[int, int, int, int]]]:
    """Dynamic programme over the task graph: per span, the best chain ending at it."""
    spans = timeline.spans
    preds: list[list[int]] = [[] for _ in spans]
    for dep, dependent in timeline.edges:
        preds[dependent].append(dep)
    # best[n] = (work, length, parent position or -1, idle gap after the parent)
    best: list[tuple[int, int, int, int]] = [(0, 0, -1, 0)] * len(spans)
    for n in timeline.order:   # every dep comes before its dependents
        item = spans[n]
        counts = item.span.kind != "wait"
        choice = (item.duration if counts else 0, item.duration, -1, 0)
        for p in preds[n]:
            dep = spans[p]
            gap = max(0, item.start - dep.end)
            effective = max(0, item.end - max(item.start, dep.end))
            work = best[p][0] + (effective if counts else 0)
            length = best[p][1] + gap + effective
            if (work, length) > choice[:2]:
                choice = (work, length, p, gap)
        best[n] = choice
    if not spans:
        return [], best
    node = max(range(len(spans)), key=lambda n: (best[n][0], best[n][1], -n))
    chain: list[int] = []
    while node != -1:
        chain.append(node)
        node = best[node][2]
    chain.reverse()
    return chain, best


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


# -- text ---------------------------------------------------------------------------------------


def format_ns(ns: float) -> str:
    """A duration with a readable unit: 850 ns, 12.40 us, 3.21 ms, 1.250 s."""
    if abs(ns) < 1_000:
        return f"{ns:.0f} ns"
    if abs(ns) < 1_000_000:
        return f"{ns / 1e3:.2f} us"
    if abs(ns) < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"


def format_bytes(count: float) -> str:
    """A byte count with a binary unit: 512 B, 4.0 KiB, 12.5 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def format_summary(stats: ProfileStats, max_kernels: int = 25, max_steps: int = 8) -> str:
    """Render ProfileStats as the tables `Profile.summary()` and the CLI print."""
    lines: list[str] = []
    extras = []
    if stats.host_span_count:
        extras.append(f"{stats.host_span_count} host span" + ("s" if stats.host_span_count > 1 else ""))
    lines.append(
        f"atensor profile: {stats.span_count} spans on {len(stats.queues)} queues of "
        f"{len(stats.devices)} devices" + (f" (+ {', '.join(extras)})" if extras else "")
    )
    if not stats.span_count:
        lines.append("no device work was recorded (was the work awaited inside the profile block?)")
    cp = stats.critical_path
    lines += [
        f"  wall time      {format_ns(stats.wall_ns):>11}   first queue command to last"
        f" (profiled window {format_ns(stats.window_ns)})",
        f"  work           {format_ns(stats.work_ns):>11}   busy time summed over all queues",
        f"  overlap        {stats.overlap:>10.2f}x   work / wall: queues busy at once, on average",
        f"  critical path  {format_ns(cp.length_ns):>11}   {cp.share_of_wall:.1%} of wall, "
        f"{len(cp.steps)} tasks: {format_ns(cp.work_ns)} work + {format_ns(cp.wait_ns)} waiting",
    ]
    if cp.steps:
        shown = [
            (f"(wait {format_ns(s.wait_before_ns)}) " if s.wait_before_ns else "")
            + f"{s.device}/{s.queue} {s.name} [{format_ns(s.end_ns - s.start_ns)}]"
            for s in cp.steps[:max_steps]
        ]
        if len(cp.steps) > max_steps:
            shown.append(f"... {len(cp.steps) - max_steps} more")
        lines.append("                 " + "\n               -> ".join(shown))

    if stats.kernels:
        lines += ["", f"{'per kernel':<32} {'kind':<9} {'count':>6} {'total':>11} {'mean':>11} "
                      f"{'max':>11} {'% wall':>7}"]
        for k in stats.kernels[:max_kernels]:
            lines.append(
                f"{_clip(k.name, 32):<32} {k.kind:<9} {k.count:>6} {format_ns(k.total_ns):>11} "
                f"{format_ns(k.mean_ns):>11} {format_ns(k.max_ns):>11} {k.share:>7.1%}"
            )
        if len(stats.kernels) > max_kernels:
            lines.append(f"... {len(stats.kernels) - max_kernels} more names")

    if stats.queues:
        lines += ["", f"{'per queue':<24} {'spans':>6} {'busy':>11} {'waiting':>11} {'utilization':>12}"]
        for q in stats.queues:
            lines.append(
                f"{_clip(q.device + ' ' + q.queue, 24):<24} {q.spans:>6} {format_ns(q.busy_ns):>11} "
                f"{format_ns(q.wait_ns):>11} {q.utilization:>12.1%}"
            )

    if stats.host:
        lines += ["", f"{'host':<24} {'count':>6} {'total':>11}"]
        for h in stats.host:
            lines.append(f"{h.category:<24} {h.count:>6} {format_ns(h.total_ns):>11}")
    hc = stats.host_coverage
    if hc.window_ns:
        lines += ["", f"host time covered by named spans: {hc.share:.1%} of {format_ns(hc.window_ns)} "
                      f"({hc.own_share:.1%} by atensor's own spans, without the loop's tasks' code)"]
        shown = [gap for gap in hc.gaps if gap[1] > 0]
        if shown:
            lines.append("  largest uncovered: " + ", ".join(
                f"{format_ns(duration)} at {format_ns(start)}" for start, duration in shown))

    if stats.peak_memory:
        lines += ["", "peak memory     " + ", ".join(
            f"{device} {format_bytes(peak)}" for device, peak in stats.peak_memory.items()
        )]
    return "\n".join(lines)
