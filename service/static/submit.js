// #/submit[?from=ID]: a form generated from the chosen recipe's JSON Schema (GET /recipes:
// its fields, types, defaults and help), the same spec as JSON behind a toggle, the dry-run
// plan, then submit. The 422 of each field shows beside that field.
import { ApiError, getJSON, postJSON, showError } from "./api.js";
import { h } from "./ui.js";

export function submitView(root, params, signal) {
  let spec = {};  // the one spec: the form and the JSON view both edit it
  let recipes = [];
  let planned = null;  // the spec (as JSON) the shown plan is for
  const recipe = h("select", { id: "recipe", name: "recipe" });
  const form = h("div", { id: "spec-form" });
  const text = h("textarea", { id: "spec-json", rows: 24, spellcheck: false, "aria-label": "run spec (JSON)", hidden: true });
  const jsonError = h("p", { id: "json-error", class: "field-error" });
  const toggle = h("button", { id: "json-toggle", type: "button" }, "edit as JSON");
  const plan = h("section", { id: "plan", hidden: true });
  const problems = h("ul", { id: "errors", class: "errors", hidden: true });
  const planButton = h("button", { id: "dry-run" }, "plan (dry run)");
  const submitButton = h("button", { id: "submit", class: "primary", disabled: true }, "submit");

  root.append(
    h("h2", {}, params.get("from") ? `Clone of ${params.get("from")}` : "New run"),
    h("div", { class: "submit-grid" },
      h("div", {},
        h("div", { class: "toolbar" }, fieldBox("recipe", "recipe", recipe, "What runs: each recipe has its own fields."), toggle),
        form, text, jsonError,
        h("div", { class: "toolbar" }, planButton, submitButton),
        problems),
      plan),
  );

  const current = () => JSON.stringify(spec);
  const changed = () => { submitButton.disabled = planned !== current(); };
  const chosen = () => recipes.find((r) => r.name === spec.recipe);

  const setField = (path, value) => {
    if (value === undefined) unset(spec, path); else set(spec, path, value);
    changed();
  };
  const render = () => {
    const schema = (chosen() || {}).spec_schema || {};
    recipe.value = spec.recipe || "";
    form.replaceChildren(...fields(schema, schema, "", spec, setField, chosen()));
  };
  recipe.addEventListener("change", () => {
    // Fields shared by every recipe stay; the recipe's own are its new schema's.
    const keep = Object.fromEntries(["name", "team", "priority", "secrets"].filter((k) => k in spec).map((k) => [k, spec[k]]));
    spec = { recipe: recipe.value, ...keep };
    render();
    changed();
  });

  // The JSON view: the whole spec as text; the form is drawn again from it when shown.
  toggle.addEventListener("click", () => {
    if (text.hidden) {
      text.value = JSON.stringify(spec, null, 2);
      text.hidden = false;
      form.hidden = true;
      toggle.textContent = "edit as form";
    } else if (readJSON()) {
      text.hidden = true;
      form.hidden = false;
      toggle.textContent = "edit as JSON";
      render();
    }
  });
  const readJSON = () => {
    try {
      const value = JSON.parse(text.value || "{}");
      if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("the spec must be a JSON object");
      spec = value;
      jsonError.textContent = "";
      changed();
      return true;
    } catch (err) {
      jsonError.textContent = `not a valid spec: ${err.message}`;
      return false;
    }
  };
  text.addEventListener("input", readJSON);

  const showProblems = (err) => {
    root.querySelectorAll(".field-error").forEach((e) => { if (e !== jsonError) e.textContent = ""; });
    root.querySelectorAll(".field.invalid").forEach((e) => e.classList.remove("invalid"));
    if (!err) { problems.hidden = true; return; }
    const list = err instanceof ApiError && err.errors.length ? err.errors : [{ field: "", msg: err.message }];
    problems.replaceChildren(h("li", { class: "summary" }, err instanceof ApiError ? `${err.problem.title}: ${err.problem.detail}` : "error"),
      ...list.map((e) => h("li", { dataset: { field: e.field || "" } }, h("code", {}, e.field || "spec"), " ", e.msg, " ", lineLink(e.field))));
    problems.hidden = false;
    for (const e of list) {
      // Beside its own field, or the nearest enclosing one the form shows (a JSON-valued field).
      const box = nearestField(root, String(e.field || ""));
      if (box) {
        box.classList.add("invalid");
        const note = box.querySelector(":scope > .field-error");
        note.textContent = note.textContent ? `${note.textContent}; ${e.msg}` : e.msg;
      }
    }
  };

  // In the JSON view, the line where an error's field is written, as a link that selects it.
  const lineLink = (field) => {
    if (text.hidden) return "";
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

  planButton.addEventListener("click", async () => {
    if (!text.hidden && !readJSON()) return;
    const sent = current();
    try {
      const answer = await postJSON("/runs?dry_run=true", spec, signal);
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
      const run = await postJSON("/runs", spec, signal);
      location.hash = `#/runs/${encodeURIComponent(run.id)}`;
    } catch (err) {
      showProblems(err);
    }
  });

  (async () => {
    try {
      recipes = await getJSON("/recipes", signal);
      recipe.replaceChildren(...recipes.map((r) => h("option", { value: r.name }, r.name)));
      spec = { recipe: recipes.some((r) => r.name === "tiny-grpo") ? "tiny-grpo" : (recipes[0] || {}).name };
      if (params.get("from")) {
        const source = await getJSON(`/runs/${encodeURIComponent(params.get("from"))}`, signal);
        spec = { ...source.spec, name: `${source.name} (clone)` };
        // The run's own spec with the split of accelerators its step-time verdict offers.
        const split = params.get("split") ? await getJSON(`/runs/${encodeURIComponent(params.get("from"))}/step-time`, signal) : null;
        if (split && split.change) spec = { ...split.change.spec, name: `${source.name} (${split.change.summary})` };
      }
      render();
      root.dataset.ready = "true";
    } catch (err) { showError(err); }
  })();
}

// A labelled field: its name, the input, help (description and default), and its error.
function fieldBox(path, label, input, help) {
  return h("label", { class: "field", dataset: { field: path } },
    h("span", { class: "field-name" }, label), input,
    help ? h("span", { class: "help" }, help) : "",
    h("span", { class: "field-error" }));
}

function nearestField(root, path) {
  for (let p = path; p; p = p.replace(/(\.[^.[\]]*|\[\d+\])$/, "")) {
    const box = root.querySelector(`.field[data-field="${CSS.escape(p)}"]`);
    if (box) return box;
    if (!/[.[]/.test(p)) break;
  }
  return null;
}

// A property's schema with its $ref followed and an optional (anyOf X | null) unwrapped; the
// property's own title, description and default win over the referenced definition's.
function resolve(prop, root) {
  let out = prop || {};
  const own = { ...out };
  delete own.$ref; delete own.anyOf;
  if (out.anyOf) {
    const real = out.anyOf.filter((s) => s.type !== "null");
    out = real.length === 1 ? { ...real[0], nullable: true } : { ...out, mixed: true };
  }
  while (out.$ref) {
    const target = (root.$defs || {})[out.$ref.split("/").pop()] || {};
    const { $ref, ...rest } = out;
    out = { ...target, ...rest };
  }
  return { ...out, ...own };
}

const SKIP = new Set(["recipe"]);  // drawn above the form, as the recipe picker

// The inputs for an object schema's properties (nested objects as sections of their own).
function fields(schema, root, prefix, spec, setField, recipe) {
  const props = schema.properties || {};
  return Object.entries(props).filter(([key]) => !(prefix === "" && SKIP.has(key))).map(([key, raw]) => {
    const path = prefix ? `${prefix}.${key}` : key;
    const prop = resolve(raw, root);
    const value = get(spec, path);
    if (prop.type === "object" && prop.properties) {
      return h("details", { class: "field-group", dataset: { field: path }, open: value !== undefined },
        h("summary", {}, prop.title || key, prop.description ? h("span", { class: "help" }, ` ${prop.description}`) : ""),
        h("span", { class: "field-error" }),
        fields(prop, root, path, spec, setField, recipe));
    }
    const presets = path === "preset" && recipe ? recipe.presets : null;
    return fieldBox(path, key, input(path, prop, value, setField, presets), help(prop));
  });
}

function help(prop) {
  const parts = [];
  if (prop.description) parts.push(prop.description);
  if (prop.default !== undefined && prop.default !== null && !(typeof prop.default === "object" && !Object.keys(prop.default).length)) {
    parts.push(`default ${JSON.stringify(prop.default)}`);
  }
  const lo = prop.minimum ?? prop.exclusiveMinimum, hi = prop.maximum ?? prop.exclusiveMaximum;
  if (lo !== undefined || hi !== undefined) parts.push(`range ${lo ?? "…"}–${hi ?? "…"}`);
  return parts.join(" · ");
}

// One input for a leaf: a choice, a number, a flag, text, or JSON for lists and maps.
function input(path, prop, value, setField, presets) {
  const id = `field-${path}`;
  const choices = presets || prop.enum || (prop.const !== undefined ? [prop.const] : null);
  if (choices) {
    const select = h("select", { id, name: path },
      h("option", { value: "" }, prop.default !== undefined && prop.default !== null ? `default (${prop.default})` : "—"),
      choices.map((c) => h("option", { value: JSON.stringify(c) }, String(c))));
    select.value = value === undefined ? "" : JSON.stringify(value);
    select.addEventListener("change", () => setField(path, select.value ? JSON.parse(select.value) : undefined));
    return select;
  }
  if (prop.type === "boolean") {
    const box = h("input", { id, name: path, type: "checkbox", checked: value ?? prop.default ?? false });
    box.addEventListener("change", () => setField(path, box.checked));
    return box;
  }
  if (prop.type === "integer" || prop.type === "number") {
    const field = h("input", { id, name: path, type: "number", step: prop.type === "integer" ? "1" : "any",
      placeholder: prop.default ?? "", value: value ?? "" });
    field.addEventListener("change", () => setField(path, field.value === "" ? undefined : Number(field.value)));
    return field;
  }
  if (prop.type === "string") {
    const field = h("input", { id, name: path, placeholder: prop.default ?? "", value: value ?? "" });
    field.addEventListener("change", () => setField(path, field.value === "" ? undefined : field.value));
    return field;
  }
  // Lists, maps and mixed types: written as JSON in place.
  const field = h("input", { id, name: path, class: "json-field", placeholder: JSON.stringify(prop.default ?? (prop.type === "array" ? [] : {})),
    value: value === undefined ? "" : JSON.stringify(value) });
  field.addEventListener("change", () => {
    const box = field.closest(".field");
    try {
      setField(path, field.value === "" ? undefined : JSON.parse(field.value));
      box.classList.remove("invalid");
      box.querySelector(".field-error").textContent = "";
    } catch {
      box.classList.add("invalid");
      box.querySelector(".field-error").textContent = "not valid JSON";
    }
  });
  return field;
}

const keysOf = (path) => path.split(".");
function get(obj, path) {
  return keysOf(path).reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj);
}
function set(obj, path, value) {
  const keys = keysOf(path);
  let node = obj;
  for (const k of keys.slice(0, -1)) {
    if (!node[k] || typeof node[k] !== "object") node[k] = {};
    node = node[k];
  }
  node[keys[keys.length - 1]] = value;
}
function unset(obj, path) {
  const keys = keysOf(path);
  const parents = [];
  let node = obj;
  for (const k of keys.slice(0, -1)) {
    if (!node[k] || typeof node[k] !== "object") return;
    parents.push([node, k]);
    node = node[k];
  }
  delete node[keys[keys.length - 1]];
  // A section left empty is dropped too: the spec says only what was chosen.
  for (const [parent, k] of parents.reverse()) if (!Object.keys(parent[k]).length) delete parent[k];
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
