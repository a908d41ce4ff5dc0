"""A real loopback HTTP/1.1 origin for tests, on trio.

Usage::

    async with serve_origin() as origin:
        origin.route("/file", Route(body=b"RIFF....WAVE", headers={"Content-Type": "audio/wav"}))
        origin.url("/file")      # "http://127.0.0.1:<port>/file"
        origin.origin            # "http://127.0.0.1:<port>"
        origin.ws_url()          # "ws://127.0.0.1:<port>/mcpl": a server address on this origin
        ...                      # dial it with any HTTP client
        origin.count("/file")    # requests received for that path (origin.count(): all paths)
        origin.requests          # every Request, in arrival order

``Route`` (all keyword arguments, all optional) says how one path answers:

* ``status`` (default 200, or 302 when ``redirect`` is set), ``headers`` (a mapping or pairs),
  ``body`` (the payload octets);
* ``gzip=True``: the body goes out gzip-compressed with ``Content-Encoding: gzip``;
* ``redirect="<url>"``: adds ``Location: <url>``;
* ``chunk=n``: write the body ``n`` bytes at a time, pausing ``interval`` seconds between
  writes (the body is always written in pieces of at most 64 KiB, so ``Request.sent`` shows
  how far a response got); ``chunked=True`` uses chunked transfer coding instead of
  ``Content-Length``;
* ``hang=True``: read the request and never answer;
* ``stall_after=n``: send the status line, the headers and the first ``n`` body bytes, then
  nothing more.

A path with no route answers 404 with an empty body. Each ``Request`` records ``method``,
``path`` (the request target as sent), ``headers`` (lower-cased names, in order),
``authorization`` (the ``Authorization`` header or None), ``sent`` (body bytes written so far,
after any gzip), ``completed`` (the whole response was written) and ``done`` (a ``trio.Event``
set once the origin is finished with the request: answered in full, cut off by the client
closing the connection, or -- for ``hang``/``stall_after`` -- the client went away). Connections
are kept alive between requests unless the client asks to close. Leaving the ``async with``
closes every connection.
"""

from __future__ import annotations

import gzip as gzip_module
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import partial

import attrs
import trio

__all__ = ["Origin", "Request", "Route", "serve_origin"]

_PIECE = 65536
_MAX_HEAD = 65536
_REASONS = {
    200: "OK",
    204: "No Content",
    301: "Moved Permanently",
    302: "Found",
    303: "See Other",
    304: "Not Modified",
    307: "Temporary Redirect",
    308: "Permanent Redirect",
    403: "Forbidden",
    404: "Not Found",
    500: "Internal Server Error",
}


def _pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@attrs.frozen(kw_only=True)
class Route:
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    body: bytes = b""
    gzip: bool = False
    redirect: str | None = None
    chunk: int | None = None
    interval: float = 0.0
    chunked: bool = False
    hang: bool = False
    stall_after: int | None = None

    def wire_body(self) -> bytes:
        return gzip_module.compress(self.body, mtime=0) if self.gzip else self.body


@attrs.define(kw_only=True, eq=False)
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    sent: int = 0
    completed: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)

    @property
    def authorization(self) -> str | None:
        return self.header("authorization")

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


class Origin:
    """The running origin; see the module docstring."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.origin = f"http://127.0.0.1:{port}"
        self.routes: dict[str, Route] = {}
        self.requests: list[Request] = []
        self._arrived = trio.Event()  # replaced after each request: wakes wait_for_requests

    def route(self, path: str, route: Route) -> None:
        self.routes[path] = route

    def url(self, path: str = "/") -> str:
        return self.origin + path

    def ws_url(self, path: str = "/mcpl") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    async def wait_for_requests(self, n: int) -> None:
        """Return once ``n`` requests (any path) have arrived."""
        while len(self.requests) < n:
            await self._arrived.wait()

    def count(self, path: str | None = None) -> int:
        return sum(1 for r in self.requests if path is None or _path_only(r.path) == path)

    # -- serving ----------------------------------------------------------------------------
    async def _connection(self, stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while True:
                head = await _read_head(stream, buffer)
                if head is None:
                    return
                request, keep_alive, body_length = head
                del buffer[:body_length]  # requests here have no body worth keeping
                self.requests.append(request)
                self._arrived.set()
                self._arrived = trio.Event()
                try:
                    await self._answer(stream, request)
                finally:
                    request.done.set()
                if not (keep_alive and request.completed):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, request: Request) -> None:
        route = self.routes.get(_path_only(request.path), Route(status=404))
        if route.hang:
            await _wait_for_close(stream)
            return
        status = route.status if route.status is not None else (302 if route.redirect else 200)
        body = route.wire_body()
        headers = list(route.headers)
        if route.redirect is not None:
            headers.append(("Location", route.redirect))
        if route.gzip:
            headers.append(("Content-Encoding", "gzip"))
        headers.append(
            ("Transfer-Encoding", "chunked")
            if route.chunked
            else ("Content-Length", str(len(body)))
        )
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        await stream.send_all(head.encode("latin-1"))
        limit = len(body) if route.stall_after is None else min(route.stall_after, len(body))
        piece = min(route.chunk or _PIECE, _PIECE)
        position = 0
        while position < limit:
            if position and route.interval > 0:
                await trio.sleep(route.interval)  # the route's pacing, not synchronisation
            data = body[position : min(position + piece, limit)]
            await stream.send_all(b"%x\r\n%b\r\n" % (len(data), data) if route.chunked else data)
            position += len(data)
            request.sent = position
        if route.stall_after is not None:
            await _wait_for_close(stream)
            return
        if route.chunked:
            await stream.send_all(b"0\r\n\r\n")
        request.completed = True


def _path_only(target: str) -> str:
    return target.split("?", 1)[0]


async def _wait_for_close(stream: trio.SocketStream) -> None:
    """Wait until the client closes its side (whatever else it sends is ignored)."""
    try:
        while await stream.receive_some(_PIECE):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _read_head(
    stream: trio.SocketStream, buffer: bytearray
) -> tuple[Request, bool, int] | None:
    """Read one request head from the connection; None once the client has closed it."""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > _MAX_HEAD:
            return None
        data = await stream.receive_some(_PIECE)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    del buffer[: end + 4]
    method, target, version = lines[0].split(" ", 2)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip().lower(), value.strip()))
    request = Request(method=method, path=target, headers=headers)
    connection = (request.header("connection") or "").lower()
    keep_alive = version == "HTTP/1.1" and "close" not in connection
    length = int(request.header("content-length") or 0)
    while len(buffer) < length:
        data = await stream.receive_some(_PIECE)
        if not data:
            return None
        buffer += data
    return request, keep_alive, length


@asynccontextmanager
async def serve_origin() -> AsyncIterator[Origin]:
    """Serve an ``Origin`` on 127.0.0.1 (an ephemeral port) for the duration of the block."""
    async with trio.open_nursery() as nursery:
        origin: Origin | None = None

        async def handler(stream: trio.SocketStream) -> None:
            assert origin is not None
            await origin._connection(stream)

        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        origin = Origin(listeners[0].socket.getsockname()[1])
        try:
            yield origin
        finally:
            nursery.cancel_scope.cancel()
