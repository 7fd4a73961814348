# One normalized view of a profile, shared by every exporter and by the summary.
#
# Raw events are what the hot path could afford to record: spans on each queue's own clock,
# dependency edges as bare task ids, host spans that may overlap because several trio tasks
# schedule and await at once. Every consumer needs the same cleaned-up picture, so it is built
# here once and the Chrome exporter, the HTML page and the statistics all read it. Two consumers
# computing "the same" thing differently is how a summary ends up disagreeing with the trace.
#
# The rules, each kept in one place below:
# - Clocks: a span's times plus its queue's clock offset are host-clock times; all times are then
#   made relative to one origin (the earliest thing the profile saw), so exported numbers are
#   small and keep their ns precision in a float of microseconds.
# - No overlap within a track: a queue runs its commands strictly in order, so two of its spans
#   overlapping can only be clock jitter. The later span is shifted to start where the earlier
#   one ended, keeping its duration (durations are what kernel statistics are made of). Host
#   spans do overlap for real (concurrent trio tasks, nested phases), so they are spread over
#   lanes instead: lane k of track "host" is named "host (k+1)" and holds no overlapping spans.
# - Dependencies: a dep id names a task; when task ids are unique within the profile (the
#   core's contract) that is the edge. When an id was reused across realizes, the dep is the
#   latest span with that id that started before the dependent ended (a dependent cannot finish
#   before what it waits for). Edges do not point backwards in start time: a "wait" span starts
#   before the task it waits for. So `order` is a real topological order (Kahn's algorithm, ties
#   by end time); an edge that would close a cycle, which only contradictory input can make, is
#   dropped rather than trusted.
from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .events import HostSpan, MemoryEvent, Span

_Lane = list[tuple[int, HostSpan]]   # (relative start, span), no two overlapping

# Queues are listed in this order within a device; unknown queue names follow alphabetically.
_QUEUE_ORDER = {"compute": 0, "copy": 1}
# Host tracks (events.py HostSpan.track) in this order: the host's own work first, then the event
# loop's task steps, the dispatcher's queue, the background compiler, garbage collections.
_HOST_TRACK_ORDER = {"host": 0, "event loop": 1, "dispatcher queue": 2, "compile (background)": 3, "gc": 4}


