"""The handshake has a deadline and never deadlocks with a server that waits on its own request.

A websocket server (``tests.blocking_server``) sends ``channels/register`` right after
``notifications/initialized`` and reads nothing else until it is answered, so it never reads
our ``featureSets/update`` until then. The grant that update announces is in force from the
moment it is sent (host-first), so the register is judged under it and accepted at once: the
server reads the update, answers it, and an agent converses in the channel, with no refusal and
no reconnect. A server that never answers the handshake at all fails the link, which is
reopened after the backoff.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Host
from actors.config import ServerConfig
from actors.link.io import EARLY_WAIT_S
from actors.link.run import HANDSHAKE_WORK_S
from actors.messages import Call
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.blocking_server import ROOM, BlockingServer
from tests.helpers import config, host_ready, scripted
from tests.vector_server import MemoryTransport

HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "hi una"\n'


def drain(receiver: Any) -> list[TraceEvent]:
    out = []
    while True:
        try:
            out.append(receiver.receive_nowait())
        except trio.WouldBlock:
            return out


@pytest.mark.slow
async def test_a_server_blocked_on_its_own_register_is_answered_and_served(
    tmp_path: Path,
) -> None:
    server = BlockingServer()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", HELLO)}]
            async with Host.open(config(tmp_path, [server.server_config()], agents)) as host:
                trace = host.ctx.trace.subscribe_nowait()
                await host.run_until_idle()
                assert not server.gave_up
                await server.registered.wait()
                assert not server.gave_up  # unblocked by our answer, not by its own timeout
                (first,) = server.register_answers  # accepted the first time: no retry
                assert first["result"]["results"] == [{"id": ROOM, "accepted": True}]
                await host_ready(host, "block")  # the handshake goes on after the register
                await server.say(ROOM, "m1", "hello Ada")
                await server.publish_seen.wait()
                await host.run_until_idle()
                assert [(p["channelId"], p["content"]) for p in server.published()] == [
                    (ROOM, [{"type": "text", "text": "hi una"}])
                ]
                lines = [format_event(e) for e in drain(trace)]
            nursery.cancel_scope.cancel()
    shown = [line for line in lines if line]
    order = [
        f"· block registered {ROOM} (#room)",  # while the handshake waits for the receipt
        "· block ready: MCPL; noop",
        f"block {ROOM} | una: hello Ada",
        f"block {ROOM} | Ada → hi una",
    ]
    assert [line for line in shown if line in order] == order
    assert not any("disconnected" in line or "refused" in line for line in shown)


# -- a server that never answers ----------------------------------------------------------------


class Silent:
    """A server that reads what the host sends and answers nothing; at each connection it sends
    one ``channels/register`` of its own at once."""

    def __init__(self) -> None:
        self.opened = 0
        self.connected = trio.Event()
        self.received: list[str] = []

    @asynccontextmanager
    async def open_transport(self, cfg: ServerConfig, on_stderr: Any) -> AsyncIterator[Any]:
        to_server, from_host = trio.open_memory_channel[str](100)
        to_host, from_server = trio.open_memory_channel[str](100)
        self.opened += 1
        register = '{"jsonrpc":"2.0","id":"r1","method":"channels/register","params":{}}'
        to_host.send_nowait(register)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, from_host)
            self.connected.set()
            try:
                yield MemoryTransport(to_server, from_server)
            finally:
                nursery.cancel_scope.cancel()
                to_host.close()

    async def _read(self, from_host: trio.MemoryReceiveChannel[str]) -> None:
        async for line in from_host:
            self.received.append(line)


async def test_a_handshake_past_its_deadline_fails_and_is_retried_after_the_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    silent = Silent()
    monkeypatch.setattr("actors.link.connection.open_transport", silent.open_transport)
    servers = [{"id": "silent", "command": ["silent-server"], "request_timeout_s": 20}]
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
    mock_clock.autojump_threshold = 10.0  # only if the store's thread leaves every task waiting
    with trio.fail_after(3600):
        async with Host.open(config(tmp_path, servers, agents)) as host:
            watched = frozenset({"disconnected", "connecting", "diagnostic", "refused"})
            trace = host.ctx.trace.subscribe_nowait(kinds=watched)
            await silent.connected.wait()
            idle = trio.Event()

            async def settle() -> None:
                await host.run_until_idle()
                idle.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(settle)
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(max(HANDSHAKE_WORK_S, EARLY_WAIT_S))
                with trio.fail_after(1):  # long before the handshake's deadline
                    await idle.wait()
            # idle while the handshake is stuck, before its deadline
            seen = drain(trace)
            assert [e.kind for e in seen if e.kind == "disconnected"] == []
            assert [(e.kind, e.data.get("code")) for e in seen if e.kind == "refused"] == [
                ("refused", -32002)
            ]
            answers = [m for m in map(json.loads, silent.received) if m.get("id") == "r1"]
            assert [a["error"]["code"] for a in answers] == [-32002]
            mock_clock.jump(20)  # the handshake's deadline
            gone = await trace.receive()
            while gone.kind != "disconnected":
                seen.append(gone)
                gone = await trace.receive()
            assert gone.data["reason"] == "the handshake timed out after 20s during initialize"
            assert gone.data["step"] == "initialize" and gone.data["attempt"] == 1
            assert format_event(gone).startswith(
                "! silent disconnected (the handshake timed out after 20s during initialize); "
                "reconnecting in "
            )
            assert any(
                e.kind == "diagnostic"
                and e.data["text"]
                == "the handshake timed out after 20s waiting for initialize; "
                "closing the link to reconnect"
                for e in seen
            )
            assert silent.opened == 1
            mock_clock.jump(gone.data["retry_in_s"] + 1)
            again = await trace.receive()
            while again.kind != "connecting":
                again = await trace.receive()
            assert again.data["attempt"] == 2 and silent.opened == 2


# -- a call made while the handshake finishes ----------------------------------------------------


class ByHand:
    """A server the test plays message by message over memory channels."""

    def __init__(self) -> None:
        self.to_host, self._from_server = trio.open_memory_channel[str](100)
        self._to_server, self.from_host = trio.open_memory_channel[str](100)

    @asynccontextmanager
    async def open_transport(self, cfg: ServerConfig, on_stderr: Any) -> AsyncIterator[Any]:
        yield MemoryTransport(self._to_server, self._from_server)

    def send(self, message: dict[str, Any]) -> None:
        self.to_host.send_nowait(json.dumps({"jsonrpc": "2.0", **message}))

    async def receive(self, method: str | None = None) -> dict[str, Any]:
        """The host's next message (a request or notification of ``method``, if given)."""
        message: dict[str, Any] = json.loads(await self.from_host.receive())
        assert message.get("method") == method, message
        return message


