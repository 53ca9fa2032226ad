// The service's public API from the browser: JSON calls with the signed-in bearer token,
// problem+json errors as ApiError, and the event stream read over fetch (EventSource cannot
// send an Authorization header), resumed with Last-Event-ID.

export { TERMINAL } from "./config.js";
const TOKEN_KEY = "rlrun-token";

export const token = () => localStorage.getItem(TOKEN_KEY) || "";
export function setToken(value) {
  if (value) localStorage.setItem(TOKEN_KEY, value);
  else localStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const out = { ...extra };
  if (token()) out.Authorization = `Bearer ${token()}`;
  return out;
}

export class ApiError extends Error {
  constructor(status, problem) {
    super(`${status} ${problem.title || "error"}: ${problem.detail || ""}`);
    this.status = status;
    this.problem = problem;
    this.errors = Array.isArray(problem.errors) ? problem.errors : [];
  }
}

async function request(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: headers() };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (!resp.ok) {
    let problem;
    try { problem = await resp.json(); } catch { problem = { title: resp.statusText }; }
    throw new ApiError(resp.status, problem || {});
  }
  return resp;
}

export const getJSON = async (path, signal) => (await request(path, { signal })).json();
export const postJSON = async (path, body, signal) =>
  (await request(path, { method: "POST", body, signal })).json();
export const putJSON = async (path, body, signal) =>
  (await request(path, { method: "PUT", body, signal })).json();
export const patchJSON = async (path, body, signal) =>
  (await request(path, { method: "PATCH", body, signal })).json();
export async function remove(path, signal) { await request(path, { method: "DELETE", signal }); }
export async function getText(path, signal) {
  const resp = await request(path, { signal });
  return { text: await resp.text(), headers: resp.headers };
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});

function parseEvent(block) {
  let kind = "message", id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) kind = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    else if (line.startsWith("id:")) id = line.slice(3).trim();
  }
  if (!data.length && kind === "message") return null;  // a keep-alive comment
  return { kind, id, data: data.length ? JSON.parse(data.join("\n")) : null };
}

// Calls onEvent({kind, id, data}) for each event of path until "end" or until signal aborts.
export async function subscribe(path, onEvent, signal) {
  let last = null;
  while (!signal.aborted) {
    try {
      const h = headers({ Accept: "text/event-stream" });
      if (last) h["Last-Event-ID"] = last;
      const resp = await fetch(path, { headers: h, signal });
      if (!resp.ok) throw new Error(`${path}: ${resp.status}`);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = parseEvent(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (!event) continue;
          if (event.id) last = event.id;
          onEvent(event);
          if (event.kind === "end") return;
        }
      }
    } catch (err) {
      if (signal.aborted) return;
    }
    await sleep(1000, signal);
  }
}

// Runs fn now and every ms milliseconds until signal aborts; a failed round is retried next time.
export function every(ms, fn, signal) {
  const tick = async () => {
    if (signal.aborted) return;
    try { await fn(); } catch (err) { if (!signal.aborted) showError(err); }
    if (!signal.aborted) setTimeout(tick, ms);
  };
  tick();
}

export function showError(err) {
  if (err && err.name === "AbortError") return;
  const bar = document.getElementById("error-bar");
  bar.textContent = String(err && err.message ? err.message : err);
  bar.hidden = false;
}
