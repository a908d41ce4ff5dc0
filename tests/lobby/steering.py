"""The control link of :mod:`tests.lobby.server` (``--control-connect HOST:PORT``): JSON lines to
and from a test's control listener (:mod:`tests.lobby.control`).

An ordinary server needs none of this. The lobby reports what happens on its host connection
as events and takes commands that make it send things, so that a host's tests can drive it:

* events: ``hello`` {pid, transport}, ``ready``, ``received`` {message} (every line the host
  sent, parsed), ``error`` {text} (what the toolkit's session refused or skipped, what the
  checks of :mod:`tests.lobby.checks` found wrong, and bad commands), ``response``
  {method, request, response, attempts} (for each request a command sent; ``response`` is None
  when the connection ended first), ``pong`` {id}, ``hung``, ``channels`` {accepted, refused}
  (with ``--channels N``), and those of the checks (``coalescing``, ``streamed``), of the
  notebook (``notes``) and of the files (``http``); over stdio also ``response`` for each
  request the lobby itself sent (the registration, the people's messages, the echoes); over a
  websocket, once the channels are registered, one ``response`` for ``channels/register`` whose
  result lists the channels the host accepted.
* commands: ``ping``, ``crash``, ``hang`` (stdio: no more reading or writing), those of
  :mod:`tests.lobby.commands` (what the lobby sends), :mod:`tests.lobby.modes`
  (``open_mode``, ``fsu_mode``, ``manifest``, ``manifest_answers``, ``publish_echo_thread``),
  :mod:`tests.lobby.answers` (``hook``, ``render_mode``) and
  :mod:`tests.lobby.notes` (``rollback_mode``). What they send goes out in the order the
  commands came.

The requests commands send are not checked against the host's grant: a test may play a server
that sends what it was not granted, to watch the host refuse it.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from actors.serverkit import MCPLServer
from actors.serverkit.link import LinkLost, PendingRequest
from protocol.errors import RpcError
from protocol.server_session import NotGranted
from tests.lobby import faults
from tests.lobby.answers import KitAnswers
from tests.lobby.checks import HostChecks
from tests.lobby.commands import MAX_RAW_PENDING, KitCommands, valid_id
from tests.lobby.link import ControlLink, InputError
from tests.lobby.modes import KitModes
from tests.lobby.notes import Notebook
from tests.lobby.options import LobbyOptions
from tests.lobby.places import Places
from tests.lobby.words import MAX_RETRIES, NOT_READY, RETRIED_METHODS, RETRY_DELAY, short

#: sends the commands asked for, waiting to be written (past it a command is refused)
MAX_QUEUED = 65_536


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


class Hangable:
    """A line transport that shows ``on_sent`` each line it writes and, once :attr:`hung`,
    neither reads nor writes any more."""

    def __init__(self, inner: Any, on_sent: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_sent = on_sent
        self.hung = trio.Event()

    async def receive(self) -> str | None:
        if self.hung.is_set():
            await trio.sleep_forever()
        line: str | None = await self._inner.receive()
        if self.hung.is_set():
            await trio.sleep_forever()
        return line

    async def send(self, text: str) -> None:
        if self.hung.is_set():
            await trio.sleep_forever()
        await self._inner.send(text)
        self._on_sent(text)

    async def aclose(self) -> None:
        await self._inner.aclose()


class KitControl(KitCommands):
    """The lobby's side of one control connection, watching one toolkit server."""

    def __init__(
        self,
        server: MCPLServer,
        options: LobbyOptions,
        link: ControlLink,
        places: Places | None = None,
        notebook: Notebook | None = None,
    ) -> None:
        self.server = server
        self.options = options
        self.link = link
        places = places or Places()
        places.problem = self.problem
        self.notebook = notebook or Notebook()
        self.notebook.emit = self.emit
        self.modes = KitModes(server, options, self.emit, self.send_line, places)
        self.checks = HostChecks(
            server, context=options.context, problem=self.problem, emit=self.emit
        )
        self._shares = itertools.count(1)
        self.answers = KitAnswers(
            server, self.checks, context=options.context, emit=self.emit, ask=self.send_request
        )
        if options.mcp_only:
            faults.refuse_mcpl(server)  # over the modes: no MCPL is answered at all
        self.transport: Hangable | None = None
        self._sends, self._to_send = trio.open_memory_channel[
            tuple[Callable[[], Awaitable[Any]], str]
        ](MAX_QUEUED)
        self._raw: dict[Any, dict[str, Any]] = {}  # raw request id: the request
        self._sent: dict[Any, dict[str, Any]] = {}  # the lobby's own requests, by id
        self._mine: set[Any] = (
            set()
        )  # ids of the requests the commands sent  # raw request id: the request
        self._raw_answered: set[str] = set()  # texts of the session's complaints to swallow
        server.on_line(self._on_line)
        server.on_problem(self._on_problem)
        server.on_ready(self._on_ready)

    # -- events ------------------------------------------------------------------------------
    def emit(self, event: dict[str, Any]) -> None:
        self.link.emit(event)

    def problem(self, text: str) -> None:
        _log(f"ERROR: {text}")
        self.emit({"event": "error", "text": text})

    def _on_line(self, line: str) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            self.problem(f"malformed JSON from the host ({exc!r}): {short(line)}")
            return
        self.emit({"event": "received", "message": message})
        if self.options.mcp_only:
            if faults.is_initialized(line):
                self.emit({"event": "ready"})  # no grant is coming: ready as the host is
        else:
            self.checks.seen(message)
        for answer in message if isinstance(message, list) else [message]:
            if isinstance(answer, dict) and "method" not in answer:
                self._raw_answer(answer)

    def on_sent(self, line: str) -> None:
        """Keep each request the lobby writes, so that the host's answer can be reported."""
        if '"method"' not in line or '"id"' not in line:
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        rid = message.get("id") if isinstance(message, dict) else None
        if valid_id(rid) and isinstance(message.get("method"), str) and rid not in self._raw:
            if len(self._sent) >= MAX_RAW_PENDING:
                self._sent.pop(next(iter(self._sent)))
            self._sent[rid] = message

    def _raw_answer(self, answer: dict[str, Any]) -> None:
        rid = answer.get("id")
        if valid_id(rid) and rid in self._sent:
            request = self._sent.pop(rid)
            if rid in self._mine:  # a command's request: reported once settled
                self._mine.discard(rid)
            else:
                self.emit(self._response_event(request["method"], request, answer))
                self.checks.answer(request["method"], request, answer)
            return
        if valid_id(rid):
            # the toolkit's session will call this an unknown answer: said here instead
            if len(self._raw_answered) >= MAX_RAW_PENDING:
                self._raw_answered.clear()
            self._raw_answered.add(f"response to unknown or expired request {rid!r} ignored")
        if valid_id(rid) and rid in self._raw:
            request = self._raw.pop(rid)
            self.emit(self._response_event(request["method"], request, answer))
        elif self.transport is not None:  # over stdio every request we wrote is known
            self.problem("response to an unknown request id: " + short(answer))
        elif valid_id(rid):
            self._raw_answered.discard(f"response to unknown or expired request {rid!r} ignored")

    def _on_problem(self, text: str) -> None:
        if text in self._raw_answered:
            self._raw_answered.discard(text)
            return
        self.problem(text)

    async def _on_ready(self) -> None:
        self.emit({"event": "ready"})
        if not self.server.grant.allows("channels.register"):
            # registered all the same, as a server may: the host's refusal is reported
            channels = [ch.spec.to_wire() for ch in self.server.channels.values()]
            self.send_request("channels/register", {"channels": channels})
            return
        if self.options.channels > 0:
            # after the lobby's own registration, which would otherwise take them along
            with trio.move_on_after(self.server.request_timeout):
                await self.server.registered.wait()
            self.register_extra(self.options.channels)
        if self.transport is not None:
            return  # the registration's answer is reported as it comes
        await self.server.registered.wait()
        link = self.server.link
        accepted = self.server.accepted_channels(link) if link is not None else set()
        channels = [ch.spec.to_wire() for ch in self.server.channels.values()]
        request = {"method": "channels/register", "params": {"channels": channels}}
        results = [{"id": ch["id"], "accepted": ch["id"] in accepted} for ch in channels]
        response = {"result": {"results": results}}
        self.emit(self._response_event("channels/register", request, response))

    @staticmethod
    def _response_event(method: str, request: Any, response: Any) -> dict[str, Any]:
        return {
            "event": "response",
            "method": method,
            "request": request,
            "response": response,
            "attempts": 1,
        }

    # -- sending -----------------------------------------------------------------------------
    def send_request(
        self,
        method: str,
        params: Mapping[str, Any],
        attempts: int = 1,
        on_answer: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> None:
        """Send our request (unchecked); its answer becomes a ``response`` event. A host not
        ready yet (-32002) for a method the lobby retries gets it again, after a pause."""
        self._queue(self._sender(method, params, attempts, on_answer), method)

    def _sender(
        self,
        method: str,
        params: Mapping[str, Any],
        attempts: int,
        on_answer: Callable[[dict[str, Any] | None], None] | None,
    ) -> Callable[[], Awaitable[None]]:

        def settled(pending: PendingRequest) -> None:
            request = {"jsonrpc": "2.0", "id": pending.id, "method": method, "params": params}
            response: dict[str, Any] | None = None
            error = pending.error
            if isinstance(error, RpcError):
                if (
                    error.code == NOT_READY
                    and method in RETRIED_METHODS
                    and attempts <= MAX_RETRIES
                ):
                    _log(f"{method} #{pending.id}: host not ready (-32002), retrying")
                    self._spawn(retry, method)
                    return
                response = {"jsonrpc": "2.0", "id": pending.id, "error": error.to_wire()}
            elif error is None:
                response = {"jsonrpc": "2.0", "id": pending.id, "result": pending.result}
            event = self._response_event(method, request, response)
            self.emit({**event, "attempts": attempts})
            if response is not None:
                self.checks.answer(method, request, response)
            if on_answer is not None:
                on_answer(response)

        async def retry() -> None:
            await trio.sleep(RETRY_DELAY)
            self.send_request(method, params, attempts + 1, on_answer)

        async def send() -> None:
            link = self.server.link
            if link is None:
                raise LinkLost(f"{method}: no host is connected")
            pending = await link.start_request(method, params, check=False, on_settled=settled)
            if not pending.done.is_set() and self.transport is not None:
                if len(self._mine) >= MAX_RAW_PENDING:
                    self._mine.clear()
                self._mine.add(pending.id)

        return send

    def send_line(self, line: str) -> None:
        self._queue(lambda: self.server.send_line(line), "a raw line")

    def _spawn(self, fn: Any, name: str) -> None:
        if not self.server.spawn(fn, name):
            _log(f"not sending {name}: no host is connected")

    def _queue(self, fn: Callable[[], Awaitable[Any]], name: str) -> None:
        """Send in the order the commands came, one after another."""
        try:
            self._sends.send_nowait((fn, name))
        except trio.WouldBlock:
            self.problem(f"not sending {name}: {MAX_QUEUED} sends are already waiting")
        except trio.ClosedResourceError:
            _log(f"not sending {name}: the host connection has ended")

    def finish_sending(self) -> None:
        """No more commands: the sender sends what is queued (or says why not), then stops."""
        self._sends.close()

    async def run_sender(self) -> None:
        """Send what the commands queued, in order, to whichever host is connected."""
        async for fn, name in self._to_send:
            try:
                await fn()
            except (LinkLost, NotGranted) as exc:
                _log(f"not sending {name}: {exc}")

    # -- commands ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Read commands until the control connection closes."""
        async for cmd in self.link.commands():
            if isinstance(cmd, InputError):
                self.problem(str(cmd))
                continue
            try:
                self.on_command(cmd)
            except (KeyError, TypeError, ValueError) as exc:
                self.problem(f"bad control command {short(cmd)}: {exc!r}")
        _log("control connection closed")

    def on_command(self, cmd: Any) -> None:
        if not isinstance(cmd, dict) or not isinstance(cmd.get("cmd"), str):
            raise ValueError("a command is an object with a string 'cmd'")
        name = cmd["cmd"]
        if name == "crash":
            _log("crash requested: exiting with code 1")
            os._exit(1)
        if name == "ping":
            self.emit({"event": "pong", "id": cmd.get("id")})
            return
        if self.transport is not None and self.transport.hung.is_set():
            _log(f"ignoring control command {name!r}: hung")
            return
        handler = getattr(self, f"_cmd_{name}", None)
        for helper in (self.modes, self.answers):
            handler = handler or getattr(helper, f"{name}_command", None)
        if name == "rollback_mode":
            handler = lambda cmd: self.notebook.set_mode(cmd["mode"])  # noqa: E731
        if handler is None:
            raise ValueError(f"unknown command {name!r}")
        handler(cmd)

    def _cmd_hang(self, cmd: dict[str, Any]) -> None:
        if self.transport is None:
            raise ValueError("hang needs the stdio transport")
        _log("hang requested: no more reading or answering")
        self.transport.hung.set()
        self.emit({"event": "hung"})
