// rlrun dashboard: reads the public API only (GET /runs, /runs/{id}, /runs/{id}/metrics,
// the /runs/{id}/events stream); draws reward curves with uPlot.
"use strict";

const CHARTS = [
  { title: "reward", keys: ["critic/score/mean", "critic/score/max", "critic/score/min"] },
  { title: "validation accuracy", keys: ["val-core/hiyouga/geometry3k/acc/mean@1", "val-core/tiny/arith/acc/mean@1"] },
  { title: "idle ratio", keys: ["fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio"] },
];
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "STOPPED", "CANCELLED", "LOST"]);
const COLORS = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"];
let current = null;   // { id, source, plots }

async function getJSON(path) {
  const resp = await fetch(path);
  if (!resp.ok) throw new Error(`${path}: ${resp.status}`);
  return resp.json();
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

async function refreshRuns() {
  const params = new URLSearchParams({ limit: "100" });
  const status = document.getElementById("status-filter").value;
  const team = document.getElementById("team-filter").value.trim();
  if (status) params.set("status", status);
  if (team) params.set("team", team);
  const page = await getJSON(`/runs?${params}`);
  const body = document.querySelector("#runs tbody");
  body.replaceChildren(...page.items.map((run) => {
    const row = el("tr");
    row.dataset.id = run.id;
    if (current && current.id === run.id) row.classList.add("selected");
    const status = el("td");
    status.append(el("span", run.status, `badge ${run.status}`));
    row.append(el("td", run.name), el("td", run.team), status,
               el("td", run.health.status, run.health.status === "ok" ? "" : "unhealthy"));
    row.addEventListener("click", () => { location.hash = `#/runs/${run.id}`; });
    return row;
  }));
}

function renderRun(run) {
  document.getElementById("run-pane").hidden = false;
  document.getElementById("run-title").textContent = `${run.name} (${run.id})`;
  const badge = document.getElementById("run-status");
  badge.textContent = run.status;
  badge.className = `badge ${run.status}`;
  document.getElementById("cancel").hidden = TERMINAL.has(run.status) || run.stop_requested;
  const health = document.getElementById("run-health");
  health.textContent = run.health.status === "ok" ? "healthy" : `${run.health.status}: ${run.health.reason}`;
  health.className = run.health.status === "ok" ? "" : "unhealthy";
  const p = run.progress || {};
  document.getElementById("run-progress").textContent =
    p.step == null ? "" : `step ${p.step}${p.total_steps ? ` of ${p.total_steps}` : ""}`;
  document.querySelector("#latest tbody").replaceChildren(
    ...Object.entries(run.metrics.latest).map(([k, v]) => {
      const row = el("tr");
      row.append(el("td", k), el("td", typeof v === "number" ? String(+v.toPrecision(6)) : String(v)));
      return row;
    }));
  document.getElementById("events").replaceChildren(
    ...run.events.map((e) => el("li", `${e.at} ${e.from_status || "—"} → ${e.to_status}: ${e.reason}`)));
  document.getElementById("command").textContent = run.entrypoint;
}

async function refreshCharts() {
  if (!current) return;
  const keys = CHARTS.flatMap((c) => c.keys).join(",");
  const data = await getJSON(`/runs/${current.id}/metrics?keys=${encodeURIComponent(keys)}&max_points=500`);
  current.series = data.series;
  drawCharts();
}

function drawCharts() {
  const holder = document.getElementById("charts");
  for (const chart of CHARTS) {
    const present = chart.keys.filter((k) => (current.series[k] || []).length);
    if (!present.length) continue;
    const steps = [...new Set(present.flatMap((k) => current.series[k].map((p) => p.step)))].sort((a, b) => a - b);
    const columns = present.map((k) => {
      // NaN and infinities arrive as strings: leave a gap in the curve.
      const byStep = new Map(current.series[k].map((p) => [p.step, typeof p.value === "number" ? p.value : null]));
      return steps.map((s) => (byStep.has(s) ? byStep.get(s) : null));
    });
    const plotData = [steps, ...columns];
    const existing = current.plots[chart.title];
    if (existing && existing.series.length === present.length + 1) {
      existing.setData(plotData);
      continue;
    }
    if (existing) existing.destroy();
    const box = el("div", undefined, "chart");
    box.dataset.chart = chart.title;
    holder.append(box);
    current.plots[chart.title] = new uPlot({
      title: chart.title, width: 420, height: 220,
      scales: { x: { time: false } },
      series: [{ label: "step" }, ...present.map((k, i) => ({ label: k, stroke: COLORS[i % COLORS.length] }))],
    }, plotData, box);
  }
}

// A metrics event carries its step and every value: it is applied in place, without re-reading
// the run. Events that come while the run is being read wait, then apply past what was read.
function applyMetrics(view, event) {
  if (view.loading) { view.waiting.push(event); return; }
  const { step, values } = event;
  for (const [key, value] of Object.entries(values)) {
    if (key in view.run.metrics.latest) view.run.metrics.latest[key] = value;
    const points = view.series[key];
    if (points && (!points.length || points[points.length - 1].step < step)) {
      points.push({ step, value, min: value, max: value });
    }
  }
  view.run.progress = view.run.progress || {};
  if (view.run.progress.step == null || step > view.run.progress.step) view.run.progress.step = step;
  view.draw = view.draw || setTimeout(() => {
    view.draw = null;
    if (current !== view) return;
    renderRun(view.run);
    drawCharts();
  }, 250);
}

async function openRun(id) {
  if (current) {
    if (current.source) current.source.close();
    Object.values(current.plots).forEach((p) => p.destroy());
  }
  document.getElementById("charts").replaceChildren();
  const view = current = { id, source: null, plots: {}, run: null, series: {}, loading: true, waiting: [] };
  const reload = async () => {
    if (current !== view) return;
    view.loading = true;
    view.run = await getJSON(`/runs/${id}`);
    renderRun(view.run);
    await refreshCharts();
    view.loading = false;
    view.waiting.splice(0).forEach((event) => applyMetrics(view, event));
  };
  // Live from now: the run is read once the stream is open, so nothing falls in between.
  const source = new EventSource(`/runs/${id}/events?since=now`);
  let pending = null;
  const schedule = () => { pending = pending || setTimeout(() => { pending = null; reload(); }, 250); };
  source.addEventListener("metrics", (e) => applyMetrics(view, JSON.parse(e.data)));
  source.addEventListener("status", schedule);
  // The run has ended and its log is read to the end: nothing more will come.
  source.addEventListener("end", () => { source.close(); schedule(); });
  view.source = source;
  await new Promise((resolve) => {
    source.addEventListener("open", resolve, { once: true });
    setTimeout(resolve, 3000);
  });
  await reload();
  refreshRuns();
}

document.getElementById("cancel").addEventListener("click", async () => {
  if (current) await fetch(`/runs/${current.id}/cancel`, { method: "POST" });
});
document.getElementById("status-filter").addEventListener("change", refreshRuns);
document.getElementById("team-filter").addEventListener("input", refreshRuns);
window.addEventListener("hashchange", route);

function route() {
  const match = location.hash.match(/^#\/runs\/(.+)$/);
  if (match) openRun(decodeURIComponent(match[1]));
}

refreshRuns();
route();
setInterval(refreshRuns, 3000);
