"""An MCPL server for the RFC-006 conformance vectors, run inside the test's trio run and joined
to the host by memory channels in place of a transport, so the vectors' time is a MockClock.

It speaks JSON-RPC as any server does: it answers ``initialize``, ``featureSets/update``,
``ping``, ``tools/list``, ``mcpl/manifest`` and ``push/render`` (as the vector's render plan
says), registers its channels again after every handshake, and sends ``push/event``,
``channels/incoming`` and ``channels/register`` requests whose answers the harness reads.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from actors.config import ServerConfig
from protocol.framing import Framed

#: What the server declares: ``doc`` needs only pushes, so narrowing the channel grant away
#: leaves it enabled (a channel-scoped push is then refused for its channel, -32017).
FEATURE_SETS: dict[str, dict[str, Any]] = {
    "doc": {"description": "document events", "uses": ["pushEvents"]},
    "chat": {
        "description": "the chat channel",
        "uses": ["channels.register", "channels.incoming", "channels.lifecycle"],
    },
    "assist": {"description": "asks the host to infer", "uses": ["inferenceRequest"]},
}
CAPABILITIES: dict[str, Any] = {
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "lifecycle": True},
    "inferenceRequest": True,
}
REVISION = "sha256:" + "A" * 43


class MemoryTransport:
    """The host's side of a memory link (``actors.transport.Transport``)."""

    description = "memory"

    def __init__(
        self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]
    ) -> None:
        self._send = send
        self._receive = receive

    async def send(self, text: str) -> None:
        await self._send.send(text)

    async def send_many(self, texts: list[str]) -> None:
        for text in texts:
            await self._send.send(text)

    def buffered(self) -> bool:
        return self._receive.statistics().current_buffer_used > 0

    def take_buffered(self) -> list[Framed]:
        out: list[Framed] = []
        while True:
            try:
                out.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return out

    async def receive(self) -> Framed | None:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
            return None


class Session:
    """One connection of the host to the server."""

    def __init__(
        self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]
    ) -> None:
        self.send = send
        self.receive = receive
        self.pending: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.ready = trio.Event()  # the policy is established and the channels registered
        self.updates: list[dict[str, Any]] = []  # featureSets/update params, oldest first


