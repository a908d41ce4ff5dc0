"""An MCPL server for the RFC-006 conformance vectors, written with the server toolkit, run inside
the test's trio run and joined to the host by memory channels in place of a transport, so the
vectors' time is a MockClock.

The toolkit answers ``initialize`` (with the manifest the vector's steps shape:
:attr:`VectorServer.capabilities` and :attr:`VectorServer.feature_sets`), ``ping``,
``featureSets/update``, ``mcpl/manifest`` and ``tools/list``; the server answers ``push/render``
(as the vector's render plan says) and ``channels/open``/``channels/close``, registers its
channels again after every handshake, and sends ``push/event``, ``channels/incoming`` and
``channels/register`` requests whose whole answers the harness reads. Those go out as the step
wrote them, granted or not (the host's refusal is what a vector may check).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from actors.config import ServerConfig
from actors.serverkit import MCPLServer, manifest_revision
from actors.serverkit.link import ServerLink
from actors.serverkit.transport import ChannelTransport
from protocol.errors import INTERNAL_ERROR, RpcError
from protocol.framing import Framed
from protocol.server_manifest import FeatureSetDecl
from protocol.server_session import Grant

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


class MemoryTransport:
    """The host's side of a memory link (``actors.link.transport.Transport``)."""

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

    def send_now(self, texts: list[str]) -> bool:
        return False

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

    def __init__(self) -> None:
        self.ready = trio.Event()  # the policy is established and the channels registered
        self.updates: list[dict[str, Any]] = []  # featureSets/update params, oldest first
        self.link: ServerLink | None = None