async def test_a_call_made_while_the_handshake_finishes_waits_for_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy is in force once its update is sent, so the server's messages are served (and
    may be answered by an agent) before the handshake is over; a call made meanwhile is sent
    once the link is ready, never refused as "not connected"."""
    hand = ByHand()
    monkeypatch.setattr("actors.link.connection.open_transport", hand.open_transport)
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
    manifest = {"version": "0.5", "channels": {"register": True, "publish": True}}
    caps = {"tools": {}, "experimental": {"mcpl": manifest}}
    answers: list[Any] = []
    with trio.fail_after(60):
        async with Host.open(config(tmp_path, [{"id": "hand", "command": ["x"]}], agents)) as host:
            init = await hand.receive("initialize")
            hand.send(
                {
                    "id": init["id"],
                    "result": {"protocolVersion": "2024-11-05", "capabilities": caps},
                }
            )
            await hand.receive("notifications/initialized")
            update = await hand.receive("featureSets/update")
            conn = host.ctx.connections["hand"]

            async def call() -> None:
                answers.append(
                    await conn.ask(Call(method="tools/call", params={"name": "t"}), timeout=60)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
                assert answers == []  # it waits: not refused, not sent
                hand.send({"id": update["id"], "result": {"accepted": True}})
                listing = await hand.receive("tools/list")
                hand.send({"id": listing["id"], "result": {"tools": [{"name": "t"}]}})
                sent = await hand.receive("tools/call")
                hand.send({"id": sent["id"], "result": {"content": []}})
    assert answers == [{"content": []}]
