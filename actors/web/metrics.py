"""The console's ``/metrics``: the host's live figures in the Prometheus text format, written by
``prometheus-client`` from a custom collector.

Each console has its own ``CollectorRegistry`` holding one :class:`HostCollector` (never the
library's global registry, so two hosts in one process never mix their figures); a scrape runs
the collector, which reads what the host already publishes without an ask: the status
snapshot (``actors.status``: servers, agents, the loop), each connection's vitals
(``actors.link.vitals``), the store's commit times and the actors' mailboxes.

Every sample carries the host's id as ``host_id`` (one place adds it, :func:`_with_host`), so
the figures of a fleet's hosts, scraped apart, stay apart. Label sets are bounded:

- ``host_id``: one per host;
- ``server`` and ``agent``: the configured servers and agents;
- ``channel``: per server, the first ``actors.link.vitals.CHANNEL_LABELS`` channels that got a
  stored message, for the life of the connection; every later channel is summed in
  ``mcplive_messages_stored_other_total`` (so each series only grows);
- ``model``: the agent's configured model (one per agent); ``kind``: the token kinds of a usage;
- mailbox depths: one series per agent and per connection; channel actors (up to a thousand per
  server) only as their sum and their largest, under ``kind="channel"``.

Every label value is the library's to escape: a server's, channel's or agent's name with quotes,
backslashes or line feeds stays inside its label.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

#: The classic text format: every name and label here is one it allows, and every scraper
#: reads it (the library's newest default, version 1.0.0, needs Prometheus 3).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HostCollector(Collector):
    """Reads one host's figures at each scrape (see the module)."""

    def __init__(self, host: Any, snapshot: Any) -> None:
        self.host = host
        self.snapshot = snapshot  # () -> the status snapshot (actors.status.StatusWriter.body)

    def collect(self) -> Iterator[Metric]:
        ctx = self.host.ctx
        for family in self._families():
            yield _with_host(family, ctx.host_id)

    def _families(self) -> Iterator[Metric]:
        snap = self.snapshot()
        ctx = self.host.ctx
        text = ctx.redactor.text
        yield from _host(snap)
        yield from _servers(snap["servers"], ctx.vitals, text)
        yield from _agents(snap["agents"], {a.name: a.model for a in self.host.config.agents})
        yield _commits(ctx.store.commit_times)
        yield from _mailboxes(ctx)


def _with_host(family: Metric, host_id: str) -> Metric:
    """``family`` with ``host_id`` as the first label of each of its samples."""
    family.samples = [
        sample._replace(labels={"host_id": host_id, **sample.labels}) for sample in family.samples
    ]
    return family


