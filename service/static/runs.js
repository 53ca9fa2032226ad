// #/runs?status=&team=&cursor=: the runs, newest first, a page at a time, refreshed live; each
// with its difference from its team's and recipe's pinned baseline.
import { every, getJSON } from "./api.js";
import { config } from "./config.js";
import { badge, h, healthText, link, num, progressCell, since, sparkline, versus, when } from "./ui.js";

const STATUSES = config.statuses;
const PAGE = 50;
const REWARD = config.reward_key;
const COLUMNS = ["", "name", "id", "team", "recipe", "status", "health", "progress", "reward", "vs baseline", "age", "duration"];
const sparks = new Map();  // run id -> {values, step}: read again only when the run moved on

export function runsView(root, params, signal) {
  const status = h("select", { id: "status-filter", "aria-label": "status" },
    h("option", { value: "" }, "all statuses"), STATUSES.map((s) => h("option", { value: s }, s)));
  status.value = params.get("status") || "";
  const team = h("input", { id: "team-filter", placeholder: "team", "aria-label": "team", value: params.get("team") || "" });
  const compare = h("button", { id: "compare-selected", disabled: true }, "compare selected");
  const body = h("tbody");
  const pager = h("div", { class: "pager" });
  const selected = new Set();

  const go = (changes) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) if (v) next.set(k, v); else next.delete(k);
    location.hash = `#/runs${next.toString() ? `?${next}` : ""}`;
  };
  status.addEventListener("change", () => go({ status: status.value, cursor: "" }));
  let typing = null;
  team.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => go({ team: team.value.trim(), cursor: "" }), 400);
  });
  compare.addEventListener("click", () => { location.hash = `#/compare?runs=${[...selected].join(",")}`; });

  root.append(
    h("div", { class: "toolbar" }, status, team, compare, link("#/submit", "new run", "button")),
    h("table", { id: "runs" },
      h("thead", {}, h("tr", {}, COLUMNS.map((t) => h("th", {}, t)))),
      body),
    pager,
  );

  const row = (run) => {
    const box = h("input", { type: "checkbox", "aria-label": `select ${run.id}`, checked: selected.has(run.id) });
    box.addEventListener("change", () => {
      if (box.checked) selected.add(run.id); else selected.delete(run.id);
      compare.disabled = selected.size < 2;
    });
    const spark = sparks.get(run.id);
    return h("tr", { dataset: { id: run.id } },
      h("td", {}, box),
      h("td", {}, link(`#/runs/${encodeURIComponent(run.id)}`, run.name)),
      h("td", { class: "mono" }, run.id),
      h("td", {}, run.team),
      h("td", {}, run.recipe),
      h("td", {}, badge(run.status)),
      h("td", {}, healthText(run.health)),
      h("td", {}, progressCell(run.progress)),
      h("td", { class: "reward" }, num(run.reward), " ", spark ? sparkline(spark.values) : ""),
      h("td", { class: "vs-baseline" }, run.baseline && !run.baseline.is_baseline
        ? link(`#/compare?runs=${encodeURIComponent(run.baseline.run_id)},${encodeURIComponent(run.id)}&baseline=${encodeURIComponent(run.baseline.run_id)}`, versus(run.baseline))
        : versus(run.baseline)),
      h("td", { title: `created ${when(run.created_at)}` }, since(run.created_at)),
      h("td", {}, run.started_at ? since(run.started_at, run.ended_at) : ""),
    );
  };

  const refresh = async () => {
    const query = new URLSearchParams({ limit: String(PAGE), baseline: "true" });
    for (const key of ["status", "team", "cursor"]) if (params.get(key)) query.set(key, params.get(key));
    const page = await getJSON(`/runs?${query}`, signal);
    const filtered = ["status", "team", "cursor"].some((k) => params.get(k));
    const none = h("tr", { class: "empty", id: "no-runs" }, h("td", { colspan: COLUMNS.length },
      filtered ? "No runs match these filters." : "No runs yet: ", filtered ? "" : link("#/submit", "submit the first one")));
    const rows = () => (page.items.length ? page.items.map(row) : [none]);
    body.replaceChildren(...rows());
    pager.replaceChildren(
      params.get("cursor") ? link(`#/runs?${new URLSearchParams([...params].filter(([k]) => k !== "cursor"))}`, "« newest") : "",
      page.next_cursor ? h("button", { id: "next-page", onclick: () => go({ cursor: page.next_cursor }) }, "older »") : "",
    );
    await loadSparks(page.items, signal);
    body.replaceChildren(...rows());
  };
  every(3000, refresh, signal);
}

async function loadSparks(runs, signal) {
  const step = (run) => `${run.progress.trainer_step}/${run.progress.step}/${run.reward}`;
  const wanted = runs.filter((r) => r.reward !== null && (sparks.get(r.id) || {}).step !== step(r));
  await Promise.all(wanted.map(async (run) => {
    const data = await getJSON(`/runs/${encodeURIComponent(run.id)}/metrics?keys=${encodeURIComponent(REWARD)}&max_points=40`, signal);
    sparks.set(run.id, { values: (data.series[REWARD] || []).map((p) => p.value), step: step(run) });
  }));
}
