"""Channels at scale, with real lobby subprocesses: servers registering a thousand channels
each, the cap past that, what agents see of them, their open/closed state across a restart, and
a batch of messages spanning many channels (one store write)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import actors.context
import actors.directory
from actors import Host
from tests.helpers import (
    agent_configs,
    answered,
    config,
    lobby,
    ready,
    running_lobby,
    texts,
    without_notices,
)
from tests.lobby.control import LobbyControl, open_control_listener

pytestmark = pytest.mark.slow

DEADLINE_S = 240  # ten lobby processes and ten thousand channels on a loaded machine
WAIT_S = 180.0  # one control event


async def channels_registered(ctl: LobbyControl) -> dict[str, Any]:
    """The lobby's report once every ``--channels`` request was answered."""
    return await ctl.wait_for(lambda e: e["event"] == "channels", "extra channels", timeout=WAIT_S)


@contextlib.asynccontextmanager
async def lobbies(
    tmp_path: Path, count: int, extra: int, agents: dict[str, str]
) -> AsyncIterator[tuple[Host, list[LobbyControl]]]:
    """A host with ``count`` lobby servers (``lobby0``…), each registering ``extra`` channels
    besides its own two; yields once every lobby reported them."""
    async with open_control_listener() as listener:
        servers = [
            lobby(listener.address, "--channels", str(extra), sid=f"lobby{i}") for i in range(count)
        ]
        cfg = config(tmp_path, servers, agent_configs(tmp_path, agents))
        async with Host.open(cfg) as host:
            controls = [await listener.accept(timeout=WAIT_S) for _ in range(count)]
            for ctl in controls:
                await ready(ctl)
                report = await channels_registered(ctl)
                assert report == {"event": "channels", "accepted": extra, "refused": []}
            yield host, controls


def listed(result: dict[str, Any]) -> list[str]:
    """The lines of a ``channel_list`` tool result."""
    return str(result["content"][0]["text"]).splitlines()


async def test_ten_servers_register_a_thousand_channels_each(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lobbies(tmp_path, 10, 998, {"Ada": ""}) as (host, controls):
            await host.run_until_idle()
            lines = listed(await host.execute_tool_call("Ada", "channel_list", {}))
            assert len(lines) == 10_000
            assert "lobby7 / lobby:#c500 · c500 · open" in lines
            for i in range(10):
                status = host.ctx.statuses[f"lobby{i}"]
                assert len(status.channels) == 1000
                assert {"lobby:#general", "lobby:#c998"} <= set(status.channels)

            # a server lists its own channels without waiting on each of them
            ctl = controls[3]
            mark = ctl.mark()
            ctl.send(
                {"cmd": "raw", "message": {"jsonrpc": "2.0", "id": "l1", "method": "channels/list"}}
            )
            found = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"].get("id") == "l1",
                "channels/list",
                since=mark,
            )
            by_id = {c["id"]: c for c in found["response"]["result"]["channels"]}
            assert len(by_id) == 1000
            assert by_id["lobby:#c42"]["label"] == "c42"

            # the 1,001st channel of a server is refused, with its reason; a known one is not
            mark = ctl.mark()
            extra = {"id": "lobby:#one-more", "type": "chat", "label": "one more"}
            renamed = {"id": "lobby:#c1", "type": "chat", "label": "first"}
            ctl.send({"cmd": "register", "channels": [extra, renamed]})
            answer = await ctl.wait_for(answered("channels/register"), "register", since=mark)
            first, second = answer["response"]["result"]["results"]
            assert first["id"] == "lobby:#one-more" and first["accepted"] is False
            sid = first["reason"].split(" ")[0]  # controls connect in no set order
            assert sid in {f"lobby{i}" for i in range(10)}
            assert first["reason"] == f"{sid} already has 1000 channels (at most 1000 per server)"
            assert second == {"id": "lobby:#c1", "accepted": True}
            lines = listed(await host.execute_tool_call("Ada", "channel_list", {}))
            assert not any("one-more" in line for line in lines)
            assert f"{sid} / lobby:#c1 · first · open" in lines


