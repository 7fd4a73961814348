# The stylesheet and script of the HTML timeline, kept apart from html.py's Python.
#
# They live in a Python module, not in .css/.js files, so that they ship with the package with no
# package-data configuration and the page stays one self-contained file: no network, no CDN, it
# opens from a mail attachment on a laptop without internet.
#
# The page draws SVG, one <rect class="span"> per span, because SVG elements are what a hover,
# a test (count the elements) and a screenshot all see directly; a canvas would be faster beyond
# ~100k spans but opaque to all three. Redrawing moves existing elements (sets x and width) and
# never rebuilds them, so wheel-zoom and drag-pan stay smooth on traces of tens of thousands.
#
# Opening the page with "#selftest" makes it zoom, pan and hover by itself after loading and
# write what happened into <pre id="selftest">; the headless-browser test reads that back.
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
#axis text { fill: #4d5661; font-size: 10px; }
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
rect.span:hover { stroke: #111; stroke-width: 1.2; }
rect.span.critical.show { stroke: #d62728; stroke-width: 2; }
text.label { font-size: 10px; fill: #fff; pointer-events: none; }
text.label.dark { fill: #1d2329; }
path.dep { fill: none; stroke: #3b4650; stroke-width: 1; opacity: 0.55; pointer-events: none; }
path.dep.critical { stroke: #d62728; opacity: 0.9; stroke-width: 1.5; }
path.mem { fill: rgba(118, 183, 178, 0.35); stroke: #4f8f8a; stroke-width: 1; }
#tip { position: fixed; display: none; z-index: 5; pointer-events: none; max-width: 420px;
       background: rgba(24, 28, 33, 0.94); color: #f2f4f6; padding: 7px 9px; border-radius: 4px;
       box-shadow: 0 2px 10px rgba(0, 0, 0, 0.25); font-size: 11.5px; }
#tip .name { font-weight: 600; font-size: 12.5px; margin-bottom: 3px; word-break: break-all; }
#tip td { padding: 0 8px 0 0; vertical-align: top; }
#tip td:first-child { color: #aeb6bf; }
#errors:empty { display: none; }
#errors { background: #fde8e8; color: #8a1010; padding: 6px 12px; font-family: monospace; }
#selftest:empty { display: none; }
"""

JS = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("profile-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const GUTTER = 180, PROCESS_H = 20, TRACK_H = 24, MEMORY_H = 40, AXIS_H = 26, PAD = 3;
  const LIGHT_KINDS = { wait: true, submit: true, await: true };
  const MAX_ARROWS = 3000;
  let arrowsHidden = 0;

  function make(name, attrs, parent) {
    const node = document.createElementNS(SVGNS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function fmtNs(ns) {
    const a = Math.abs(ns);
    if (a < 1e3) return ns.toFixed(0) + " ns";
    if (a < 1e6) return (ns / 1e3).toFixed(2) + " us";
    if (a < 1e9) return (ns / 1e6).toFixed(2) + " ms";
    return (ns / 1e9).toFixed(3) + " s";
  }
  function fmtUnits(value, units, base) {
    let i = 0;
    while (Math.abs(value) >= base && i < units.length - 1) { value /= base; i += 1; }
    return (i === 0 ? value.toFixed(0) : value.toFixed(1)) + " " + units[i];
  }
  const fmtBytes = (b) => fmtUnits(b, ["B", "KiB", "MiB", "GiB", "TiB"], 1024);
  const fmtFlops = (f) => fmtUnits(f, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"], 1000);

  // Spans: [track, start, end, name, kind, task_id, bytes, flops, deps, critical, extra]
  const spans = data.spans.map((s) => ({
    track: s[0], start: s[1], end: s[2], name: s[3], kind: s[4], task: s[5], bytes: s[6],
    flops: s[7], deps: s[8], critical: !!s[9], extra: s[10] || "",
  }));

  // ---- layout: a header row per process, a row per track, a memory row per device ----
  const rows = [];
  const trackY = [];
  const memoryY = {};
  let height = 0;
  for (const process of data.processes) {
    rows.push({ kind: "process", label: process, y: height, h: PROCESS_H });
    height += PROCESS_H;
    data.tracks.forEach((track, i) => {
      if (track.process !== process) return;
      rows.push({ kind: "track", label: track.name, y: height, h: TRACK_H, odd: i % 2 === 1 });
      trackY[i] = height;
      height += TRACK_H;
    });
    if (data.memory[process]) {
      const peak = Math.max.apply(null, data.memory[process].map((m) => m[1]));
      rows.push({ kind: "track", label: "memory (peak " + fmtBytes(peak) + ")", y: height, h: MEMORY_H });
      memoryY[process] = { y: height, peak: peak };
      height += MEMORY_H;
    }
  }
  height += 6;

  const root = document.getElementById("timeline");
  const axis = document.getElementById("axis");
  const chart = make("svg", { id: "chart", height: height });
  root.appendChild(chart);
  const defs = make("defs", {}, chart);
  const marker = make("marker", { id: "arrow", viewBox: "0 0 8 8", refX: 8, refY: 4, markerWidth: 5,
                                   markerHeight: 5, orient: "auto-start-reverse" }, defs);
  make("path", { d: "M0,0 L8,4 L0,8 z", fill: "#3b4650" }, marker);
  const clip = make("clipPath", { id: "plot-clip" }, defs);
  const clipRect = make("rect", { x: GUTTER, y: 0, height: height, width: 100 }, clip);

  const rowLayer = make("g", {}, chart);
  const plot = make("g", { "clip-path": "url(#plot-clip)" }, chart);
  const gridLayer = make("g", { class: "grid" }, plot);
  const memoryLayer = make("g", {}, plot);
  const spanLayer = make("g", {}, plot);
  const labelLayer = make("g", {}, plot);
  const depLayer = make("g", {}, plot);
  const gutterLayer = make("g", {}, chart);

  const rowRects = rows.map((row) => make("rect", {
    class: row.kind === "process" ? "row-process" : "row-track" + (row.odd ? " odd" : ""),
    x: 0, y: row.y, height: row.h, width: 100 }, rowLayer));
  make("rect", { class: "gutter", x: 0, y: 0, width: GUTTER, height: height }, gutterLayer);
  make("line", { class: "gutter-line", x1: GUTTER, x2: GUTTER, y1: 0, y2: height }, gutterLayer);
  for (const row of rows) {
    const text = make("text", { class: "row-label" + (row.kind === "process" ? " process" : ""),
                                x: row.kind === "process" ? 8 : 20, y: row.y + row.h / 2 + 4 }, gutterLayer);
    text.textContent = row.label;
  }

  const rects = spans.map((s, i) => {
    const rect = make("rect", {
      class: "span" + (s.critical ? " critical show" : ""), "data-span": i, "data-kind": s.kind,
      y: trackY[s.track] + PAD, height: TRACK_H - 2 * PAD, x: 0, width: 0,
      fill: data.colors[s.kind] || "#9aa3ad" }, spanLayer);
    if (s.task !== null) rect.setAttribute("data-task", s.task);
    return rect;
  });
  // Labels and arrows come from pools sized to what is on screen, not to the whole trace.
  const labelPool = [], depPool = [];
  function pooled(pool, k, layer, tag) {
    if (k === pool.length) pool.push(make(tag, {}, layer));
    return pool[k];
  }
  function hideRest(pool, k) {
    for (; k < pool.length; k++) pool[k].setAttribute("visibility", "hidden");
  }
  const memoryPaths = {};
  for (const device in memoryY) memoryPaths[device] = make("path", { class: "mem" }, memoryLayer);

  // ---- the view: [t0, t1] in ns relative to the profile's origin ----
  const full = [data.window[0], Math.max(data.window[1], data.window[0] + 1000)];
  const margin = (full[1] - full[0]) * 0.02;
  const home = [full[0] - margin, full[1] + margin];
  const view = { t0: home[0], t1: home[1] };
  let width = 800;
  let scale = 1;
  const X = (t) => GUTTER + (t - view.t0) * scale;
  const clampX = (x) => Math.max(GUTTER - 50, Math.min(width + 50, x));

  function niceStep(span) {
    const raw = span / Math.max(2, (width - GUTTER) / 110);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function render() {
    width = Math.max(GUTTER + 200, root.clientWidth || 1000);
    scale = (width - GUTTER) / (view.t1 - view.t0);
    chart.setAttribute("width", width);
    axis.setAttribute("width", width);
    clipRect.setAttribute("width", width - GUTTER);
    for (const r of rowRects) r.setAttribute("width", width);

    let labelCount = 0;
    const shown = new Uint8Array(spans.length);
    spans.forEach((s, i) => {
      const a = X(s.start), b = X(s.end);
      const rect = rects[i];
      if (b < GUTTER - 1 || a > width + 1) {
        if (rect.getAttribute("visibility") !== "hidden") rect.setAttribute("visibility", "hidden");
        return;
      }
      shown[i] = 1;
      const x0 = clampX(a), x1 = clampX(b);
      rect.setAttribute("visibility", "visible");
      rect.setAttribute("x", x0.toFixed(2));
      rect.setAttribute("width", Math.max(1, x1 - x0).toFixed(2));
      const left = Math.max(x0, GUTTER), room = Math.min(x1, width) - left - 6;
      if (room > 24) {
        const label = pooled(labelPool, labelCount++, labelLayer, "text");
        const chars = Math.floor(room / 6);
        label.textContent = s.name.length > chars ? s.name.slice(0, Math.max(1, chars - 1)) + "~" : s.name;
        label.setAttribute("class", "label" + (LIGHT_KINDS[s.kind] ? " dark" : ""));
        label.setAttribute("x", (left + 3).toFixed(2));
        label.setAttribute("y", trackY[s.track] + TRACK_H / 2 + 3.5);
        label.setAttribute("visibility", "visible");
      }
    });
    hideRest(labelPool, labelCount);

    // Arrows whose ends are both off to one side are skipped; past MAX_ARROWS only the critical
    // path's arrows are drawn, and the axis caption says so.
    let visible = [];
    if (document.getElementById("show-deps").checked) {
      visible = data.edges.filter((e) => shown[e[0]] || shown[e[1]] ||
        (spans[e[0]].end < view.t0) !== (spans[e[1]].start < view.t0));
    }
    arrowsHidden = 0;
    if (visible.length > MAX_ARROWS) {
      const critical = visible.filter((e) => spans[e[0]].critical && spans[e[1]].critical);
      const kept = critical.length <= MAX_ARROWS ? critical : [];
      arrowsHidden = visible.length - kept.length;
      visible = kept;
    }
    visible.forEach((e, k) => {
      const from = spans[e[0]], to = spans[e[1]];
      // A wait starts before what it waits for ends: its arrow lands where it was released.
      const x1 = clampX(X(from.end)), x2 = clampX(X(Math.max(to.start, from.end)));
      const y1 = trackY[from.track] + TRACK_H / 2, y2 = trackY[to.track] + TRACK_H / 2;
      const bend = Math.max(18, Math.abs(x2 - x1) / 2);
      const path = pooled(depPool, k, depLayer, "path");
      path.setAttribute("class", "dep" + (from.critical && to.critical ? " critical" : ""));
      path.setAttribute("marker-end", "url(#arrow)");
      path.setAttribute("d", "M" + x1.toFixed(1) + "," + y1 + " C" + (x1 + bend).toFixed(1) + "," +
        y1 + " " + (x2 - bend).toFixed(1) + "," + y2 + " " + x2.toFixed(1) + "," + y2);
      path.setAttribute("visibility", "visible");
    });
    hideRest(depPool, visible.length);

    for (const device in memoryPaths) {
      const samples = data.memory[device], box = memoryY[device];
      const base = box.y + MEMORY_H - 3, top = box.y + 4;
      const yOf = (b) => (base - (box.peak ? (b / box.peak) * (base - top) : 0)).toFixed(1);
      let y = String(base);
      let d = "M" + clampX(X(samples[0][0])).toFixed(1) + "," + base;
      for (const [ts, bytes] of samples) {
        const x = clampX(X(ts)).toFixed(1);
        d += " L" + x + "," + y;   // hold the previous value up to this sample: a step line
        y = yOf(bytes);
        d += " L" + x + "," + y;
      }
      const xEnd = clampX(X(full[1])).toFixed(1);
      d += " L" + xEnd + "," + y + " L" + xEnd + "," + base + " Z";
      memoryPaths[device].setAttribute("d", d);
    }

    while (gridLayer.firstChild) gridLayer.removeChild(gridLayer.firstChild);
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    const step = niceStep(view.t1 - view.t0);
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const x = X(t);
      if (x < GUTTER) continue;
      make("line", { x1: x, x2: x, y1: 0, y2: height }, gridLayer);
      make("line", { x1: x, x2: x, y1: AXIS_H - 7, y2: AXIS_H }, axis);
      const label = make("text", { x: x + 3, y: AXIS_H - 10 }, axis);
      label.textContent = fmtNs(t);
    }
    const caption = make("text", { x: 8, y: AXIS_H - 10 }, axis);
    caption.textContent = "visible: " + fmtNs(view.t1 - view.t0);
    document.getElementById("notice").textContent =
      arrowsHidden ? arrowsHidden + " dependency arrows hidden at this zoom: zoom in to see them" : "";
  }

  let pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; render(); });
  }

  // ---- zoom (wheel, around the cursor), pan (drag), reset (double click or button) ----
  function zoomAt(clientX, factor) {
    // From the view itself, not from the last drawing: several wheel events can arrive between
    // two animation frames.
    const px = Math.max(GUTTER, clientX - chart.getBoundingClientRect().left);
    const frac = Math.min(1, (px - GUTTER) / (width - GUTTER));
    const at = view.t0 + frac * (view.t1 - view.t0);
    const span = Math.min(Math.max((view.t1 - view.t0) * factor, 10), (home[1] - home[0]) * 20);
    view.t0 = at - frac * span;
    view.t1 = view.t0 + span;
    schedule();
  }
  chart.addEventListener("wheel", (event) => {
    event.preventDefault();
    const delta = event.deltaMode === 1 ? event.deltaY * 16 : event.deltaY;
    zoomAt(event.clientX, Math.exp(delta * 0.0015));
  }, { passive: false });

  let drag = null;
  chart.addEventListener("mousedown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, t0: view.t0, t1: view.t1 };
    chart.classList.add("dragging");
    event.preventDefault();
  });
  window.addEventListener("mousemove", (event) => {
    if (!drag) return;
    const shift = (event.clientX - drag.x) * (drag.t1 - drag.t0) / (width - GUTTER);
    view.t0 = drag.t0 - shift;
    view.t1 = drag.t1 - shift;
    schedule();
  });
  window.addEventListener("mouseup", () => { drag = null; chart.classList.remove("dragging"); });
  function reset() { view.t0 = home[0]; view.t1 = home[1]; schedule(); }
  chart.addEventListener("dblclick", reset);
  document.getElementById("reset").addEventListener("click", reset);
  document.getElementById("show-deps").addEventListener("change", schedule);
  document.getElementById("show-critical").addEventListener("change", (event) => {
    rects.forEach((r, i) => { if (spans[i].critical) r.classList.toggle("show", event.target.checked); });
  });
  window.addEventListener("resize", schedule);

  // ---- hover details ----
  const tip = document.getElementById("tip");
  function showTip(i, clientX, clientY) {
    const s = spans[i];
    const rowsHtml = [];
    const add = (k, v) => rowsHtml.push([k, v]);
    add("kind", s.kind);
    add("where", data.tracks[s.track].process + " / " + data.tracks[s.track].name);
    add("start", fmtNs(s.start));
    add("duration", fmtNs(s.end - s.start));
    if (s.task !== null) add("task", String(s.task));
    if (s.bytes) add("bytes", fmtBytes(s.bytes) + (s.end > s.start ?
      "  (" + (s.bytes / (s.end - s.start)).toFixed(2) + " GB/s)" : ""));
    if (s.flops) add("flops", fmtFlops(s.flops) + (s.end > s.start ?
      "  (" + (s.flops / (s.end - s.start)).toFixed(2) + " GFLOP/s)" : ""));
    if (s.deps && s.deps.length) {
      add("deps", s.deps.slice(0, 16).join(", ") + (s.deps.length > 16 ? ", ..." : ""));
    }
    if (s.extra) add("track", s.extra);
    if (s.critical) add("", "on the critical path");
    tip.textContent = "";
    const title = document.createElement("div");
    title.className = "name";
    title.textContent = s.name;
    tip.appendChild(title);
    const table = document.createElement("table");
    for (const [k, v] of rowsHtml) {
      const tr = table.insertRow();
      tr.insertCell().textContent = k;
      tr.insertCell().textContent = v;
    }
    tip.appendChild(table);
    tip.style.display = "block";
    const w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.min(clientX + 14, window.innerWidth - w - 4) + "px";
    tip.style.top = (clientY + 16 + h > window.innerHeight ? clientY - h - 10 : clientY + 16) + "px";
  }
  chart.addEventListener("mousemove", (event) => {
    const i = event.target.getAttribute && event.target.getAttribute("data-span");
    if (i === null || i === undefined || drag) { tip.style.display = "none"; return; }
    showTip(Number(i), event.clientX, event.clientY);
  });
  chart.addEventListener("mouseleave", () => { tip.style.display = "none"; });

  const started = performance.now();
  render();
  const status = document.getElementById("status");
  status.setAttribute("data-rendered", String(rects.length));
  status.setAttribute("data-render-ms", (performance.now() - started).toFixed(0));

  // ---- "#selftest": exercise zoom, pan and hover, and report what happened ----
  if (location.hash === "#selftest") {
    const out = {};
    const box = chart.getBoundingClientRect();
    const before = [view.t0, view.t1];
    const cursor = GUTTER + (width - GUTTER) * 0.8;
    const timeAtCursor = () => view.t0 + 0.8 * (view.t1 - view.t0);
    const anchor = timeAtCursor();
    for (let i = 0; i < 2; i++) {   // two wheel events within one frame
      chart.dispatchEvent(new WheelEvent("wheel", { deltaY: -300, clientX: box.left + cursor,
                                                   clientY: box.top + 10, bubbles: true, cancelable: true }));
    }
    out.zoomed = (view.t1 - view.t0) < (before[1] - before[0]) * 0.9;
    out.anchored = Math.abs(timeAtCursor() - anchor) < 1e-6 * (before[1] - before[0]);
    const zoomed = [view.t0, view.t1];
    chart.dispatchEvent(new MouseEvent("mousedown", { button: 0, clientX: box.left + 500,
                                                     clientY: box.top + 10, bubbles: true }));
    window.dispatchEvent(new MouseEvent("mousemove", { clientX: box.left + 400, clientY: box.top + 10 }));
    window.dispatchEvent(new MouseEvent("mouseup", { clientX: box.left + 400, clientY: box.top + 10 }));
    const sameWidth = Math.abs((view.t1 - view.t0) - (zoomed[1] - zoomed[0])) < 1e-6 * zoomed[1];
    out.panned = view.t0 > zoomed[0] && sameWidth;
    render();
    if (rects.length) {
      rects[0].dispatchEvent(new MouseEvent("mousemove", { clientX: box.left + 300, clientY: box.top + 30,
                                                          bubbles: true }));
      out.tooltip = tip.style.display === "block" ? tip.textContent : "";
    }
    reset();
    render();
    out.reset = view.t0 === home[0] && view.t1 === home[1];
    document.getElementById("selftest").textContent = JSON.stringify(out);
  }
})();
"""
