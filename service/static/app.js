// rlrun dashboard: reads the public API only (GET /runs, /runs/{id}, /runs/{id}/metrics,
// the /runs/{id}/events stream); draws reward curves with uPlot. With auth on it signs in with an
// API token kept in this tab's sessionStorage and sent as a bearer header (never a cookie), so
// the event stream is read with fetch rather than EventSource (which cannot send headers).
"use strict";

const CHARTS = [
  { title: "reward", keys: ["critic/score/mean", "critic/score/max", "critic/score/min"] },
  { title: "validation accuracy", keys: ["val-core/hiyouga/geometry3k/acc/mean@1", "val-core/tiny/arith/acc/mean@1"] },
  { title: "idle ratio", keys: ["fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio"] },
];
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "STOPPED", "CANCELLED", "LOST"]);
const COLORS = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"];
let current = null;   // { id, source, plots }

const TOKEN_KEY = "rlrun-token";

function authFetch(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { ...(options.headers || {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  return fetch(path, { ...options, headers }).then((resp) => {
    if (resp.status === 401) showSignIn();
    return resp;
  });
}

async function getJSON(path) {
  const resp = await authFetch(path);
  if (!resp.ok) throw new Error(`${path}: ${resp.status}`);
  return resp.json();
}

function showSignIn() {
  document.getElementById("signin").hidden = false;
}

document.getElementById("signin").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  document.getElementById("signin").hidden = true;
  refreshRuns();
  route();
});

// Server-Sent Events over fetch: calls onEvent(name) per event until the stream ends or
// `signal` aborts; reconnects with Last-Event-ID while the run may still send more.
async function streamEvents(path, onEvent, signal) {
  let lastId = null;
  while (!signal.aborted) {
    const headers = lastId ? { "Last-Event-ID": lastId } : {};
    let ended = false;
    try {
      const resp = await authFetch(path, { headers, signal });
      if (!resp.ok || !resp.body) return;
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let name = "message";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("id: ")) lastId = line.slice(4);
          }
          onEvent(name);
          if (name === "end") ended = true;
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    if (ended) return;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
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
  const holder = document.getElementById("charts");
  for (const chart of CHARTS) {
    const present = chart.keys.filter((k) => (data.series[k] || []).length);
    if (!present.length) continue;
    const steps = [...new Set(present.flatMap((k) => data.series[k].map((p) => p.step)))].sort((a, b) => a - b);
    const columns = present.map((k) => {
      // NaN and infinities arrive as strings: leave a gap in the curve.
      const byStep = new Map(data.series[k].map((p) => [p.step, typeof p.value === "number" ? p.value : null]));
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

async function openRun(id) {
  if (current) {
    if (current.source) current.source.abort();
    Object.values(current.plots).forEach((p) => p.destroy());
  }
  document.getElementById("charts").replaceChildren();
  current = { id, source: null, plots: {} };
  const reload = async () => {
    if (!current || current.id !== id) return;
    renderRun(await getJSON(`/runs/${id}`));
    await refreshCharts();
  };
  await reload();
  // Live: every status or metrics event re-reads the run (cheap, and never out of order); after
  // "end" (the run has ended and its log is read to the end) nothing more will come.
  const source = new AbortController();
  let pending = null;
  const schedule = () => { pending = pending || setTimeout(() => { pending = null; reload(); }, 250); };
  streamEvents(`/runs/${encodeURIComponent(id)}/events`, schedule, source.signal);
  current.source = source;
  refreshRuns();
}

document.getElementById("cancel").addEventListener("click", async () => {
  if (current) await authFetch(`/runs/${current.id}/cancel`, { method: "POST" });
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
