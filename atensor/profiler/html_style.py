# The stylesheet of the HTML timeline (its script: html_assets.py). A Python string, like the
# script, so the page ships with the package and stays one self-contained file.
from __future__ import annotations

CSS = r"""
* { box-sizing: border-box; }
body { margin: 0; font: 12px/1.35 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2329;
       background: #fff; }
header { position: sticky; top: 0; z-index: 2; background: #f6f7f9; border-bottom: 1px solid #d9dde3; }
.bar { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; padding: 7px 12px 4px; }
.bar h1 { font-size: 14px; margin: 0 8px 0 0; }
.stat b { font-variant-numeric: tabular-nums; }
.legend { display: flex; gap: 10px; flex-wrap: wrap; }
.legend span { display: inline-flex; align-items: center; gap: 4px; }
.legend i { width: 11px; height: 11px; border-radius: 2px; display: inline-block; }
.controls { margin-left: auto; display: flex; gap: 12px; align-items: center; }
.controls button { font: inherit; padding: 1px 8px; }
.hint { color: #6b7480; }
#notice { color: #a3400b; margin-left: 12px; }
#axis { display: block; }
#axis text { fill: #4d5661; font-size: 10px; font-variant-numeric: tabular-nums; }
#axis line { stroke: #aab2bc; }
#chart { display: block; user-select: none; cursor: grab; }
#chart.dragging { cursor: grabbing; }
.row-process { fill: #eef1f4; }
.row-track { fill: #ffffff; }
.row-track.odd { fill: #f8f9fb; }
.row-label { fill: #2b323a; font-size: 11px; }
.row-label.process { font-weight: 600; }
.gutter { fill: #fff; }
.gutter-line { stroke: #d9dde3; }
.grid line { stroke: #eceff2; }
rect.span { stroke: rgba(0, 0, 0, 0.28); stroke-width: 0.5; }
rect.span:hover, rect.band:hover { stroke: #111; stroke-width: 1.2; }
rect.band { stroke: none; }
rect.span.critical.show { stroke: #d62728; stroke-width: 2; }
rect.span.selected { stroke: #111; stroke-width: 2.5; }
text.label { font-size: 10px; fill: #fff; pointer-events: none; }
text.label.dark { fill: #1d2329; }
path.dep { fill: none; stroke: #3b4650; stroke-width: 1; opacity: 0.55; pointer-events: none; }
path.dep.critical { stroke: #d62728; opacity: 0.9; stroke-width: 1.5; }
path.dep.focus { stroke: #111; opacity: 0.95; stroke-width: 1.6; }
path.mem { fill: rgba(118, 183, 178, 0.35); stroke: #4f8f8a; stroke-width: 1; }
#tip { position: fixed; display: none; z-index: 5; pointer-events: none; max-width: 460px;
       background: rgba(24, 28, 33, 0.94); color: #f2f4f6; padding: 7px 9px; border-radius: 4px;
       box-shadow: 0 2px 10px rgba(0, 0, 0, 0.25); font-size: 11.5px; }
#tip.pinned { outline: 2px solid #edc948; }
#tip .name { font-weight: 600; font-size: 12.5px; margin-bottom: 3px; word-break: break-all; }
#tip td { padding: 0 8px 0 0; vertical-align: top; }
#tip td:first-child { color: #aeb6bf; white-space: nowrap; }
#tip td:last-child { word-break: break-word; }
#tip .hint { color: #aeb6bf; margin-top: 4px; }
#errors:empty { display: none; }
#errors { background: #fde8e8; color: #8a1010; padding: 6px 12px; font-family: monospace; }
#selftest:empty { display: none; }
"""
