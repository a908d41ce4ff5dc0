"""Each connection gets a fair share of the host's ingest: a server that floods the host with
requests or notifications slows itself down (its reader waits in its own transport), never the
other servers or the agents that hear them. Real subprocess and websocket servers on loopback;
order is asserted, never time.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from actors import Host
from actors.link.state import INGEST_SLICE
from tests.chat_servers import DiscordServer
from tests.helpers import config, scripted, wait_trace

FLOOD = 8000  # pushes the flooding server pipelines, all at once, without waiting for answers
#: How far the flood may have got when the quiet server's item is stored, and when the agent
#: hearing it has answered. With one connection's whole backlog handled per step, the item
#: waited for well over a thousand pushes and the reply for the flood's end; with slices but no
#: giving way while the other agent's turn runs, the reply waited for some 450 pushes.
STORED_WITHIN = 16 * INGEST_SLICE
ANSWERED_WITHIN = 16 * INGEST_SLICE


def flood_server(messages: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "examples.bench.server", "--push"]
    command += ["--messages", str(messages), "--window", str(messages)]
    return {"id": "flood", "command": command}


async def test_a_flooding_server_does_not_hold_back_another_servers_item_or_its_reply(
    tmp_path: Path,
) -> None:
    discord = DiscordServer()
    agents = [
        {
            "name": "Ada",
            "model": scripted(tmp_path, "ada", '[[rules]]\nwhen = "ping"\nsay = "pong"\n'),
            "servers": ["discord"],
        },
        {"name": "Flo", "model": scripted(tmp_path, "flo", ""), "servers": ["flood"]},
    ]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(discord.serve)
            cfg = config(tmp_path, [discord.server_config(), flood_server(FLOOD)], agents)
            async with Host.open(cfg) as host:
                stream = host.trace()
                flooded = 0
                stored_at = answered_at = None
                async for event in stream:
                    if event.kind == "push" and event.server_id == "flood":
                        flooded += 1
                        if flooded == 1:  # the flood's whole backlog is on its way now
                            nursery.start_soon(discord.push, "e1", "ping")
                    elif event.kind == "push" and event.server_id == "discord":
                        stored_at = flooded
                    elif event.kind == "turn-end" and event.agent == "Ada":
                        answered_at = flooded
                        break
                assert stored_at is not None and stored_at <= STORED_WITHIN
                assert answered_at is not None and answered_at <= ANSWERED_WITHIN
                [message] = [m for m in host.history("Ada") if m["role"] == "assistant"]
                assert "pong" in str(message["blocks"])
                # and the flood itself goes on: nothing of it was refused
                await wait_trace(
                    stream,
                    lambda e: e.kind == "server-log" and "BENCH sent" in str(e.data.get("line")),
                    "the flood's last answer",
                )
                assert [e for e in host.history("Flo") if e["role"] == "user"][-1:]
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def ada_hearing(tmp_path: Path, server: DiscordServer) -> AsyncIterator[tuple[Host, Any]]:
    """A host whose one agent hears ``server`` (served here), once the server is ready: the
    host and its trace stream."""
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", ""), "servers": ["discord"]}]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        async with Host.open(config(tmp_path, [server.server_config()], agents)) as host:
            stream = host.trace()
            await wait_trace(stream, lambda e: e.kind == "ready", "the server ready")
            yield host, stream
        nursery.cancel_scope.cancel()


class HeldListings(DiscordServer):
    """Answers ``tools/list`` only once released (when ``holding``)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.release = trio.Event()

    async def answer(self, method: str, params: Mapping[str, Any]) -> Any:
        if method == "tools/list" and self.holding:
            await self.release.wait()
        return await super().answer(method, params)

    def listings(self) -> int:
        return len([m for m in self.received if m.get("method") == "tools/list"])


async def test_a_burst_of_tools_list_changed_makes_one_listing_at_a_time(tmp_path: Path) -> None:
    """However many ``notifications/tools/list_changed`` a server sends, one listing runs at a
    time, and the changes that came during it make exactly one more."""
    server = HeldListings()
    with trio.fail_after(60):
        async with ada_hearing(tmp_path, server) as (host, _):
            await host.run_until_idle()
            before = server.listings()
            server.holding = True
            for _ in range(300):
                await server.notify("notifications/tools/list_changed")
            await server.push("e1", "after the burst")  # answered: the burst was read
            assert server.listings() - before == 1  # the first, still unanswered
            server.release.set()
            await host.run_until_idle()
            assert server.listings() - before == 2  # and one more for all the others


async def test_a_flood_of_unknown_notifications_is_told_in_one_line(tmp_path: Path) -> None:
    """The first notification of a method the host does not know is told at once; the rest of
    a burst is summed (one line per interval), not one line each."""
    server = DiscordServer()
    with trio.fail_after(60):
        async with ada_hearing(tmp_path, server) as (_, stream):
            for i in range(500):
                await server.notify(f"odd/{i % 3}")
            await server.push("e1", "after the burst")  # answered: the burst was read
            seen: list[Any] = []
            await wait_trace(stream, lambda e: e.kind == "push", "the push", seen)
            told = [e.data["text"] for e in seen if "ignored" in str(e.data.get("text"))]
            assert told == ["notification odd/0 ignored"]