class VectorServer:
    def __init__(self) -> None:
        self.capabilities: dict[str, Any] = json.loads(json.dumps(CAPABILITIES))
        self.feature_sets: dict[str, Any] = json.loads(json.dumps(FEATURE_SETS))
        self.channels: list[str] = []
        self.plan: dict[str, Any] = {"mode": "immediate", "text": "RENDERED"}
        self.renders: list[dict[str, Any]] = []
        self.held: list[tuple[Session, Any, dict[str, Any]]] = []  # renders not yet answered
        self.render_asked = trio.Event()
        self.session: Session | None = None
        self.advertised: Any = None  # the host's eventCoalescing in its last initialize
        self.nursery: trio.Nursery | None = None

    # -- the link -------------------------------------------------------------------------------

    @asynccontextmanager
    async def link(self) -> AsyncIterator[MemoryTransport]:
        """A new connection from the host; the server serves it until either side closes."""
        assert self.nursery is not None
        to_host, from_server = trio.open_memory_channel[str](1000)
        to_server, from_host = trio.open_memory_channel[str](1000)
        session = Session(to_host, from_host)
        self.session = session
        self.nursery.start_soon(self._serve, session)
        try:
            yield MemoryTransport(to_server, from_server)
        finally:
            await to_server.aclose()
            await from_server.aclose()

    async def disconnect(self) -> None:
        """Drop the current connection from the server's side."""
        session = self.session
        assert session is not None
        self.session = None
        await session.send.aclose()
        await session.receive.aclose()

    async def _serve(self, session: Session) -> None:
        try:
            async for text in session.receive:
                message = json.loads(text)
                if "method" in message and "id" in message:
                    assert self.nursery is not None
                    self.nursery.start_soon(self._answer, session, message)
                elif "method" not in message:
                    answer = session.pending.pop(message["id"], None)
                    if answer is not None:
                        await answer.send(message)
        except trio.ClosedResourceError:
            pass
        finally:
            for answer in session.pending.values():
                await answer.aclose()

    async def _reply(self, session: Session, rid: Any, body: dict[str, Any]) -> None:
        try:
            await session.send.send(json.dumps({"jsonrpc": "2.0", "id": rid, **body}))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the link is gone; the host will not hear this answer

    async def _answer(self, session: Session, message: dict[str, Any]) -> None:
        method, params, rid = message["method"], message.get("params") or {}, message["id"]
        handler: Callable[[Session, dict[str, Any]], Any] | None = {
            "initialize": self._initialize,
            "featureSets/update": self._update,
            "mcpl/manifest": lambda s, p: self.manifest(),
            "ping": lambda s, p: {},
            "tools/list": lambda s, p: {"tools": []},
            "channels/open": lambda s, p: {},
            "channels/close": lambda s, p: {},
        }.get(method)
        if method == "push/render":
            await self._render(session, rid, params)
            return
        if handler is None:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            await self._reply(session, rid, {"error": error})
            return
        await self._reply(session, rid, {"result": handler(session, params)})
        if method == "featureSets/update" and not session.ready.is_set():
            if self.channels:
                await self.request("channels/register", self._descriptors(self.channels))
            session.ready.set()

    def manifest(self) -> dict[str, Any]:
        return {"version": "0.5", **self.capabilities, "featureSets": self.feature_sets}

    def _initialize(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        mcpl = params.get("capabilities", {}).get("experimental", {}).get("mcpl", {})
        self.advertised = mcpl.get("eventCoalescing")
        return {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}, "experimental": {"mcpl": self.manifest()}},
            "serverInfo": {"name": "vector-server", "version": "1"},
        }

    def _update(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        session.updates.append(params)
        return {"accepted": True}

    async def _render(self, session: Session, rid: Any, params: dict[str, Any]) -> None:
        plan = self.plan.get("byKey", {}).get(params.get("key"), self.plan)
        mode = plan["mode"]
        text = plan.get("text", self.plan.get("text", "RENDERED"))
        entry: dict[str, Any] = {"params": params}
        self.renders.append(entry)
        self.render_asked.set()
        if mode == "held":
            self.held.append((session, rid, entry))
            return
        if mode == "error":
            error = {"code": -32603, "message": "Internal error"}
            await self._reply(session, rid, {"error": error})
            return
        if mode == "inference-request":
            ask = {
                "featureSet": "assist",
                "messages": [{"role": "user", "content": {"type": "text", "text": "help"}}],
                "maxTokens": 16,
            }
            entry["inferenceResponse"] = await self.request("inference/request", ask)
        content: list[dict[str, Any]]
        if mode == "empty":
            content = []
        elif mode == "notice-summary":
            summary = f"NOTICES={len(params['notices'])} DROPPED={params['dropped']}"
            content = [{"type": "text", "text": summary}]
        else:
            content = [{"type": "text", "text": text}]
        await self._reply(session, rid, {"result": {"content": content}})

    async def release(self, text: str) -> None:
        """Answer the oldest held render with ``text``."""
        session, rid, _ = self.held.pop(0)
        await self._reply(session, rid, {"result": {"content": [{"type": "text", "text": text}]}})

    # -- requests of the server -----------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request on the current link; the host's whole answer (``result`` or
        ``error``)."""
        session = self.session
        assert session is not None, "not connected"
        rid = next(session.ids)
        answer_send, answer_receive = trio.open_memory_channel[dict[str, Any]](1)
        session.pending[rid] = answer_send
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        await session.send.send(json.dumps(message))
        async with answer_receive:
            return await answer_receive.receive()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        session = self.session
        assert session is not None, "not connected"
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        await session.send.send(json.dumps(message))

    async def register(self, channel: str) -> dict[str, Any]:
        self.channels.append(channel)
        return await self.request("channels/register", self._descriptors([channel]))

    @staticmethod
    def _descriptors(channels: list[str]) -> dict[str, Any]:
        return {
            "channels": [
                {
                    "id": c,
                    "type": "chat",
                    "label": c,
                    "direction": "bidirectional",
                    "capabilities": {"publish": {"target": "exact"}},
                }
                for c in channels
            ]
        }

    async def change_manifest(self) -> None:
        """Tell the host the manifest changed (it fetches it with ``mcpl/manifest``)."""
        await self.notify(
            "mcpl/manifestChanged", {"revision": REVISION, "domains": ["capabilities"]}
        )


def memory_transports(
    servers: dict[str, VectorServer],
) -> Callable[[ServerConfig, Callable[[str], None]], Any]:
    """A stand-in for ``actors.connection.open_transport`` that links each configured server
    id to its :class:`VectorServer`."""

    @asynccontextmanager
    async def open_transport(
        cfg: ServerConfig, on_stderr: Callable[[str], None]
    ) -> AsyncIterator[MemoryTransport]:
        async with servers[cfg.id].link() as transport:
            yield transport

    return open_transport
