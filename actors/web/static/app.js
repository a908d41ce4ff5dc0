// The mcplive operator console. Everything a server, a sender or an agent wrote is set as text
// (textContent, never markup), and the page builds its elements one by one.
"use strict";

const ACTION_KEY = document.querySelector('meta[name="mcplive-action-key"]').content;
const MAX_ROWS = 2000; // transcript rows kept on the page; the oldest go first
const POLL_MS = 2000;

const state = {
  page: "transcript",
  lastSeq: 0,
  agents: [],
  filter: "",
  historyMore: null,
  historyShown: false,
  following: true, // the transcript keeps to its newest line (until the operator scrolls up)
  unseen: 0, // lines that arrived below while the operator looked further up
  channels: [], // the host's registered channels, for the drafts' destination pickers
  picks: {}, // the destination chosen per draft ("agent/draft": value), kept across redraws
  fleet: false, // the store is a fleet's PostgreSQL database: the Servers page shows its hosts
};

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child);
  return node;
}

function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

function toast(message) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => box.classList.remove("show"), 3500);
}

async function getJSON(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

async function act(path, body) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", "x-mcplive-action": ACTION_KEY },
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    toast(text(answer.error) || `refused (${response.status})`);
    throw new Error(text(answer.error));
  }
  return answer;
}

// -- pages ------------------------------------------------------------------------------------
function show(page) {
  state.page = page;
  for (const button of document.querySelectorAll("nav button")) {
    button.classList.toggle("active", button.dataset.page === page);
  }
  for (const section of document.querySelectorAll(".page")) {
    section.classList.toggle("active", section.id === `page-${page}`);
  }
  if (page === "history" && !state.historyShown) loadHistory(false); // the newest, at once
  if (page === "usage") renderUsage(true).catch(() => toast("the usage ledger could not be read"));
  if (page === "transcript" && state.following) toTail(); // what came meanwhile, at once
  refresh();
}

async function refresh() {
  try {
    const [agents, channels] = await Promise.all([getJSON("/api/agents"), getJSON("/api/channels")]);
    state.agents = agents;
    state.channels = channels;
    for (const picker of document.querySelectorAll("select.destination")) fillPicker(picker);
    renderSummary(agents);
    if (state.page === "agents") renderAgents(agents);
    if (state.page === "servers") renderServers(await getJSON("/api/servers"));
    if (state.page === "servers" && state.fleet) renderFleet(await getJSON("/api/fleet"));
    if (state.page === "channels") renderChannels(channels);
    if (state.page === "usage") await renderUsage(false);
  } catch (error) {
    document.getElementById("link").textContent = "the host does not answer";
  }
}

function chip(value) {
  return el("span", { class: `chip s-${text(value)}`, text: text(value) });
}

function renderSummary(agents) {
  const box = document.getElementById("summary");
  box.replaceChildren(
    ...agents.map((a) => el("div", { class: "row" }, el("span", { text: a.name }), chip(a.state)))
  );
}

function usageLine(usage) {
  const u = usage || {};
  const parts = [`in ${u.input_tokens || 0}`, `out ${u.output_tokens || 0}`];
  parts.push(`cache read ${u.cache_read_input_tokens || 0}`);
  parts.push(`cache write ${u.cache_creation_input_tokens || 0}`);
  return parts.join(" · ");
}

function contextFill(seen) {
  if (!seen) return "no model call yet";
  if (seen.input_tokens === null) return `turn ${seen.turn}: waiting for its reply`;
  const share = seen.context_budget ? Math.round((100 * seen.input_tokens) / seen.context_budget) : 0;
  return `${seen.input_tokens} of ${seen.context_budget} tokens (${share} %) in turn ${seen.turn}`;
}

function foldsLine(folds) {
  if (!folds || !folds.length) return "none since the host started";
  const last = folds[folds.length - 1];
  const what = last.summaries ? `merged ${last.summaries} summaries` : `folded ${text(last.messages)} messages`;
  return `${folds.length} (last: ${what} at ${timeOf(last.ts)})`;
}

