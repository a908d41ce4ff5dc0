"""The host against the lobby (``tests/lobby/server.py``) as a real stdio subprocess,
driven over its control link (``tests/lobby/steering.py``).

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from actors import Host
from tests.helpers import (
    agent_configs,
    answered,
    config,
    incoming_answered,
    publish_received,
    publishes,
    ready,
    received,
    send_incoming,
    texts,
    without_notices,
)
from tests.lobby.control import LobbyControl, open_control_listener

pytestmark = pytest.mark.slow

HELLO = """
[[rules]]
when = "(?i)\\\\bhello\\\\b"
say = "Hi there, hello to you!"
"""
KIT = [sys.executable, "-m", "tests.lobby", "--run-id", ""]


@asynccontextmanager
async def kit_host(
    tmp_path: Path, agents: dict[str, str]
) -> AsyncIterator[tuple[Host, LobbyControl]]:
    """A host with the lobby as its one server, ready, and the lobby's control link."""
    async with open_control_listener() as listener:
        server = {"id": "lobby", "command": [*KIT, "--control-connect", listener.address]}
        async with Host.open(config(tmp_path, [server], agent_configs(tmp_path, agents))) as host:
            ctl = await listener.accept()
            async with ctl:
                await ready(ctl, host)
                yield host, ctl


async def test_the_handshake_is_seen_and_a_push_wakes_the_agent(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with kit_host(tmp_path, {"Ada": HELLO}) as (host, ctl):
            methods = [m["method"] for m in received(ctl, "initialize")]
            assert methods == ["initialize"]
            assert received(ctl, "notifications/initialized")
            ctl.send({"cmd": "push", "eventId": "e1", "text": "hello from the clock"})
            answer = await ctl.wait_for(answered("push/event", "eventId", "e1"), "push answer")
            assert answer["response"]["result"] == {"accepted": True}
            await host.run_until_idle()
            history = without_notices(host.history("Ada"))
            assert history[0]["metadata"]["event_id"] == "e1"
            assert texts(history, "assistant") == ["Hi there, hello to you!"]


async def test_an_incoming_message_is_answered_in_its_channel_and_echoed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with kit_host(tmp_path, {"Ada": HELLO, "Grace": ""}) as (host, ctl):
            send_incoming(ctl, "lobby:#random", "x1", "hello all")
            await ctl.wait_for(incoming_answered("x1"), "x1 answered")
            await ctl.wait_for(publish_received(), "Ada's reply")
            await ctl.wait_for(incoming_answered("out-1"), "the echo answered")
            await host.run_until_idle()
            assert publishes(ctl) == [("lobby:#random", "Hi there, hello to you!")]
            grace = texts(host.history("Grace"), "user")
            assert grace == ["hello all", "Hi there, hello to you!"]


async def test_a_push_the_host_did_not_grant_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with kit_host(tmp_path, {"Ada": ""}) as (host, ctl):
            ctl.send({"cmd": "push", "eventId": "x9", "text": "nope", "featureSet": "lobby.other"})
            answer = await ctl.wait_for(answered("push/event", "eventId", "x9"), "refusal")
            assert "error" in answer["response"]
            await host.run_until_idle()
            assert without_notices(host.history("Ada")) == []
