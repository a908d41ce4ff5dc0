"""Transports of the server toolkit: newline-delimited JSON on stdio, text frames on a websocket.

Each is a :class:`LineTransport`: ``receive()`` returns the next message text (None at the
end), ``send(text)`` writes one, ``aclose()`` ends it. Framing is the pure
:class:`protocol.framing.LineBuffer`, so an over-long or non-UTF-8 line is skipped with a
diagnostic on stderr instead of ending the link. :class:`ChannelTransport` joins a server to a
host in the same trio run through memory channels, for tests under a MockClock.
"""

from __future__ import annotations

import os
import sys
from typing import Protocol

import trio
import trio_websocket

from protocol.framing import LineBuffer, Oversize, Undecodable, encode_line

__all__ = [
    "ChannelTransport",
    "LineTransport",
    "StdioTransport",
    "StreamTransport",
    "TransportClosed",
    "WsTransport",
]

#: The largest line or frame the toolkit reads.
MAX_LINE_BYTES = 4 * 1024 * 1024


class TransportClosed(Exception):
    """The peer is gone; nothing more can be written."""


class LineTransport(Protocol):
    """One message per line or frame."""

    async def receive(self) -> str | None:
        """The next message's text; None when the peer closed."""
        ...

    async def send(self, text: str) -> None:
        """Write one message; raises :class:`TransportClosed` when the peer is gone."""
        ...

    async def aclose(self) -> None:
        """End the transport."""
        ...


def warn(text: str) -> None:
    """A diagnostic on stderr (stdout belongs to the protocol on stdio)."""
    print(f"[mcpl-server] {text}", file=sys.stderr, flush=True)


class StreamTransport:
    """Newline-delimited JSON over a pair of trio byte streams."""

    def __init__(
        self,
        receive_stream: trio.abc.ReceiveStream,
        send_stream: trio.abc.SendStream,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self._in = receive_stream
        self._out = send_stream
        self._buf = LineBuffer(max_line_bytes)
        self._ready: list[str] = []
        self._eof = False

    async def receive(self) -> str | None:
        """The next non-blank line; None at EOF."""
        while not self._ready:
            if self._eof:
                return None
            try:
                data = await self._in.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._eof = True
            for item in self._buf.receive_data(data):
                if isinstance(item, Oversize):
                    warn(f"a line of {item.size} bytes is over the limit; skipped")
                elif isinstance(item, Undecodable):
                    warn(f"a line of {item.size} bytes is not UTF-8; skipped")
                else:
                    self._ready.append(item)
        return self._ready.pop(0)

    async def send(self, text: str) -> None:
        """Write one line."""
        try:
            await self._out.send_all(encode_line(text))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(str(exc)) from exc

    async def aclose(self) -> None:
        """Close both streams."""
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await self._out.aclose()
            await self._in.aclose()


class StdioTransport(StreamTransport):
    """The process's stdin and stdout, duplicated.

    While it is open, file descriptor 1 points at stderr: a stray ``print()`` in a tool (or
    a child process's output) goes to stderr instead of corrupting the protocol's stream.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        sys.stdout.flush()
        super().__init__(
            trio.lowlevel.FdStream(os.dup(0)),
            trio.lowlevel.FdStream(os.dup(1)),
            max_line_bytes=max_line_bytes,
        )
        self._stdout = os.dup(1)
        os.dup2(2, 1)

    async def aclose(self) -> None:
        """Close the streams and give fd 1 back to stdout."""
        if self._stdout >= 0:
            sys.stdout.flush()
            os.dup2(self._stdout, 1)
            os.close(self._stdout)
            self._stdout = -1
        await super().aclose()


class WsTransport:
    """One JSON-RPC message per websocket text frame; binary frames are ignored."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws

    async def receive(self) -> str | None:
        """The next text frame; None once the connection closed."""
        while True:
            try:
                message = await self._ws.get_message()
            except trio_websocket.ConnectionClosed:
                return None
            if isinstance(message, str):
                if message.strip():
                    return message
                continue
            warn(f"a binary frame of {len(message)} bytes ignored")

    async def send(self, text: str) -> None:
        """Write one text frame."""
        try:
            await self._ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(repr(exc)) from exc

    async def aclose(self) -> None:
        """Close the websocket."""
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await self._ws.aclose()


class ChannelTransport:
    """One message per item of a pair of trio memory channels, in the same process: what a
    host in the same trio run sends arrives on ``receive_channel``, what the server writes
    leaves on ``send_channel``. Nothing is framed or capped (both ends are this process)."""

    def __init__(
        self,
        send_channel: trio.MemorySendChannel[str],
        receive_channel: trio.MemoryReceiveChannel[str],
    ) -> None:
        self._out = send_channel
        self._in = receive_channel

    async def receive(self) -> str | None:
        """The next message; None once the other side closed (or this side did)."""
        try:
            return await self._in.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
            return None

    async def send(self, text: str) -> None:
        """Hand one message over (waits while the channel's buffer is full)."""
        try:
            await self._out.send(text)
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise TransportClosed(f"the memory channel is closed: {exc!r}") from exc

    async def aclose(self) -> None:
        """Close both channels."""
        await self._out.aclose()
        await self._in.aclose()
