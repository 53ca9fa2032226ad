// #/cluster: every cluster (up or down, capacity, labels, teams), then the primary cluster's
// nodes (address, capacity, who holds what there), the runs holding resources, jobs outside the
// service, teams against quotas and node groups, the queue.
import { every, getJSON } from "./api.js";
import { badge, h, link, table } from "./ui.js";

const runLink = (id, name) => link(`#/runs/${encodeURIComponent(id)}`, name || id);

function meter(free, total, label) {
  const used = total - free;
  return h("span", { class: "meter" },
    h("progress", { max: total || 1, value: used }),
    ` ${fmt(used)} used / ${fmt(total)} ${label} (${fmt(free)} free)`);
}
const fmt = (n) => String(+Number(n || 0).toFixed(1));
const accelerator = (resources) => (resources.GPU && !resources.NPU ? "GPU" : "NPU");
const held = (r) => {
  const acc = accelerator(r);
  const parts = [r[acc] ? `${fmt(r[acc])} ${acc}` : "", r.CPU ? `${fmt(r.CPU)} CPU` : ""].filter(Boolean);
  return parts.join(", ") || "—";
};
const started = (ms) => (ms ? new Date(ms).toLocaleString() : "");

function holderCell(node) {
  if (!node.holders.length) return h("span", { class: "dim" }, "nothing held");
  return h("ul", { class: "holders" }, node.holders.map((x) => h("li", { dataset: { holder: x.id, kind: x.kind } },
    x.kind === "run" ? runLink(x.id, x.name) : h("span", { class: "unmanaged mono", title: "a job outside rlrun" }, x.id),
    ` ${held(x.resources)}`,
    x.team ? h("span", { class: "dim" }, ` (${x.team})`) : x.kind === "unmanaged" ? h("span", { class: "dim" }, " (outside rlrun)") : "")));
}

const capacityCell = (c) => (c.capacity === null
  ? h("span", { class: "dim" }, c.health.up ? "cannot be read" : "—")
  : Object.entries(c.capacity).map(([acc, n]) => meter(n.free, n.total, acc)));
const healthCell = (c) => h("span", { class: c.health.up ? "healthy" : "unhealthy" },
  `${c.health.up ? "up" : "down"} since ${new Date(c.health.since).toLocaleTimeString()}`);

