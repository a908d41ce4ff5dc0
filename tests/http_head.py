"""A peek at a plain HTTP request on a socket before deciding what to serve on it: read the
request head (:func:`read_head`), parse it (:class:`RequestHead`), then hand the socket on with
what was read put back in front (:class:`ReplayStream`), e.g. to a websocket server when the
head asks for an upgrade. Test servers use it to serve files and a websocket on one port."""

from __future__ import annotations

import trio

from actors.serverkit.files import ReplayStream
from tests.lobby.words import short

__all__ = ["MAX_HEAD_BYTES", "ReplayStream", "RequestHead", "read_head"]

#: The longest request head read before the request is refused.
MAX_HEAD_BYTES = 16 * 1024


class RequestHead:
    """The request line and headers of one HTTP/1.1 request."""

    def __init__(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise ValueError(f"bad request line {short(lines[0])}")
        self.method, self.target, self.version = parts
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError(f"bad header line {short(line)}")
            self.headers.append((name.lower(), value.strip()))

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def path(self) -> str:
        target = self.target.partition("?")[0].partition("#")[0]
        if "://" in target:  # absolute-form
            target = "/" + target.partition("://")[2].partition("/")[2]
        return target

    def is_websocket_upgrade(self) -> bool:
        return any(
            key == "upgrade" and "websocket" in [t.strip().lower() for t in value.split(",")]
            for key, value in self.headers
        )


async def read_head(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes | None]:
    """Everything read so far, and the request head (None: too long, or the peer went away)."""
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if 0 <= end <= MAX_HEAD_BYTES:
            return bytes(buf), bytes(buf[:end])
        if end > MAX_HEAD_BYTES or len(buf) > MAX_HEAD_BYTES:
            return bytes(buf), None
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        if not data:
            return bytes(buf), None
        buf += data
