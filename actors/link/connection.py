"""ConnectionActor: one per configured MCPL server.

It owns the transport, the protocol session, our pending requests, and reconnection; the link
in force (``actors.link.state.Link``) holds the grant, the declared feature sets and the channels
this server registered on it. Its concerns live in parts it delegates to, modules that never import
the actor (they see it as an ``actors.link.state.LinkOwner``):

- ``actors.link.run``: the life of a link once its transport is open: its tasks, the handshake
  under its deadline, the server's notifications;
- ``actors.link.io``: the wire loop of a link (writer, reader, dispatcher, and the requests
  held until the host's policy is decided);
- ``actors.link.handshake.LinkPolicy``: the handshake, and manifest changes (re-applying a policy);
- ``actors.link.inbound.HotLanes``: ``push/event`` and ``channels/incoming``, from admission to the
  answer after the commit, and the report of items skipped as already stored;
- ``actors.link.requests.ServerRequests``: the server's other requests;
- ``actors.link.end``: how a link ended, in one line, and the server's last stderr lines.

Tasks of one link (``actors.link.io``): a reader that only decodes and dispatches; a dispatcher
that takes the server's requests (and its ``channels/changed`` notifications) from a bounded
queue in arrival order, applies channel changes before anything after them is checked, hands the
items of the hot lanes to their channel actors and gives any other request a handler task; a
responder that answers the hot lanes once their writes are committed, then wakes the agents;
and a writer that owns the transport's send side, fed by a bounded outbox. Every queue is
bounded and its producer waits when it is full, so a flooding server is slowed down by its own
transport (backpressure), nothing it sent is refused for being too many, and no answer is ever
dropped.

The actor's own mailbox serves ``Call``/``Status`` asks from agents and channels; a ``Call`` runs
in a child task, so a server that never answers stalls only the asker, and only until the request
deadline (after which a ``ping`` probe tells a slow server from a silent one). A ``Call`` made
while a link's handshake finishes under a policy already in force waits for its end.

Supervision: the whole handshake (``initialize`` to ``tools/list``) has ``request_timeout_s``;
past it the link has failed: the server's requests that still wait for a policy are refused
(-32002) and the link is closed. A link that ends (EOF, crash, silence, garbage that kills the
transport, a failed handshake) is reported (``disconnected``: how it ended, the handshake step
it died in, the server's last stderr lines, the retry's number and delay) and reopened after an
exponential backoff with jitter (5 s base, 5 min cap), with a fresh handshake. A link that was
never ready, or ready for less than ``HEALTHY_AFTER_S``, counts as a failed attempt: the next
wait doubles, up to the cap; only a link ready that long starts again from the first retry
(``protocol.backoff``). A link the operator closed (``Host.reconnect``) is no failed attempt:
its ``disconnected`` has ``requested``, no stderr lines and no wait, and the new link is
dialled at once. Nothing that happens on a link escapes into the host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

import attrs
import trio

from actors.config import ServerConfig
from actors.context import HostContext
from actors.errors import NotConnected
from actors.kernel import Actor, Reply, backoff_delay
from actors.messages import Call, CancelCall, ConnStatus, Notify, Reconfigure, Reconnect, Status
from protocol import jsonrpc as rpc
from protocol.backoff import next_attempt
from protocol.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, RpcError

from .end import StderrTail, ending
from .handshake import LinkPolicy, manifest_impacts, policy_report
from .inbound import HotLanes
from .io import new_link
from .reconnect import ReconnectSwitch
from .requests import ServerRequests
from .run import LinkRun
from .state import MANIFEST_FETCHES, Link, RequestTimeout
from .transport import Transport, open_transport
from .vitals import LinkVitals

MAX_KEYED_CALLS = 1024
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0
HEALTHY_AFTER_S = 30.0  # a link ready this long resets the retry count; a shorter one adds one
PROBE_TIMEOUT_S = 10.0


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
        self.last_error: str | None = None
        # every configured server's credential is kept out of what this server's reports say
        self.redactor = ctx.redactor
        self.tail = StderrTail(self.redactor)
        # what a console shows of this server over time; read from ctx.vitals without an ask
        self.vitals = ctx.vitals[self.sid] = LinkVitals(self.sid, self.tail)
        self.policy = LinkPolicy(self)
        self.lanes = HotLanes(self)
        self.requests = ServerRequests(self)
        self.life = LinkRun(self, self.policy, self.lanes, self.requests)
        self.switch = ReconnectSwitch()

    # -- tracing ----------------------------------------------------------------------------
    def trace(self, kind: str, channel_id: str | None = None, **data: Any) -> None:
        self.ctx.trace.emit(kind, server_id=self.sid, channel_id=channel_id, data=data)

    def diagnostic(self, text: str) -> None:
        self.trace("diagnostic", text=text)

    def refused(
        self,
        method: str,
        error: RpcError | None,
        reason: str,
        *,
        channel_id: str | None = None,
        **ids: Any,
    ) -> None:
        """Trace a refusal sent to the server: a whole request answered with ``error``, or one
        item of a batch (``error`` None). Ids go in the data, never in ``reason``."""
        data = {k: v for k, v in ids.items() if v is not None}
        code = error.code if error is not None else None
        self.trace(
            "refused", channel_id=channel_id, method=method, code=code, reason=reason, **data
        )

    # -- mailbox ----------------------------------------------------------------------------
    async def on_start(self) -> None:
        self.spawn(self._supervise, counted=False)

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Status):
            reply.value(self.status())
        elif isinstance(msg, Call):
            if self._handshake_ending() is None:
                call = self._start_call(msg, reply)
                if call is not None:
                    self.spawn(self._do_call, *call)
            else:
                self.spawn(self._call, msg, reply)
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
        elif isinstance(msg, Reconnect):
            reply.value(self.switch.request(self.link))
        else:
            raise TypeError(f"unexpected message {msg!r}")

    def serve_inline(self, msg: Any) -> Awaitable[Any] | None:
        """A call is made in the asker's task: handled here, it would only start a task of its
        own for the request (see :mod:`actors.kernel`)."""
        return self._call_here(msg) if isinstance(msg, Call) else None

    async def _call_here(self, msg: Call) -> Any:
        reply = Reply(trio.Event())
        await self._call(msg, reply)
        assert reply.result is not None  # _call answers, or raises a cancellation
        return reply.result.unwrap()

    async def _call(self, msg: Call, reply: Reply) -> None:
        """Make ``msg``'s request and answer ``reply``, once the handshake is over if it is
        finishing (:meth:`_handshake_ending`)."""
        ending = self._handshake_ending()
        if ending is not None:
            await ending.wait()
        call = self._start_call(msg, reply)
        if call is not None:
            await self._do_call(*call)

    def _handshake_ending(self) -> trio.Event | None:
        """What a call waits for when the link's handshake is finishing under a policy already
        in force (the server's requests are served from then on, so an agent may answer a
        message of the server before its tools are listed): the end of the handshake, ready or
        failed, at most its deadline away. None when the call is decided at once."""
        link = self.link
        if link is not None and link.decided and not link.ready:
            return link.handshake_over
        return None

    def _start_call(
        self, msg: Call, reply: Reply
    ) -> tuple[Link, Call, Reply, trio.CancelScope] | None:
        """What ``_do_call`` needs for ``msg``, or None with ``reply`` refused (no ready link;
        a link still connecting refuses at once, as one between links does)."""
        link = self.link
        if link is None or not link.ready:
            reply.error(NotConnected(f"server {self.sid} is not connected"))
            return None
        scope = trio.CancelScope()
        if msg.key is not None and len(link.calls) < MAX_KEYED_CALLS:
            link.calls[msg.key] = scope  # before the call starts, so no cancel is missed
        return link, msg, reply, scope

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

    def link_ready(self) -> None:
        """The link's handshake is over: it is connected from now (for the console's vitals)."""
        self.vitals.ready()

    def publish_status(self) -> None:
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
            connects=self.connects,
            last_error=self.last_error,
            stderr_tail=self.tail.lines(),
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
            began = trio.current_time()
            rid, line = link.session.send_request(method, params, now=began, timeout=t)
        except rpc.PendingFull as exc:
            raise RpcError(
                code=INTERNAL_ERROR, message=f"too many pending requests: {exc}"
            ) from None
        except rpc.LocalProtocolError:
            raise NotConnected(f"server {self.sid} is not connected") from None
        recv = link.expect(rid)
        try:
            with trio.fail_after(t):
                if not link.write_now([line]):
                    try:  # queued at once while the outbox has room: the answer is the wait
                        link.outbox_send.send_nowait([line])
                    except trio.WouldBlock:
                        await link.outbox_send.send([line])
                result = await recv.receive()
            self.vitals.answered(trio.current_time() - began)
        except trio.TooSlowError:
            self.trace("request-timeout", method=method, timeout_s=t)
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
            link.close("the server went silent (no answer to ping)")
        except NotConnected:
            pass
        finally:
            link.probing = False

    async def notify(self, link: Link, method: str, params: Any) -> None:
        try:
            await link.outbox_send.send([link.session.send_notification(method, params)])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise NotConnected(f"server {self.sid} is not connected") from None

    async def send_lines(self, link: Link, lines: list[str]) -> None:
        if not lines:
            return
        try:
            if not link.write_now(lines):
                await link.outbox_send.send(lines)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _apply_manifest(
        self,
        link: Link,
        manifest: Mapping[str, Any],
        cfg: ServerConfig | None = None,
        *,
        by_operator: bool = False,
    ) -> None:
        """Re-apply a policy (``cfg``'s masks, the actor's own config by default) to the live
        link, as a manifest change does."""
        await self.policy.apply_manifest(link, manifest, cfg, by_operator=by_operator)

    def _reconfigure(self, cfg: ServerConfig, reply: Reply) -> None:
        """A config reload changed this server's masks. A ready link gets them at once, the way
        a manifest change is applied (host-first revocation, then ``featureSets/update``), but
        additions are granted too: the operator asked for them. A link whose handshake already
        negotiated under the old masks is reopened; otherwise the next handshake uses them.
        The answer is the grant in force afterwards, or None when the server is not ready."""
        self.cfg = cfg
        link = self.link
        if link is not None and not link.ready and not link.mcp_only and link.manifest:
            link.close("reopened: negotiated under the masks a reload replaced")
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

    # -- supervision ------------------------------------------------------------------------
    async def _supervise(self) -> None:
        attempt = 0
        while not self.ctx.closing:
            try:
                reason, report, ready_for = await self._run_link()
            finally:
                self.link = None
                self.publish_status()
            self.lanes.flush_skips()
            self.life.flush_ignored()
            self.ctx.hot_in_flight.pop(self.sid, None)  # what was in hand went with the link
            self.ctx.last_read.pop(self.sid, None)
            self.vitals.ended(reason, ready_for)
            requested = self.switch.ended_by_request()
            if requested:  # the operator's doing: no error, no failed attempt, no stderr dump
                report["stderr_tail"] = []
            else:
                self.last_error = reason
                attempt = next_attempt(attempt, ready_for, HEALTHY_AFTER_S)
            self.publish_status()
            if self.switch.pending:  # a reconnect was asked for: no wait at all
                delay = 0.0
            else:
                delay = backoff_delay(max(attempt, 1), BACKOFF_BASE_S, BACKOFF_CAP_S, self.ctx.rng)
            self.trace(
                "disconnected",
                reason=reason,
                retry_in_s=round(delay, 1),
                attempt=attempt,
                requested=requested,
                **report,
            )
            await self.switch.wait(delay)

    def _on_stderr(self, line: str) -> None:
        self.tail.add(line)
        self.vitals.stderr_line()
        self.trace("server-log", line=self.redactor.text(line)[:2000])
        status = self.ctx.statuses.get(self.sid)
        if isinstance(status, ConnStatus):
            self.ctx.statuses[self.sid] = attrs.evolve(status, stderr_tail=self.tail.lines())

    async def _run_link(self) -> tuple[str, dict[str, Any], float | None]:
        """Open a link, run it until it ends; how it ended (one line), the report's data, and
        how long the link was ready (None if it never was)."""
        self.connects += 1
        self.vitals.connecting()
        self.tail.clear()
        self.publish_status()
        transport: Transport | None = None
        link: Link | None = None
        error: Exception | None = None
        try:
            async with open_transport(self.cfg, self._on_stderr) as transport:
                link = self.link = new_link(transport, self.vitals.traffic)
                self.trace("connecting", transport=transport.description, attempt=self.connects)
                await self.life.serve(link)
        except Exception as exc:
            error = exc
        process = getattr(transport, "process", None)
        step = link.step if link is not None and not link.ready else None
        reason = ending(
            error=error,
            process=process,
            close_reason=link.close_reason if link is not None else None,
            step=step,
            redactor=self.redactor,
        )
        report = {
            "step": step,
            "exit_code": process.returncode if process is not None else None,
            "stderr_tail": list(self.tail.lines()),
        }
        ready_at = link.ready_at if link is not None else None
        ready_for = trio.current_time() - ready_at if ready_at is not None else None
        return reason, report, ready_for


__all__ = [
    "MANIFEST_FETCHES",
    "ConnectionActor",
    "backoff_delay",
    "manifest_impacts",
    "policy_report",
]
