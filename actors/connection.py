"""ConnectionActor: one per configured MCPL server.

It owns the transport, the protocol session, our pending requests, the grant, the declared
feature sets, the channels this server registered on the current link, and reconnection.

Tasks of one link: a reader that only decodes and dispatches; a dispatcher that takes the
server's requests from a bounded queue, hands the items of the hot lanes (``push/event``,
``channels/incoming``) to their channel actors and gives any other request a handler task (at
most ``MAX_HANDLERS``); a responder that answers the hot lanes once their writes are committed,
then wakes the agents; and a writer that owns the transport's send side, fed by a bounded outbox.
Between reader, dispatcher and responder, batch queues pass everything accumulated at once,
so under load the batches grow and per-batch costs are shared. When a queue is full its producer
waits: the reader stops reading, so a flooding server is slowed down by its own transport
(backpressure), nothing it sent is refused for being too many, and memory stays bounded. Replies
wait for room in the outbox the same way; no answer is ever dropped.

The actor's own mailbox serves ``Call``/``Status`` asks from agents and channels; a ``Call`` runs
in a child task, so a server that never answers stalls only the asker, and only until the request
deadline (after which a ``ping`` probe tells a slow server from a silent one).

Supervision: a link that ends (EOF, crash, silence, garbage that kills the transport, a failed
handshake) is reopened after an exponential backoff with jitter (5 s base, 5 min cap), with a
fresh handshake. Nothing that happens on a link escapes into the host.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import attrs
import outcome
import trio

from protocol import grants, mcpl
from protocol import jsonrpc as rpc
from protocol.coalesce import CoalesceInvalid, CoalesceSpec, parse_coalesce
from protocol.errors import (
    CAPABILITY_DENIED,
    CHANNEL_NOT_PERMITTED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNKNOWN_CHANNEL,
    RpcError,
)
from protocol.framing import Oversize, Undecodable
from protocol.inference import parse_inference_request
from protocol.lanes import (
    ChannelDescriptor,
    ChannelsChanged,
    IncomingMessage,
    PushEvent,
    parse_descriptors,
    parse_incoming,
    parse_incoming_batch,
    parse_push,
    structure,
)
from protocol.manifest import ManifestError, manifest_digest
from store import StoreError

from .coalescer import ADVERTISED
from .config import ServerConfig
from .context import ChannelLimit, HostContext
from .errors import NotConnected
from .kernel import Actor, BatchQueue, Reply, backoff_delay
from .messages import (
    Call,
    CancelCall,
    ChannelInfo,
    ConnStatus,
    Describe,
    IngestBatch,
    Notify,
    Prepared,
    Reconfigure,
    Register,
    Status,
    Unregister,
    Wake,
    Wakes,
)
from .transport import Transport, open_transport

log = logging.getLogger("mcplive.connection")

PRE_READY_CAP = 1000
OUTBOX_CAP = 1024
MAX_HANDLERS = 128
READ_BATCH = 256  # requests read together are queued together, up to this many
REQUEST_QUEUE_CAP = 1024  # requests read, waiting for the dispatcher (reader waits past it)
ANSWER_QUEUE_CAP = 1024  # prepared requests waiting for the responder (dispatcher waits past it)
TAKE_LIMIT = 1024  # the most a dispatcher or responder takes at once
# Every request the server may have in flight with us: the queues (each may overshoot its cap by
# one batch), the batch in each worker's hands, the handlers and the pre-readiness buffer.
INBOUND_CAP = REQUEST_QUEUE_CAP + ANSWER_QUEUE_CAP + 2 * READ_BATCH + 2 * TAKE_LIMIT
INBOUND_CAP += MAX_HANDLERS + PRE_READY_CAP
HOT_LANES = frozenset({"push/event", "channels/incoming"})
WRITE_BATCH = 256
MAX_TOOLS = 1000
MAX_KEYED_CALLS = 1024
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
HEALTHY_AFTER_S = 60.0
WS_PING_EVERY_S = 30.0
PROBE_TIMEOUT_S = 10.0
MANIFEST_FETCHES = 5  # at most this many mcpl/manifest fetches per window; the excess is dropped
MANIFEST_WINDOW_S = 60.0
_REVISION = re.compile(r"sha256:[A-Za-z0-9_-]{43}")
_DOMAINS = frozenset({"capabilities", "featureSets", "tagOntology"})


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RequestTimeout(TimeoutError):
    pass


#: What the transcript says of an item: (kind, channel id, message id or event id, author).
#: Only strings (and None), so the cycle collector stops tracking it at its first pass.
Trace = tuple[str, str | None, str, str | None]


class Pending:
    """A hot-lane request whose items were handed to the store: its id and method, (prepared
    item, trace fields), what was refused item by item, and the error that answers the whole
    request, if any. The request itself (its decoded params) is not kept past conversion."""

    __slots__ = ("error", "id", "items", "method", "push", "refused")

    def __init__(self, req: rpc.Request) -> None:
        self.id = req.id
        self.method = req.method
        self.push = req.method == "push/event"
        self.items: list[tuple[Prepared, Trace]] = []
        self.refused: list[dict[str, Any]] | None = None  # made by the first refusal
        self.error: RpcError | None = None

    def refuse(self, message_id: Any, reason: str) -> None:
        """One message of a ``channels/incoming`` request is refused."""
        if self.refused is None:
            self.refused = []
        self.refused.append({"messageId": message_id, "accepted": False, "reason": reason})


@attrs.define
class Link:
    """One live transport and everything that dies with it."""

    transport: Transport
    session: rpc.RpcSession
    outbox_send: trio.MemorySendChannel[list[str]]
    outbox_recv: trio.MemoryReceiveChannel[list[str]]
    requests: BatchQueue[rpc.Request]
    answers: BatchQueue[Pending]
    waiters: dict[rpc.Id, trio.MemorySendChannel[outcome.Outcome[Any]]] = attrs.field(factory=dict)
    ready: bool = False
    mcp_only: bool = False
    grant: frozenset[str] = frozenset()
    feature_sets: Mapping[str, mcpl.FeatureSet] = attrs.field(factory=dict)
    enabled_sets: frozenset[str] = frozenset()
    policy: dict[str, Any] = attrs.field(factory=dict)  # what the handshake decided, for reports
    # manifest changes (SPEC §17): the manifest in force, the MCP capabilities it came with,
    # fetches in the rate window, and whether a fetch is running or another one is wanted
    manifest: Mapping[str, Any] = attrs.field(factory=dict)
    mcp_caps: Mapping[str, Any] = attrs.field(factory=dict)
    fetches: deque[float] = attrs.field(factory=lambda: deque(maxlen=MANIFEST_FETCHES))
    fetching: bool = False
    refetch: bool = False
    tools: tuple[Mapping[str, Any], ...] = ()
    channels: set[str] = attrs.field(factory=set)
    pre_ready: deque[rpc.Request] = attrs.field(factory=lambda: deque())
    closed: trio.Event = attrs.field(factory=trio.Event)
    probing: bool = False
    nursery: trio.Nursery | None = None
    hooks_in_flight: int = 0  # our context/beforeInference calls awaiting this server
    # keyed calls that a CancelCall may stop: only hooks are keyed, one per agent's running
    # turn, so this holds at most one entry per agent; MAX_KEYED_CALLS still caps it (past it,
    # a call runs to its deadline instead of being cancellable)
    calls: dict[str, trio.CancelScope] = attrs.field(factory=dict)


class ConnectionActor(Actor):
    mailbox_size = 64

    def __init__(self, cfg: ServerConfig, ctx: HostContext) -> None:
        super().__init__(f"connection:{cfg.id}", ctx.work)
        self.cfg = cfg
        self.ctx = ctx
        self.sid = cfg.id
        self.link: Link | None = None
        self._policy: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self.connects = 0
        try:
            self.version = metadata.version("mcplive")
        except metadata.PackageNotFoundError:
            self.version = "0"

    # -- tracing ----------------------------------------------------------------------------
    def _trace(self, kind: str, channel_id: str | None = None, **data: Any) -> None:
        self.ctx.trace.emit(kind, server_id=self.sid, channel_id=channel_id, data=data)

    def diagnostic(self, text: str) -> None:
        self._trace("diagnostic", text=text)

    # -- mailbox ----------------------------------------------------------------------------
    async def on_start(self) -> None:
        self.spawn(self._supervise, counted=False)

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Status):
            reply.value(self.status())
        elif isinstance(msg, Call):
            link = self.link
            if link is None or not link.ready:
                reply.error(NotConnected(f"server {self.sid} is not connected"))
                return
            scope = trio.CancelScope()
            if msg.key is not None and len(link.calls) < MAX_KEYED_CALLS:
                link.calls[msg.key] = scope  # before the task starts, so no cancel is missed
            self.spawn(self._do_call, link, msg, reply, scope)
        elif isinstance(msg, CancelCall):
            link = self.link
            cancelled = link.calls.pop(msg.key, None) if link is not None else None
            if cancelled is not None:
                cancelled.cancel()
            reply.value(cancelled is not None)
        elif isinstance(msg, Notify):
            self._notify_nowait(msg)
            reply.value(None)
        elif isinstance(msg, Reconfigure):
            self._reconfigure(msg.cfg, reply)
        else:
            raise TypeError(f"unexpected message {msg!r}")

    def _reconfigure(self, cfg: ServerConfig, reply: Reply) -> None:
        """A config reload changed this server's masks. A ready link gets them at once, the way
        a manifest change is applied (host-first revocation, then ``featureSets/update``), but
        additions are granted too: the operator asked for them. A link whose handshake already
        negotiated under the old masks is reopened; otherwise the next handshake uses them.
        The answer is the grant in force afterwards, or None when the server is not ready."""
        self.cfg = cfg
        link = self.link
        if link is not None and not link.ready and not link.mcp_only and link.manifest:
            link.closed.set()  # negotiated under the old masks: reconnect to negotiate anew
        if link is None or link.mcp_only or not link.ready:
            reply.value(None)
        else:
            self.spawn(self._reapply, link, reply)

    async def _reapply(self, link: Link, reply: Reply) -> None:
        try:
            await self._apply_manifest(link, link.manifest, by_operator=True)
        except NotConnected:
            pass
        reply.value(sorted(link.grant) if self.link is link and link.ready else None)

    def _notify_nowait(self, msg: Notify) -> None:
        """A best-effort notification: sent on a ready link if the outbox has room, dropped
        with a diagnostic otherwise (it never waits, so ``Notify`` order is kept)."""
        link = self.link
        if link is None or not link.ready or link.mcp_only:
            return
        try:
            link.outbox_send.send_nowait([link.session.send_notification(msg.method, msg.params)])
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.diagnostic(f"{msg.method} not sent: the link to the server is full or closing")

    def _publish_status(self) -> None:
        """Replace this server's published snapshot (read by agents' turns without an ask)."""
        self.ctx.statuses[self.sid] = self.status()

    def status(self) -> ConnStatus:
        link = self.link
        if link is not None and link.ready and not link.mcp_only:
            self._policy = (link.grant, frozenset(link.enabled_sets))
        return ConnStatus(
            server_id=self.sid,
            connected=link is not None,
            ready=bool(link and link.ready),
            mcp_only=bool(link and link.mcp_only),
            grant=link.grant if link else frozenset(),
            tools=link.tools if link else (),
            channels=tuple(sorted(link.channels)) if link else (),
            feature_sets={
                name: fs.raw for name, fs in link.feature_sets.items() if name in link.enabled_sets
            }
            if link
            else {},
            policy_grant=self._policy[0],
            policy_feature_sets=self._policy[1],
        )

    async def _do_call(self, link: Link, msg: Call, reply: Reply, scope: trio.CancelScope) -> None:
        link.hooks_in_flight += msg.hook
        try:
            with scope:
                result = await self.request(link, msg.method, dict(msg.params), timeout=msg.timeout)
            if scope.cancelled_caught:
                reply.error(RpcError(code=INTERNAL_ERROR, message=f"{msg.method} cancelled"))
                return
        except RpcError as exc:
            if msg.notify_fallback and exc.code == METHOD_NOT_FOUND:
                await self.notify(link, msg.method, dict(msg.params))
                reply.value({"outcome": "unknown"})
                return
            reply.error(exc)
        except Exception as exc:
            reply.error(exc)
        else:
            reply.value(result)
        finally:
            link.hooks_in_flight -= msg.hook
            if msg.key is not None and link.calls.get(msg.key) is scope:
                del link.calls[msg.key]

    # -- requests of ours -------------------------------------------------------------------
    async def request(
        self, link: Link, method: str, params: Any, timeout: float | None = None
    ) -> Any:
        t = timeout if timeout is not None else self.cfg.request_timeout_s
        try:
            rid, line = link.session.send_request(
                method, params, now=trio.current_time(), timeout=t
            )
        except rpc.PendingFull as exc:
            raise RpcError(
                code=INTERNAL_ERROR, message=f"too many pending requests: {exc}"
            ) from None
        except rpc.LocalProtocolError:
            raise NotConnected(f"server {self.sid} is not connected") from None
        send, recv = trio.open_memory_channel[outcome.Outcome[Any]](1)
        link.waiters[rid] = send
        try:
            with trio.fail_after(t):
                await link.outbox_send.send([line])
                result = await recv.receive()
        except trio.TooSlowError:
            self._trace("request-timeout", method=method, timeout_s=t)
            if link.ready and not link.probing and method != "ping":
                link.probing = True
                assert link.nursery is not None
                link.nursery.start_soon(self._probe, link)
            raise RequestTimeout(f"{self.sid}: {method} got no answer in {t:g}s") from None
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            raise NotConnected(f"server {self.sid} disconnected during {method}") from None
        except trio.Cancelled:
            self._cancelled(link, rid, "the host no longer needs the answer")
            raise
        finally:
            link.waiters.pop(rid, None)
            link.session.cancel(rid)
            recv.close()
        return result.unwrap()

    def _cancelled(self, link: Link, rid: rpc.Id, reason: str) -> None:
        """Tell the server (MCP ``notifications/cancelled``) that an answer is not awaited any
        more; never waits, so it works inside a cancelled scope."""
        if not link.ready or link.mcp_only:
            return
        try:
            line = link.session.send_notification(
                "notifications/cancelled", {"requestId": rid, "reason": reason}
            )
            link.outbox_send.send_nowait([line])
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except rpc.LocalProtocolError:
            pass

    async def _probe(self, link: Link) -> None:
        """After a request timed out: is the server still there? Any answer to ``ping`` (an
        error too) means yes; silence means the link is dead and is reopened."""
        try:
            await self.request(
                link, "ping", None, timeout=min(PROBE_TIMEOUT_S, self.cfg.request_timeout_s)
            )
        except RpcError:
            pass  # it answered
        except RequestTimeout:
            self.diagnostic("server silent (no answer to ping); closing the link to reconnect")
            link.closed.set()
        except NotConnected:
            pass
        finally:
            link.probing = False

    async def notify(self, link: Link, method: str, params: Any) -> None:
        try:
            await link.outbox_send.send([link.session.send_notification(method, params)])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise NotConnected(f"server {self.sid} is not connected") from None

    # -- supervision ------------------------------------------------------------------------
    async def _supervise(self) -> None:
        attempt = 0
        while not self.ctx.closing:
            started = trio.current_time()
            try:
                reason = await self._run_link()
            except Exception as exc:
                reason = _describe(exc)
            finally:
                self.link = None
                self._publish_status()
            if trio.current_time() - started >= HEALTHY_AFTER_S:
                attempt = 0
            attempt += 1
            delay = backoff_delay(attempt, BACKOFF_BASE_S, BACKOFF_CAP_S, self.ctx.rng)
            self._trace("disconnected", reason=reason, retry_in_s=round(delay, 1), attempt=attempt)
            await trio.sleep(delay)

    def _on_stderr(self, line: str) -> None:
        self._trace("server-log", line=line[:2000])

    async def _run_link(self) -> str:
        self.connects += 1
        async with open_transport(self.cfg, self._on_stderr) as transport:
            out_send, out_recv = trio.open_memory_channel[list[str]](OUTBOX_CAP)
            link = Link(
                transport=transport,
                session=rpc.RpcSession(
                    max_pending=256,
                    max_inbound=INBOUND_CAP,
                ),
                outbox_send=out_send,
                outbox_recv=out_recv,
                requests=BatchQueue(REQUEST_QUEUE_CAP),
                answers=BatchQueue(ANSWER_QUEUE_CAP),
            )
            self.link = link
            self._trace("connecting", transport=transport.description, attempt=self.connects)
            async with trio.open_nursery() as nursery:
                link.nursery = nursery
                nursery.start_soon(self._writer, link)
                nursery.start_soon(self._reader, link)
                nursery.start_soon(self._dispatcher, link)
                nursery.start_soon(self._responder, link)
                if self.cfg.url is not None:
                    nursery.start_soon(self._pinger, transport)
                # The handshake is work in flight (connecting or waiting to reconnect is not).
                self.work.inc()
                try:
                    await self._handshake(link)
                finally:
                    self.work.dec()
                await link.closed.wait()
                nursery.cancel_scope.cancel()
            return "server closed the connection"

    async def _pinger(self, transport: Transport) -> None:
        ws = getattr(transport, "ws", None)
        while ws is not None:
            await trio.sleep(WS_PING_EVERY_S)
            with trio.move_on_after(2 * WS_PING_EVERY_S) as scope:
                await ws.ping()
            if scope.cancelled_caught:
                self.diagnostic("no pong in 60 s; closing the link")
                await ws.aclose()
                return

    async def _writer(self, link: Link) -> None:
        async for lines in link.outbox_recv:
            while len(lines) < WRITE_BATCH:  # whatever else is waiting goes in the same write
                try:
                    lines = lines + link.outbox_recv.receive_nowait()
                except trio.WouldBlock:
                    break
            try:
                await link.transport.send_many(lines)
            except Exception as exc:  # the link is gone; the reader sees EOF
                self.diagnostic(f"write failed: {_describe(exc)}")
                link.closed.set()
                return

    async def _reader(self, link: Link) -> None:
        """Decode what the server sends. Requests are passed on in batches: every request
        already read is queued together before the reader waits for more input."""
        batch: list[rpc.Request] = []
        try:
            while True:
                first = await link.transport.receive()
                if first is None:
                    return
                # what the transport has already framed is handled without waiting again
                for item in [first, *link.transport.take_buffered()]:
                    if isinstance(item, Oversize):
                        size = "a frame" if item.size < 0 else f"{item.size} bytes"
                        self.diagnostic(
                            f"line over max_line_bytes ({self.cfg.max_line_bytes}) refused: {size}"
                        )
                        if item.size < 0:
                            return
                        continue
                    if isinstance(item, Undecodable):
                        self.diagnostic(f"undecodable line ({item.size} bytes) skipped")
                        continue
                    for event in link.session.receive_line(item):
                        if isinstance(event, rpc.RequestReceived) and link.ready:
                            self.work.inc()  # released once the request is answered
                            batch.append(event.request)
                        else:
                            await self._dispatch_event(link, event)
                    if len(batch) >= READ_BATCH:
                        await self._queue_requests(link, batch)
                        batch = []
                if batch:  # nothing more is buffered: what was read goes on together
                    await self._queue_requests(link, batch)
                    batch = []
        except Exception as exc:
            self.diagnostic(f"read failed: {_describe(exc)}")
        finally:
            self.work.dec(len(batch))  # read but never queued: the link is gone
            for rid, waiter in list(link.waiters.items()):
                waiter.close()
                link.waiters.pop(rid, None)
            link.session.close()
            link.closed.set()

    async def _send(self, link: Link, line: str) -> None:
        await self._send_lines(link, [line])

    async def _send_lines(self, link: Link, lines: list[str]) -> None:
        if not lines:
            return
        try:
            await link.outbox_send.send(lines)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _dispatcher(self, link: Link) -> None:
        """Take queued requests in order. Items of the hot lanes are handed to their channels
        here, one ask per channel per batch, and answered by the responder after their commit;
        any other request gets a handler task, at most ``MAX_HANDLERS`` at a time."""
        slots = trio.Semaphore(MAX_HANDLERS)
        assert link.nursery is not None
        while True:
            batch = await link.requests.take(TAKE_LIMIT)
            hot = []
            for req in batch:
                if req.method in HOT_LANES:
                    hot.append(req)
                else:
                    await slots.acquire()
                    link.nursery.start_soon(self._serve, link, req, slots)
            batch.clear()
            if hot:  # _prepare empties hot once the requests are parsed
                await link.answers.put_many(await self._prepare(link, hot))

    async def _dispatch_event(self, link: Link, event: rpc.Event) -> None:
        if isinstance(event, rpc.ResponseReceived):
            self._resolve(link, event.id, outcome.Value(event.result))
        elif isinstance(event, rpc.ErrorReceived):
            self._resolve(link, event.id, outcome.Error(event.error))
        elif isinstance(event, rpc.RequestReceived):
            req = event.request
            if not link.ready:
                if len(link.pre_ready) >= PRE_READY_CAP:
                    cap = grants.INBOUND_CAPABILITY.get(req.method)
                    err = RpcError(
                        code=CAPABILITY_DENIED,
                        message="connection not ready; retry later",
                        data={"capability": cap} if cap else None,
                    )
                    await self._reply(link, req.id, error=err)
                    self.diagnostic(f"pre-readiness buffer full; {req.method} refused")
                else:
                    link.pre_ready.append(req)
                return
            self.work.inc()
            await self._queue_requests(link, [req])
        elif isinstance(event, rpc.NotificationReceived):
            self._on_notification(link, event.notification)
        elif isinstance(event, rpc.Diagnostic):
            self.diagnostic(event.text)
            if event.reply is not None:
                await self._send(link, event.reply)

    def _resolve(self, link: Link, rid: rpc.Id, result: outcome.Outcome[Any]) -> None:
        waiter = link.waiters.get(rid)
        if waiter is not None:
            try:
                waiter.send_nowait(result)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _queue_requests(self, link: Link, batch: list[rpc.Request]) -> None:
        try:
            await link.requests.put_many(batch)
        except BaseException:
            self.work.dec(len(batch))
            raise

    # -- handshake --------------------------------------------------------------------------
    async def _handshake(self, link: Link) -> None:
        init = await self.request(link, "initialize", mcpl.initialize_params(self.version))
        # notifications/initialized is always the very next message we send.
        await self.notify(link, "notifications/initialized", None)
        caps = init.get("capabilities") if isinstance(init, Mapping) else None
        caps = caps if isinstance(caps, Mapping) else {}
        experimental = caps.get("experimental")
        manifest = experimental.get("mcpl") if isinstance(experimental, Mapping) else None
        info = init.get("serverInfo") if isinstance(init, Mapping) else None
        if isinstance(manifest, Mapping):
            await self._negotiate(link, manifest, caps)
        else:
            link.mcp_only = True
            self._trace("mcp-only", reason="the server sent no experimental.mcpl")
        # An MCP-only server keeps its tools; an MCPL server's tools need the ``tools`` grant.
        if caps.get("tools") is not None and (link.mcp_only or "tools" in link.grant):
            await self._list_tools(link)
        # What waited for readiness goes first, in arrival order; the reader keeps buffering
        # until the buffer is empty and the link is marked ready in the same step.
        while link.pre_ready:
            waiting = list(link.pre_ready)
            link.pre_ready.clear()
            self.work.inc(len(waiting))
            for i in range(0, len(waiting), READ_BATCH):
                await self._queue_requests(link, waiting[i : i + READ_BATCH])
        link.ready = True
        self._publish_status()
        self._trace(
            "ready",
            mcp_only=link.mcp_only,
            grant=sorted(link.grant),
            feature_sets=sorted(link.enabled_sets),
            policy=link.policy,
            tools=[t.get("name") for t in link.tools],
            server_info=dict(info) if isinstance(info, Mapping) else {},
        )

    async def _negotiate(
        self, link: Link, manifest: Mapping[str, Any], caps: Mapping[str, Any]
    ) -> None:
        advertised = mcpl.advertised_paths(manifest, caps)
        declared = mcpl.declared_feature_sets(manifest)
        for note in declared.diagnostics:
            self.diagnostic(note)
        grant = self.cfg.grant_for(advertised)
        state = self.cfg.feature_sets_for(declared.sets, grant)
        params = grants.update_params(grant, state)
        link.manifest = manifest
        link.mcp_caps = caps
        link.feature_sets = declared.sets
        link.policy = policy_report(advertised, grant, state)
        try:
            result = await self.request(link, "featureSets/update", params)
        except RpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                await self.notify(link, "featureSets/update", params)
                self.diagnostic(
                    "featureSets/update request refused (-32601); sent the notification form"
                )
                receipt = mcpl.Receipt(ready=True)
            else:
                receipt = mcpl.Receipt(
                    ready=True, mcp_only=True, note=f"featureSets/update failed: {exc}"
                )
        except RequestTimeout:
            receipt = mcpl.Receipt(
                ready=True, mcp_only=True, note="featureSets/update never answered"
            )
        else:
            receipt = mcpl.read_receipt(result)
        if receipt.note:
            self.diagnostic(receipt.note)
        if receipt.close:
            link.closed.set()
            raise NotConnected(receipt.note)
        if receipt.mcp_only:
            link.mcp_only = True
            self._trace("mcp-only", reason=receipt.note)
            return
        # The grant is empty until the receipt: only now does the policy come into force.
        link.grant = grant
        link.enabled_sets = state.enabled
        for status in state.statuses.values():
            if not status.enabled:
                self.diagnostic(f"feature set {status.name} not enabled: {status.reason}")

    async def _list_tools(self, link: Link) -> None:
        tools: list[Mapping[str, Any]] = []
        cursor: Any = None
        for _ in range(20):
            try:
                result = await self.request(
                    link, "tools/list", {"cursor": cursor} if cursor else {}
                )
            except (RpcError, RequestTimeout) as exc:
                self.diagnostic(f"tools/list failed: {exc}")
                break
            page = result.get("tools") if isinstance(result, Mapping) else None
            for tool in page if isinstance(page, list) else []:
                if (
                    isinstance(tool, Mapping)
                    and isinstance(tool.get("name"), str)
                    and len(tools) < MAX_TOOLS
                ):
                    tools.append(tool)
            cursor = result.get("nextCursor") if isinstance(result, Mapping) else None
            if not cursor:
                break
        link.tools = tuple(tools)
        self._publish_status()

    # -- notifications ----------------------------------------------------------------------
    def _on_notification(self, link: Link, note: rpc.Notification) -> None:
        method = note.method
        if method == "notifications/tools/list_changed":
            if link.ready and link.nursery is not None:
                link.nursery.start_soon(self._list_tools, link)
        elif method == "mcpl/manifestChanged":
            self._on_manifest_changed(link, note.params)
        elif method == "channels/changed":
            if not self._admitted(link, method):
                self.diagnostic("channels/changed dropped: channels.register not granted")
                return
            assert link.nursery is not None
            self.work.inc()
            link.nursery.start_soon(self._changed_note, link, note.params)
        elif method.startswith("notifications/"):
            pass  # MCP housekeeping (progress, logging, …) is tolerated and ignored
        else:
            self.diagnostic(f"notification {method} ignored")

    # -- manifest changes (SPEC §17) ----------------------------------------------------------
    def _on_manifest_changed(self, link: Link, params: Any) -> None:
        """An announcement only: fetch the manifest (rate-limited) and diff it ourselves."""
        if not (
            isinstance(params, Mapping)
            and set(params) == {"revision", "domains"}
            and isinstance(params["revision"], str)
            and _REVISION.fullmatch(params["revision"])
            and isinstance(params["domains"], list)
            and params["domains"]
            and all(d in _DOMAINS for d in params["domains"])
        ):
            self.diagnostic("malformed mcpl/manifestChanged ignored")
            return
        if link.mcp_only or not link.ready:
            self.diagnostic("mcpl/manifestChanged before the policy is in force; ignored")
            return
        if link.fetching:
            link.refetch = True  # coalesced into one more fetch after the running one
            return
        if not self._may_fetch(link):
            return
        link.fetching = True
        assert link.nursery is not None
        self.work.inc()
        link.nursery.start_soon(self._refresh_manifest, link)

    def _may_fetch(self, link: Link) -> bool:
        now = trio.current_time()
        if len(link.fetches) == MANIFEST_FETCHES and now - link.fetches[0] < MANIFEST_WINDOW_S:
            self.diagnostic(
                f"mcpl/manifestChanged more than {MANIFEST_FETCHES} times in "
                f"{MANIFEST_WINDOW_S:g}s: dropped (a server defect)"
            )
            return False
        link.fetches.append(now)
        return True

    async def _refresh_manifest(self, link: Link) -> None:
        try:
            while True:
                try:
                    fetched = await self.request(link, "mcpl/manifest", {})
                except (RpcError, RequestTimeout) as exc:
                    self.diagnostic(
                        f"the server announced a manifest change, but mcpl/manifest failed: {exc}"
                    )
                    return
                if isinstance(fetched, Mapping):
                    await self._apply_manifest(link, fetched)
                else:
                    self.diagnostic(
                        "mcpl/manifest did not answer an object; the manifest in force stays"
                    )
                if not link.refetch or not self._may_fetch(link):
                    return
                link.refetch = False
        except NotConnected:
            pass
        finally:
            link.fetching = False
            link.refetch = False
            self.work.dec()

    async def _apply_manifest(
        self, link: Link, manifest: Mapping[str, Any], *, by_operator: bool = False
    ) -> None:
        """Diff a fetched manifest against the one in force and apply it (SPEC §6.7, §17).

        Removals are revoked at once, host-first, before the update is sent. Additions are never
        granted on the server's word: only an explicit ``enabled_capabilities`` pattern can grant
        them, and then only once the receipt arrives; otherwise they wait for the operator (a
        config reload, ``by_operator``, grants them).
        """
        cfg = self.cfg
        before_grant, before_sets = link.grant, link.enabled_sets
        advertised = mcpl.advertised_paths(manifest, link.mcp_caps)
        declared = mcpl.declared_feature_sets(manifest)
        for note in declared.diagnostics:
            self.diagnostic(note)
        wanted = cfg.grant_for(advertised)
        added = wanted - before_grant
        pending = added if cfg.enabled_capabilities is None and not by_operator else frozenset()
        target = wanted - pending
        reduced = before_grant & target
        # host-first: what the server no longer offers (or policy no longer allows) is gone now
        link.grant = reduced
        link.manifest = manifest
        link.feature_sets = declared.sets
        link.enabled_sets = cfg.feature_sets_for(declared.sets, reduced).enabled
        state = cfg.feature_sets_for(declared.sets, target)
        params = grants.update_params(target, state)
        accepted = False
        try:
            receipt = mcpl.read_receipt(await self.request(link, "featureSets/update", params))
            accepted = receipt.ready and not receipt.mcp_only
            if receipt.close:
                link.closed.set()
        except RpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                await self.notify(link, "featureSets/update", params)
                accepted = True
            else:
                self.diagnostic(f"featureSets/update after a manifest change failed: {exc}")
        except RequestTimeout:
            self.diagnostic("featureSets/update after a manifest change got no receipt")
        if accepted:  # expansions activate only with the receipt
            link.grant = target
            link.enabled_sets = state.enabled
        impacts = manifest_impacts(
            before_grant,
            link.grant,
            pending,
            added - pending,
            before_sets,
            link.enabled_sets,
            accepted,
        )
        try:
            digest = manifest_digest(manifest)
        except ManifestError as exc:
            digest = f"refused ({exc.code})"
        link.policy = policy_report(advertised, link.grant, state)
        self._publish_status()
        self._trace("manifest-changed", digest=digest, impacts=impacts, grant=sorted(link.grant))

    async def _changed_note(self, link: Link, params: Any) -> None:
        try:
            result = await self._channels_changed(link, params)
            refused = [r for r in result["results"] if not r.get("accepted")]
            if refused:
                self.diagnostic(f"channels/changed notification: refused {refused}")
        except RpcError as exc:
            self.diagnostic(f"channels/changed notification refused: {exc}")
        finally:
            self.work.dec()

    # -- inbound requests -------------------------------------------------------------------
    def _admitted(self, link: Link, method: str) -> bool:
        try:
            self._admit(link, method)
        except RpcError:
            return False
        return True

    async def _serve(self, link: Link, req: rpc.Request, slots: trio.Semaphore) -> None:
        try:
            try:
                result = await self._answer(link, req)
            except Exception as exc:
                await self._reply(link, req.id, error=_as_rpc_error(exc, req.method))
            else:
                await self._reply(link, req.id, result=result)
        finally:
            slots.release()
            self.work.dec()

    async def _reply(
        self, link: Link, rid: rpc.Id, *, result: Any = None, error: RpcError | None = None
    ) -> None:
        """Answer one of the server's requests; a link that already ended takes no answer."""
        try:
            if error is not None:
                line = link.session.send_error(rid, error)
            else:
                line = link.session.send_response(rid, result)
        except rpc.LocalProtocolError:
            return  # the session closed while we worked: the server will retry on a new link
        await self._send(link, line)

    def _admit(self, link: Link, method: str, feature_set: Any = None) -> None:
        """The one admission point for the server's MCPL calls: raises the refusal."""
        if link.mcp_only and method not in grants.REMOVED_METHODS:
            raise RpcError(
                code=METHOD_NOT_FOUND, message=f"{method}: this connection runs MCP-only"
            )
        grants.admit(
            method,
            link.grant,
            feature_set,
            declared=link.feature_sets,
            enabled=link.enabled_sets,
        )

    async def _answer(self, link: Link, req: rpc.Request) -> Any:
        method = req.method
        if method == "ping":
            return {}
        params = req.params if isinstance(req.params, Mapping) else {}
        self._admit(link, method, params.get("featureSet"))
        if method == "channels/register":
            return await self._register(link, req.params)
        if method == "channels/changed":
            return await self._channels_changed(link, req.params)
        if method == "channels/list":
            return await self._list_channels(link)
        if method == "model/info":
            info = self.ctx.inference.model_info(self.sid)
            if info is None:
                raise RpcError(code=INTERNAL_ERROR, message="no model serves this server")
            return info.to_wire()
        if method == "inference/request":
            return await self._inference(link, req)
        raise rpc.method_not_found(method)

    async def _inference(self, link: Link, req: rpc.Request) -> Any:
        """A server-initiated inference (admitted by ``_answer``): never while one of our hooks
        or renders awaits this server, within its budget, streamed when asked and granted."""
        if link.hooks_in_flight:
            raise RpcError(
                code=INVALID_REQUEST,
                message="inference/request refused: a context/beforeInference or push/render "
                "call to this server is in flight, and neither may start inference",
            )
        request = parse_inference_request(req.params)
        streamed = request.stream and "inferenceRequest.streaming" in link.grant

        async def chunk(method: str, params: Mapping[str, object]) -> None:
            await self.notify(link, method, params)

        result, model = await self.ctx.inference.answer(
            self.sid,
            req.id,
            request,
            now=trio.current_time(),
            chunks=chunk if streamed else None,
        )
        self._trace(
            "inference-request",
            feature_set=request.feature_set,
            model=model,
            streamed=streamed,
            finish_reason=result["finishReason"],
            usage=result["usage"],
        )
        return result

    # push/event and channels/incoming: the hot lanes ------------------------------------
    async def _prepare(self, link: Link, requests: list[rpc.Request]) -> list[Pending]:
        """Admit and convert a batch of hot-lane requests, then hand their items to their
        channels: one ask per channel, items in arrival order. The answers wait for the commit.

        ``requests`` is emptied once they are parsed: their decoded params are not kept alive
        while the channels convert and the writes commit."""
        accepted_at = utc_now()  # one timestamp for what was read together
        out = [Pending(req) for req in requests]
        groups: dict[str | None, list[tuple[Pending, Any, Any, Trace]]] = {}
        admitted: set[tuple[str, str | None]] = set()  # the link does not change meanwhile
        for req, pending in zip(requests, out, strict=True):
            try:
                params = req.params
                if type(params) is not dict and not isinstance(params, Mapping):
                    params = {}
                feature_set = params.get("featureSet")
                if not (feature_set is None or type(feature_set) is str):
                    self._admit(link, req.method, feature_set)
                elif (req.method, feature_set) not in admitted:
                    self._admit(link, req.method, feature_set)
                    admitted.add((req.method, feature_set))
                parsed: Sequence[tuple[str | None, Any, Any, Trace]]
                if pending.push:
                    parsed = [self._parse_push(link, req.params)]
                else:
                    parsed = self._parse_incoming(link, req.params, pending)
                for channel_id, item, spec, trace in parsed:
                    groups.setdefault(channel_id, []).append((pending, item, spec, trace))
            except Exception as exc:
                pending.error = _as_rpc_error(exc, req.method)
        requests.clear()
        timeout = self.cfg.request_timeout_s
        for cid, entries in groups.items():
            try:
                chan = await self.ctx.channel(self.sid, cid)
                results = await chan.ask(
                    IngestBatch(
                        items=tuple([item for _, item, _, _ in entries]),
                        specs=tuple([spec for _, _, spec, _ in entries]),
                        accepted_at=accepted_at,
                    ),
                    timeout=timeout,
                )
            except Exception as exc:
                results = [_as_rpc_error(exc, "ingest")] * len(entries)
            for (pending, _, _, trace), result in zip(entries, results, strict=True):
                if isinstance(result, Prepared):
                    pending.items.append((result, trace))
                elif pending.push:
                    pending.error = result
                else:
                    pending.refuse(
                        trace[2], result.message if isinstance(result, RpcError) else str(result)
                    )
        return out

    def _parse_push(
        self, link: Link, params: Any
    ) -> tuple[str | None, PushEvent, CoalesceSpec | None, Trace]:
        event = parse_push(params)  # admission already checked its feature set
        scoped = None
        claimed = (event.origin or {}).get("mcplChannelId")
        if isinstance(claimed, str) and claimed in link.channels:
            scoped = claimed
        spec = None
        if event.coalesce is not None:
            spec = self._coalesce_spec(link, event)
            if spec.channel_id is not None:
                scoped = spec.channel_id  # channel scope is only ever named, never inferred
        return scoped, event, spec, ("push", scoped, event.event_id, None)

    def _coalesce_spec(self, link: Link, event: PushEvent) -> CoalesceSpec:
        """A push's valid ``coalesce`` member (RFC-006), or the error refusing the push; a
        channel-scoped one must name a channel this server registered, with
        ``channels.incoming`` granted."""
        parsed = parse_coalesce(
            event.coalesce, lane="push", advertised=ADVERTISED, event_id=event.event_id
        )
        if isinstance(parsed, CoalesceInvalid):
            raise RpcError(
                code=INVALID_PARAMS,
                message=f"Invalid params: {parsed.field}: {parsed.reason}",
                data=parsed.error_data(),
            )
        cid = parsed.channel_id
        if cid is not None and cid not in link.channels:
            raise RpcError(code=UNKNOWN_CHANNEL, message="Unknown channel", data={"channelId": cid})
        if cid is not None and "channels.incoming" not in link.grant:
            raise RpcError(
                code=CHANNEL_NOT_PERMITTED,
                message="channels.incoming is not granted",
                data={"channelId": cid},
            )
        return parsed

    def _parse_incoming(
        self, link: Link, params: Any, pending: Pending
    ) -> list[tuple[str, IncomingMessage, CoalesceSpec | None, Trace]]:
        items = []
        for raw in parse_incoming_batch(params):
            try:
                msg = parse_incoming(raw)
            except RpcError as exc:
                pending.refuse(
                    raw.get("messageId") if isinstance(raw, Mapping) else None, exc.message
                )
                continue
            spec = None
            if msg.coalesce is not None:
                parsed = parse_coalesce(
                    msg.coalesce, lane="incoming", advertised=ADVERTISED, event_id=msg.event_id
                )
                if isinstance(parsed, CoalesceInvalid):
                    self.diagnostic(
                        f"incoming message {msg.message_id}: {parsed.field} {parsed.reason}"
                    )
                    pending.refuse(msg.message_id, "coalesce_invalid")
                    continue
                spec = parsed
            if msg.channel_id not in link.channels:
                self.diagnostic(
                    f"incoming message {msg.message_id} for unregistered channel "
                    f"{msg.channel_id!r} refused"
                )
                pending.refuse(msg.message_id, "unknown_channel")
                continue
            author = msg.author.name or msg.author.id
            trace: Trace = ("incoming", msg.channel_id, msg.message_id, author)
            items.append((msg.channel_id, msg, spec, trace))
        return items

    async def _responder(self, link: Link) -> None:
        """Answer the hot lanes in commit order (the store commits FIFO), a batch per write,
        then trace and wake: one wake per agent per batch, naming the newest conversation."""
        while True:
            answers = await link.answers.take(TAKE_LIMIT)
            try:
                lines: list[str] = []
                done: list[tuple[Prepared, Trace]] = []
                for pending in answers:  # most commit together: wait for the stragglers
                    for prepared, _ in pending.items:
                        if not prepared.future.done:
                            await prepared.future.wait_settled()
                for pending in answers:
                    line = self._answer_line(link, pending, done)
                    if line is not None:
                        lines.append(line)
                await self._send_lines(link, lines)
                # one message per agent, carrying each item's own wake: the gate and the
                # speech route look at every one of them
                wakes: dict[str, list[Wake]] = {}
                publish, sid = self.ctx.trace.publish_fields, self.sid
                for prepared, (kind, channel_id, key, author) in done:
                    text = _text(prepared.blocks)
                    fields: dict[str, Any] = (
                        {"event_id": key, "text": text}
                        if kind == "push"
                        else {"message_id": key, "author": author, "text": text}
                    )
                    publish(kind, sid, channel_id, fields)
                    for agent, wake in prepared.wakes:
                        wakes.setdefault(agent, []).append(wake)
                for agent, items in wakes.items():
                    ref = self.ctx.agents.get(agent)
                    if ref is not None:
                        await ref.tell(Wakes(items=tuple(items)))
            finally:
                self.work.dec(len(answers))

    def _answer_line(
        self, link: Link, pending: Pending, done: list[tuple[Prepared, Trace]]
    ) -> str | None:
        """The reply to a request whose writes are all settled (None if the link is gone).
        Items that were new are added to ``done``."""
        results: list[dict[str, Any]] = []
        all_ok = pending.error is None
        for prepared, trace in pending.items:
            ok = True
            try:
                if prepared.future.result().stored:
                    done.append((prepared, trace))
            except StoreError as exc:
                self._trace("error", error=f"store failed: {exc}", method=pending.method)
                ok = all_ok = False
            if not pending.push:
                entry: dict[str, Any] = {"messageId": trace[2], "accepted": ok}
                if not ok:
                    entry["reason"] = "not stored; retry"
                elif prepared.coalesce is not None:
                    entry["coalesce"] = dict(prepared.coalesce)
                results.append(entry)
        try:
            if pending.error is not None:
                return link.session.send_error(pending.id, pending.error)
            if not pending.push:
                if pending.refused:
                    results += pending.refused
                return link.session.send_response(pending.id, {"results": results})
            if all_ok:
                answer: dict[str, Any] = {"accepted": True}
                for prepared, _ in pending.items:
                    if prepared.coalesce is not None:
                        answer["coalesce"] = dict(prepared.coalesce)
                return link.session.send_response(pending.id, answer)
            err = RpcError(code=INTERNAL_ERROR, message="not stored; retry")
            return link.session.send_error(pending.id, err)
        except rpc.LocalProtocolError:
            return None  # the session closed meanwhile; the server retries on a new link

    # channels/register, channels/changed, channels/list ------------------------------------
    async def _register(self, link: Link, params: Any) -> dict[str, Any]:
        return {"results": [await self._add_channel(link, d) for d in parse_descriptors(params)]}

    async def _add_channel(self, link: Link, raw: Any) -> dict[str, Any]:
        cid = raw.get("id") if isinstance(raw, Mapping) else None
        try:
            desc = structure(raw, ChannelDescriptor)
        except RpcError as exc:
            return {"id": cid, "accepted": False, "reason": exc.message}
        if not desc.id:
            return {"id": cid, "accepted": False, "reason": "empty channel id"}
        try:
            chan = await self.ctx.channel(self.sid, desc.id)
        except ChannelLimit as exc:
            return {"id": desc.id, "accepted": False, "reason": str(exc)}
        await chan.ask(Register(descriptor=desc), timeout=self.cfg.request_timeout_s)
        link.channels.add(desc.id)
        self._trace("channel-registered", channel_id=desc.id, label=desc.label)
        return {"id": desc.id, "accepted": True}

    async def _channels_changed(self, link: Link, params: Any) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise RpcError(code=INVALID_PARAMS, message="Invalid params: params must be an object")
        changed = structure({k: params[k] for k in ("removed",) if k in params}, ChannelsChanged)
        results: list[dict[str, Any]] = []
        for key in ("added", "updated"):
            if key in params:
                results.extend(
                    [await self._add_channel(link, d) for d in parse_descriptors(params, key)]
                )
        for cid in changed.removed:
            if cid in link.channels:
                link.channels.discard(cid)
                chan = await self.ctx.channel(self.sid, cid)
                await chan.tell(Unregister())
                self._trace("channel-removed", channel_id=cid)
                results.append({"id": cid, "accepted": True})
            else:
                results.append({"id": cid, "accepted": False, "reason": "unknown_channel"})
        return {"results": results}

    async def _list_channels(self, link: Link) -> dict[str, Any]:
        out = []
        for cid in sorted(link.channels):
            chan = await self.ctx.channel(self.sid, cid)
            info: ChannelInfo = await chan.ask(Describe(), timeout=self.cfg.request_timeout_s)
            out.append(dict(info.descriptor))
        return {"channels": out}