class _Tap:
    """The server's end of one memory link: the toolkit's :class:`ChannelTransport`, noting
    what the harness observes of the host's handshake (its ``eventCoalescing`` and every
    ``featureSets/update`` request) as it passes."""

    def __init__(self, server: VectorServer, session: Session, inner: ChannelTransport) -> None:
        self._server = server
        self._session = session
        self._inner = inner

    async def receive(self) -> str | None:
        text = await self._inner.receive()
        if text is not None and ('"initialize"' in text or '"featureSets/update"' in text):
            message = json.loads(text)
            params = message.get("params") or {}
            if message.get("method") == "initialize":
                mcpl = params.get("capabilities", {}).get("experimental", {}).get("mcpl", {})
                self._server.advertised = mcpl.get("eventCoalescing")
            elif message.get("method") == "featureSets/update" and "id" in message:
                self._session.updates.append(params)
        return text

    async def send(self, text: str) -> None:
        await self._inner.send(text)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Kit(MCPLServer):
    """The toolkit server under a :class:`VectorServer`, declaring what the vector's steps
    made of its manifest and answering renders and channel lifecycle through it."""

    def __init__(self, vector: VectorServer) -> None:
        super().__init__("vector-server", version="1", push_events=False)
        self.vector = vector

    def feature_sets(self) -> list[FeatureSetDecl]:
        return [
            FeatureSetDecl(name=name, description=fs["description"], uses=fs["uses"])
            for name, fs in self.vector.feature_sets.items()
        ]

    def manifest(self) -> dict[str, Any]:
        vector = self.vector
        manifest = {"version": "0.5", **vector.capabilities, "featureSets": vector.feature_sets}
        manifest = json.loads(json.dumps(manifest))  # a copy the steps cannot change under it
        manifest["revision"] = manifest_revision(manifest)
        return manifest

    def grant_changed(self, link: ServerLink, before: Grant, after: Grant) -> None:
        super().grant_changed(link, before, after)
        session = self.vector.session
        if session is not None and session.link is None:  # the first policy on this link
            session.link = link
            link.spawn(functools.partial(self.vector.registered, session))

    async def host_call(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> Any:
        if method == "push/render":
            return await self.vector.render(dict(params))
        if method in ("channels/open", "channels/close"):
            return {}
        return await super().host_call(link, method, params)


class _Held:
    """A render the plan holds until :meth:`VectorServer.release` answers it."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.text = ""
        self.released = trio.Event()


class VectorServer:
    def __init__(self) -> None:
        self.capabilities: dict[str, Any] = json.loads(json.dumps(CAPABILITIES))
        self.feature_sets: dict[str, Any] = json.loads(json.dumps(FEATURE_SETS))
        self.channels: list[str] = []
        self.plan: dict[str, Any] = {"mode": "immediate", "text": "RENDERED"}
        self.renders: list[dict[str, Any]] = []
        self.held: list[_Held] = []  # renders not yet answered, oldest first
        self.render_asked = trio.Event()
        self.session: Session | None = None
        self.advertised: Any = None  # the host's eventCoalescing in its last initialize
        self.nursery: trio.Nursery | None = None
        self.kit = _Kit(self)

    # -- the link -------------------------------------------------------------------------------

    @asynccontextmanager
    async def link(self) -> AsyncIterator[MemoryTransport]:
        """A new connection from the host; the server serves it until either side closes."""
        assert self.nursery is not None
        to_host, from_server = trio.open_memory_channel[str](1000)
        to_server, from_host = trio.open_memory_channel[str](1000)
        session = Session()
        self.session = session
        self.nursery.start_soon(
            self.kit.serve, _Tap(self, session, ChannelTransport(to_host, from_host))
        )
        try:
            yield MemoryTransport(to_server, from_server)
        finally:
            await to_server.aclose()
            await from_server.aclose()

    async def disconnect(self) -> None:
        """Drop the current connection from the server's side."""
        session = self.session
        assert session is not None and session.link is not None
        self.session = None
        session.link.close()
        await session.link.closed.wait()

    async def registered(self, session: Session) -> None:
        """After the first policy of a connection: register the channels, then be ready."""
        if self.channels:
            await self.request("channels/register", self._descriptors(self.channels))
        session.ready.set()

    def manifest(self) -> dict[str, Any]:
        return self.kit.manifest()

    async def render(self, params: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``push/render`` as the plan says."""
        plan = self.plan.get("byKey", {}).get(params.get("key"), self.plan)
        mode = plan["mode"]
        text = plan.get("text", self.plan.get("text", "RENDERED"))
        entry: dict[str, Any] = {"params": params}
        self.renders.append(entry)
        self.render_asked.set()
        if mode == "held":
            held = _Held(entry)
            self.held.append(held)
            await held.released.wait()
            text = held.text
        elif mode == "error":
            raise RpcError(code=INTERNAL_ERROR, message="Internal error")
        elif mode == "inference-request":
            ask = {
                "featureSet": "assist",
                "messages": [{"role": "user", "content": {"type": "text", "text": "help"}}],
                "maxTokens": 16,
            }
            entry["inferenceResponse"] = await self.request("inference/request", ask)
        if mode == "empty":
            return {"content": []}
        if mode == "notice-summary":
            summary = f"NOTICES={len(params['notices'])} DROPPED={params['dropped']}"
            return {"content": [{"type": "text", "text": summary}]}
        return {"content": [{"type": "text", "text": text}]}

    async def release(self, text: str) -> None:
        """Answer the oldest held render with ``text``."""
        held = self.held.pop(0)
        held.text = text
        held.released.set()
        await trio.lowlevel.checkpoint()

    # -- requests of the server -----------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request on the current link, granted or not; the host's whole answer
        (``result`` or ``error``)."""
        session = self.session
        assert session is not None and session.link is not None, "not connected"
        pending = await session.link.start_request(method, params, check=False)
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": pending.id}
        try:
            answer["result"] = await pending.wait()
        except RpcError as err:
            answer["error"] = err.to_wire()
        return answer

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
        await self.kit.manifest_changed()


def memory_transports(
    servers: dict[str, VectorServer],
) -> Callable[[ServerConfig, Callable[[str], None]], Any]:
    """A stand-in for ``actors.link.connection.open_transport`` that links each configured server
    id to its :class:`VectorServer`."""

    @asynccontextmanager
    async def open_transport(
        cfg: ServerConfig, on_stderr: Callable[[str], None]
    ) -> AsyncIterator[MemoryTransport]:
        async with servers[cfg.id].link() as transport:
            yield transport

    return open_transport
