"""The wire loop of one link: the writer, the reader, the dispatcher, and the requests that
arrive before the host has decided its policy for the link.

The reader only decodes and dispatches: answers to our requests resolve their waiters, the
server's requests go to a bounded batch queue (or, before the decision, to a buffer capped at
``EARLY_CAP``, past which they are refused), notifications go to the actor, except the
``channels/changed`` of a link whose policy is in force, which goes to the queue with the
requests. The dispatcher takes the queue in arrival order: admission checks run in that order,
and a channel change (``channels/register``, ``channels/changed``) is applied before any later
message is checked, so a push or a message naming a channel announced just before it finds the
channel. Hot-lane requests go to ``actors.link.inbound.HotLanes`` a batch at a time; any other
request gets a handler task of ``actors.link.requests.ServerRequests`` (at most
``MAX_HANDLERS``). The writer owns the transport's send side, fed by the bounded outbox, and
writes whatever waits in one go. Every queue is bounded and its producer waits when it is full:
a flooding server is slowed down by its own transport.

The host's policy (its grant, announced by the initial ``featureSets/update``) is its own
decision and is in force from the moment it is sent (SPEC §6.7, host-first): the server's
requests are judged under it at once, while the handshake goes on, and never wait for the
server's receipt. So a server that reads nothing until its own first request is answered (an
eager ``channels/register`` right after ``initialize``) is answered, reads our policy, and the
handshake completes. A request that arrives before the decision (the host decides as soon as it
has the server's ``initialize`` answer) waits in the buffer until the decision
(:meth:`LinkIO.hold_early`), then goes to the dispatcher ahead of anything later. Only a request
sent before the server even answered ``initialize`` can wait longer, for that answer, and at
most ``EARLY_WAIT_S``: then it is refused with -32002 ``{capability}`` (no policy in force
yet), well before the 30 s after which servers give up on their own requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import outcome
import trio

from actors.kernel import BatchQueue
from protocol import grants
from protocol import jsonrpc as rpc
from protocol.errors import CAPABILITY_DENIED, RpcError
from protocol.fairness import ingest_pause
from protocol.framing import Oversize, Undecodable
from protocol.vitals import MinuteCounts

from .inbound import HotLanes, Pending
from .requests import ServerRequests
from .state import INGEST_SLICE, READ_BATCH, TAKE_LIMIT, Link, LinkOwner, describe
from .transport import Transport

EARLY_CAP = 1000  # requests held until the policy is decided; past it, refused at once (-32002)
EARLY_WAIT_S = 5.0  # the longest a request waits for the decision before its -32002
NOT_READY = "connection not ready; retry later"
OUTBOX_CAP = 1024
MAX_HANDLERS = 128
REQUEST_QUEUE_CAP = 1024  # requests read, waiting for the dispatcher (reader waits past it)
# prepared requests waiting for their commit and the responder (the dispatcher waits past it):
# what one connection may have in the store's queue ahead of another's
ANSWER_QUEUE_CAP = 8 * INGEST_SLICE
#: The answers a flooding connection may have queued while other connections deliver too.
SHARED_ANSWERS = 2 * INGEST_SLICE
#: The requests a reader keeps queued while others need the host (past it, it stops reading).
SHARED_QUEUE = 4 * INGEST_SLICE
# Every request the server may have in flight with us: the queues (each may overshoot its cap by
# one batch), the batch in each worker's hands, the handlers and the buffer before the decision.
INBOUND_CAP = REQUEST_QUEUE_CAP + ANSWER_QUEUE_CAP + 2 * READ_BATCH + 2 * TAKE_LIMIT
INBOUND_CAP += MAX_HANDLERS + EARLY_CAP
MAX_PENDING = 256  # our own requests awaiting the server's answer
HOT_LANES = frozenset({"push/event", "channels/incoming"})
# what changes the channels a later push or message is checked against: applied in order
CHANNEL_CHANGES = frozenset({"channels/register", "channels/changed"})
WRITE_BATCH = 256
WS_PING_EVERY_S = 30.0


def new_link(transport: Transport, traffic: MinuteCounts | None = None) -> Link:
    """A link over a freshly opened transport, with its session, outbox and queues; its
    messages are counted in ``traffic`` (a count of its own if None)."""
    out_send, out_recv = trio.open_memory_channel[list[str]](OUTBOX_CAP)
    return Link(
        traffic=traffic if traffic is not None else MinuteCounts(),
        transport=transport,
        session=rpc.RpcSession(max_pending=MAX_PENDING, max_inbound=INBOUND_CAP),
        outbox_send=out_send,
        outbox_recv=out_recv,
        requests=BatchQueue(REQUEST_QUEUE_CAP),
        answers=BatchQueue(ANSWER_QUEUE_CAP),
    )


class LinkIO:
    def __init__(
        self,
        owner: LinkOwner,
        lanes: HotLanes,
        requests: ServerRequests,
        on_notification: Callable[[Link, rpc.Notification], None],
    ) -> None:
        self.owner = owner
        self.lanes = lanes
        self.requests = requests
        self.on_notification = on_notification

    async def pinger(self, link: Link) -> None:
        ws = getattr(link.transport, "ws", None)
        while ws is not None:
            await trio.sleep(WS_PING_EVERY_S)
            with trio.move_on_after(2 * WS_PING_EVERY_S) as scope:
                await ws.ping()
            if scope.cancelled_caught:
                self.owner.diagnostic("no pong in 60 s; closing the link")
                link.close_reason = link.close_reason or "the server stopped answering pings"
                await ws.aclose()
                return

    async def writer(self, link: Link) -> None:
        """Write what the outbox holds until the link ends or the outbox is closed (then
        everything queued before the close is written first)."""
        try:
            async for lines in link.outbox_recv:
                while len(lines) < WRITE_BATCH:  # whatever else is waiting goes in the same write
                    try:
                        lines = lines + link.outbox_recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                try:
                    await link.transport.send_many(lines)
                except Exception as exc:  # the link is gone; the reader sees EOF
                    self.owner.diagnostic(f"write failed: {describe(exc)}")
                    link.closed.set()  # most often the server went away: its exit says why
                    return
                link.traffic.add(trio.current_time(), sent=len(lines))
        finally:
            link.written.set()

    async def reader(self, link: Link) -> None:
        """Decode what the server sends. Requests are passed on in batches: every request
        already read is queued together before the reader waits for more input."""
        batch: list[rpc.Request | rpc.Notification] = []
        try:
            while True:
                first = await link.transport.receive()
                if first is None:
                    return
                ctx, sid = self.owner.ctx, self.owner.sid
                ctx.last_read[sid] = trio.current_time()
                step = ctx.ingest_slice(sid, INGEST_SLICE)
                # what the transport has already framed is handled without waiting for input,
                # a slice at a time: between slices every other task has its turn
                handled = 0
                for item in [first, *link.transport.take_buffered()]:
                    handled += 1
                    if handled % step == 0:
                        if batch:
                            await self.pass_on(link, batch)
                            batch = []
                        await trio.lowlevel.checkpoint()
                    if isinstance(item, Oversize):
                        size = "a frame" if item.size < 0 else f"{item.size} bytes"
                        cap = self.owner.cfg.max_line_bytes
                        self.owner.diagnostic(f"line over max_line_bytes ({cap}) refused: {size}")
                        if item.size < 0:
                            return
                        continue
                    if isinstance(item, Undecodable):
                        self.owner.diagnostic(f"undecodable line ({item.size} bytes) skipped")
                        continue
                    for event in link.session.receive_line(item):
                        if link.admitting and isinstance(event, rpc.RequestReceived):
                            self.owner.work.inc()  # released once the request is answered
                            batch.append(event.request)
                        elif link.admitting and _changes_channels(event):
                            assert isinstance(event, rpc.NotificationReceived)
                            self.owner.work.inc()  # released once the change is applied
                            batch.append(event.notification)
                        else:
                            await self.dispatch_event(link, event)
                    if len(batch) >= READ_BATCH:
                        await self.pass_on(link, batch)
                        batch = []
                link.traffic.add(trio.current_time(), received=handled)
                if batch:  # nothing more is buffered: what was read goes on together
                    await self.pass_on(link, batch)
                    batch = []
        except Exception as exc:
            self.owner.diagnostic(f"read failed: {describe(exc)}")
        finally:
            self.owner.work.dec(len(batch))  # read but never queued: the link is gone
            for rid, waiter in list(link.waiters.items()):
                waiter.close()
                link.waiters.pop(rid, None)
            link.session.close()
            link.closed.set()

    async def dispatcher(self, link: Link) -> None:
        """Take queued messages in arrival order. Items of the hot lanes are handed to their
        channels here, one ask per channel per batch, and answered by the responder after their
        commit. A channel change is applied here, after the hot-lane items before it and before
        anything after it is checked. Any other request is admitted here, in order, and then
        handled in a task of its own, at most ``MAX_HANDLERS`` at a time."""
        slots = trio.Semaphore(MAX_HANDLERS)
        assert link.nursery is not None
        while True:
            batch = await link.requests.take(
                self.owner.ctx.ingest_slice(self.owner.sid, TAKE_LIMIT)
            )
            began = trio.current_time()
            hot: list[rpc.Request] = []
            for item in batch:
                if isinstance(item, rpc.Request) and item.method in HOT_LANES:
                    hot.append(item)
                    continue
                if isinstance(item, rpc.Notification) or item.method in CHANNEL_CHANGES:
                    if hot:  # what came before the change is checked before it
                        await self.prepare_hot(link, hot)
                        hot = []
                    await self.requests.apply_change(link, item)
                    continue
                refusal = self.requests.admission(link, item.method, item.params)
                await slots.acquire()
                link.nursery.start_soon(self.requests.serve, link, item, slots, refusal)
            batch.clear()
            if hot:
                await self.prepare_hot(link, hot)
            await self.give_way(link, trio.current_time() - began)

    async def give_way(self, link: Link, spent: float) -> None:
        """After a slice, a flooding server gives way to the rest of the host for a while
        (:func:`protocol.fairness.ingest_pause`): its share is what the others leave. A server
        alone, or heard by the agents in a turn, or the lighter of two, goes on at once."""
        ctx, sid = self.owner.ctx, self.owner.sid
        step = ctx.ingest_slice(sid, INGEST_SLICE)
        pause = ingest_pause(
            waiting=len(link.requests),
            in_hand=ctx.hot_in_flight.get(sid, 0),
            slice_size=step,
            others_turning=ctx.others_turning(sid),
            others_in_hand=[n for s, n in ctx.hot_in_flight.items() if s != sid],
            spent=spent,
        )
        if pause > 0:
            await trio.sleep(pause)
        if len(link.requests) >= INGEST_SLICE and any(s != sid for s in ctx.hot_in_flight):
            # while other servers deliver too, a flooding one keeps few writes queued ahead of
            # theirs in the store: it prepares more once most of its own are answered (fewer
            # still while they deliver right now)
            await link.answers.wait_below(min(SHARED_ANSWERS, 2 * step))

    async def prepare_hot(self, link: Link, hot: list[rpc.Request]) -> None:
        """Admit, check and convert hot-lane requests (``prepare`` checks every one before it
        first waits, and empties ``hot`` once they are parsed); their answers wait for the
        responder (which counts them out of ``ctx.hot_in_flight``)."""
        in_flight, sid = self.owner.ctx.hot_in_flight, self.owner.sid
        in_flight[sid] = in_flight.get(sid, 0) + len(hot)
        prepared: list[Pending] = await self.lanes.prepare(link, hot)
        await link.answers.put_many(prepared)

    async def dispatch_event(self, link: Link, event: rpc.Event) -> None:
        if isinstance(event, rpc.ResponseReceived):
            self.resolve(link, event.id, outcome.Value(event.result))
        elif isinstance(event, rpc.ErrorReceived):
            self.resolve(link, event.id, outcome.Error(event.error))
        elif isinstance(event, rpc.RequestReceived):
            req = event.request
            if not link.admitting:  # held until the decision (hold_early)
                if len(link.early) >= EARLY_CAP:
                    await self.refuse_not_ready(link, req)
                else:
                    link.early.append((req, trio.current_time() + EARLY_WAIT_S))
                    link.early_wake.set()
                return
            self.owner.work.inc()
            await self.queue_requests(link, [req])
        elif isinstance(event, rpc.NotificationReceived):
            self.on_notification(link, event.notification)
        elif isinstance(event, rpc.Diagnostic):
            self.owner.diagnostic(event.text)
            if event.reply is not None:
                await self.owner.send_lines(link, [event.reply])

    def resolve(self, link: Link, rid: rpc.Id, result: outcome.Outcome[Any]) -> None:
        waiter = link.waiters.get(rid)
        if waiter is not None:
            try:
                waiter.send_nowait(result)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def pass_on(self, link: Link, batch: list[rpc.Request | rpc.Notification]) -> None:
        """The reader queues what it read. While others need the host, it then waits until
        fewer than ``SHARED_QUEUE`` requests are queued: the rest stays unread in the
        server's own transport instead of parsed here. It never waits while we await an
        answer from the server (the answer may be behind them)."""
        await self.queue_requests(link, batch)
        if self.owner.ctx.contended(self.owner.sid):
            await link.requests.wait_below(SHARED_QUEUE, unless=lambda: bool(link.waiters))

    async def queue_requests(self, link: Link, batch: list[rpc.Request | rpc.Notification]) -> None:
        try:
            await link.requests.put_many(batch)
        except BaseException:
            self.owner.work.dec(len(batch))
            raise

    async def hold_early(self, link: Link) -> None:
        """Hold the requests that arrive before the host decided its policy, until it does
        (:meth:`actors.link.state.Link.decide`); then queue them in arrival order and let the
        reader queue what follows itself. A request whose ``EARLY_WAIT_S`` runs out first (the
        decision waits for the server's ``initialize`` answer) is refused with -32002."""
        while not link.decided:
            due = link.early[0][1] if link.early else math.inf
            link.early_wake = trio.Event()
            with trio.move_on_at(due):
                await link.early_wake.wait()
            now = trio.current_time()
            while link.early and link.early[0][1] <= now and not link.decided:
                req, _ = link.early.popleft()
                await self.refuse_not_ready(link, req)
        while link.early:  # the reader holds on while these are queued
            waiting: list[rpc.Request | rpc.Notification] = [req for req, _ in link.early]
            link.early.clear()
            self.owner.work.inc(len(waiting))
            for i in range(0, len(waiting), READ_BATCH):
                await self.queue_requests(link, waiting[i : i + READ_BATCH])
        link.admitting = True  # in the step that found the buffer empty: the order is kept

    async def refuse_early(self, link: Link) -> int:
        """The link will not get a policy: refuse (-32002) every request still held now; how
        many there were."""
        waiting = [req for req, _ in link.early]
        link.early.clear()
        for req in waiting:
            await self.refuse_not_ready(link, req)
        return len(waiting)

    async def refuse_not_ready(self, link: Link, req: rpc.Request) -> None:
        """SPEC §5.3: a privileged call before any policy is in force gets -32002
        ``{capability}`` (a request that needs no capability, such as ``ping``, gets it without
        data)."""
        cap = grants.INBOUND_CAPABILITY.get(req.method)
        err = RpcError(
            code=CAPABILITY_DENIED, message=NOT_READY, data={"capability": cap} if cap else None
        )
        await self.requests.reply(link, req, error=err)


def _changes_channels(event: rpc.Event) -> bool:
    return (
        isinstance(event, rpc.NotificationReceived) and event.notification.method in CHANNEL_CHANGES
    )
