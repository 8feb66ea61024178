// A small SVG charting module, ours: a line chart (linear or log y, several series), a heatmap and a timeline
// (Gantt) of bars in lanes. Each returns an <svg> with role="img" and an aria-label; every point, cell and bar
// carries a <title> the browser shows on hover. Colours come from style.css classes, except heatmap fills.

import {svg} from "./dom.js";

const MARGIN = {top: 14, right: 18, bottom: 42, left: 74};
const MAX_MARKERS = 600; // above this many points a marker per point costs more than it shows

/** About `count` round tick values (1, 2 or 5 times a power of ten) covering [lo, hi]. */
function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** Ticks of a log axis: 1, 2 and 5 times each power of ten inside [lo, hi] (plain ticks when that gives < 3). */
function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * 10 ** e;
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(Number(v.toPrecision(12)));
    }
  }
  return out.length >= 3 ? out : ticks(lo, hi);
}

function scale(lo, hi, from, to, log = false) {
  const f = log ? Math.log10 : (v) => v;
  const a = f(lo), b = f(hi);
  return (v) => (b === a ? (from + to) / 2 : from + ((f(v) - a) / (b - a)) * (to - from));
}

function frame(width, height, label) {
  return svg("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label,
    preserveAspectRatio: "xMidYMid meet"});
}

function axes(root, {x, y, xTicks, yTicks, xFormat, yFormat, width, height, xLabel, yLabel}) {
  const grid = svg("g", {class: "grid"});
  const bottom = height - MARGIN.bottom;
  for (const t of yTicks) {
    grid.append(svg("line", {x1: MARGIN.left, x2: width - MARGIN.right, y1: y(t), y2: y(t)}));
    grid.append(svg("text", {x: MARGIN.left - 6, y: y(t), class: "tick y"}, yFormat(t)));
  }
  for (const t of xTicks) {
    grid.append(svg("line", {x1: x(t), x2: x(t), y1: MARGIN.top, y2: bottom, class: "vertical"}));
    grid.append(svg("text", {x: x(t), y: bottom + 16, class: "tick x"}, xFormat(t)));
  }
  grid.append(svg("line", {x1: MARGIN.left, x2: width - MARGIN.right, y1: bottom, y2: bottom, class: "axis"}));
  root.append(grid);
  if (xLabel) root.append(svg("text", {x: (MARGIN.left + width - MARGIN.right) / 2, y: height - 6, class: "label"},
    xLabel));
  if (yLabel) root.append(svg("text", {x: 14, y: (MARGIN.top + bottom) / 2, class: "label",
    transform: `rotate(-90 14 ${(MARGIN.top + bottom) / 2})`}, yLabel));
}

function emptyChart(width, height, label, text) {
  const root = frame(width, height, label);
  root.dataset.points = "0";
  root.append(svg("text", {x: width / 2, y: height / 2, class: "empty"}, text));
  return root;
}

/**
 * series: [{name, points: [[x, y], ...], className}]; y may be null (skipped). Options: label (aria), xLabel,
 * yLabel, xFormat, yFormat, log (log y axis), step (a staircase: a best-so-far curve holds until it improves).
 */
export function lineChart(series, {label, xLabel, yLabel, xFormat = String, yFormat = String, log = false,
  step = false, width = 760, height = 300, empty = "No points yet."} = {}) {
  const clean = series.map((s) => ({...s, points: s.points.filter(([px, py]) => Number.isFinite(px) &&
    Number.isFinite(py) && (!log || py > 0))}));
  const all = clean.flatMap((s) => s.points);
  if (!all.length) return emptyChart(width, height, label, empty);
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = log ? [y0 / 1.5, y1 * 1.5] : [y0 * 0.9, y1 * 1.1 || 1];
  let yTicks;
  if (log) {
    [y0, y1] = [y0 / 1.08, y1 * 1.08];
    yTicks = logTicks(y0, y1);
  } else {
    const t = ticks(y0, y1);
    const stepY = t.length > 1 ? t[1] - t[0] : (y1 - y0) / 4;
    [y0, y1] = [Math.max(0, Math.floor(y0 / stepY) * stepY), Math.ceil(y1 / stepY) * stepY];
    yTicks = ticks(y0, y1);
  }
  const x = scale(x0, x1, MARGIN.left, width - MARGIN.right);
  const y = scale(y0, y1, height - MARGIN.bottom, MARGIN.top, log);
  const root = frame(width, height, label);
  root.dataset.points = String(all.length);
  axes(root, {x, y, xTicks: ticks(x0, x1, 6), yTicks, xFormat, yFormat, width, height, xLabel, yLabel});
  clean.forEach((s, i) => {
    if (!s.points.length) return;
    const sorted = [...s.points].sort((a, b) => a[0] - b[0]);
    let d = `M${x(sorted[0][0]).toFixed(1)},${y(sorted[0][1]).toFixed(1)}`;
    for (const [px, py] of sorted.slice(1)) {
      const to = `${x(px).toFixed(1)},${y(py).toFixed(1)}`;
      d += step ? `H${x(px).toFixed(1)}V${y(py).toFixed(1)}` : `L${to}`;
    }
    const group = svg("g", {class: `series ${s.className || `series-${i}`}`, "data-series": s.name});
    group.append(svg("path", {d, class: "line"}));
    if (all.length <= MAX_MARKERS) {
      for (const [px, py] of sorted) {
        group.append(svg("circle", {cx: x(px).toFixed(1), cy: y(py).toFixed(1), r: 2.6, class: "marker"},
          svg("title", {}, `${s.name}: ${yFormat(py)} at ${xFormat(px)}`)));
      }
    }
    root.append(group);
  });
  if (clean.length > 1) {
    const legend = svg("g", {class: "legend"});
    clean.forEach((s, i) => {
      const lx = MARGIN.left + 10 + i * 170;
      legend.append(svg("rect", {x: lx, y: MARGIN.top + 2, width: 12, height: 4,
        class: `swatch ${s.className || `series-${i}`}`}));
      legend.append(svg("text", {x: lx + 18, y: MARGIN.top + 7}, s.name));
    });
    root.append(legend);
  }
  return root;
}

