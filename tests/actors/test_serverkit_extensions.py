"""The server toolkit's hooks for servers that shape their own answers: feature sets of the
server's choosing only, tasks beside the connection, and handlers that override or withhold the
toolkit's own answers."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from actors.serverkit import NO_ANSWER, HostRequest, MCPLServer, Publish
from protocol.errors import RpcError
from tests.actors.test_serverkit import serving


def own_sets() -> MCPLServer:
    server = MCPLServer("room", default_feature_sets=False, request_timeout=5)
    server.channel("room:#a", publish_target="root")
    server.feature_set("room.chat", description="chat", uses=["channels.register"])
    server.feature_set("room.events", description="events", uses=["pushEvents"])
    return server


def test_only_the_declared_feature_sets_are_in_the_manifest() -> None:
    manifest = own_sets().manifest()
    assert sorted(manifest["featureSets"]) == ["room.chat", "room.events"]
    assert "tools" not in manifest and "channels" in manifest and manifest["pushEvents"]


def test_the_default_sets_are_unchanged() -> None:
    server = MCPLServer("room")
    server.channel("room:#a")
    server.feature_set("room.extra", description="x", uses=["pushEvents"])
    assert sorted(server.manifest()["featureSets"]) == ["room", "room.extra"]


async def test_a_push_goes_out_under_the_set_that_uses_push_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = own_sets()
    with trio.fail_after(30):
        async with serving(server) as host:
            init = await host.answer_to(await host.ask("initialize", {}))
            assert set(init["result"]["capabilities"]["experimental"]["mcpl"]["featureSets"]) == {
                "room.chat",
                "room.events",
            }
            await host.send({"method": "notifications/initialized"})
            params = {"effectiveCapabilities": ["pushEvents"], "enabled": ["room.events"]}
            await host.answer_to(await host.ask("featureSets/update", params))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.push_event, "tick")
                push = await host.read()
                assert push["method"] == "push/event"
                assert push["params"]["featureSet"] == "room.events"
                await host.send({"id": push["id"], "result": {"accepted": True}})


async def test_a_spawned_task_runs_beside_the_connection_and_needs_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MCPLServer("demo", request_timeout=5)
    ran: list[str] = []

    async def later() -> None:
        ran.append("later")

    assert server.spawn(later) is False  # no host yet: nothing runs

    @server.tool()
    async def kick() -> str:
        """Starts a task beside the connection."""
        assert server.spawn(later) is True
        return "kicked"

    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake(["tools"])
            called = await host.answer_to(await host.ask("tools/call", {"name": "kick"}))
            assert called["result"]["content"] == [{"type": "text", "text": "kicked"}]
            await trio.testing.wait_all_tasks_blocked()
            assert ran == ["later"]


async def test_on_ready_runs_once_per_connection_whatever_was_granted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MCPLServer("demo", request_timeout=5)
    grants: list[bool] = []

    @server.on_ready
    async def ready() -> None:
        grants.append(server.is_granted("pushEvents"))

    with trio.fail_after(30):
        for _ in range(2):  # a second connection is ready again
            async with serving(server) as host:
                await host.handshake([])  # nothing granted: still ready
                await trio.testing.wait_all_tasks_blocked()
                params = {"effectiveCapabilities": ["pushEvents"], "enabled": ["demo"]}
                await host.answer_to(await host.ask("featureSets/update", params))
                await trio.testing.wait_all_tasks_blocked()
    assert grants == [False, False]


async def test_answer_overrides_replace_withhold_or_refuse_the_toolkits_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MCPLServer("demo", request_timeout=5)
    seen: list[HostRequest] = []

    @server.answer_for("featureSets/update")
    def withhold(request: HostRequest) -> object:
        seen.append(request)
        return NO_ANSWER

    @server.answer_for("ping")
    async def late(request: HostRequest) -> object:
        await trio.sleep(5)
        return {"late": True, **request.default}

    @server.answer_for("channels/publish")
    def refuse(request: HostRequest) -> object:
        raise RpcError(code=-32601, message="Method not found: channels/publish")

    with trio.fail_after(30):
        async with serving(server) as host:
            await host.answer_to(await host.ask("initialize", {}))
            await host.send({"method": "notifications/initialized"})
            params = {"effectiveCapabilities": ["pushEvents"], "enabled": ["demo"]}
            await host.ask("featureSets/update", params)
            await trio.testing.wait_all_tasks_blocked()
            # withheld: nothing was written, yet the grant was taken
            assert [r.params for r in seen] == [params] and seen[0].default["accepted"] is True
            assert server.is_granted("pushEvents")
            ping = await host.ask("ping")
            publish = await host.ask("channels/publish", {"channelId": "x", "content": []})
            first, second = await host.read(), await host.read()
            assert first == {
                "jsonrpc": "2.0",
                "id": publish,
                "error": {"code": -32601, "message": "Method not found: channels/publish"},
            }
            assert second == {"jsonrpc": "2.0", "id": ping, "result": {"late": True}}


async def test_a_raw_line_goes_out_as_it_is(autojump_clock: trio.testing.MockClock) -> None:
    server = MCPLServer("demo", request_timeout=5)
    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake([])
            await server.send_line("not json")
            while b"\n" not in host.buf:
                host.buf += await host.stream.receive_some(65536)
            assert host.buf == b"not json\n"


async def test_watchers_see_every_host_line_and_every_problem(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``on_line`` sees each line the host sends, before the toolkit answers it; ``on_problem``
    is told what the session refused or skipped (instead of stderr); a watcher that fails is
    logged and the connection goes on."""
    server = MCPLServer("demo", request_timeout=5)
    lines: list[str] = []
    problems: list[str] = []

    @server.on_line
    def seen(line: str) -> None:
        lines.append(line)

    @server.on_line
    def broken(line: str) -> None:
        raise ValueError("a watcher's bug")

    @server.on_problem
    def told(text: str) -> None:
        problems.append(text)

    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake([])
            await host.send({"id": 999, "result": {}})  # an answer to no request of ours
            answer = await host.answer_to(await host.ask("ping", {}))
            assert answer["result"] == {}
    methods = [json.loads(line).get("method") for line in lines]
    assert methods[0] == "initialize" and methods[-1] == "ping"
    assert any('"id": 999' in line for line in lines)
    assert len(problems) == 1 and "999" in problems[0]


async def test_a_publish_handler_knows_whether_the_host_waits_for_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = MCPLServer("room", request_timeout=5)
    server.channel("room:#a", publish_target="root")
    seen: list[tuple[str, bool]] = []

    @server.on_publish
    def post(publish: Publish) -> str:
        seen.append((publish.text, publish.notification))
        return "m-" + publish.text

    content = [{"type": "text", "text": "asked"}]
    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake(["channels.publish"])
            params = {"channelId": "room:#a", "content": [{"type": "text", "text": "told"}]}
            await host.send({"method": "channels/publish", "params": params})
            answer = await host.answer_to(
                await host.ask("channels/publish", {"channelId": "room:#a", "content": content})
            )
            assert answer["result"] == {"delivered": True, "messageId": "m-asked"}
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(seen) == [("asked", False), ("told", True)]


def test_a_capability_no_feature_set_uses_can_be_advertised() -> None:
    server = own_sets()
    system = "contextHooks.beforeInference.inject.system"
    assert system not in server.capabilities()
    server.advertise(system)
    assert system in server.capabilities()
    hooks = server.manifest()["contextHooks"]["beforeInference"]
    assert hooks["inject"]["system"] is True
    assert all(system not in fs.uses for fs in server.feature_sets())
    with pytest.raises(ValueError, match="teleport"):
        server.advertise("teleport")
