// The console's Usage page: the usage ledger's last days per agent (tokens and cost), drawn as
// a stacked bar chart in plain SVG (one bar a day, one colour an agent), with today's budgets
// and the rows as a table. Every name is set as text; the chart is built element by element.
"use strict";

const USAGE_EVERY_MS = 10000; // the ledger is read again at most this often while shown
const COLOURS = ["#3558d6", "#1f7a3d", "#a86500", "#7a4fb5", "#b3261e", "#0f7c8c", "#6b7383", "#c2185b"];
const TOKEN_KEYS = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"];

function tokensOf(row) {
  return TOKEN_KEYS.reduce((sum, key) => sum + (Number(row[key]) || 0), 0);
}

function count(n) {
  return Number(n || 0).toLocaleString("en-US");
}

function money(value) {
  return value === null || value === undefined ? "?" : `$${Number(value).toFixed(4)}`;
}

async function renderUsage(force) {
  const now = Date.now();
  if (!force && renderUsage.at && now - renderUsage.at < USAGE_EVERY_MS) return;
  renderUsage.at = now;
  const days = document.getElementById("usage-days").value || "30";
  const data = await getJSON(`/api/usage?days=${encodeURIComponent(days)}`);
  const agents = [...new Set(data.rows.map((r) => text(r.agent)))].sort();
  document.getElementById("usage-chart").replaceChildren(usageChart(data, agents));
  document.getElementById("usage-budgets").replaceChildren(...budgetCards(data));
  document.getElementById("usage-table").replaceChildren(usageTable(data.rows));
}

// One bar a day, stacked by agent; each segment says its figures in its title (on hover).
function usageChart(data, agents) {
  const width = 760, height = 220, left = 64, bottom = 24, top = 10;
  const byDay = {};
  for (const r of data.rows) {
    const day = (byDay[r.day] = byDay[r.day] || {});
    const agent = (day[r.agent] = day[r.agent] || { tokens: 0, cost: 0, unknown: false });
    agent.tokens += tokensOf(r);
    if (r.cost_usd === null) agent.unknown = true;
    else agent.cost += r.cost_usd;
  }
  const totals = data.days.map((d) => Object.values(byDay[d] || {}).reduce((s, a) => s + a.tokens, 0));
  const most = Math.max(1, ...totals);
  const slot = (width - left) / Math.max(1, data.days.length);
  const scale = (height - bottom - top) / most;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart", "data-days": data.days.length });
  chart.append(svg("title", {}, `Tokens a day, last ${data.days.length} days, by agent`));
  chart.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }));
  chart.append(svg("text", { x: left - 6, y: top + 10, "text-anchor": "end", class: "tick" }, count(most)));
  chart.append(svg("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "tick" }, "0"));
  data.days.forEach((day, i) => {
    let y = height - bottom;
    agents.forEach((agent, n) => {
      const figures = (byDay[day] || {})[agent];
      if (!figures || !figures.tokens) return;
      const h = Math.max(1, figures.tokens * scale);
      y -= h;
      const cost = figures.unknown ? "cost unknown" : money(figures.cost);
      chart.append(
        svg(
          "rect",
          { x: left + i * slot + 1, y, width: Math.max(1, slot - 2), height: h, fill: COLOURS[n % COLOURS.length], "data-agent": agent, "data-day": day },
          svg("title", {}, `${agent} ${day}: ${count(figures.tokens)} tokens, ${cost}`)
        )
      );
    });
    if (i === 0 || i === data.days.length - 1 || i === Math.floor(data.days.length / 2)) {
      chart.append(svg("text", { x: left + i * slot + slot / 2, y: height - 6, "text-anchor": "middle", class: "tick" }, day.slice(5)));
    }
  });
  // the swatches are SVG too: the page's policy allows no inline style
  const legend = el("div", { class: "legend" }, ...agents.map((agent, n) =>
    el("span", {}, svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: COLOURS[n % COLOURS.length] })), agent)));
  return el("div", {}, chart, legend);
}

function budgetLine(unit, figures) {
  if (!figures) return "";
  const show = unit === "usd" ? money : (n) => `${count(n)} tokens`;
  const used = show(figures.used);
  return figures.limit === null || figures.limit === undefined
    ? `${used} (no budget)`
    : `${used} of ${show(figures.limit)} (${show(figures.left)} left)`;
}

function budgetCards(data) {
  const entries = Object.entries(data.today || {});
  if (data.host && data.host.tokens) entries.push(["all agents", data.host]);
  return entries.map(([name, today]) =>
    el(
      "div",
      { class: "card", "data-budget": name },
      el("div", { class: "head" }, el("h2", { text: name }), el("span", { class: "muted", text: text(today.day) })),
      el("dl", {},
        el("dt", { text: "tokens today" }), el("dd", { text: budgetLine("tokens", today.tokens) }),
        el("dt", { text: "cost today" }), el("dd", { text: budgetLine("usd", today.usd) }))
    )
  );
}

function usageTable(rows) {
  const head = ["day", "agent", "model", "calls", "silent", "input", "output", "cache read", "cache write", "cost"];
  const body = [...rows].reverse().map((r) =>
    el("tr", {},
      ...[r.day, r.agent, r.model].map((v) => el("td", { text: text(v) })),
      ...[r.calls, r.silent_turns, ...TOKEN_KEYS.map((k) => r[k])].map((v) => el("td", { class: "num", text: count(v) })),
      el("td", { class: "num", text: money(r.cost_usd) }))
  );
  if (!body.length) body.push(el("tr", {}, el("td", { colspan: head.length, class: "muted", text: "no model calls recorded" })));
  return el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))), el("tbody", {}, ...body));
}

// -- what the model saw -----------------------------------------------------------------------
async function openRequest(agent) {
  const view = document.getElementById("request-view");
  const answer = await getJSON(`/api/agents/${encodeURIComponent(agent)}/request`);
  const seen = answer.request;
  const facts = document.getElementById("request-facts");
  const body = document.getElementById("request-body");
  document.getElementById("request-title").textContent = `What ${agent}'s model saw`;
  if (!seen) {
    facts.textContent = "no model call yet";
    body.textContent = "";
  } else {
    const fill = seen.input_tokens === null ? "tokens not counted yet"
      : `${count(seen.input_tokens)} input tokens of its ${count(seen.context_budget)} context budget`;
    facts.textContent = `${text(seen.model)} · turn ${seen.turn}, round ${seen.round} · ${text(seen.at)} · ${fill}`
      + (seen.truncated ? ` · shown cut at 2 MiB of ${count(seen.bytes)} bytes` : "");
    body.textContent = text(seen.body);
  }
  if (!view.open) view.showModal();
}
