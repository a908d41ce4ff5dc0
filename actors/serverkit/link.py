"""One host connection of the server toolkit: the reader, the writer and the pending asks.

The reader only decodes (through the pure :class:`protocol.server_session.ServerSession`) and
dispatches; it never awaits one of our own requests, nor a handler, so the host's requests are
served while ours are pending and the host's answers reach a handler that awaits them (a
``push/event`` sent from inside a ``tools/call`` handler is answered while the call is still
open). Each host request and notice runs in its own task in the link's nursery, in the order
and under the rules of :mod:`actors.serverkit.serving` (publishes into one channel one after
the other, a publish answered before its handler's first call to the host). At most
``max_handlers`` requests are handled at a time (the session refuses more than its
``max_inbound`` waiting ones with an error) and :data:`MAX_NOTICES` notices (a further one is
dropped with a line on stderr). Lines leave through a bounded outbox drained by one writer
task: a sender waits while it is full (backpressure). At most ``max_pending`` of our requests
are unanswered; a further one waits for a slot.

When the link ends every pending request fails with :class:`LinkLost` and every task the link
started (handlers, ``on_granted`` hooks) is cancelled.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import attrs
import trio

from protocol import server_session as ss
from protocol.errors import INTERNAL_ERROR, RpcError
from protocol.jsonrpc import Id, LocalProtocolError, method_not_found

from .serving import CURRENT, UNSET, Lanes, Serving, Turn, lane_of
from .transport import LineTransport, TransportClosed, warn

__all__ = [
    "NO_ANSWER",
    "Dispatch",
    "HostRequest",
    "LinkLost",
    "LinkTaps",
    "PendingRequest",
    "RequestTimeout",
    "ServerLink",
]


#: Host notices being handled or waiting for their turn; past it, one more is dropped (with a
#: line on stderr): the reader never waits for a handler.
MAX_NOTICES = 256


class _NoAnswer:
    def __repr__(self) -> str:
        return "NO_ANSWER"


#: What an answer override returns to write no answer at all: the host's request stays open.
NO_ANSWER: Final = _NoAnswer()


@attrs.frozen
class HostRequest:
    """A host request as an answer override sees it (``MCPLServer.answer_for``).

    ``default`` is the answer the toolkit's session would have written itself (for
    ``initialize``, ``ping``, ``mcpl/manifest`` and ``featureSets/update``), else None.
    """

    id: Id
    method: str
    params: Mapping[str, Any]
    default: Any = None


#: An answer override: the result, :data:`NO_ANSWER`, or it raises ``RpcError`` to refuse.
Override = Callable[[HostRequest], Any]


@attrs.frozen
class LinkTaps:
    """What a server watches on a link: every line the host sends (``lines``), and the
    session's refusals and skips (``problems``; without any, they go to stderr)."""

    lines: tuple[Callable[[str], None], ...] = ()
    problems: tuple[Callable[[str], None], ...] = ()


def _tell(taps: tuple[Callable[[str], None], ...], text: str) -> None:
    for tap in taps:
        try:
            tap(text)
        except Exception as exc:  # a watcher's bug never ends the connection
            warn(f"{getattr(tap, '__name__', 'tap')} failed: {type(exc).__name__}: {exc}")


class LinkLost(Exception):
    """The host connection ended before our request was answered."""


class RequestTimeout(TimeoutError):
    """The host did not answer our request in time."""


