"""How the toolkit runs a server's handlers: a handler may await any toolkit call, a publish is
answered before its handler's first call to the host, publishes into one channel and lifecycle
notices are handled in order, and the reader never waits for a handler.

The test plays the host line by line, as in :mod:`tests.actors.test_serverkit`, and like mcplive
it holds back what could be the echo of a post until the post is answered. MockClock with
autojump: a handler that waited for ever would show as the test's deadline.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

import actors.serverkit.link
import actors.serverkit.run
from actors.serverkit import Lifecycle, MCPLServer, Publish, PublishRefused
from actors.serverkit.link import ServerLink
from tests.actors.test_serverkit import FakeHost, serving

GRANT = [
    "pushEvents",
    "channels.register",
    "channels.incoming",
    "channels.publish",
    "channels.lifecycle",
]


def chat() -> MCPLServer:
    """A server named like the fake host's enabled feature set, with rooms ``a`` and ``b``."""
    server = MCPLServer("demo", request_timeout=600)
    server.channel("a", publish_target="root")
    server.channel("b", publish_target="root")
    return server


async def connected(host: FakeHost) -> None:
    """The handshake, and the server's channels accepted."""
    await host.handshake(GRANT)
    register = await host.read()
    assert register["method"] == "channels/register"
    accepted = [{"id": c["id"], "accepted": True} for c in register["params"]["channels"]]
    await host.send({"id": register["id"], "result": {"results": accepted}})
    await trio.testing.wait_all_tasks_blocked()


