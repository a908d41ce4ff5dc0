"""Transports: a stdio subprocess (newline-delimited JSON) and a websocket (one message per text
frame). Both yield a ``Transport`` whose ``receive()`` returns a text message, an ``Oversize`` or
``Undecodable`` marker, or ``None`` at end of stream.

A transport that cannot open raises one of the ``TransportFailure`` errors below, whose text is
one line fit for an operator (never a credential: a refused websocket upgrade gives its status
line and a clipped excerpt of the body, never the headers). A server process's stderr is read
line by line until it ends, also after the link closed, so the last lines before a crash are
not lost; its exit status is kept on ``Transport.process``.
"""

from __future__ import annotations

import http
import logging
import os
import signal
import subprocess
import sys
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

import attrs
import trio
import trio_websocket

from actors.config import ServerConfig
from actors.prompt_io import is_pipe, write_promptly, write_whole_now
from protocol.display import one_line
from protocol.framing import Framed, LineBuffer, Oversize, Undecodable

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
STOP_GRACE_S = 2.0  # how long a server may take to exit once asked (stdin closed, SIGTERM)
DRAIN_GRACE_S = 1.0  # how long its last stderr lines may take to arrive once it exited
BODY_EXCERPT_CHARS = 200


class TransportFailure(OSError):
    """A transport could not be opened; ``str()`` is one line for the operator."""


class CommandNotFound(TransportFailure):
    def __init__(self, command: str, why: str = "command not found") -> None:
        super().__init__(f"{why}: {command}")
        self.command = command


class ServerExited(TransportFailure):
    """A launched server exited before it listened."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"{exit_text(returncode)} before listening")
        self.returncode = returncode


class HandshakeRefused(TransportFailure):
    """The websocket server answered the upgrade with an HTTP status other than 101."""

    def __init__(self, status: int, body: bytes | None) -> None:
        super().__init__(rejection_text(status, body))
        self.status = status


def exit_text(returncode: int) -> str:
    """How a process ended, in words: its exit code, or the signal that killed it."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = f" ({signal_name(-returncode)})"
    except ValueError:
        name = ""
    return f"killed by signal {-returncode}{name}"


def signal_name(number: int) -> str:
    return signal.Signals(number).name


def rejection_text(status: int, body: bytes | None) -> str:
    """A refused websocket upgrade in one line: the status line and an excerpt of the body."""
    try:
        phrase = f" {http.HTTPStatus(status).phrase}"
    except ValueError:
        phrase = ""
    text = f"handshake refused: HTTP {status}{phrase}"
    excerpt = one_line((body or b"").decode("utf-8", "replace"), BODY_EXCERPT_CHARS)
    return f"{text}: {excerpt}" if excerpt else text


@attrs.define
class ProcessExit:
    """How a server process ended, known once the transport closed: its return code, and
    whether the host had to kill it (it did not exit when asked)."""

    returncode: int | None = None
    killed: bool = False


class Transport(Protocol):
    description: str
    process: ProcessExit | None  # a server process the transport started, if any

    async def send(self, text: str) -> None: ...

    async def send_many(self, texts: list[str]) -> None: ...

    def send_now(self, texts: list[str]) -> bool:
        """Write ``texts`` in this step if the transport takes them whole without waiting; False,
        with nothing written, otherwise. Only while the link's writer has nothing in hand."""
        ...

    def buffered(self) -> bool:
        """Whether ``receive`` would return at once."""
        ...

    def take_buffered(self) -> list[Framed]:
        """Everything ``receive`` would return at once, in order, without waiting."""
        ...

    async def receive(self) -> Framed | None: ...


def _lines_of(texts: list[str]) -> bytes:
    """One message per line: encoded JSON never holds a raw newline, so a join is exact."""
    return ("\n".join(texts) + "\n").encode("utf-8")


