"""The console's ``/metrics`` and per-server vitals against a running host and a lobby server
process, over real loopback HTTP: the exposition parses (``prometheus_client``'s own parser),
its figures move when messages arrive, and ``/api/servers`` tells a disconnect and its reason.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from actors.web.console import open_console
from tests.helpers import answered, incoming_answered, running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there! Ada here."\n'
DEADLINE = 120

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str, host_id: str) -> Samples:
    """Each sample's value by its name and its labels but ``host_id``, which every sample
    carries, with the host's id."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("host_id") == host_id, s
            samples[(s.name, frozenset(labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and want <= got)


async def scrape(http: httpx.AsyncClient, host_id: str) -> Samples:
    response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text, host_id)


def is_iso(texts: Iterable[Any]) -> bool:
    return all(isinstance(t, str) and datetime.fromisoformat(t) for t in texts)


async def test_metrics_move_when_messages_arrive_and_vitals_tell_a_disconnect(
    tmp_path: Path,
) -> None:
    with trio.fail_after(DEADLINE):
        async with (
            running_lobby(tmp_path, {"Ada": HELLO}) as lb,
            open_console(lb.host, "127.0.0.1:0", None) as console,
            httpx.AsyncClient(base_url=console.url) as http,
        ):
            await lb.host.run_until_idle()
            host_id = lb.host.ctx.host_id
            assert host_id  # kept in the data dir, shown everywhere
            before = await scrape(http, host_id)
            assert value(before, "mcplive_up") == 1
            assert value(before, "mcplive_server_ready", server="lobby") == 1
            assert value(before, "mcplive_server_connects_total", server="lobby") == 1
            assert value(before, "mcplive_server_reconnects_total", server="lobby") == 0
            general = {"server": "lobby", "channel": "lobby:#general"}
            assert value(before, "mcplive_messages_stored_total", **general) == 0

            mark = lb.ctl.mark()
            send_incoming(lb.ctl, "lobby:#general", "m1", "hello Ada")
            await lb.ctl.wait_for(incoming_answered("m1"), "m1 answered", since=mark)
            lb.ctl.send({"cmd": "push", "eventId": "p1", "text": "ding"})
            await lb.ctl.wait_for(answered("push/event", "eventId", "p1"), "p1", since=mark)
            await lb.host.run_until_idle()
            after = await scrape(http, host_id)

            # m1 (and the lobby's echo of Ada's reply, when it came back already), and p1
            assert value(after, "mcplive_messages_stored_total", **general) >= 1
            stored = "mcplive_messages_stored_total"
            assert total(after, stored, server="lobby") >= total(before, stored, server="lobby") + 2
            for name in ("mcplive_agent_wakes_total", "mcplive_agent_turns_total"):
                assert value(after, name, agent="Ada") > value(before, name, agent="Ada")
            commits = "mcplive_store_commit_seconds_count"
            assert value(after, commits) > value(before, commits) > 0
            tokens = "mcplive_model_tokens_total"
            assert total(after, tokens, agent="Ada") > total(before, tokens, agent="Ada")
            model = lb.host.config.agents[0].model
            assert value(after, "mcplive_model_errors_total", agent="Ada", model=model) == 0
            assert (
                "mcplive_model_errors_total",
                frozenset({("agent", "Ada"), ("model", model)}),
            ) in after
            depth = "mcplive_mailbox_depth"
            assert (depth, frozenset({("kind", "agent"), ("actor", "Ada")})) in after
            assert (depth, frozenset({("kind", "connection"), ("actor", "lobby")})) in after
            p95 = {"server": "lobby", "quantile": "0.95"}
            assert value(after, "mcplive_server_request_latency_seconds", **p95) >= 0

            [server] = (await http.get("/api/servers")).json()
            vitals = server["vitals"]
            assert is_iso([vitals["connected_since"]]) and vitals["uptime_s"] >= 0
            assert vitals["disconnects"] == [] and vitals["connects"] == 1
            assert vitals["per_minute"]["minutes"] == 60
            assert len(vitals["per_minute"]["in"]) == len(vitals["per_minute"]["out"]) == 60
            assert vitals["latency"]["count"] >= 1  # the handshake's requests, at least
            assert vitals["latency"]["p50_s"] <= vitals["latency"]["p95_s"]
            assert is_iso(line["at"] for line in vitals["stderr"])

            lb.ctl.send({"cmd": "crash"})
            await wait_trace(lb.stream, lambda e: e.kind == "disconnected", "the crash")
            [server] = (await http.get("/api/servers")).json()
            vitals = server["vitals"]
            assert vitals["connected_since"] is None and vitals["uptime_s"] is None
            [gone] = vitals["disconnects"]
            assert "exited with code 1" in gone["reason"] and is_iso([gone["at"]])
            assert gone["ready_for_s"] > 0
            assert value(await scrape(http, host_id), "mcplive_server_ready", server="lobby") == 0
            # the status file's entry carries the same vitals, without the hour of traffic
            status = lb.host.ctx.vitals["lobby"].snapshot()
            assert status.disconnects[-1].reason == gone["reason"]