def _text(blocks: Any) -> str:
    return "\n".join([str(b.get("text", "")) for b in blocks if b.get("type") == "text"])


def manifest_impacts(
    before: frozenset[str],
    after: frozenset[str],
    pending: frozenset[str],
    configured: frozenset[str],
    sets_before: frozenset[str],
    sets_after: frozenset[str],
    accepted: bool,
) -> list[dict[str, str]]:
    """The receipt of one manifest change: each impact with its disposition (SPEC §17)."""
    impacts = [
        {"impact": "capability-revoked", "subject": p, "disposition": "applied"}
        for p in sorted(before - after - configured)
    ]
    impacts += [
        {"impact": "capability-expansion-pending", "subject": p, "disposition": "decision-needed"}
        for p in sorted(pending)
    ]
    impacts += [
        {
            "impact": "capability-expansion-pending",
            "subject": p,
            "disposition": "applied" if accepted else "informational",
        }
        for p in sorted(configured)
    ]
    impacts += [
        {"impact": "feature-degraded", "subject": n, "disposition": "applied"}
        for n in sorted(sets_before - sets_after)
    ]
    impacts += [
        {"impact": "feature-restored", "subject": n, "disposition": "applied"}
        for n in sorted(sets_after - sets_before)
    ]
    return impacts


def policy_report(
    advertised: frozenset[str], grant: frozenset[str], state: grants.FeatureSetState
) -> dict[str, Any]:
    """What a server advertised, what the host grants, and each feature set's status."""
    return {
        "advertised": sorted(advertised),
        "granted": sorted(grant),
        "denied": sorted(advertised - grant),
        "feature_sets": {
            name: "enabled"
            if st.enabled
            else (st.reason or "not enabled")
            + (f" ({', '.join(st.missing)})" if st.missing else "")
            for name, st in sorted(state.statuses.items())
        },
    }


def _as_rpc_error(exc: Exception, method: str) -> RpcError:
    if isinstance(exc, RpcError):
        return exc
    log.error("internal error handling %s: %s", method, _describe(exc))
    return RpcError(code=INTERNAL_ERROR, message=f"internal error handling {method}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["UNKNOWN_CHANNEL", "ConnectionActor", "backoff_delay"]
