"""The toolkit's pipelining and in-process hooks: requests sent without waiting
(``ServerLink.start_request``), the ``max_pending`` option, the current ``link`` and the
memory-channel transport. The test plays the host, as in :mod:`tests.actors.test_serverkit`;
MockClock with autojump.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from actors.serverkit import MCPLServer, NotGranted
from actors.serverkit.link import LinkLost, PendingRequest, RequestTimeout
from actors.serverkit.transport import ChannelTransport
from protocol.errors import RpcError
from tests.actors.test_serverkit import FakeHost, serving


def pinger(**options: Any) -> MCPLServer:
    return MCPLServer("demo", request_timeout=5, **options)


async def connected(server: MCPLServer, host: FakeHost) -> None:
    await host.handshake(["pushEvents"])
    await trio.testing.wait_all_tasks_blocked()
    assert server.link is not None


async def read_all(host: FakeHost) -> list[dict[str, Any]]:
    """Every line the server wrote until it went quiet for a while."""
    out = []
    while True:
        with trio.move_on_after(5):
            out.append(await host.read())
            continue
        return out


async def test_start_request_returns_before_the_answer_and_settles_on_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = pinger()
    settled: list[PendingRequest] = []
    with trio.fail_after(60):
        async with serving(server) as host:
            assert server.link is None
            await connected(server, host)
            link = server.link
            assert link is not None
            first = await link.start_request("ping", {"n": 1}, on_settled=settled.append)
            second = await link.start_request("ping", {"n": 2}, on_settled=settled.append)
            assert not first.done.is_set() and settled == []
            sent = [await host.read(), await host.read()]
            assert [m["id"] for m in sent] == [first.id, second.id]
            await host.send({"id": second.id, "error": {"code": -32000, "message": "no"}})
            await host.send({"id": first.id, "result": {"n": 1}})
            assert await first.wait() == {"n": 1}
            with pytest.raises(RpcError, match="-32000"):
                await second.wait()
            assert settled == [second, first]
            third = await link.start_request("ping", {})
            await host.read()
            with pytest.raises(RequestTimeout):
                await third.wait(timeout=3)
            assert not third.done.is_set()  # still pending: it may yet be answered
        assert isinstance(third.error, LinkLost)  # the connection ended first


async def test_start_request_checks_the_grant_unless_told_not_to(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = pinger()
    with trio.fail_after(60):
        async with serving(server) as host:
            await connected(server, host)
            assert server.link is not None
            params = {"channels": [{"id": "x", "type": "chat", "label": "x"}]}
            with pytest.raises(NotGranted):
                await server.link.start_request("channels/register", params)
            pending = await server.link.start_request("channels/register", params, check=False)
            sent = await host.read()
            assert (sent["id"], sent["method"]) == (pending.id, "channels/register")
            await host.send({"id": pending.id, "error": {"code": -32002, "message": "denied"}})
            with pytest.raises(RpcError, match="-32002"):
                await pending.wait()


async def test_by_default_64_requests_are_pending_and_a_further_one_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = pinger()
    assert server.max_pending == 64
    with trio.fail_after(120):
        async with serving(server) as host, trio.open_nursery() as nursery:
            await connected(server, host)
            link = server.link
            assert link is not None

            async def send(n: int) -> None:
                for i in range(n):
                    await link.start_request("ping", {"i": i})

            nursery.start_soon(send, 65)
            sent = await read_all(host)
            assert len(sent) == 64
            await host.send({"id": sent[0]["id"], "result": {}})
            [last] = await read_all(host)
            assert last["params"] == {"i": 64}


async def test_max_pending_lets_thousands_be_pipelined(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = pinger(max_pending=2000)
    with trio.fail_after(120):
        async with serving(server) as host:
            await connected(server, host)
            link = server.link
            assert link is not None
            pending = [await link.start_request("ping", {"i": i}) for i in range(2000)]
            sent = await read_all(host)
            assert [m["params"]["i"] for m in sent] == list(range(2000))
            for message in reversed(sent):
                await host.send({"id": message["id"], "result": message["params"]})
            assert [await p.wait() for p in pending] == [{"i": i} for i in range(2000)]
    with pytest.raises(ValueError, match="max_pending"):
        pinger(max_pending=0)


async def test_a_server_over_memory_channels(autojump_clock: trio.testing.MockClock) -> None:
    server = pinger()
    to_server, server_in = trio.open_memory_channel[str](16)
    server_out, from_server = trio.open_memory_channel[str](16)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, ChannelTransport(server_out, server_in))
            await to_server.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            assert json.loads(await from_server.receive()) == {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {},
            }
            await to_server.aclose()  # the host hangs up: the server's side ends
        with pytest.raises(trio.EndOfChannel):
            await from_server.receive()
    assert server.link is None
