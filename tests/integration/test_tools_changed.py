"""A server's tool list changing while it runs is shown to the operator: one ``tools-changed``
trace event and transcript line naming what came and went (a listing that finds the same tools
says nothing), and a manifest change gets a line of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.chat_servers import DiscordServer
from tests.helpers import wait_trace
from tests.integration.test_fair_ingest import ada_hearing


def roll(sides: int) -> str:
    """Roll a die."""
    return str(sides)


def topic(text: str) -> str:
    """Set the topic."""
    return text


def shout(text: str) -> str:
    """Shout."""
    return text.upper()


async def test_a_changed_tool_list_is_traced_and_shown_once(tmp_path: Path) -> None:
    server = DiscordServer()
    server.kit.tool()(roll)
    server.kit.tool()(topic)
    with trio.fail_after(60):
        async with ada_hearing(tmp_path, server) as (_, stream):
            await server.kit.tools_changed()  # the same tools: nothing to tell
            del server.kit.tools["topic"]
            server.kit.tool()(shout)
            await server.kit.tools_changed()
            seen: list[Any] = []
            await wait_trace(stream, lambda e: e.kind == "tools-changed", "the change", seen)
    changes = [e for e in seen if e.kind == "tools-changed"]
    assert [(e.data["added"], e.data["removed"]) for e in changes] == [(["shout"], ["topic"])]
    assert format_event(changes[0]) == "· discord tools now: roll, shout (+shout -topic)"


def test_a_manifest_change_gets_one_line() -> None:
    event = TraceEvent(
        kind="manifest-changed",
        agent=None,
        server_id="lobby",
        channel_id=None,
        data={"digest": "sha256:ab12", "impacts": [], "grant": ["pushEvents", "tools"]},
        ts=0.0,
    )
    assert format_event(event) == (
        "· lobby manifest changed (sha256:ab12); granted: pushEvents, tools"
    )
