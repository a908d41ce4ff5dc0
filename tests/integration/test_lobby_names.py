"""Agents hear each other by name through the example lobby.

A host with two scripted agents, Ada and Grace, against the lobby as a real stdio subprocess:
the lobby echoes each agent's post under that agent's name, the other agent's stored copy
carries that author and the line its model is shown names the agent; the echo of the host's own
post wakes nobody, and its author does not store it again.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.agent.history import render_for_model
from tests.helpers import (
    incoming_answered,
    publishes,
    running_lobby,
    send_incoming,
    texts,
    without_notices,
)

pytestmark = pytest.mark.slow

ADA = '[[rules]]\nwhen = "(?i)\\\\bhello\\\\b"\nsay = "Hi there, Ada here."\n'
GRACE = '[[rules]]\nwhen = "(?i)grace"\nsay = "Hello from Grace."\n'
ROOM = "lobby:#random"


def by_message(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        m["metadata"]["message_id"]: m
        for m in without_notices(messages)
        if m["role"] == "user" and m["metadata"].get("message_id")
    }


def turns(lb: Any, agent: str) -> int:
    return lb.host.ctx.agent_statuses[agent].turns


async def test_an_agents_post_is_heard_by_the_other_agent_under_its_name(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ADA, "Grace": GRACE}) as lb:
            send_incoming(lb.ctl, ROOM, "x1", "hello all")
            await lb.ctl.wait_for(incoming_answered("out-1"), "the echo of Ada's post")
            await lb.host.run_until_idle()
            assert turns(lb, "Grace") == 1  # woken by the greeting; the echo woke nobody
            heard = by_message(lb.host.history("Grace"))["out-1"]
            assert heard["metadata"]["author"] == {"id": "agent:Ada", "name": "Ada"}
            shown = [b["text"] for b in render_for_model(heard)["blocks"]]
            assert shown == [
                heard["metadata"]["source_header"],
                "[author: Ada]",
                "Hi there, Ada here.",
            ]
            send_incoming(lb.ctl, ROOM, "x2", "grace, are you there?")
            await lb.ctl.wait_for(incoming_answered("out-2"), "the echo of Grace's answer")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == [
                (ROOM, "Hi there, Ada here."),
                (ROOM, "Hello from Grace."),
            ]
            answer = by_message(lb.host.history("Ada"))["out-2"]
            assert answer["metadata"]["author"] == {"id": "agent:Grace", "name": "Grace"}
            # neither stores the echo of their own post
            assert "out-1" not in by_message(lb.host.history("Ada"))
            assert "out-2" not in by_message(lb.host.history("Grace"))


async def test_the_agent_who_spoke_is_not_woken_by_its_echo(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ADA, "Grace": ""}) as lb:
            send_incoming(lb.ctl, ROOM, "x1", "hello all")
            await lb.ctl.wait_for(incoming_answered("out-1"), "the echo of Ada's post")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == [(ROOM, "Hi there, Ada here.")]
            assert turns(lb, "Ada") == 1  # the greeting woke her; her own echo did not
            assert texts(lb.host.history("Ada"), "user") == ["hello all"]
            heard = by_message(lb.host.history("Grace"))["out-1"]
            assert heard["metadata"]["author"] == {"id": "agent:Ada", "name": "Ada"}


async def test_a_post_tagged_from_self_with_no_known_agent_wakes_nobody(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ADA, "Grace": GRACE}) as lb:
            # the host's own account, but no receipt names the agent who posted it
            send_incoming(lb.ctl, ROOM, "s1", "hello Ada here", tags=["chat:from-self"])
            await lb.ctl.wait_for(incoming_answered("s1"), "s1 answered")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == []
            assert (turns(lb, "Ada"), turns(lb, "Grace")) == (0, 0)
            for agent in ("Ada", "Grace"):
                assert "s1" in by_message(lb.host.history(agent))  # stored all the same
