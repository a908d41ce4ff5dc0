"""The CoalescerActor: RFC-006 event coalescing for the whole host.

Every transition of :class:`protocol.coalesce.Coalescer` is one message handled by this actor,
so transitions never interleave (no lock is held across an await: the actor's own loop is the
serialization). A transition's effects and its journal records go to the store as **one** op:
the item's stored copies (an ``Append`` effect), the markers hiding an unread occurrence it
replaced or retracted (``Hide``), and the journal entries, committed together. The caller
answers the server only once that op is durable.

On start the coalescer is rebuilt from the journal (stream ``coalesce``) and then recovers
conservatively (:meth:`~protocol.coalesce.Coalescer.recover`): what was unread before a restart
stays as an ordinary item rather than being silently rewritten.

Hidden occurrences are stored as host markers (a ``system`` message of kind
``coalesce-hidden`` naming the occurrence) for each agent the hidden item reached; an agent's
context leaves out both the markers and what they hide. ``Assembled`` closes the race between
an agent reading its context and a replacement: it marks what the agent's request included as
read, and answers which of those were hidden meanwhile (the agent drops them).

Deferred batches (RFC-006 §5): a deferred notice is admitted here (nothing is stored; its wake
says ``deferred``). When an agent assembles its context, ``BeginAssembly`` starts the render of
every pending batch it would see whose authority holds (server connected, ``pushEvents``
granted, feature set enabled, and for a channel-scoped batch ``channels.incoming`` granted),
journals that, and answers one :class:`RenderJob` per render. The
agent's turn task runs :func:`render` for each, concurrently: the ``push/render`` call (through
the server's ConnectionActor, under ``RENDER_TIMEOUT_S``) and the stored copies (built by the
ChannelActor: ``Materialized``) are the turn task's work, never this actor's; the outcome comes
back as ``RenderDone``, whose ``Materialize`` effect stores those copies together with the
journal entries before the answer. This actor itself never asks another actor.

A batch is rendered once for its whole audience. An agent whose assembly begins while another
agent's render of a batch it sees is in flight joins that render; one whose assembly begins
only after that render completed finds the batch closed, its copy already stored. Its wake
was still caused by the batch, so ``Begun.landed`` tells it what materialized into its
context since its last assembly (RFC-006 rev 8: an inference caused only by deferred batches
runs when something materialized), whatever the order in which the agents' turns got there.

Journal compaction: the journal is a command log, one record per journaled transition. Once
more than ``COMPACT_EVERY`` (1024) records have been journaled since the stream's latest
snapshot, the step that journaled the last of them goes on, after its answer and before the
next message, to compact the stream: it appends one snapshot record
(:meth:`~protocol.coalesce.Coalescer.snapshot`), waits until that is durable, reads back its
seq and trims every older row (``TrimJournal``). So once a step is over the stream holds at
most ``COMPACT_EVERY + 1`` rows (a snapshot and the records after it), and start-up replays no
more. A kill between the snapshot and the trim leaves the older rows in place: replaying them
rebuilds the state the snapshot then replaces with the same one. On start, after recovery, a
stream holding more than ``COMPACT_EVERY`` rows besides its latest snapshot (written before
compaction ran, or left by a kill before a trim) is compacted at once. A compaction the store
refuses is retried after another ``COMPACT_EVERY`` records.

Audit (RFC-006 §11): every ``Audit`` effect of a step (an unread occurrence displaced or
withdrawn, a pending batch superseded, narrowed or dropped, a render cancelled, a late result
discarded, an empty render, a subject evicted at the cap, an unread item sealed as ordinary)
is one ``coalesce-audit`` trace event naming its server, channel, subject key, event ids and
batch; never the displaced content.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import trio

from actors.context import HostContext
from actors.errors import ActorDied, MailboxFull, NotConnected
from actors.kernel import Actor, Reply
from actors.link.calls import call_within
from actors.messages import Call, Materialized, Withdraw
from actors.storage import SettledFuture
from protocol.coalesce import (
    Append as AppendEffect,
)
from protocol.coalesce import (
    Audit,
    Coalescer,
    CoalesceSpec,
    Hide,
    Materialize,
    RequestRender,
    Step,
    Subject,
)
from protocol.errors import RpcError
from protocol.mcpl import HOST_COALESCING
from store import Append, JournalEntry, MessageRecord, StoreError, TrimJournal

log = logging.getLogger("mcplive.coalescer")

STREAM = "coalesce"
HIDDEN_KIND = "coalesce-hidden"
#: Records journaled since the latest snapshot that make the next step compact the journal.
COMPACT_EVERY = 1024
#: What an ``Audit`` kind means, for the trace event's ``reason``.
AUDIT_REASONS: Mapping[str, str] = {
    "displaced": "an unread occurrence was replaced",
    "withdrawn": "an unread occurrence was retracted",
    "superseded": "a pending deferred batch was superseded",
    "cancelled": "a render in flight was cancelled",
    "narrowed": "a pending deferred batch lost its whole audience",
    "dropped": "a deferred batch was dropped: its authority lapsed",
    "discarded": "a late render result was discarded",
    "empty": "a render was empty",
    "evicted": "the subject was forgotten at the subject cap",
    "sealed": "an unread occurrence was kept as an ordinary item",
}
#: Occurrences remembered as hidden, for the race with an agent's read; oldest forgotten first.
MAX_HIDDEN = 100_000

#: What this host advertises (``experimental.mcpl.eventCoalescing``).
ADVERTISED = HOST_COALESCING
#: The deadline of one ``push/render`` (RFC-006 §5 recommends 5 s).
RENDER_TIMEOUT_S = 5.0
#: Renders started and not yet completed, remembered for their authority re-check.
MAX_JOBS = 4096
#: Agents remembered as having a render's outcome land in their context unasked; at the cap the
#: one remembered longest is forgotten (its next assembly, if caused only by deferred batches,
#: then runs no inference: what landed stays in its context for the next one).
MAX_LANDED = 4096
ASK_S = 60.0


@attrs.frozen(kw_only=True)
class Admit:
    """Admit one coalesced item. ``records`` are its stored copies (one per agent it reaches);
    they are stored only if the coalescer appends the occurrence. The answer is
    ``(Step, future)``: the future settles when the op is durable."""

    spec: CoalesceSpec
    binding: str
    occurrence: str
    contexts: tuple[str, ...]
    records: tuple[MessageRecord, ...]
    dedupe: tuple[str, str, str] | None
    feature_set: str | None = None
    channel_id: str | None = None
    content: tuple[Any, ...] = ()
    timestamp: str = ""
    tags: tuple[str, ...] = ()
    origin: Any = None


@attrs.frozen(kw_only=True)
class BeginAssembly:
    """An agent begins assembling a request: start rendering the pending deferred batches it
    would see. The answer is a :class:`Begun`."""

    context: str


@attrs.frozen(kw_only=True)
class RenderJob:
    """One ``push/render`` the asker must perform and report with ``RenderDone``."""

    batch: str
    subject: Subject
    server_id: str
    channel_id: str | None  # the channel of a channel-scoped subject
    params: Mapping[str, Any]
    contexts: tuple[str, ...]
    event_id: str
    feature_set: str
    fallback: tuple[Any, ...]
    timestamp: str
    tags: tuple[str, ...]
    origin: Any


@attrs.define
class RenderWait:
    """A render started by another agent's assembly of a batch this one sees too (a batch is
    rendered once, RFC-006 §5): ``done`` is set once its outcome is durable, ``outcome`` written
    just before, by the coalescer alone."""

    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: str | None = None
    #: the agents that hear the outcome from this render: the one rendering and each joiner
    told: set[str] = attrs.field(factory=set)


@attrs.frozen(kw_only=True)
class Begun:
    """The answer to ``BeginAssembly``: the renders the asker performs (``jobs``), those
    already under way elsewhere that it waits for (``joins``), and the outcome of renders
    completed elsewhere since its last assembly that materialized into its context
    (``landed``: ``materialized`` or ``fallback``, at most one)."""

    jobs: tuple[RenderJob, ...] = ()
    joins: tuple[RenderWait, ...] = ()
    landed: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RenderDone:
    """A render's outcome: ``content`` (``reason`` None) or a failure ``reason`` (``timeout``,
    ``error``, ``disconnect``). ``records`` are the stored copies of what materializes in that
    case (the result's, or the fallback's); the answer, once they are durable, is the step's
    outcome (``materialized``, ``empty``, ``fallback``, ``dropped`` or ``discarded``)."""

    batch: str
    content: tuple[Any, ...] = ()
    reason: Literal["timeout", "error", "disconnect"] | None = None
    records: tuple[MessageRecord, ...] = ()
    timestamp: str | None = None


@attrs.frozen(kw_only=True)
class Assembled:
    """An agent's request included these occurrences; the answer is the set of them that are
    hidden (replaced or retracted before the read counted)."""

    context: str
    occurrences: tuple[str, ...]


def hidden_marker(agent: str, occurrence: str, new_id: str) -> MessageRecord:
    return MessageRecord(
        id=new_id,
        agent=agent,
        role="system",
        blocks=(),
        metadata={"system": True, "kind": HIDDEN_KIND, "occurrence": occurrence},
        created_at=time.time(),
    )


def is_hidden_marker(message: Mapping[str, Any]) -> bool:
    meta = message.get("metadata")
    return (
        message.get("role") == "system"
        and isinstance(meta, Mapping)
        and meta.get("kind") == HIDDEN_KIND
    )


class CoalescerActor(Actor):
    mailbox_size = 1024
    #: See the module docstring (a test may lower it on an instance).
    compact_every = COMPACT_EVERY
    #: See ``MAX_LANDED`` (a test may lower it).
    max_landed = MAX_LANDED

    def __init__(self, ctx: HostContext, new_id: Any) -> None:
        super().__init__("coalescer", ctx.work)
        self.ctx = ctx
        self.co = Coalescer()
        self._new_id = new_id
        self._hidden: OrderedDict[str, None] = OrderedDict()
        self._jobs: OrderedDict[str, RenderJob] = OrderedDict()
        self._waits: dict[str, RenderWait] = {}  # one per job in ``_jobs``, by batch
        # agent -> a render outcome that landed in its context and it was not told of
        self._landed: OrderedDict[str, str] = OrderedDict()
        # rows of the stream besides its latest snapshot (journaled, or submitted to be)
        self._since = 0

    async def on_start(self) -> None:
        rows = await self.ctx.store.read(self.ctx.store.reader.journal, STREAM)
        self.co = Coalescer.replay(record for _, record in rows)
        snapshotted = any(record.get("op") == "snapshot" for _, record in rows)
        self._since = len(rows) - (1 if snapshotted else 0)
        steps = [self.co.advertise(ADVERTISED)]
        if rows:
            steps.append(self.co.recover())
        entries = tuple(e for step in steps for e in self._entries(step))
        if entries:
            await self.ctx.store.write(Append(records=(), journal=entries))
        del rows
        if self._since > self.compact_every:
            await self._compact()
        for step in steps:
            self._audit(step)
            self._fallbacks(step)

    def _entries(self, step: Step) -> tuple[JournalEntry, ...]:
        """A step's journal entries, counted towards the next compaction."""
        self._since += len(step.records)
        return tuple(JournalEntry(STREAM, r) for r in step.records)

    async def _compact(self) -> None:
        """Append a snapshot, then trim every row before it (see the module docstring). Runs in
        this actor's loop, so no transition is journaled between the two."""
        store = self.ctx.store
        records, self._since = self._since, 0  # if the store refuses, retried after as many
        try:
            snapshot = JournalEntry(STREAM, self.co.snapshot())
            await store.write(Append(records=(), journal=(snapshot,)))
            # this actor is the stream's only writer and waits here: the newest row is that one
            seq = await store.read(store.reader.last_seq, STREAM)
            assert seq is not None
            await store.write(TrimJournal(stream=STREAM, before_seq=seq))
        except StoreError as exc:
            log.warning("coalescer: journal compaction failed: %s", exc)
            self.ctx.trace.emit("coalesce-compacted", data={"records": records, "error": str(exc)})
            return
        self.ctx.trace.emit("coalesce-compacted", data={"records": records, "seq": seq})

    def _now(self) -> int:
        return int(time.time() * 1000)

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Admit):
            reply.value(await self._admit(msg))
        elif isinstance(msg, Assembled):
            reply.value(await self._assembled(msg))
        elif isinstance(msg, BeginAssembly):
            reply.value(await self._begin(msg))
        elif isinstance(msg, RenderDone):
            reply.value(await self._render_done(msg))
        else:
            raise TypeError(f"unexpected message {msg!r}")
        if self._since > self.compact_every:
            await self._compact()

    async def _admit(self, msg: Admit) -> tuple[Step, Any]:
        step = self.co.admit(
            msg.spec,
            binding=msg.binding,
            occurrence=msg.occurrence,
            contexts=msg.contexts,
            now=self._now(),
            feature_set=msg.feature_set,
            channel_id=msg.channel_id,
            content=msg.content,
            timestamp=msg.timestamp,
            tags=msg.tags,
            origin=msg.origin,
        )
        if step.duplicate or not (step.effects or step.records):
            return step, SettledFuture(stored=False)
        records = self._apply(step, msg.records)
        op = Append(
            records=tuple(records),
            dedupe=msg.dedupe if any(r in msg.records for r in records) else None,
            journal=self._entries(step),
        )
        [future] = await self.ctx.store.submit_many([op])
        self._audit(step)
        self._fallbacks(step)  # a batch of a subject evicted at the cap falls back
        return step, future

    def _fallbacks(self, step: Step) -> None:
        """Store what a step materializes outside a render (a subject evicted at the cap, a
        render in flight at a restart): the batch's fallback. Building its copies asks the
        channel, so it runs in a task of its own, never in this loop."""
        for effect in step.effects:
            if isinstance(effect, Materialize) and effect.source == "fallback":
                self.spawn(self._store_fallback, effect)

    async def _store_fallback(self, effect: Materialize) -> None:
        sid = self._server_of(effect.subject.binding)
        if sid is None:
            return  # that server is no longer configured: nobody can be shown its batch
        scoped = effect.subject.scope_kind == "channel"
        chan = await self.ctx.channel(sid, effect.subject.scope_id if scoped else None)
        records: tuple[MessageRecord, ...] = await chan.ask(
            Materialized(
                occurrence=effect.occurrence,
                contexts=tuple(sorted(effect.contexts)),
                content=tuple(effect.content),
                converted=True,
                key=effect.subject.key,
                event_id=effect.event_id,
                feature_set=effect.feature_set,
                tags=tuple(effect.tags),
                timestamp=effect.timestamp,
                origin=effect.origin,
            ),
            timeout=ASK_S,
        )
        if records:
            await self.ctx.store.write(Append(records=records))
        self.ctx.trace.emit(
            "coalesce-render",
            server_id=sid,
            channel_id=effect.subject.scope_id if scoped else None,
            data={"batch": effect.batch, "outcome": "fallback", "reason": "evicted or recovered"},
        )

    def _apply(self, step: Step, item: Sequence[MessageRecord]) -> list[MessageRecord]:
        """The records a step stores: the item's copies it appends, and hiding markers."""
        out: list[MessageRecord] = []
        for effect in step.effects:
            if isinstance(effect, AppendEffect):
                out.extend(r for r in item if r.agent in effect.contexts)
            elif isinstance(effect, Hide):
                for agent in effect.contexts:  # its wake no longer counts
                    ref = self.ctx.agents.get(agent)
                    if ref is not None:
                        with contextlib.suppress(MailboxFull, ActorDied):
                            ref.tell_nowait(Withdraw(occurrence=effect.occurrence))
                self._hidden[effect.occurrence] = None
                while len(self._hidden) > MAX_HIDDEN:
                    self._hidden.popitem(last=False)
                out.extend(
                    hidden_marker(agent, effect.occurrence, self._new_id())
                    for agent in sorted(effect.contexts)
                )
        return out

    def _audit(self, step: Step) -> None:
        """One ``coalesce-audit`` trace event per ``Audit`` effect of a step: what was
        displaced, and why, by subject and event ids (never its content)."""
        for effect in step.effects:
            if not isinstance(effect, Audit):
                continue
            subject = effect.subject
            scoped = subject is not None and subject.scope_kind == "channel"
            self.ctx.trace.emit(
                "coalesce-audit",
                server_id=self._server_of(subject.binding) if subject is not None else None,
                channel_id=subject.scope_id if subject is not None and scoped else None,
                data={
                    "kind": effect.kind,
                    "reason": AUDIT_REASONS.get(effect.kind, effect.kind),
                    "key": subject.key if subject is not None else None,
                    "feature_set": subject.scope_id if subject is not None and not scoped else None,
                    "event_ids": list(effect.event_ids),
                    "batch": effect.batch,
                },
            )

    async def _assembled(self, msg: Assembled) -> frozenset[str]:
        hidden = frozenset(o for o in msg.occurrences if o in self._hidden)
        step = self.co.assembled(msg.context, (o for o in msg.occurrences if o not in hidden))
        if step.records:
            await self.ctx.store.write(Append(records=(), journal=self._entries(step)))
        self._audit(step)
        return hidden

    # -- deferred batches -------------------------------------------------------------------

    def _server_of(self, binding: str) -> str | None:
        for server in self.ctx.config.servers:
            if self.ctx.binding(server.id) == binding:
                return str(server.id)
        return None

    def _authorized(self, subject: Subject, feature_set: str) -> bool:
        """The batch's authority now: its server connected and ready, ``pushEvents`` granted,
        the feature set enabled; for a channel scope ``channels.incoming`` granted."""
        sid = self._server_of(subject.binding)
        status = self.ctx.statuses.get(sid) if sid is not None else None
        if status is None:
            return False
        # the policy last in force: a server away (reconnecting) keeps its authority, and its
        # render then fails as a disconnect (the fallback), RFC-006 case 21
        grant, sets = status.policy_grant, status.policy_feature_sets
        if "pushEvents" not in grant or feature_set not in sets:
            return False
        if subject.scope_kind == "channel":
            return "channels.incoming" in grant
        return True

    async def _begin(self, msg: BeginAssembly) -> Begun:
        step = self.co.begin_assembly(
            msg.context, authorized=lambda v: self._authorized(v.subject, v.feature_set)
        )
        renders = [e for e in step.effects if isinstance(e, RequestRender)]
        self._apply(step, ())
        if step.records:
            await self.ctx.store.write(Append(records=(), journal=self._entries(step)))
        self._audit(step)
        started = {e.batch for e in renders}
        joins = tuple(
            self._waits[batch]
            for batch, job in self._jobs.items()
            if batch not in started and msg.context in job.contexts
        )
        for wait in joins:
            wait.told.add(msg.context)
        landed = self._landed.pop(msg.context, None)
        if not renders:
            return Begun(joins=joins, landed=(landed,) if landed else ())
        jobs = []
        for effect in renders:
            b = self.co.rendering(effect.subject)  # frozen by this very step
            sid = self._server_of(effect.subject.binding)
            assert b is not None and b.batch == effect.batch and sid is not None
            subject = effect.subject
            job = RenderJob(
                batch=effect.batch,
                subject=subject,
                server_id=sid,
                channel_id=subject.scope_id if subject.scope_kind == "channel" else None,
                params=effect.params,
                contexts=tuple(sorted(b.audience)),
                event_id=b.event_id,
                feature_set=b.feature_set,
                fallback=tuple(b.fallback),
                timestamp=b.timestamp,
                tags=tuple(b.tags),
                origin=b.origin,
            )
            self._jobs[job.batch] = job
            self._waits[job.batch] = RenderWait(told={msg.context})
            while len(self._jobs) > MAX_JOBS:
                forgotten, _ = self._jobs.popitem(last=False)
                self._waits.pop(forgotten).done.set()  # nobody waits on it any longer
            jobs.append(job)
        return Begun(jobs=tuple(jobs), joins=joins, landed=(landed,) if landed else ())

    async def _render_done(self, msg: RenderDone) -> str | None:
        job = self._jobs.pop(msg.batch, None)
        # authority is re-checked at response; a server gone away has no response to check
        authorized = job is not None and (
            msg.reason == "disconnect" or self._authorized(job.subject, job.feature_set)
        )
        if msg.reason is None:
            step = self.co.render_result(
                msg.batch, msg.content, authorized=authorized, timestamp=msg.timestamp
            )
        else:
            step = self.co.render_failed(msg.batch, reason=msg.reason, authorized=authorized)
        records = self._apply(step, ())
        for effect in step.effects:
            if isinstance(effect, Materialize):
                records.extend(r for r in msg.records if r.agent in effect.contexts)
        if records or step.records:
            entries = self._entries(step)
            await self.ctx.store.write(Append(records=tuple(records), journal=entries))
        wait = self._waits.pop(msg.batch, None)
        self._land(step, wait.told if wait is not None else set())
        self._audit(step)
        self.ctx.trace.emit(
            "coalesce-render",
            server_id=job.server_id if job is not None else None,
            channel_id=job.channel_id if job is not None else None,
            data={"batch": msg.batch, "outcome": step.outcome, "reason": msg.reason},
        )
        if wait is not None:
            wait.outcome = step.outcome
            wait.done.set()
        return step.outcome

    def _land(self, step: Step, told: set[str]) -> None:
        """Remember, for each agent a render's outcome materialized for (now durable) that
        neither rendered it nor joined it, that something landed in its context."""
        for effect in step.effects:
            if not isinstance(effect, Materialize):
                continue
            for agent in sorted(set(effect.contexts) - told):
                self._landed.pop(agent, None)
                self._landed[agent] = "fallback" if effect.source == "fallback" else "materialized"
                while len(self._landed) > self.max_landed:
                    self._landed.popitem(last=False)


