"""Transports: a stdio subprocess (newline-delimited JSON) and a websocket (one message per text
frame). Both yield a ``Transport`` whose ``receive()`` returns a text message, an ``Oversize`` or
``Undecodable`` marker, or ``None`` at end of stream.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import trio
import trio_websocket

from protocol.framing import Framed, LineBuffer, Oversize, Undecodable

from .config import ServerConfig

log = logging.getLogger("mcplive.transport")

#: Environment variables a stdio server inherits; the config's ``env`` adds to them.
ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "SYSTEMROOT",
    "PYTHONPATH",
    "VIRTUAL_ENV",
)
STDERR_LINE_CAP = 8192
READ_CHUNK = 65536


class Transport(Protocol):
    description: str

    async def send(self, text: str) -> None: ...

    async def send_many(self, texts: list[str]) -> None: ...

    def buffered(self) -> bool:
        """Whether ``receive`` would return at once."""
        ...

    def take_buffered(self) -> list[Framed]:
        """Everything ``receive`` would return at once, in order, without waiting."""
        ...

    async def receive(self) -> Framed | None: ...


class StdioTransport:
    def __init__(self, proc: trio.Process, max_line_bytes: int, description: str) -> None:
        self.proc = proc
        self.description = description
        self._lines = LineBuffer(max_line_bytes)
        self._ready: deque[Framed] = deque()
        self._eof = False

    async def send(self, text: str) -> None:
        await self.send_many([text])

    async def send_many(self, texts: list[str]) -> None:
        assert self.proc.stdin is not None
        # One message per line: encoded JSON never holds a raw newline, so a join is exact.
        await self.proc.stdin.send_all(("\n".join(texts) + "\n").encode("utf-8"))

    def buffered(self) -> bool:
        return bool(self._ready)

    def take_buffered(self) -> list[Framed]:
        ready = list(self._ready)
        self._ready.clear()
        return ready

    async def receive(self) -> Framed | None:
        assert self.proc.stdout is not None
        while not self._ready:
            if self._eof:
                return None
            try:
                data = await self.proc.stdout.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
            self._ready.extend(self._lines.receive_data(data))
        return self._ready.popleft()


def server_argv(cfg: ServerConfig) -> list[str]:
    assert cfg.command is not None
    argv = list(cfg.command)
    # "python" in a command means the interpreter running the host, so a bundled or project
    # server runs with the same packages installed.
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def server_env(cfg: ServerConfig) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW}
    env.update(cfg.env)
    return env


async def _drain_stderr(stream: trio.abc.ReceiveStream, on_line: Callable[[str], None]) -> None:
    lines = LineBuffer(STDERR_LINE_CAP)
    while True:
        try:
            data = await stream.receive_some(READ_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        for item in lines.receive_data(data):
            if isinstance(item, str):
                on_line(item)
            else:
                on_line(f"<stderr line dropped: {item.size} bytes>")
        if not data:
            return


async def _spawn(cfg: ServerConfig, *, stdin: int) -> trio.Process:
    """Start a server's command: its own session, the allowed environment, output piped."""
    return await trio.lowlevel.open_process(
        server_argv(cfg),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(cfg),
        cwd=str(cfg.cwd) if cfg.cwd else None,
        start_new_session=True,
    )


@asynccontextmanager
async def open_stdio(
    cfg: ServerConfig, on_stderr: Callable[[str], None]
) -> AsyncIterator[StdioTransport]:
    proc = await _spawn(cfg, stdin=subprocess.PIPE)
    try:
        async with trio.open_nursery() as nursery:
            assert proc.stderr is not None
            nursery.start_soon(_drain_stderr, proc.stderr, on_stderr)
            try:
                yield StdioTransport(proc, cfg.max_line_bytes, f"pid {proc.pid}")
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(3) as scope:
            scope.shield = True
            if proc.stdin is not None:
                try:
                    await proc.stdin.aclose()  # EOF ends a well-behaved stdio server
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            with trio.move_on_after(2):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


class WebsocketTransport:
    def __init__(self, ws: trio_websocket.WebSocketConnection, description: str) -> None:
        self.ws = ws
        self.description = description

    async def send(self, text: str) -> None:
        await self.ws.send_message(text)

    async def send_many(self, texts: list[str]) -> None:
        for text in texts:  # one message per frame
            await self.ws.send_message(text)

    def buffered(self) -> bool:
        return False

    def take_buffered(self) -> list[Framed]:
        return []

    async def receive(self) -> Framed | None:
        while True:
            try:
                msg = await self.ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                reason = exc.reason
                if reason is not None and reason.code == 1009:
                    return Oversize(-1)  # the frame was over max_line_bytes; the link is closed
                return None
            if isinstance(msg, str):
                return msg
            log.info("%s: binary frame of %d bytes ignored", self.description, len(msg))
            return Undecodable(len(msg))


@asynccontextmanager
async def open_websocket(cfg: ServerConfig) -> AsyncIterator[WebsocketTransport]:
    assert cfg.endpoint is not None
    headers = [(b"Authorization", f"Bearer {cfg.token}".encode())] if cfg.token else []
    async with trio_websocket.open_websocket_url(
        cfg.endpoint,
        extra_headers=headers,
        max_message_size=cfg.max_line_bytes,
        connect_timeout=cfg.request_timeout_s,
        disconnect_timeout=2,
    ) as ws:
        yield WebsocketTransport(ws, cfg.url or cfg.endpoint)


@asynccontextmanager
async def open_transport(
    cfg: ServerConfig, on_stderr: Callable[[str], None]
) -> AsyncIterator[Transport]:
    if cfg.command is not None and cfg.url is not None:
        async with open_launched(cfg, on_stderr) as w:
            yield w
    elif cfg.command is not None:
        async with open_stdio(cfg, on_stderr) as t:
            yield t
    else:
        async with open_websocket(cfg) as w:
            yield w


#: How long a launched websocket server may take to start listening.
LAUNCH_TIMEOUT_S = 30.0
LAUNCH_RETRY_S = 0.1


async def _until_listening(cfg: ServerConfig, proc: trio.Process) -> None:
    """Wait until the launched server accepts connections on its url's host and port."""
    assert cfg.endpoint is not None
    url = urllib.parse.urlsplit(cfg.endpoint)
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if url.scheme == "wss" else 80)
    with trio.fail_after(LAUNCH_TIMEOUT_S):
        while True:
            if proc.returncode is not None:
                raise OSError(f"the server exited with code {proc.returncode}")
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError:
                await trio.sleep(LAUNCH_RETRY_S)  # not listening yet
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def open_launched(
    cfg: ServerConfig, on_stderr: Callable[[str], None]
) -> AsyncIterator[WebsocketTransport]:
    """A websocket server the host starts itself (``command`` and ``url`` both set): the process
    runs for as long as the link, and the host dials ``url`` once it accepts connections. Its
    stdout and stderr are both read as log lines."""
    proc = await _spawn(cfg, stdin=subprocess.DEVNULL)
    try:
        async with trio.open_nursery() as nursery:
            assert proc.stderr is not None and proc.stdout is not None
            nursery.start_soon(_drain_stderr, proc.stderr, on_stderr)
            nursery.start_soon(_drain_stderr, proc.stdout, on_stderr)
            await _until_listening(cfg, proc)
            try:
                async with open_websocket(cfg) as ws:
                    yield ws
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(3) as scope:
            scope.shield = True
            proc.terminate()
            with trio.move_on_after(2):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