async def test_open_and_closed_states_of_many_channels_survive_a_restart(tmp_path: Path) -> None:
    async def run(check: Any = None, act: Any = None) -> tuple[list[str], list[dict[str, Any]]]:
        async with lobbies(tmp_path, 1, 998, {"Ada": "", "Bo": ""}) as (host, controls):
            if act is not None:
                await act(host, controls[0])
            await host.run_until_idle()
            lines = listed(await host.execute_tool_call("Ada", "channel_list", {}))
            bo = listed(await host.execute_tool_call("Bo", "channel_list", {}))
            assert len(lines) == len(bo) == 1000
            return lines, host.history("Ada")
        raise AssertionError("unreachable")

    async def close_some(host: Host, ctl: LobbyControl) -> None:
        for cid in ("lobby:#c7", "lobby:#c900", "lobby:#general"):
            result = await host.execute_tool_call("Ada", "channel_close", {"channel_id": cid})
            assert result["is_error"] is False, result
        opened = await host.execute_tool_call(
            "Ada", "channel_open", {"channel_id": "lobby:#c7", "set_speech_target": False}
        )
        assert "opened lobby0 / lobby:#c7" in opened["content"][0]["text"]
        await host.execute_tool_call("Ada", "channel_close", {"channel_id": "lobby:#c7"})

    with trio.fail_after(DEADLINE_S):
        lines, _ = await run(act=close_some)
        closed = {line for line in lines if line.endswith("closed")}
        assert closed == {
            "lobby0 / lobby:#c7 · c7 · closed",
            "lobby0 / lobby:#c900 · c900 · closed",
            "lobby0 / lobby:#general · general · closed",
        }
        # a new host on the same data dir reads the states back
        lines, _ = await run()
        assert {line for line in lines if line.endswith("closed")} == closed


async def test_saved_states_past_the_kept_cap_are_read_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``MAX_SAVED_CHANNELS`` channels' saved states are kept in memory; a channel past
    the cap still gets its own from the store."""
    monkeypatch.setattr(actors.directory, "MAX_SAVED_CHANNELS", 1)
    extra = [{"id": f"lobby:#x{i}", "type": "chat", "label": f"x{i}"} for i in range(3)]

    async def session(close: bool) -> set[str]:
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            mark = lb.ctl.mark()
            lb.ctl.send({"cmd": "register", "channels": extra})
            await lb.ctl.wait_for(answered("channels/register"), "registered", since=mark)
            if close:
                for c in extra:
                    await lb.host.execute_tool_call("Ada", "channel_close", {"channel_id": c["id"]})
            lines = listed(await lb.host.execute_tool_call("Ada", "channel_list", {}))
            return {line.split(" · ")[0] for line in lines if line.endswith("closed")}

    names = {f"lobby / lobby:#x{i}" for i in range(3)}
    with trio.fail_after(120):
        assert await session(close=True) == names
        assert await session(close=False) == names


async def test_a_batch_over_many_channels_is_stored_in_one_write(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        async with lobbies(tmp_path, 1, 60, {"Ada": ""}) as (host, controls):
            ctl = controls[0]
            await host.run_until_idle()
            before = host.ctx.store.writer.stats()
            messages = [
                {
                    "channelId": f"lobby:#c{i}",
                    "messageId": f"many-{i}",
                    "author": {"id": "u7", "name": "Cy"},
                    "timestamp": "2026-01-01T00:00:00Z",
                    "content": [{"type": "text", "text": f"to c{i}"}],
                }
                for i in range(1, 61)
            ]
            mark = ctl.mark()
            ctl.send({"cmd": "incoming_batch", "messages": messages})
            answer = await ctl.wait_for(answered("channels/incoming"), "stored", since=mark)
            results = answer["response"]["result"]["results"]
            assert [r["accepted"] for r in results] == [True] * 60
            # the answer came once they were durable: all sixty in one transaction
            after = host.ctx.store.writer.stats()
            assert after.largest_batch >= 60
            assert after.ops - before.ops >= 60
            await host.run_until_idle()
            stored = without_notices(host.history("Ada"))[-60:]
            assert texts(stored) == [f"to c{i}" for i in range(1, 61)]
            assert [m["metadata"]["inbound_source"]["label"] for m in stored] == [
                f"c{i}" for i in range(1, 61)
            ]


async def test_the_channel_cap_counts_channels_not_the_unscoped_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's unscoped lane (pushes naming no channel) takes no room under the cap."""
    monkeypatch.setattr(actors.context, "MAX_CHANNELS_PER_SERVER", 3)
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            mark = lb.ctl.mark()
            lb.ctl.send({"cmd": "push", "eventId": "e1", "text": "a push"})
            await lb.ctl.wait_for(answered("push/event"), "push stored", since=mark)
            extra = [{"id": f"lobby:#x{i}", "type": "chat", "label": f"x{i}"} for i in range(2)]
            mark = lb.ctl.mark()
            lb.ctl.send({"cmd": "register", "channels": extra})
            answer = await lb.ctl.wait_for(answered("channels/register"), "register", since=mark)
            accepted = [r["accepted"] for r in answer["response"]["result"]["results"]]
            assert accepted == [True, False]  # the lobby's two and x0 make three