def text(words: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": words}]


async def publish(host: FakeHost, channel: str, words: str) -> int:
    """Send one ``channels/publish`` request as agent Ada; its id."""
    params = {"channelId": channel, "conversationId": "agent:Ada", "content": text(words)}
    return await host.ask("channels/publish", params)


async def test_a_publish_is_answered_before_its_handler_first_calls_the_host(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = chat()
    seen: list[Publish] = []
    sent: list[dict[str, Any]] = []

    @server.channels["a"].on_publish
    async def echo(post: Publish) -> None:  # the echo as Channel.send's docstring advises
        seen.append(post)
        author = {"id": post.conversation_id, "name": post.agent}
        sent.append(await server.channels["a"].send(post.text, author=author))

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            rid = await publish(host, "a", "hello")
            answer = await host.read()  # the host holds the echo until this comes
            assert answer.get("id") == rid and "method" not in answer, answer
            assert answer["result"] == {"delivered": True, "messageId": seen[0].message_id}
            incoming = await host.read()
            assert incoming["method"] == "channels/incoming"
            [message] = incoming["params"]["messages"]
            assert message["content"] == text("hello")
            result = {"messageId": message["messageId"], "accepted": True}
            await host.send({"id": incoming["id"], "result": {"results": [result]}})
            await trio.testing.wait_all_tasks_blocked()
            assert sent == [result]  # the handler went on to the end


async def test_the_handlers_own_tasks_call_for_it_and_a_spawned_one_does_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child in the handler's nursery is the handler's: its echo answers the publish first.
    A task started with ``server.spawn`` runs beside the connection: the handler's return
    decides the answer, and the echo goes out before it (the host holds the echo meanwhile)."""
    server = chat()
    room = server.channels["a"]
    gate = trio.Event()

    @room.on_publish
    async def post(p: Publish) -> str:
        author = {"id": "agent:Ada", "name": "Ada"}
        if p.text == "nursery":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(room.send, p.text, author=author))
        else:
            server.spawn(functools.partial(room.send, p.text, author=author, message_id="m-2"))
            await gate.wait()
        return "m-" + p.text

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            first = await publish(host, "a", "nursery")
            answer = await host.answer_to(first)
            assert answer["result"]["messageId"] != "m-nursery"  # answered before the echo
            incoming = await host.read()
            [message] = incoming["params"]["messages"]
            result = {"messageId": message["messageId"], "accepted": True}
            await host.send({"id": incoming["id"], "result": {"results": [result]}})
            second = await publish(host, "a", "spawned")
            echo = await host.read()
            assert echo["method"] == "channels/incoming"  # the echo first, the answer waits
            gate.set()
            assert (await host.answer_to(second))["result"]["messageId"] == "m-spawned"
            result = {"messageId": "m-2", "accepted": True}
            await host.send({"id": echo["id"], "result": {"results": [result]}})


async def test_publishes_into_one_channel_are_handled_in_the_order_they_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = chat()
    started: list[str] = []
    gate = trio.Event()

    @server.on_publish
    async def post(p: Publish) -> str:
        started.append(p.text)
        if p.text == "a1":
            await gate.wait()  # slow, but it calls nothing of the host
        return f"m-{p.text}"

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            ids = {w: await publish(host, c, w) for c, w in (("a", "a1"), ("a", "a2"), ("b", "b1"))}
            await trio.testing.wait_all_tasks_blocked()
            assert started == ["a1", "b1"]  # a2 waits for a1's answer; b is another lane
            assert (await host.answer_to(ids["b1"]))["result"]["messageId"] == "m-b1"
            gate.set()
            assert (await host.answer_to(ids["a1"]))["result"]["messageId"] == "m-a1"
            assert (await host.answer_to(ids["a2"]))["result"]["messageId"] == "m-a2"
            assert started == ["a1", "b1", "a2"]


async def test_a_publish_answered_early_lets_the_next_in_its_channel_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = chat()
    done: list[str] = []

    @server.on_publish
    async def post(p: Publish) -> None:
        if p.text == "a1":
            await server.push_event("a1 arrived")
        done.append(p.text)

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            first = await publish(host, "a", "a1")
            second = await publish(host, "a", "a2")
            assert (await host.answer_to(first))["result"]["delivered"] is True
            push = await host.read()
            assert push["method"] == "push/event"
            assert (await host.answer_to(second))["result"]["delivered"] is True
            assert done == ["a2"]  # a1 still waits for the push's answer
            await host.send({"id": push["id"], "result": {"accepted": True}})
            await trio.testing.wait_all_tasks_blocked()
            assert done == ["a2", "a1"]


async def test_what_a_handler_decides_after_its_first_call_is_logged_not_sent(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    server = chat()
    seen: list[Publish] = []

    @server.on_publish
    async def post(p: Publish) -> None:
        seen.append(p)
        await server.push_event("thinking it over")
        raise PublishRefused("changed my mind")

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            rid = await publish(host, "a", "a1")
            answer = await host.answer_to(rid)
            assert answer["result"] == {"delivered": True, "messageId": seen[0].message_id}
            push = await host.read()
            await host.send({"id": push["id"], "result": {"accepted": True}})
            await trio.testing.wait_all_tasks_blocked()
            pong = await host.ask("ping")
            assert (await host.read())["id"] == pong  # no second answer to the publish
    err = capsys.readouterr().err
    assert "channels/publish was answered" in err and "changed my mind" in err
    assert "was not sent" in err


async def test_lifecycle_notices_are_handled_one_at_a_time_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = chat()
    steps: list[str] = []

    @server.on_lifecycle
    async def watch(event: Lifecycle) -> None:
        steps.append(f"{event.phase} begins")
        if event.phase == "started":
            await server.push_event("a turn started")
        steps.append(f"{event.phase} ends")

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            for phase in ("started", "completed"):
                params = {"inferenceId": "i1", "conversationId": "agent:Ada", "phase": phase}
                await host.send({"method": "inference/lifecycle", "params": params})
            push = await host.read()
            await trio.testing.wait_all_tasks_blocked()
            assert steps == ["started begins"]  # completed waits for started's handler
            await host.send({"id": push["id"], "result": {"accepted": True}})
            await trio.testing.wait_all_tasks_blocked()
            assert steps == ["started begins", "started ends", "completed begins", "completed ends"]


async def test_a_publish_answered_early_frees_its_handler_place(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one place for handlers: the handler in ``a`` awaits its echo, which the host holds
    while a publish is unanswered; the publish in ``b`` still gets the place and its answer."""
    monkeypatch.setattr(
        actors.serverkit.run, "ServerLink", functools.partial(ServerLink, max_handlers=1)
    )
    server = chat()

    @server.on_publish
    async def echo(p: Publish) -> None:
        if p.channel_id == "a":
            await server.channels["a"].send(p.text, author={"id": "agent:Ada", "name": "Ada"})

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            in_a = await publish(host, "a", "a1")
            in_b = await publish(host, "b", "b1")
            assert (await host.answer_to(in_a))["result"]["delivered"] is True
            incoming = await host.read()
            assert incoming["method"] == "channels/incoming"
            assert (await host.answer_to(in_b))["result"]["delivered"] is True
            [message] = incoming["params"]["messages"]
            result = {"messageId": message["messageId"], "accepted": True}
            await host.send({"id": incoming["id"], "result": {"results": [result]}})


async def test_notices_past_the_cap_are_dropped_with_a_line(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(actors.serverkit.link, "MAX_NOTICES", 2)
    server = chat()
    handled: list[str] = []
    gate = trio.Event()

    @server.on_lifecycle
    async def watch(event: Lifecycle) -> None:
        await gate.wait()
        handled.append(event.inference_id)

    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(host)
            for n in range(3):
                params = {"inferenceId": f"i{n}", "phase": "started"}
                await host.send({"method": "inference/lifecycle", "params": params})
            pong = await host.ask("ping")  # the reader goes on meanwhile
            assert (await host.read())["id"] == pong
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
    assert handled == ["i0", "i1"]
    assert "inference/lifecycle dropped: 2 notices are being handled already" in (
        capsys.readouterr().err
    )