export function clusterView(root, params, signal) {
  const clusters = table("clusters", ["cluster", "health", "capacity", "accelerator", "labels", "teams", "verl", "active runs"], "no cluster declared");
  const nodes = table("nodes", ["node", "address", "group", "accelerators", "CPUs", "memory", "held by"], "no node reported yet");
  const active = table("active", ["run", "id", "team", "status", "priority", "accelerators", "groups"], "nothing yet: no run holds resources");
  const outside = table("unmanaged", ["job", "type", "status", "holds", "started", "command"], "nothing yet: every job on the cluster is a run of rlrun");
  const teams = table("teams", ["turn", "team", "held", "quota", "recently", "fair share"], "nothing yet: no team holds or queues accelerators");
  const groups = table("team-nodes", ["team", "node group", "nodes"], "no team is mapped to nodes: every node is shared");
  const queue = table("queue", ["#", "run", "id", "team", "priority", "accelerators", "reason"], "nothing yet: the queue is empty");
  const status = h("p", { id: "cluster-status" });
  const primary = h("h2", { id: "primary-cluster" }, "Cluster");
  root.append(
    h("h2", {}, "Clusters"), clusters.node,
    primary, status,
    h("h3", {}, "Nodes"),
    h("p", { class: "note" }, "Who holds what on a node is Ray's own report (the placement groups and actors of each job); a run admitted but not yet placed by Ray shows under runs only."),
    nodes.node,
    h("h3", {}, "Runs holding resources"), active.node,
    h("h3", {}, "Jobs outside rlrun"),
    h("p", { class: "note" }, "Jobs on the cluster that are no runs of the service; their accelerators count as taken."),
    outside.node,
    h("h3", {}, "Teams"), teams.node,
    h("h3", {}, "Nodes per team"), groups.node,
    h("h3", {}, "Queue"), queue.node,
  );
  every(3000, async () => {
    const [view, all] = await Promise.all([getJSON("/cluster", signal), getJSON("/clusters", signal)]);
    // GET /cluster is the first cluster's view (the primary).
    if (all.clusters.length > 1) primary.textContent = `Cluster ${all.clusters[0].name} (the primary)`;
    clusters.fill(all.clusters.map((c) => h("tr", { dataset: { cluster: c.name, up: String(c.health.up) } },
      h("td", { class: "mono" }, c.name), h("td", { class: "cluster-health" }, healthCell(c)),
      h("td", {}, capacityCell(c)), h("td", {}, c.accelerator || "—"),
      h("td", {}, Object.entries(c.labels).map(([k, v]) => `${k}=${v}`).join(", ")),
      h("td", {}, c.teams === null ? "every team" : c.teams.join(", ")),
      h("td", {}, c.verl_versions.join(", ") || "any"), h("td", {}, String(c.active_runs)))));
    status.textContent = view.ray.ok ? "" : "Ray cannot be read: the queue reasons are the last known ones.";
    nodes.fill(view.nodes.map((n) => {
      const kind = accelerator(n.total);
      return h("tr", { dataset: { node: n.id } },
        h("td", { class: "mono", title: n.id }, n.hostname && n.hostname !== n.address ? n.hostname : `${n.id.slice(0, 12)}…`),
        h("td", { class: "mono node-address" }, n.address || "unknown"),
        h("td", {}, n.group || h("span", { class: "dim" }, "shared")),
        h("td", {}, meter(n.available[kind] || 0, n.total[kind] || 0, kind)),
        h("td", {}, meter(n.available.CPU || 0, n.total.CPU || 0, "CPU")),
        h("td", {}, n.total.memory ? `${fmt((n.available.memory || 0) / 2 ** 30)} of ${fmt(n.total.memory / 2 ** 30)} GiB free` : ""),
        h("td", { class: "node-holders" }, holderCell(n)));
    }));
    active.fill(view.active.map((r) => h("tr", { dataset: { id: r.id } },
      h("td", {}, runLink(r.id, r.name)), h("td", { class: "mono" }, r.id), h("td", {}, r.team), h("td", {}, badge(r.status)),
      h("td", {}, r.priority), h("td", {}, `${r.accelerators} ${r.shape.accelerator}`),
      h("td", {}, r.shape.groups.map((g) => `${g.role} ${g.accelerators}`).join(", ")))));
    outside.fill(view.unmanaged.map((j) => h("tr", { dataset: { id: j.id } },
      h("td", { class: "mono" }, j.id), h("td", {}, j.type), h("td", {}, badge(j.status)),
      h("td", {}, held(j.resources)), h("td", {}, started(j.start_time_ms)),
      h("td", { class: "mono" }, j.entrypoint === null ? h("span", { class: "dim" }, "shown to admins") : j.entrypoint))));
    // Teams in their fair-share turn (1: served first within a priority class).
    teams.fill(Object.entries(view.teams).map(([team, t]) => h("tr", { dataset: { team } },
      h("td", {}, t.turn === undefined ? "" : String(t.turn)),
      h("td", {}, team),
      h("td", {}, t.quota ? meter(t.quota - t.accelerators, t.quota, "accelerators") : `${t.accelerators} accelerators`),
      h("td", {}, t.quota === null || t.quota === undefined ? "unlimited" : String(t.quota)),
      h("td", { title: "accelerators held on average lately (usage decayed with its half-life)" }, t.recent === undefined ? "" : `${Number(t.recent).toFixed(1)} accelerators`),
      h("td", { class: "standing" }, t.standing === undefined ? "" : Number(t.standing).toFixed(2)))));
    groups.fill(Object.entries(view.team_nodes).map(([team, group]) => {
      const members = view.nodes.filter((n) => n.group === group).map((n) => n.address || n.id.slice(0, 12));
      return h("tr", { dataset: { team } },
        h("td", {}, team === "*" ? "every other team" : team), h("td", {}, group),
        h("td", { class: "mono" }, members.length ? members.join(", ") : h("span", { class: "dim" }, "no node of this group")));
    }));
    queue.fill(view.queue.map((q) => h("tr", { dataset: { id: q.id } },
      h("td", {}, String(q.position + 1)), h("td", {}, runLink(q.id, q.name)), h("td", { class: "mono" }, q.id),
      h("td", {}, q.team), h("td", {}, q.priority), h("td", {}, String(q.accelerators)),
      h("td", { class: "queue-reason" }, q.reason || ""))));
  }, signal);
}