Failure = Literal["timeout", "error", "disconnect"]


async def _call_render(ctx: HostContext, job: RenderJob) -> tuple[Any, Failure | None]:
    """``push/render`` under ``RENDER_TIMEOUT_S``: ``(result, None)`` or ``(None, reason)``."""
    conn = ctx.connections.get(job.server_id)
    if conn is None:
        return None, "disconnect"
    key = f"render/{job.batch}"
    # hook=True: like a context hook, a render may not start an inference (RFC-006 §10.7)
    call = Call(
        method="push/render", params=job.params, timeout=RENDER_TIMEOUT_S, hook=True, key=key
    )
    try:
        return await call_within(conn, call, RENDER_TIMEOUT_S), None
    except (NotConnected, ActorDied):
        return None, "disconnect"
    except TimeoutError:
        return None, "timeout"
    except Exception:  # an error answer, or one the connection could not take
        return None, "error"


async def render(ctx: HostContext, job: RenderJob) -> str | None:
    """Run one render job in the caller's task (an agent's turn): build the fallback's stored
    copies, call ``push/render``, build the result's copies (a result that is not valid
    content is an ``error``: the fallback), and report to the coalescer; its answer (the
    outcome) comes once what materialized is durable."""
    chan = await ctx.channel(job.server_id, job.channel_id)
    common: dict[str, Any] = {
        "occurrence": job.batch,
        "contexts": job.contexts,
        "key": job.subject.key,
        "event_id": job.event_id,
        "feature_set": job.feature_set,
        "tags": job.tags,
        "origin": job.origin,
    }
    fallback: tuple[MessageRecord, ...] = await chan.ask(
        Materialized(content=job.fallback, converted=True, timestamp=job.timestamp, **common),
        timeout=ASK_S,
    )
    try:
        result, reason = await _call_render(ctx, job)
        done = RenderDone(batch=job.batch, reason=reason, records=fallback)
        if reason is None:
            content = result.get("content") if isinstance(result, Mapping) else None
            stamp = result.get("timestamp") if isinstance(result, Mapping) else None
            stamp = stamp if isinstance(stamp, str) else None
            if not isinstance(content, list):
                done = RenderDone(batch=job.batch, reason="error", records=fallback)
            elif not content:
                done = RenderDone(batch=job.batch, content=())
            else:
                try:
                    records = await chan.ask(
                        Materialized(
                            content=tuple(content), converted=False, timestamp=stamp, **common
                        ),
                        timeout=ASK_S,
                    )
                except RpcError:
                    done = RenderDone(batch=job.batch, reason="error", records=fallback)
                else:
                    done = RenderDone(
                        batch=job.batch, content=tuple(content), records=records, timestamp=stamp
                    )
    except trio.Cancelled:
        # the turn was aborted: the render counts as timed out (never left in flight)
        with trio.CancelScope(shield=True), trio.move_on_after(RENDER_TIMEOUT_S):
            await ctx.coalescer.ask(
                RenderDone(batch=job.batch, reason="timeout", records=fallback),
                timeout=RENDER_TIMEOUT_S,
            )
        raise
    outcome: str | None = await ctx.coalescer.ask(done, timeout=ASK_S)
    return outcome