def registry_for(host: Any, snapshot: Any) -> CollectorRegistry:
    """A registry of its own for one host's console."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(host, snapshot))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def _host(snap: Mapping[str, Any]) -> Iterator[Metric]:
    loop = snap.get("loop") or {}
    yield GaugeMetricFamily("mcplive_up", "Whether the host runs, by its id.", value=1)
    yield GaugeMetricFamily(
        "mcplive_loop_longest_step_seconds",
        "The longest time one task step held the host's loop.",
        value=float(loop.get("longest_step_ms", 0.0)) / 1000,
    )
    yield CounterMetricFamily(
        "mcplive_loop_stalls",
        "Task steps that held the host's loop 250 ms or more.",
        value=float(loop.get("stalls", 0)),
    )


def _servers(
    servers: list[Mapping[str, Any]], vitals: Mapping[str, Any], text: Any
) -> Iterator[Metric]:
    ready = GaugeMetricFamily(
        "mcplive_server_ready",
        "Whether the server's link is ready (1) or not (0).",
        labels=["server"],
    )
    connected = GaugeMetricFamily(
        "mcplive_server_connected",
        "Whether the server has a link (1), ready or still being set up, or none (0).",
        labels=["server"],
    )
    connects = CounterMetricFamily(
        "mcplive_server_connects", "Links opened to the server.", labels=["server"]
    )
    reconnects = CounterMetricFamily(
        "mcplive_server_reconnects",
        "Links opened to the server after its first.",
        labels=["server"],
    )
    stored = CounterMetricFamily(
        "mcplive_messages_stored",
        "New messages of the server stored, per channel (the first channels that got one).",
        labels=["server", "channel"],
    )
    other = CounterMetricFamily(
        "mcplive_messages_stored_other",
        "New messages of the server stored in channels past the per-server label cap.",
        labels=["server"],
    )
    latency = GaugeMetricFamily(
        "mcplive_server_request_latency_seconds",
        "Latency of the host's requests to the server over its newest answered requests.",
        labels=["server", "quantile"],
    )
    for s in servers:
        sid = s["id"]
        ready.add_metric([sid], float(s["state"] in ("ready", "mcp-only")))
        connected.add_metric([sid], float(s["state"] in ("ready", "mcp-only", "connecting")))
        connects.add_metric([sid], float(s["connects"]))
        reconnects.add_metric([sid], float(s["reconnects"]))
        live = vitals.get(sid)
        if live is None:
            continue
        v = live.snapshot()
        for channel_id, n in sorted(v.stored.items(), key=lambda kv: kv[0] or ""):
            stored.add_metric([sid, text(channel_id or "")], float(n))
        other.add_metric([sid], float(v.stored_other))
        for quantile, key in (("0.5", "p50_s"), ("0.95", "p95_s")):
            value = v.latency.get(key)
            if value is not None:
                latency.add_metric([sid, quantile], float(value))
    yield from (ready, connected, connects, reconnects, stored, other, latency)


def _agents(agents: list[Mapping[str, Any]], models: Mapping[str, str]) -> Iterator[Metric]:
    turns = CounterMetricFamily("mcplive_agent_turns", "Turns the agent took.", labels=["agent"])
    wakes = CounterMetricFamily(
        "mcplive_agent_wakes",
        "Wakes the agent received (the gate's refusals too).",
        labels=["agent"],
    )
    state = GaugeMetricFamily(
        "mcplive_agent_state",
        "The agent's state (1 for the one it is in).",
        labels=["agent", "state"],
    )
    queued = GaugeMetricFamily(
        "mcplive_agent_queued_wakes", "Wakes waiting for the agent's next turn.", labels=["agent"]
    )
    tokens = CounterMetricFamily(
        "mcplive_model_tokens",
        "Tokens the agent's model calls used, per kind.",
        labels=["agent", "model", "kind"],
    )
    errors = CounterMetricFamily(
        "mcplive_model_errors",
        "The agent's model calls that failed (those tried again too).",
        labels=["agent", "model"],
    )
    for a in agents:
        name = a["name"]
        model = str(models.get(name, ""))
        turns.add_metric([name], float(a["turns"]))
        wakes.add_metric([name], float(a.get("wakes", 0)))
        state.add_metric([name, a["state"]], 1.0)
        queued.add_metric([name], float(a.get("queued", 0)))
        for kind, n in sorted((a.get("usage") or {}).items()):
            tokens.add_metric([name, model, kind], float(n))
        errors.add_metric([name, model], float(a.get("model_errors", 0)))
    yield from (turns, wakes, state, queued, tokens, errors)


def _commits(times: Any) -> Metric:
    buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in times.cumulative()]
    return HistogramMetricFamily(
        "mcplive_store_commit_seconds",
        "How long the store's commits took, from hand-over to the store process to its answer.",
        buckets=buckets,
        sum_value=times.sum,
    )


def _mailboxes(ctx: Any) -> Iterator[Metric]:
    depth = GaugeMetricFamily(
        "mcplive_mailbox_depth",
        "Messages waiting in an actor's mailbox (channels: their sum).",
        labels=["kind", "actor"],
    )
    largest = GaugeMetricFamily(
        "mcplive_mailbox_depth_max",
        "The fullest mailbox of each kind of actor.",
        labels=["kind"],
    )
    for kind, refs in (("agent", ctx.agents), ("connection", ctx.connections)):
        depths = [(name, ref.queued) for name, ref in sorted(refs.items())]
        for name, n in depths:
            depth.add_metric([kind, name], float(n))
        largest.add_metric([kind], float(max((n for _, n in depths), default=0)))
    channel_depths = [ref.queued for ref in list(ctx.channels.values())]
    depth.add_metric(["channel", ""], float(sum(channel_depths)))
    largest.add_metric(["channel"], float(max(channel_depths, default=0)))
    yield from (depth, largest)