@dataclass(frozen=True, slots=True)
class PlacedSpan:
    """A device span placed on the shared timeline: ns relative to the origin, no overlaps."""

    span: Span
    index: int
    track: int
    start: int
    end: int

    @property
    def duration(self) -> int:
        """Duration in ns after placement (equal to the recorded duration)."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class PlacedHostSpan:
    """A host span on one lane of its host track, ns relative to the origin."""

    span: HostSpan
    track: int
    start: int
    end: int


@dataclass(slots=True)
class Track:
    """One horizontal row: a (device, queue) pair, or one lane of a host track."""

    index: int
    process: str          # the device name, or "host"
    name: str             # the queue name, or the host lane's name
    is_host: bool
    items: list = field(default_factory=list)   # PlacedSpan or PlacedHostSpan, sorted by start


@dataclass(slots=True)
class Timeline:
    """Everything an exporter needs, on one clock, in the order tracks should be shown."""

    origin_ns: int
    tracks: list[Track]
    spans: list[PlacedSpan]                      # device spans, sorted by (start, index)
    host_spans: list[PlacedHostSpan]
    memory: dict[str, list[tuple[int, int]]]     # device -> [(ts, bytes_in_use)] sorted by ts
    edges: list[tuple[int, int]]                 # (dep, dependent) positions in `spans`
    order: list[int]                             # positions in `spans`, topologically sorted
    window: tuple[int, int]                      # (start, end) of everything seen, relative
    profile_window: tuple[int | None, int | None]  # entering and exiting the profile, relative
    kernel_ops: dict[str, str] = field(default_factory=dict)  # kernel name -> its op list (hover text)

    def cross_track_edges(self) -> list[tuple[int, int]]:
        """Edges whose two spans are on different tracks (same-track order needs no arrow)."""
        return [(a, b) for a, b in self.edges if self.spans[a].track != self.spans[b].track]

    def processes(self) -> list[str]:
        """Process names in display order: "host" first when present, then devices."""
        seen: dict[str, None] = {}
        for track in self.tracks:
            seen.setdefault(track.process, None)
        for device in self.memory:
            seen.setdefault(device, None)
        host = ["host"] if "host" in seen else []
        return host + sorted((p for p in seen if p != "host"), key=device_sort_key)


def device_sort_key(device: str) -> tuple:
    """Natural order for device names: CPU, CPU:1, CPU:2, ..., CPU:10, NULL:0, ..."""
    match = re.fullmatch(r"(.*?)(?::(\d+))?", device)
    assert match is not None
    return (match.group(1), int(match.group(2) or 0), device)


def queue_sort_key(queue: str) -> tuple:
    """Compute queues first, then copy queues, then any other queue by name."""
    base = queue.rstrip("0123456789:_-")
    return (_QUEUE_ORDER.get(base, len(_QUEUE_ORDER)), base, queue)


def build_timeline(
    spans: Iterable[Span],
    host_spans: Iterable[HostSpan] = (),
    memory: Iterable[MemoryEvent] = (),
    clock_offsets: Mapping[tuple[str, str], int] | None = None,
    window: tuple[int | None, int | None] = (None, None),
    kernel_ops: Mapping[str, str] | None = None,
) -> Timeline:
    """Map raw events onto one clock and one set of non-overlapping tracks.

    `clock_offsets[(device, queue)]` is added to that queue's span times; `window` is the host
    time the profile was entered and exited (either may be None); `kernel_ops` names each kernel's
    ops (sched/kernel_names.py), shown on hover.
    """
    offsets = clock_offsets or {}
    host_list = list(host_spans)
    memory_list = list(memory)
    shifted = [(s.start_ns + offsets.get((s.device, s.queue), 0), s) for s in spans]
    window_times = [t for t in window if t is not None]
    starts = [t for t, _ in shifted] + [h.start_ns for h in host_list] + [m.ts_ns for m in memory_list]
    origin = min(starts + window_times, default=0)

    # Host lanes are shown above the devices, so they take the first track indices.
    tracks: list[Track] = []
    host_placed: list[PlacedHostSpan] = []
    for name, lanes in _host_lanes(host_list, origin):
        for number, lane in enumerate(lanes):
            track = Track(len(tracks), "host", name if number == 0 else f"{name} ({number + 1})", True)
            tracks.append(track)
            track.items = [PlacedHostSpan(h, track.index, start, start + h.duration_ns) for start, h in lane]
            host_placed.extend(track.items)
    host_placed.sort(key=lambda p: (p.start, p.track))

    placed: list[PlacedSpan] = []
    for (device, queue), items in _queue_groups(shifted, origin):
        track = Track(len(tracks), device, queue, False)
        tracks.append(track)
        previous_end: int | None = None
        for start, index, span in items:
            # Invariant: spans within one queue track never overlap (see the module comment).
            if previous_end is not None and start < previous_end:
                start = previous_end
            item = PlacedSpan(span, index, track.index, start, start + span.duration_ns)
            track.items.append(item)
            previous_end = item.end
        placed.extend(track.items)
    placed.sort(key=lambda p: (p.start, p.index))

    memory_map: dict[str, list[tuple[int, int]]] = {}
    for event in sorted(memory_list, key=lambda e: (device_sort_key(e.device), e.ts_ns)):
        memory_map.setdefault(event.device, []).append((event.ts_ns - origin, event.bytes_in_use))

    ends = [p.end for p in placed] + [h.end for h in host_placed] + [t - origin for t in window_times]
    ends += [samples[-1][0] for samples in memory_map.values()]
    window_rel = (0, max(ends, default=0))
    edges, order = _resolve_edges(placed)
    entered = tuple(None if t is None else t - origin for t in window)
    return Timeline(origin, tracks, placed, host_placed, memory_map, edges, order, window_rel,
                    (entered[0], entered[1]), dict(kernel_ops or {}))


def _queue_groups(
    shifted: list[tuple[int, Span]], origin: int
) -> list[tuple[tuple[str, str], list[tuple[int, int, Span]]]]:
    """Spans grouped by (device, queue) in display order, each group sorted by (start, index)."""
    groups: dict[tuple[str, str], list[tuple[int, int, Span]]] = {}
    for index, (start, span) in enumerate(shifted):
        groups.setdefault((span.device, span.queue), []).append((start - origin, index, span))
    keys = sorted(groups, key=lambda k: (device_sort_key(k[0]), queue_sort_key(k[1])))
    return [(key, sorted(groups[key], key=lambda e: (e[0], e[1]))) for key in keys]


def _host_lanes(host_spans: list[HostSpan], origin: int) -> list[tuple[str, list[_Lane]]]:
    """Per host track name, lanes of (relative start, span) in which no two spans overlap."""
    by_track: dict[str, list[HostSpan]] = {}
    for span in host_spans:
        by_track.setdefault(span.track, []).append(span)
    result = []
    for name in sorted(by_track, key=lambda n: (_HOST_TRACK_ORDER.get(n, len(_HOST_TRACK_ORDER)), n)):
        lanes: list[_Lane] = []
        lane_ends: list[int] = []
        # Longest first among equal starts, so an enclosing phase keeps the first lane.
        for span in sorted(by_track[name], key=lambda s: (s.start_ns, -s.duration_ns)):
            start = span.start_ns - origin
            free = next((k for k, end in enumerate(lane_ends) if end <= start), None)
            if free is None:
                lanes.append([])
                lane_ends.append(start)
                free = len(lanes) - 1
            lanes[free].append((start, span))
            lane_ends[free] = start + span.duration_ns
        result.append((name, lanes))
    return result


def _resolve_edges(placed: list[PlacedSpan]) -> tuple[list[tuple[int, int]], list[int]]:
    """Dep task ids as (dep position, dependent position) pairs in `placed`, and a topological
    order of the positions in which every kept edge points forwards."""
    by_task: dict[int, list[int]] = {}
    for position, item in enumerate(placed):
        by_task.setdefault(item.span.task_id, []).append(position)
    preds: list[list[int]] = [[] for _ in placed]
    for position, item in enumerate(placed):
        found = preds[position]
        for dep in item.span.deps:
            candidates = by_task.get(dep)
            if candidates is None:
                continue   # the dep ran before the profile began: no edge
            if len(candidates) == 1:
                chosen = candidates[0]
            else:
                others = [c for c in candidates if c != position]
                started = [c for c in others if placed[c].start < item.end]
                chosen = (started[-1:] or others[:1] or [position])[0]
            if chosen != position and chosen not in found:
                found.append(chosen)

    # Kahn's algorithm; among ready spans the earliest-ending goes first. Heap entries are ranks
    # in that order (plain ints compare fastest).
    by_end = sorted(range(len(placed)), key=lambda n: (placed[n].end, placed[n].start, placed[n].index))
    rank = [0] * len(placed)
    for r, n in enumerate(by_end):
        rank[n] = r
    succs: list[list[int]] = [[] for _ in placed]
    for position, deps in enumerate(preds):
        for dep in deps:
            succs[dep].append(position)
    missing = [len(deps) for deps in preds]
    ready = [rank[n] for n in range(len(placed)) if not missing[n]]
    heapq.heapify(ready)
    done = [False] * len(placed)
    order: list[int] = []
    next_unforced = 0
    while len(order) < len(placed):
        if not ready:   # a cycle: release its earliest-ending span and forget its unmet deps
            while done[by_end[next_unforced]]:
                next_unforced += 1
            n = by_end[next_unforced]
            preds[n] = [d for d in preds[n] if done[d]]
            missing[n] = 0
            ready.append(rank[n])
        n = by_end[heapq.heappop(ready)]
        if done[n]:
            continue
        done[n] = True
        order.append(n)
        for succ in succs[n]:
            if not done[succ] and missing[succ]:
                missing[succ] -= 1
                if not missing[succ]:
                    heapq.heappush(ready, rank[succ])
    edges = sorted((dep, n) for n, deps in enumerate(preds) for dep in deps)
    return edges, order
