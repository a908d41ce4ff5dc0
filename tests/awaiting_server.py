"""A toolkit server whose handler of one kind awaits every toolkit call, run inside the test's
trio run and joined to the real host by the toolkit's memory transport.

:class:`AwaitingServer` declares every kind of handler (:data:`KINDS`); the one named ``kind``
awaits, the first time it runs, each call of :data:`CALLS` in turn, noting each in
:attr:`AwaitingServer.done` once it returned or raised (its result or exception in
:attr:`AwaitingServer.results`), and sets :attr:`AwaitingServer.finished` after
the last. Every other handler does its ordinary, quick work (the ``before_inference`` hook
is declared only for its own kind: the host refuses an inference request while one of its hooks
awaits the server, and the sends of other kinds wake the agent). :func:`transports` hands the host a
transport to the server in place of a process or a socket.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from actors.config import ServerConfig
from actors.serverkit import (
    BeforeInference,
    Lifecycle,
    MCPLServer,
    OpenRequest,
    Publish,
    Render,
    Rollback,
    ToolResult,
)
from actors.serverkit.transport import ChannelTransport
from tests.vector_server import MemoryTransport

SERVER_ID: Final = "aw"
ROOM: Final = "aw:room"
#: Every kind of handler a server declares, in the order the module's docstring lists them.
KINDS: Final = (
    "publish",
    "open",
    "close",
    "tool",
    "before_inference",
    "lifecycle",
    "rollback",
    "render",
    "granted",
    "ready",
)
#: Every call a handler may await, each sent to the host.
CALLS: Final = (
    "send",
    "push_event",
    "infer",
    "update",
    "model_info",
    "tools_changed",
    "channels_changed",
    "manifest_changed",
)


class AwaitingServer:
    """The server; ``kind`` names the handler that awaits every call."""

    def __init__(self, kind: str) -> None:
        assert kind in KINDS, kind
        self.kind = kind
        self.kit = MCPLServer(SERVER_ID, inference=True, request_timeout=3600)
        self.room = self.kit.channel(ROOM, label="#room", publish_target="root")
        self.done: list[str] = []
        self.results: dict[str, Any] = {}
        self.started = False
        self.finished = trio.Event()
        self.checkpoints = 0
        self._declare()

    async def _every_call(self, text: str, author: str | dict[str, Any]) -> None:
        """Await each of :data:`CALLS`, once (the first handler of ``kind`` to run)."""
        if self.started:
            return
        self.started = True
        kit = self.kit
        calls: dict[str, Callable[[], Any]] = {
            "send": lambda: self.room.send(text, author=author),
            "push_event": lambda: kit.push_event(f"pushed from {self.kind}"),
            "infer": lambda: kit.infer("what is 2+2?"),
            "update": lambda: self.room.update(label=f"#room after {self.kind}"),
            "model_info": kit.model_info,
            "tools_changed": kit.tools_changed,
            "channels_changed": lambda: kit.channels_changed(
                added=[kit.channel("aw:more", label="#more", publish_target="root")]
            ),
            "manifest_changed": self._manifest_changed,
        }
        for name in CALLS:
            try:
                self.results[name] = await calls[name]()
            except Exception as exc:  # a refusal is an answer too: the call finished
                self.results[name] = exc
            self.done.append(name)
        self.finished.set()

    async def _manifest_changed(self) -> bool:
        self.kit.feature_set("aw.extra", description="one more", uses=["pushEvents"])
        return await self.kit.manifest_changed()

    async def _if(self, kind: str, text: str = "", author: str | dict[str, Any] = "bob") -> None:
        if self.kind == kind:
            await self._every_call(text or f"sent from {kind}", author)

    def _declare(self) -> None:
        kit = self.kit

        @self.room.on_publish
        async def published(publish: Publish) -> None:
            # the echo, as ``Channel.send``'s docstring advises
            author = {"id": publish.conversation_id, "name": publish.agent}
            await self._if("publish", publish.text, author)

        @kit.on_open
        async def opened(request: OpenRequest) -> list[dict[str, Any]]:
            await self._if("open")
            return []

        @kit.on_close
        async def closed(request: OpenRequest) -> None:
            await self._if("close")

        @kit.tool()
        async def work() -> str:
            """Does the work."""
            await self._if("tool")
            return "worked"

        @kit.tool()
        def note(text: str) -> ToolResult:
            """Keeps a note; each note is a checkpoint."""
            self.checkpoints += 1
            n = self.checkpoints
            state = {"checkpoint": f"cp-{n}", "parent": f"cp-{n - 1}" if n > 1 else None}
            return ToolResult(content=[{"type": "text", "text": f"noted {text}"}], state=state)

        async def before(ctx: BeforeInference) -> None:
            await self._if("before_inference")

        if self.kind == "before_inference":  # the host refuses inference while a hook waits
            kit.before_inference(before)

        @kit.on_lifecycle
        async def lifecycle(event: Lifecycle) -> None:
            await self._if("lifecycle")

        @kit.on_rollback
        async def rollback(request: Rollback) -> bool:
            await self._if("rollback")
            return True

        @kit.on_render
        async def render(request: Render) -> str:
            await self._if("render")
            return f"rendered {len(request.notices)}"

        @kit.on_granted("pushEvents")
        async def granted() -> None:
            await self._if("granted")

        @kit.on_ready
        async def ready() -> None:
            await self._if("ready")


def transports(nursery: trio.Nursery, server: MCPLServer) -> Callable[..., Any]:
    """A stand-in for ``actors.link.connection.open_transport`` serving every connection of
    the host with ``server``, over the toolkit's :class:`ChannelTransport`, in ``nursery``."""

    @asynccontextmanager
    async def open_transport(
        cfg: ServerConfig, on_stderr: Callable[[str], None]
    ) -> AsyncIterator[MemoryTransport]:
        to_host, from_server = trio.open_memory_channel[str](1000)
        to_server, from_host = trio.open_memory_channel[str](1000)
        nursery.start_soon(server.serve, ChannelTransport(to_host, from_host))
        try:
            yield MemoryTransport(to_server, from_server)
        finally:
            await to_server.aclose()
            await from_server.aclose()

    return open_transport
