// #/webhooks?id=whk_...: the subscriptions the caller may see (the URL's host only: a Slack URL's
// path is its credential), what each hears, paused or active, its newest attempt and the failures
// since its last success; the recent deliveries of the one picked, each with its attempts; and
// what the caller's role may do (GET /whoami): add, pause or resume, remove. A secret is never
// shown: the one an add answers with is dropped (the CLI prints it; a rotation makes a new one).
import { ApiError, every, getJSON, patchJSON, postJSON, remove, showError } from "./api.js";
import { config } from "./config.js";
import { h, link, table, when } from "./ui.js";

const hostOf = (url) => { try { return new URL(url).host; } catch { return "?"; } };
const RULE = /^\s*(\S+?)\s*(<=|>=|<|>)\s*(\S+?)(?:\s+for\s+(\d+))?\s*$/;  // as `rlrun webhook add --threshold`
const ruleText = (t) => `${t.key} ${t.op} ${t.value}${t.for_steps > 1 ? ` for ${t.for_steps} steps` : ""}`;

function attemptCell(a) {
  if (!a) return h("span", { class: "dim" }, "none yet");
  const ok = a.status_code !== null && a.status_code >= 200 && a.status_code < 300;
  return h("span", { class: ok ? "healthy" : "unhealthy", title: a.error || "" },
    a.status_code === null ? "no answer" : String(a.status_code), h("span", { class: "dim" }, ` ${when(a.at)}`));
}

function hears(hook) {
  return hook.events.map((e) => (e === "run.status" && hook.statuses.length ? `${e} (${hook.statuses.join(", ")})` : e)).join(", ");
}

function filters(hook) {
  const out = [hook.team ? `team ${hook.team}` : "every team",
    hook.recipe ? `recipe ${hook.recipe}` : "", hook.name_pattern ? `name ${hook.name_pattern}` : ""];
  return out.filter(Boolean).join(" · ");
}

// The add form: what POST /webhooks takes, each 422 beside the form.
function addForm(me, added) {
  const url = h("input", { id: "hook-url", type: "url", required: true, placeholder: "https://hooks.example/rlrun", size: 40 });
  const format = h("select", { id: "hook-format" }, h("option", { value: "standard" }, "standard (signed JSON)"), h("option", { value: "slack" }, "slack"));
  const events = config.webhook_events.map((e) => h("label", {}, h("input", { type: "checkbox", name: "event", value: e, checked: e === "run.status" }), ` ${e} `));
  const statuses = config.statuses.map((s) => h("label", {}, h("input", { type: "checkbox", name: "status", value: s }), ` ${s} `));
  const recipe = h("input", { id: "hook-recipe", placeholder: "any recipe" });
  const pattern = h("input", { id: "hook-name", placeholder: "any name (a glob)" });
  const rules = h("textarea", { id: "hook-thresholds", rows: 2, placeholder: "critic/score/mean < 0.1 for 20   (one rule a line)" });
  const team = h("input", { id: "hook-team", placeholder: "every team" });
  const problems = h("ul", { id: "hook-errors", class: "errors", hidden: true });
  const form = h("form", { id: "hook-add" },
    h("div", { class: "form-row" }, h("label", {}, "URL ", url), h("label", {}, "format ", format),
      me.role === "admin" ? h("label", {}, "team ", team) : ""),
    h("div", { class: "form-row" }, "events: ", events),
    h("div", { class: "form-row" }, "run.status only for: ", statuses, h("span", { class: "dim" }, "(none: every status)")),
    h("div", { class: "form-row" }, h("label", {}, "recipe ", recipe), h("label", {}, "name ", pattern)),
    h("label", { class: "field" }, "metric.threshold rules: KEY OP VALUE [for N]", rules),
    h("div", { class: "form-row" }, h("button", { type: "submit", class: "primary" }, "add")),
    problems);
  const checked = (name) => [...form.querySelectorAll(`input[name=${name}]:checked`)].map((i) => i.value);
  const fail = (lines) => { problems.replaceChildren(...lines.map((l) => h("li", {}, l))); problems.hidden = !lines.length; };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const lines = rules.value.split("\n").filter((l) => l.trim());
    const bad = lines.filter((l) => !RULE.test(l));
    if (bad.length) { fail(bad.map((l) => `${l.trim()}: not KEY OP VALUE [for N]`)); return; }
    const thresholds = lines.map((l) => { const [, key, op, value, n] = l.match(RULE); return { key, op, value: Number(value), for_steps: Number(n || 1) }; });
    const wanted = checked("event");
    const body = { url: url.value.trim(), format: format.value, events: thresholds.length && !wanted.includes("metric.threshold") ? [...wanted, "metric.threshold"] : wanted, statuses: checked("status"), thresholds };
    if (recipe.value.trim()) body.recipe = recipe.value.trim();
    if (pattern.value.trim()) body.name_pattern = pattern.value.trim();
    if (me.role === "admin" && team.value.trim()) body.team = team.value.trim();
    try {
      const { secret, ...hook } = await postJSON("/webhooks", body);  // the secret goes nowhere
      fail([]);
      form.reset();
      added(hook);
    } catch (err) {
      if (err instanceof ApiError && err.errors.length) fail(err.errors.map((e) => `${e.field || ""}: ${e.msg || e.message || ""}`));
      else if (err instanceof ApiError) fail([err.message]);
      else showError(err);
    }
  });
  return form;
}