function renderAgents(agents) {
  const cards = agents.map((a) => {
    const held = a.state === "held" || a.state === "paused";
    const toggle = held
      ? el("button", { onclick: () => agentAction(a.name, "resume"), text: "Resume" })
      : el("button", { onclick: () => agentAction(a.name, "pause"), text: "Pause" });
    const turns = (a.turn_usage || []).slice(-5).reverse();
    const drafts = (a.drafts || []).map((d) =>
      el(
        "li",
        { "data-draft": text(d.id) },
        el("span", { class: "muted", text: `[${text(d.id)}] ${text(d.reason)} ` }),
        el("span", { text: text(d.text) }),
        draftControls(a.name, text(d.id), Boolean(d.place))
      )
    );
    return el(
      "div",
      { class: "card", "data-agent": a.name },
      el("div", { class: "head" }, el("h2", { text: a.name }), chip(a.state), toggle),
      el(
        "dl",
        {},
        el("dt", { text: "queued wakes" }), el("dd", { text: text(a.queued) }),
        el("dt", { text: "turns" }), el("dd", { text: text(a.turns) }),
        el("dt", { text: "last turn" }),
        el("dd", { text: a.last_turn_at ? `${dateTimeOf(a.last_turn_at)} (${text(a.last_outcome)})` : "none yet" }),
        el("dt", { text: "paused" }), el("dd", { text: a.paused ? text(a.paused) : "no" }),
        el("dt", { text: "model" }), el("dd", { text: text(a.last_request ? a.last_request.model : a.model) }),
        el("dt", { text: "context" }), el("dd", { text: contextFill(a.last_request) }),
        el("dt", { text: "folds" }), el("dd", { text: foldsLine(a.folds) }),
        el("dt", { text: "usage (all)" }), el("dd", { text: usageLine(a.usage) })
      ),
      el("button", { class: "request", onclick: () => openRequest(a.name), text: "What the model saw" }),
      turns.length ? el("h2", { text: "Last turns" }) : null,
      turns.length ? el("ol", {}, ...turns.map((t) => el("li", { class: "muted", text: `${timeOf(t.ts)} · ${usageLine(t)}` }))) : null,
      drafts.length ? el("h2", { text: "Drafts" }) : null,
      drafts.length ? el("ol", {}, ...drafts) : null
    );
  });
  document.getElementById("agents").replaceChildren(el("div", { class: "cards" }, ...cards));
}

function renderChannels(channels) {
  const names = [...new Set(channels.flatMap((c) => Object.keys(c.open_for || {})))];
  const head = el("tr", {}, ...["server", "channel", "label", "publish to", ...names].map((h) => el("th", { text: h })));
  const rows = channels.map((c) =>
    el(
      "tr",
      {},
      el("td", { text: text(c.server_id) }),
      el("td", { text: text(c.id) }),
      el("td", { text: text(c.label) }),
      el("td", { text: text(c.publish) }),
      ...names.map((n) => {
        const open = (c.open_for || {})[n];
        return el("td", {}, open === undefined ? "" : chip(open ? "open" : "closed"));
      })
    )
  );
  const table = channels.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)) : el("p", { class: "muted", text: "No channels registered." });
  document.getElementById("channels").replaceChildren(table);
}

async function agentAction(name, action) {
  await act(`/api/agents/${encodeURIComponent(name)}/${action}`);
  toast(`${name}: ${action === "pause" ? "paused" : "resumed"}`);
  refresh();
}

async function serverAction(id) {
  const answer = await act(`/api/servers/${encodeURIComponent(id)}/reconnect`);
  toast(`${id}: ${text(answer.reconnect)}`);
  refresh();
}

async function draftAction(agent, id, action, destination) {
  const body = {};
  if (destination) {
    const [serverId, channelId] = JSON.parse(destination);
    body.destination = channelId;
    body.server_id = serverId;
  }
  const path = `/api/agents/${encodeURIComponent(agent)}/drafts/${encodeURIComponent(id)}/${action}`;
  const answer = await act(path, body);
  if (answer.ok) delete state.picks[`${agent}/${id}`];
  toast(text(answer.result) || action);
  refresh();
}

// The channels a draft of `agent` may be resent to: the registered ones of the servers it hears.
function channelsOf(agent) {
  return state.channels.filter((c) => c.registered && Object.hasOwn(c.open_for || {}, agent));
}

