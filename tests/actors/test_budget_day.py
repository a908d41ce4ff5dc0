"""The daily budget's pause lifts by itself at the next UTC day: a real Host on trio's
MockClock, with the agent's wall clock held an hour before midnight, then set past it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

import actors.agent.budget as agent_budget
from actors import Host
from actors.agent.actor import PostLocal
from protocol.budget import next_day
from tests.helpers import agent_configs, config, drain_ready

RULES = '[[rules]]\nwhen = "(.+)"\nsay = "heard {1}"\n'


async def test_the_pause_lifts_at_the_next_utc_day_and_the_waiting_wake_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    midnight = next_day(time.time())  # the ledger's rows are stamped today, before it
    clock = {"now": midnight - 3600}
    monkeypatch.setattr(agent_budget, "wall_clock", lambda: clock["now"])
    entries = agent_configs(tmp_path, {"Ada": RULES})
    entries[0].update(system_prompt="x" * 3400, budget_daily_tokens=2000)
    async with Host.open(config(tmp_path, [], entries)) as host:
        stream = host.trace()
        for n in range(1, 5):
            # told, not asked: an ask's 60 s deadline is mock time, which jumps while the
            # store appends in a thread
            await host.ctx.agents["Ada"].tell(PostLocal(text=f"turn {n}"))
            await host.run_until_idle()
        events = await drain_ready(stream)
        assert [e.kind for e in events].count("budget-paused") == 1
        assert host.ctx.agent_statuses["Ada"].paused is not None
        await trio.sleep(3600)  # the agent's timer is due, but its day has not ended
        await host.run_until_idle()
        assert host.ctx.agent_statuses["Ada"].paused is not None
        assert not [e for e in await drain_ready(stream) if e.kind == "turn-usage"]
        clock["now"] = midnight + 1
        await trio.sleep(3600)
        await host.run_until_idle()
        events = await drain_ready(stream)
        kinds = [e.kind for e in events if e.agent == "Ada"]
        assert "agent-resumed" in kinds and "turn-usage" in kinds
        assert "budget-paused" not in kinds  # a new day: counted from 0
        assert host.ctx.agent_statuses["Ada"].paused is None
        replies = [
            "".join(b.get("text", "") for b in m["blocks"])
            for m in host.history("Ada")
            if m["role"] == "assistant"
        ]
        assert replies[-1] == "heard turn 4"
