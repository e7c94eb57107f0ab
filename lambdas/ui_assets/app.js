// The skyfn status page: no build step, no framework. The token stays in sessionStorage;
// every datum comes from the REST API (GET /endpoints, GET /tasks) with that token, and
// live updates from the WebSocket API (skyfn.protocol.push). Where the APIs are comes from
// config.json beside this file: the same origin for the embedded runtime; in AWS the REST
// API's stage and the WebSocket API's own host. Data is only ever inserted as text (never
// as HTML).
"use strict";
// stages as skyfn/report/analysis.py reads them; RELEASED is the first QUEUED after WAITING
// (a task with inputs, once they all succeeded), and the wait is taken out of "service"
const STAGES = [["service", "CREATED", "QUEUED"], ["waiting", "WAITING", "RELEASED"], ["queue", "QUEUED", "DISPATCHED"],
  ["dispatch", "DISPATCHED", "RUNNING"], ["run", "RUNNING", "DONE"], ["return", "DONE", "STORED"]];
const STATES = ["CREATED", "WAITING", "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT",
  "CANCELLED"];  // skyfn.protocol.states.TaskState, in lifecycle order
const FINAL = new Set(["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"]);
const FIRST = new Set(["CREATED", "WAITING", ...FINAL]);  // the first of these counts; of the others, the last
const $ = (id) => document.getElementById(id);
const ui = { token: null, ws: null, pushes: 0, tasks: new Map(), refreshTimer: null, pollTimer: null,
  since: Date.now() / 1000 - 3600, endpoints: new Map(), apiBase: null, wsUrl: null };
window.skyfnUi = ui;  // the browser test reads its counters

async function configure() {
  let cfg = {};
  try {
    const r = await fetch("config.json", { cache: "no-cache" });
    if (r.ok) cfg = await r.json();
  } catch (err) { /* the defaults below: the APIs beside the page */ }
  // the page is <api>/ui/: the REST API is one level up (the stage in AWS, the root locally)
  ui.apiBase = new URL(cfg.api_url || "..", document.baseURI);
  if (cfg.ws_url === null) return;  // no WebSocket API: the 3 s refresh only
  const ws = new URL(cfg.ws_url || "/ws", location.href);
  ws.protocol = ws.protocol.replace(/^http/, "ws");
  ui.wsUrl = ws;
}

