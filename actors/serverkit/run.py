"""Running a toolkit server: over stdio, or as a websocket server on loopback or beyond.

One host connection is current at a time. Over stdio there is only one, and the server returns
when the host closes stdin. A websocket server accepts connections for as long as it runs; a
new connection takes over from the previous one, which is closed (an MCPL host reconnects
with a fresh ``initialize``, and the connection is the session).
"""

from __future__ import annotations

import functools
import hmac
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import trio
import trio_websocket

from protocol.server_manifest import FeatureSetDecl
from protocol.server_session import ServerSession

from .files import HEAD_TIMEOUT_S, HttpHandler, Shelf, serve_connection
from .link import Dispatch, LinkTaps, Override, ServerLink
from .tools import Tool
from .transport import (
    MAX_LINE_BYTES,
    LineTransport,
    StdioTransport,
    WsTransport,
    warn,
)

if TYPE_CHECKING:
    from .channels import Channel

__all__ = ["ServeMixin", "listen", "serve_websocket_each"]

#: The pure session's own cap on pending requests; the link's (smaller by default) applies first.
SESSION_PENDING = 256


class ServeMixin:
    """The running half of :class:`actors.serverkit.MCPLServer`."""

    # supplied by MCPLServer
    name: str
    version: str
    request_timeout: float
    max_pending: int
    tools: dict[str, Tool]
    answer_overrides: dict[str, Override]
    line_taps: list[Callable[[str], None]]
    problem_taps: list[Callable[[str], None]]

    def manifest(self) -> dict[str, Any]:
        """The current manifest (MCPLServer builds it)."""
        raise NotImplementedError

    def feature_sets(self) -> list[FeatureSetDecl]:
        """The declared feature sets (MCPLServer builds them)."""
        raise NotImplementedError

    def __init__(self) -> None:
        self._link: ServerLink | None = None
        self._accepted: set[str] = set()
        #: set once the current host's answer to ``channels/register`` arrived (or failed)
        self.registered = trio.Event()
        self.grant_event = trio.Event()
        self.current_manifest: dict[str, Any] | None = None
        self._limiter: trio.CapacityLimiter | None = None
        self.shelf = Shelf()
        self.http_handlers: list[HttpHandler] = []

    @property
    def thread_limiter(self) -> trio.CapacityLimiter:
        """The limiter sync tools run their worker threads under."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(8)
        return self._limiter

    @property
    def link(self) -> ServerLink | None:
        """The current host connection (None while no host is connected).

        Its :meth:`~actors.serverkit.link.ServerLink.request` and
        :meth:`~actors.serverkit.link.ServerLink.start_request` send without the retries of
        :meth:`actors.serverkit.MCPLServer.call`."""
        return self._link

    def _wake(self) -> None:
        event, self.grant_event = self.grant_event, trio.Event()
        event.set()

    def accepted_channels(self, link: ServerLink) -> set[str]:
        """The channels the current host accepted (empty for any other link)."""
        return self._accepted if link is self._link else set()

    def _note_results(self, link: ServerLink, result: Any, channels: Sequence[Channel]) -> None:
        entries = result.get("results") if isinstance(result, Mapping) else None
        accepted = {
            e.get("id")
            for e in entries or ()
            if isinstance(e, Mapping) and e.get("accepted") is True
        }
        for ch in channels:
            if ch.id in accepted:
                self.accepted_channels(link).add(ch.id)
            else:
                warn(f"the host did not accept channel {ch.id!r}")

    def new_session(self) -> ServerSession:
        """A fresh pure session for one host connection, with the current manifest."""
        manifest = self.manifest()
        self.current_manifest = manifest
        return ServerSession(
            name=self.name,
            version=self.version,
            manifest=manifest,
            feature_sets=self.feature_sets(),
            tools=bool(self.tools),
            max_pending=max(SESSION_PENDING, self.max_pending),
            defer=frozenset(self.answer_overrides),
        )

    async def serve(self, transport: LineTransport) -> None:
        """Serve one host connection on ``transport`` until it ends."""
        dispatch = cast(Dispatch, self)
        link = ServerLink(
            self.new_session(),
            transport,
            dispatch,
            request_timeout=self.request_timeout,
            max_pending=self.max_pending,
            overrides=self.answer_overrides,
            taps=LinkTaps(lines=tuple(self.line_taps), problems=tuple(self.problem_taps)),
        )
        old, self._link = self._link, link
        self._accepted = set()
        self.registered = trio.Event()
        if old is not None:
            old.close()
        self._wake()
        try:
            await link.run()
        finally:
            if self._link is link:
                self._link = None
                self._accepted = set()
            self._wake()

    async def serve_stdio(self) -> None:
        """Serve the host on stdin/stdout until stdin closes."""
        await self.serve(StdioTransport())

    def on_http(self, fn: HttpHandler) -> HttpHandler:
        """Decorator: ``fn(request)`` (sync, quick) may answer a plain HTTP request to the
        websocket listener (an :class:`actors.serverkit.files.HttpAnswer`) or return None to
        leave it to the next handler and last to the toolkit (the payloads of
        :meth:`reference`, else 404). For a server that serves files of its own, or logs
        what is fetched."""
        self.http_handlers.append(fn)
        return fn

    async def serve_websocket(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept host connections on ``ws://host:port/`` (the same port answers ``GET`` for
        the payloads of :meth:`reference`); ``task_status`` gets the address.

        With a ``token``, a websocket handshake without ``Authorization: Bearer <token>`` (what
        a host configured with that ``token`` sends) is refused with 401.
        """
        await listen(
            host,
            port,
            self.serve,
            token=token,
            shelf=self.shelf,
            http=self.http_handlers,
            task_status=task_status,
        )

    def reference(
        self,
        data: bytes,
        *,
        mime_type: str = "application/octet-stream",
        name: str | None = None,
        disposition: str | None = None,
    ) -> dict[str, Any]:
        """A bulk reference (RFC-005) to ``data``: a ``resource`` block with its size, type
        and digest, whose bytes this server serves at its own origin until the shelf drops
        them. Put it in a push's or a tool result's content. Needs the websocket transport
        (a host fetches only from the origin it dialled)."""
        return self.shelf.put(data, mime_type=mime_type, name=name, disposition=disposition)

    def run(
        self,
        transport: str = "stdio",
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        token: str | None = None,
    ) -> None:
        """Run the server: ``"stdio"`` (the default) or ``"websocket"`` on ``host:port``
        (with ``token``, only hosts sending it as a bearer token are served).

        A websocket server prints ``LISTENING ws://host:port/`` on stdout once it accepts
        connections, and runs until interrupted.
        """
        if transport == "stdio":
            trio.run(self.serve_stdio)
        elif transport == "websocket":

            async def main() -> None:
                async with trio.open_nursery() as nursery:
                    url = await nursery.start(
                        functools.partial(self.serve_websocket, host, port, token=token)
                    )
                    print(f"LISTENING {url}", flush=True)

            try:
                trio.run(main)
            except KeyboardInterrupt:
                pass
        else:
            raise ValueError(f"transport must be 'stdio' or 'websocket', not {transport!r}")
        sys.stdout.flush()


