"""The server toolkit's runtime against a host played by the test, line by line, in memory.

The test is the host: it writes JSON-RPC lines into the server's stdin side and reads what the
server writes. MockClock with autojump, so retries and timeouts take no wall time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from actors.serverkit import MCPLServer, NotGranted, PushRefused, ToolError
from actors.serverkit.link import ServerLink
from actors.serverkit.transport import StreamTransport


class FakeHost:
    """Writes the host's lines, reads the server's."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""
        self.next_id = 1
        self.written = 0  # bytes the server wrote

    async def send(self, obj: dict[str, Any]) -> None:
        await self.stream.send_all((json.dumps({"jsonrpc": "2.0", **obj}) + "\n").encode())

    async def ask(self, method: str, params: dict[str, Any] | None = None) -> int:
        rid = self.next_id
        self.next_id += 1
        await self.send({"id": rid, "method": method, "params": params or {}})
        return rid

    async def read(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            assert data, "the server closed"
            self.written += len(data)
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        out: dict[str, Any] = json.loads(line)
        return out

    async def answer_to(self, rid: int) -> dict[str, Any]:
        msg = await self.read()
        assert msg.get("id") == rid and "method" not in msg, msg
        return msg

    async def handshake(self, granted: list[str]) -> dict[str, Any]:
        init = await self.answer_to(await self.ask("initialize", {"protocolVersion": "2024-11-05"}))
        await self.send({"method": "notifications/initialized"})
        params = {"effectiveCapabilities": granted, "enabled": ["demo"]}
        receipt = await self.answer_to(await self.ask("featureSets/update", params))
        assert receipt["result"]["accepted"] is True
        return init


@asynccontextmanager
async def serving(server: MCPLServer) -> AsyncIterator[FakeHost]:
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, StreamTransport(ours, ours))
        yield FakeHost(theirs)
        await theirs.aclose()


def demo() -> MCPLServer:
    server = MCPLServer("demo", request_timeout=5)

    @server.tool()
    async def boom() -> str:
        """Fails."""
        raise ToolError("it broke")

    @server.tool()
    def add(a: int, b: int = 2) -> int:
        """Adds."""
        return a + b

    return server


async def test_tools_list_call_and_refusals() -> None:  # a sync tool runs in a thread: real clock
    with trio.fail_after(30):
        async with serving(demo()) as host:
            init = await host.handshake(["pushEvents", "tools"])
            assert init["result"]["capabilities"]["tools"] == {"listChanged": True}
            listed = await host.answer_to(await host.ask("tools/list"))
            schemas = {t["name"]: t["inputSchema"] for t in listed["result"]["tools"]}
            assert schemas["add"] == {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 2}},
                "required": ["a"],
            }
            called = await host.answer_to(
                await host.ask("tools/call", {"name": "add", "arguments": {"a": 1}})
            )
            assert called["result"]["content"] == [{"type": "text", "text": "3"}]
            bad = await host.answer_to(
                await host.ask("tools/call", {"name": "add", "arguments": {"a": "x"}})
            )
            assert bad["error"]["code"] == -32602
            assert bad["error"]["message"].endswith("'a': expected integer, got string \"x\"")
            boom = await host.answer_to(await host.ask("tools/call", {"name": "boom"}))
            assert boom["result"] == {
                "content": [{"type": "text", "text": "it broke"}],
                "isError": True,
            }
            unknown = await host.answer_to(await host.ask("channels/acknowledge"))
            assert unknown["error"]["code"] == -32601


async def test_an_ungranted_push_is_refused_before_a_byte_is_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = demo()
    with trio.fail_after(30):
        async with serving(server) as host:
            with pytest.raises(NotGranted, match=r"no host is connected|not sent its grant"):
                await server.push_event("too early")
            await host.handshake(["tools"])
            written = host.written
            with pytest.raises(NotGranted, match="'pushEvents', which the host has not granted"):
                await server.push_event("not granted")
            # the server wrote nothing: the next thing it writes is the answer to a ping
            rid = await host.ask("ping")
            assert await host.answer_to(rid) == {"jsonrpc": "2.0", "id": rid, "result": {}}
            assert (
                host.written - written
                == len(
                    json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}, separators=(",", ":"))
                )
                + 1
            )