async function api(path) {
  const r = await fetch(new URL(path, ui.apiBase), { headers: { Authorization: "Bearer " + ui.token },
    cache: "no-store" });
  if (r.status === 401 || r.status === 403) throw Object.assign(new Error("token refused"), { auth: true });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function ms(v) { return v === null || v === undefined ? "" : v.toFixed(1); }

function stamps(events) {
  const out = {};
  for (const [state, ts] of events || []) {
    if (FIRST.has(state) && state in out) continue;
    if (state === "QUEUED" && "WAITING" in out && !("RELEASED" in out)) out.RELEASED = ts;
    out[state] = ts;
  }
  for (const f of FINAL) if (f in out) { out.FINAL = out[f]; if (!("STORED" in out)) out.STORED = out[f]; }
  return out;
}

function stageMs(st) {  // stage name -> ms, for the stages the task went through
  const out = {};
  for (const [name, a, b] of STAGES) if (a in st && b in st && st[b] >= st[a]) out[name] = (st[b] - st[a]) * 1000;
  if ("waiting" in out && "service" in out) out.service = Math.max(0, out.service - out.waiting);
  return out;
}

function renderStateCounts() {
  const counts = new Map();
  for (const t of ui.tasks.values()) counts.set(t.state, (counts.get(t.state) || 0) + 1);
  const known = STATES.filter((s) => counts.has(s));
  const others = [...counts.keys()].filter((s) => !STATES.includes(s)).sort();
  const line = $("state-counts");
  line.replaceChildren();
  for (const s of [...known, ...others]) {
    const span = document.createElement("span");
    span.className = "count state-" + s;
    span.dataset.state = s;
    span.dataset.count = String(counts.get(s));
    span.textContent = s + " " + counts.get(s);
    line.appendChild(span);
  }
}

function renderEndpoints(list) {
  const body = $("endpoints").tBodies[0];
  body.replaceChildren();
  for (const e of list) {
    ui.endpoints.set(e.endpoint_id, e.name);
    const m = e.metadata || {}, s = e.stats || {};
    const tr = document.createElement("tr");
    tr.dataset.endpoint = e.name;
    tr.dataset.status = e.status;
    cell(tr, e.name);
    cell(tr, e.status, e.status);
    cell(tr, s.manager_count ?? "");
    cell(tr, s.workers ?? m.workers ?? "");
    cell(tr, e.backlog ?? 0);
    const warm = s.warm_containers || {};
    cell(tr, typeof warm === "object" ? Object.entries(warm).map(([k, v]) => k + ":" + v).join(" ") : warm);
    cell(tr, e.last_heartbeat ? new Date(e.last_heartbeat * 1000).toLocaleTimeString() : "");
    body.appendChild(tr);
  }
}

function renderTasks() {
  const rows = [...ui.tasks.values()].sort((a, b) => b.created - a.created).slice(0, 500);
  const body = $("tasks").tBodies[0];
  body.replaceChildren();
  for (const t of rows) {
    const st = stamps(t.events);
    const tr = document.createElement("tr");
    tr.dataset.task = t.task_id;
    tr.dataset.state = t.state;
    cell(tr, t.task_id.slice(0, 8)).title = t.task_id;
    cell(tr, ui.endpoints.get(t.endpoint_id) || t.endpoint_id || "");
    cell(tr, t.state, "state-" + t.state);
    cell(tr, new Date(t.created * 1000).toLocaleTimeString());
    const stage = stageMs(st);
    for (const [name] of STAGES) cell(tr, ms(stage[name]), name === "waiting" ? "stage-waiting" : "");
    cell(tr, "FINAL" in st ? ms((st.FINAL - st.CREATED) * 1000) : "");
    body.appendChild(tr);
  }
  $("task-count").textContent = "(" + ui.tasks.size + ")";
  renderStateCounts();
  document.body.dataset.pushes = String(ui.pushes);
}

async function refresh() {
  try {
    const [eps, tasks] = await Promise.all([api("endpoints"),
      api("tasks?history=false&limit=500&since=" + ui.since.toFixed(3))]);
    renderEndpoints(eps.endpoints);
    for (const t of tasks.tasks) ui.tasks.set(t.task_id, t);
    renderTasks();
  } catch (err) {
    if (err.auth) return signOut("the service refused the token");
  }
}

function soon() {  // many pushes, one refresh
  if (!ui.refreshTimer) ui.refreshTimer = setTimeout(() => { ui.refreshTimer = null; refresh(); }, 250);
}

function connect() {
  if (!ui.token || !ui.wsUrl) return;
  // browsers cannot set headers on a WebSocket: the token goes in the query string, which
  // both the local gateway and the AWS $connect authorizer (lambdas/ws.py) read
  const url = new URL(ui.wsUrl);
  url.searchParams.set("token", ui.token);
  const ws = new WebSocket(url.href);
  ui.ws = ws;
  // peek: the page only shows states, so pushes delivered here never count as results
  // retrieved (they stay for whoever collects them); its GET /tasks refresh reads none
  ws.onopen = () => ws.send(JSON.stringify({ action: "subscribe", peek: true }));
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.type === "subscribed") { $("live").textContent = "live"; $("live").className = "live on"; return; }
    if (msg.type !== "done") return;
    ui.pushes += 1;
    for (const st of msg.tasks || []) {
      const t = ui.tasks.get(st.task_id);
      if (t) t.state = st.state;
    }
    renderTasks();
    soon();  // events and tasks not listed yet
  };
  ws.onclose = () => {
    $("live").textContent = "offline"; $("live").className = "live off";
    if (ui.token && ui.ws === ws) setTimeout(connect, 1000);
  };
}

async function signIn(token) {
  ui.token = token;
  try {
    await api("endpoints");
  } catch (err) {
    return signOut(err.auth ? "the service refused this token" : "the service is not reachable: " + err.message);
  }
  sessionStorage.setItem("skyfn-token", token);
  $("signin").hidden = true;
  $("dashboard").hidden = false;
  $("signout").hidden = false;
  $("signin-error").textContent = "";
  await refresh();
  connect();
  ui.pollTimer = setInterval(refresh, 3000);  // endpoint heartbeats and non-final states
}

function signOut(reason) {
  ui.token = null;
  sessionStorage.removeItem("skyfn-token");
  if (ui.ws) { const ws = ui.ws; ui.ws = null; ws.close(); }
  clearInterval(ui.pollTimer);
  ui.tasks.clear();
  $("endpoints").tBodies[0].replaceChildren();
  $("tasks").tBodies[0].replaceChildren();
  $("state-counts").replaceChildren();
  $("dashboard").hidden = true;
  $("signout").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = reason || "";
}

const configured = configure();
$("signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  await configured;
  if (token) signIn(token);
});
$("signout").addEventListener("click", () => signOut(""));
const kept = sessionStorage.getItem("skyfn-token");
if (kept) configured.then(() => signIn(kept));
