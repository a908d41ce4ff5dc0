"""Caps of the runtime's maps and buffers, each tested at its limit with a real server."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import actors.channel.actor
import actors.context
import actors.directory
import actors.link.io
from actors import Host
from actors.messages import Describe
from tests import editor_like_server as editor_like
from tests.helpers import (
    answered,
    config,
    incoming_answered,
    publish_received,
    running_lobby,
    scripted,
    send_incoming,
    texts,
    wait_trace,
    without_notices,
)

pytestmark = pytest.mark.slow


async def test_channels_per_server_cap_refuses_per_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the lobby registers 2 channels itself: with the cap at 3, one more fits, the next is refused
    monkeypatch.setattr(actors.context, "MAX_CHANNELS_PER_SERVER", 3)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            mark = lb.ctl.mark()
            extra = [{"id": f"lobby:#x{i}", "type": "chat", "label": f"x{i}"} for i in range(2)]
            lb.ctl.send({"cmd": "register", "channels": extra})
            answer = await lb.ctl.wait_for(answered("channels/register"), "register", since=mark)
            results = answer["response"]["result"]["results"]
            assert results[0] == {"id": "lobby:#x0", "accepted": True}
            assert results[1]["id"] == "lobby:#x1" and results[1]["accepted"] is False
            assert "already has 3 channels" in results[1]["reason"]
            listed = await lb.host.execute_tool_call("Ada", "channel_list", {})
            assert "lobby:#x1" not in listed["content"][0]["text"]


async def test_requests_before_the_policy_is_decided_wait_within_a_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five pings sent before the server answers ``initialize`` (so before the host can decide
    its policy): the two past the cap are refused at once; the three held are answered once the
    policy is decided, while the server, waiting for them, reads nothing else (the host's
    ``featureSets/update`` waits unanswered meanwhile)."""
    monkeypatch.setattr(actors.link.io, "EARLY_CAP", 3)
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
    servers = [editor_like.server_config("--early-pings", "5")]
    with trio.fail_after(60):
        async with Host.open(config(tmp_path, servers, agents)) as host:
            stream = host.trace(kinds={"server-log"})
            lines: list[str] = []
            while not lines or "register" not in lines[-1]:
                event = await wait_trace(stream, lambda e: "[editor] " in e.data["line"], "a log")
                lines.append(event.data["line"].removeprefix("[editor] "))
    refused = [f"early{n}: -32002 connection not ready; retry later" for n in (3, 4)]
    answered = [f"early{n}: answered" for n in range(3)]
    registered = (
        "channels/register answered: {'results': [{'id': 'editor:#notes', 'accepted': True}]}"
    )
    assert lines == [*refused, *answered, registered]


async def test_publish_receipts_are_forgotten_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.channel.actor, "MAX_RECEIPTS", 1)
    rules = '[[rules]]\nwhen = "^ping"\nsay = "pong"\n'
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": rules}, "--no-echo") as lb:
            host, ctl = lb.host, lb.ctl
            for n in (1, 2):
                mark = ctl.mark()
                send_incoming(ctl, "lobby:#general", f"q{n}", "ping")
                await ctl.wait_for(publish_received(), f"reply {n}", since=mark)
                await host.run_until_idle()
            # out-1's receipt was forgotten (cap 1); out-2's is kept
            for mid in ("out-1", "out-2"):
                author = {"id": "host", "name": "mcplive"}
                send_incoming(ctl, "lobby:#general", mid, "pong", author=author)
                await ctl.wait_for(incoming_answered(mid), f"{mid} answered")
            await host.run_until_idle()
            user = texts(without_notices(host.history("Ada")), "user")
            # the echo of the forgotten receipt is stored for Ada; the remembered one is not
            assert user == ["ping", "ping", "pong"]


async def test_label_history_keeps_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.directory, "MAX_LABELS", 3)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            for i in range(5):
                mark = ctl.mark()
                renamed = {"id": "lobby:#general", "type": "chat", "label": f"name{i}"}
                ctl.send({"cmd": "register", "channels": [renamed]})
                await ctl.wait_for(answered("channels/register"), "renamed", since=mark)
            await host.run_until_idle()
            chan = await host.ctx.channel("lobby", "lobby:#general")
            info = await chan.ask(Describe(), timeout=5)
            assert info.label == "name4"
            assert info.labels == ("name2", "name3", "name4")
            send_incoming(ctl, "lobby:#general", "l1", "hi")
            await ctl.wait_for(answered("channels/incoming"), "stored")
            await host.run_until_idle()
            assert (
                without_notices(host.history("Ada"))[-1]["metadata"]["inbound_source"]["label"]
                == "name4"
            )
