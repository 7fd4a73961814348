# The HTML timeline: one self-contained page to open in any browser, offline.
#
# Perfetto is the tool for deep digging, but it is a web app someone has to open and load a file
# into; a single .html file is what people attach to an issue or open from a CI artifact. This
# module turns a normalized timeline into the page's data (compact arrays, one per span) and
# wraps it with the stylesheet and script of html_assets.py. Everything the page shows is
# computed here or in summary.py, so the page and the terminal summary agree.
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .html_assets import JS
from .html_style import CSS
from .summary import compute_stats, critical_chain, format_ns
from .timeline import Timeline

# Colours by kind (device spans) and by category (host spans); colour-blind-safe Tableau hues.
COLORS = {
    "kernel": "#4e79a7",
    "copy": "#f28e2b",
    "allreduce": "#59a14f",
    "wait": "#d4d7db",
    "schedule": "#9c755f",
    "compile": "#b07aa1",
    "submit": "#edc948",
    "await": "#a0cbe8",
    "gc": "#e15759",
    "load": "#76b7b2",
    "call": "#bab0ac",
    "task": "#8cd17d",
}

# Shown before the page's main script so that any script error ends up in the DOM, where a
# headless-browser test (and a person) can see it.
_ERROR_HOOK = """
window.addEventListener("error", function (event) {
  var line = document.createElement("div");
  line.className = "script-error";
  line.textContent = "script error: " + (event.message || event) + " (line " + (event.lineno || "?") + ")";
  var box = document.getElementById("errors");
  if (box) { box.appendChild(line); return; }
  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("errors").appendChild(line);
  });
});
"""


def page_data(timeline: Timeline) -> dict[str, Any]:
    """The JSON the page's script draws: tracks, spans as arrays, edges, memory, window."""
    critical = set(critical_chain(timeline))
    spans: list[list[Any]] = []
    for position, item in enumerate(timeline.spans):
        s = item.span
        spans.append([item.track, item.start, item.end, s.name, s.kind, s.task_id, s.bytes, s.flops,
                      list(s.deps), 1 if position in critical else 0, "", timeline.kernel_ops.get(s.name, "")])
    for host_item in timeline.host_spans:
        h = host_item.span
        spans.append([host_item.track, host_item.start, host_item.end, h.name, h.category, None, 0, 0,
                      [], 0, h.track, h.detail])
    return {
        "processes": timeline.processes(),
        "tracks": [{"process": t.process, "name": t.name, "host": t.is_host} for t in timeline.tracks],
        "spans": spans,
        # Device spans come first in `spans`, so timeline positions are page positions.
        "edges": [list(edge) for edge in timeline.cross_track_edges()],
        "memory": {device: [list(sample) for sample in samples]
                   for device, samples in timeline.memory.items()},
        "window": list(timeline.window),
        "colors": COLORS,
    }


def render_html(timeline: Timeline, title: str = "atensor profile") -> str:
    """The complete page as a string."""
    stats = compute_stats(timeline)
    cp = stats.critical_path
    facts = [
        ("wall", format_ns(stats.wall_ns)),
        ("work", format_ns(stats.work_ns)),
        ("overlap", f"{stats.overlap:.2f}x"),
        ("critical path", f"{format_ns(cp.length_ns)} ({cp.share_of_wall:.0%} of wall)"),
        ("spans", str(stats.span_count + stats.host_span_count)),
    ]
    stat_html = " ".join(
        f'<span class="stat">{html.escape(k)} <b>{html.escape(v)}</b></span>' for k, v in facts
    )
    kinds = [k for k in COLORS if any(item.span.kind == k for item in timeline.spans)]
    kinds += [k for k in COLORS if any(item.span.category == k for item in timeline.host_spans)]
    legend = "".join(
        f'<span><i style="background:{COLORS[k]}"></i>{html.escape(k)}</span>' for k in kinds
    )
    # "</" would end the <script> element early; JSON allows the escaped form "<\/".
    data = json.dumps(page_data(timeline), separators=(",", ":")).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
<script>{_ERROR_HOOK}</script>
</head>
<body>
<header>
  <div class="bar">
    <h1>{html.escape(title)}</h1>
    {stat_html}
    <div class="legend">{legend}</div>
    <div class="controls">
      <label><input type="checkbox" id="show-deps" checked> dependencies</label>
      <label><input type="checkbox" id="show-critical" checked> critical path</label>
      <button id="reset" type="button">reset zoom</button>
    </div>
  </div>
  <div class="bar hint">wheel: zoom around the cursor &middot; drag: pan &middot; double-click: reset
    &middot; hover a span for its details, click to pin them <span id="notice"></span></div>
  <svg id="axis" height="26"></svg>
</header>
<div id="errors"></div>
<pre id="selftest"></pre>
<div id="status" data-rendered="0" hidden></div>
<main id="timeline"></main>
<div id="tip"></div>
<script type="application/json" id="profile-data">{data}</script>
<script>{JS}</script>
</body>
</html>
"""


def write_html_file(timeline: Timeline, path: Path) -> None:
    """Write the HTML timeline page to `path`."""
    path.write_text(render_html(timeline), encoding="utf-8")