// Fill a destination picker with the agent's channels, keeping what is chosen; the first option
// is the draft's own place (or, when it has none, a prompt to choose one).
function fillPicker(picker) {
  const agent = picker.dataset.agent;
  const choices = channelsOf(agent).map((c) => [JSON.stringify([c.server_id, c.id]), c]);
  const key = JSON.stringify(choices.map(([value]) => value));
  if (picker.dataset.choices === key) return;
  const chosen = state.picks[`${agent}/${picker.dataset.draft}`] || picker.value;
  const first = picker.dataset.placed === "1" ? "to its own place" : "choose a channel…";
  picker.replaceChildren(
    el("option", { value: "", text: first }),
    ...choices.map(([value, c]) => el("option", { value, text: `${text(c.label) || text(c.id)} (${text(c.server_id)})` }))
  );
  picker.value = choices.some(([value]) => value === chosen) ? chosen : "";
  picker.dataset.choices = key;
}

function draftControls(agent, id, placed) {
  const picker = el("select", {
    class: "small destination",
    "aria-label": "destination",
    "data-agent": agent,
    "data-draft": id,
    "data-placed": placed ? "1" : "0",
  });
  fillPicker(picker);
  picker.addEventListener("change", () => { state.picks[`${agent}/${id}`] = picker.value; });
  return el(
    "span",
    { class: "actions" },
    picker,
    el("button", { class: "small", onclick: () => draftAction(agent, id, "resend", picker.value), text: "Resend" }),
    el("button", { class: "small", onclick: () => draftAction(agent, id, "dismiss"), text: "Dismiss" })
  );
}

// -- the live transcript ----------------------------------------------------------------------
function timeOf(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? "" : d.toLocaleTimeString([], { hour12: false });
}

function dateTimeOf(ts) {
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? text(ts) : d.toLocaleString([], { hour12: false });
}

// Kinds whose line is the agent's own doing: the agent is named as their source.
const AGENT_KINDS = new Set(["published", "speech-held", "tool-call", "tool-result", "turn-usage",
  "local", "local-reply", "asleep", "awake", "turn-aborted", "agent-paused", "agent-resumed", "context-fold",
  "rolled-back", "model-retry", "turn-start", "error"]);

function sourceOf(r) {
  const first = AGENT_KINDS.has(r.kind) ? r.agent || r.server_id : r.server_id || r.agent;
  return text(first || "host");
}

function placeOf(r) {
  return [r.server_id, r.channel_id, r.agent].filter(Boolean).map(text).join(" · ") || "host";
}

function row(r) {
  const item = el(
    "li",
    { class: `k-${text(r.kind)} l-${text(r.level)}`, "data-agent": text(r.agent), "data-kind": text(r.kind) },
    el("span", { class: "time", text: timeOf(r.ts) }),
    el("span", { class: "src", title: placeOf(r), text: sourceOf(r) }),
    el("span", { class: "text", text: text(r.line) })
  );
  const draft = r.kind === "speech-held" && r.data && r.data.draft;
  if (draft && r.agent) item.lastChild.append(draftControls(text(r.agent), text(draft), Boolean(r.channel_id)));
  item.hidden = !visible(item);
  return item;
}

function visible(item) {
  return !state.filter || item.dataset.agent === state.filter || item.dataset.agent === "";
}

function addRecords(records) {
  const list = document.getElementById("transcript");
  let added = 0;
  for (const r of records) {
    if (typeof r.seq === "number") {
      if (r.seq <= state.lastSeq) continue;
      state.lastSeq = r.seq;
    }
    if (r.line === null || r.line === undefined) continue;
    const item = row(r);
    list.append(item);
    if (!item.hidden) added += 1;
  }
  while (list.childElementCount > MAX_ROWS) list.firstElementChild.remove();
  if (state.following) toTail();
  else if (added) {
    state.unseen += added;
    showUnseen();
  }
  if (!refreshSoon.timer) refreshSoon.timer = setTimeout(refreshSoon, 500);
}

// Following the tail: the transcript shows its newest line, also after a visit to another page
// (a hidden list cannot scroll; it is brought to its tail when shown again), unless the operator
// scrolled up to read: then new lines are counted on a button that brings them back to the tail.
function atTail(list) {
  return list.scrollTop + list.clientHeight >= list.scrollHeight - 40;
}

function toTail() {
  const list = document.getElementById("transcript");
  list.scrollTop = list.scrollHeight;
  state.following = true;
  state.unseen = 0;
  showUnseen();
}

