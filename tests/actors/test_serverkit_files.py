"""Bulk references of the server toolkit: the bounded shelf and the HTTP answers on the
websocket's own port (real loopback sockets, the real clock)."""

from __future__ import annotations

import pytest
import trio

from actors.serverkit import MCPLServer
from actors.serverkit.files import Shelf
from protocol.references import digest_of


def test_a_reference_needs_an_origin() -> None:
    with pytest.raises(RuntimeError, match="websocket transport"):
        Shelf().put(b"x")


def test_the_shelf_drops_its_oldest_past_either_cap() -> None:
    shelf = Shelf(max_files=2, max_bytes=10)
    shelf.origin = "http://127.0.0.1:1"
    a, b, c = (shelf.put(bytes([n]) * 4) for n in range(3))
    paths = [blk["uri"].removeprefix(shelf.origin) for blk in (a, b, c)]
    assert [shelf.get(p) is not None for p in paths] == [False, True, True]
    d = shelf.put(b"z" * 8)  # over max_bytes with b and c: both go
    assert [shelf.get(p) is not None for p in paths] == [False, False, False]
    assert shelf.get(d["uri"].removeprefix(shelf.origin)) is not None
    with pytest.raises(ValueError, match="over the shelf"):
        shelf.put(b"y" * 11)
    assert d == {
        "type": "resource",
        "uri": d["uri"],
        "mimeType": "application/octet-stream",
        "sizeBytes": 8,
        "digest": digest_of(b"z" * 8),
    }


async def http_get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        out = b""
        while data := await stream.receive_some(65536):
            out += data
    return out


async def test_the_websocket_port_serves_shelved_bytes_and_nothing_else() -> None:
    server = MCPLServer("files")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.serve_websocket, "127.0.0.1", 0)
            port = int(url.rsplit(":", 1)[1].strip("/"))
            block = server.reference(b"payload", mime_type="text/plain", name="p.txt")
            assert block["uri"].startswith(f"http://127.0.0.1:{port}/refs/")
            path = block["uri"].split(str(port), 1)[1]
            ok = await http_get(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert ok.startswith(b"HTTP/1.1 200 ") and ok.endswith(b"\r\n\r\npayload")
            assert b"content-type: text/plain" in ok.lower()
            missing = await http_get(port, b"GET /refs/nope HTTP/1.1\r\nHost: x\r\n\r\n")
            assert missing.startswith(b"HTTP/1.1 404 ")
            post = await http_get(port, f"POST {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert post.startswith(b"HTTP/1.1 405 ")
            nursery.cancel_scope.cancel()
