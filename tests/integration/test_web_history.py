"""The console's history across agents: ``/api/history`` over real loopback HTTP lists every
agent's stored messages with their times and ids, searched through the store's text index and
filtered by day, read in a worker thread.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.web.console import open_console
from tests.helpers import running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

QUIET = ""  # a scripted model that says nothing


async def test_history_across_agents_with_a_search_and_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": QUIET, "Grace": QUIET}) as lb:
            reader = lb.host.ctx.store.reader
            read_on: list[bool] = []

            def rows(*args: Any, **kwargs: Any) -> Any:
                read_on.append(threading.current_thread() is threading.main_thread())
                return type(reader).rows(reader, *args, **kwargs)

            monkeypatch.setattr(reader, "rows", rows)
            send_incoming(lb.ctl, "lobby:#general", "m1", "the comet is visible tonight")
            for _ in range(2):  # each agent's turn
                await wait_trace(lb.stream, lambda e: e.kind == "turn-usage", "a turn")
            await lb.host.run_until_idle()
            async with (
                open_console(lb.host, "127.0.0.1:0", None) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                found = (await http.get("/api/history", params={"q": "COMET"})).json()
                today = dt.datetime.now(dt.UTC).date()
                yesterday = (today - dt.timedelta(days=1)).isoformat()
                same_day = {"q": "comet", "since": today.isoformat(), "until": today.isoformat()}
                on_the_day = (await http.get("/api/history", params=same_day)).json()
                before = (await http.get("/api/history", params={"until": yesterday})).json()
                ada = (await http.get("/api/history/Ada", params={"q": "comet"})).json()
                bad = await http.get("/api/history", params={"since": "last week"})
                paged = (await http.get("/api/history", params={"q": "comet", "limit": "1"})).json()
                rest = (
                    await http.get("/api/history", params={"q": "comet", "before": paged["more"]})
                ).json()
    hits = found["messages"]
    assert sorted(m["agent"] for m in hits) == ["Ada", "Grace"]
    assert all(m["role"] == "user" and "comet" in m["line"] for m in hits)
    assert all(m["ts"].startswith(today.isoformat()) and m["id"] for m in hits)
    assert [m["id"] for m in on_the_day["messages"]] == [m["id"] for m in hits]
    assert before["messages"] == [] and before["more"] is None
    assert [m["agent"] for m in ada["messages"]] == ["Ada"]
    assert bad.status_code == 400 and "since" in bad.json()["error"]
    # paging across agents: the newest one, then the other
    assert len(paged["messages"]) == 1 and paged["more"] is not None
    assert {paged["messages"][0]["agent"], rest["messages"][0]["agent"]} == {"Ada", "Grace"}
    assert read_on and not any(read_on)  # never on the host's loop
