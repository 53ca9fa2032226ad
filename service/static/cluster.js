// #/cluster: nodes and their free capacity, which run holds what, teams against quotas, the queue.
import { every, getJSON } from "./api.js";
import { badge, h, link } from "./ui.js";

const runLink = (id, name) => link(`#/runs/${encodeURIComponent(id)}`, name || id);

function meter(free, total, label) {
  const used = total - free;
  return h("span", { class: "meter" },
    h("progress", { max: total || 1, value: used }),
    ` ${fmt(used)} used / ${fmt(total)} ${label} (${fmt(free)} free)`);
}
const fmt = (n) => String(+Number(n || 0).toFixed(1));

export function clusterView(root, params, signal) {
  const nodes = h("tbody"), active = h("tbody"), teams = h("tbody"), queue = h("tbody");
  const status = h("p", { id: "cluster-status" });
  const table = (id, heads, body) => h("table", { id }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), body);
  root.append(
    h("h2", {}, "Cluster"), status,
    h("h3", {}, "Nodes"), table("nodes", ["node", "accelerators", "CPUs", "memory"], nodes),
    h("h3", {}, "Runs holding resources"), table("active", ["run", "id", "team", "status", "priority", "accelerators", "groups"], active),
    h("h3", {}, "Teams"), table("teams", ["team", "held", "quota"], teams),
    h("h3", {}, "Queue"), table("queue", ["#", "run", "id", "team", "priority", "accelerators", "reason"], queue),
  );
  every(3000, async () => {
    const view = await getJSON("/cluster", signal);
    status.textContent = view.ray.ok ? "" : "Ray cannot be read: the queue reasons are the last known ones.";
    nodes.replaceChildren(...view.nodes.map((n) => {
      const kind = n.total.NPU ? "NPU" : n.total.GPU ? "GPU" : "NPU";
      return h("tr", { dataset: { node: n.id } },
        h("td", { class: "mono" }, n.id),
        h("td", {}, meter(n.available[kind] || 0, n.total[kind] || 0, kind)),
        h("td", {}, meter(n.available.CPU || 0, n.total.CPU || 0, "CPU")),
        h("td", {}, n.total.memory ? `${fmt((n.available.memory || 0) / 2 ** 30)} of ${fmt(n.total.memory / 2 ** 30)} GiB free` : ""));
    }));
    active.replaceChildren(...view.active.map((r) => h("tr", { dataset: { id: r.id } },
      h("td", {}, runLink(r.id, r.name)), h("td", { class: "mono" }, r.id), h("td", {}, r.team), h("td", {}, badge(r.status)),
      h("td", {}, r.priority), h("td", {}, `${r.accelerators} ${r.shape.accelerator}`),
      h("td", {}, r.shape.groups.map((g) => `${g.role} ${g.accelerators}`).join(", ")))));
    teams.replaceChildren(...Object.entries(view.teams).map(([team, t]) => h("tr", {},
      h("td", {}, team),
      h("td", {}, t.quota ? meter(t.quota - t.accelerators, t.quota, "accelerators") : `${t.accelerators} accelerators`),
      h("td", {}, t.quota === null || t.quota === undefined ? "unlimited" : String(t.quota)))));
    queue.replaceChildren(...view.queue.map((q) => h("tr", { dataset: { id: q.id } },
      h("td", {}, String(q.position + 1)), h("td", {}, runLink(q.id, q.name)), h("td", { class: "mono" }, q.id),
      h("td", {}, q.team), h("td", {}, q.priority), h("td", {}, String(q.accelerators)),
      h("td", { class: "queue-reason" }, q.reason || ""))));
  }, signal);
}
