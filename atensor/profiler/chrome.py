# Chrome trace-event JSON: the format Perfetto, chrome://tracing and speedscope all open.
#
# Mapping (the trace-event format's "JSON Object Format"):
# - one process (pid) per device, plus a process named "host" for host spans; one thread (tid)
#   per queue or host lane. `M` metadata events name them and fix their order.
# - every span is a complete event (`X`) with ts/dur in microseconds as floats. Tracks never
#   hold overlapping events (timeline.py guarantees it), so viewers never misnest slices.
# - every dependency edge between two different tracks is a flow: an `s` event on the dep's
#   track at the dep's start and an `f` event with `bp: "e"` on the dependent's track at the
#   dependent's start, sharing a unique id and the category/name "atensor"/"dep". The flow events
#   use exactly the slices' pid, tid, ts and category, because that is how the viewers bind a
#   flow to a slice: Perfetto binds `s` to the slice open on that thread at that time and `f`
#   (with bp "e") to the enclosing slice; Chrome DevTools matches (cat, pid, tid, ts) exactly.
#   Flow events come after all slices in the file, so the slice is open when its flow is read.
# - memory is a counter (`C`) per device named "memory" with args {"bytes_in_use": N}.
#
# Precision: viewers turn microseconds back into ns as int(ts * 1000.0), which truncates; a float
# like 1.579 can come back as 1578 ns and make two touching slices overlap by 1 ns. `_us` picks,
# for each ns value, the float nearest above ns/1000 that survives that round trip exactly (and
# also round(ts * 1000) == ns), so what a viewer reads is what we placed.
from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import HOST_CATEGORIES, HostSpan, MemoryEvent, Span
from .timeline import PlacedHostSpan, PlacedSpan, Timeline

PRODUCER = "atensor.profiler"
FORMAT_VERSION = 1
FLOW_CATEGORY = "atensor"
SPAN_CATEGORY = "atensor"


def _us(ns: int) -> float:
    """ns as float microseconds that every reader turns back into exactly `ns`."""
    value = ns / 1000
    while int(value * 1000.0) < ns:
        value = math.nextafter(value, math.inf)
    return value


def to_chrome(timeline: Timeline) -> dict[str, Any]:
    """Build the Chrome trace JSON object for a timeline."""
    pids = {name: number + 1 for number, name in enumerate(timeline.processes())}
    tids: dict[int, int] = {}
    lanes_in_process: dict[str, int] = {}
    metadata: list[dict[str, Any]] = []
    for name, pid in pids.items():
        metadata.append(_meta("process_name", pid, None, {"name": name}))
        metadata.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
    for track in timeline.tracks:
        pid = pids[track.process]
        lane = lanes_in_process.get(track.process, 0)
        lanes_in_process[track.process] = lane + 1
        tid = tids[track.index] = pid * 1000 + lane + 1
        metadata.append(_meta("thread_name", pid, tid, {"name": track.name}))
        metadata.append(_meta("thread_sort_index", pid, tid, {"sort_index": lane}))

    slices: list[dict[str, Any]] = []
    for track in timeline.tracks:
        pid, tid = pids[track.process], tids[track.index]
        for item in track.items:
            slices.append(_slice(item, pid, tid, timeline.kernel_ops))

    flows: list[dict[str, Any]] = []
    for flow_id, (dep, dependent) in enumerate(timeline.cross_track_edges(), start=1):
        for phase, item in (("s", timeline.spans[dep]), ("f", timeline.spans[dependent])):
            event = {
                "ph": phase, "id": flow_id, "name": "dep", "cat": FLOW_CATEGORY,
                "pid": pids[item.span.device], "tid": tids[item.track], "ts": _us(item.start),
            }
            if phase == "f":
                event["bp"] = "e"
            flows.append(event)

    counters: list[dict[str, Any]] = []
    for device, samples in timeline.memory.items():
        for ts, in_use in samples:
            counters.append({
                "ph": "C", "name": "memory", "pid": pids[device], "ts": _us(ts),
                "args": {"bytes_in_use": in_use},
            })

    return {
        "traceEvents": metadata + slices + flows + counters,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": PRODUCER,
            "format_version": FORMAT_VERSION,
            "clock": "host perf_counter_ns, relative to origin_ns",
            "origin_ns": timeline.origin_ns,
            "profile_window_ns": list(timeline.profile_window),
        },
    }


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _slice(item: PlacedSpan | PlacedHostSpan, pid: int, tid: int, kernel_ops: dict[str, str]) -> dict[str, Any]:
    """One `X` event; device spans carry their task-graph facts (and a kernel its op list) in args."""
    event: dict[str, Any] = {
        "ph": "X", "name": item.span.name, "pid": pid, "tid": tid,
        "ts": _us(item.start), "dur": _us(item.end - item.start),
    }
    if isinstance(item, PlacedSpan):
        span = item.span
        event["cat"] = SPAN_CATEGORY
        event["args"] = {
            "task_id": span.task_id, "kind": span.kind, "bytes": span.bytes,
            "flops": span.flops, "deps": list(span.deps),
        }
        ops = kernel_ops.get(span.name)
        if ops:
            event["args"]["ops"] = ops
    else:
        event["cat"] = item.span.category
        event["args"] = {"category": item.span.category, "track": item.span.track}
        if item.span.detail:
            event["args"]["detail"] = item.span.detail
    return event


