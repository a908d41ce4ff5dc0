"""The test side of the lobby server's control socket (``--control-connect HOST:PORT``).

A test listens, starts the lobby (directly or through the host) with ``--control-connect
<listener.address>``, accepts the connection the lobby makes, then exchanges JSON lines with it::

    async with open_control_listener() as listener:
        ...start the lobby with --control-connect listener.address...
        ctl = await listener.accept()
        await ctl.wait_for(lambda e: e["event"] == "ready", "lobby ready")
        ctl.send({"cmd": "push", "eventId": "e1", "text": "hi"})
        event = await ctl.wait_for(
            lambda e: e["event"] == "response" and e["request"]["params"]["eventId"] == "e1",
            "answer to push e1",
        )

Events from the lobby: ``hello`` {pid, transport}, ``ready``, ``received`` {message},
``response`` {request, response, attempts, timedOut?}, ``error`` {text}, ``flood_done``
{accepted, count}, ``channels`` {accepted, refused: [{id, reason}]} (with ``--channels N``),
``hung``, ``pong`` {id}, ``open_withheld`` {id} (a ``channels/open`` left unanswered in open mode
``never``, once its handler has decided), ``streamed`` {inferenceId, channelId, text} (on each
``channels/outgoing/complete``), the acknowledgements ``threads`` {channelId, threads},
``publish_echo_thread`` {mode}, ``open_mode`` {mode} and ``render_mode`` {mode, content,
delaySeconds}; with ``--files``, ``http`` {method, path, status, authorization} for every plain
HTTP request the listener answered (sent to every live session's control connection). RFC-006:
``coalescing`` {advertised, leaves} (the host's ``eventCoalescing`` from ``initialize``),
``coalesce_withheld`` {method, eventId?, messageId?, coalesce, missing} (sent without the
member: the host did not advertise those leaves) and ``render`` {requestId, params, mode,
result? | error?, delaySeconds?} (each ``push/render``). Commands are listed in
:mod:`tests.lobby.steering` (and :mod:`tests.lobby.commands`), e.g. ``{"cmd": "share", "file":
"board.png", "text": ..., "eventId"?, "uri"?, "coalesce"?, "force"?}`` with ``--files``, or
``{"cmd": "push", "eventId": ..., "text": ..., "coalesce": {"key": "status"}}``.

Every lobby process (or websocket connection) connects once; after a restart, ``accept()`` again.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
from collections.abc import Callable, Generator
from typing import Any

import trio

BACKLOG = 10_000
DEFAULT_TIMEOUT = 60.0  # generous: tests run in parallel, often on a loaded machine

Predicate = Callable[[dict[str, Any]], bool]


class ControlClosed(ConnectionError):
    """The lobby closed its control connection (it exited, crashed or ended its session)."""


class _Sent:
    """What :meth:`LobbyControl.send` returns: awaiting it flushes anything not yet written."""

    def __init__(self, control: LobbyControl) -> None:
        self._control = control

    def __await__(self) -> Generator[Any, None, None]:
        return self._control.flush().__await__()


class LobbyControl:
    """One control connection from one lobby process or websocket session."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._fd = stream.socket.fileno()
        self._outbuf = bytearray()
        self._send_lock = trio.Lock()
        self._read_lock = trio.Lock()
        self._inbuf = bytearray()
        self._backlog: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(
            maxlen=BACKLOG
        )
        self._seq = 0
        self.closed = False

    # ---- sending -------------------------------------------------------------------------------

    def send(self, cmd: dict[str, Any]) -> _Sent:
        """Queue one command and write it out now if the socket takes it (it nearly always does).

        Usable both as ``ctl.send(cmd)`` and ``await ctl.send(cmd)``; anything the socket could
        not take at once is flushed by the await, by the next :meth:`wait_for`, or by ``aclose``.
        """
        self._outbuf += (json.dumps(cmd) + "\n").encode("utf-8")
        if not self._send_lock.locked():
            self._write_some()
        return _Sent(self)

    def _write_some(self) -> None:
        while self._outbuf:
            try:
                n = os.write(self._fd, self._outbuf)
            except BlockingIOError:
                return
            except OSError as exc:
                raise ControlClosed(f"cannot send to the lobby: {exc}") from exc
            del self._outbuf[:n]

    async def flush(self) -> None:
        async with self._send_lock:
            while self._outbuf:
                data = bytes(self._outbuf)
                self._outbuf.clear()
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise ControlClosed(f"cannot send to the lobby: {exc}") from exc

    # ---- receiving -----------------------------------------------------------------------------

    @property
    def events(self) -> list[dict[str, Any]]:
        """The backlog: the last events seen, oldest first."""
        return [event for _, event in self._backlog]

    def mark(self) -> int:
        """A position for ``wait_for(..., since=mark)``: only events after this call count."""
        return self._seq

    def _matches(self, pred: Predicate, event: dict[str, Any]) -> bool:
        try:
            return bool(pred(event))
        except (KeyError, IndexError, TypeError, AttributeError):
            return False

    def _scan(self, pred: Predicate, after: int) -> tuple[dict[str, Any] | None, int]:
        """The first backlog event with seq >= after that matches, and the next seq to scan."""
        if self._backlog:
            # the backlog's seqs are consecutive: the one at ``after`` is at a known index
            start = max(0, after - self._backlog[0][0])
            for seq, event in itertools.islice(self._backlog, start, None):
                if self._matches(pred, event):
                    return event, seq + 1
        return None, self._seq

    async def _read_event(self) -> None:
        while True:
            nl = self._inbuf.find(b"\n")
            if nl >= 0:
                raw = bytes(self._inbuf[:nl])
                del self._inbuf[: nl + 1]
                if not raw.strip():
                    continue
                event = json.loads(raw.decode("utf-8"))
                if not isinstance(event, dict):
                    event = {"event": "invalid", "value": event}
                self._backlog.append((self._seq, event))
                self._seq += 1
                return
            if self.closed:
                raise ControlClosed("the lobby closed the control connection")
            try:
                data = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.closed = True
            else:
                self._inbuf += data

    async def wait_for(
        self,
        pred: Predicate,
        what: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        since: int | None = None,
    ) -> dict[str, Any]:
        """Return the first event (oldest first, backlog included) for which ``pred`` is true.

        The backlog holds the last 10000 events, so an event that arrived before this call (even
        one an earlier ``wait_for`` returned) matches too; pass ``since=ctl.mark()`` to look only
        at later ones. A predicate raising KeyError/IndexError/TypeError/AttributeError counts
        as "no". Raises TimeoutError after ``timeout`` seconds and ControlClosed at EOF, both
        naming ``what``.
        """
        await self.flush()
        after = 0 if since is None else since
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while True:
                found, after = self._scan(pred, after)
                if found is not None:
                    return found
                async with self._read_lock:
                    if self._seq == after:  # nothing new arrived while we waited for the lock
                        try:
                            await self._read_event()
                        except ControlClosed:
                            found, after = self._scan(pred, after)
                            if found is not None:
                                return found
                            raise ControlClosed(
                                f"control closed while waiting for {what}; last events: "
                                f"{self._tail()}"
                            ) from None
        raise TimeoutError(f"timed out waiting for {what}; last events: {self._tail()}")

    async def wait_closed(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Read (and keep) events until the lobby closes the connection."""
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            try:
                while True:
                    async with self._read_lock:
                        await self._read_event()
            except ControlClosed:
                return
        raise TimeoutError(f"the lobby kept its control connection open; last: {self._tail()}")

    def _tail(self, n: int = 5) -> str:
        tail = [event for _, event in list(self._backlog)[-n:]]
        text = json.dumps(tail)
        return text if len(text) < 2000 else text[:2000] + "…"

    # ---- closing -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        if not self.closed:
            with trio.move_on_after(1):
                try:
                    await self.flush()
                except ControlClosed:
                    pass
        self.closed = True
        await self._stream.aclose()

    async def __aenter__(self) -> LobbyControl:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class ControlListener:
    """A TCP listener on 127.0.0.1 that lobby processes connect to.

    :func:`open_control_listener` binds synchronously, so the listener works as
    ``listener = open_control_listener()``, ``listener = await open_control_listener()`` and
    ``async with open_control_listener() as listener``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
        self.host = host
        self.port: int = sock.getsockname()[1]
        self._listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self.address = f"{host}:{self.port}"

    async def accept(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> LobbyControl:
        """The next lobby connection (a restarted lobby connects again)."""
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            stream = await self._listener.accept()
            return LobbyControl(stream)
        raise TimeoutError(f"no lobby connected to {self.address}")

    async def aclose(self) -> None:
        await self._listener.aclose()

    def __await__(self) -> Generator[Any, None, ControlListener]:
        return self._itself().__await__()

    async def _itself(self) -> ControlListener:
        return self

    async def __aenter__(self) -> ControlListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def open_control_listener(host: str = "127.0.0.1", port: int = 0) -> ControlListener:
    """Listen for lobby control connections; ``.address`` is what ``--control-connect`` takes."""
    return ControlListener(host, port)