const LABEL_CHARS = 28; // a longer row label is cut (whole in its <title>) so it stays inside the chart

function clip(text, chars) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

/** White to green by `fraction` in [0, 1] (no data: grey). */
function heatColour(fraction) {
  if (fraction === null || fraction === undefined) return "#e5e7eb";
  const mix = (a, b) => Math.round(a + (b - a) * fraction);
  return `rgb(${mix(254, 22)}, ${mix(242, 163)}, ${mix(199, 74)})`;
}

/**
 * rows: [{label, href, title}], columns: [{label, sublabel}], cell(rowIndex, columnIndex) -> {fraction, text, title}.
 */
export function heatmap(rows, columns, cell, {label, cellWidth = 160, cellHeight = 34, labelWidth = 200} = {}) {
  const top = 48;
  const width = labelWidth + columns.length * cellWidth + 10, height = top + rows.length * cellHeight + 8;
  const root = frame(width, height, label);
  root.classList.add("heatmap");
  root.setAttribute("width", width); // a heatmap keeps its cell size: wide ones scroll instead of shrinking
  columns.forEach((c, j) => {
    const cx = labelWidth + j * cellWidth + cellWidth / 2;
    root.append(svg("text", {x: cx, y: 18, class: "column"}, c.label));
    if (c.sublabel) root.append(svg("text", {x: cx, y: 34, class: "column sub"}, c.sublabel));
  });
  rows.forEach((r, i) => {
    const cy = top + i * cellHeight;
    const text = svg("text", {x: labelWidth - 8, y: cy + cellHeight / 2, class: "row"}, clip(r.label, LABEL_CHARS),
      svg("title", {}, r.title || r.label));
    root.append(r.href ? svg("a", {href: r.href}, text) : text);
    columns.forEach((_, j) => {
      const {fraction, text: value, title} = cell(i, j);
      const g = svg("g", {class: "cell"});
      g.append(svg("rect", {x: labelWidth + j * cellWidth + 2, y: cy + 2, width: cellWidth - 4, height: cellHeight - 4,
        rx: 3, fill: heatColour(fraction)}));
      g.append(svg("text", {x: labelWidth + j * cellWidth + cellWidth / 2, y: cy + cellHeight / 2}, value));
      g.append(svg("title", {}, title));
      root.append(g);
    });
  });
  return root;
}

/**
 * A Gantt chart: lanes (one per worker) of bars, each {lane, queued, start, end, state, title} in seconds on one
 * clock; the queued-to-start wait is drawn faint before the bar.
 */
export function timeline(lanes, bars, {label, xFormat = String, states = [], width = 980, laneHeight = 22,
  labelWidth = 200, empty = "No batches yet."} = {}) {
  if (!bars.length) return emptyChart(width, 80, label, empty);
  const top = 24, bottom = 30;
  const height = top + lanes.length * laneHeight + bottom;
  const t0 = Math.min(...bars.map((b) => b.queued ?? b.start));
  const t1 = Math.max(...bars.map((b) => b.end));
  const x = scale(t0, t1 > t0 ? t1 : t0 + 1, labelWidth, width - MARGIN.right);
  const root = frame(width, height, label);
  root.classList.add("timeline");
  root.dataset.bars = String(bars.length);
  const grid = svg("g", {class: "grid"});
  for (const t of ticks(0, Math.max(t1 - t0, 1), 8)) {
    grid.append(svg("line", {x1: x(t0 + t), x2: x(t0 + t), y1: top, y2: height - bottom, class: "vertical"}));
    grid.append(svg("text", {x: x(t0 + t), y: height - bottom + 16, class: "tick x"}, xFormat(t)));
  }
  root.append(grid);
  lanes.forEach((name, i) => {
    root.append(svg("text", {x: labelWidth - 8, y: top + i * laneHeight + laneHeight / 2, class: "row"},
      clip(name, LABEL_CHARS), svg("title", {}, name)));
  });
  const laneIndex = new Map(lanes.map((name, i) => [name, i]));
  const group = svg("g", {class: "bars"});
  for (const b of bars) {
    const ly = top + laneIndex.get(b.lane) * laneHeight + 3;
    const bar = svg("g", {class: `bar state-${b.state}`});
    if (b.queued !== null && b.queued !== undefined && b.queued < b.start) {
      bar.append(svg("rect", {x: x(b.queued), y: ly + 5, width: Math.max(0.5, x(b.start) - x(b.queued)),
        height: laneHeight - 16, class: "wait"}));
    }
    bar.append(svg("rect", {x: x(b.start), y: ly, width: Math.max(1, x(b.end) - x(b.start)), height: laneHeight - 6,
      class: "run"}));
    bar.append(svg("title", {}, b.title));
    group.append(bar);
  }
  root.append(group);
  const legend = svg("g", {class: "legend"});
  states.forEach((state, i) => {
    const lx = labelWidth + i * 110;
    legend.append(svg("rect", {x: lx, y: 6, width: 12, height: 10, class: `swatch state-${state}`}));
    legend.append(svg("text", {x: lx + 17, y: 15}, state));
  });
  root.append(legend);
  return root;
}