def write_chrome_file(timeline: Timeline, path: Path) -> None:
    """Write the Chrome trace to `path`, gzip-compressed when it ends in .gz."""
    text = json.dumps(to_chrome(timeline), separators=(",", ":"))
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text, encoding="utf-8")


# -- reading a saved trace back -----------------------------------------------------------------


@dataclass(slots=True)
class SavedTrace:
    """The events read back from a Chrome trace, and when the profile was entered and exited."""

    spans: list[Span] = field(default_factory=list)
    host_spans: list[HostSpan] = field(default_factory=list)
    memory: list[MemoryEvent] = field(default_factory=list)
    window: tuple[int | None, int | None] = (None, None)
    kernel_ops: dict[str, str] = field(default_factory=dict)  # kernel name -> its op list


def read_chrome_file(path: Path) -> SavedTrace:
    """Load events from a Chrome trace file (plain or gzip); ValueError if it is not a trace."""
    raw = path.read_bytes()   # FileNotFoundError / IsADirectoryError propagate as they are
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise ValueError(f"{path}: damaged gzip data ({error})") from None
    try:
        document = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file, so not a JSON trace") from None
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    return from_chrome(document, str(path))


def from_chrome(document: Any, source: str = "trace") -> SavedTrace:
    """Turn a Chrome trace object back into events; ValueError if it is not a trace.

    Traces written by this package come back exactly (on the trace's relative clock). Traces
    from other tools are read leniently: every complete event becomes a span of its process
    (device) and thread (queue).
    """
    if isinstance(document, dict) and isinstance(document.get("traceEvents"), list):
        events = document["traceEvents"]
        other = document.get("otherData")
        ours = isinstance(other, dict) and other.get("producer") == PRODUCER
    elif isinstance(document, list):
        events, other, ours = document, None, False
    else:
        raise ValueError(f"{source}: not a Chrome trace (expected an object with a 'traceEvents' list)")

    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "M":
            name = (event.get("args") or {}).get("name")
            if event.get("name") == "process_name" and isinstance(name, str):
                process_names[event.get("pid")] = name
            elif event.get("name") == "thread_name" and isinstance(name, str):
                thread_names[(event.get("pid"), event.get("tid"))] = name

    spans: list[Span] = []
    host_spans: list[HostSpan] = []
    memory: list[MemoryEvent] = []
    kernel_ops: dict[str, str] = {}
    complete = 0
    for number, event in enumerate(events):
        if not isinstance(event, dict):
            raise ValueError(f"{source}: trace event #{number} is not an object")
        phase = event.get("ph")
        if phase not in ("X", "C"):
            continue
        try:
            start = round(float(event["ts"]) * 1000)
            pid = event.get("pid")
            process = process_names.get(pid, f"pid {pid}")
            if phase == "C":
                if event.get("name") == "memory":
                    for value in (event.get("args") or {}).values():
                        memory.append(MemoryEvent(process, start, int(value)))
                continue
            complete += 1
            end = start + round(float(event.get("dur", 0)) * 1000)
            args = event.get("args") or {}
            thread = thread_names.get((pid, event.get("tid")), f"tid {event.get('tid')}")
            name = str(event.get("name", "?"))
            if process == "host" and (ours or event.get("cat") in HOST_CATEGORIES):
                track = str(args.get("track", thread))
                host_spans.append(HostSpan(name, str(event.get("cat", "")), start, end, track,
                                           str(args.get("detail", ""))))
            else:
                spans.append(Span(
                    process, thread, int(args.get("task_id", -complete)), name,
                    str(args.get("kind", "kernel")), start, end, int(args.get("bytes", 0)),
                    int(args.get("flops", 0)), tuple(int(d) for d in args.get("deps", ())),
                ))
                if args.get("ops"):
                    kernel_ops[name] = str(args["ops"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{source}: trace event #{number} is malformed ({error!r})") from None
    if not ours and complete == 0:
        raise ValueError(f"{source}: no complete ('X') events, so nothing to summarize")
    window: tuple[int | None, int | None] = (None, None)
    entered = other.get("profile_window_ns") if ours else None
    if isinstance(entered, list) and len(entered) == 2:
        window = (entered[0] if isinstance(entered[0], int) else None,
                  entered[1] if isinstance(entered[1], int) else None)
    return SavedTrace(spans, host_spans, memory, window, kernel_ops)
