// #/usage?from=YYYY-MM-DD&to=YYYY-MM-DD: accelerator-hours per team per day as stacked bars
// (uPlot), and a table per team, over a range picked by dates or a preset (GET /usage);
// read again every minute, as running runs add to today.
import { every, getJSON } from "./api.js";
import { COLORS, empty, h } from "./ui.js";

const DAY_MS = 86400e3;
const iso = (ms) => new Date(ms).toISOString().slice(0, 10);
const hours = (n) => String(+Number(n).toFixed(1));
// Teams beyond the palette are summed into one band, so the colours stay apart.
const SHOWN = COLORS.length - 1;

function range(params) {
  const to = params.get("to") || iso(Date.now() + DAY_MS);
  const from = params.get("from") || iso(Date.parse(to) - 30 * DAY_MS);
  return { from, to };
}

function picker({ from, to }) {
  const go = (f, t) => { location.hash = `#/usage?from=${f}&to=${t}`; };
  const start = h("input", { type: "date", id: "usage-from", value: from });
  const end = h("input", { type: "date", id: "usage-to", value: to });
  const apply = h("button", { type: "button", id: "usage-apply", onclick: () => go(start.value, end.value) }, "show");
  const preset = (days) => h("button", { type: "button", dataset: { days: String(days) },
    onclick: () => { const t = iso(Date.now() + DAY_MS); go(iso(Date.parse(t) - days * DAY_MS), t); } }, `last ${days} days`);
  return h("form", { class: "usage-range", onsubmit: (e) => { e.preventDefault(); go(start.value, end.value); } },
    h("label", {}, "from ", start), h("label", {}, " to (the day after the last) ", end), " ", apply, " ",
    preset(7), preset(30), preset(90), preset(365));
}

// Stacked: each band's top is the sum of the teams below it and itself; drawn top band first.
function stacked(days, teams, byTeamDay) {
  const x = days.map((d) => Date.parse(d) / 1000);
  let below = days.map(() => 0);
  const bands = teams.map((team) => {
    below = below.map((v, i) => v + (byTeamDay.get(team)?.get(days[i]) || 0));
    return below;
  });
  return [x, ...bands.reverse()];
}

function chart(holder, days, teams, byTeamDay) {
  const box = h("div", { class: "chart", dataset: { chart: "usage", series: String(teams.length), days: String(days.length) } });
  holder.append(box);
  const bars = uPlot.paths.bars({ size: [0.8, 40] });
  const series = [...teams].reverse().map((team, i) => {
    const color = COLORS[(teams.length - 1 - i) % COLORS.length];
    return { label: team, stroke: color, fill: color, paths: bars, points: { show: false }, width: 0,
      value: (u, v, s, idx) => (idx === null ? "" : hours(v - (u.data[s + 1]?.[idx] || 0))) };
  });
  const width = Math.max(480, holder.clientWidth - 4);
  box.plot = new uPlot({
    title: "accelerator-hours per day, by team", width, height: 320,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),  // days are UTC days
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.05)] } },
    axes: [{ label: "day (UTC)" }, { label: "accelerator-hours", size: 70 }],
    legend: { live: true },
    series: [{ label: "day", value: (u, v) => (v === null ? "" : iso(v * 1000)) }, ...series],
  }, stacked(days, teams, byTeamDay), box);
}

function table(rows, total) {
  const body = rows.length ? rows.map((r) => h("tr", { dataset: { team: r.team } },
    h("td", {}, r.team), h("td", { class: "num" }, hours(r.accelerator_hours)),
    h("td", { class: "num" }, total ? `${(100 * r.accelerator_hours / total).toFixed(1)} %` : ""),
    h("td", { class: "num" }, String(r.runs))))
    : [h("tr", { class: "empty" }, h("td", { colspan: 4, class: "dim" }, "nothing yet: no usage in this range"))];
  return h("table", { id: "usage-table" },
    h("thead", {}, h("tr", {}, ["team", "accelerator-hours", "share", "runs"].map((t) => h("th", {}, t)))),
    h("tbody", {}, body),
    h("tfoot", {}, h("tr", {}, h("th", {}, "total"), h("th", { class: "num", id: "usage-total" }, hours(total)), h("th", {}), h("th", {}))));
}

export function usageView(root, params, signal) {
  const { from, to } = range(params);
  const place = h("div", { id: "usage-chart" });
  const listing = h("div");
  root.append(h("h2", {}, "Usage"),
    h("p", { class: "note" }, "Accelerator-hours allocated (submitted to ended; running runs up to now), per UTC day."),
    picker({ from, to }), place, h("h3", {}, "By team"), listing);
  const query = (groups) => `/usage?from=${from}&to=${to}&${groups.map((g) => `group_by=${g}`).join("&")}&limit=10000`;
  // The whole report: its pages one after another (a month of a hundred teams is one).
  const whole = async (groups) => {
    const first = await getJSON(query(groups), signal);
    for (let page = first; page.next_cursor;) {
      page = await getJSON(`${query(groups)}&cursor=${encodeURIComponent(page.next_cursor)}`, signal);
      first.rows.push(...page.rows);
    }
    return first;
  };
  every(60_000, async () => {
    const [perDay, perTeam] = await Promise.all([whole(["team", "day"]), whole(["team"])]);
    const ranked = perTeam.rows.map((r) => r.team);
    const teams = ranked.length > SHOWN + 1 ? [...ranked.slice(0, SHOWN), "other teams"] : ranked;
    const bandOf = (team) => (teams.includes(team) ? team : "other teams");
    const byTeamDay = new Map(teams.map((t) => [t, new Map()]));
    for (const r of perDay.rows) {
      const cells = byTeamDay.get(bandOf(r.team));
      cells.set(r.day, (cells.get(r.day) || 0) + r.accelerator_hours);
    }
    const days = [];
    for (let at = Date.parse(from); at < Date.parse(to); at += DAY_MS) days.push(iso(at));
    place.querySelector(".chart")?.plot?.destroy();
    place.replaceChildren();
    if (ranked.length) chart(place, days, teams, byTeamDay);
    else place.append(empty("nothing yet: no usage in this range"));
    listing.replaceChildren(table(perTeam.rows, perTeam.total_accelerator_hours));
  }, signal);
}