export function webhooksView(root, params, signal) {
  const hooks = table("webhooks", ["id", "host", "hears", "runs", "thresholds", "format", "state", "last delivery", "failures", ""],
    "nothing yet: no subscription");
  const deliveries = table("deliveries", ["webhook-id", "event", "run", "state", "created", "attempts", "last error", "delivered"],
    "nothing yet: no delivery");
  const picked = h("span", { id: "picked", class: "mono" });
  const notice = h("p", { id: "hook-notice", class: "note", hidden: true });
  const adding = h("section", { id: "hook-adding", hidden: true });
  root.append(h("h2", {}, "Webhooks"),
    h("p", { class: "note" }, "Run events sent to a URL, signed as Standard Webhooks say (or as Slack messages). Deliveries are retried with backoff; a subscription whose delivery keeps failing is paused."),
    hooks.node, notice,
    h("h3", {}, "Recent deliveries of ", picked), deliveries.node, adding);
  let me = { role: "viewer" };
  let shown = [];
  const pick = () => params.get("id") || shown[0]?.id;

  async function act(hook, change) {
    try { await change(); await reload(); } catch (err) { showError(err); }
  }
  function actions(hook) {
    if (me.role === "viewer") return "";
    const path = `/webhooks/${encodeURIComponent(hook.id)}`;
    const paused = hook.paused_at !== null;
    return h("span", { class: "actions" },
      h("button", { type: "button", dataset: { action: paused ? "resume" : "pause" },
        onclick: () => act(hook, () => patchJSON(path, { paused: !paused }, signal)) }, paused ? "resume" : "pause"), " ",
      h("button", { type: "button", class: "danger", dataset: { action: "remove" },
        onclick: () => confirm(`Remove ${hook.id} (${hostOf(hook.url)})? Deliveries not yet sent go with it.`)
          && act(hook, () => remove(path, signal)) }, "remove"));
  }
  function row(hook) {
    const state = hook.paused_at === null ? h("span", { class: "healthy" }, "active")
      : h("span", { class: "unhealthy", title: hook.paused_reason || "" }, "paused", h("div", { class: "dim" }, hook.paused_reason || ""));
    return h("tr", { dataset: { hook: hook.id }, class: hook.id === pick() ? "picked" : undefined },
      h("td", {}, link(`#/webhooks?id=${encodeURIComponent(hook.id)}`, hook.id, "mono")),
      h("td", { class: "host" }, hostOf(hook.url)),
      h("td", {}, hears(hook)),
      h("td", {}, filters(hook)),
      h("td", {}, hook.thresholds.map((t) => h("div", { class: "mono" }, ruleText(t)))),
      h("td", {}, hook.format),
      h("td", { class: "state" }, state),
      h("td", { class: "last" }, attemptCell(hook.last_attempt)),
      h("td", { class: `failures num ${hook.failures ? "unhealthy" : ""}` }, String(hook.failures)),
      h("td", {}, actions(hook)));
  }
  function deliveryRow(d) {
    const codes = d.attempts.map((a) => (a.status_code === null ? "—" : String(a.status_code)));
    const failed = [...d.attempts].reverse().find((a) => a.error);
    return h("tr", { dataset: { delivery: d.id, state: d.state } },
      h("td", { class: "mono" }, d.id), h("td", {}, d.event_type),
      h("td", {}, d.run_id ? link(`#/runs/${encodeURIComponent(d.run_id)}`, d.run_id, "mono") : ""),
      h("td", { class: d.state === "failed" ? "unhealthy" : d.state === "delivered" ? "healthy" : "" }, d.state),
      h("td", {}, when(d.created_at)),
      h("td", { class: "attempts mono", title: `${d.attempts.length} attempts` }, codes.join(" → ") || "not tried yet"),
      h("td", { class: "dim" }, failed ? failed.error : ""),
      h("td", {}, d.delivered_at ? when(d.delivered_at) : ""));
  }
  async function reload() {
    shown = await getJSON("/webhooks", signal);
    hooks.fill(shown.map(row));
    const id = pick();
    picked.textContent = id || "";
    deliveries.fill(id ? (await getJSON(`/webhooks/${encodeURIComponent(id)}/deliveries?limit=20`, signal)).map(deliveryRow) : []);
  }
  (async () => {
    try { me = await getJSON("/whoami", signal); } catch (err) { showError(err); return; }
    if (me.role !== "viewer") {
      adding.hidden = false;
      adding.append(h("h3", {}, "Add a subscription"), addForm(me, (hook) => {
        notice.hidden = false;
        notice.textContent = `Added ${hook.id} (${hostOf(hook.url)}). Its signing secret is not shown here: rlrun webhook add prints it once, and POST /webhooks/${hook.id}/rotate makes a new one.`;
        reload().catch(showError);
      }));
    }
    every(10_000, reload, signal);
  })();
}
