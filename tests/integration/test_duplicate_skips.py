"""Items a server sends again, which the store already holds, are answered and skipped, and the
transcript says so: the first skip at once, later ones summed into one line per interval,
whatever their rhythm; the rest when the link ends.

Over the real host and store, with a server joined by memory channels, on a MockClock that moves
only when the test says (the store's writer thread makes an autojumping clock unusable: past
``HANG_S`` real seconds with every task blocked, it jumps, and the deadline fails the test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Host
from actors.link.inbound import SKIP_REPORT_S
from actors.transcript.lines import format_event
from tests.helpers import config, scripted
from tests.vector_server import VectorServer, memory_transports

SERVER = "editor"
CHANNEL = "editor:#notes"
HANG_S = 10.0


def message(message_id: str) -> dict[str, Any]:
    return {
        "channelId": CHANNEL,
        "messageId": message_id,
        "author": {"id": "u1", "name": "Uma"},
        "timestamp": "2026-01-01T00:00:00.000Z",
        "content": [{"type": "text", "text": f"note {message_id}"}],
    }


class Running:
    def __init__(self, host: Host, server: VectorServer) -> None:
        self.host = host
        self.server = server
        self.skips = host.ctx.trace.subscribe_nowait(kinds=frozenset({"duplicates-skipped"}))

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()
        await self.host.run_until_idle()
        await trio.testing.wait_all_tasks_blocked()

    async def send(self, *ids: str) -> None:
        answer = await self.server.request(
            "channels/incoming", {"messages": [message(i) for i in ids]}
        )
        assert [r["accepted"] for r in answer["result"]["results"]] == [True] * len(ids)

    def reported(self) -> list[int]:
        """The counts reported since the last call."""
        out = []
        while True:
            try:
                event = self.skips.receive_nowait()
            except trio.WouldBlock:
                return out
            assert format_event(event) == (
                f"· {event.data['count']} already-stored item"
                f"{'' if event.data['count'] == 1 else 's'} skipped from {SERVER}"
            )
            out.append(event.data["count"])


@asynccontextmanager
async def running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: trio.testing.MockClock
) -> AsyncIterator[Running]:
    server = VectorServer()
    monkeypatch.setattr(
        "actors.link.connection.open_transport", memory_transports({SERVER: server})
    )
    cfg = config(
        tmp_path,
        [{"id": SERVER, "command": ["vector-server"]}],
        [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
    )
    clock.autojump_threshold = HANG_S
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            async with Host.open(cfg) as host:
                while server.session is None:
                    await trio.testing.wait_all_tasks_blocked()
                await server.session.ready.wait()
                await server.register(CHANNEL)
                yield Running(host, server)
            nursery.cancel_scope.cancel()


async def test_a_trickle_and_a_burst_make_one_line_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, monkeypatch, mock_clock) as r:
        await r.send("m1", "m2")
        await r.settle()
        assert r.reported() == []  # new items: nothing skipped
        await r.send("m1")
        await r.settle()
        assert r.reported() == [1]  # the first skip is reported at once
        for _ in range(3):  # a trickle within the interval
            mock_clock.jump(2)
            await r.send("m2")
        await r.send("m1", "m2", "m1", "m2")  # and a burst in one batch
        await r.send("m3")  # a new item between them changes nothing
        await r.settle()
        assert r.reported() == []
        mock_clock.jump(SKIP_REPORT_S)
        await r.settle()
        assert r.reported() == [7]  # summed when the interval ended
        mock_clock.jump(2 * SKIP_REPORT_S)
        await r.send("m3")
        await r.settle()
        assert r.reported() == [1]  # after a quiet interval: at once again


async def test_what_is_still_counted_is_reported_when_the_link_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, monkeypatch, mock_clock) as r:
        gone = r.host.ctx.trace.subscribe_nowait(kinds=frozenset({"disconnected"}))
        await r.send("m1")
        await r.send("m1")
        await r.send("m1", "m1")
        await r.settle()
        assert r.reported() == [1]
        await r.server.disconnect()
        await gone.receive()
        assert r.reported() == [2]
