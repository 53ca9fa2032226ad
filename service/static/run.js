// #/runs/{id}: one run — curves, status timeline, health, its baseline (pinned and unpinned here
// by a member of its team), spec/command/env/script, live log.
import { ApiError, TERMINAL, getJSON, getText, postJSON, putJSON, remove, showError, subscribe } from "./api.js";
import { config } from "./config.js";
import { COLORS, Chart, align, ansiSpans, badge, empty, h, link, num, progressCell, since, versus, when } from "./ui.js";

const REWARD = [config.reward_key, ...config.reward_band_keys];
// One quantity per chart (so per axis): a mean staleness of 0.5 is not drawn against a count
// of 1,800 trajectories. verl itself logs the sync time under a doubled prefix. A chart shows
// the keys a run logs: verl's fully async trainer's (fully_async/*), or its V1 trainer's
// (training/off_policy/*, timing_s/update_weights); one a run never logs is not drawn.
const FIXED = [
  { title: "idle ratio", yLabel: "fraction of time idle", keys: ["fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio"] },
  { title: "staleness", yLabel: "parameter versions behind", keys: ["fully_async/count/mean_staleness", "training/off_policy/trajectory_staleness/mean", "training/off_policy/trajectory_staleness/max"] },
  { title: "stale samples", yLabel: "samples in flight at the last sync", keys: ["fully_async/count/staleness_samples"] },
  { title: "stale trajectories", yLabel: "trajectories (cumulative)", keys: ["fully_async/count/stale_trajectory_processed"] },
  { title: "evicted as too stale", yLabel: "prompt groups", keys: ["training/off_policy/evicted_samples"] },
  { title: "partial rollouts", yLabel: "fraction of rollouts", keys: ["fully_async/partial/partial_ratio"] },
  { title: "versions per trajectory", yLabel: "model versions a trajectory spans", keys: ["training/off_policy/trajectory_spans/mean", "training/off_policy/trajectory_spans/max"] },
  { title: "sync time", yLabel: "seconds", keys: ["timing_s/param_sync", "timing_s/timing_s/param_sync", "timing_s/update_weights"] },
  // verl's rollout correction (algorithm.rollout_correction): its IS weights and what its
  // rejection sampling masked.
  { title: "rollout IS weight", yLabel: "importance weight", keys: ["rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_seq_mean", "actor/rollout_corr/rollout_is_mean"] },
  { title: "rejected by rollout RS", yLabel: "fraction masked", keys: ["rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"] },
];
const LOG_LINES = 2000;
const hours = (n) => Number(n).toLocaleString("en", { maximumFractionDigits: 1 });
const BAND_EDGE = "rgba(31,119,180,0.3)", BAND_FILL = "rgba(31,119,180,0.07)";

// Beside a run that is not over yet, how its last attempt ended: while it is RETRYING (the
// decision pending) and while its next attempt waits (QUEUED, in its backoff).
export function retryNote(run) {
  const attempts = run.attempts || [];
  const ended = run.status === "RETRYING" ? attempts[attempts.length - 1]
    : run.status === "QUEUED" && attempts.length > 1 ? attempts[attempts.length - 2] : null;
  if (!ended) return "";
  const cls = ended.failure ? ` (${ended.failure.class})` : "";
  const next = run.status === "RETRYING" ? "deciding on a next attempt"
    : `attempt ${run.attempt} ${run.retry_at ? `from ${when(run.retry_at)}` : "queued"}`;
  return `attempt ${ended.n} ${ended.status}${cls}: ${next}`;
}

