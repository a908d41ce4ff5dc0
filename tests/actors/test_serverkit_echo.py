"""``Publish.echo``: the agent's words posted back as the message the publish was confirmed as.

The test plays the host, line by line, in memory (MockClock with autojump): the echo carries
the confirmed id (made up for a handler that returns nothing, or the handler's own), the agent
as author and ``chat:from-self``; a refused publish is echoed nowhere; a message the server
sends itself must name its author.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

from actors.serverkit import MCPLServer, Publish, PublishRefused
from tests.actors.test_serverkit import FakeHost, serving

GRANT = ["channels.register", "channels.publish", "channels.incoming"]
CHANNEL = "room:#a"


def room() -> tuple[MCPLServer, list[Publish]]:
    """A server whose channel echoes every publish; a text starting ``own`` is confirmed under
    an id of the handler's own, one starting ``no`` is refused after asking for its echo."""
    server = MCPLServer("room", request_timeout=5)
    channel = server.channel(CHANNEL, label="#a", publish_target="root")
    seen: list[Publish] = []

    @channel.on_publish
    def post(publish: Publish) -> str | None:
        seen.append(publish)
        publish.echo()
        if publish.text.startswith("no"):
            raise PublishRefused("not here")
        return "own-7" if publish.text.startswith("own") else None

    return server, seen


async def started(host: FakeHost) -> None:
    """The handshake, and the channel's registration accepted."""
    await host.handshake(GRANT)
    register = await host.read()
    assert register["method"] == "channels/register"
    results = [{"id": CHANNEL, "accepted": True}]
    await host.send({"id": register["id"], "result": {"results": results}})


