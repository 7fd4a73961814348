"""One trace for the whole world: every process's profile, on rank 0's clock, in one Profile.

Why align after a barrier: the processes' clocks (perf_counter) are unrelated on different hosts
and need not agree on one. Every process leaves a barrier within a few microseconds of the others
(the barrier's own skew, far below a kernel's length), so each reads its clock right after it and
rank 0 shifts process r's events by (rank 0's reading - r's reading). Devices and host tracks are
renamed "rank{r}/CPU:0", "rank{r}/host"; task ids get a per-rank offset so dependency arrows stay
within their process. The events are the collector's own records (Span, HostSpan, MemoryEvent).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

from atensor.dist.processes import World
from atensor.profiler.collector import Profile

_TASK_ID_STRIDE = 1 << 40  # task ids of rank r start at r * stride (ids of one process stay far below)


def merged(world: World, profile: Profile) -> Optional[Profile]:
    """Collective: on rank 0, one Profile of every process's `profile` on rank 0's clock; None on
    the others. In a world of one process, `profile` itself."""
    if world.size == 1:
        return profile
    world.barrier()
    now = time.perf_counter_ns()
    got = world.gather((now, profile.spans, profile.host_spans, profile.memory, dict(profile.clock_offsets),
                        profile.start_ns, profile.end_ns))
    if got is None:
        return None
    origin = got[0][0]
    spans, host, memory, offsets = [], [], [], {}
    for rank, (clock, rank_spans, rank_host, rank_memory, rank_offsets, _, _) in enumerate(got):
        shift, prefix, base = origin - clock, f"rank{rank}/", rank * _TASK_ID_STRIDE
        for span in rank_spans:
            key = (prefix + span.device, span.queue)
            offsets.setdefault(key, rank_offsets.get((span.device, span.queue), 0) + shift)
            spans.append(span._replace(device=key[0], task_id=span.task_id + base,
                                       deps=tuple(d + base for d in span.deps)))
        host += [dataclasses.replace(h, track=prefix + h.track, start_ns=h.start_ns + shift,
                                     end_ns=h.end_ns + shift) for h in rank_host]
        memory += [dataclasses.replace(m, device=prefix + m.device, ts_ns=m.ts_ns + shift) for m in rank_memory]
    out = Profile.from_events(spans, host, memory, offsets)
    starts = [s + origin - c for c, _, _, _, _, s, _ in got if s is not None]
    ends = [e + origin - c for c, _, _, _, _, _, e in got if e is not None]
    out.start_ns = min(starts) if starts else None
    out.end_ns = max(ends) if ends else None
    return out
