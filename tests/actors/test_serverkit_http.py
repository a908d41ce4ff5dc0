"""The server toolkit's websocket listener beyond one server: HTTP handlers of the server's own
on the same port, and a server of its own for each host connection. Real loopback sockets."""

from __future__ import annotations

import functools
import json

import trio
import trio_websocket

from actors.serverkit import HttpAnswer, HttpRequest, MCPLServer, serve_websocket_each
from actors.serverkit.files import MAX_BODY_BYTES

TIMEOUT = 20


async def http_get(port: int, target: str, method: str = "GET") -> tuple[int, bytes]:
    """One plain HTTP/1.1 request; the status and the body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n"
        await stream.send_all(head.encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), body


async def test_the_servers_own_http_handlers_answer_first() -> None:
    server = MCPLServer("files")
    asked: list[HttpRequest] = []

    @server.on_http
    def hello(request: HttpRequest) -> HttpAnswer | None:
        asked.append(request)
        if request.path != "/hello":
            return None
        return HttpAnswer(status=200, body=b"hi", headers={"Content-Type": "text/plain"})

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(server.serve_websocket, "127.0.0.1", 0))
            port = int(url.rstrip("/").rpartition(":")[2])
            assert await http_get(port, "/hello?x=1") == (200, b"hi")
            status, _ = await http_get(port, "/elsewhere")
            assert status == 404  # left to the toolkit
            assert [(r.method, r.path, r.target) for r in asked] == [
                ("GET", "/hello", "/hello?x=1"),
                ("GET", "/elsewhere", "/elsewhere"),
            ]
            assert asked[0].headers["authorization"] == "Bearer t"
            nursery.cancel_scope.cancel()


async def test_each_host_connection_gets_a_server_of_its_own() -> None:
    made: list[MCPLServer] = []

    def factory() -> MCPLServer:
        server = MCPLServer("room")
        number = len(made) + 1

        @server.tool()
        def which() -> str:
            """Which server answers."""
            return f"server {number}"

        made.append(server)
        return server

    async def rpc(
        ws: trio_websocket.WebSocketConnection, rid: int, method: str, params: dict[str, object]
    ) -> dict[str, object]:
        await ws.send_message(
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        )
        answer = json.loads(await ws.get_message())
        assert answer["id"] == rid, answer
        return dict(answer["result"])

    async def which(ws: trio_websocket.WebSocketConnection, rid: int) -> object:
        result = await rpc(ws, rid, "tools/call", {"name": "which", "arguments": {}})
        return result["content"][0]["text"]  # type: ignore[index]

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve_websocket_each, factory))
            async with (
                trio_websocket.open_websocket_url(url) as one,
                trio_websocket.open_websocket_url(url) as two,
            ):
                init = {"protocolVersion": "2024-11-05", "capabilities": {}}
                await rpc(one, 1, "initialize", init)
                await rpc(two, 1, "initialize", init)
                assert await which(one, 2) == "server 1"
                assert await which(two, 2) == "server 2"
                # the first connection is still served, by its own server
                assert await which(one, 3) == "server 1"
            nursery.cancel_scope.cancel()


async def test_a_handler_reads_the_request_body_up_to_its_cap() -> None:
    server = MCPLServer("hooks")
    bodies: list[bytes] = []

    @server.on_http
    def hook(request: HttpRequest) -> HttpAnswer | None:
        bodies.append(request.body)
        return HttpAnswer(status=202, body=b"taken")

    async def post(port: int, body: bytes, *, chunked: bool = False) -> tuple[int, bytes]:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            if chunked:
                head = "POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                data = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            else:
                head = f"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                data = body
            await stream.send_all(head.encode() + data)
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
        head_bytes, _, rest = answer.partition(b"\r\n\r\n")
        return int(head_bytes.split(b" ", 2)[1]), rest

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(server.serve_websocket, "127.0.0.1", 0))
            port = int(url.rstrip("/").rpartition(":")[2])
            assert await post(port, b'{"text": "build failed"}') == (202, b"taken")
            assert await post(port, b"in chunks", chunked=True) == (202, b"taken")
            status, _ = await post(port, b"x" * (MAX_BODY_BYTES + 1))
            assert status == 413  # refused for the handler, which never sees it
            nursery.cancel_scope.cancel()
    assert bodies == [b'{"text": "build failed"}', b"in chunks"]