async def publish(host: FakeHost, text: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Publish ``text`` as Ada; the answer, and the ``channels/incoming`` request the server
    sent for it (answered as accepted), whichever came first; None when a ping's answer comes
    before any."""
    params = {
        "channelId": CHANNEL,
        "content": [{"type": "text", "text": text}],
        "conversationId": "agent:Ada",
    }
    rid = await host.ask("channels/publish", params)
    answer: dict[str, Any] | None = None
    echo: dict[str, Any] | None = None
    ping: int | None = None
    while True:
        msg = await host.read()
        if msg.get("id") == rid and "method" not in msg:
            answer = msg
            ping = await host.ask("ping")  # anything sent for the publish comes before its answer
        elif msg.get("method") == "channels/incoming":
            echo = msg
            [message] = msg["params"]["messages"]
            entry = {"messageId": message["messageId"], "accepted": True}
            await host.send({"id": msg["id"], "result": {"results": [entry]}})
        elif ping is not None and msg.get("id") == ping:
            assert answer is not None
            return answer, echo
        else:
            raise AssertionError(f"unexpected: {msg}")


async def test_an_echo_carries_the_id_made_up_for_the_publish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server, seen = room()
    with trio.fail_after(30):
        async with serving(server) as host:
            await started(host)
            answer, echo = await publish(host, "hello room")
    [heard] = seen
    made = answer["result"]["messageId"]
    assert answer["result"] == {"delivered": True, "messageId": made}
    assert made == heard.message_id  # known to the handler before it returned
    assert echo is not None
    [message] = echo["params"]["messages"]
    assert message["messageId"] == made
    assert message["author"] == {"id": "agent:Ada", "name": "Ada"}
    assert message["content"] == [{"type": "text", "text": "hello room"}]
    assert message["tags"] == ["chat:from-self"]
    assert message["channelId"] == CHANNEL and "threadId" not in message


async def test_an_echo_carries_the_id_the_handler_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server, seen = room()
    with trio.fail_after(30):
        async with serving(server) as host:
            await started(host)
            answer, echo = await publish(host, "own words")
            second, again = await publish(host, "hello twice")
    assert answer["result"] == {"delivered": True, "messageId": "own-7"}
    assert echo is not None and echo["params"]["messages"][0]["messageId"] == "own-7"
    # each publish gets an id of its own
    assert again is not None
    assert again["params"]["messages"][0]["messageId"] == second["result"]["messageId"]
    assert len({p.message_id for p in seen}) == 2


async def test_a_refused_publish_is_echoed_nowhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server, _ = room()
    with trio.fail_after(30):
        async with serving(server) as host:
            await started(host)
            answer, echo = await publish(host, "no thanks")
    assert answer["result"] == {"delivered": False, "reason": "not here"}
    assert echo is None


async def test_an_echo_asked_for_after_the_answer_goes_out_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MCPLServer("room", request_timeout=5)
    channel = server.channel(CHANNEL, label="#a", publish_target="root")
    later: list[Publish] = []

    @channel.on_publish
    async def post(publish: Publish) -> None:
        later.append(publish)

    with trio.fail_after(30):
        async with serving(server) as host:
            await started(host)
            answer, echo = await publish(host, "later")
            assert echo is None
            later[0].echo("later, reworded", author="Ada")
            msg = await host.read()
    assert msg["method"] == "channels/incoming"
    [message] = msg["params"]["messages"]
    assert message["messageId"] == answer["result"]["messageId"]
    assert message["author"] == {"id": "Ada", "name": "Ada"}
    assert message["content"] == [{"type": "text", "text": "later, reworded"}]


def test_a_publish_not_handed_out_by_the_toolkit_cannot_echo() -> None:
    publish = Publish.from_params({"channelId": CHANNEL, "content": []})
    with pytest.raises(RuntimeError, match="echo"):
        publish.echo()


async def test_a_message_must_name_its_author() -> None:
    server = MCPLServer("room")
    channel = server.channel(CHANNEL, label="#a", publish_target="root")
    with pytest.raises(TypeError, match="author"):
        await channel.send("who wrote this?")  # type: ignore[call-arg]


async def test_a_push_scoped_to_a_channel_waits_for_its_registration() -> None:
    # the real clock: the wait under test is bounded by the request timeout
    server = MCPLServer("demo", request_timeout=30)
    server.channel(CHANNEL, label="#a", publish_target="root")
    origin = {"mcplChannelId": CHANNEL}
    with trio.fail_after(20):
        async with serving(server) as host:
            await host.handshake([*GRANT, "channels.lifecycle", "pushEvents"])
            register = await host.read()
            assert register["method"] == "channels/register"
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(server.push_event, "hi", origin=origin))
                await trio.testing.wait_all_tasks_blocked()
                ping = await host.ask("ping")
                assert (await host.read())["id"] == ping  # the push has not gone out
                results = [{"id": CHANNEL, "accepted": True}]
                await host.send({"id": register["id"], "result": {"results": results}})
                push = await host.read()
                assert push["method"] == "push/event"
                assert push["params"]["origin"] == origin
                await host.send({"id": push["id"], "result": {"accepted": True}})


async def test_a_publish_answered_early_is_echoed_as_the_id_the_host_was_told(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the handler asks for its echo, then calls the host (so the publish is answered at once,
    # as delivered under message_id), then returns an id of its own: too late to be the
    # confirmed one, so the echo carries the id the host was told
    server = MCPLServer("room", request_timeout=5)
    channel = server.channel(CHANNEL, label="#a", publish_target="root")

    @channel.on_publish
    async def post(publish: Publish) -> str:
        publish.echo()
        await channel.send("a note first", author="bot")
        return "own-9"

    params = {
        "channelId": CHANNEL,
        "content": [{"type": "text", "text": "hello"}],
        "conversationId": "agent:Ada",
    }
    with trio.fail_after(30):
        async with serving(server) as host:
            await started(host)
            rid = await host.ask("channels/publish", params)
            answer: dict[str, Any] | None = None
            echoed: dict[str, Any] | None = None
            while answer is None or echoed is None:
                msg = await host.read()
                if msg.get("id") == rid and "method" not in msg:
                    answer = msg
                elif msg.get("method") == "channels/incoming":
                    [message] = msg["params"]["messages"]
                    if "chat:from-self" in message.get("tags", []):
                        echoed = message
                    entry = {"messageId": message["messageId"], "accepted": True}
                    await host.send({"id": msg["id"], "result": {"results": [entry]}})
    told = answer["result"]["messageId"]
    assert answer["result"] == {"delivered": True, "messageId": told}
    assert told != "own-9"
    assert echoed["messageId"] == told