async def listen(
    host: str,
    port: int,
    serve: Callable[[LineTransport], Awaitable[None]],
    *,
    token: str | None = None,
    shelf: Shelf | None = None,
    http: Sequence[HttpHandler] = (),
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept websocket connections on ``ws://host:port/`` and ``serve`` each (its transport)
    until cancelled; plain HTTP requests on the same port go to the ``http`` handlers, then to
    the ``shelf`` (whose origin this sets while listening). ``task_status`` gets the address."""
    wanted = f"Bearer {token}".encode() if token is not None else None
    shelf = shelf if shelf is not None else Shelf()

    async def websocket(stream: trio.abc.Stream) -> None:
        async with trio.open_nursery() as nursery:
            request = None
            with trio.move_on_after(HEAD_TIMEOUT_S):
                request = await trio_websocket.wrap_server_stream(
                    nursery, stream, max_message_size=MAX_LINE_BYTES
                )
            if request is not None and wanted is not None:
                given = dict((k.lower(), v) for k, v in request.headers).get(b"authorization")
                if given is None or not hmac.compare_digest(given, wanted):
                    warn("a websocket client without the right bearer token was refused")
                    await request.reject(401, extra_headers=[(b"WWW-Authenticate", b"Bearer")])
                    request = None
            if request is not None:
                try:
                    ws = await request.accept()
                except trio_websocket.ConnectionClosed:
                    pass
                else:
                    await serve(WsTransport(ws))
            nursery.cancel_scope.cancel()

    async def connection(stream: trio.SocketStream) -> None:
        await serve_connection(stream, shelf, websocket, http)

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    shelf.origin = f"http://{shown}:{bound}"
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, connection, listeners)
            task_status.started(f"ws://{shown}:{bound}/")
    finally:
        shelf.origin = None


async def serve_websocket_each(
    factory: Callable[[], ServeMixin],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    http: Sequence[HttpHandler] = (),
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept host connections on ``ws://host:port/``, each served by a server of its own
    (``factory()``), so that several hosts are served at once and independently (where
    :meth:`~actors.serverkit.MCPLServer.serve_websocket` serves one host at a time, a new
    connection taking over). The servers share one shelf, so each one's
    :meth:`~actors.serverkit.MCPLServer.reference` payloads are fetched from the listener's
    origin."""
    shelf = Shelf()

    async def serve(transport: LineTransport) -> None:
        server = factory()
        server.shelf = shelf
        await server.serve(transport)

    await listen(host, port, serve, token=token, shelf=shelf, http=http, task_status=task_status)
