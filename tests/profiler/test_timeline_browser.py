"""The HTML timeline at every zoom, driven in headless chromium through the DevTools protocol:
real mouse moves, clicks and wheel turns (browser.Browser), the page read back with JavaScript."""
from __future__ import annotations

import re

import pytest

from atensor.profiler import Profile

from .browser import Browser, find_chromium
from .sample_events import long_run, simulate_step

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (as root: apt-get update && apt-get install -y chromium)",
)

WIDTH, HEIGHT = 1200, 640


def export(tmp_path, run) -> tuple[Profile, object]:
    prof = Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)
    return prof, prof.export(tmp_path / "timeline.html")


def center_of(page: Browser, index: int) -> tuple[float, float] | None:
    """The viewport centre of span `index`'s own rect, None when it is not drawn as one."""
    box = page.evaluate(
        f"(() => {{ const r = document.querySelector('rect.span[data-span=\"{index}\"]:not([visibility=hidden])');"
        f" if (!r) return null; const b = r.getBoundingClientRect();"
        f" return [b.left + b.width / 2, b.top + b.height / 2]; }})()")
    return None if box is None else (box[0], box[1])


def tip(page: Browser) -> tuple[bool, str]:
    shown, text = page.evaluate(
        "[getComputedStyle(document.getElementById('tip')).display !== 'none',"
        " document.getElementById('tip').innerText]")
    return shown, text


def test_hovering_a_span_shows_its_name_queue_start_duration_bytes_flops_and_dependencies(tmp_path):
    prof, page_path = export(tmp_path, simulate_step(seed=2))
    timeline = prof.timeline()
    with Browser(WIDTH, HEIGHT) as page:
        page.open(page_path)
        assert page.evaluate("document.getElementById('errors').textContent") == ""
        # the widest kernel that depends on a span of another queue
        position = max((n for n, p in enumerate(timeline.spans) if p.span.kind == "kernel" and p.span.deps),
                       key=lambda n: timeline.spans[n].duration)
        placed = timeline.spans[position]
        at = center_of(page, position)
        assert at is not None
        assert tip(page)[0] is False
        page.mouse_move(*at)
        shown, text = tip(page)
        assert shown
        span = placed.span
        dep_names = {p.span.name for p in timeline.spans if p.span.task_id in span.deps}
        assert text.startswith(span.name)
        assert f"{span.device} / {span.queue}" in text
        assert f"{placed.start / 1e6:.3f} ms" in text               # start, to the microsecond
        assert f"{placed.duration / 1e3:.2f} us" in text            # duration
        assert "MiB" in text or "KiB" in text                       # bytes
        assert "MFLOP" in text or "GFLOP" in text                   # flops
        assert "depends on" in text and any(name in text for name in dep_names)
        # moving off the spans hides it again
        page.mouse_move(WIDTH - 5, HEIGHT - 5)
        assert tip(page)[0] is False


def test_a_click_pins_the_details_until_a_click_elsewhere(tmp_path):
    prof, page_path = export(tmp_path, simulate_step(seed=3))
    timeline = prof.timeline()
    position = max(range(len(timeline.spans)), key=lambda n: timeline.spans[n].duration)
    with Browser(WIDTH, HEIGHT) as page:
        page.open(page_path)
        at = center_of(page, position)
        page.click(*at)
        assert page.evaluate("atensorTimeline.drawn().selected") == position
        page.mouse_move(WIDTH - 5, HEIGHT - 5)                      # the mouse leaves: still shown
        shown, text = tip(page)
        assert shown and text.startswith(timeline.spans[position].span.name) and "pinned" in text
        page.click(WIDTH - 5, HEIGHT - 5)                           # a click on empty space
        assert page.evaluate("atensorTimeline.drawn().selected") is None
        assert tip(page)[0] is False


