// Building blocks of the views: DOM from text only (never HTML), formatting, charts (uPlot),
// sparklines (SVG) and ANSI colour codes rendered as styled spans.

const SVG = "http://www.w3.org/2000/svg";
export const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

// h("td", {class: "x", dataset: {id}}, "text", node, ...): children are text or nodes.
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const link = (href, text, cls) => h("a", { href, class: cls }, text);
export const badge = (status) => h("span", { class: `badge ${status}` }, status);

export function healthText(health) {
  return h("span", { class: health.status === "ok" ? "healthy" : "unhealthy", title: health.reason || "" },
    health.status === "ok" ? "ok" : health.status);
}

export function num(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "number" ? String(+value.toPrecision(4)) : String(value);
}

// A difference, signed: "+0.05", "-3".
export const signed = (value) => `${value < 0 ? "-" : "+"}${num(Math.abs(value))}`;

// What a run is compared on against its team's and recipe's baseline, and the short names
// ``rlrun list`` gives them.
const VERSUS = [["reward", "reward"], ["response_length", "len"], ["step_time", "s/step"]];

// A run against its baseline (its ``baseline`` field, read with ?baseline=true): "baseline"
// for the baseline itself, else its differences at the same step, each explained on hover.
export function versus(b) {
  if (!b) return "";
  if (b.is_baseline) return h("span", { class: "baseline-mark" }, "baseline");
  const known = VERSUS.filter(([key]) => b[key]);
  const told = known.map(([key]) => `${key.replace("_", " ")} ${num(b[key].value)} at step ${b[key].step}, the baseline's ${num(b[key].baseline_value)} at step ${b[key].baseline_step}`);
  return h("span", { class: "versus", title: told.join("\n") || `no step in common with ${b.run_id}` },
    known.map(([key, short]) => `${short} ${signed(b[key].difference)}`).join(", ") || "no common step");
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor(seconds % 3600 / 60)}m`;
  return `${Math.floor(seconds / 86400)}d ${Math.floor(seconds % 86400 / 3600)}h`;
}

export const since = (iso, until) =>
  duration(((until ? Date.parse(until) : Date.now()) - Date.parse(iso)) / 1000);

export function progressCell(progress) {
  if (progress.step === null || progress.step === undefined) return "";
  const total = progress.total_steps;
  const bar = h("progress", { max: total || 1, value: total ? progress.step : 0 });
  return h("span", { class: "progress" }, bar, total ? ` ${progress.step}/${total}` : ` ${progress.step}`);
}

export function sparkline(values, width = 80, height = 18) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const finite = values.filter((v) => typeof v === "number" && isFinite(v));
  if (finite.length < 2) return svg;
  const lo = Math.min(...finite), hi = Math.max(...finite), span = hi - lo || 1;
  const points = finite.map((v, i) =>
    `${(i / (finite.length - 1) * (width - 2) + 1).toFixed(1)},${(height - 1 - (v - lo) / span * (height - 2)).toFixed(1)}`);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

// Series values as numbers; NaN and the infinities arrive as strings and become gaps.
export const numeric = (v) => (typeof v === "number" ? v : null);

// Aligns several [{step, value}] lists by step: [steps, column per list].
export function align(lists, pick = (p) => p.value) {
  const steps = [...new Set(lists.flatMap((l) => l.map((p) => p.step)))].sort((a, b) => a - b);
  const columns = lists.map((list) => {
    const byStep = new Map(list.map((p) => [p.step, numeric(pick(p))]));
    return steps.map((s) => (byStep.has(s) ? byStep.get(s) : null));
  });
  return [steps, ...columns];
}

// Steps are whole numbers: the x axis ticks only at whole steps (1, 2, 5, 10, 20, 50, ...).
const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];

// A constant gets a range around itself: 0 to twice it (a constant 0 is drawn on 0..1, not
// 0..100; a constant 0.01 on 0..0.02).
function valueRange(u, min, max) {
  if (min === null || max === null || !isFinite(min) || !isFinite(max)) return [0, 1];
  if (min === max) return min > 0 ? [0, 2 * min] : min < 0 ? [2 * min, 0] : [0, 1];
  return uPlot.rangeNum(min, max, 0.1, true);
}

// A chart that keeps its uPlot instance while its series stay the same (live updates). Both
// axes are titled: "step" and the chart's quantity (``yLabel``); ``perRow`` charts share a row.
export class Chart {
  constructor(holder, title, { yLabel = "", perRow = 2 } = {}) {
    this.title = title;
    this.yLabel = yLabel;
    this.perRow = perRow;
    this.box = h("div", { class: "chart", dataset: { chart: title, xLabel: "step", yLabel } });
    this.box.chart = this;  // for a reader of the page (and its tests)
    holder.append(this.box);
    this.plot = null;
    this.signature = "";
    this.markers = [];
  }

  // Vertical marks at these steps ([{step, label}]): where each later attempt of a run began.
  mark(markers) {
    this.markers = markers;
    this.box.dataset.markers = markers.map((m) => `${m.label}@${m.step}`).join(",");
    if (this.plot) this.plot.redraw(false, false);
  }

  // series: [{label, stroke, fill?, dash?, width?}], data: [steps, ...columns], bands: uPlot bands
  draw(series, data, bands = []) {
    // What is drawn, for a reader of the page (and its tests): steps and series.
    this.box.dataset.points = String(data[0].length);
    this.box.dataset.series = String(series.length);
    const signature = JSON.stringify([series.map((s) => s.label), bands]);
    if (this.plot && signature === this.signature) {
      this.plot.setData(data);
      return;
    }
    this.destroy();
    this.signature = signature;
    const room = this.box.parentElement.clientWidth;
    const width = Math.max(320, Math.floor((room - (this.perRow - 1) * 16) / this.perRow) - 2);
    this.plot = new uPlot({
      title: this.title, width, height: 240,
      scales: { x: { time: false }, y: { range: valueRange } },
      axes: [
        { label: "step", incrs: STEP_INCRS, values: (u, splits) => {
          this.box.dataset.xTicks = splits.join(",");
          return splits.map(String);
        } },
        { label: this.yLabel, size: 60 },
      ],
      legend: { live: true },
      series: [{ label: "step" }, ...series.map((s) => ({ spanGaps: true, width: 1.5, points: { show: false }, ...s }))],
      bands,
      hooks: { draw: [(u) => drawMarkers(u, this.markers)] },
    }, data, this.box);
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}

function drawMarkers(u, markers) {
  const { ctx, bbox } = u;
  ctx.save();
  ctx.strokeStyle = "#888";
  ctx.fillStyle = "#555";
  ctx.setLineDash([4, 4]);
  ctx.font = `${Math.round(11 * devicePixelRatio)}px sans-serif`;
  // uPlot leaves its axes' text alignment on the context: the label sets its own, beside the
  // line (right of it, or left where it would leave the plot), never across it.
  ctx.textBaseline = "alphabetic";
  const gap = 4 * devicePixelRatio;
  for (const { step, label } of markers) {
    const x = Math.round(u.valToPos(step, "x", true));
    if (x < bbox.left || x > bbox.left + bbox.width) continue;
    ctx.beginPath();
    ctx.moveTo(x, bbox.top);
    ctx.lineTo(x, bbox.top + bbox.height);
    ctx.stroke();
    const left = x + gap + ctx.measureText(label).width > bbox.left + bbox.width;
    ctx.textAlign = left ? "right" : "left";
    ctx.fillText(label, left ? x - gap : x + gap, bbox.top + 12 * devicePixelRatio);
  }
  ctx.restore();
}

// A date and time (local), for any shown timestamp.
export function when(iso) {
  if (!iso) return "";
  return new Date(iso).toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
}

// The "nothing yet" line shown instead of an empty table, chart area or log.
export const empty = (text) => h("p", { class: "empty" }, text);

// A table whose body says `empty` while it has no rows: ``fill(rows)`` replaces its rows.
export function table(id, heads, empty) {
  const body = h("tbody");
  const node = h("table", { id }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), body);
  const fill = (rows) => body.replaceChildren(...(rows.length ? rows
    : [h("tr", { class: "empty" }, h("td", { colspan: heads.length, class: "dim" }, empty))]));
  return { node, fill };
}

// ANSI SGR colour codes -> spans with classes; every other escape sequence is dropped.
const ANSI = /\x1b\[([0-9;]*)m|\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])/g;

export function ansiSpans(text, state = { classes: [] }) {
  const out = [];
  let at = 0;
  const flush = (end) => {
    if (end <= at) return;
    const piece = text.slice(at, end);
    out.push(state.classes.length ? h("span", { class: state.classes.join(" ") }, piece) : document.createTextNode(piece));
  };
  for (const match of text.matchAll(ANSI)) {
    flush(match.index);
    at = match.index + match[0].length;
    if (match[1] === undefined) continue;
    for (const code of (match[1] || "0").split(";").map(Number)) {
      if (code === 0) state.classes = [];
      else if (code === 1) state.classes.push("ansi-bold");
      else if ((code >= 30 && code <= 37) || (code >= 90 && code <= 97)) {
        state.classes = state.classes.filter((c) => !c.startsWith("ansi-fg")).concat(`ansi-fg${code}`);
      } else if (code === 39) state.classes = state.classes.filter((c) => !c.startsWith("ansi-fg"));
    }
  }
  flush(text.length);
  return out;
}

// Dotted path -> value for every leaf of a JSON value (arrays indexed like field paths).
export function flatten(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !(Array.isArray(value) && value.length === 0)) {
    for (const [k, v] of Object.entries(value)) {
      const path = Array.isArray(value) ? `${prefix}[${k}]` : prefix ? `${prefix}.${k}` : k;
      flatten(v, path, out);
    }
  } else {
    out[prefix] = value;
  }
  return out;
}