class StdioTransport:
    def __init__(self, proc: trio.Process, max_line_bytes: int, description: str) -> None:
        self.proc = proc
        self.description = description
        self.process: ProcessExit | None = ProcessExit()
        self._lines = LineBuffer(max_line_bytes)
        self._ready: deque[Framed] = deque()
        self._eof = False
        stdin = proc.stdin
        #: The server's stdin when it is a pipe, which :meth:`send_now` may write to.
        self._pipe_in = (
            stdin if isinstance(stdin, trio.lowlevel.FdStream) and is_pipe(stdin) else None
        )

    async def send(self, text: str) -> None:
        await self.send_many([text])

    async def send_many(self, texts: list[str]) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if isinstance(stdin, trio.lowlevel.FdStream):
            await write_promptly(stdin, _lines_of(texts))  # the only writer: the link's writer
        else:
            await stdin.send_all(_lines_of(texts))

    def send_now(self, texts: list[str]) -> bool:
        return self._pipe_in is not None and write_whole_now(self._pipe_in, _lines_of(texts))

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
    argv = server_argv(cfg)
    try:
        return await trio.lowlevel.open_process(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=server_env(cfg),
            cwd=str(cfg.cwd) if cfg.cwd else None,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        if cfg.cwd is not None and exc.filename == str(cfg.cwd):
            raise CommandNotFound(str(cfg.cwd), "working folder not found") from None
        raise CommandNotFound(argv[0]) from None
    except PermissionError:
        raise CommandNotFound(argv[0], "command not executable") from None


@asynccontextmanager
async def _running(
    proc: trio.Process,
    on_stderr: Callable[[str], None],
    ended: ProcessExit,
    *,
    stdout_too: bool = False,
) -> AsyncIterator[None]:
    """Read the process's stderr (and stdout, if asked) as log lines while the body runs; then
    stop the process (stdin closed, or SIGTERM when it has no stdin pipe; killed after
    ``STOP_GRACE_S``), record how it ended in ``ended``, and read what it still wrote (at most
    ``DRAIN_GRACE_S``). Runs to the end under a bounded shield, so a closing host also reaps
    its servers."""
    streams = [s for s in (proc.stderr, proc.stdout if stdout_too else None) if s is not None]
    try:
        async with trio.open_nursery() as nursery:
            drained = [trio.Event() for _ in streams]

            async def drain(stream: trio.abc.ReceiveStream, done: trio.Event) -> None:
                try:
                    await _drain_stderr(stream, on_stderr)
                finally:
                    done.set()

            for stream, done in zip(streams, drained, strict=True):
                nursery.start_soon(drain, stream, done)
            try:
                yield
            finally:
                with trio.move_on_after(STOP_GRACE_S + DRAIN_GRACE_S + 1) as scope:
                    scope.shield = True
                    await _stop(proc, ended)
                    with trio.move_on_after(DRAIN_GRACE_S):
                        for done in drained:
                            await done.wait()
                nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:  # the stop above was cut short
            proc.kill()
            ended.killed = True
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await proc.wait()
        ended.returncode = proc.returncode


async def _stop(proc: trio.Process, ended: ProcessExit) -> None:
    if proc.stdin is not None:
        try:
            await proc.stdin.aclose()  # EOF ends a well-behaved stdio server
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    elif proc.returncode is None:
        proc.terminate()
    if proc.returncode is None:
        with trio.move_on_after(STOP_GRACE_S):
            await proc.wait()
    if proc.returncode is None:
        proc.kill()
        ended.killed = True
        await proc.wait()
    ended.returncode = proc.returncode


@asynccontextmanager
async def open_stdio(
    cfg: ServerConfig, on_stderr: Callable[[str], None]
) -> AsyncIterator[StdioTransport]:
    proc = await _spawn(cfg, stdin=subprocess.PIPE)
    transport = StdioTransport(proc, cfg.max_line_bytes, f"pid {proc.pid}")
    assert transport.process is not None
    async with _running(proc, on_stderr, transport.process):
        yield transport


class WebsocketTransport:
    def __init__(self, ws: trio_websocket.WebSocketConnection, description: str) -> None:
        self.ws = ws
        self.description = description
        self.process: ProcessExit | None = None  # set for a server the host launched

    async def send(self, text: str) -> None:
        await self.ws.send_message(text)

    async def send_many(self, texts: list[str]) -> None:
        for text in texts:  # one message per frame
            await self.ws.send_message(text)

    def send_now(self, texts: list[str]) -> bool:
        return False  # a frame is sent by its own task's wait

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
    opened = False
    try:
        async with trio_websocket.open_websocket_url(
            cfg.endpoint,
            extra_headers=headers,
            max_message_size=cfg.max_line_bytes,
            connect_timeout=cfg.request_timeout_s,
            disconnect_timeout=2,
        ) as ws:
            opened = True
            yield WebsocketTransport(ws, cfg.url or cfg.endpoint)
    except trio_websocket.HandshakeError as exc:
        if opened:
            raise
        # Never the exception itself: a rejection's text holds the response's headers and body,
        # which may echo the Authorization header we sent.
        raise _handshake_failure(exc, cfg.request_timeout_s) from None


def _handshake_failure(exc: trio_websocket.HandshakeError, timeout: float) -> TransportFailure:
    if isinstance(exc, trio_websocket.ConnectionRejected):
        return HandshakeRefused(exc.status_code, exc.body)
    if isinstance(exc, trio_websocket.ConnectionTimeout):
        return TransportFailure(f"no websocket handshake within {timeout:g}s")
    cause = exc.__cause__
    if isinstance(cause, OSError):
        why = cause.strerror or str(cause) or type(cause).__name__
        return TransportFailure(f"could not connect: {why}")
    return TransportFailure(f"websocket handshake failed ({type(exc).__name__})")


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
                raise ServerExited(proc.returncode)
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
    ended = ProcessExit()
    async with _running(proc, on_stderr, ended, stdout_too=True):
        await _until_listening(cfg, proc)
        async with open_websocket(cfg) as ws:
            ws.process = ended
            yield ws