function showUnseen() {
  const button = document.getElementById("new-lines");
  button.hidden = state.unseen === 0;
  button.textContent = `${state.unseen} new ${state.unseen === 1 ? "line" : "lines"} ↓`;
}

function onScroll() {
  const list = document.getElementById("transcript");
  if (list.clientHeight === 0) return; // hidden: another page is shown
  state.following = atTail(list);
  if (state.following && state.unseen) {
    state.unseen = 0;
    showUnseen();
  }
}

function refreshSoon() {
  refreshSoon.timer = null;
  refresh();
}

function follow(delay) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/api/feed`);
  const link = document.getElementById("link");
  socket.onopen = () => { link.textContent = "live"; delay = 1000; };
  socket.onmessage = (message) => addRecords(JSON.parse(message.data));
  socket.onclose = () => {
    link.textContent = "feed closed; retrying…";
    setTimeout(() => follow(Math.min(delay * 2, 30000)), delay);
  };
}

// -- history ----------------------------------------------------------------------------------
async function loadHistory(older) {
  const agent = document.getElementById("history-agent").value;
  const params = new URLSearchParams({ limit: "50" });
  for (const [key, id] of [["q", "history-q"], ["since", "history-since"], ["until", "history-until"]]) {
    const value = document.getElementById(id).value;
    if (value) params.set(key, value);
  }
  if (older && state.historyMore) params.set("before", state.historyMore);
  const path = agent ? `/api/history/${encodeURIComponent(agent)}` : "/api/history";
  let answer;
  try {
    answer = await getJSON(`${path}?${params}`);
  } catch (error) {
    toast(text(error.message));
    return;
  }
  const list = document.getElementById("history");
  const rows = answer.messages.map((m) =>
    el(
      "li",
      { "data-id": text(m.id), "data-agent": text(m.agent) },
      el("span", { class: "time", text: dateTimeOf(m.ts) }),
      el("span", { class: "src", text: text(m.agent) }),
      el("span", { class: "muted", text: text(m.role) }),
      el("span", { class: "muted id", text: text(m.id) }),
      el("span", { class: "text", text: text(m.line) })
    )
  );
  if (older) list.prepend(...rows);
  else list.replaceChildren(...rows);
  if (!older) list.scrollTop = list.scrollHeight;
  state.historyMore = answer.more;
  state.historyShown = true;
  document.getElementById("history-more").hidden = !answer.more;
}

// -- start ------------------------------------------------------------------------------------
async function start() {
  for (const button of document.querySelectorAll("nav button")) {
    button.addEventListener("click", () => show(button.dataset.page));
  }
  const info = await getJSON("/api/console");
  if (info.host_id) document.querySelector("nav .brand span").textContent = `console · ${info.host_id}`;
  state.fleet = Boolean(info.fleet);
  document.getElementById("history-agent").append(el("option", { value: "", text: "all agents" }));
  for (const id of ["compose-agent", "history-agent", "filter-agent"]) {
    const select = document.getElementById(id);
    for (const name of info.agents) select.append(el("option", { value: name, text: name }));
  }
  document.getElementById("filter-agent").addEventListener("change", (event) => {
    state.filter = event.target.value;
    for (const item of document.getElementById("transcript").children) item.hidden = !visible(item);
    if (state.following) toTail();
  });
  document.getElementById("transcript").addEventListener("scroll", onScroll);
  document.getElementById("new-lines").addEventListener("click", toTail);
  document.getElementById("compose").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = document.getElementById("compose-text");
    const agent = document.getElementById("compose-agent").value;
    if (!input.value.trim()) return;
    await act(`/api/agents/${encodeURIComponent(agent)}/post`, { text: input.value });
    input.value = "";
  });
  document.getElementById("history-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadHistory(false);
  });
  document.getElementById("history-more").addEventListener("click", () => loadHistory(true));
  document.getElementById("history-agent").addEventListener("change", () => loadHistory(false));
  document.getElementById("usage-days").addEventListener("change", () => renderUsage(true));
  document.getElementById("transcript").addEventListener("click", (event) => {
    const line = event.target.closest("li[data-kind='turn-usage']");
    if (line && line.dataset.agent) openRequest(line.dataset.agent);
  });
  follow(1000);
  refresh();
  setInterval(refresh, POLL_MS);
}

start();
