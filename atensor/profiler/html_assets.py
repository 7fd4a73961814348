# The script of the HTML timeline, kept apart from html.py's Python (its stylesheet: html_style.py).
#
# It lives in a Python module, not in a .js file, so that it ships with the package with no
# package-data configuration and the page stays one self-contained file: no network, no CDN, it
# opens from a mail attachment on a laptop without internet.
#
# The page draws SVG, because SVG elements are what a hover, a test (count the elements) and a
# screenshot all see directly; a canvas would be opaque to all three. What it draws depends on
# the zoom, so that the page reads at every zoom and its size does not grow with the trace:
# - a span at least MIN_PX wide is one <rect class="span">; consecutive spans of a track that are
#   each narrower, and less than a pixel apart, are merged into one <rect class="band">, whose
#   opacity is how busy the track was under it and whose tooltip counts the spans and names the
#   most frequent ones. So a track draws at most about one element per pixel of width, whether
#   the trace has a hundred spans or a million;
# - dependency arrows are drawn when few enough are on screen to be followed (READABLE_ARROWS)
#   and none ends inside a band; otherwise only the hovered or selected (clicked) span's own;
# - axis labels carry as many decimals as the tick step needs to tell two ticks apart;
# - hovering a span shows its details, clicking pins them (and its arrows) until the next click.
# Elements come from pools (a track walks only its visible spans, found by binary search), so
# wheel-zoom and drag-pan move existing elements instead of rebuilding the page.
#
# `window.atensorTimeline` lets a test or a script set the view and read what is drawn. Opening
# the page with "#selftest" makes it zoom, pan and hover by itself after loading and write what
# happened into <pre id="selftest">; the headless-browser tests read that back.
from __future__ import annotations

