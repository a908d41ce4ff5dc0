"""RFC-006 §11 audit over a real lobby: what coalescing displaces (an unread occurrence replaced
or retracted, on a feature-set or a channel subject) is one ``coalesce-audit`` trace event with
its server, channel, subject key and event ids, never its content, and one transcript line.
Real clock, order-only assertions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.helpers import incoming_answered, running_lobby, wait_trace
from tests.integration.test_coalescing import push

pytestmark = pytest.mark.slow

SKIP_ALL = 'default = "skip"\n'  # nothing wakes the agent, so nothing is read meanwhile


async def test_displaced_occurrences_are_audited_in_the_trace_and_the_transcript(
    tmp_path: Path,
) -> None:
    (tmp_path / "gate.toml").write_text(SKIP_ALL, encoding="utf-8")
    (tmp_path / "a.toml").write_text("", encoding="utf-8")
    agent = {"model": f"scripted:{tmp_path / 'a.toml'}", "gate": str(tmp_path / "gate.toml")}
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            audit = lb.host.trace(kinds={"coalesce-audit"})
            ctl = lb.ctl
            await push(ctl, "a1", "secret draft one", key="build", initial=True)
            replaced = await push(ctl, "a2", "secret draft two", key="build")
            assert replaced["result"]["coalesce"]["outcome"] == "replaced"
            retracted = await push(ctl, "a3", "", key="build", retract=True)
            assert retracted["result"]["coalesce"]["outcome"] == "retracted"
            # a chat message edited before anyone read it: a channel-scoped subject
            mark = ctl.mark()
            ctl.send(
                {
                    "cmd": "incoming",
                    "channelId": "lobby:#general",
                    "messageId": "m1",
                    "eventId": "m1-created",
                    "text": "secret first wording",
                    "coalesce": {"key": "message:m1", "initial": True},
                }
            )
            await ctl.wait_for(incoming_answered("m1"), "m1", since=mark)
            edited = await push(
                ctl, "m1-edited", "the edit", key="message:m1", channelId="lobby:#general"
            )
            assert edited["result"]["coalesce"]["outcome"] == "replaced"
            seen: list[TraceEvent] = []
            for n in range(3):
                await wait_trace(audit, lambda e: e.kind == "coalesce-audit", f"audit {n}", seen)
    displaced, withdrawn, edit = seen
    assert (displaced.server_id, displaced.channel_id) == ("lobby", None)
    assert displaced.data["kind"] == "displaced"
    assert displaced.data["key"] == "build" and displaced.data["event_ids"] == ["a1"]
    assert withdrawn.data["kind"] == "withdrawn" and withdrawn.data["event_ids"] == ["a2"]
    assert (edit.server_id, edit.channel_id) == ("lobby", "lobby:#general")
    assert edit.data["kind"] == "displaced" and edit.data["key"] == "message:m1"
    assert edit.data["event_ids"] == ["m1-created"]
    for event in seen:
        assert event.data["reason"]
        assert "secret" not in repr(event.data)  # never the displaced content
    lines = [format_event(e) for e in seen]
    assert lines == [
        "· lobby: an unread occurrence was replaced (key build; event a1)",
        "· lobby: an unread occurrence was retracted (key build; event a2)",
        "· lobby lobby:#general: an unread occurrence was replaced"
        " (key message:m1; event m1-created)",
    ]


def test_an_audit_line_without_a_server_or_event_ids() -> None:
    data: dict[str, Any] = {
        "kind": "discarded",
        "reason": "a late render result was discarded",
        "key": None,
        "event_ids": [],
        "batch": "coalesced:7",
    }
    line = format_event(TraceEvent(kind="coalesce-audit", data=data))
    assert line == "· coalescer: a late render result was discarded (batch coalesced:7)"
