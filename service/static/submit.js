// #/submit[?from=ID]: choose a recipe and preset, edit the spec, see the dry-run plan, submit.
import { ApiError, getJSON, postJSON, showError } from "./api.js";
import { h } from "./ui.js";

const FORM_FIELDS = ["recipe", "preset", "name", "team", "priority"];

export function submitView(root, params, signal) {
  const recipe = h("select", { id: "recipe", name: "recipe" });
  const preset = h("select", { id: "preset", name: "preset" });
  const name = h("input", { id: "name", name: "name", placeholder: "name (optional)" });
  const team = h("input", { id: "team", name: "team", placeholder: "default" });
  const priority = h("select", { id: "priority", name: "priority" }, ["normal", "high", "low"].map((p) => h("option", { value: p }, p)));
  const text = h("textarea", { id: "spec-json", rows: 18, spellcheck: false, "aria-label": "run spec (JSON)" });
  const plan = h("section", { id: "plan", hidden: true });
  const problems = h("ul", { id: "errors", class: "errors", hidden: true });
  const planButton = h("button", { id: "dry-run" }, "plan (dry run)");
  const submitButton = h("button", { id: "submit", class: "primary", disabled: true }, "submit");
  const inputs = { recipe, preset, name, team, priority };
  const fieldBox = (label, input) => h("label", { class: "field", dataset: { field: label } }, h("span", {}, label), input, h("span", { class: "field-error" }));

  root.append(
    h("h2", {}, params.get("from") ? `Clone of ${params.get("from")}` : "New run"),
    h("div", { class: "submit-grid" },
      h("div", {},
        h("div", { class: "form-row" }, ...FORM_FIELDS.map((f) => fieldBox(f, inputs[f]))),
        text,
        h("div", { class: "toolbar" }, planButton, submitButton),
        problems),
      plan),
  );

  let planned = null;  // the exact text the shown plan is for
  const parse = () => {
    try { return JSON.parse(text.value || "{}"); } catch (err) { return null; }
  };
  // Form fields and the JSON stay one spec: editing either updates the other.
  const toJSON = () => {
    const spec = parse();
    if (!spec) return;
    for (const f of FORM_FIELDS) {
      const value = inputs[f].value.trim();
      if (value && !(f === "priority" && value === "normal" && !spec.priority)) spec[f] = value;
      else delete spec[f];
    }
    text.value = JSON.stringify(spec, null, 2);
    changed();
  };
  const fromJSON = () => {
    const spec = parse();
    if (!spec) return;
    for (const f of FORM_FIELDS) if (f !== "preset" && f !== "recipe") inputs[f].value = spec[f] || (f === "priority" ? "normal" : "");
    if (spec.recipe && [...recipe.options].some((o) => o.value === spec.recipe)) recipe.value = spec.recipe;
    fillPresets(spec.preset || "");
  };
  const changed = () => {
    submitButton.disabled = planned !== text.value;
  };
  let recipes = [];
  const fillPresets = (value) => {
    const chosen = recipes.find((r) => r.name === recipe.value);
    preset.replaceChildren(h("option", { value: "" }, "no preset"), ...(chosen ? chosen.presets : []).map((p) => h("option", { value: p }, p)));
    preset.value = value;
    preset.disabled = !chosen || !chosen.presets.length;
  };
  recipe.addEventListener("change", () => { fillPresets(""); toJSON(); });
  for (const input of [preset, name, team, priority]) input.addEventListener("change", toJSON);
  text.addEventListener("input", () => { changed(); fromJSON(); });

  const showProblems = (err) => {
    root.querySelectorAll(".field-error").forEach((e) => { e.textContent = ""; });
    root.querySelectorAll(".field.invalid").forEach((e) => e.classList.remove("invalid"));
    if (!err) { problems.hidden = true; return; }
    const list = err instanceof ApiError && err.errors.length ? err.errors : [{ field: "", msg: err.message }];
    problems.replaceChildren(h("li", { class: "summary" }, err instanceof ApiError ? `${err.problem.title}: ${err.problem.detail}` : "error"),
      ...list.map((e) => h("li", { dataset: { field: e.field || "" } }, h("code", {}, e.field || "spec"), " ", e.msg, " ", lineLink(e.field))));
    problems.hidden = false;
    for (const e of list) {
      const box = root.querySelector(`.field[data-field="${CSS.escape(e.field || "")}"]`);
      if (box) {
        box.classList.add("invalid");
        box.querySelector(".field-error").textContent = e.msg;
      }
    }
  };

  // The line of the spec's JSON where an error's field is written, as a link that selects it.
  const lineLink = (field) => {
    const leaf = String(field || "").split(/[.[\]]/).filter(Boolean).pop();
    if (!leaf || /^\d+$/.test(leaf)) return "";
    const lines = text.value.split("\n");
    const at = lines.findIndex((l) => l.includes(`"${leaf}"`));
    if (at < 0) return "";
    const start = lines.slice(0, at).reduce((n, l) => n + l.length + 1, 0);
    return h("a", { href: "#", class: "line-link", onclick: (event) => {
      event.preventDefault();
      text.focus();
      text.setSelectionRange(start, start + lines[at].length);
    } }, `line ${at + 1}`);
  };

  const spec = () => {
    const value = parse();
    if (!value) throw new Error("the spec is not valid JSON");
    return value;
  };

  planButton.addEventListener("click", async () => {
    const sent = text.value;
    try {
      const answer = await postJSON("/runs?dry_run=true", spec(), signal);
      showProblems(null);
      renderPlan(plan, answer);
      planned = sent;
    } catch (err) {
      plan.hidden = true;
      planned = null;
      showProblems(err);
    }
    changed();
  });
  submitButton.addEventListener("click", async () => {
    try {
      const run = await postJSON("/runs", spec(), signal);
      location.hash = `#/runs/${encodeURIComponent(run.id)}`;
    } catch (err) {
      showProblems(err);
    }
  });

  (async () => {
    try {
      recipes = await getJSON("/recipes", signal);
      recipe.replaceChildren(...recipes.map((r) => h("option", { value: r.name }, r.name)));
      let initial = { recipe: recipes.some((r) => r.name === "tiny-grpo") ? "tiny-grpo" : (recipes[0] || {}).name };
      if (params.get("from")) {
        const source = await getJSON(`/runs/${encodeURIComponent(params.get("from"))}`, signal);
        initial = { ...source.spec, name: `${source.name} (clone)` };
      }
      text.value = JSON.stringify(initial, null, 2);
      fromJSON();
    } catch (err) { showError(err); }
  })();
}

