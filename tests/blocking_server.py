"""A websocket MCPL server that blocks its read loop on its own first request, as some real
servers do, run in-process on loopback (``nursery.start(server.serve)`` returns its url).

After ``notifications/initialized`` it sends ``channels/register`` for ``block:#room`` at once
and reads nothing else until that request is answered: every other frame the host sends
meanwhile (our ``featureSets/update`` first of all) is queued, unanswered. It gives up on the
register after ``GIVE_UP_S`` (30 s, as real servers do; :attr:`BlockingServer.gave_up` is then
set) and carries on with its queue. On a -32002 answer it processes its queued frames (answering
``featureSets/update``) and, once it has answered the update, retries the register;
:attr:`BlockingServer.registered` is set when a register is accepted.

Otherwise it behaves as :class:`tests.chat_servers.ChatServer` (by hand: a server built on
the toolkit cannot stop reading): it answers ``initialize`` (MCPL
0.5 and an MCP ``tools`` capability), ``featureSets/update``, ``tools/list`` (one tool,
``noop``), ``ping`` and ``channels/publish`` (:attr:`BlockingServer.publish_seen` is set at
the first); :meth:`say` sends a message in ``block:#room``. Each answer the host gave to a
register attempt is kept in :attr:`BlockingServer.register_answers`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import trio
import trio_websocket

from tests.chat_servers import Content, HostRefused, descriptor, now_iso, text_content

GIVE_UP_S = 30.0
ROOM = "block:#room"
NOOP = {"name": "noop", "description": "does nothing", "inputSchema": {"type": "object"}}
PROTOCOL_VERSION = "2024-11-05"
CHANNEL_USES = ["channels.register", "channels.publish", "channels.incoming", "channels.lifecycle"]
METHOD_NOT_FOUND = -32601


class RawChatServer:
    """The chat server's wire, by hand: a websocket it serves itself, one connection at a time;
    the subclass reads the frames (see :meth:`BlockingServer._accept`)."""

    def __init__(
        self,
        server_id: str,
        channels: Sequence[Mapping[str, Any]],
        *,
        author: Mapping[str, str] | None = None,
    ) -> None:
        self.server_id = server_id
        self.feature_set = f"{server_id}.chat"
        self.channels: dict[str, dict[str, Any]] = {c["id"]: dict(c) for c in channels}
        self.author = dict(author or {"id": "u1", "name": "someone"})
        self.url = ""
        self.ready = trio.Event()
        self.received: list[dict[str, Any]] = []
        self.answers: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._ids = itertools.count(1)
        self._published = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[dict[str, Any]]]] = {}
        self._ws: trio_websocket.WebSocketConnection | None = None
        self._send_lock = trio.Lock()
        self._connected = trio.Event()

    # -- the websocket ---------------------------------------------------------------------------
    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (any free port); ``nursery.start(server.serve)`` returns the url."""
        async with trio.open_nursery() as nursery:
            listener = await nursery.start(
                trio_websocket.serve_websocket, self._accept, "127.0.0.1", 0, None
            )
            self.url = f"ws://127.0.0.1:{listener.port}"
            task_status.started(self.url)

    def server_config(self, **keys: Any) -> dict[str, Any]:
        """This server's entry in the host's ``servers``."""
        return {"id": self.server_id, "url": self.url, **keys}

    def _dispatch(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        """A host request is answered in a task of its own; a response wakes its asker."""
        if "method" in msg and "id" in msg:
            nursery.start_soon(self._answer_host, msg, nursery)
        elif "method" not in msg:
            waiting = self._waiting.pop(msg.get("id"), None)
            if waiting is not None:
                waiting[1].append(msg)
                waiting[0].set()

    async def _send(self, msg: Mapping[str, Any]) -> None:
        assert self._ws is not None, "the host has not connected"
        async with self._send_lock:
            await self._ws.send_message(json.dumps(msg))

    # -- answering the host ----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return {
            "version": "0.5",
            "pushEvents": True,
            "channels": {"register": True, "publish": True, "incoming": True, "lifecycle": True},
            "featureSets": {
                self.feature_set: {
                    "description": f"Chat on {self.server_id}.",
                    "uses": [*CHANNEL_USES, "pushEvents"],
                }
            },
        }

    async def _answer_host(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        method, rid = msg["method"], msg["id"]
        result: Any = None
        error: dict[str, Any] | None = None
        if method == "initialize":
            result = {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"experimental": {"mcpl": self.manifest()}},
                "serverInfo": {"name": f"{self.server_id}-test", "version": "0"},
            }
        elif method == "ping":
            result = {}
        elif method == "channels/publish":
            params = msg.get("params") or {}
            result = {
                "delivered": True,
                "messageId": f"{self.server_id}-pub-{next(self._published)}",
            }
            if "threadId" in params:  # RFC-011: the place is echoed
                result["threadId"] = params["threadId"]
        else:
            error = {"code": METHOD_NOT_FOUND, "message": f"Method not found: {method}"}
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        if error is not None:
            reply["error"] = error
        else:
            reply["result"] = result
        await self._send(reply)

    # -- requests to the host --------------------------------------------------------------------
    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and return the host's whole answer (``result`` or ``error``)."""
        await self._connected.wait()
        rid = next(self._ids)
        event, slot = trio.Event(), list[dict[str, Any]]()
        self._waiting[rid] = (event, slot)
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": dict(params)}
        await self._send(msg)
        await event.wait()
        if not slot:
            raise HostRefused(f"the host closed the link before answering {method}")
        self.answers.append((msg, slot[0]))
        return slot[0]

    async def call(self, method: str, params: Mapping[str, Any]) -> Any:
        """:meth:`request`, raising :class:`HostRefused` on an error answer; the ``result``."""
        answer = await self.request(method, params)
        if "error" in answer:
            raise HostRefused(f"{method} refused: {answer['error']}")
        return answer["result"]

    def message(
        self,
        channel_id: str,
        message_id: str,
        content: Content,
        *,
        author: Mapping[str, str] | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        """One ``channels/incoming`` message as this server shapes it."""
        msg: dict[str, Any] = {
            "channelId": channel_id,
            "messageId": message_id,
            "author": dict(author or self.author),
            "timestamp": now_iso(),
            "content": text_content(content),
        }
        if thread_id is not None:
            msg["threadId"] = thread_id
        if reply_to is not None:
            msg["replyTo"] = reply_to
        if metadata is not None:
            msg["metadata"] = dict(metadata)
        if tags is not None:
            msg["tags"] = list(tags)
        return msg

    async def incoming(self, *messages: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One ``channels/incoming`` request; raises unless the host accepted every message.
        Returns the host's per-message results (the host answers once they are stored)."""
        result = await self.call("channels/incoming", {"messages": [dict(m) for m in messages]})
        results: list[dict[str, Any]] = result["results"]
        if not all(r.get("accepted") for r in results) or len(results) != len(messages):
            raise HostRefused(f"channels/incoming not all accepted: {results}")
        return results

    async def say(
        self, channel_id: str, message_id: str, content: Content, **fields: Any
    ) -> dict[str, Any]:
        """One message in one request (see :meth:`message`); returns the message sent."""
        msg = self.message(channel_id, message_id, content, **fields)
        await self.incoming(msg)
        return msg

    def published(self) -> list[dict[str, Any]]:
        """The params of every ``channels/publish`` the host sent, oldest first."""
        return [m["params"] for m in self.received if m.get("method") == "channels/publish"]


class BlockingServer(RawChatServer):
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