class Dispatch(Protocol):
    """What a link hands to the server: the host's calls and notices, and grant changes."""

    async def host_call(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> Any:
        """Answer one host request (raise :class:`protocol.errors.RpcError` to refuse it)."""
        ...

    async def host_notice(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> None:
        """Handle one host notification."""
        ...

    def grant_changed(self, link: ServerLink, before: ss.Grant, after: ss.Grant) -> None:
        """The host's grant on ``link`` changed."""
        ...


@attrs.define(eq=False)
class _Waiter:
    method: str
    on_chunk: Callable[[Mapping[str, Any]], None] | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: BaseException | None = None
    on_settled: Callable[[_Waiter], None] | None = None


@attrs.define(eq=False)
class PendingRequest:
    """One of our requests sent by :meth:`ServerLink.start_request`: its ``id``, and once
    ``done`` is set, the host's ``result`` or the ``error`` (:class:`protocol.errors.RpcError`
    for the host's error, :class:`LinkLost` when the connection ended first)."""

    id: Id
    method: str
    _waiter: _Waiter = attrs.field(repr=False)

    @property
    def done(self) -> trio.Event:
        """Set once the host answered (or the connection ended)."""
        return self._waiter.done

    @property
    def result(self) -> Any:
        """The host's result (None until answered, or after an error)."""
        return self._waiter.result

    @property
    def error(self) -> BaseException | None:
        """Why there is no result, once ``done``; None otherwise."""
        return self._waiter.error

    async def wait(self, timeout: float = math.inf) -> Any:
        """Wait for the answer and return the host's result; raises the ``error``, or
        :class:`RequestTimeout` after ``timeout`` seconds (the request stays pending)."""
        with trio.move_on_after(timeout):
            await self._waiter.done.wait()
        if not self._waiter.done.is_set():
            raise RequestTimeout(f"{self.method}: no answer from the host within {timeout:g} s")
        if self._waiter.error is not None:
            raise self._waiter.error
        return self._waiter.result


class ServerLink:
    """One host connection; see the module docstring."""

    def __init__(
        self,
        session: ss.ServerSession,
        transport: LineTransport,
        dispatch: Dispatch,
        *,
        request_timeout: float = 30.0,
        max_handlers: int = 32,
        max_pending: int = 64,
        outbox_size: int = 64,
        overrides: Mapping[str, Override] | None = None,
        taps: LinkTaps = LinkTaps(),
    ) -> None:
        """``overrides``: per method, a function (sync or async) answering the host's request
        in place of the server (and of the session, for the methods it defers); see
        :class:`HostRequest` and :data:`NO_ANSWER`."""
        self._overrides = dict(overrides or {})
        self._taps = taps
        self.session = session
        self._transport = transport
        self._dispatch = dispatch
        self.request_timeout = request_timeout
        self._handlers = trio.Semaphore(max_handlers)
        self._lanes = Lanes()
        self._notices = 0
        self._slots = trio.Semaphore(max_pending)
        self._out_send, self._out_recv = trio.open_memory_channel[str](outbox_size)
        self._waiters: dict[Id, _Waiter] = {}
        self._nursery: trio.Nursery | None = None
        self.closed = trio.Event()
        self._previous_grant = ss.Grant()
        #: replaced by a fresh event each time the host fetches the manifest
        self.manifest_fetched = trio.Event()

    @property
    def grant(self) -> ss.Grant:
        """The host's grant on this link."""
        return self.session.grant

    # -- running ---------------------------------------------------------------------------
    async def run(
        self, *, task_status: trio.TaskStatus[ServerLink] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the link until the host closes it (or the caller cancels)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                task_status.started(self)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self._end()
            await self._transport.aclose()

    def spawn(self, fn: Callable[[], Any], name: str = "") -> None:
        """Run ``fn()`` (async) for as long as the link lives; its failure is logged. It runs
        beside the connection, not as part of the handler that started it: its calls to the
        host do not answer that handler's publish."""
        if self._nursery is None or self.closed.is_set():
            return

        async def guarded() -> None:
            CURRENT.set(None)
            try:
                await fn()
            except Exception as exc:
                warn(
                    f"{name or getattr(fn, '__name__', 'task')} failed: {type(exc).__name__}: {exc}"
                )

        self._nursery.start_soon(guarded)

    def close(self) -> None:
        """End the link (a newer connection takes over, or the server stops)."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for lost in self.session.close():
            self._settle(lost.id, error=LinkLost(f"{lost.method}: the host connection closed"))
        for rid in list(self._waiters):
            self._settle(rid, error=LinkLost("the host connection closed"))

    async def _writer(self) -> None:
        async for line in self._out_recv:
            try:
                await self._transport.send(line)
            except TransportClosed:
                self.close()
                return

    async def _reader(self) -> None:
        while True:
            line = await self._transport.receive()
            if line is None:
                return
            if self._taps.lines:
                _tell(self._taps.lines, line)
            for event in self.session.receive_line(line):
                await self._on_event(event)

    async def _on_event(self, event: ss.Event) -> None:
        if isinstance(event, ss.Outgoing):
            await self._out_send.send(event.line)
        elif isinstance(event, ss.HostCall):
            assert self._nursery is not None
            self._nursery.start_soon(self._serve, event, self._turn(event.method, event.params))
        elif isinstance(event, ss.HostNotice):
            if event.method == "inference/chunk":
                self._chunk(event.params)
            elif self._notices >= MAX_NOTICES:
                warn(f"{event.method} dropped: {MAX_NOTICES} notices are being handled already")
            else:
                assert self._nursery is not None
                self._notices += 1
                turn = self._turn(event.method, event.params)
                self._nursery.start_soon(self._notice, event, turn)
        elif isinstance(event, ss.Answered):
            self._settle(event.id, result=event.result)
        elif isinstance(event, ss.Failed):
            self._settle(event.id, error=event.error)
        elif isinstance(event, ss.GrantChanged):
            self._dispatch.grant_changed(self, self._previous_grant, event.grant)
            self._previous_grant = event.grant
        elif isinstance(event, ss.ManifestServed):
            fetched, self.manifest_fetched = self.manifest_fetched, trio.Event()
            fetched.set()
        elif isinstance(event, ss.Skipped):
            if self._taps.problems:
                _tell(self._taps.problems, event.text)
            else:
                warn(event.text)

    def _turn(self, method: str, params: Mapping[str, Any]) -> Turn | None:
        """A turn in the lane of this message (taken as it is read), or None."""
        key = lane_of(method, params)
        return self._lanes.take(key) if key is not None else None

    def _free(self, serving: Serving) -> None:
        """Give back what ``serving`` holds: its turn and its handler place."""
        if serving.turn is not None:
            self._lanes.give_back(serving.turn)
            serving.turn = None
        if serving.holds_place:
            serving.holds_place = False
            self._handlers.release()

    async def _serve(self, call: ss.HostCall, turn: Turn | None) -> None:
        serving = Serving(self, call.method, call.id, turn)
        CURRENT.set(serving)
        try:
            if turn is not None:
                await turn.go.wait()
            await self._handlers.acquire()
            serving.holds_place = True
            result, error = await self._decide(call)
            if serving.answered:  # answered as the handler first called the host
                self._too_late(serving, result, error)
                return
            serving.answered = True
            if result is NO_ANSWER:
                return
            try:
                line = (
                    self.session.answer_error(call.id, error)
                    if error is not None
                    else self.session.answer(call.id, result)
                )
            except Exception as exc:  # a result that is not JSON: -32603
                warn(f"{call.method} failed: {type(exc).__name__}: {exc}")
                line = self.session.answer_error(call.id, _internal(exc, call.method))
            try:
                await self._out_send.send(line)
            except trio.ClosedResourceError:
                pass
        finally:
            serving.answered = True
            self._free(serving)

    async def _decide(self, call: ss.HostCall) -> tuple[Any, RpcError | None]:
        """The handler's result for ``call`` (or :data:`NO_ANSWER`), or the error refusing it."""
        try:
            override = self._overrides.get(call.method)
            if override is not None:
                result = override(HostRequest(call.id, call.method, call.params, call.default))
                if inspect.isawaitable(result):
                    result = await result
                return result, None
            return await self._dispatch.host_call(self, call.method, call.params), None
        except RpcError as refusal:
            return None, refusal
        except Exception as exc:  # a handler's bug: -32603
            warn(f"{call.method} failed: {type(exc).__name__}: {exc}")
            return None, _internal(exc, call.method)

    def _too_late(self, serving: Serving, result: Any, error: RpcError | None) -> None:
        if error is None and result == serving.early:
            return
        decided = f"error {error}" if error is not None else f"result {result!r}"
        warn(
            f"{serving.method} was answered {serving.early!r} when its handler first called the "
            f"host; what the handler decided after that ({decided}) was not sent"
        )

    async def _notice(self, notice: ss.HostNotice, turn: Turn | None) -> None:
        serving = Serving(self, notice.method, None, turn)
        CURRENT.set(serving)
        try:
            if turn is not None:
                await turn.go.wait()
            await self._dispatch.host_notice(self, notice.method, notice.params)
        except Exception as exc:  # a handler's bug never ends the connection
            warn(f"{notice.method} failed: {type(exc).__name__}: {exc}")
        finally:
            serving.answered = True
            self._free(serving)
            self._notices -= 1

    def answer_on_first_call(self, result: Any) -> None:
        """Arm ``result`` as the answer to the host request the current task handles: it is
        written just before the first line this task (or a task it starts) sends to the host,
        unless the handler is done first. For a notice, that first send ends the notice's turn
        in its lane. Used for ``channels/publish`` (see :mod:`actors.serverkit.serving`)."""
        serving = CURRENT.get()
        if serving is not None and serving.owner is self and not serving.answered:
            serving.early = result

    def answered_early(self) -> bool:
        """Whether the host request the current task handles was already answered: its armed
        answer went out before one of the handler's calls (:meth:`answer_on_first_call`)."""
        serving = CURRENT.get()
        return serving is not None and serving.owner is self and serving.answered

    async def _answer_first(self) -> None:
        """Before one of our sends: write the answer armed for what this task handles."""
        serving = CURRENT.get()
        if (
            serving is None
            or serving.owner is not self
            or serving.answered
            or serving.early is UNSET
        ):
            return
        serving.answered = True
        try:
            if serving.id is not None:
                await self._out_send.send(self.session.answer(serving.id, serving.early))
        except (trio.ClosedResourceError, LocalProtocolError):
            pass  # the link ended: the send that follows says so
        finally:
            self._free(serving)

    def _chunk(self, params: Mapping[str, Any]) -> None:
        rid = params.get("requestId")
        waiter = self._waiters.get(rid) if isinstance(rid, int | str) else None
        if waiter is None or waiter.on_chunk is None:
            warn(f"inference/chunk for no streaming request: {rid!r}")
            return
        waiter.on_chunk(params)

    def _settle(self, rid: Id, *, result: Any = None, error: BaseException | None = None) -> None:
        waiter = self._waiters.pop(rid, None)
        if waiter is not None:
            waiter.result, waiter.error = result, error
            waiter.done.set()
            if waiter.on_settled is not None:
                waiter.on_settled(waiter)

    # -- sending ---------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        timeout: float | None = None,
        on_chunk: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> Any:
        """Send our request and return the host's result.

        Raises :class:`protocol.server_session.NotGranted` before writing anything when the
        host has not granted it, :class:`protocol.errors.RpcError` for the host's error,
        :class:`RequestTimeout` and :class:`LinkLost`.
        """
        self.session.check(method, params)
        if self.closed.is_set():
            raise LinkLost(f"{method}: the host connection is closed")
        await self._answer_first()
        wait = self.request_timeout if timeout is None else timeout
        async with self._slots:
            rid, line = self.session.request(
                method, params, now=trio.current_time(), timeout=math.inf
            )
            waiter = _Waiter(method, on_chunk)
            self._waiters[rid] = waiter
            try:
                await self._out_send.send(line)
                with trio.move_on_after(wait):
                    await waiter.done.wait()
            finally:
                if not waiter.done.is_set():
                    self._waiters.pop(rid, None)
                    self.session.forget(rid)
            if not waiter.done.is_set():
                raise RequestTimeout(f"{method}: no answer from the host within {wait:g} s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    async def start_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        check: bool = True,
        on_settled: Callable[[PendingRequest], None] | None = None,
    ) -> PendingRequest:
        """Send our request without waiting for its answer: return once its line is queued
        (after a free slot among the ``max_pending``, and room in the outbox).

        The request holds its slot until the host answers or the connection ends; there is no
        deadline unless :meth:`PendingRequest.wait` is given one. ``on_settled`` (sync) is
        called with the request as soon as it is settled, in the reader's task. With
        ``check=False`` the grant is not consulted (a test playing a server that sends what
        it was not granted); otherwise :class:`protocol.server_session.NotGranted` is raised
        before anything is written, and :class:`LinkLost` when the connection is closed.
        """
        if check:
            self.session.check(method, params)
        if self.closed.is_set():
            raise LinkLost(f"{method}: the host connection is closed")
        await self._answer_first()
        await self._slots.acquire()
        try:
            if check:  # again: the grant may have changed while we waited for the slot
                rid, line = self.session.request(
                    method, params, now=trio.current_time(), timeout=math.inf
                )
            else:
                rid, line = self.session.request_unchecked(
                    method, params, now=trio.current_time(), timeout=math.inf
                )
        except BaseException:
            self._slots.release()
            raise
        waiter = _Waiter(method)
        pending = PendingRequest(rid, method, waiter)

        def settled(_: _Waiter) -> None:
            self._slots.release()
            if on_settled is not None:
                on_settled(pending)

        waiter.on_settled = settled
        self._waiters[rid] = waiter
        try:
            await self._out_send.send(line)
        except BaseException:
            if not waiter.done.is_set():
                self._waiters.pop(rid, None)
                self.session.forget(rid)
                self._slots.release()
            raise
        return pending

    async def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        """Send our notification (refused like :meth:`request` when not granted)."""
        line = self.session.notify(method, params)
        await self.send_line(line)

    async def send_line(self, line: str) -> None:
        """Queue one ready-made line for the writer."""
        if self.closed.is_set():
            raise LinkLost("the host connection is closed")
        await self._answer_first()
        await self._out_send.send(line)


def _internal(exc: Exception, method: str) -> RpcError:
    return RpcError(code=INTERNAL_ERROR, message=f"{type(exc).__name__} in {method}")


def no_handler(method: str) -> RpcError:
    """The refusal of a method this server does not serve."""
    return method_not_found(method)
