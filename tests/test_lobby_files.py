"""The lobby's files (``tests/lobby/files.py``): with ``--files`` its websocket
port answers ``GET /files/<name>``, a ``share`` command pushes a reference to one, and every
live session's control link hears of each request answered. In process, on real loopback."""

from __future__ import annotations

import functools

import trio

from tests.actors.test_serverkit_http import http_get
from tests.lobby.control import open_control_listener
from tests.lobby.server import LobbyOptions, builtin_files, serve_ws
from tests.test_lobby_server import TIMEOUT, pushed, ws_peer


async def test_a_shared_file_is_served_and_each_request_reported() -> None:
    board = builtin_files()["board.png"]
    with trio.fail_after(TIMEOUT):
        async with open_control_listener() as listener, trio.open_nursery() as nursery:
            options = LobbyOptions(script="none", files=True, control_connect=listener.address)
            port = await nursery.start(functools.partial(serve_ws, "127.0.0.1", 0, options))
            async with ws_peer(f"ws://127.0.0.1:{port}") as peer:
                ctl = await listener.accept()
                await peer.handshake()
                await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
                ctl.send({"cmd": "share", "file": "board.png", "eventId": "s1", "text": "Look."})
                params = await pushed(peer, ctl, "s1")
                text, reference = params["payload"]["content"]
                assert text == {"type": "text", "text": "Look."}
                assert reference == {
                    "type": "resource",
                    "uri": f"http://127.0.0.1:{port}/files/board.png",
                    "mimeType": "image/png",
                    "sizeBytes": board.size,
                    "digest": board.digest,
                    "name": "board.png",
                }
                assert await http_get(port, "/files/board.png?x=1") == (200, board.data)
                assert (await http_get(port, "/files/nothing.png"))[0] == 404
                assert (await http_get(port, "/files/board.png", "POST"))[0] == 405
                ctl.send({"cmd": "ping", "id": "fence"})  # after every event before it
                await ctl.wait_for(lambda e: e["event"] == "pong", "pong")
                events = [e for e in ctl.events if e["event"] == "http"]
                seen = [(e["method"], e["path"], e["status"]) for e in events]
                assert {e["authorization"] for e in events} == {"Bearer t"}
                assert seen == [
                    ("GET", "/files/board.png", 200),
                    ("GET", "/files/nothing.png", 404),
                    ("POST", "/files/board.png", 405),
                ]
                ctl.send({"cmd": "share", "file": "nothing.png"})
                error = await ctl.wait_for(lambda e: e["event"] == "error", "unknown file")
                assert "unknown file" in error["text"]
                await ctl.aclose()
            nursery.cancel_scope.cancel()
