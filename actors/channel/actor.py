"""ChannelActor: one per (server, channel id); ``channel_id=None`` is the server's unscoped lane.

It owns the descriptor and label, each agent's open/closed state (persisted), the conversion and
storage of what arrives on the channel, the wake decision, and publishing into the channel.
What it freezes of each item (envelope, copies, wakes) is built by ``channel_envelope``; a
coalesced item goes through the coalescer (``channel_coalesce``).

Ingest never waits on a commit inside the loop: ``IngestBatch`` converts each
item, decide who it wakes, hand it to the store and answer at once with the pending write (or,
asked so, answer with the write itself, for the caller to hand to the store together with other
channels' writes); the caller awaits durability, answers the server, and only then sends the
wakes.

A channel's actor starts on first use: until then what its server registered waits in the
host's ``ChannelDirectory``, and the actor takes it over when it starts. The actor publishes
its ``ChannelInfo`` there whenever it changes, for listings that do not ask it.

Echoes: a message whose id matches one of our publish receipts, or tagged ``chat:from-self``,
never wakes anyone, and it is not stored again for the agent that wrote it. The author of an
echo known by its receipt is remembered as that agent's own account here
(``protocol.loops.OwnAuthors``): a later message by it is stored as any is, and its wake names
the agent (``Wake.own_of``), whom it does not wake (``actors.agent.loops``). While a publish to
this channel is still waiting for its receipt, a batch holding an item that could be its echo
(``protocol.echoes.EchoWatch``: a server may echo a post before it answers the publish) waits,
in order with the other waiting batches, until no publish is pending, at most ``MAX_DEFERRED``
batches; past that they are taken at once. Every other batch is taken at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

from actors.context import HostContext
from actors.directory import (
    OPEN_STATE_NS,
    Registration,
    describe,
    is_open,
    open_state_key,
    with_label,
)
from actors.kernel import Actor, Reply
from actors.messages import (
    ChannelInfo,
    Describe,
    IngestBatch,
    Materialized,
    Prepared,
    Publish,
    Register,
    SetOpen,
    Unregister,
)
from actors.references.registry import resolve_references
from protocol.addressing import is_direct
from protocol.content import ContentError, convert_blocks
from protocol.echoes import EchoWatch
from protocol.errors import INVALID_PARAMS, RpcError
from protocol.lanes import ChannelDescriptor, IncomingMessage, PushEvent
from protocol.leases import server_resource
from protocol.loops import OwnAuthors
from protocol.routes import (
    PublishOutcome,
    declared_target,
    speech_place,
)
from protocol.source import (
    channel_header,
    unscoped_header,
)
from protocol.tags import expand_tags, is_addressed
from store import Append, MessageRecord, PutState

from .coalesced import admit
from .envelope import (
    BatchView,
    copies,
    inbound_source,
    incoming_envelope,
    new_id,
    push_envelope,
    render_meta,
    wakes_of,
)
from .items import seal
from .publish import Receipts, now_iso, send_publish

MAX_RECEIPTS = 1024  # publish receipts kept for echo detection; oldest forgotten first
MAX_DEFERRED = 64  # ingest batches waiting for a publish receipt; past it: taken at once
MAX_OWN_AUTHORS = 16  # accounts seen posting our echoes; least recently seen forgotten first
MAX_SUBJECT_PLACES = 4096  # coalescing subjects whose place is known; least recent forgotten


__all__ = ["ChannelActor"]


class ChannelActor(Actor):
    mailbox_size = 256

    def __init__(
        self,
        server_id: str,
        channel_id: str | None,
        ctx: HostContext,
        registration: Registration | None = None,
    ) -> None:
        super().__init__(f"channel:{server_id}/{channel_id or '-'}", ctx.work)
        self.ctx = ctx
        self.sid = server_id
        self.cid = channel_id
        self.descriptor: ChannelDescriptor | None = None
        self.labels: list[str] = []
        self.registered = False
        self.open_for: dict[str, bool] = {}
        self.hearers = tuple(ctx.agents_hearing(server_id))  # the configured agents: fixed
        self._receipts = Receipts(MAX_RECEIPTS)  # what we posted, for echo detection
        self._echoes = EchoWatch(MAX_OWN_AUTHORS)  # publishes in flight, the host's accounts
        self._own = OwnAuthors(MAX_OWN_AUTHORS)  # the accounts each agent's echoes came from
        self._flushing = False
        self._deferred: list[tuple[IngestBatch, Reply]] = []
        # RFC-006 subjects of this channel (their key) and where each lives: (thread, message)
        self._subject_places: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        # the last header rendered, by (label, thread, reply): consecutive items share it
        self._header: tuple[tuple[str | None, str | None, str | None], str] | None = None
        if registration is not None:  # what the channel's server registered before it started
            self.descriptor = registration.descriptor
            self.labels = list(registration.labels)
            self.registered = registration.registered

    @property
    def place(self) -> str | None:
        """Where the server says a post to this channel lands (RFC-011): ``"exact"``,
        ``"root"``, or None when it does not say."""
        desc = self.descriptor
        return declared_target(desc.capabilities) if desc is not None else None

    @property
    def speech_place(self) -> str | None:
        """Where prose may go here: the declared place, ``"legacy"`` for an undeclared channel
        of a server with ``publish_undeclared`` (read from the config in force), else None."""
        return speech_place(self.place, self.ctx.config.publish_undeclared(self.sid))

    @property
    def label(self) -> str:
        return self.labels[-1] if self.labels else ""

    async def on_start(self) -> None:
        if self.cid is None:
            return
        saved = await self.ctx.saved_open.of_channel(self.sid, self.cid)
        for agent in self.hearers:
            if agent in saved:
                self.open_for[agent] = saved[agent]
        self._publish_info()

    def _publish_info(self) -> None:
        """Replace this channel's snapshot in the host's directory (read without an ask)."""
        self.ctx.channel_directory.publish(self._info())

    def is_open(self, agent: str) -> bool:
        if self.cid is None:
            return True
        return is_open(self.open_for, agent, self.descriptor)

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, IngestBatch) and len(self._deferred) < MAX_DEFERRED:
            if self._held_back(msg):
                self._deferred.append((msg, reply))
                return
        if isinstance(msg, IngestBatch):
            reply.value(await self._ingest_batch(msg.items, msg.accepted_at, msg.specs, msg.write))
        elif isinstance(msg, Register):
            self._register(msg.descriptor)
            self._publish_info()
            reply.value(None)
        elif isinstance(msg, Unregister):
            self.registered = False
            self._publish_info()
            reply.value(None)
        elif isinstance(msg, SetOpen):
            self.open_for[msg.agent] = msg.open
            self._publish_info()
            key = open_state_key(msg.agent, self.sid, self.cid)
            await self.ctx.store.write(PutState(namespace=OPEN_STATE_NS, key=key, value=msg.open))
            if self.cid is not None:
                self.ctx.saved_open.note(msg.agent, self.sid, self.cid, msg.open)
            reply.value(None)
        elif isinstance(msg, Describe):
            reply.value(self._info())
        elif isinstance(msg, Materialized):
            reply.value(await self._materialized(msg))
        elif isinstance(msg, Publish):
            self.spawn(self._publish, msg, reply, self._echoes.begin(msg.blocks))
        else:
            raise TypeError(f"unexpected message {msg!r}")

    def _register(self, desc: ChannelDescriptor) -> None:
        self.descriptor = desc
        self.registered = True
        self.labels = with_label(self.labels, desc.label)

    def _info(self) -> ChannelInfo:
        if self.cid is None:  # the unscoped lane: nothing of a channel to describe
            return ChannelInfo(
                server_id=self.sid,
                channel_id=None,
                label="",
                labels=(),
                type="",
                registered=False,
                open_for={a: True for a in self.hearers},
                descriptor={"id": None},
            )
        open_for = {a: self.is_open(a) for a in self.hearers}
        undeclared = self.ctx.config.publish_undeclared(self.sid)
        return describe(
            self.sid, self.cid, self.descriptor, self.labels, self.registered, open_for, undeclared
        )

    # -- ingest -----------------------------------------------------------------------------
    async def _ingest_batch(
        self,
        items: tuple[Any, ...],
        accepted_at: str,
        specs: tuple[Any, ...] = (),
        write: bool = True,
    ) -> list[Prepared | RpcError]:
        """Convert every item, then hand all the writes to the store at once (or, without
        ``write``, back to the caller in each ``Prepared.op``); a coalesced item (RFC-006, with
        its ``CoalesceSpec`` in ``specs``) goes through the coalescer, which decides what of it
        is stored."""
        specs = specs or (None,) * len(items)
        built: list[tuple[Append, tuple[Any, ...], Any, str] | RpcError] = []
        now = time.time()
        converted: list[list[dict[str, Any]] | RpcError] = []
        for msg in items:
            try:
                converted.append(self._convert(msg))
            except RpcError as exc:
                converted.append(exc)
        converted = await self._bind_references(converted)
        view = BatchView(
            label=self.label or None,
            place=self.speech_place,
            registered=self.registered,
            open=frozenset(a for a in self.hearers if self.is_open(a)),
        )
        for msg, blocks, spec in zip(items, converted, specs, strict=True):
            if isinstance(blocks, RpcError):
                built.append(blocks)
                continue
            built.append(self._ingest(msg, blocks, now, accepted_at, spec, view))
        ops = [
            b[0]
            for b, spec in zip(built, specs, strict=True)
            if not isinstance(b, RpcError)
            if spec is None
        ]
        futures = iter(await self.ctx.store.submit_many(ops)) if ops and write else iter(())
        out: list[Prepared | RpcError] = []
        for b, spec, msg, blocks in zip(built, specs, items, converted, strict=True):
            if isinstance(b, RpcError):
                out.append(b)
            elif spec is None and not write:
                out.append(Prepared(future=None, op=b[0], blocks=b[1], wakes=b[2], author=b[3]))
            elif spec is None:
                out.append(Prepared(future=next(futures), blocks=b[1], wakes=b[2], author=b[3]))
            else:
                assert not isinstance(blocks, RpcError)
                out.append(await admit(self.ctx, self.sid, self.cid, msg, spec, b, blocks))
        return out

    def _convert(self, msg: IncomingMessage | PushEvent) -> list[dict[str, Any]]:
        """The item's content converted, naming this channel's server as its sender."""
        if isinstance(msg, IncomingMessage):
            content, lane = msg.content, "incoming"
        else:
            content, lane = msg.payload_content, "push"
        try:
            return convert_blocks(list(content), self.sid, lane)
        except ContentError as exc:
            raise RpcError(code=INVALID_PARAMS, message=f"Invalid params: {exc}") from None

    async def _bind_references(
        self, converted: list[list[dict[str, Any]] | RpcError]
    ) -> list[list[dict[str, Any]] | RpcError]:
        """Register the batch's references with this channel's server (one ask) and put their
        stubs in place; a batch without references costs one scan."""
        lists = [c for c in converted if not isinstance(c, RpcError)]
        resolved = await resolve_references(self.ctx.references, lists, self.sid)
        if resolved is lists:  # nothing to register
            return converted
        parts = iter(resolved)
        return [c if isinstance(c, RpcError) else next(parts) for c in converted]

    def _ingest(
        self,
        msg: IncomingMessage | PushEvent,
        blocks: list[dict[str, Any]],
        now: float,
        accepted_at: str,
        spec: Any,
        view: BatchView,
    ) -> tuple[Append, tuple[Any, ...], Any, str]:
        """The write of one item, then the blocks, wakes and author of its ``Prepared``."""
        if isinstance(msg, IncomingMessage):
            tags = expand_tags(msg.tags)[0] if msg.tags else ()
            author_agent = self._receipts.get(msg.message_id)
            occurrence_id = spec.event_id if spec is not None else None
            env = incoming_envelope(msg, self.sid, self.cid, tags, author_agent, occurrence_id)
            self._echoes.seen(msg.author.id, own=env.from_self)
            if author_agent is not None:
                self._own.note(msg.author.id, author_agent)
        else:
            env = push_envelope(msg, self.sid, self.cid, expand_tags(msg.tags)[0])
            if spec is not None and spec.channel_id is not None:
                # A correction of a channel subject has no platform message of its own: the
                # subject's message stays its reply target, and one that names no thread is
                # delivered in the thread where its subject lives (RFC-006 case 45, I.1).
                known_thread, message_id = self._subject_places.get(spec.key, (None, None))
                env.thread_id = known_thread if env.thread_id is None else env.thread_id
                env.message_id = env.source_message = message_id
                if message_id is not None:
                    env.meta["message_id"] = message_id
                if env.thread_id is not None:
                    env.meta["thread_id"] = env.thread_id
        meta = env.meta
        if spec is not None:
            self._note_subject(spec.key, env.thread_id, env.message_id)
        meta["inbound_source"] = inbound_source(
            env.lane,
            self.sid,
            self.cid,
            thread=env.thread_id,
            message=env.source_message,
            label=view.label,
            reply_to=env.reply_to,
            accepted_at=accepted_at,
        )
        if spec is not None:
            meta["occurrence"] = f"{env.lane}:{self.sid}:{spec.event_id}"
            meta["coalesce_key"] = spec.key
        # The header is rendered once, from what was frozen above (refs-and-headers F.1).
        if self.cid is None:
            header = unscoped_header(self.sid)
        else:
            header = self._channel_header(view.label, env.thread_id, env.reply_to)
        stored, body = seal(meta, header, blocks)
        # what the host itself published wakes nobody; a message addressed to agents for whom
        # the channel is closed carries, in their copy, an invitation to open it
        echo = env.from_self or (env.message_id is not None and env.message_id in self._receipts)
        addressed = not echo and bool(env.tags) and is_addressed(env.tags)
        invited = (
            frozenset(a for a in self.hearers if a not in view.open)
            if addressed and env.lane == "incoming"
            else frozenset()
        )
        where = (self.sid, self.cid, self.label)
        records = copies(self.hearers, env, stored, invited, where, now)
        wakes = wakes_of(
            self.hearers,
            view,
            env,
            server_id=self.sid,
            channel_id=self.cid,
            echo=echo,
            addressed=addressed,
            blocks=blocks,
            own_of=self._own.agents(env.author_id),
            replies_to=self._replied_agents(env.reply_to, env.thread_id),
            direct=is_direct(self.descriptor.type if self.descriptor is not None else None),
        )
        # on a fleet, stored only while this host still holds the server's connection lease
        op = self.ctx.fenced(server_resource(self.sid), Append(records=records, dedupe=env.dedupe))
        return op, tuple(body), wakes, env.author

    def _replied_agents(self, reply_to: str | None, thread_id: str | None) -> frozenset[str]:
        """The agents who wrote the message an item replies to or the thread it is in."""
        found = (self._receipts.get(m) for m in (reply_to, thread_id) if m is not None)
        return frozenset(a for a in found if a is not None)

    def _note_subject(self, key: str, thread_id: str | None, message_id: str | None) -> None:
        """Remember where an RFC-006 subject lives (its corrections are delivered there)."""
        self._subject_places[key] = (thread_id, message_id)
        self._subject_places.move_to_end(key)
        while len(self._subject_places) > MAX_SUBJECT_PLACES:
            self._subject_places.popitem(last=False)

    def _channel_header(
        self, label: str | None, thread_id: str | None, reply_to: str | None
    ) -> str:
        """``channel_header`` for this channel, remembered for the next item."""
        key = (label, thread_id, reply_to)
        last = self._header
        if last is not None and last[0] == key:
            return last[1]
        assert self.cid is not None
        header = channel_header(self.sid, self.cid, label, thread_id, reply_to)
        self._header = (key, header)
        return header

    async def _materialized(self, msg: Materialized) -> tuple[MessageRecord, ...]:
        """The stored copies of a materialized deferred batch (RFC-006 §5): the same shape as
        a push item of this channel (header, marking, digests), lane ``"render"``."""
        if msg.converted:
            blocks = [dict(b) for b in msg.content]
        else:
            try:
                blocks = convert_blocks(list(msg.content), self.sid, "render")
            except ContentError as exc:
                raise RpcError(code=INVALID_PARAMS, message=f"Invalid params: {exc}") from None
            [blocks] = await resolve_references(self.ctx.references, [blocks], self.sid)
        now = time.time()
        unknown: tuple[str | None, str | None] = (None, None)
        place = self._subject_places.get(msg.key, unknown) if self.cid is not None else unknown
        thread_id, message_id = place
        tags, _ = expand_tags(list(msg.tags))
        meta = render_meta(
            server_id=self.sid,
            channel_id=self.cid,
            event_id=msg.event_id,
            timestamp=msg.timestamp or now_iso(),
            feature_set=msg.feature_set,
            tags=tags,
            origin=msg.origin,
        )
        meta["inbound_source"] = inbound_source(
            "render",
            self.sid,
            self.cid,
            thread=thread_id,
            message=message_id,
            label=self.label or None,
            reply_to=None,
            accepted_at=now_iso(),
        )
        if message_id is not None:
            meta["message_id"] = message_id
        if thread_id is not None:
            meta["thread_id"] = thread_id
        meta["occurrence"] = msg.occurrence
        meta["coalesce_key"] = msg.key
        if self.cid is None:
            header = unscoped_header(self.sid)
        else:
            header = channel_header(self.sid, self.cid, self.label or None, thread_id, None)
        stored, _ = seal(meta, header, blocks)
        return tuple(
            MessageRecord(
                id=new_id(), agent=agent, role="user", blocks=stored, metadata=meta, created_at=now
            )
            for agent in msg.contexts
        )

    # -- publish ----------------------------------------------------------------------------
    def serve_inline(self, msg: Any) -> Awaitable[Any] | None:
        """Two asks are served in the asking task (see :mod:`actors.kernel`), saving the
        mailbox's scheduling round. A publish, while nothing waits in the mailbox (what came
        before it is still handled first; handled there, it would only start a task of its
        own). A plain ingest batch (no coalesced item, nothing to write here) that could not be
        the echo of a publish awaiting its answer, while the channel is idle: it is converted at
        once, after everything sent to the channel before it, as the loop would convert it."""
        if isinstance(msg, Publish) and not (self.ref is not None and self.ref.queued):
            return self._publish_here(msg, self._echoes.begin(msg.blocks))
        if isinstance(msg, IngestBatch) and self._ingests_here(msg):
            return self._ingest_batch(msg.items, msg.accepted_at, msg.specs, msg.write)
        return None

    def _ingests_here(self, msg: IngestBatch) -> bool:
        """Whether the loop, were it to take ``msg`` now, would convert it at once."""
        if not self.idle or msg.write or any(spec is not None for spec in msg.specs):
            return False
        return not self._held_back(msg)

    def _held_back(self, msg: IngestBatch) -> bool:
        """Whether ``msg`` waits for a publish's answer: something of it could be the echo."""
        return bool(self._echoes.pending or self._flushing) and self._echoes.may_hold(msg.items)

    async def _publish_here(self, msg: Publish, token: str) -> tuple[PublishOutcome, Any]:
        """Send ``msg`` (its echo watched under ``token``); once no publish waits for an echo,
        the batches held back meanwhile are ingested in a task of the channel's."""
        try:
            return await self._send_publish(msg)
        finally:
            self._echoes.end(token)
            # a stopped channel starts nothing: its end answers what waits (ActorDied), and a
            # publish cancelled by the stop stays cancelled
            if not self._echoes.pending and not self._flushing and self._deferred and self.running:
                self._flushing = True  # what waits behind it stays behind until the task runs
                self.spawn(self._flush_deferred)

    async def _publish(self, msg: Publish, reply: Reply, token: str) -> None:
        """A publish that came by the mailbox (something was queued before it)."""
        try:
            reply.value(await self._publish_here(msg, token))
        except Exception as exc:
            reply.error(exc)

    async def _send_publish(self, msg: Publish) -> tuple[PublishOutcome, Any]:
        if self.cid is None:
            return PublishOutcome(status="failed", reason="no such channel"), None
        outcome, result = await send_publish(self.ctx, self.sid, self.cid, self.speech_place, msg)
        if outcome.message_id is not None:
            self._receipts.note(outcome.message_id, msg.agent)
        return outcome, result

    async def _flush_deferred(self) -> None:
        self._flushing = True
        try:
            while self._deferred and not self._echoes.pending:
                msg, waiting = self._deferred.pop(0)
                try:
                    waiting.value(
                        await self._ingest_batch(msg.items, msg.accepted_at, msg.specs, msg.write)
                    )
                except Exception as exc:
                    waiting.error(exc)
        finally:
            self._flushing = False
