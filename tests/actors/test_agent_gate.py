"""The gate's timers in the AgentActor, on trio's MockClock: a debounce batch fires when it is
due (not before), and a sleep ends by itself when its time is up.

A host with one agent and no server; wakes are told to the agent directly, as the connection
actor tells them. Nothing here waits with a deadline while the store's thread works (the mock
clock would jump to it): the test sleeps on the virtual clock, or waits for the host to be idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.messages import Wake
from actors.models.base import ModelReply, ModelRequest
from actors.trace import TraceEvent
from protocol.hooks import ModelInfo
from tests.helpers import config, install, scripted

EPSILON = 0.001


class TimedModel:
    """Says nothing; records the virtual time of every call."""

    name = "timed"
    info = ModelInfo(id="timed-1", vendor="tests", context_window=8192, capabilities=())

    def __init__(self) -> None:
        self.times: list[float] = []

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        self.times.append(trio.current_time())
        return ModelReply(blocks=(), model=self.name)


def host_config(tmp_path: Path, gate_text: str) -> dict[str, Any]:
    gate = tmp_path / "gate.toml"
    gate.write_text(gate_text, encoding="utf-8")
    agent = {"name": "Ada", "model": scripted(tmp_path, "ada", ""), "gate": str(gate)}
    return config(tmp_path, [], [agent])


def incoming(message_id: str, text: str = "hello") -> Wake:
    return Wake(
        lane="incoming",
        server_id="s1",
        channel_id="c1",
        message_id=message_id,
        text=text,
        author="Alice",
    )


def ready_events(stream: trio.MemoryReceiveChannel[TraceEvent]) -> list[TraceEvent]:
    """The trace events already delivered to ``stream``, without waiting."""
    out = []
    while True:
        try:
            out.append(stream.receive_nowait())
        except trio.WouldBlock:
            return out


def of(events: list[TraceEvent], kind: str) -> list[TraceEvent]:
    return [e for e in events if e.kind == kind and e.agent == "Ada"]


DEBOUNCE = """
[[policies]]
name = "calm"
behavior = { debounce_ms = 300 }
match = { scope = ["incoming"] }
"""


async def test_a_debounce_batch_fires_when_due_after_the_last_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    model = TimedModel()
    install(monkeypatch, model)  # type: ignore[arg-type]
    async with Host.open(host_config(tmp_path, DEBOUNCE)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = host.ctx.agents["Ada"]
        start = trio.current_time()
        for i in range(3):
            if i:
                await trio.sleep(0.1)  # each event puts the batch off again
            await ada.tell(incoming(f"m{i}"))
        due = start + 0.2 + 0.3

        await trio.sleep_until(due - EPSILON)
        seen = ready_events(stream)
        assert [e.data["behavior"] for e in of(seen, "gate-decision")] == ["debounce"] * 3
        assert of(seen, "gate-batch") == [] and of(seen, "turn-start") == []
        assert model.times == []

        await trio.sleep_until(due + EPSILON)
        seen += ready_events(stream)
        [batch] = of(seen, "gate-batch")
        assert batch.data == {"policy": "calm", "count": 3}

        await host.run_until_idle()
        seen += ready_events(stream)
        [turn] = of(seen, "turn-start")
        assert turn.data["wakes"] == 3
        [called] = model.times
        assert called >= due - EPSILON


async def test_a_sleep_ends_by_itself_and_wakes_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    model = TimedModel()
    install(monkeypatch, model)  # type: ignore[arg-type]
    async with Host.open(host_config(tmp_path, 'default = "always"\n')) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = host.ctx.agents["Ada"]
        start = trio.current_time()
        slept = await host.execute_tool_call("Ada", "sleep", {"seconds": 60})
        assert slept["is_error"] is False
        end = start + 60

        await trio.sleep(30)
        await ada.tell(incoming("m1"))  # not privileged: it does not wake the agent
        await trio.sleep_until(end - EPSILON)
        seen = ready_events(stream)
        assert [e.data["seconds"] for e in of(seen, "asleep")] == [60]
        [decision] = of(seen, "gate-decision")
        assert decision.data == {"wake": False, "policy": None, "behavior": "asleep"}
        assert of(seen, "awake") == [] and of(seen, "turn-start") == []
        assert model.times == []

        await trio.sleep_until(end + EPSILON)
        seen += ready_events(stream)
        [awake] = of(seen, "awake")
        assert awake.data == {"reason": "the sleep is over"}

        await host.run_until_idle()
        seen += ready_events(stream)
        [turn] = of(seen, "turn-start")
        assert turn.data["wakes"] == 1  # the self-wake alone: the refused message is not counted
        [called] = model.times
        assert called >= end - EPSILON

        # awake again: an ordinary message wakes the agent
        await ada.tell(incoming("m2"))
        await host.run_until_idle()
        seen += ready_events(stream)
        assert len(of(seen, "turn-start")) == 2
        assert len(of(seen, "gate-decision")) == 1
