"""A websocket MCPL server that blocks its read loop on its own first request, as some real
servers do, run in-process on loopback (``nursery.start(server.serve)`` returns its url).

After ``notifications/initialized`` it sends ``channels/register`` for ``block:#room`` at once
and reads nothing else until that request is answered: every other frame the host sends
meanwhile (our ``featureSets/update`` first of all) is queued, unanswered. It gives up on the
register after ``GIVE_UP_S`` (30 s, as real servers do; :attr:`BlockingServer.gave_up` is then
set) and carries on with its queue. On a -32002 answer it processes its queued frames (answering
``featureSets/update``) and, once it has answered the update, retries the register;
:attr:`BlockingServer.registered` is set when a register is accepted.

Otherwise it behaves as :class:`tests.chat_servers.ChatServer`: it answers ``initialize`` (MCPL
0.5 and an MCP ``tools`` capability), ``featureSets/update``, ``tools/list`` (one tool,
``noop``), ``ping`` and ``channels/publish`` (:attr:`BlockingServer.publish_seen` is set at
the first); :meth:`say` sends a message in ``block:#room``. Each answer the host gave to a
register attempt is kept in :attr:`BlockingServer.register_answers`.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio_websocket

from tests.chat_servers import ChatServer, descriptor

GIVE_UP_S = 30.0
ROOM = "block:#room"
NOOP = {"name": "noop", "description": "does nothing", "inputSchema": {"type": "object"}}


class BlockingServer(ChatServer):
    def __init__(self) -> None:
        super().__init__(
            "block",
            [descriptor(ROOM, "#room", "chat", "root")],
            author={"id": "u7", "name": "una"},
        )
        self.gave_up = False
        self.registered = trio.Event()
        self.updated = trio.Event()
        self.publish_seen = trio.Event()
        self.register_answers: list[dict[str, Any]] = []

    async def _accept(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        self._ws = ws
        self._connected.set()
        self.updated = trio.Event()
        async with trio.open_nursery() as nursery:
            try:
                await self._session(ws, nursery)
            except trio_websocket.ConnectionClosed:
                pass
            nursery.cancel_scope.cancel()
        for event, _ in self._waiting.values():
            event.set()

    async def _next(self, ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
        msg: dict[str, Any] = json.loads(await ws.get_message())
        self.received.append(msg)
        return msg

    async def _session(self, ws: trio_websocket.WebSocketConnection, nursery: trio.Nursery) -> None:
        # the handshake, answered as it comes, up to notifications/initialized
        while (msg := await self._next(ws)).get("method") != "notifications/initialized":
            if "method" in msg and "id" in msg:
                await self._answer_host(msg, nursery)
        # its own first request, and nothing else read until it is answered
        rid = next(self._ids)
        register = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "channels/register",
            "params": {"channels": list(self.channels.values())},
        }
        await self._send(register)
        queued: list[dict[str, Any]] = []
        answer: dict[str, Any] | None = None
        with trio.move_on_after(GIVE_UP_S):
            while answer is None:
                msg = await self._next(ws)
                if "method" not in msg and msg.get("id") == rid:
                    answer = msg
                else:
                    queued.append(msg)
        if answer is None:
            self.gave_up = True
        else:
            self._registered(register, answer)
        for msg in queued:
            self._dispatch(msg, nursery)
        if answer is not None and answer.get("error", {}).get("code") == -32002:
            nursery.start_soon(self._retry_register)
        while True:
            self._dispatch(await self._next(ws), nursery)

    def _registered(self, request: dict[str, Any], answer: dict[str, Any]) -> None:
        self.register_answers.append(answer)
        self.answers.append((request, answer))
        results = answer.get("result", {}).get("results", [])
        if results and all(r.get("accepted") for r in results):
            self.registered.set()

    async def _retry_register(self) -> None:
        """Once the update is answered (the server is ready), register again."""
        await self.updated.wait()
        params = {"channels": list(self.channels.values())}
        answer = await self.request("channels/register", params)
        self.register_answers.append(answer)
        results = answer.get("result", {}).get("results", [])
        if results and all(r.get("accepted") for r in results):
            self.registered.set()

    async def _answer_host(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        method, rid = msg["method"], msg["id"]
        result: Any
        if method == "initialize":
            result = {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}, "experimental": {"mcpl": self.manifest()}},
                "serverInfo": {"name": "block-test", "version": "0"},
            }
        elif method == "featureSets/update":
            result = {"accepted": True}
        elif method == "tools/list":
            result = {"tools": [NOOP]}
        else:
            if method == "channels/publish":
                self.publish_seen.set()
            await super()._answer_host(msg, nursery)
            return
        await self._send({"jsonrpc": "2.0", "id": rid, "result": result})
        if method == "featureSets/update":
            self.updated.set()
