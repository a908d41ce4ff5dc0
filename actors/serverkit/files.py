"""Bulk references (RFC-005) of the server toolkit: bytes served from the server's own origin.

A host fetches a reference only from the origin it dialled (the websocket's ``http://host:port``;
a stdio server has no address, so its references are never fetched). The websocket listener
therefore answers plain HTTP too, on the same port: a request asking to upgrade goes to the
websocket handshake (its bytes replayed), a ``GET /refs/<token>`` gets the bytes put on the
:class:`Shelf`, anything else a 404 or 405 -- unless one of the server's own HTTP handlers
(:meth:`actors.serverkit.MCPLServer.on_http`) answers it first. Tokens are unguessable, so a
reference's URI is its own capability; the host's bearer token (when it has one) is not checked
here.

The shelf is bounded: at most ``max_files`` entries and ``max_bytes`` bytes. Past either cap the
oldest entries are dropped (a later fetch of one gets 404, which the host reports as a failed
fetch); a single payload larger than ``max_bytes`` is refused with ``ValueError``.
"""

from __future__ import annotations

import collections
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import h11
import trio

from protocol.references import digest_of

__all__ = ["HttpAnswer", "HttpHandler", "HttpRequest", "ReplayStream", "Shelf", "serve_connection"]

#: The longest request head read before the connection is refused.
MAX_HEAD_BYTES = 16 * 1024
#: How long a client may take to send its request head (and then its body).
HEAD_TIMEOUT_S = 30.0
#: The largest request body read for an HTTP handler; a larger one is answered 413.
MAX_BODY_BYTES = 1024 * 1024


@attrs.frozen(kw_only=True)
class HttpRequest:
    """A plain HTTP request to the websocket listener: the method, the path (no query), the
    target as sent, the headers (names lower-cased; a repeated one keeps its last value) and
    the body (at most ``MAX_BODY_BYTES``, 1 MiB: a larger one is answered 413 for you)."""

    method: str
    path: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""


