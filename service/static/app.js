// rlrun dashboard: hash-routed views over the public API (the same calls as curl and the CLI).
//   #/runs            runs, filters, paging        #/runs/{id}        one run
//   #/runs/{id}/samples?step=&min_score=&q=&prompt=  its rollout samples
//   #/submit          plan and submit a run        #/cluster          nodes, teams, queue
//   #/compare?runs=A,B  metrics of runs overlaid   #/usage?from=&to=  accelerator-hours by team
//   #/webhooks?id=    subscriptions, deliveries
import { every, getJSON, setToken, token } from "./api.js";
import { clusterView } from "./cluster.js";
import { config } from "./config.js";
import { compareView } from "./compare.js";
import { runView } from "./run.js";
import { runsView } from "./runs.js";
import { samplesView } from "./samples.js";
import { submitView } from "./submit.js";
import { usageView } from "./usage.js";
import { webhooksView } from "./webhooks.js";

const ROUTES = [
  [/^\/runs\/([^/?]+)\/samples$/, (root, m, params, signal) => samplesView(root, decodeURIComponent(m[1]), params, signal), "runs"],
  [/^\/runs\/([^/?]+)$/, (root, m, params, signal) => runView(root, decodeURIComponent(m[1]), signal), "runs"],
  [/^\/runs$/, (root, m, params, signal) => runsView(root, params, signal), "runs"],
  [/^\/submit$/, (root, m, params, signal) => submitView(root, params, signal), "submit"],
  [/^\/cluster$/, (root, m, params, signal) => clusterView(root, params, signal), "cluster"],
  [/^\/compare$/, (root, m, params, signal) => compareView(root, params, signal), "compare"],
  [/^\/usage$/, (root, m, params, signal) => usageView(root, params, signal), "usage"],
  [/^\/webhooks$/, (root, m, params, signal) => webhooksView(root, params, signal), "webhooks"],
];
let current = null;  // AbortController of the shown view: its timers and streams stop with it

function route() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const match = ROUTES.map(([re, view, tab]) => [path.match(re), view, tab]).find(([m]) => m);
  if (!match) { location.replace("#/runs"); return; }
  const focused = document.activeElement && document.activeElement.id;
  if (current) current.abort();
  current = new AbortController();
  const root = document.getElementById("view");
  root.replaceChildren();
  document.getElementById("error-bar").hidden = true;
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.tab === match[2]));
  match[1](root, match[0], new URLSearchParams(query), current.signal);
  // A filter typed into stays focused when its change re-renders the view.
  const again = focused && document.getElementById(focused);
  if (again && again.tagName === "INPUT") { again.focus(); again.setSelectionRange(again.value.length, again.value.length); }
}

// A sign-in only where the service asks for tokens (with auth off, every caller is let in).
function signIn() {
  if (!config.auth) {
    document.getElementById("sign-in").remove();
    return;
  }
  const input = document.getElementById("token");
  const state = document.getElementById("token-state");
  const show = () => {
    state.textContent = token() ? "token set" : "no token";
    document.getElementById("sign-out").hidden = !token();
  };
  document.getElementById("sign-in").addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    input.value = "";
    show();
    route();
  });
  document.getElementById("sign-out").addEventListener("click", () => { setToken(""); show(); route(); });
  document.getElementById("sign-in").hidden = false;
  show();
}

// The header's one-line cluster summary, on every view.
function summary() {
  const holder = document.getElementById("cluster");
  every(5000, async () => {
    const view = await getJSON("/cluster", new AbortController().signal);
    const total = (r, k) => view.nodes.reduce((sum, n) => sum + (n[k][r] || 0), 0);
    const kind = total("GPU", "total") && !total("NPU", "total") ? "GPU" : "NPU";
    holder.textContent = view.ray.ok
      ? `${total(kind, "available")}/${total(kind, "total")} ${kind} free · ${view.active.length} active · ${view.queue.length} queued`
      : `Ray unreachable · ${view.queue.length} queued`;
  }, new AbortController().signal);
}

window.addEventListener("hashchange", route);
document.getElementById("error-bar").addEventListener("click", (e) => { e.currentTarget.hidden = true; });
signIn();
summary();
route();