async def test_a_push_is_retried_under_its_event_id_until_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = demo()
    with trio.fail_after(120):
        async with serving(server) as host:
            await host.handshake(["pushEvents", "tools"])
            async with trio.open_nursery() as nursery:
                results: list[Any] = []

                async def push() -> None:
                    results.append(await server.push_event("hello", tags=["chat:ambient"]))

                nursery.start_soon(push)
                first = await host.read()  # answered with "not ready yet"
                await host.send(
                    {"id": first["id"], "error": {"code": -32002, "message": "Capability denied"}}
                )
                second = await host.read()  # left unanswered: it times out
                third = await host.read()
                ids = {m["params"]["eventId"] for m in (first, second, third)}
                assert len(ids) == 1 and first["params"]["featureSet"] == "demo"
                assert first["params"]["payload"]["content"] == [{"type": "text", "text": "hello"}]
                # meanwhile the host's own request is served
                rid = await host.ask("ping")
                assert (await host.answer_to(rid))["result"] == {}
                await host.send({"id": third["id"], "result": {"accepted": True}})
            assert results[0].accepted and results[0].event_id == ids.pop()


async def test_a_policy_refusal_is_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    server = demo()
    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake(["pushEvents", "tools"])
            async with trio.open_nursery() as nursery:
                failures: list[BaseException] = []

                async def push() -> None:
                    try:
                        await server.push_event("x")
                    except PushRefused as exc:
                        failures.append(exc)

                nursery.start_soon(push)
                sent = await host.read()
                await host.send({"id": sent["id"], "error": {"code": -32001, "message": "off"}})
            assert "-32001" in str(failures[0])


async def test_the_grant_wakes_waiters_and_starts_hooks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = demo()
    started: list[str] = []

    @server.on_granted("pushEvents")
    async def hello() -> None:
        started.append("pushEvents")

    @server.on_granted("demo")
    async def enabled() -> None:
        started.append("demo")

    with trio.fail_after(30):
        async with serving(server) as host:
            async with trio.open_nursery() as nursery:
                waited: list[bool] = []

                async def wait() -> None:
                    await server.granted("pushEvents")
                    waited.append(server.is_granted("pushEvents"))

                nursery.start_soon(wait)
                await host.handshake(["pushEvents", "tools"])
            assert waited == [True]
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(started) == ["demo", "pushEvents"]
            # a narrower grant takes it away again
            rid = await host.ask("featureSets/update", {"effectiveCapabilities": []})
            await host.answer_to(rid)
            assert not server.is_granted("pushEvents")


async def test_a_push_lost_with_its_connection_is_sent_again_on_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = demo()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            results: list[Any] = []
            first_side, first_host = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, StreamTransport(first_side, first_side))
            host = FakeHost(first_host)
            await host.handshake(["pushEvents", "tools"])

            async def push() -> None:
                results.append(await server.push_event("survives"))

            nursery.start_soon(push)
            lost = await host.read()
            await first_host.aclose()  # the host goes away with the push unanswered
            second_side, second_host = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, StreamTransport(second_side, second_side))
            host = FakeHost(second_host)
            await host.handshake(["pushEvents", "tools"])
            again = await host.read()
            assert again["method"] == "push/event"
            assert again["params"]["eventId"] == lost["params"]["eventId"]
            await host.send({"id": again["id"], "result": {"accepted": True}})
            await trio.testing.wait_all_tasks_blocked()
            assert results[0].accepted
            await second_host.aclose()


async def test_a_tool_added_while_running_is_announced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = demo()
    with trio.fail_after(30):
        async with serving(server) as host:
            await host.handshake(["pushEvents", "tools"])

            @server.tool()
            async def late() -> str:
                """Registered late."""
                return "late"

            await server.tools_changed()
            assert await host.read() == {
                "jsonrpc": "2.0",
                "method": "notifications/tools/list_changed",
                "params": {},
            }
            listed = await host.answer_to(await host.ask("tools/list"))
            assert "late" in [t["name"] for t in listed["result"]["tools"]]


async def test_our_requests_wait_for_a_free_slot(autojump_clock: trio.testing.MockClock) -> None:
    server = demo()
    ours, theirs = trio.testing.memory_stream_pair()
    session = server.new_session()
    link = ServerLink(session, StreamTransport(ours, ours), server, max_pending=1)
    host = FakeHost(theirs)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            await host.handshake(["pushEvents", "tools"])
            answers: list[Any] = []

            async def ask(n: int) -> None:
                answers.append(await link.request("ping", {"n": n}))

            nursery.start_soon(ask, 1)
            nursery.start_soon(ask, 2)
            first = await host.read()
            with trio.move_on_after(5) as idle:  # the second waits for the slot: nothing comes
                await host.read()
            assert idle.cancelled_caught and host.buf == b""
            await host.send({"id": first["id"], "result": {"n": 1}})
            second = await host.read()
            assert second["params"]["n"] != first["params"]["n"]
            await host.send({"id": second["id"], "result": {"n": 2}})
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(a["n"] for a in answers) == [1, 2]
            await theirs.aclose()
