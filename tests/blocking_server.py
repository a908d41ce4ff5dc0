"""A websocket MCPL server that blocks its read loop on its own first request, as some real
servers do, run in-process on loopback (``nursery.start(server.serve)`` returns its url).

After ``notifications/initialized`` it sends ``channels/register`` for ``block:#room`` at once
and reads nothing else until that request is answered: every other frame the host sends
meanwhile (our ``featureSets/update`` first of all) is queued, unanswered. It gives up on the
register after ``GIVE_UP_S`` (30 s, as real servers do; :attr:`BlockingServer.gave_up` is then
set) and carries on with its queue. On a -32002 answer it processes its queued frames (answering
``featureSets/update``) and, once it has answered the update, retries the register;
:attr:`BlockingServer.registered` is set when a register is accepted.

It is a :class:`tests.chat_servers.ChatServer` (on the server toolkit) whose transport stalls:
the toolkit reads on, but :class:`Stalling` hands it nothing but the awaited answer. Like the
chat servers it answers ``initialize`` (with one tool, ``noop``), ``featureSets/update``,
``tools/list``, ``ping`` and ``channels/publish`` (:attr:`BlockingServer.publish_seen` is set at
the first); :meth:`say` sends a message in ``block:#room``. Each answer the host gave to a
register attempt is kept in :attr:`BlockingServer.register_answers`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import trio

from actors.serverkit.link import PendingRequest
from actors.serverkit.transport import LineTransport
from protocol.errors import RpcError
from protocol.server_session import Grant
from tests.chat_servers import ChatServer, descriptor

GIVE_UP_S = 30.0
ROOM = "block:#room"
CHANNEL_USES = ["channels.register", "channels.publish", "channels.incoming", "channels.lifecycle"]


class Stalling:
    """A connection's transport that, from ``notifications/initialized`` on, holds back every
    frame but the answer to the server's first request (for at most ``GIVE_UP_S``)."""

    def __init__(self, inner: LineTransport, server: BlockingServer) -> None:
        self._inner = inner
        self._server = server
        self._queued: list[str] = []
        self._awaited: PendingRequest | None = None
        self._initialized = False

    async def receive(self) -> str | None:
        if self._awaited is None:
            if self._queued:
                return self._queued.pop(0)
            text = await self._inner.receive()
            if not self._initialized and text is not None and _is_initialized(text):
                self._initialized = True
                self._awaited = await self._server.first_register()
            return text
        awaited = self._awaited
        with trio.move_on_after(GIVE_UP_S):
            while True:
                text = await self._inner.receive()
                if text is None:
                    return None
                message = json.loads(text)
                if "method" not in message and message.get("id") == awaited.id:
                    self._awaited = None
                    return text
                self._queued.append(text)
        self._server.gave_up = True
        self._awaited = None
        return await self.receive()

    async def send(self, text: str) -> None:
        await self._inner.send(text)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _is_initialized(text: str) -> bool:
    """Whether a frame is the host's ``notifications/initialized``."""
    return "notifications/initialized" in text and (
        json.loads(text).get("method") == "notifications/initialized"
    )


def noop() -> str:
    """does nothing"""
    return ""


class BlockingServer(ChatServer):
    def __init__(self) -> None:
        # no channel declared to the toolkit: this server registers its room by itself
        super().__init__("block", [], author={"id": "u7", "name": "una"})
        self.room = descriptor(ROOM, "#room", "chat", "root")
        self.kit.feature_set("block.chat", description="Chat on block.", uses=CHANNEL_USES)
        self.kit.tool(name="noop", description="does nothing")(noop)
        self.gave_up = False
        self.registered = trio.Event()
        self.updated = trio.Event()
        self.publish_seen = trio.Event()
        self.register_answers: list[dict[str, Any]] = []

    def wrap(self, transport: LineTransport) -> LineTransport:
        self.updated = trio.Event()
        return Stalling(transport, self)

    def on_grant(self, grant: Grant) -> None:
        self.updated.set()

    async def answer(self, method: str, params: Mapping[str, Any]) -> Any:
        if method == "channels/publish":
            self.publish_seen.set()
        return await super().answer(method, params)

    async def first_register(self) -> PendingRequest:
        """Send the register (before any grant: nothing is granted yet) and see to its answer."""
        link = self.kit.link
        assert link is not None
        params = {"channels": [self.room]}
        pending = await link.start_request("channels/register", params, check=False)
        self.spawn(self._first_answered, pending)
        return pending

    async def _first_answered(self, pending: PendingRequest) -> None:
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": pending.id}
        try:
            answer["result"] = await pending.wait()
        except RpcError as err:
            answer["error"] = err.to_wire()
        if self.gave_up:
            return  # answered too late: it carried on without it
        self._note_register(answer)
        if answer.get("error", {}).get("code") == -32002:
            await self.updated.wait()  # once the update is answered (the server is ready)
            self._note_register(await self.request("channels/register", {"channels": [self.room]}))

    def _note_register(self, answer: dict[str, Any]) -> None:
        self.register_answers.append(answer)
        results = answer.get("result", {}).get("results", [])
        if results and all(r.get("accepted") for r in results):
            self.registered.set()