@attrs.frozen(kw_only=True)
class HttpAnswer:
    """What a :data:`HttpHandler` answers: a status, the body and its headers."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = attrs.field(factory=dict)


#: Answers a plain HTTP request, or returns None to leave it to the next handler (and last to
#: the toolkit: the shelf's ``/refs/`` payloads, else 404). Called before the answer is sent.
HttpHandler = Callable[[HttpRequest], "HttpAnswer | None"]


@attrs.frozen
class _Entry:
    data: bytes
    mime_type: str


class Shelf:
    """Payloads served at ``<origin>/refs/<token>``; bounded, oldest dropped first."""

    def __init__(self, *, max_files: int = 256, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._size = 0
        self.origin: str | None = None

    def put(
        self,
        data: bytes,
        *,
        mime_type: str = "application/octet-stream",
        name: str | None = None,
        disposition: str | None = None,
    ) -> dict[str, Any]:
        """Shelve ``data``; the ``resource`` block that references it (with its size and
        digest). Raises ``RuntimeError`` when no websocket listener gives the bytes an origin."""
        if self.origin is None:
            raise RuntimeError(
                "references need the websocket transport: a host fetches only from the origin "
                "it dialled, and a stdio server has none"
            )
        if len(data) > self.max_bytes:
            raise ValueError(f"{len(data)} bytes is over the shelf's {self.max_bytes}")
        if disposition not in (None, "never", "ref"):
            raise ValueError(f"disposition must be 'never', 'ref' or None, not {disposition!r}")
        token = secrets.token_urlsafe(16)
        self._entries[token] = _Entry(bytes(data), mime_type)
        self._size += len(data)
        while len(self._entries) > self.max_files or self._size > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._size -= len(dropped.data)
        block: dict[str, Any] = {
            "type": "resource",
            "uri": f"{self.origin}/refs/{token}",
            "mimeType": mime_type,
            "sizeBytes": len(data),
            "digest": digest_of(data),
        }
        if name is not None:
            block["name"] = name
        if disposition is not None:
            block["disposition"] = disposition
        return block

    def get(self, path: str) -> _Entry | None:
        """The entry a request path names, if it is still shelved."""
        token = path.removeprefix("/refs/") if path.startswith("/refs/") else None
        return self._entries.get(token) if token else None


class ReplayStream(trio.abc.Stream):
    """A stream whose first reads return bytes already taken from the wrapped one."""

    def __init__(self, stream: trio.abc.Stream, buffered: bytes) -> None:
        self.stream = stream
        self._buffered = bytearray(buffered)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The replayed bytes first, then the wrapped stream's."""
        if self._buffered:
            await trio.lowlevel.checkpoint()
            n = len(self._buffered) if max_bytes is None else max_bytes
            data = bytes(self._buffered[:n])
            del self._buffered[:n]
            return data
        return bytes(await self.stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the wrapped stream."""
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        """As the wrapped stream."""
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Close the wrapped stream."""
        await self.stream.aclose()

    def __repr__(self) -> str:
        return f"<replayed {self.stream!r}>"


def _answer(conn: h11.Connection, status: int, body: bytes, headers: Mapping[str, str]) -> bytes:
    head = [(k, v) for k, v in headers.items()]
    head += [("Content-Length", str(len(body))), ("Connection", "close")]
    out = conn.send(h11.Response(status_code=status, headers=head)) or b""
    out += conn.send(h11.Data(data=body)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    return out


async def _read_request(stream: trio.abc.Stream) -> tuple[h11.Connection, bytes, Any]:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    raw = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return conn, bytes(raw), None
        if event is not h11.NEED_DATA:
            return conn, bytes(raw), event
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        raw += data
        conn.receive_data(bytes(data))
        if not data:
            return conn, bytes(raw), None


_TOO_LARGE = HttpAnswer(status=413, body=b"request body too large\n")
_CUT_SHORT = HttpAnswer(status=400, body=b"request body cut short or malformed\n")


async def _read_body(conn: h11.Connection, stream: trio.abc.Stream) -> bytes | HttpAnswer:
    """The request's body, or the answer refusing it (over ``MAX_BODY_BYTES``: 413; cut
    short or malformed: 400)."""
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return _CUT_SHORT
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                return _TOO_LARGE
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                return _CUT_SHORT
            conn.receive_data(bytes(data))
        else:
            return _CUT_SHORT


def _asked(event: h11.Request, body: bytes) -> HttpRequest:
    target = event.target.decode("latin-1")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    return HttpRequest(
        method=event.method.decode("latin-1"),
        path=target.partition("?")[0],
        target=target,
        headers=headers,
        body=body,
    )


async def serve_connection(
    stream: trio.abc.Stream,
    shelf: Shelf,
    websocket: Callable[[trio.abc.Stream], Awaitable[None]],
    http: Sequence[HttpHandler] = (),
) -> None:
    """One connection to the listener: a websocket session, or one HTTP answer (from the
    first of the ``http`` handlers that gives one, else from the shelf)."""
    try:
        event = None
        with trio.move_on_after(HEAD_TIMEOUT_S):
            conn, raw, event = await _read_request(stream)
        if not isinstance(event, h11.Request):
            return
        upgrade = dict(event.headers).get(b"upgrade", b"")
        if b"websocket" in upgrade.lower():
            await websocket(ReplayStream(stream, raw))
            return
        path = event.target.decode("latin-1").partition("?")[0]
        entry = shelf.get(path) if event.method == b"GET" else None
        answer = None
        if http:
            body: bytes | HttpAnswer = _CUT_SHORT
            with trio.move_on_after(HEAD_TIMEOUT_S):
                body = await _read_body(conn, stream)
            if isinstance(body, HttpAnswer):
                answer = body
            else:
                asked = _asked(event, body)
                for handler in http:
                    answer = handler(asked)
                    if answer is not None:
                        break
        if answer is not None:
            reply = _answer(conn, answer.status, answer.body, answer.headers)
        elif event.method != b"GET":
            reply = _answer(
                conn, 405, b"only GET\n", {"Allow": "GET", "Content-Type": "text/plain"}
            )
        elif entry is None:
            reply = _answer(conn, 404, b"no such reference\n", {"Content-Type": "text/plain"})
        else:
            reply = _answer(conn, 200, entry.data, {"Content-Type": entry.mime_type})
        try:
            await stream.send_all(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()
