// #/runs/{id}/samples?step=&min_score=&max_score=&q=&prompt=: a run's rollout samples.
// Prompts and responses are model output and user data: they are only ever text nodes (ui.h),
// never markup.
import { getJSON } from "./api.js";
import { Chart, empty, h, link, num } from "./ui.js";

const PAGE = 50;
const CUT = 120;
const FILTERS = [
  ["step", "step", "number"],
  ["min_score", "min score", "number"],
  ["max_score", "max score", "number"],
  ["q", "text", "search"],
];

const shortText = (text) => (text.length > CUT ? `${text.slice(0, CUT)}…` : text);
const cutMark = (sample, field) => (sample.cut.includes(field) ? " (cut)" : "");

export function samplesView(root, id, params, signal) {
  const path = `/runs/${encodeURIComponent(id)}`;
  const prompt = params.get("prompt") || "";
  const title = h("h2", { id: "samples-title" }, `Samples of ${id}`);
  const counts = h("p", { id: "samples-counts", class: "dim" });
  const inputs = FILTERS.map(([name, label, type]) => h("input", {
    id: `samples-${name.replace("_", "-")}`, name, type, step: type === "number" ? "any" : undefined,
    placeholder: label, "aria-label": label, value: params.get(name) || "",
  }));
  const form = h("form", { id: "samples-filters", class: "toolbar" }, ...inputs, h("button", { type: "submit" }, "filter"),
    prompt ? link(`#${path}/samples`, "all prompts") : "");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const input of inputs) if (input.value.trim()) next.set(input.name, input.value.trim());
    if (prompt) next.set("prompt", prompt);
    location.hash = `#${path}/samples?${next}`;
  });
  const charts = h("div", { id: "samples-chart" });
  const body = h("tbody");
  const rows = h("table", { id: "samples-table" },
    h("thead", {}, h("tr", {}, ["step", "score", "prompt chars", "response chars", "prompt", "response"].map((t) => h("th", {}, t)))),
    body);
  const detail = h("section", { id: "sample-detail", hidden: true });
  const across = h("section", { id: "prompt-across", hidden: !prompt });
  const more = h("button", { id: "samples-more", hidden: true }, "more");
  root.append(
    h("div", { class: "run-head" }, title, h("p", {}, link(`#${path}`, "← the run"), " ", counts)),
    form, charts, across, rows, more, detail,
  );

  const query = new URLSearchParams({ limit: String(PAGE) });
  for (const [name] of FILTERS) if (params.get(name)) query.set(name, params.get(name));
  if (prompt) query.set("prompt_id", prompt);
  let cursor = null;
  const shown = [];

  const open = (s) => {
    detail.hidden = false;
    detail.replaceChildren(
      h("h3", {}, `Step ${s.step} · score ${num(s.score)}`),
      h("p", {}, link(`#${path}/samples?prompt=${s.prompt_id}`, "this prompt at every step", "prompt-link"),
        " ", h("span", { class: "mono dim" }, s.prompt_id)),
      h("h4", {}, `prompt${cutMark(s, "input")}`), h("pre", { class: "sample-text", dataset: { field: "input" } }, s.input),
      h("h4", {}, `response${cutMark(s, "output")}`), h("pre", { class: "sample-text", dataset: { field: "output" } }, s.output),
      h("h4", {}, `ground truth${cutMark(s, "gts")}`), h("pre", { class: "sample-text", dataset: { field: "gts" } }, s.gts),
      h("h4", {}, "extras"), h("pre", { class: "sample-text", dataset: { field: "extras" } }, JSON.stringify(s.extras, null, 2)),
    );
    detail.scrollIntoView({ block: "nearest" });
  };

  const render = () => {
    body.replaceChildren(...(shown.length ? shown.map((s) => {
      const row = h("tr", { class: "sample-row", tabindex: "0", dataset: { id: String(s.id), step: String(s.step) } },
        h("td", {}, String(s.step)), h("td", {}, num(s.score)),
        h("td", {}, String(s.input.length)), h("td", {}, String(s.output.length)),
        h("td", { class: "sample-cell" }, shortText(s.input)), h("td", { class: "sample-cell" }, shortText(s.output)));
      row.addEventListener("click", () => open(s));
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") open(s); });
      return row;
    }) : [h("tr", {}, h("td", { colspan: 6 }, "No samples match."))]));
    if (prompt) {
      // One prompt across steps, side by side: a column per sample, oldest step first.
      const ordered = [...shown].sort((a, b) => a.step - b.step || a.id - b.id);
      across.replaceChildren(
        h("h3", {}, "This prompt across steps"),
        h("pre", { class: "sample-text" }, ordered.length ? ordered[0].input : ""),
        h("div", { class: "side-by-side" }, ordered.map((s) => h("div", { class: "side", dataset: { step: String(s.step) } },
          h("h4", {}, `step ${s.step} · score ${num(s.score)}`), h("pre", { class: "sample-text" }, s.output)))));
    }
  };

  const load = async (first) => {
    if (!first && cursor !== null) query.set("cursor", String(cursor));
    if (first) query.set("steps", "true"); else query.delete("steps");
    const page = await getJSON(`${path}/samples?${query}`, signal);
    shown.push(...page.items);
    cursor = page.next_cursor;
    more.hidden = cursor === null;
    counts.textContent = `${page.kept.toLocaleString("en")} samples kept · ${page.skipped.toLocaleString("en")} lines skipped`;
    if (first) drawSteps(charts, page.steps || [], signal);
    render();
  };
  more.addEventListener("click", () => load(false));
  load(true);
}

// The score distribution per step: mean, with min and max as a band.
function drawSteps(holder, steps, signal) {
  if (!steps.length) {
    holder.replaceChildren(empty("No samples yet: they appear as the job ships its steps."));
    return;
  }
  const chart = new Chart(holder, "sample scores", { yLabel: "score", perRow: 1 });
  signal.addEventListener("abort", () => chart.destroy());
  const data = [steps.map((s) => s.step), steps.map((s) => s.mean), steps.map((s) => s.min), steps.map((s) => s.max)];
  chart.draw([
    { label: "mean", stroke: "#1f77b4" },
    { label: "min", stroke: "rgba(31,119,180,0.3)" },
    { label: "max", stroke: "rgba(31,119,180,0.3)" },
  ], data, [{ series: [3, 2], fill: "rgba(31,119,180,0.07)" }]);
}
