"""The lobby's side of a test's control socket (``--control-connect HOST:PORT``): JSON lines
out (events, queued so that they never block the lobby) and in (commands). The test's side is
:mod:`tests.lobby.control`."""

from __future__ import annotations

import json
import math
from typing import Any

import trio

from tests.lobby.options import LobbyOptions, split_host_port
from tests.lobby.words import dumps, log, short


class InputError(Exception):
    """A line or frame from the host that could not be read; logged and skipped."""


class ControlLink:
    """JSON lines to and from a test's control socket. Events are queued and never block."""

    def __init__(self, stream: trio.SocketStream, label: str = "") -> None:
        self._stream = stream
        self._send, self._recv = trio.open_memory_channel[str](math.inf)
        self._broken = False
        self._prefix = f"{label}: " if label else ""

    def emit(self, event: dict[str, Any]) -> None:
        if self._broken:
            return
        try:
            line = dumps(event)
        except (TypeError, ValueError) as exc:
            line = dumps({"event": "error", "text": f"unserializable event: {exc}"})
        try:
            self._send.send_nowait(line + "\n")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def run_writer(self) -> None:
        async for line in self._recv:
            try:
                await self._stream.send_all(line.encode("utf-8"))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self._broken = True
                log(f"{self._prefix}control connection lost (writing)")
                return

    async def commands(self) -> Any:
        """Yield parsed command objects (or InputError instances for unreadable lines)."""
        buf = bytearray()
        while True:
            try:
                data = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                return
            buf += data
            while (nl := buf.find(b"\n")) >= 0:
                raw = bytes(buf[:nl])
                del buf[: nl + 1]
                if not raw.strip():
                    continue
                try:
                    yield json.loads(raw.decode("utf-8"))
                except (ValueError, RecursionError) as exc:
                    yield InputError(f"unreadable control line ({exc}): {short(repr(raw))}")

    def finish(self) -> None:
        """No more events: the writer drains what is queued, then stops."""
        self._send.close()

    async def aclose(self) -> None:
        self._send.close()
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self._stream.aclose()


async def _open_control(options: LobbyOptions, label: str) -> ControlLink | None:
    if not options.control_connect:
        return None
    host, port = split_host_port(options.control_connect)
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        log(f"{label + ': ' if label else ''}ERROR: cannot reach control {host}:{port}: {exc}")
        return None
    return ControlLink(stream, label)
