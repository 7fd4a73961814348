# The HTML timeline: self-contained, and drawn by a real (headless) browser without errors.
from __future__ import annotations

import json
import re
import struct
from html.parser import HTMLParser

import pytest

from atensor.profiler import HostSpan, Profile, Span

from .browser import dump_dom, find_chromium, screenshot
from .sample_events import simulate_step

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (as root: apt-get update && apt-get install -y chromium)",
)


class DomCounter(HTMLParser):
    """Collects the elements of a dumped DOM that the tests look at."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, str]] = []
        self.bands: list[dict[str, str]] = []
        self.deps = 0
        self.errors: list[str] = []
        self.status: dict[str, str] = {}
        self._in: str | None = None
        self.selftest = ""

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        classes = attributes.get("class", "").split()
        if tag == "rect" and "span" in classes:
            self.spans.append(attributes)
        if tag == "rect" and "band" in classes:
            self.bands.append(attributes)
        if tag == "path" and "dep" in classes and attributes.get("visibility") != "hidden":
            self.deps += 1
        if "script-error" in classes:
            self._in = "error"
            self.errors.append("")
        if attributes.get("id") == "status":
            self.status = attributes
        if attributes.get("id") == "selftest":
            self._in = "selftest"

    def handle_endtag(self, tag):
        if tag in ("div", "pre"):
            self._in = None

    def handle_data(self, data):
        if self._in == "error":
            self.errors[-1] += data
        elif self._in == "selftest":
            self.selftest += data


def sample_profile() -> Profile:
    run = simulate_step(seed=4, queue_clock_skew=True)
    # A name that would break a naive page: it must show as text, not close the data <script>.
    run.spans.append(Span("CPU:1", "copy", 777_777, "</script><b>evil</b>", "copy", 0, 10))
    run.host_spans.append(HostSpan("compile <kernel & co>", "compile", 1, 2))
    return Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)


def page_span(prof: Profile, index: int) -> tuple[str, str]:
    """(name, kind or category) of the page's span number `index` (device spans, then host)."""
    timeline = prof.timeline()
    if index < len(timeline.spans):
        span = timeline.spans[index].span
        return span.name, span.kind
    host = timeline.host_spans[index - len(timeline.spans)].span
    return host.name, host.category


def test_the_page_is_self_contained(tmp_path):
    page = sample_profile().export(tmp_path / "timeline.html").read_text()
    # The only URL is the SVG namespace, which browsers never fetch.
    assert set(re.findall(r"https?://[^\s\"')]+", page)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert page.count("</script>") == 3   # the error hook, the data, the page script
    data = json.loads(re.search(r'id="profile-data">(.*?)</script>', page, re.S).group(1))
    prof = sample_profile()
    assert len(data["spans"]) == len(prof.spans) + len(prof.host_spans)


@needs_chromium
def test_every_span_is_drawn_as_its_own_rect_or_counted_in_a_band_without_script_errors(tmp_path):
    prof = sample_profile()
    page = prof.export(tmp_path / "timeline.html")
    dom = DomCounter()
    dom.feed(dump_dom(page))
    assert dom.errors == []
    total = len(prof.spans) + len(prof.host_spans)
    assert dom.status.get("data-rendered") == str(total)
    drawn = [s for s in dom.spans if s.get("visibility") != "hidden"]
    in_bands = sum(int(b["data-count"]) for b in dom.bands if b.get("visibility") != "hidden")
    assert len(drawn) + in_bands == total
    assert len({s["data-span"] for s in drawn}) == len(drawn)
    kinds = {s["data-kind"] for s in drawn}
    assert {"kernel", "copy", "allreduce", "schedule", "compile", "await"} <= kinds
    # Every span was laid out on screen: a real position and width, not the placeholder zero.
    assert all(float(s["width"]) >= 1 for s in drawn)


@needs_chromium
def test_zoom_pan_and_hover_work_in_the_browser(tmp_path):
    prof = sample_profile()
    page = prof.export(tmp_path / "timeline.html")
    dom = DomCounter()
    dom.feed(dump_dom(page, fragment="selftest"))
    assert dom.errors == []
    result = json.loads(dom.selftest)
    assert result == {**result, "zoomed": True, "anchored": True, "panned": True, "reset": True}
    hovered = page_span(prof, result["tooltipSpan"])
    assert result["tooltip"].startswith(hovered[0])
    assert "duration" in result["tooltip"] and hovered[1] in result["tooltip"]


@needs_chromium
def test_a_screenshot_of_the_timeline_is_a_real_picture(tmp_path):
    page = sample_profile().export(tmp_path / "timeline.html")
    png = tmp_path / "shot.png"
    screenshot(page, png, width=1200, height=400)
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1200, 400)
    assert png.stat().st_size > 20_000   # a blank page compresses to a few kB