export function runView(root, id, signal) {
  const path = `/runs/${encodeURIComponent(id)}`;
  const title = h("h2", { id: "run-title" });
  const status = h("span", { id: "run-status", class: "badge" });
  const health = h("span", { id: "run-health" });
  const queue = h("p", { id: "run-queue", class: "queue-reason", hidden: true });
  const budget = h("p", { id: "run-budget", class: "queue-reason", hidden: true });
  const progress = h("span", { id: "run-progress" });
  const cluster = h("span", { id: "run-cluster", class: "dim" });
  const retry = h("p", { id: "run-retry", class: "queue-reason", hidden: true });
  const cancel = h("button", { id: "cancel", class: "danger", hidden: true }, "cancel");
  const yieldButton = h("button", { id: "cancel-at-checkpoint", hidden: true, title: "stop right after its next complete checkpoint; retry resumes it from there" }, "stop at next checkpoint");
  const stopNote = h("p", { id: "run-stop", class: "queue-reason", hidden: true });
  const saved = h("span", { id: "run-checkpoint", class: "dim" });
  const clone = link(`#/submit?from=${encodeURIComponent(id)}`, "clone", "button");
  const samples = link(`#/runs/${encodeURIComponent(id)}/samples`, "samples", "button");
  samples.id = "run-samples";
  const pin = h("button", { id: "pin-baseline", hidden: true });
  const versusBaseline = h("p", { id: "run-baseline", class: "dim", hidden: true });
  const charts = h("div", { id: "charts" }, empty("No metrics yet: the charts appear with the run's first step."));
  const picker = h("select", { id: "key-picker", "aria-label": "another metric" }, h("option", { value: "" }, "add a chart…"));
  const timeline = h("ol", { id: "events", class: "timeline" });
  const startup = h("div", { id: "startup", class: "startup-strip" });
  const startupNote = h("p", { id: "startup-total", class: "dim" });
  const verdict = h("p", { id: "step-verdict" });
  const stepNotes = h("ul", { id: "step-notes", class: "dim" });
  const change = h("p", { id: "step-change", class: "queue-reason", hidden: true });
  const stepChart = h("div", { id: "step-chart" });
  const latest = h("tbody");
  const spec = h("pre", { id: "spec" }), command = h("pre", { id: "command" });
  const env = h("pre", { id: "runtime-env" }), script = h("pre", { id: "script" });
  const log = h("pre", { id: "log", class: "log", hidden: true });
  const noLog = empty("No log yet: it appears once the job prints.");
  noLog.id = "no-log";

  root.append(
    h("div", { class: "run-head" }, title, h("p", {}, status, " ", health, " ", progress, " ", saved, " ", cluster, " ", cancel, " ", yieldButton, " ", clone, " ", samples, " ", pin), versusBaseline, stopNote, retry, queue, budget),
    h("div", { class: "toolbar" }, picker),
    charts,
    h("section", { id: "startup-section" }, h("h3", {}, "Start-up"), startup, startupNote),
    h("section", { id: "step-time" }, h("h3", {}, "Where a step's time goes"), verdict, stepNotes, change, stepChart),
    h("div", { class: "columns" },
      h("section", {}, h("h3", {}, "Status timeline"), timeline),
      h("section", {}, h("h3", {}, "Latest metrics"), h("table", { id: "latest" }, latest))),
    h("h3", {}, "Log"), noLog, log,
    h("details", { open: true }, h("summary", {}, "Command"), command),
    h("details", {}, h("summary", {}, "Spec"), spec),
    h("details", {}, h("summary", {}, "Runtime env"), env),
    h("details", {}, h("summary", {}, "Bash script (ray job submit)"), script),
  );

  const plots = new Map();
  const extra = new Set();
  let keys = [];
  signal.addEventListener("abort", () => plots.forEach((c) => c.destroy()));

  cancel.addEventListener("click", async () => {
    if (!confirm(`Cancel run ${id}?`)) return;
    try { render(await postJSON(`${path}/cancel`, undefined, signal)); } catch (err) { showError(err); }
  });
  yieldButton.addEventListener("click", async () => {
    const within = prompt(`Stop run ${id} at its next checkpoint, or after how many seconds at most?`, "1800");
    if (within === null) return;
    const body = { at: "next_checkpoint", within_s: Number(within) };
    try { render(await postJSON(`${path}/cancel`, body, signal)); } catch (err) { showError(err); }
  });
  // Who may pin: an admin, or a member of the run's team (GET /whoami, read once).
  const me = getJSON("/whoami", signal).catch(() => null);
  pin.addEventListener("click", async () => {
    const pinned = current && current.baseline && current.baseline.is_baseline;
    try {
      if (pinned) await remove(`${path}/baseline`, signal);
      else await putJSON(`${path}/baseline`, undefined, signal);
    } catch (err) { showError(err); }
    reload();
  });
  picker.addEventListener("change", () => {
    if (picker.value) extra.add(picker.value);
    picker.value = "";
    reload();
  });

  function render(run) {
    title.replaceChildren(run.name, " ", h("small", { class: "mono" }, run.id));
    status.textContent = run.status;
    status.className = `badge ${run.status}`;
    health.replaceChildren(run.health.status === "ok" ? h("span", { class: "healthy" }, "healthy")
      : h("span", { class: "unhealthy" }, `${run.health.status}: ${run.health.reason || ""}`));
    const told = retryNote(run);
    retry.hidden = !told;
    retry.textContent = told;
    queue.hidden = !run.queue_reason;
    queue.textContent = run.queue_reason ? `waiting: ${run.queue_reason}` : "";
    const wait = run.budget_wait;
    budget.hidden = !wait;
    budget.replaceChildren(...(wait ? ["waits for budget: ", h("strong", { id: "over-by" }, `${hours(wait.over_by_hours)} ${wait.accelerator}-hours over`),
      ` its team's ${hours(wait.budget_hours)} for ${wait.month} (used ${hours(wait.used_hours)}); an admin may let it through`] : []));
    progress.replaceChildren(run.progress.step === null ? "" : "step ", progressCell(run.progress));
    cluster.textContent = run.cluster ? `on cluster ${run.cluster}` : "";
    cancel.hidden = TERMINAL.has(run.status) || run.stop_requested;
    yieldButton.hidden = !["SUBMITTED", "RUNNING"].includes(run.status) || run.stop_requested || run.stop !== null;
    saved.textContent = run.checkpoint ? `checkpoint: step ${run.checkpoint.step}` : "";
    stopNote.hidden = !run.stop;
    stopNote.textContent = !run.stop ? "" : run.stop.saved_step !== null || run.stop_requested
      ? `${run.stop.reason}: stopped ${run.stop.saved_step !== null ? `at checkpoint step ${run.stop.saved_step}` : "with no checkpoint"}, ${run.stop.steps_lost ?? 0} steps lost`
      : `stops at its next checkpoint, by ${when(run.stop.by)} at the latest: ${run.stop.reason}`;
    const values = Object.entries(run.metrics.latest);
    latest.replaceChildren(...(values.length ? values.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, num(v))))
      : [h("tr", { class: "empty" }, h("td", { colspan: 2 }, "No metrics yet."))]));
    timeline.replaceChildren(...run.events.map((e) => h("li", { class: e.from_status === e.to_status ? `note${e.kind ? ` ${e.kind}` : ""}` : "move" },
      h("time", { datetime: e.at, title: e.at }, when(e.at)), " ",
      e.from_status === e.to_status ? "" : [badge(e.to_status), " "], e.reason,
      e.from_status && e.from_status !== e.to_status ? h("span", { class: "dim" }, ` (after ${since(lastAt(run.events, e), e.at)} ${e.from_status})`) : "")));
    renderStartup(run);
    renderBaseline(run);
    command.textContent = run.entrypoint;
    spec.textContent = JSON.stringify(run.spec, null, 2);
    env.textContent = JSON.stringify(run.runtime_env, null, 2);
  }

  // The run against its team's and recipe's baseline, and the pin or unpin its reader may do.
  function renderBaseline(run) {
    const b = run.baseline;
    const compare = b && !b.is_baseline ? `#/compare?runs=${encodeURIComponent(b.run_id)},${encodeURIComponent(run.id)}&baseline=${encodeURIComponent(b.run_id)}` : "";
    versusBaseline.hidden = !b;
    versusBaseline.replaceChildren(...(!b ? [] : b.is_baseline ? [`the baseline of team ${run.team}, recipe ${run.recipe}: its other runs show their difference from it`]
      : ["vs baseline ", link(`#/runs/${encodeURIComponent(b.run_id)}`, b.run_id), ": ", versus(b), " ", link(compare, "compare")]));
    me.then((who) => {
      pin.hidden = !who || !(who.role === "admin" || (who.role === "member" && who.team === run.team));
      pin.dataset.offered = String(!pin.hidden);  // decided: for a reader of the page
      pin.textContent = b && b.is_baseline ? "unpin baseline" : "pin as baseline";
      pin.title = b && b.is_baseline ? "no longer compare the team's other runs with it"
        : `compare the other ${run.recipe} runs of team ${run.team} with this one`;
    });
  }

  // The phases before the first step, each as wide as its share of the time; a phase whose
  // trace never came is shown as "not seen", never given a width it did not have.
  function renderStartup(run) {
    const phases = run.startup || [];
    const total = phases.reduce((t, p) => t + (p.seconds || 0), 0);
    startup.replaceChildren(...phases.map((p) => h("span", {
      class: `phase ${p.seen ? "seen" : "unseen"}`, dataset: { phase: p.phase },
      style: p.seen && total > 0 ? `flex-grow: ${Math.max(p.seconds / total, 0.02)}` : "flex-grow: 0.02",
      title: `${p.source}${p.note ? ` — ${p.note}` : ""}`,
    }, `${p.phase.replaceAll("_", " ")} `, h("strong", {}, p.seen ? `${num(p.seconds)} s` : "not seen"))));
    startupNote.textContent = run.time_to_first_step === null || run.time_to_first_step === undefined
      ? "no training step yet" : `first step ${num(run.time_to_first_step)} s after it was accepted`;
  }

  let stepPlot = null;
  signal.addEventListener("abort", () => stepPlot && stepPlot.destroy());
  async function drawStepTime() {
    const a = await getJSON(`${path}/step-time`, signal);
    verdict.replaceChildren(h("strong", { class: `verdict ${a.verdict}` }, a.verdict), ": ", a.summary);
    stepNotes.replaceChildren(...a.notes.map((n) => h("li", {}, n)));
    change.hidden = !a.change;
    change.replaceChildren(...(a.change ? ["change: ", h("strong", {}, a.change.summary),
      a.change.plan.feasible_now ? " (fits now) " : " (fits the cluster, not now) ",
      link(`#/submit?from=${encodeURIComponent(id)}&split=1`, "submit it as a new run")] : []));
    if (!a.steps.length) return;
    if (!stepPlot) stepPlot = new Chart(stepChart, "step time", { yLabel: "seconds" });
    const parts = ["wait", "update", "sync", "other"];
    const labels = { wait: "wait for samples", update: "update", sync: "weight sync", other: "other" };
    stepPlot.draw(parts.map((p, i) => ({ label: labels[p], stroke: COLORS[i % COLORS.length] })),
      [a.steps.map((s) => s.step), ...parts.map((p) => a.steps.map((s) => s[p]))]);
  }

  async function drawCharts() {
    const validation = keys.filter((k) => k.startsWith("val-core/"));
    const groups = [
      { title: "reward", yLabel: "score", keys: REWARD, band: true },
      { title: "validation", yLabel: "accuracy", keys: validation },
      ...FIXED,
      ...[...extra].map((k) => ({ title: k, yLabel: k.split("/").slice(-2).join("/"), keys: [k] })),
    ].map((g) => ({ ...g, keys: g.keys.filter((k) => keys.includes(k)) })).filter((g) => g.keys.length);
    const wanted = [...new Set(groups.flatMap((g) => g.keys))];
    if (!wanted.length) return;
    const data = await getJSON(`${path}/metrics?keys=${encodeURIComponent(wanted.join(","))}&max_points=500`, signal);
    if (!plots.size) charts.replaceChildren();
    // Where each later attempt began: the step it resumed from (a start from scratch: 0).
    const markers = (current ? current.attempts : []).filter((a) => a.n > 1 && a.resumed_from_step !== null)
      .map((a) => ({ step: a.resumed_from_step, label: `attempt ${a.n}` }));
    for (const group of groups) {
      if (!plots.has(group.title)) plots.set(group.title, new Chart(charts, group.title, { yLabel: group.yLabel }));
      plots.get(group.title).mark(markers);
      const lists = group.keys.map((k) => data.series[k] || []);
      if (group.band && group.keys[0] === REWARD[0]) {
        // The mean, bold, over a faint band between max and min (each downsampled point keeps
        // its bucket's extremes): the band shows the spread without hiding the mean.
        const [steps, mean, max, min] = align(lists);
        const series = [{ label: "mean", stroke: COLORS[0], width: 2.5 }];
        const columns = [steps, mean];
        if (max) { series.push({ label: "max", stroke: BAND_EDGE, width: 1 }); columns.push(max); }
        if (min) { series.push({ label: "min", stroke: BAND_EDGE, width: 1 }); columns.push(min); }
        const bands = max && min ? [{ series: [2, 3], fill: BAND_FILL }] : [];
        plots.get(group.title).draw(series, columns, bands);
      } else {
        plots.get(group.title).draw(group.keys.map((k, i) => ({ label: shortKey(k), stroke: COLORS[i % COLORS.length] })), align(lists));
      }
    }
  }

  let logOffset = null;
  const ansiState = { classes: [] };
  async function readLog() {
    const query = logOffset === null ? "ansi=true&tail=200" : `ansi=true&offset=${logOffset}`;
    const { text, headers } = await getText(`${path}/logs?${query}`, signal);
    logOffset = Number(headers.get("Log-Offset") || 0);
    if (!text) return headers.get("Log-Complete") === "true";
    log.hidden = false;
    noLog.hidden = true;
    const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(...ansiSpans(text, ansiState));
    while (log.childNodes.length > LOG_LINES) log.firstChild.remove();
    if (stick) log.scrollTop = log.scrollHeight;
    return headers.get("Log-Complete") === "true";
  }

  // The run as last read; metrics events update it in place (they carry step and values).
  let current = null;
  function addKeys(more) {
    const known = new Set([...picker.options].map((o) => o.value));
    const fresh = more.filter((k) => !known.has(k));
    picker.append(...fresh.map((k) => h("option", { value: k }, k)));
    keys = [...new Set([...keys, ...more])].sort();
  }
  function applyMetrics({ values }) {
    if (!current) return;
    addKeys(Object.keys(values));
    for (const [k, v] of Object.entries(values)) if (k in current.metrics.latest) current.metrics.latest[k] = v;
    const version = values[current.progress.key || config.step_key];
    if (typeof version === "number") current.progress.step = version;
    render(current);
  }

  let running = null, again = false;
  async function reload() {
    if (running) { again = true; return; }
    running = (async () => {
      try {
        current = await getJSON(`${path}?baseline=true`, signal);
        render(current);
        addKeys(await getJSON(`${path}/metrics/keys`, signal));
        await drawCharts();
        await drawStepTime();
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) root.replaceChildren(h("p", { class: "error" }, `no run ${id}`));
        else showError(err);
      }
    })();
    await running;
    running = null;
    if (again && !signal.aborted) { again = false; reload(); }
  }

  (async () => {
    await reload();
    getText(`${path}/script`, signal).then(({ text }) => { script.textContent = text; }, showError);
    // Live, from the stream's own payloads: a metrics event updates the run in place and the
    // charts at most every 2 s (one request for all of them); a status event re-reads the run
    // (debounced). The stream's end is final. It starts "now": the run was just read whole.
    let pending = null, chartsDue = null;
    const schedule = () => { pending = pending || setTimeout(() => { pending = null; reload(); }, 400); };
    const onEvent = (event) => {
      if (event.kind === "metrics") {
        applyMetrics(event.data);
        chartsDue = chartsDue || setTimeout(() => { chartsDue = null; drawCharts().catch(showError); }, 2000);
      } else if (event.kind === "status") schedule();
    };
    subscribe(`${path}/events?since=now`, onEvent, signal).then(() => { if (!signal.aborted) reload(); });
    // Log lines that are not metric lines come with no event: read on while the run is active.
    const tick = async () => {
      if (signal.aborted) return;
      const done = await readLog().catch(() => false);
      if (!done) setTimeout(tick, 2000);
    };
    tick();
  })();
}

function lastAt(events, event) {
  const before = events.filter((e) => e.id < event.id && e.from_status !== e.to_status);
  return before.length ? before[before.length - 1].at : events[0].at;
}

const shortKey = (key) => key.replace(/^fully_async\//, "").replace(/^val-core\//, "");