JS = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("profile-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const GUTTER = 180, PROCESS_H = 20, TRACK_H = 24, MEMORY_H = 40, AXIS_H = 26, PAD = 3;
  const LIGHT_KINDS = { wait: true, submit: true, await: true, task: true, call: true };
  const MIN_PX = 1;              // spans narrower than this merge into density bands
  const READABLE_ARROWS = 60;    // more on screen than this: only the focused span's arrows

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
  // A point in time to the microsecond, so two nearby starts read differently.
  const fmtAt = (ns) => (ns / 1e6).toFixed(3) + " ms";
  function fmtUnits(value, units, base) {
    let i = 0;
    while (Math.abs(value) >= base && i < units.length - 1) { value /= base; i += 1; }
    return (i === 0 ? value.toFixed(0) : value.toFixed(1)) + " " + units[i];
  }
  const fmtBytes = (b) => fmtUnits(b, ["B", "KiB", "MiB", "GiB", "TiB"], 1024);
  const fmtFlops = (f) => fmtUnits(f, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"], 1000);

  // Spans: [track, start, end, name, kind, task_id, bytes, flops, deps, critical, extra, detail]
  const spans = data.spans.map((s) => ({
    track: s[0], start: s[1], end: s[2], name: s[3], kind: s[4], task: s[5], bytes: s[6],
    flops: s[7], deps: s[8], critical: !!s[9], extra: s[10] || "", detail: s[11] || "",
  }));
  // Per track, span positions by start, and the running maximum of their ends (binary search).
  const byTrack = data.tracks.map(() => []);
  spans.forEach((s, i) => byTrack[s.track].push(i));
  const maxEnd = byTrack.map((list) => {
    list.sort((a, b) => spans[a].start - spans[b].start || a - b);
    const ends = new Float64Array(list.length);
    let best = -Infinity;
    list.forEach((i, k) => { best = Math.max(best, spans[i].end); ends[k] = best; });
    return ends;
  });
  function firstEndingAfter(track, t) {
    const ends = maxEnd[track];
    let lo = 0, hi = ends.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (ends[mid] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }
  // Task ids to spans (device spans), for naming dependencies; arrows per span.
  const byTask = new Map();
  spans.forEach((s, i) => { if (s.task !== null && !byTask.has(s.task)) byTask.set(s.task, i); });
  const neededBy = spans.map(() => []);
  spans.forEach((s, i) => { for (const d of s.deps) { const j = byTask.get(d); if (j !== undefined) neededBy[j].push(i); } });
  const edgesOf = spans.map(() => []);
  data.edges.forEach((e, k) => { edgesOf[e[0]].push(k); edgesOf[e[1]].push(k); });

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
  const bandLayer = make("g", {}, plot);
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

  // Pools: elements are reused from one drawing to the next; the unused are hidden, and dropped
  // when far more than needed, so zooming back out shrinks the page again.
  function Pool(layer, tag) { this.layer = layer; this.tag = tag; this.items = []; this.used = 0; }
  Pool.prototype.take = function () {
    if (this.used === this.items.length) this.items.push(make(this.tag, {}, this.layer));
    const node = this.items[this.used++];
    node.removeAttribute("visibility");
    return node;
  };
  Pool.prototype.finish = function () {
    const drawn = this.used;
    while (this.items.length > 2 * drawn + 64) this.layer.removeChild(this.items.pop());
    for (let k = drawn; k < this.items.length; k++) this.items[k].setAttribute("visibility", "hidden");
    this.used = 0;
    return drawn;
  };
  const spanPool = new Pool(spanLayer, "rect"), bandPool = new Pool(bandLayer, "rect");
  const labelPool = new Pool(labelLayer, "text"), depPool = new Pool(depLayer, "path");
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

  let state = new Uint8Array(spans.length);   // 0 off screen, 1 its own rect, 2 inside a band
  let bands = [];                              // {track, from, to (positions in byTrack), count, busy, start, end}
  let hovered = null, selected = null;
  let drawnArrows = 0, arrowsOnScreen = 0, arrowMode = "all";
  let tickLabels = [];
  const showDeps = document.getElementById("show-deps");
  const showCritical = document.getElementById("show-critical");

  function niceStep(span) {
    const raw = span / Math.max(2, (width - GUTTER) / 110);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  // Tick labels in one unit with as many decimals as the step needs: 1.2041 s, 1.2043 s.
  function tickFormat(step, maxAbs) {
    const units = [[1e9, " s"], [1e6, " ms"], [1e3, " us"], [1, " ns"]];
    const unit = units.find((u) => maxAbs >= u[0]) || units[3];
    const decimals = Math.max(0, Math.min(9, Math.ceil(Math.log10(unit[0] / step) - 1e-9)));
    return (t) => (t / unit[0]).toFixed(decimals) + unit[1];
  }

  function drawSpan(i, x0, x1) {
    const s = spans[i];
    const rect = spanPool.take();
    let cls = "span";
    if (s.critical && showCritical.checked) cls += " critical show";
    if (i === selected) cls += " selected";
    rect.setAttribute("class", cls);
    rect.setAttribute("data-span", i);
    rect.setAttribute("data-kind", s.kind);
    rect.setAttribute("x", x0.toFixed(2));
    rect.setAttribute("y", trackY[s.track] + PAD);
    rect.setAttribute("width", Math.max(1, x1 - x0).toFixed(2));
    rect.setAttribute("height", TRACK_H - 2 * PAD);
    rect.setAttribute("fill", data.colors[s.kind] || "#9aa3ad");
    const left = Math.max(x0, GUTTER), room = Math.min(x1, width) - left - 6;
    if (room > 24) {
      const label = labelPool.take();
      const chars = Math.floor(room / 6);
      label.textContent = s.name.length > chars ? s.name.slice(0, Math.max(1, chars - 1)) + "~" : s.name;
      label.setAttribute("class", "label" + (LIGHT_KINDS[s.kind] ? " dark" : ""));
      label.setAttribute("x", (left + 3).toFixed(2));
      label.setAttribute("y", trackY[s.track] + TRACK_H / 2 + 3.5);
    }
  }
  function drawBand(band) {
    const x0 = clampX(X(band.start)), x1 = clampX(X(band.end));
    const rect = bandPool.take();
    const kinds = {};
    let kind = null;
    for (let k = band.from; k <= band.to; k++) {
      const name = spans[byTrack[band.track][k]].kind;
      kinds[name] = (kinds[name] || 0) + 1;
      if (kind === null || kinds[name] > kinds[kind]) kind = name;
    }
    const busy = Math.min(1, band.busy / Math.max(1, band.end - band.start));
    rect.setAttribute("class", "band");
    rect.setAttribute("data-band", bands.length);
    rect.setAttribute("data-count", band.count);
    rect.setAttribute("x", x0.toFixed(2));
    rect.setAttribute("y", trackY[band.track] + PAD);
    rect.setAttribute("width", Math.max(1, x1 - x0).toFixed(2));
    rect.setAttribute("height", TRACK_H - 2 * PAD);
    rect.setAttribute("fill", data.colors[kind] || "#9aa3ad");
    rect.setAttribute("fill-opacity", (0.3 + 0.7 * busy).toFixed(2));
    bands.push(band);
  }

  function render() {
    width = Math.max(GUTTER + 200, root.clientWidth || 1000);
    scale = (width - GUTTER) / (view.t1 - view.t0);
    chart.setAttribute("width", width);
    axis.setAttribute("width", width);
    clipRect.setAttribute("width", width - GUTTER);
    for (const r of rowRects) r.setAttribute("width", width);

    state = new Uint8Array(spans.length);
    bands = [];
    const tMin = view.t0 - 1 / scale, tMax = view.t1 + 1 / scale;
    byTrack.forEach((list, track) => {
      let band = null;   // the open band: sub-pixel spans less than a pixel apart
      const close = () => {
        if (band === null) return;
        if (band.count === 1) {
          const i = list[band.from];
          state[i] = 1;
          drawSpan(i, clampX(X(spans[i].start)), clampX(X(spans[i].end)));
        } else {
          for (let k = band.from; k <= band.to; k++) state[list[k]] = 2;
          drawBand(band);
        }
        band = null;
      };
      for (let k = firstEndingAfter(track, tMin); k < list.length; k++) {
        const i = list[k], s = spans[i];
        if (s.start > tMax) break;
        const a = X(s.start), b = X(s.end);
        if (b - a >= MIN_PX) {
          close();
          state[i] = 1;
          drawSpan(i, clampX(a), clampX(b));
          continue;
        }
        if (band !== null && a <= X(band.end) + 1) {
          band.to = k; band.count += 1; band.busy += s.end - s.start; band.end = Math.max(band.end, s.end);
        } else {
          close();
          band = { track: track, from: k, to: k, count: 1, busy: s.end - s.start, start: s.start, end: s.end };
        }
      }
      close();
    });
    spanPool.finish();
    bandPool.finish();
    labelPool.finish();
    drawArrows();

    for (const device in memoryPaths) {
      const samples = data.memory[device], box = memoryY[device];
      const base = box.y + MEMORY_H - 3, top = box.y + 4;
      const yOf = (b) => (base - (box.peak ? (b / box.peak) * (base - top) : 0)).toFixed(1);
      // A step line: hold each value up to the next sample's x, then go to the new value there.
      // Samples that fall on one x make one vertical step (to the last of them), not one each.
      let y = String(base), lastX = null;
      let d = "M" + clampX(X(samples[0][0])).toFixed(1) + "," + base;
      for (const [ts, bytes] of samples) {
        const x = clampX(X(ts)).toFixed(1);
        if (x !== lastX) {
          if (lastX !== null) d += " L" + lastX + "," + y;
          d += " L" + x + "," + y;
          lastX = x;
        }
        y = yOf(bytes);
      }
      d += " L" + lastX + "," + y;
      const xEnd = clampX(X(full[1])).toFixed(1);
      d += " L" + xEnd + "," + y + " L" + xEnd + "," + base + " Z";
      memoryPaths[device].setAttribute("d", d);
    }

    while (gridLayer.firstChild) gridLayer.removeChild(gridLayer.firstChild);
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    const step = niceStep(view.t1 - view.t0);
    const first = Math.ceil(view.t0 / step);
    const format = tickFormat(step, Math.max(Math.abs(view.t0), Math.abs(view.t1)));
    tickLabels = [];
    for (let n = first; n * step <= view.t1; n++) {
      const t = n * step, x = X(t);
      if (x < GUTTER) continue;
      make("line", { x1: x, x2: x, y1: 0, y2: height }, gridLayer);
      make("line", { x1: x, x2: x, y1: AXIS_H - 7, y2: AXIS_H }, axis);
      const label = make("text", { x: x + 3, y: AXIS_H - 10, class: "tick" }, axis);
      label.textContent = format(t);
      tickLabels.push(label.textContent);
    }
    const caption = make("text", { x: 8, y: AXIS_H - 10 }, axis);
    caption.textContent = "visible: " + fmtNs(view.t1 - view.t0);
    const status = document.getElementById("status");
    status.setAttribute("data-elements", String(document.getElementsByTagName("*").length));
    status.setAttribute("data-bands", String(bands.length));
  }

  // Arrows on screen: all of them when they can be followed, else only the focused span's own.
  function drawArrows() {
    const focus = selected !== null ? selected : hovered;
    let candidates = [];
    if (showDeps.checked) {
      candidates = data.edges.filter((e) => state[e[0]] || state[e[1]] ||
        (spans[e[0]].end < view.t0) !== (spans[e[1]].start < view.t0));
    }
    arrowsOnScreen = candidates.length;
    const readable = candidates.length <= READABLE_ARROWS &&
      candidates.every((e) => state[e[0]] !== 2 && state[e[1]] !== 2);
    arrowMode = readable ? "all" : "focus";
    let shown = candidates;
    if (!readable) shown = focus !== null && showDeps.checked ? edgesOf[focus].map((k) => data.edges[k]) : [];
    for (const e of shown) {
      const from = spans[e[0]], to = spans[e[1]];
      // A wait starts before what it waits for ends: its arrow lands where it was released.
      const x1 = clampX(X(from.end)), x2 = clampX(X(Math.max(to.start, from.end)));
      const y1 = trackY[from.track] + TRACK_H / 2, y2 = trackY[to.track] + TRACK_H / 2;
      const bend = Math.max(18, Math.abs(x2 - x1) / 2);
      const path = depPool.take();
      const onFocus = focus !== null && (e[0] === focus || e[1] === focus);
      path.setAttribute("class", "dep" + (onFocus ? " focus" : from.critical && to.critical ? " critical" : ""));
      path.setAttribute("marker-end", "url(#arrow)");
      path.setAttribute("d", "M" + x1.toFixed(1) + "," + y1 + " C" + (x1 + bend).toFixed(1) + "," +
        y1 + " " + (x2 - bend).toFixed(1) + "," + y2 + " " + x2.toFixed(1) + "," + y2);
    }
    drawnArrows = depPool.finish();
    document.getElementById("notice").textContent = readable || !arrowsOnScreen ? "" :
      arrowsOnScreen + " dependency arrows at this zoom: hover or click a span for its own, zoom in for all";
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
    drag = { x: event.clientX, t0: view.t0, t1: view.t1, moved: false, target: event.target };
    chart.classList.add("dragging");
    event.preventDefault();
  });
  window.addEventListener("mousemove", (event) => {
    if (!drag) return;
    if (Math.abs(event.clientX - drag.x) > 3) drag.moved = true;
    if (!drag.moved) return;
    const shift = (event.clientX - drag.x) * (drag.t1 - drag.t0) / (width - GUTTER);
    view.t0 = drag.t0 - shift;
    view.t1 = drag.t1 - shift;
    schedule();
  });
  window.addEventListener("mouseup", (event) => {
    if (drag && !drag.moved) choose(drag.target, event.clientX, event.clientY);   // a click
    drag = null;
    chart.classList.remove("dragging");
  });
  function reset() { view.t0 = home[0]; view.t1 = home[1]; schedule(); }
  chart.addEventListener("dblclick", reset);
  document.getElementById("reset").addEventListener("click", reset);
  showDeps.addEventListener("change", schedule);
  showCritical.addEventListener("change", schedule);
  window.addEventListener("resize", schedule);
  window.addEventListener("keydown", (event) => { if (event.key === "Escape") choose(null, 0, 0); });
  window.addEventListener("mousedown", (event) => {   // a click outside the chart unpins too
    if (selected !== null && !chart.contains(event.target)) choose(null, 0, 0);
  });

  // ---- details: hover shows them, a click pins them (and the span's arrows) ----
  const tip = document.getElementById("tip");
  function spanLabel(i) {
    const s = spans[i], track = data.tracks[s.track];
    return s.name + " (" + track.process + " " + track.name + ")";
  }
  function listOf(indices) {
    const names = indices.slice(0, 6).map(spanLabel);
    return names.join(", ") + (indices.length > 6 ? ", ... " + (indices.length - 6) + " more" : "");
  }
  function spanRows(i) {
    const s = spans[i], track = data.tracks[s.track];
    const rows = [];
    rows.push([track.host ? "category" : "kind", s.kind]);
    rows.push([track.host ? "track" : "queue", track.process + " / " + track.name]);
    rows.push(["start", fmtAt(s.start)]);
    rows.push(["duration", fmtNs(s.end - s.start)]);
    if (s.task !== null) rows.push(["task", String(s.task)]);
    if (!track.host || s.bytes) rows.push(["bytes", fmtBytes(s.bytes) + (s.bytes && s.end > s.start ?
      "  (" + (s.bytes / (s.end - s.start)).toFixed(2) + " GB/s)" : "")]);
    if (!track.host || s.flops) rows.push(["flops", fmtFlops(s.flops) + (s.flops && s.end > s.start ?
      "  (" + (s.flops / (s.end - s.start)).toFixed(2) + " GFLOP/s)" : "")]);
    if (!track.host) {
      const deps = s.deps.map((d) => byTask.get(d)).filter((j) => j !== undefined);
      rows.push(["depends on", deps.length ? listOf(deps) : (s.deps.length ? s.deps.join(", ") : "nothing")]);
      if (neededBy[i].length) rows.push(["needed by", listOf(neededBy[i])]);
    }
    if (s.detail) rows.push([track.host ? "detail" : "ops", s.detail.length > 400 ? s.detail.slice(0, 400) + " ..." : s.detail]);
    if (s.critical) rows.push(["", "on the critical path"]);
    return rows;
  }
  function bandRows(band) {
    const counts = new Map();
    for (let k = band.from; k <= band.to; k++) {
      const name = spans[byTrack[band.track][k]].name;
      counts.set(name, (counts.get(name) || 0) + 1);
    }
    const top = Array.from(counts.entries()).sort((a, b) => b[1] - a[1]).slice(0, 4);
    const track = data.tracks[band.track];
    return [
      ["spans", band.count + " merged, each narrower than a pixel here"],
      [track.host ? "track" : "queue", track.process + " / " + track.name],
      ["from", fmtAt(band.start) + " to " + fmtAt(band.end)],
      ["busy", fmtNs(band.busy) + " of " + fmtNs(band.end - band.start) + " (" +
        Math.round(100 * Math.min(1, band.busy / Math.max(1, band.end - band.start))) + "%)"],
      ["most", top.map((e) => e[1] + " x " + e[0]).join(", ")],
    ];
  }
  function showTip(title, rows, clientX, clientY, hint) {
    tip.textContent = "";
    const head = document.createElement("div");
    head.className = "name";
    head.textContent = title;
    tip.appendChild(head);
    const table = document.createElement("table");
    for (const [k, v] of rows) {
      const tr = table.insertRow();
      tr.insertCell().textContent = k;
      tr.insertCell().textContent = v;
    }
    tip.appendChild(table);
    if (hint) {
      const line = document.createElement("div");
      line.className = "hint";
      line.textContent = hint;
      tip.appendChild(line);
    }
    tip.style.display = "block";
    const w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(clientX + 14, window.innerWidth - w - 4)) + "px";
    tip.style.top = Math.max(4, clientY + 16 + h > window.innerHeight ? clientY - h - 10 : clientY + 16) + "px";
  }
  function targetOf(node) {
    if (!node || !node.getAttribute) return null;
    const span = node.getAttribute("data-span");
    if (span !== null) return { span: Number(span) };
    const band = node.getAttribute("data-band");
    if (band !== null) return { band: Number(band) };
    return null;
  }
  function describe(target, clientX, clientY, pinned) {
    if (target.span !== undefined) {
      showTip(spans[target.span].name, spanRows(target.span), clientX, clientY,
        pinned ? "pinned: click elsewhere or press Escape to close" : "click to pin");
    } else {
      showTip("density band", bandRows(bands[target.band]), clientX, clientY, "zoom in to see each span");
    }
  }
  function choose(node, clientX, clientY) {
    const target = targetOf(node);
    selected = target && target.span !== undefined ? target.span : null;
    tip.classList.toggle("pinned", selected !== null);
    if (selected !== null) describe(target, clientX, clientY, true);
    else tip.style.display = "none";
    render();
  }
  chart.addEventListener("mousemove", (event) => {
    if (drag && drag.moved) { tip.style.display = "none"; return; }
    const target = targetOf(event.target);
    const now = target && target.span !== undefined ? target.span : null;
    if (selected === null) {
      if (target) describe(target, event.clientX, event.clientY, false);
      else tip.style.display = "none";
    }
    if (now !== hovered) {
      hovered = now;
      if (arrowMode === "focus" && selected === null) drawArrows();
    }
  });
  chart.addEventListener("mouseleave", () => {
    hovered = null;
    if (selected === null) { tip.style.display = "none"; if (arrowMode === "focus") drawArrows(); }
  });

  const started = performance.now();
  render();
  const status = document.getElementById("status");
  status.setAttribute("data-rendered", String(spans.length));
  status.setAttribute("data-render-ms", (performance.now() - started).toFixed(0));

  // For tests and scripts: set the view, read what is drawn.
  window.atensorTimeline = {
    setView(t0, t1) { view.t0 = t0; view.t1 = t1; render(); },
    getView() { return [view.t0, view.t1]; },
    home: home.slice(),
    drawn() {
      return { spans: spanPool.items.filter((n) => n.getAttribute("visibility") !== "hidden").length,
               bands: bands.length, bandCounts: bands.map((b) => b.count), arrows: drawnArrows,
               arrowsOnScreen: arrowsOnScreen, arrowMode: arrowMode, ticks: tickLabels.slice(),
               elements: document.getElementsByTagName("*").length, selected: selected };
    },
  };

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
    reset();
    render();
    const first = spanPool.items.find((n) => n.getAttribute("visibility") !== "hidden");
    if (first) {
      first.dispatchEvent(new MouseEvent("mousemove", { clientX: box.left + 300, clientY: box.top + 30,
                                                       bubbles: true }));
      out.tooltip = tip.style.display === "block" ? tip.textContent : "";
      out.tooltipSpan = Number(first.getAttribute("data-span"));
    }
    out.reset = view.t0 === home[0] && view.t1 === home[1];
    document.getElementById("selftest").textContent = JSON.stringify(out);
  }
})();
"""
