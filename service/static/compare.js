// #/compare?runs=A,B[&keys=k1,k2]: metrics of several runs overlaid by step, spec differences.
import { every, getJSON } from "./api.js";
import { config } from "./config.js";
import { COLORS, Chart, align, badge, empty, flatten, h, link } from "./ui.js";

const DEFAULT_KEYS = [config.reward_key];

export function compareView(root, params, signal) {
  const ids = (params.get("runs") || "").split(",").filter(Boolean);
  const keys = (params.get("keys") || "").split(",").filter(Boolean);
  if (!keys.length) keys.push(...DEFAULT_KEYS);
  const picker = h("select", { id: "compare-key", "aria-label": "add a metric" }, h("option", { value: "" }, "add a metric…"));
  const legend = h("ul", { id: "compare-runs", class: "legend" });
  const charts = h("div", { id: "charts" });
  const head = h("tr", {}, h("th", {}, "field"), ids.map((id, i) => h("th", { style: `color:${COLORS[i % COLORS.length]}`, title: id }, id)));
  const diff = h("tbody");
  // Charts take the whole width, one per row; the spec differences follow, headed by run names.
  root.append(
    h("h2", {}, `Compare ${ids.length} runs`),
    legend,
    h("div", { class: "toolbar" }, picker),
    charts,
    h("section", {}, h("h3", {}, "Spec differences"), h("table", { id: "spec-diff" }, h("thead", {}, head), diff)),
  );
  picker.addEventListener("change", () => {
    if (!picker.value) return;
    const next = new URLSearchParams(params);
    next.set("keys", [...keys, picker.value].join(","));
    location.hash = `#/compare?${next}`;
  });
  const plots = new Map();
  signal.addEventListener("abort", () => plots.forEach((c) => c.destroy()));
  let runs = [];

  every(5000, async () => {
    runs = await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}`, signal)));
    legend.replaceChildren(...runs.map((r, i) => h("li", {},
      h("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }), " ",
      link(`#/runs/${encodeURIComponent(r.id)}`, r.name), " ", h("span", { class: "mono" }, r.id), " ", badge(r.status))));
    const allKeys = new Set((await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}/metrics/keys`, signal)))).flat());
    picker.replaceChildren(h("option", { value: "" }, "add a metric…"), ...[...allKeys].sort().filter((k) => !keys.includes(k)).map((k) => h("option", { value: k }, k)));
    const query = `keys=${encodeURIComponent(keys.join(","))}&max_points=500`;
    const series = await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}/metrics?${query}`, signal)));
    head.replaceChildren(h("th", {}, "field"), ...runs.map((r, i) => h("th", { style: `color:${COLORS[i % COLORS.length]}`, title: r.id }, r.name)));
    const drawn = keys.filter((k) => series.some((s) => (s.series[k] || []).length));
    if (!drawn.length) {
      plots.forEach((c) => c.destroy());
      plots.clear();
      charts.replaceChildren(empty("No points yet for these metrics: the charts appear with the runs' first steps."));
    } else if (!plots.size) charts.replaceChildren();
    for (const key of drawn) {
      if (!plots.has(key)) plots.set(key, new Chart(charts, key, { yLabel: key.split("/").slice(-2).join("/"), perRow: 1 }));
      plots.get(key).draw(
        runs.map((r, i) => ({ label: r.name, stroke: COLORS[i % COLORS.length] })),
        align(series.map((s) => s.series[key] || [])));
    }
    renderDiff(diff, runs);
  }, signal);
}

function renderDiff(body, runs) {
  const flat = runs.map((r) => flatten(r.spec));
  const fields = [...new Set(flat.flatMap(Object.keys))].sort();
  const shown = (v) => (v === undefined ? "—" : JSON.stringify(v));
  const rows = fields.filter((f) => new Set(flat.map((s) => shown(s[f]))).size > 1)
    .map((f) => h("tr", { dataset: { field: f } }, h("td", {}, h("code", {}, f)), flat.map((s) => h("td", {}, shown(s[f])))));
  body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: runs.length + 1 }, "the specs are the same"))]));
}
