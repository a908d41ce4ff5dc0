"""The console's Usage page's reads: ``/api/usage`` over real loopback HTTP, against a running
host whose agent answered a lobby server: the ledger's rows per day, agent and model, priced,
the days of the chart, and each agent's day against its budgets.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest
import trio

from actors.web.console import open_console
from store import Reader, db_path
from tests.helpers import running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there! Ada here."\n'


async def test_the_usage_page_reads_the_ledger_by_day_agent_and_model(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": HELLO}) as lb:
            for n in range(2):
                send_incoming(lb.ctl, "lobby:#general", f"m{n}", f"hello Ada {n}")
                await wait_trace(lb.stream, lambda e: e.kind == "turn-usage", "a turn")
            await lb.host.run_until_idle()
            async with (
                open_console(lb.host, "127.0.0.1:0", None) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                usage = (await http.get("/api/usage")).json()
                week = (await http.get("/api/usage", params={"days": "7"})).json()
                refused = await http.get("/api/usage", params={"days": "0"})
                too_many = await http.get("/api/usage", params={"days": "400"})
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert len(usage["days"]) == 30 and usage["days"][-1] == today
    assert len(week["days"]) == 7 and week["days"][-1] == today
    assert refused.status_code == 400 and "days" in refused.json()["error"]
    assert too_many.status_code == 400
    [row] = usage["rows"]
    assert (row["day"], row["agent"]) == (today, "Ada")
    assert row["model"].startswith("scripted:") and row["cost_usd"] is None  # no price known
    with Reader(db_path(tmp_path / "data"), read_only=True) as reader:
        [total] = reader.usage(agent="Ada")
    assert row["calls"] == total.calls >= 2
    assert row["input_tokens"] == total.input_tokens > 0
    assert row["output_tokens"] == total.output_tokens > 0
    ada = usage["today"]["Ada"]
    assert ada["tokens"]["used"] == total.input_tokens + total.output_tokens
    assert ada["tokens"]["limit"] is None and ada["usd"]["limit"] is None
    assert usage["host"]["tokens"]["limit"] is None