function renderPlan(holder, answer) {
  const plan = answer.plan || {};
  const verdict = plan.feasible_now ? "starts now" : plan.feasible_ever === false ? "can never fit this cluster" : "waits in the queue";
  const rows = (plan.placement || []).map((slot) => h("tr", {}, h("td", { class: "mono" }, slot.node), h("td", {}, slot.role), h("td", {}, String(slot.accelerators)), h("td", {}, String(slot.cpus))));
  holder.replaceChildren(
    h("h3", {}, "Plan"),
    h("p", { id: "plan-verdict", class: plan.feasible_ever === false ? "unhealthy" : "" }, `${verdict}; queue position ${plan.queue_position}`),
    rows.length ? h("table", { id: "placement" }, h("thead", {}, h("tr", {}, ["node", "group", "accelerators", "CPUs"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)) : "",
    (plan.reasons || []).length ? h("ul", { class: "reasons" }, plan.reasons.map((r) => h("li", {}, r))) : "",
    plan.suggestion ? h("p", {}, "suggestion: ", JSON.stringify(plan.suggestion)) : "",
    [...(answer.warnings || []), ...(plan.warnings || [])].length
      ? h("ul", { id: "warnings", class: "warnings" }, [...(answer.warnings || []), ...(plan.warnings || [])].map((w) => h("li", {}, w))) : "",
    h("h4", {}, "Command"), h("pre", { id: "plan-command" }, answer.entrypoint || (answer.command || []).join(" ")),
    h("h4", {}, "Runtime env"), h("pre", {}, JSON.stringify(answer.runtime_env || {}, null, 2)),
  );
  holder.hidden = false;
}