def test_axis_labels_differ_at_every_zoom(tmp_path):
    _, page_path = export(tmp_path, long_run(2_000))
    windows = [None, (1.2040e9, 1.2044e9), (1.2041e9, 1.204104e9), (50e6, 50.0002e6), (7e6, 7.00000002e6),
               (0, 1e3)]
    with Browser(WIDTH, HEIGHT) as page:
        page.open(page_path)
        for window in windows:
            if window is not None:
                page.evaluate(f"atensorTimeline.setView({window[0]}, {window[1]})")
            ticks = page.evaluate("atensorTimeline.drawn().ticks")
            assert len(ticks) >= 3, (window, ticks)
            assert len(set(ticks)) == len(ticks), (window, ticks)
            assert all(re.fullmatch(r"-?\d+(\.\d+)? (s|ms|us|ns)", t) for t in ticks), ticks
        page.evaluate("atensorTimeline.setView(1.2040e9, 1.2046e9)")   # 100 us ticks
        assert page.evaluate("atensorTimeline.drawn().ticks")[:3] == ["1.2040 s", "1.2041 s", "1.2042 s"]


def test_a_zoomed_out_10000_span_trace_draws_a_bounded_page_with_density_bands(tmp_path):
    run = long_run(10_000)
    prof, page_path = export(tmp_path, run)
    total = len(run.spans) + len(run.host_spans)
    with Browser(WIDTH, HEIGHT) as page:
        page.open(page_path)
        assert page.evaluate("document.getElementById('errors').textContent") == ""
        drawn = page.evaluate("atensorTimeline.drawn()")
        # every span is on screen, as its own rect or counted in a band ...
        assert drawn["spans"] + sum(drawn["bandCounts"]) == total
        assert drawn["bands"] > 0 and max(drawn["bandCounts"]) > 20
        # ... in a page whose size does not follow the trace's
        assert drawn["elements"] < 3_000, drawn["elements"]   # about one per pixel column and track at most
        assert drawn["elements"] < total / 4
        # too many arrows to follow: none drawn until a span is hovered
        assert drawn["arrowMode"] == "focus" and drawn["arrows"] == 0
        assert drawn["arrowsOnScreen"] > 1000
        # a band's tooltip counts its spans
        box = page.evaluate(
            "(() => { const bands = Array.from(document.querySelectorAll('rect.band:not([visibility=hidden])'));"
            " const b = bands.sort((p, q) => q.getAttribute('data-count') - p.getAttribute('data-count'))[0];"
            " const r = b.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2, Number(b.getAttribute('data-count'))]; })()")
        page.mouse_move(box[0], box[1])
        shown, text = tip(page)
        assert shown and text.startswith("density band") and f"{box[2]} merged" in text
        # zoomed in with the wheel, through the browser's input: spans get their own rects
        for _ in range(12):
            page.wheel(WIDTH * 0.5, 200, -400)
        zoomed = page.evaluate("atensorTimeline.drawn()")
        view = page.evaluate("atensorTimeline.getView()")
        assert view[1] - view[0] < (prof.timeline().window[1]) / 50
        assert zoomed["bands"] < drawn["bands"] and zoomed["spans"] > 0


def test_arrows_show_when_readable_and_otherwise_only_for_the_hovered_span(tmp_path):
    run = long_run(3_000)
    prof, page_path = export(tmp_path, run)
    timeline = prof.timeline()
    cross = timeline.cross_track_edges()
    with Browser(WIDTH, HEIGHT) as page:
        page.open(page_path)
        assert page.evaluate("atensorTimeline.drawn().arrowMode") == "focus"
        # hover the longest span that has cross-queue arrows: only its own are drawn
        position = max({b for _, b in cross}, key=lambda n: timeline.spans[n].duration)
        own = sum(1 for a, b in cross if position in (a, b))
        page.mouse_move(*center_of(page, position))
        drawn = page.evaluate("atensorTimeline.drawn()")
        assert drawn["arrowMode"] == "focus" and drawn["arrows"] == own > 0
        # one step of the simulated run on screen: few enough arrows to follow, all drawn
        first = timeline.spans[0]
        step_end = max(p.end for p in timeline.spans if p.span.task_id < 60)
        page.evaluate(f"atensorTimeline.setView({first.start - 1000}, {step_end + 1000})")
        drawn = page.evaluate("atensorTimeline.drawn()")
        assert drawn["arrowMode"] == "all" and drawn["arrows"] == drawn["arrowsOnScreen"] > 0
