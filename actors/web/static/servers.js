// The console's Servers page: a card per server with its state, its grant, and the vitals a
// console running around the clock shows (uptime, traffic a minute as a small SVG chart,
// request latency, the last disconnects with their reasons, stderr with times), and on a fleet's
// PostgreSQL store the fleet: each host's last heartbeat and who holds each lease. Text only.
"use strict";

function duration(seconds) {
  const s = Math.max(0, Math.round(Number(seconds) || 0));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} days`;
}

function vitalsRows(v) {
  const lat = v.latency || {};
  const minutes = (v.per_minute && v.per_minute.in) || [];
  const last = minutes.length - 1;
  const traffic = last < 0 ? "no traffic yet"
    : `${v.per_minute.in[last]} in, ${v.per_minute.out[last]} out in the last minute`;
  return [
    el("dt", { text: "connected since" }),
    el("dd", { text: v.connected_since ? `${dateTimeOf(v.connected_since)} (up ${duration(v.uptime_s)})` : "not connected" }),
    el("dt", { text: "messages" }), el("dd", { text: traffic }),
    el("dt", { text: "latency" }),
    el("dd", { text: lat.count ? `p50 ${Math.round(lat.p50_s * 1000)} ms · p95 ${Math.round(lat.p95_s * 1000)} ms (${lat.count} requests)` : "no request answered yet" }),
  ];
}

// Messages in and out a minute over the last hour: two lines in plain SVG.
function trafficChart(perMinute) {
  const width = 400, height = 60, ins = perMinute.in || [], outs = perMinute.out || [];
  const most = Math.max(1, ...ins, ...outs);
  const step = width / Math.max(1, ins.length - 1);
  const points = (values) => values.map((v, i) => `${(i * step).toFixed(1)},${(height - 4 - (v / most) * (height - 8)).toFixed(1)}`).join(" ");
  return svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "traffic", role: "img" },
    svg("title", {}, `messages a minute, last ${ins.length} minutes (most ${most}): in blue, out in green`),
    svg("polyline", { points: points(ins), class: "in" }),
    svg("polyline", { points: points(outs), class: "out" })
  );
}

function stderrBlock(s) {
  const lines = (s.vitals && s.vitals.stderr) || [];
  if (!lines.length) return null;
  return el("div", {}, el("h2", { text: "stderr" }),
    el("pre", { text: lines.map((l) => `${timeOf(l.at)}  ${text(l.line)}`).join("\n") }));
}

function renderServers(servers) {
  const cards = servers.map((s) =>
    el(
      "div",
      { class: "card", "data-server": s.id },
      el(
        "div",
        { class: "head" },
        el("h2", { text: s.id }),
        chip(s.state),
        el("button", { onclick: () => serverAction(s.id), text: "Reconnect" })
      ),
      el(
        "dl",
        {},
        el("dt", { text: "grant" }), el("dd", { text: (s.grant || []).join(", ") || "none" }),
        el("dt", { text: "feature sets" }), el("dd", { text: (s.feature_sets || []).join(", ") || "none" }),
        el("dt", { text: "tools" }), el("dd", { text: text(s.tools) }),
        el("dt", { text: "channels" }), el("dd", { text: text(s.channel_count) }),
        el("dt", { text: "reconnects" }), el("dd", { text: text(s.reconnects) }),
        el("dt", { text: "last error" }), el("dd", { text: text(s.last_error) || "none" }),
        ...vitalsRows(s.vitals || {})
      ),
      s.vitals && s.vitals.per_minute ? trafficChart(s.vitals.per_minute) : null,
      (s.vitals && (s.vitals.disconnects || []).length) ? el("h2", { text: "Disconnects" }) : null,
      (s.vitals && (s.vitals.disconnects || []).length)
        ? el("ol", { class: "disconnects" }, ...[...s.vitals.disconnects].reverse().map((d) =>
            el("li", { class: "muted", text: `${dateTimeOf(d.at)} · ${text(d.reason)}${d.ready_for_s === null ? " (never ready)" : ` (ready ${duration(d.ready_for_s)})`}` })))
        : null,
      (s.mismatches || []).length ? el("h2", { text: "Declaration mismatches" }) : null,
      ...(s.mismatches || []).map((m) => el("pre", { text: text(m.text) })),
      stderrBlock(s)
    )
  );
  document.getElementById("servers").replaceChildren(el("div", { class: "cards" }, ...cards));
}

// The fleet (GET /api/fleet): the hosts sharing the store and the holder of each agent and
// server, as `mcplive status` prints them. Ages and expiries are on the database's clock.
function hostLine(h) {
  return `${h.host_id}: last heartbeat ${duration(h.heartbeat_age_s)} ago${h.leaving ? ", leaving" : ""}`;
}

function leaseLine(l) {
  if (l.state === "free" || l.holder === null) return `${l.resource}: free (epoch ${l.epoch})`;
  const left = Number(l.expires_in_s) || 0;
  const when = left > 0 ? `expires in ${duration(left)}` : `expired ${duration(-left)} ago`;
  return `${l.resource} → ${l.holder}, epoch ${l.epoch}, ${when}`;
}

function renderFleet(fleet) {
  const box = document.getElementById("fleet");
  box.hidden = !fleet.enabled;
  if (!fleet.enabled) return box.replaceChildren();
  const title = el("h2", { text: "Fleet" });
  if (fleet.error) {
    return box.replaceChildren(title, el("p", { class: "muted", text: `not read: ${text(fleet.error)}` }));
  }
  const hosts = fleet.hosts || [], leases = fleet.leases || [];
  box.replaceChildren(
    title,
    el("p", { class: "muted", text: `store ${text(fleet.store)} · read ${dateTimeOf(fleet.read_at)}` }),
    el("h3", { text: "Hosts" }),
    hosts.length
      ? el("ul", { class: "fleet-hosts" }, ...hosts.map((h) => el("li", { "data-host": h.host_id, class: h.host_id === fleet.host_id ? "this-host" : "", text: hostLine(h) + (h.host_id === fleet.host_id ? " (this host)" : "") })))
      : el("p", { class: "muted", text: "no host has beaten yet" }),
    el("h3", { text: "Holders" }),
    leases.length
      ? el("ul", { class: "fleet-leases" }, ...leases.map((l) => el("li", { "data-resource": l.resource, text: leaseLine(l) })))
      : el("p", { class: "muted", text: "no lease taken yet" })
  );
}
