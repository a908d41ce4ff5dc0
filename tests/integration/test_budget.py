"""The daily token budget as a host keeps it: a real Host (real store in a temp dir) with one
scripted agent and no server, woken by local input. Its usage is an estimate, a token per four
characters read, so a big system prompt makes each turn cost about 860 tokens of its 2,000.

Order-only assertions: no sleeps, no timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.cli.status import summary
from actors.config import ConfigErrors, load_config
from actors.status import StatusWriter
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from protocol.prices import PRICE_KEYS
from tests.helpers import agent_configs, config, drain_ready

pytestmark = pytest.mark.slow

BUDGET = 2000
RULES = '[[rules]]\nwhen = "(.+)"\nsay = "heard {1}"\n'


def budget_config(tmp_path: Path) -> dict[str, Any]:
    agent = {"model": None, "system_prompt": "x" * 3400, "budget_daily_tokens": BUDGET}
    entries = agent_configs(tmp_path, {"Ada": RULES})
    entries[0].update({k: v for k, v in agent.items() if v is not None})
    return config(tmp_path, [], entries)


def kinds(events: list[TraceEvent], *wanted: str) -> list[TraceEvent]:
    return [e for e in events if e.kind in wanted and e.agent == "Ada"]


def said(host: Host, role: str = "assistant") -> list[str]:
    return [
        "".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text")
        for m in host.history("Ada")
        if m["role"] == role
    ]


async def test_the_budget_pauses_the_agent_keeps_what_it_missed_and_lasts_a_restart(
    tmp_path: Path,
) -> None:
    cfg = budget_config(tmp_path)
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            for n in range(1, 6):
                await host.post_local("Ada", f"turn {n}")
                await host.run_until_idle()
            events = await drain_ready(stream)
            used = kinds(events, "turn-usage")
            paused = kinds(events, "budget-paused")
            assert len(paused) == 1, [e.kind for e in events]
            pause = paused[0].data
            assert pause["budget"] == BUDGET and pause["used"] >= BUDGET
            assert pause["resumes_at"].endswith("T00:00+00:00")
            # the turns stopped at the pause: it went past the budget by one turn at most
            assert len(used) == 3
            totals = [sum(e.data[k] for k in ("input_tokens", "output_tokens")) for e in used]
            assert sum(totals[:-1]) < BUDGET <= sum(totals) == pause["used"]
            warned = kinds(events, "budget-warning")
            assert len(warned) == 1 and events.index(warned[0]) < events.index(paused[0])
            status = host.ctx.agent_statuses["Ada"]
            assert status.paused is not None and "budget" in status.paused
            # what came while paused is stored and reaches the turn after the resume
            assert any("turn 5" in s for s in said(host, "user"))
            assert not any("turn 4" in s or "turn 5" in s for s in said(host))
            assert await host.resume("Ada")
            await host.run_until_idle()
            events = await drain_ready(stream)
            assert said(host)[-1] == "heard turn 5"
            # still over the budget: one turn, then paused again (no loop)
            assert len(kinds(events, "turn-usage")) == 1
            assert len(kinds(events, "budget-paused")) == 1
            assert host.ctx.agent_statuses["Ada"].paused is not None
        async with Host.open(cfg) as host:  # the same day: it starts paused
            stream = host.trace()
            await host.post_local("Ada", "after the restart")
            await host.run_until_idle()
            events = await drain_ready(stream)
            assert host.ctx.agent_statuses["Ada"].paused is not None
            assert not kinds(events, "turn-usage")
            # a reload with the same budget resumes it for one turn, then it pauses again
            report = await host.reload(cfg)
            assert report["resumed"] == ["Ada"]
            await host.run_until_idle()
            events = await drain_ready(stream)
            assert len(kinds(events, "turn-usage")) == 1
            assert len(kinds(events, "budget-paused")) == 1
            assert said(host)[-1] == "heard after the restart"
            # a raised budget, reloaded: resumed and not paused again
            cfg["agents"][0]["budget_daily_tokens"] = 100 * BUDGET
            report = await host.reload(cfg)
            assert report["resumed"] == ["Ada"]
            await host.post_local("Ada", "raised")
            await host.run_until_idle()
            events = await drain_ready(stream)
            assert len(kinds(events, "turn-usage")) == 1
            assert not kinds(events, "budget-paused")
            assert host.ctx.agent_statuses["Ada"].paused is None
            assert said(host)[-1] == "heard raised"


async def test_a_cost_budget_pauses_at_its_dollars(tmp_path: Path) -> None:
    cfg = budget_config(tmp_path)
    ada = cfg["agents"][0]
    del ada["budget_daily_tokens"]
    ada["budget_daily_usd"] = 2
    # a dollar per thousand tokens read or written: about $0.86 a turn
    cfg["prices"] = {"scripted:ada.toml": dict.fromkeys(PRICE_KEYS, 1000)}
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            for n in range(1, 6):
                await host.post_local("Ada", f"turn {n}")
                await host.run_until_idle()
            events = await drain_ready(stream)
    used = kinds(events, "turn-usage")
    (paused,) = kinds(events, "budget-paused")
    assert len(used) == 3 and kinds(events, "budget-warning")
    assert paused.data["unit"] == "usd" and paused.data["budget"] == 2
    spent = [sum(e.data[k] for k in ("input_tokens", "output_tokens")) / 1000 for e in used]
    assert sum(spent[:-1]) < 2 <= paused.data["used"] == pytest.approx(sum(spent))


async def test_a_host_wide_budget_pauses_every_agent_in_its_time_zone(tmp_path: Path) -> None:
    """Two agents share ``[host] budget_daily_tokens``: the turn that reaches it pauses its
    agent, the other agent pauses before its next turn (no model call), both say when the day
    ends in the host's zone, ``status`` shows today's usage and the budget, and a restart the
    same day starts both paused."""
    entries = agent_configs(tmp_path, {"Ada": RULES, "Grace": RULES})
    for entry in entries:
        entry["system_prompt"] = "x" * 3400  # about 860 tokens a turn
    cfg = config(tmp_path, [], entries)
    cfg["host"].update(budget_daily_tokens=2500, timezone="Pacific/Kiritimati")
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            for n in range(1, 4):
                for agent in ("Ada", "Grace"):
                    await host.post_local(agent, f"{agent} {n}")
                    await host.run_until_idle()
            events = await drain_ready(stream)
            used = [e for e in events if e.kind == "turn-usage"]
            paused = [e for e in events if e.kind == "budget-paused"]
            assert [e.agent for e in used] == ["Ada", "Grace", "Ada"]  # 3 × ~860 > 2,500
            assert sorted(e.agent for e in paused) == ["Ada", "Grace"]
            assert {e.data["scope"] for e in paused} == {"host"}
            total = sum(e.data["input_tokens"] + e.data["output_tokens"] for e in used)
            assert (
                sum(e.data["input_tokens"] + e.data["output_tokens"] for e in used[:-1])
                < 2500
                <= total
            )
            # the day ends at midnight in Kiritimati (UTC+14), said in its own offset
            assert all(e.data["resumes_at"].endswith("T00:00+14:00") for e in paused)
            lines = [format_event(e) for e in paused]
            assert all("host-wide daily token budget reached" in line for line in lines)
            doc = StatusWriter(host.ctx).body()
            report = summary(tmp_path, 1, {**doc, "written_at": doc["started_at"]}, _ok(), 0)
            assert any(line.startswith("all agents: today (") for line in report), report
            assert any("budget 2,500 tokens (0 tokens left)" in line for line in report), report
            ada = next(a for a in doc["agents"] if a["name"] == "Ada")
            assert ada["today"]["tokens"]["used"] > 0 and ada["today"]["tokens"]["limit"] is None
        async with Host.open(cfg) as host:  # the same day: both start paused
            stream = host.trace()
            await host.post_local("Grace", "after the restart")
            await host.run_until_idle()
            assert all(host.ctx.agent_statuses[a].paused for a in ("Ada", "Grace"))
            assert not kinds(await drain_ready(stream), "turn-usage")
            # the total raised: a reload resumes both and the waiting line is answered
            cfg["host"]["budget_daily_tokens"] = 100_000
            report = await host.reload(cfg)
            assert "budget_daily_tokens" in report["changed"]
            assert sorted(report["resumed"]) == ["Ada", "Grace"]
            await host.run_until_idle()
            grace = [
                "".join(b.get("text", "") for b in m["blocks"])
                for m in host.history("Grace")
                if m["role"] == "assistant"
            ]
            assert grace[-1] == "heard after the restart"
            assert not any(host.ctx.agent_statuses[a].paused for a in ("Ada", "Grace"))


def _ok() -> Any:
    from protocol import status as fmt

    return fmt.Verdict(code=fmt.HEALTHY, problems=())


async def test_an_unknown_time_zone_is_a_config_error(tmp_path: Path) -> None:
    cfg = budget_config(tmp_path)
    cfg["host"]["timezone"] = "Mars/Olympus"
    with pytest.raises(ConfigErrors) as caught:
        load_config(cfg)
    assert caught.value.problems == [
        "host.timezone: 'Mars/Olympus' is not a known time zone; use an IANA name such as "
        "'Europe/Berlin'"
    ]
