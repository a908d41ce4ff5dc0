"""The HTTP/1.1 both fake model APIs speak: a listener on a free loopback port, the reading of
request heads and sized bodies, and response heads. What a fake answers is its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import NoReturn

import trio

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024


class Closed(Exception):
    """The client hung up."""


class HeadReader:
    """Reads requests off one connection: heads up to :data:`MAX_HEAD_BYTES`, then bodies."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def _fill(self) -> None:
        data = await self._stream.receive_some(65536)
        if not data:
            raise Closed
        self._buf += data

    async def read_head(self) -> bytes | None:
        """The request head (without the blank line), or None if too large."""
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self._buf[:end])
                del self._buf[: end + 4]
                return head
            if len(self._buf) > MAX_HEAD_BYTES:
                return None
            await self._fill()

    async def read_exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path and headers (names lower-cased) of a request head."""
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


async def send_head(
    stream: trio.SocketStream, status: int, headers: Mapping[str, str], reasons: Mapping[int, str]
) -> None:
    lines = [f"HTTP/1.1 {status} {reasons.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


async def serve_local(
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    suffix: str,
    task_status: trio.TaskStatus[str],
) -> NoReturn:
    """Serve each connection with ``handle`` on 127.0.0.1 (a free port); reports the base URL
    (``http://127.0.0.1:PORT`` + ``suffix``) via ``task_status``. Runs until cancelled."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(f"http://127.0.0.1:{port}{suffix}")
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover
