// #/compare?runs=A,B[&keys=k1,k2][&baseline=A|none]: metrics of several runs overlaid by step,
// spec differences. With a baseline (the runs' pinned one unless another is chosen here, or
// none), every other run is drawn as its difference from it at the same step: its value less
// the baseline's newest value at or before that step, as GET /runs?baseline=true takes it.
import { every, getJSON } from "./api.js";
import { config } from "./config.js";
import { COLORS, Chart, align, badge, empty, flatten, h, link, numeric, signed } from "./ui.js";

const DEFAULT_KEYS = [config.reward_key];
const COMPARED = Object.entries(config.baseline_keys);  // [[name, metric key], ...]

export function compareView(root, params, signal) {
  const ids = (params.get("runs") || "").split(",").filter(Boolean);
  const keys = (params.get("keys") || "").split(",").filter(Boolean);
  if (!keys.length) keys.push(...DEFAULT_KEYS);
  const picker = h("select", { id: "compare-key", "aria-label": "add a metric" }, h("option", { value: "" }, "add a metric…"));
  const chooser = h("select", { id: "compare-baseline", "aria-label": "baseline" });
  const legend = h("ul", { id: "compare-runs", class: "legend" });
  const charts = h("div", { id: "charts" });
  const head = h("tr", {}, h("th", {}, "field"), ids.map((id, i) => h("th", { style: `color:${COLORS[i % COLORS.length]}`, title: id }, id)));
  const diff = h("tbody");
  const versusHead = h("tr");
  const versusBody = h("tbody");
  const versusSection = h("section", { id: "baseline-section", hidden: true },
    h("h3", {}, "Against the baseline, at each run's newest step"),
    h("table", { id: "baseline-diff" }, h("thead", {}, versusHead), versusBody));
  // Charts take the whole width, one per row; the spec differences follow, headed by run names.
  root.append(
    h("h2", {}, `Compare ${ids.length} runs`),
    legend,
    h("div", { class: "toolbar" }, picker, h("label", {}, "baseline ", chooser)),
    versusSection,
    charts,
    h("section", {}, h("h3", {}, "Spec differences"), h("table", { id: "spec-diff" }, h("thead", {}, head), diff)),
  );
  const go = (changes) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) next.set(k, v);
    location.hash = `#/compare?${next}`;
  };
  picker.addEventListener("change", () => { if (picker.value) go({ keys: [...keys, picker.value].join(",") }); });
  // A pinned baseline not among the runs joins them when chosen.
  chooser.addEventListener("change", () => go(ids.includes(chooser.value) || chooser.value === "none"
    ? { baseline: chooser.value } : { baseline: chooser.value, runs: [...ids, chooser.value].join(",") }));
  const plots = new Map();
  signal.addEventListener("abort", () => plots.forEach((c) => c.destroy()));

  every(5000, async () => {
    const runs = await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}?baseline=true`, signal)));
    const pinned = new Set(runs.filter((r) => r.baseline).map((r) => r.baseline.run_id));
    const asked = params.get("baseline");
    const base = asked === "none" ? null : ids.includes(asked) ? asked : asked ? null : ids.find((id) => pinned.has(id)) || null;
    chooser.replaceChildren(h("option", { value: "none" }, "none"),
      ...runs.map((r) => h("option", { value: r.id }, `${r.name}${pinned.has(r.id) ? " (pinned)" : ""}`)),
      ...[...pinned].filter((id) => !ids.includes(id)).map((id) => h("option", { value: id }, `${id} (pinned, not shown)`)));
    chooser.value = base || "none";
    legend.replaceChildren(...runs.map((r, i) => h("li", { dataset: { id: r.id } },
      h("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }), " ",
      link(`#/runs/${encodeURIComponent(r.id)}`, r.name), " ", h("span", { class: "mono" }, r.id), " ", badge(r.status),
      r.id === base ? [" ", h("span", { class: "baseline-mark" }, "baseline")] : "")));
    const allKeys = new Set((await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}/metrics/keys`, signal)))).flat());
    picker.replaceChildren(h("option", { value: "" }, "add a metric…"), ...[...allKeys].sort().filter((k) => !keys.includes(k)).map((k) => h("option", { value: k }, k)));
    const read = base ? [...new Set([...keys, ...COMPARED.map(([, k]) => k)])] : keys;
    const query = `keys=${encodeURIComponent(read.join(","))}&max_points=500`;
    const series = await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}/metrics?${query}`, signal)));
    head.replaceChildren(h("th", {}, "field"), ...runs.map((r, i) => h("th", { style: `color:${COLORS[i % COLORS.length]}`, title: r.id }, r.name)));
    const at = ids.indexOf(base);
    // With a baseline, each run's points become its differences from it (the baseline: 0).
    const shown = (key) => series.map((s) => {
      const points = s.series[key] || [];
      return at < 0 ? points : points.map((p) => ({ step: p.step, value: minus(p, series[at].series[key] || []) }));
    });
    const title = (key) => (at < 0 ? key : `${key} vs baseline`);
    const drawn = keys.filter((k) => series.some((s) => (s.series[k] || []).length));
    for (const [name, chart] of plots) {
      if (!drawn.some((k) => title(k) === name)) { chart.destroy(); chart.box.remove(); plots.delete(name); }
    }
    if (!drawn.length) {
      charts.replaceChildren(empty("No points yet for these metrics: the charts appear with the runs' first steps."));
    } else if (!plots.size) charts.replaceChildren();
    for (const key of drawn) {
      const name = title(key);
      const yLabel = key.split("/").slice(-2).join("/");
      if (!plots.has(name)) plots.set(name, new Chart(charts, name, { yLabel: at < 0 ? yLabel : `${yLabel} − baseline`, perRow: 1 }));
      plots.get(name).draw(
        runs.map((r, i) => ({ label: r.name, stroke: COLORS[i % COLORS.length], dash: i === at ? [6, 4] : undefined })),
        align(shown(key)));
    }
    renderVersus(runs, series, at);
    renderDiff(diff, runs);
  }, signal);

  // One row per other run: its difference from the baseline on each compared key, at its
  // newest step of that key.
  function renderVersus(runs, series, at) {
    versusSection.hidden = at < 0;
    if (at < 0) return;
    versusHead.replaceChildren(h("th", {}, "run"), ...COMPARED.map(([name]) => h("th", {}, name.replace("_", " "))));
    const row = (r, i) => h("tr", { dataset: { id: r.id } },
      h("td", { style: `color:${COLORS[i % COLORS.length]}` }, r.name),
      COMPARED.map(([name, key]) => {
        const points = series[i].series[key] || [];
        const last = points[points.length - 1];
        const d = last ? minus(last, series[at].series[key] || []) : null;
        return h("td", { dataset: { key: name }, title: last ? `at step ${last.step}` : "" }, d === null ? "—" : signed(d));
      }));
    versusBody.replaceChildren(...runs.map((r, i) => (i === at ? null : row(r, i))).filter(Boolean));
  }
}

// ``point``'s value less the baseline's newest value at or before its step (null: none).
function minus(point, baseline) {
  let found = null;
  for (const p of baseline) if (p.step <= point.step) found = p; else break;
  const mine = numeric(point.value), theirs = found ? numeric(found.value) : null;
  return mine === null || theirs === null ? null : mine - theirs;
}

function renderDiff(body, runs) {
  const flat = runs.map((r) => flatten(r.spec));
  const fields = [...new Set(flat.flatMap(Object.keys))].sort();
  const shown = (v) => (v === undefined ? "—" : JSON.stringify(v));
  const rows = fields.filter((f) => new Set(flat.map((s) => shown(s[f]))).size > 1)
    .map((f) => h("tr", { dataset: { field: f } }, h("td", {}, h("code", {}, f)), flat.map((s) => h("td", {}, shown(s[f])))));
  body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: runs.length + 1 }, "the specs are the same"))]));
}
