"""A publish waiting for its answer holds only what could be its echo.

An in-process websocket chat server holds its answer to ``channels/publish`` until the test
releases it. Meanwhile another user's message on the same channel is stored, answered and wakes
the other agent; the echo of the post itself, sent by the server before its answer, is still
recognised (not stored for its author, waking nobody); past ``MAX_DEFERRED`` waiting batches an
item that could be the echo is taken at once.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

import actors.channel.actor
from actors import Host
from tests.chat_servers import DiscordServer, running_chat, stored_by_message
from tests.helpers import wait_trace

pytestmark = pytest.mark.slow

ROOM = DiscordServer.GENERAL_1
OWN_ACCOUNT = {"id": "bot-1", "name": "mcplive"}  # the host's account, as the server names it
POST = "hello from Ada"
REQUEST_TIMEOUT_S = 10.0


class HoldingServer(DiscordServer):
    """Holds every ``channels/publish`` answer until :attr:`release` is set, noting in
    :attr:`order` when it answers; with ``echo_first`` it first sends the post back as a
    ``channels/incoming`` message by the host's account, carrying the id its answer will name
    (:attr:`echo_answered` is set when the host answers that)."""

    def __init__(self, *, echo_first: bool = False) -> None:
        super().__init__()
        self.echo_first = echo_first
        self.publish_seen = trio.Event()
        self.release = trio.Event()
        self.echo_sent = trio.Event()
        self.echo_answered = trio.Event()
        self.order: list[str] = []

    async def answer(self, method: str, params: Mapping[str, Any]) -> Any:
        if method == "channels/publish":
            if self.echo_first:
                echo = self.message(
                    params["channelId"],
                    f"{self.server_id}-pub-1",
                    params["content"],
                    author=OWN_ACCOUNT,
                )
                self.spawn(self._echo, echo)
                await self.echo_sent.wait()
            self.publish_seen.set()
            await self.release.wait()
            self.order.append("publish answered")
        return await super().answer(method, params)

    async def _echo(self, echo: dict[str, Any]) -> None:
        await self.incoming(echo)
        self.order.append("echo answered")
        self.echo_answered.set()

    def on_sent(self, request: Mapping[str, Any]) -> None:
        if request.get("method") == "channels/incoming":
            self.echo_sent.set()

    def server_config(self, **keys: Any) -> dict[str, Any]:
        # a publish unanswered is given up after this + 5 s: the wait under test is not that
        return super().server_config(request_timeout_s=REQUEST_TIMEOUT_S, **keys)


async def post(host: Host, order: list[str], results: dict[str, Any]) -> None:
    """Ada posts :data:`POST` into :data:`ROOM`; notes in ``order`` when the post settles."""
    results["post"] = await host.execute_tool_call(
        "Ada", "channel_publish", {"channel_id": ROOM, "content": POST}
    )
    order.append("post settled")


def turns(host: Host, agent: str) -> int:
    return host.ctx.agent_statuses[agent].turns


async def test_another_users_message_is_taken_while_a_publish_waits_for_its_answer(
    tmp_path: Path,
) -> None:
    server = HoldingServer()
    results: dict[str, Any] = {}
    with trio.fail_after(90):
        async with running_chat(tmp_path, server, agents=("Ada", "Grace")) as host:
            stream = host.trace(kinds={"turn-start"})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, host, server.order, results)
                await server.publish_seen.wait()
                await server.say(ROOM, "d1", "hi everyone")  # answered once stored
                server.order.append("incoming answered")
                await wait_trace(stream, lambda e: e.agent == "Grace", "Grace's wake")
                server.order.append("Grace woke")
                server.release.set()
            await host.run_until_idle()
            assert server.order == [
                "incoming answered",
                "Grace woke",
                "publish answered",
                "post settled",
            ]
            assert not results["post"]["is_error"], results["post"]
            assert "delivered as discord-pub-1" in results["post"]["content"][0]["text"]
            for agent in ("Ada", "Grace"):
                assert "d1" in stored_by_message(host, agent)


async def test_the_echo_of_a_post_sent_before_its_answer_is_recognised(tmp_path: Path) -> None:
    server = HoldingServer(echo_first=True)
    results: dict[str, Any] = {}
    with trio.fail_after(90):
        async with running_chat(tmp_path, server, agents=("Ada", "Grace")) as host:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, host, server.order, results)
                await server.publish_seen.wait()  # the echo went out before the answer
                server.release.set()
                await server.echo_answered.wait()
            await host.run_until_idle()
            assert "delivered as discord-pub-1" in results["post"]["content"][0]["text"]
            assert "discord-pub-1" not in stored_by_message(host, "Ada")  # not stored again
            echo = stored_by_message(host, "Grace")["discord-pub-1"]  # the others hear it
            assert echo["metadata"]["author"] == OWN_ACCOUNT
            assert (turns(host, "Ada"), turns(host, "Grace")) == (0, 0)  # it woke nobody


async def test_past_the_cap_a_possible_echo_is_taken_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actors.channel.actor, "MAX_DEFERRED", 0)
    server = HoldingServer(echo_first=True)
    results: dict[str, Any] = {}
    with trio.fail_after(90):
        async with running_chat(tmp_path, server, agents=("Ada", "Grace")) as host:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, host, server.order, results)
                await server.publish_seen.wait()
                await server.echo_answered.wait()  # no room to wait: answered at once
                server.release.set()
            await host.run_until_idle()
            assert server.order == ["echo answered", "publish answered", "post settled"]
            # taken before its receipt: stored as any message is, for its author too
            assert "discord-pub-1" in stored_by_message(host, "Ada")
